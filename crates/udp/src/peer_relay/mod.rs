//! Tailscale peer-relay endpoints: the data half of Ferry as a Tailscale
//! peer relay.
//!
//! The control half (a tailnet node) receives a client's allocation
//! request over DERP and calls [`PeerRelays::allocate`] (the shared
//! [`PeerRelayTable::allocate`]), which makes or
//! finds the pair's endpoint and gives the [`RelayEndpoint`] to answer
//! with. Both clients then bind their slot from their UDP sockets with
//! sealed disco messages ([`ferry_proto::peer_relay`]) and their WireGuard
//! datagrams are forwarded between the two bound addresses, unchanged,
//! behind the same 8-byte header as Ferry's relay sessions
//! ([`PeerRelayTable::handle`]). The table does no I/O; times are passed
//! in and tests drive it in simulated time.
//!
//! [`RelayEndpoint`]: ferry_proto::disco::RelayEndpoint

mod drop_log;
pub(crate) mod port;
mod service;
mod stun;
mod table;

pub use drop_log::{DropLog, DROP_LOG_EVERY};
pub use service::PeerRelays;
pub use stun::StunProbe;
pub use table::{
    Allocated, Counters, Drop, Freed, Limits, PeerRelayTable, Refusal, States, Verdict,
};
