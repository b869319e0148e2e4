//! What an [`super::Endpoint`] shows of itself: its DERP servers
//! ([`RelayStatus`]) and its counters ([`EndpointStats`], with the
//! datagrams it rejected by reason, [`Rejected`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// One DERP server as [`super::Endpoint::relay_status`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStatus {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// While the connection is up, the URL of the node it is up to: `url`,
    /// or one of the region's other nodes
    /// ([`super::DerpServerOptions::fallback_urls`]).
    pub node: Option<String>,
    /// Whether the DERP connection is up.
    pub connected: bool,
    /// Connections established so far.
    pub connects: u64,
    /// Connections lost and attempts failed so far.
    pub failures: u64,
    /// Why the last attempt failed or the connection was lost, while it
    /// is down.
    pub last_error: Option<String>,
    /// When the next attempt is due, while it is down.
    pub next_attempt: Option<std::time::Instant>,
    /// The STUN server asked.
    pub stun: Option<SocketAddr>,
    /// This endpoint's address as that STUN server saw it.
    pub public_addr: Option<SocketAddr>,
    /// The server's relay-session port, when it offers relay sessions.
    pub relay_port: Option<u16>,
}

/// Counters of an endpoint, since it was bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointStats {
    /// Datagrams the send calls did not send (every [`super::SendError`]),
    /// and DERP packets queued but not written because the connection
    /// ended.
    pub send_dropped: u64,
    /// Datagrams received and dropped because [`super::Endpoint::recv`]
    /// lagged (the receive queue was full).
    pub recv_dropped: u64,
    /// Datagrams and DERP packets received and rejected, by reason.
    pub rejected: Rejected,
    /// Of [`Rejected::stray_bind`], relay bind replies (challenge, bound)
    /// for one of this endpoint's sessions that came from an address other
    /// than that session's relay.
    pub foreign_bind_replies: u64,
    /// UDP GSO trains the kernel refused (a path MTU under 1,500 bytes),
    /// sent again one datagram at a time.
    pub gso_fallbacks: u64,
}

/// Datagrams (on the UDP socket) and DERP packets the endpoint rejected,
/// by reason. Nothing rejected reaches [`super::Endpoint::recv`] or
/// changes a path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejected {
    /// Neither a peer message nor STUN: no valid 8-byte header, an unknown
    /// protocol, a short probe, a DERP packet with a session id.
    pub malformed: u64,
    /// A payload from an address or relay session that is no peer's path,
    /// or over DERP from a key that is not a peer.
    pub unknown_source: u64,
    /// A probe from a key that is not a peer, whose sealed box does not
    /// open, or that claims another key than its DERP sender.
    pub bad_probe: u64,
    /// A STUN response this endpoint did not ask for, or from another
    /// address than the server asked.
    pub stray_stun: u64,
    /// A relay bind message for none of this endpoint's sessions, or from
    /// an address other than the session's relay.
    pub stray_bind: u64,
    /// Longer than the receive buffer (cut short), or without a source.
    pub truncated: u64,
}

impl Rejected {
    /// Every reason together.
    pub fn total(&self) -> u64 {
        self.malformed
            + self.unknown_source
            + self.bad_probe
            + self.stray_stun
            + self.stray_bind
            + self.truncated
    }
}

/// Why the driver rejected something (an index of [`RejectCounters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reject {
    Malformed,
    UnknownSource,
    BadProbe,
    StrayStun,
    StrayBind,
    Truncated,
}

/// [`Rejected`]'s live counters.
#[derive(Debug, Default)]
pub(super) struct RejectCounters([AtomicU64; 6]);

impl RejectCounters {
    pub(super) fn count(&self, why: Reject) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Rejected {
        let n = |why: Reject| self.0[why as usize].load(Ordering::Relaxed);
        Rejected {
            malformed: n(Reject::Malformed),
            unknown_source: n(Reject::UnknownSource),
            bad_probe: n(Reject::BadProbe),
            stray_stun: n(Reject::StrayStun),
            stray_bind: n(Reject::StrayBind),
            truncated: n(Reject::Truncated),
        }
    }
}
