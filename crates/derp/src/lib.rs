//! Ferry's DERP relay: Tailscale's relay protocol on a shard-per-core
//! engine.
//!
//! - [`server`] starts and stops a relay: listeners, one pinned shard
//!   thread per core, STUN and metrics threads.
//! - [`shard`] is the per-core state machine. Its `mod.rs` holds the
//!   shard's state and the order of one loop turn (intake, mail, timers,
//!   flush); each concern is a child module that adds methods to the shard:
//!   `front_door` (accept, HTTP, the DERP handshake), `input` (TLS and
//!   frames in), `registry` (keys, duplicates, peerGone, closing),
//!   `router` (delivery, caps and drops, cross-shard records and mail),
//!   `forward` (the region's keys and packets for the mesh links),
//!   `gate` (backpressure and its budget), `presence` (watchers),
//!   `migrate` (moving a connection to its key's owner), `handoff` (when
//!   to move a TLS session into the kernel), `output` (one send per
//!   connection per turn) and `timers` (the sweep,
//!   the start of a drain). A new feature adds a module there, not lines to
//!   the turn loop. See its module doc for the data path. The shard never
//!   reads the clock: `now` comes from the loop, so `tests/sim.rs` drives
//!   it on `ferry_engine::sim` with simulated time.
//! - [`conn`] is one client connection, its fields private: the shard
//!   asks and tells it through methods. Its DERP protocol part is
//!   `ferry_proto::server::ServerConn`, sans-IO: a frame reader whose
//!   `handle_bytes` turns client bytes into actions that borrow the
//!   shard's read buffer (route this packet, note preferred, ping, watch,
//!   close a peer, and one `Unknown` arm where frame types beyond the
//!   classic set reach the shard); the control, disco and data queues with
//!   their caps, drained by `poll_output` into the send buffer (with only
//!   data queued, the queue itself becomes the buffer); and its clocks —
//!   handshake deadline, keepalive, write timeout — behind `poll_timeout` /
//!   `handle_timeout(now)`. Time comes from the caller. Two adaptations
//!   for the hot path: actions go to a callback instead of a returned list
//!   (nothing is collected or allocated per packet), and the reader leaves
//!   the connection state while it runs, because an action may queue
//!   output on the same connection (a packet to its own key, a pong).
//!   `conn` never uses `shard`.
//! - [`transport`] carries a connection's bytes under DERP (plain,
//!   rustls, Ferry's own TLS 1.3 record layer, kernel TLS, leaving rustls
//!   for one of the last two at a record boundary, and WebSocket framing
//!   above any of them): one `read` per receive, one `write` per flush.
//! - [`front`] answers plain HTTP requests; [`certs`] loads, generates
//!   and reloads the listener's certificates and holds the ACME state;
//!   [`stun`] answers STUN; [`metrics`] counts everything; [`health`]
//!   answers `/healthz`; [`config`] holds the settings; [`admission`] asks
//!   tailscaled or an admission controller whether a client may register,
//!   off the shards; [`bootstrap_dns`] resolves and serves
//!   `/bootstrap-dns`; [`mesh`] dials the region's other nodes
//!   (`--mesh-with`) on a thread of its own.
//! - [`fuzzing`] drives the TLS record layer with arbitrary input for the
//!   `tls_records` fuzz target and the corpus replay test.
//!
//! The protocol itself (frames, handshake boxes, HTTP head, STUN parsing)
//! lives in `ferry-proto`, without I/O.
//!
//! # Layers
//!
//! A connection's bytes pass three layers, each once: the transport
//! (socket bytes to DERP bytes and back), the DERP state
//! (`ferry_proto::server::ServerConn`: frames to actions, queues to send
//! buffers, its clocks) and the shard, which drives both and routes. The
//! lower layers know nothing above them, and `tests/layers.rs` reads the
//! sources to check it:
//!
//! - `transport` names neither `conn` nor `shard`;
//! - `conn` never names `shard`;
//! - `config` names nothing of this crate, so every module may read the
//!   settings (services it holds, such as relay sessions or the ACME
//!   challenge answers, are traits their owners implement);
//! - `proto::server` knows no type of this crate (`ferry-proto` does not
//!   depend on it, so the compiler checks that one).

#![deny(unsafe_code)]

pub mod admission;
pub mod bootstrap_dns;
pub mod certs;
pub mod config;
pub mod conn;
pub mod debug_clients;
pub mod front;
pub mod fuzzing;
pub mod health;
pub mod heap;
pub mod mesh;
pub mod metrics;
pub mod server;
pub mod shard;
pub mod stun;
pub mod transport;

pub use config::{DerpConfig, HomePage, ListenerKind, ListenerSpec, Placement};
pub use server::{Server, ServerOptions, SocketRole, StartError};
