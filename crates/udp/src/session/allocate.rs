//! Allocation (`docs/relay-sessions.md` §2, §5): who a session counts
//! against, and who hears of it.
//!
//! - A session counts against a key once the key **takes part**: it asked
//!   for the session, or bound its slot. A key takes part in at most
//!   [`Limits::per_key`](super::Limits::per_key) sessions; beyond, its own requests are refused
//!   ([`RefuseReason::Limit`]).
//! - A key is *in* at most `per_key` sessions, whether or not it took
//!   part. When a new session needs room in a key's list, the oldest
//!   session of that key it never took part in (opened by someone else,
//!   its slot unbound) gives way; only if there is none is the request
//!   refused. So strangers asking for sessions with a key can neither lock
//!   it out of its own nor keep more than `per_key` sessions with it.
//! - Sessions asked for from one source (the asker's DERP connection's
//!   IPv4 address, or IPv6 /64) are limited to
//!   [`Limits::per_ip`](super::Limits::per_ip).
//! - A new session is offered to both keys. Asking again for an existing
//!   session answers the asker, on the same DERP connection at most once
//!   per [`Limits::answer_interval`](super::Limits::answer_interval) (a repeat within it is counted and
//!   not answered); the peer is told again only on a connection that has
//!   not heard of the session (the peer reconnected). So however often a
//!   client asks, its peer hears of their session once per connection.

use std::net::IpAddr;
use std::time::Instant;

use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::{RefuseReason, Via};
use ferry_proto::udp_header;
use rand::Rng;

use super::{pair, Allocation, Freed, Session, SessionTable, Told};

/// Attempts at a random unused VNI before the allocation is refused.
const VNI_TRIES: usize = 64;

/// What the per-IP limit counts a source as: an IPv4 address (also when
/// mapped into IPv6), or an IPv6 address's /64.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

impl SessionTable {
    /// [`SessionTable::allocate_on`] for callers without connections to
    /// tell apart (tests, fuzzing): every call as from the same two.
    pub fn allocate(
        &mut self,
        asker: &NodePublic,
        peer: &NodePublic,
        ip: IpAddr,
        now: Instant,
    ) -> Result<Allocation, RefuseReason> {
        self.allocate_on(asker, peer, ip, [0, 0], now)
    }

    /// The session of `asker` and `peer`, made if they have none (the
    /// module doc says when room is made and who is told): a new one gives
    /// the asker slot 0, an existing one is returned unchanged (each keeps
    /// its slot). `ip` is the asker's DERP connection's source address;
    /// `conns` number the asker's and the peer's DERP connections. Refuses
    /// [`RefuseReason::SelfPeer`] and [`RefuseReason::Limit`].
    pub fn allocate_on(
        &mut self,
        asker: &NodePublic,
        peer: &NodePublic,
        ip: IpAddr,
        conns: [u64; 2],
        now: Instant,
    ) -> Result<Allocation, RefuseReason> {
        self.allocate_via(asker, peer, ip, conns, None, now)
    }

