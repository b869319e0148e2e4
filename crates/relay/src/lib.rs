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
//!   `migrate` (moving a connection to its key's owner), `kernel_tls`,
//!   `output` (one send per connection per turn) and `timers` (the sweep,
//!   the start of a drain). A new feature adds a module there, not lines to
//!   the turn loop. See its module doc for the data path. The shard never
//!   reads the clock: `now` comes from the loop, so `tests/sim.rs` drives
//!   it on `ferry_engine::sim` with simulated time.
//! - [`conn`] is one client connection; [`front`] answers plain HTTP
//!   requests; [`transport`] carries a connection's bytes (plain, TLS,
//!   kernel TLS); [`tls`] sets up certificates; [`stun`] answers STUN;
//!   [`metrics`] counts everything; [`health`] answers `/healthz`;
//!   [`config`] holds the settings; [`admission`] asks tailscaled or an
//!   admission controller whether a client may register, off the shards;
//!   [`bootstrap_dns`] resolves and serves `/bootstrap-dns`; [`mesh`]
//!   dials the region's other nodes (`--mesh-with`) on a thread of its
//!   own.
//!
//! The protocol itself (frames, handshake boxes, HTTP head, STUN parsing)
//! lives in `ferry-proto`, without I/O.

#![deny(unsafe_code)]

pub mod admission;
pub mod bootstrap_dns;
pub mod config;
pub mod conn;
pub mod front;
pub mod health;
pub mod heap;
pub mod ktls;
pub mod mesh;
pub mod metrics;
pub mod server;
pub mod shard;
pub mod stun;
pub mod tls;
pub mod transport;

pub use config::{HomePage, ListenerKind, ListenerSpec, Placement, RelayConfig};
pub use server::{Server, ServerOptions, SocketRole, StartError};
