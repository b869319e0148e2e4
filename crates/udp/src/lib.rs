//! ferry-udp: a UDP relay for stock WireGuard that never decrypts.
//!
//! Two modes, which one process can run side by side on different ports:
//!
//! - **Static bounce** ([`config::Bounce`]): everything that arrives on a
//!   listening address goes to one target (`host:port`). Each client
//!   address gets its own upstream socket, connected to the target, so the
//!   server sees only the relay and replies find their client by socket.
//!   A client is forgotten after an idle timeout; at a route's client
//!   limit (`max_sessions`), a new client may take the place of one whose
//!   target never answered (a flood from spoofed sources must not lock new
//!   clients out). A DNS target is re-resolved periodically; when it
//!   moves, each client's upstream socket is re-connected in place (same
//!   local port, so the server's view of the client does not change), by
//!   the shard that owns the client, between two batches.
//! - **Receiver-index hub** ([`config::Hub`], [`hub`]): many WireGuard
//!   peers, each configured with the hub as the endpoint of the others.
//!   The hub learns WireGuard session indices from handshakes (MAC1 names the
//!   recipient of an initiation among the configured public keys), forwards
//!   data by receiver index, and follows roaming peers. It holds no secret.
//!
//! How a datagram moves: the kernel spreads datagrams over one
//! `SO_REUSEPORT` socket per shard ([`socket`]); the shard ([`shard`])
//! receives a batch with one `recvmmsg` (GRO may glue several datagrams of
//! a flow into one slot), routes each datagram, queues it as a span of the
//! receive buffer in the outbox of the socket it leaves through (a
//! [`ferry_sys::train::Trains`], which groups datagrams into GSO trains by
//! the kernel's rules), and sends each outbox with `sendmmsg`. Bounce
//! clients live entirely on the shard that received their first datagram
//! (a client's address always hashes to the same socket); only a route's
//! client count is shared, one atomic that a shard updates when it opens
//! or closes a client ([`shard::ClientCap`]). The hub's tables are
//! replicated across shards through the engine's SPSC rings, as its module
//! doc explains. Bounce and hub take no lock and allocate nothing on the
//! packet path. Relay sessions ([`session`]) share one table behind a
//! lock, taken once per received batch, not per datagram, so a bind seen
//! by one shard is in force on every other at once. Tailscale peer-relay
//! endpoints ([`peer_relay`]) are served the same way on their own port.
//! Counters are per-shard and single-writer ([`metrics`]).
//!
//! [`Relay::start`] validates a [`config::Config`], resolves targets,
//! probes the kernel's offloads, binds everything (naming the config field
//! of whatever fails), and starts the shard threads.
//!
//! [`fuzzing`] drives the hub's tables as a state machine for the `hub`
//! fuzz target and the corpus-replay test.

pub mod config;
mod forward;
pub mod fuzzing;
pub mod hub;
pub mod live;
pub mod metrics;
pub mod peer_relay;
pub mod published;
pub mod ratelimit;
pub mod server;
pub mod session;
pub mod shard;
pub mod socket;
mod toml_key;

pub use server::{Relay, Resolve, StartError, SystemResolver};
