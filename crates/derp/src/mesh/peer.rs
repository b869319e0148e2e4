//! One configured mesh peer: when to dial it, the connection to it, and
//! the keys it announced (capped).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::key::NodePublic;

use super::conn::MeshConn;
use super::stats::MeshPeerStats;
use crate::config::MeshPeer;

/// The keys one link's peer announced, at most `cap` of them.
pub(super) struct Announced {
    pub(super) keys: HashSet<NodePublic>,
    pub(super) cap: usize,
    /// The cap was logged (once per link, across its connections).
    warned: bool,
}

/// What a peerPresent means for the link's set.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Presence {
    /// A new key: the owner shard hears of it.
    New,
    /// Announced already: nothing changes.
    Known,
    /// New, but the set is full: dropped. `first` on the link's first.
    OverCap { first: bool },
}

impl Announced {
    pub(super) fn new(cap: usize) -> Announced {
        Announced {
            keys: HashSet::new(),
            cap,
            warned: false,
        }
    }

    pub(super) fn present(&mut self, key: NodePublic) -> Presence {
        if self.keys.contains(&key) {
            Presence::Known
        } else if self.keys.len() >= self.cap {
            Presence::OverCap {
                first: !std::mem::replace(&mut self.warned, true),
            }
        } else {
            self.keys.insert(key);
            Presence::New
        }
    }
}

/// One configured mesh peer: its counters, the connection to it (if
/// any) and when to dial again.
pub(super) struct MeshPeerState {
    pub(super) peer: MeshPeer,
    pub(super) stats: Arc<MeshPeerStats>,
    pub(super) conn: Option<MeshConn>,
    /// When to dial again (while there is no connection).
    pub(super) retry_at: Option<Instant>,
    pub(super) backoff: Duration,
    /// The peer is this relay: never dialed again.
    pub(super) is_self: bool,
    /// Keys the peer announced on this connection.
    pub(super) announced: Announced,
    /// Dials since the last successful handshake.
    pub(super) attempts: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_holds_at_most_its_cap_of_announced_keys() {
        let mut a = Announced::new(3);
        let keys: Vec<NodePublic> = (0..6u8).map(|i| NodePublic::from_bytes([i; 32])).collect();
        let got: Vec<Presence> = keys.iter().map(|&k| a.present(k)).collect();
        assert_eq!(
            got,
            [
                Presence::New,
                Presence::New,
                Presence::New,
                Presence::OverCap { first: true },
                Presence::OverCap { first: false },
                Presence::OverCap { first: false },
            ]
        );
        assert_eq!(a.keys.len(), 3);
        // Announced again: known, not refused, nothing to post.
        assert_eq!(a.present(keys[1]), Presence::Known);
        // Room again after a peerGone; the warning stays said.
        assert!(a.keys.remove(&keys[0]));
        assert_eq!(a.present(keys[4]), Presence::New);
        assert_eq!(a.present(keys[5]), Presence::OverCap { first: false });
        assert_eq!(a.keys.len(), 3);
    }
}
