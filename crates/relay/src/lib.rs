//! Ferry's DERP relay: Tailscale's relay protocol on a shard-per-core
//! engine.
//!
//! - [`server`] starts and stops a relay: listeners, one pinned shard
//!   thread per core, STUN and metrics threads.
//! - [`shard`] is the per-core state machine: handshakes, routing by key
//!   owner, queues, timers. See its module doc for the data path.
//! - [`conn`] is one client connection; [`front`] answers plain HTTP
//!   requests; [`tls`] sets up certificates; [`stun`] answers STUN;
//!   [`metrics`] counts everything; [`health`] answers `/healthz`;
//!   [`config`] holds the settings.
//!
//! The protocol itself (frames, handshake boxes, HTTP head, STUN parsing)
//! lives in `ferry-proto`, without I/O.

#![deny(unsafe_code)]

pub mod config;
pub mod conn;
pub mod front;
pub mod health;
pub mod ktls;
pub mod metrics;
pub mod server;
pub mod shard;
pub mod stun;
pub mod tls;

pub use config::{HomePage, ListenerKind, ListenerSpec, RelayConfig};
pub use server::{Server, ServerOptions, SocketRole, StartError};
