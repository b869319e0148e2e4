//! What the path manager shows of a peer ([`PeerStatus`]): every path's
//! state, round trip, limits and counters ([`PathStatus`],
//! [`PathStats`]), and the peer's totals by kind of path ([`PeerTotals`]).

use super::mtu::PathMtu;
#[cfg(doc)]
use super::paths::Paths;
use super::paths::{PathAddr, PathEvent, PathKind, PathState};
use std::time::Duration;

/// Traffic counters of one path, or of a peer's paths of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStats {
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Their bytes (application bytes, without headers).
    pub tx_bytes: u64,
    /// Datagrams received.
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Pings sent.
    pub pings: u64,
    /// Pongs that answered them.
    pub pongs: u64,
}

impl PathStats {
    /// Both counted together.
    pub fn plus(&self, other: &PathStats) -> PathStats {
        PathStats {
            tx_packets: self.tx_packets + other.tx_packets,
            tx_bytes: self.tx_bytes + other.tx_bytes,
            rx_packets: self.rx_packets + other.rx_packets,
            rx_bytes: self.rx_bytes + other.rx_bytes,
            pings: self.pings + other.pings,
            pongs: self.pongs + other.pongs,
        }
    }
}

/// A peer's traffic since it was added, by kind of path: paths come and go
/// (a relay session ends, a direct candidate is forgotten), these stay, so
/// they only ever grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerTotals {
    /// On direct paths.
    pub direct: PathStats,
    /// Through relay sessions.
    pub relay_session: PathStats,
    /// Over DERP.
    pub derp: PathStats,
}

impl PeerTotals {
    /// The counters of one kind of path.
    pub fn of(&self, kind: PathKind) -> PathStats {
        match kind {
            PathKind::Direct => self.direct,
            PathKind::RelaySession => self.relay_session,
            PathKind::Derp => self.derp,
        }
    }

    /// Every kind together.
    pub fn all(&self) -> PathStats {
        self.direct.plus(&self.relay_session).plus(&self.derp)
    }

    pub(super) fn of_mut(&mut self, kind: PathKind) -> &mut PathStats {
        match kind {
            PathKind::Direct => &mut self.direct,
            PathKind::RelaySession => &mut self.relay_session,
            PathKind::Derp => &mut self.derp,
        }
    }
}

/// One path as [`Paths::status`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStatus {
    /// Where it goes.
    pub addr: PathAddr,
    /// How large a datagram it carries.
    pub mtu: PathMtu,
    /// How it is doing.
    pub state: PathState,
    /// The last round trip measured by a ping.
    pub rtt: Option<Duration>,
    /// Its counters.
    pub stats: PathStats,
}

/// One peer as [`Paths::status`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    /// The path the next datagram takes.
    pub active: Option<PathAddr>,
    /// Every path there is now, DERP first.
    pub paths: Vec<PathStatus>,
    /// The traffic since the peer was added, by kind of path, including
    /// paths that are gone.
    pub totals: PeerTotals,
    /// The last switch.
    pub last_switch: Option<PathEvent>,
}
