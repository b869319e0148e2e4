//! Regional mesh, the dialing half (`--mesh-with`): this relay connects
//! to every other node of its region as a DERP client with its own key
//! and the mesh key, subscribes to their connection lists (`watchConns`),
//! and carries its clients' packets for keys connected there
//! (`forwardPacket`). The serving half (answering other nodes' links) is
//! the shard's ordinary handling of mesh clients.
//!
//! One thread drives every link: a `mio` poll over the links' sockets,
//! rustls for TLS, and the sans-IO DERP client ([`ferry_proto::client`])
//! for the protocol. It never blocks a shard and is never blocked by one:
//!
//! - what a link learns (peerPresent, peerGone, the link breaking) goes to
//!   the shards as [`Control::Mesh`](crate::shard::Control::Mesh)
//!   messages, to each key's owner shard, which keeps the forwarding
//!   table (see `shard/forward.rs`);
//! - packets come the other way through one bounded byte ring per (link,
//!   shard), already framed as forwardPacket; the thread takes from a ring
//!   only while the link's socket keeps up, so a slow link fills its rings
//!   and the shards pause the senders feeding it.
//!
//! A link that fails (refused, TLS error, wrong mesh key, silence past the
//! keepalive limit, the peer restarting) is logged with its reason, its
//! keys leave the table at once, and it is dialed again after a backoff
//! (1 s doubling to 10 s, ±20 % jitter from a seeded source). A link whose
//! server key is this relay's own is this node listed in its own
//! `--mesh-with`: it is dropped for good, as derper does.
//!
//! TLS to mesh peers is always verified, against the system's roots
//! (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured), with the TLS name
//! and `Host` header from the entry's name, as derper does.
//!
//! The module's parts: `thread` (the poll loop, dialing, the links'
//! events and their rings), `peer` (one configured peer: its dial state
//! and the keys it announced), `conn` (one connection: socket, TLS, the
//! DERP client), `stats` (the `ferry_mesh_*` metrics) and [`route`] (which
//! node of the region hosts a relay session whose keys are on different
//! nodes; version 2 of relay sessions, used by `shard/cross_node.rs`).

mod conn;
mod peer;
pub mod route;
mod stats;
mod thread;

pub use stats::{MeshPeerStats, MeshStats};
pub use thread::{MeshError, MeshThread};

/// Most keys one link's peer may have announced at once. A peer past it
/// (a bug, or a compromised node that holds the mesh key) would otherwise
/// grow this thread's set, the shards' inboxes and their forwarding tables
/// without bound; its further new keys are dropped and counted
/// (`ferry_mesh_link_refused_keys_total`), and logged once per link. A
/// million clients is far beyond one relay node: derper's busiest nodes
/// hold tens of thousands.
pub const MESH_LINK_MAX_KEYS: usize = 1 << 20;

/// meshSession frames other than state (allocations, offers, refusals,
/// ends, declines) that one node may send this relay on its link, per
/// second on each shard ...
///
/// A node's frames are its clients' asks and the answers to them, each
/// already held to its client's own rate on that node (32 at once, then
/// 4 a second); a node past this is flooding, and its excess is dropped
/// and counted (`ferry_mesh_session_dropped_total{reason="rate"}`).
pub const MESH_SESSION_RATE: f64 = 256.0;
/// ... and at once.
pub const MESH_SESSION_BURST: f64 = 1024.0;