    /// [`SessionTable::allocate_on`] for a pair one of whose keys
    /// (`via.key`) is behind the DERP server's mesh link `via.link` (a
    /// pair split across the nodes of a region): a new session also
    /// counts against that link, and remembers the key's slot
    /// ([`SessionTable::link_down`], [`SessionTable::end_remote`]); a link
    /// holds at most [`Limits::per_link`](super::Limits::per_link)
    /// (beyond, [`RefuseReason::Limit`]).
    pub fn allocate_via(
        &mut self,
        asker: &NodePublic,
        peer: &NodePublic,
        ip: IpAddr,
        conns: [u64; 2],
        via: Option<Via>,
        now: Instant,
    ) -> Result<Allocation, RefuseReason> {
        if asker == peer {
            return Err(RefuseReason::SelfPeer);
        }
        if let Some(&vni) = self.by_pair.get(&pair(asker, peer)) {
            return Ok(self.again(vni, asker, conns, now));
        }
        let ip = source_key(ip);
        if via.is_some_and(|v| self.via_link(v.link) >= self.limits.per_link) {
            self.counters.refused_link += 1;
            return self.refuse();
        }
        if self.taken_part(asker) >= self.limits.per_key
            || self.per_ip.get(&ip).copied().unwrap_or(0) >= self.limits.per_ip
        {
            return self.refuse();
        }
        let (Some(room_asker), Some(room_peer)) = (self.room_for(asker), self.room_for(peer))
        else {
            return self.refuse();
        };
        let Some(vni) = (0..VNI_TRIES)
            .map(|_| self.rng.gen_range(1..=udp_header::MAX_VNI))
            .find(|v| !self.sessions.contains_key(v))
        else {
            return self.refuse();
        };
        for gone in [room_asker, room_peer].into_iter().flatten() {
            self.free(gone, Freed::Evicted);
        }
        let tokens = [self.rng.gen(), self.rng.gen()];
        self.sessions.insert(
            vni,
            Session {
                keys: [*asker, *peer],
                tokens,
                bound: [None, None],
                joined: [true, false],
                told: [
                    Told {
                        conn: Some(conns[0]),
                        answered: Some(now),
                    },
                    Told {
                        conn: Some(conns[1]),
                        answered: None,
                    },
                ],
                ip,
                via: via.map(|v| (v.link, usize::from(v.key == *peer))),
                created: now,
                last_active: now,
            },
        );
        self.by_pair.insert(pair(asker, peer), vni);
        for k in [asker, peer] {
            self.by_key.entry(*k).or_default().push(vni);
        }
        *self.per_ip.entry(ip).or_default() += 1;
        if let Some(v) = via {
            *self.per_link.entry(v.link).or_default() += 1;
        }
        self.counters.allocated += 1;
        Ok(Allocation {
            vni,
            slot: 0,
            tokens,
            existing: false,
            tell_asker: true,
            tell_peer: true,
        })
    }

    /// The asker asks again for session `vni`: it takes part, and it and
    /// the peer are told per the module doc.
    fn again(&mut self, vni: u32, asker: &NodePublic, conns: [u64; 2], now: Instant) -> Allocation {
        let interval = self.limits.answer_interval;
        let s = self.sessions.get_mut(&vni).expect("paired sessions exist");
        let mine = s.slot_of(asker);
        let theirs = 1 - mine;
        s.joined[mine] = true;
        let repeat = matches!(
            s.told[mine],
            Told { conn: Some(c), answered: Some(at) }
                if c == conns[0] && now.saturating_duration_since(at) < interval
        );
        if !repeat {
            s.told[mine] = Told {
                conn: Some(conns[0]),
                answered: Some(now),
            };
        }
        let tell_peer = s.told[theirs].conn != Some(conns[1]);
        if tell_peer {
            s.told[theirs] = Told {
                conn: Some(conns[1]),
                answered: None,
            };
        }
        let allocation = Allocation {
            vni,
            slot: mine as u8,
            tokens: s.tokens,
            existing: true,
            tell_asker: !repeat,
            tell_peer,
        };
        self.counters.reused += 1;
        if repeat {
            self.counters.repeats_unanswered += 1;
        }
        allocation
    }

    fn refuse(&mut self) -> Result<Allocation, RefuseReason> {
        self.counters.refused_limit += 1;
        Err(RefuseReason::Limit)
    }

    /// Sessions `key` took part in.
    pub fn taken_part(&self, key: &NodePublic) -> usize {
        self.by_key.get(key).map_or(0, |list| {
            list.iter()
                .filter(|v| self.sessions[*v].joined[self.sessions[*v].slot_of(key)])
                .count()
        })
    }

    /// Room for one more session in `key`'s list: `Some(None)` if there is
    /// some, `Some(Some(vni))` if session `vni` (the oldest `key` never
    /// took part in) must give way, `None` if none can.
    fn room_for(&self, key: &NodePublic) -> Option<Option<u32>> {
        let Some(list) = self.by_key.get(key) else {
            return Some(None);
        };
        if list.len() < self.limits.per_key {
            return Some(None);
        }
        list.iter()
            .copied()
            .filter(|v| {
                let s = &self.sessions[v];
                !s.joined[s.slot_of(key)]
            })
            .min_by_key(|v| self.sessions[v].created)
            .map(Some)
    }
}
