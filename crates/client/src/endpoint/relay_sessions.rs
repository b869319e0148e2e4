//! Relay sessions per peer, without I/O: when to ask the relay for one,
//! binding the offered slot ([`Binder`], `docs/relay-sessions.md` §4), and
//! the bound session handed to the path manager as the peer's relay path.
//!
//! A peer's session goes `Idle` (allocation due at a time) → `Asked` (an
//! allocation sent over DERP, waiting for the offer) → `Binding` (the
//! binder exchanging bind / challenge / answer / bound with the relay's
//! session socket) → `Bound`. Both peers ask; the relay answers both with
//! the one session of the pair, so a repeated offer of the session being
//! bound is ignored. A refusal, an offer that never comes, a bind that
//! never completes, or a bound session whose relay path went silent
//! ([`RelaySessions::lost`]) starts over after a wait, with a higher bind
//! generation each time. The wait is [`SessionTiming::retry`] after the
//! first failure and doubles with each further one up to
//! [`SessionTiming::retry_max`], so a peer that never takes part (an old
//! `ferry link`, sessions off on its side, not connected) is asked rarely;
//! it starts over from the first wait once a session's path is confirmed,
//! and [`RelaySessions::reset`] (the peer came back, the relay reconnected)
//! asks again at once.
//!
//! Inputs: [`RelaySessions::want`], [`RelaySessions::handle_offer`],
//! [`RelaySessions::handle_refused`], [`RelaySessions::handle_datagram`],
//! [`RelaySessions::lost`], [`RelaySessions::ended`], [`RelaySessions::check_path`] (the path manager's view of
//! the session's path), [`RelaySessions::reset`], [`RelaySessions::handle_timeout`]. Outputs:
//! [`RelaySessions::poll_allocate`] (ask the relay, over DERP),
//! [`RelaySessions::poll_transmit`] (bind messages to send on the UDP socket),
//! [`RelaySessions::poll_change`] (the peer's relay path, or none),
//! [`RelaySessions::poll_timeout`].

use super::paths::PathState;
use ferry_proto::frame::canonical_addr;
use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::{Binder, SessionOffer, BIND_LEN};
use ferry_proto::udp_header::Header;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How persistently sessions are sought: [`SessionTiming::default`],
/// fields changed as needed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionTiming {
    /// Wait before asking again after a refusal, a failed bind or a lost
    /// session; doubled after each further failure in a row.
    pub retry: Duration,
    /// The longest wait between attempts.
    pub retry_max: Duration,
    /// How long an allocation may go unanswered.
    pub answer_timeout: Duration,
    /// A bound session whose relay path no pong confirmed this long after
    /// binding (the peer never bound its slot) is given up.
    pub confirm_within: Duration,
}

impl Default for SessionTiming {
    fn default() -> Self {
        SessionTiming {
            retry: Duration::from_secs(10),
            retry_max: Duration::from_secs(320),
            answer_timeout: Duration::from_secs(5),
            confirm_within: Duration::from_secs(10),
        }
    }
}

/// A bound session: its id and the relay address datagrams go to.
pub type RelayPath = (u32, SocketAddr);

#[derive(Debug)]
enum State {
    Idle {
        at: Instant,
    },
    Asked {
        until: Instant,
    },
    Binding(Binder),
    Bound {
        binder: Binder,
        /// When it bound.
        at: Instant,
        /// Its relay path has been seen working since.
        confirmed: bool,
    },
}

/// The relay sessions of one endpoint.
#[derive(Debug, Default)]
pub struct RelaySessions {
    timing: SessionTiming,
    peers: HashMap<NodePublic, State>,
    changes: VecDeque<(NodePublic, Option<RelayPath>)>,
    generation: u32,
    /// Failures in a row per peer since its last confirmed session.
    failures: HashMap<NodePublic, u32>,
    /// Bind messages of these sessions from addresses not their relay's.
    foreign_replies: u64,
    /// The peers whose binder has this session id, so that a bind
    /// message costs one lookup, not a look at every peer (a flood of
    /// them would otherwise cost the whole table each): one entry per
    /// binding or bound peer.
    by_vni: HashMap<u32, Vec<NodePublic>>,
}

impl SessionTiming {
    /// When to ask again after a failure, counting it.
    fn next_try(
        &self,
        failures: &mut HashMap<NodePublic, u32>,
        peer: &NodePublic,
        now: Instant,
    ) -> Instant {
        let n = failures.entry(*peer).or_insert(0);
        let delay = self
            .retry
            .saturating_mul(1u32 << (*n).min(20))
            .min(self.retry_max.max(self.retry));
        *n = n.saturating_add(1);
        tracing::debug!(%peer, failures = *n, ?delay, "no session: asking again after the wait");
        now + delay
    }
}

/// Forgets that `peer`'s binder had session `vni`.
fn unindex(by_vni: &mut HashMap<u32, Vec<NodePublic>>, vni: u32, peer: &NodePublic) {
    if let Some(peers) = by_vni.get_mut(&vni) {
        peers.retain(|p| p != peer);
        if peers.is_empty() {
            by_vni.remove(&vni);
        }
    }
}

impl RelaySessions {
    /// No sessions yet.
    pub fn new(timing: SessionTiming) -> RelaySessions {
        RelaySessions {
            timing,
            ..RelaySessions::default()
        }
    }

    /// Seek a session with `peer` (its relay offers them); asks at once.
    pub fn want(&mut self, now: Instant, peer: NodePublic) {
        self.peers.entry(peer).or_insert(State::Idle { at: now });
    }

    /// Stop: the peer is gone, or its relay no longer offers sessions.
    pub fn remove(&mut self, peer: &NodePublic) {
        self.failures.remove(peer);
        let gone = self.peers.remove(peer);
        if let Some(State::Binding(b) | State::Bound { binder: b, .. }) = &gone {
            unindex(&mut self.by_vni, b.vni(), peer);
        }
        if let Some(State::Bound { .. }) = gone {
            self.changes.push_back((*peer, None));
        }
    }

    /// The next peer to ask the relay a session for (the caller sends
    /// relayAllocate over DERP; if that fails, [`RelaySessions::lost`]).
    pub fn poll_allocate(&mut self, now: Instant) -> Option<NodePublic> {
        let (peer, state) = self
            .peers
            .iter_mut()
            .find(|(_, s)| matches!(s, State::Idle { at } if *at <= now))?;
        *state = State::Asked {
            until: now + self.timing.answer_timeout,
        };
        tracing::debug!(%peer, "asking the relay for a session");
        Some(*peer)
    }

    /// The relay offered a session (to the asker or to its peer);
    /// `relay` is the offer's endpoint the caller's socket can reach.
    pub fn handle_offer(&mut self, now: Instant, offer: &SessionOffer, relay: SocketAddr) {
        let Some(state) = self.peers.get_mut(&offer.peer) else {
            return;
        };
        if let State::Binding(b) | State::Bound { binder: b, .. } = state {
            if b.vni() == offer.vni && b.slot() == offer.slot {
                // The same session offered again (both peers asked).
                tracing::debug!(
                    peer = %offer.peer,
                    vni = offer.vni,
                    bound = b.is_bound(),
                    "session offered again: ignored"
                );
                return;
            }
        }
        let was_bound = matches!(state, State::Bound { .. });
        tracing::debug!(
            peer = %offer.peer,
            vni = offer.vni,
            slot = offer.slot,
            %relay,
            was_bound,
            "session offered: binding"
        );
        if let State::Binding(b) | State::Bound { binder: b, .. } = state {
            unindex(&mut self.by_vni, b.vni(), &offer.peer);
        }
        self.generation = self.generation.wrapping_add(1).max(1);
        *state = State::Binding(Binder::new(offer, relay, self.generation, now));
        self.by_vni.entry(offer.vni).or_default().push(offer.peer);
        if was_bound {
            self.changes.push_back((offer.peer, None));
        }
    }

    /// The relay refused an allocation for `peer`: ask again later.
    pub fn handle_refused(&mut self, now: Instant, peer: &NodePublic) {
        if let Some(state @ State::Asked { .. }) = self.peers.get_mut(peer) {
            *state = State::Idle {
                at: self.timing.next_try(&mut self.failures, peer, now),
            };
        }
    }

    /// The peer's circumstances changed (it came back to its relay, the
    /// relay reconnected): forget the failures, and if waiting to ask
    /// again, or for the answer to an ask (which may have gone out on a
    /// connection that is gone, as when a draining node's end of a
    /// session is answered at once), ask now.
    pub fn reset(&mut self, now: Instant, peer: &NodePublic) {
        self.failures.remove(peer);
        match self.peers.get_mut(peer) {
            Some(State::Idle { at }) => *at = (*at).min(now),
            Some(state @ State::Asked { .. }) => *state = State::Idle { at: now },
            _ => {}
        }
    }

    /// A control datagram from the UDP socket, sent from `from`; `true` if
    /// it was a bind message of one of these sessions (consumed).
    ///
    /// A challenge or bound counts only from the relay's session address
    /// the binder sends to: anyone who sees or guesses a session id could
    /// otherwise feed the binder a cookie of their own (its answers then
    /// fail at the relay) or a bound the relay never said (the session
    /// then carries nothing). Those from elsewhere are dropped and counted
    /// ([`RelaySessions::foreign_replies`]).
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> bool {
        let Ok(header) = Header::parse(datagram) else {
            return false;
        };
        let from = canonical_addr(from);
        let mut foreign = false;
        let candidates = self.by_vni.get(&header.vni).map_or(&[][..], Vec::as_slice);
        for peer in candidates {
            let Some(state) = self.peers.get_mut(peer) else {
                continue;
            };
            let (State::Binding(b) | State::Bound { binder: b, .. }) = state else {
                continue;
            };
            if b.vni() != header.vni {
                continue;
            }
            if canonical_addr(b.relay()) != from {
                foreign = true;
                continue;
            }
            if !b.handle(now, datagram) {
                continue;
            }
            if let State::Binding(b) = state {
                if b.is_bound() {
                    let path = (b.vni(), b.relay());
                    let bound = b.clone();
                    tracing::debug!(%peer, vni = b.vni(), "session bound");
                    *state = State::Bound {
                        binder: bound,
                        at: now,
                        confirmed: false,
                    };
                    self.changes.push_back((*peer, Some(path)));
                }
            }
            return true;
        }
        if foreign {
            self.foreign_replies += 1;
            tracing::trace!(%from, vni = header.vni, "bind message for a session from an address not its relay's: dropped");
        }
        false
    }

    /// Bind messages for one of these sessions that came from an address
    /// other than its relay's, dropped, so far.
    pub fn foreign_replies(&self) -> u64 {
        self.foreign_replies
    }

    /// The peer's session stopped working (its relay path went silent, or
    /// the allocation could not be sent): start over after the retry wait,
    /// or at once when the session had been seen working (its host may
    /// have gone: a node of the region died or restarted, and another one
    /// can host the pair now); the wait applies from the next failure.
    pub fn lost(&mut self, now: Instant, peer: &NodePublic) {
        let Some(state) = self.peers.get_mut(peer) else {
            return;
        };
        let confirmed = matches!(
            state,
            State::Bound {
                confirmed: true,
                ..
            }
        );
        tracing::debug!(%peer, confirmed, "session lost");
        if let State::Binding(b) | State::Bound { binder: b, .. } = state {
            unindex(&mut self.by_vni, b.vni(), peer);
        }
        if matches!(state, State::Bound { .. }) {
            self.changes.push_back((*peer, None));
        }
        let at = if confirmed {
            now
        } else {
            self.timing.next_try(&mut self.failures, peer, now)
        };
        *state = State::Idle { at };
    }

    /// The relay says session `vni` with `peer` ends; any other session
    /// is left alone. A draining host's session is given up and asked for
    /// again at once, whatever its state (nothing failed: its host is
    /// going, another node can host the pair); one the host freed (its
    /// peer could not be told of it) is [lost](Self::lost).
    pub fn ended(&mut self, now: Instant, peer: &NodePublic, vni: u32, draining: bool) {
        let Some(state) = self.peers.get_mut(peer) else {
            return;
        };
        let (State::Binding(b) | State::Bound { binder: b, .. }) = state else {
            return;
        };
        if b.vni() != vni {
            return;
        }
        tracing::debug!(%peer, vni, draining, "session ended by its relay");
        if !draining {
            return self.lost(now, peer);
        }
        unindex(&mut self.by_vni, vni, peer);
        if matches!(state, State::Bound { .. }) {
            self.changes.push_back((*peer, None));
        }
        *state = State::Idle { at: now };
        self.failures.remove(peer);
    }

    /// How the path manager sees the peer's relay path: a bound session
    /// whose path died, or that no pong confirmed within
    /// [`SessionTiming::confirm_within`] of binding, is lost.
    pub fn check_path(&mut self, now: Instant, peer: &NodePublic, state: Option<PathState>) {
        let Some(State::Bound { at, confirmed, .. }) = self.peers.get_mut(peer) else {
            return;
        };
        let unconfirmed = now.saturating_duration_since(*at) >= self.timing.confirm_within;
        match state {
            Some(PathState::Working) => {
                *confirmed = true;
                self.failures.remove(peer);
            }
            Some(PathState::Unconfirmed) if !unconfirmed => {}
            _ => {
                tracing::debug!(%peer, ?state, "bound session's relay path not working");
                self.lost(now, peer)
            }
        }
    }

    /// The peers with a bound session.
    pub fn bound(&self) -> Vec<NodePublic> {
        self.peers
            .iter()
            .filter(|(_, s)| matches!(s, State::Bound { .. }))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Gives up on binds and allocations past their time.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (peer, state) in &mut self.peers {
            let expired = match state {
                State::Asked { until } => *until <= now,
                State::Binding(b) => {
                    // Only the lifetime: a due retransmission is left for
                    // poll_transmit, which the caller calls next.
                    b.handle_timeout(now);
                    b.is_failed()
                }
                State::Idle { .. } | State::Bound { .. } => false,
            };
            if expired {
                let what = if matches!(state, State::Asked { .. }) {
                    "allocation unanswered"
                } else {
                    "bind lifetime passed"
                };
                tracing::debug!(%peer, what, "no session");
                if let State::Binding(b) = state {
                    unindex(&mut self.by_vni, b.vni(), peer);
                }
                *state = State::Idle {
                    at: self.timing.next_try(&mut self.failures, peer, now),
                };
            }
        }
    }

    /// The next bind message to send, and where to.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(SocketAddr, [u8; BIND_LEN])> {
        self.peers.values_mut().find_map(|s| match s {
            State::Binding(b) => b.poll_transmit(now).map(|m| (b.relay(), m)),
            _ => None,
        })
    }

    /// A peer's relay path appeared (bound) or went away.
    pub fn poll_change(&mut self) -> Option<(NodePublic, Option<RelayPath>)> {
        self.changes.pop_front()
    }

    /// When something is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.peers
            .values()
            .filter_map(|s| match s {
                State::Idle { at } => Some(*at),
                State::Asked { until } => Some(*until),
                State::Binding(b) => b.poll_timeout(),
                State::Bound { .. } => None,
            })
            .min()
    }

    /// Whether `peer` has a bound session.
    pub fn is_bound(&self, peer: &NodePublic) -> bool {
        matches!(self.peers.get(peer), Some(State::Bound { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::key::NodePrivate;
    use ferry_proto::relay_session::{BindKind, BindMsg};

    const RELAY: &str = "192.0.2.9:3479";

    fn offer(peer: NodePublic, vni: u32) -> SessionOffer {
        SessionOffer {
            request_id: 0,
            vni,
            peer,
            slot: 1,
            token: [7; 32],
            endpoints: vec![RELAY.parse().unwrap()],
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
        }
    }

    /// The relay's reply to a client's bind message sent to `to`: a
    /// challenge to a bind, bound to an answer.
    fn relay_reply(to: SocketAddr, msg: &[u8]) -> [u8; BIND_LEN] {
        assert_eq!(to, RELAY.parse().unwrap());
        let m = BindMsg::parse(msg).unwrap();
        let reply = match m.kind {
            BindKind::Bind => BindMsg {
                cookie: [3; 32],
                ..BindMsg::new(BindKind::Challenge, m.vni, m.slot, m.generation)
            },
            BindKind::Answer => BindMsg::new(BindKind::Bound, m.vni, m.slot, m.generation),
            other => panic!("client sent {other:?}"),
        };
        reply.to_bytes()
    }

    /// Plays the relay's part of one bind: challenge the bind, bound the
    /// answer.
    fn relay_answers(s: &mut RelaySessions, now: Instant) -> Option<RelayPath> {
        for _ in 0..4 {
            let Some((to, msg)) = s.poll_transmit(now) else {
                break;
            };
            assert!(s.handle_datagram(now, to, &relay_reply(to, &msg)));
        }
        s.poll_change().and_then(|(_, p)| p)
    }

    /// UDP to the relay is blocked for a while after the offer (a firewall
    /// that only lets DERP through, then opens): driven as the endpoint's
    /// driver does (at each deadline `handle_timeout`, then `poll_transmit`
    /// until empty), the binder keeps retransmitting while blocked, and the
    /// session is bound within one retransmission interval (at most 2 s) of
    /// the relay becoming reachable.
    #[test]
    fn binds_once_udp_to_the_relay_opens() {
        let start = Instant::now();
        let peer = NodePrivate::generate().public();
        for blocked in [1, 3, 8, 20] {
            let open = start + Duration::from_secs(blocked);
            let mut s = RelaySessions::new(SessionTiming::default());
            s.want(start, peer);
            assert_eq!(s.poll_allocate(start), Some(peer));
            s.handle_offer(start, &offer(peer, 0x77), RELAY.parse().unwrap());
            let (mut at, mut lost, mut bound_at) = (start, 0, None);
            for _ in 0..200 {
                s.handle_timeout(at);
                while let Some((to, msg)) = s.poll_transmit(at) {
                    if at < open {
                        lost += 1;
                    } else {
                        assert!(s.handle_datagram(at, to, &relay_reply(to, &msg)));
                    }
                }
                if let Some((p, path)) = s.poll_change() {
                    assert_eq!((p, path), (peer, Some((0x77, RELAY.parse().unwrap()))));
                    bound_at = Some(at);
                    break;
                }
                // Past the bind lifetime the session would be asked for
                // again (a new allocation): not bound in time.
                let Some(next) = s.poll_timeout().filter(|&n| n > at) else {
                    break;
                };
                at = next;
            }
            let bound_at = bound_at.unwrap_or_else(|| {
                panic!(
                    "blocked {blocked} s: not bound, {lost} binds lost, at {:?}",
                    at - start
                )
            });
            assert!(
                bound_at - open <= Duration::from_secs(2),
                "blocked {blocked} s: bound {:?} after the relay became reachable",
                bound_at - open
            );
            assert!(
                lost >= 2,
                "blocked {blocked} s: only {lost} binds sent while blocked"
            );
            assert!(s.is_bound(&peer));
        }
    }

    #[test]
    fn asks_binds_and_hands_over_the_path() {
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let mut s = RelaySessions::new(SessionTiming::default());
        s.want(now, peer);
        assert_eq!(s.poll_timeout(), Some(now));
        assert_eq!(s.poll_allocate(now), Some(peer));
        assert_eq!(s.poll_allocate(now), None, "asked once");
        s.handle_offer(now, &offer(peer, 0x42), RELAY.parse().unwrap());
        assert_eq!(
            relay_answers(&mut s, now),
            Some((0x42, RELAY.parse().unwrap()))
        );
        assert!(s.is_bound(&peer));
        // The same session offered again (the peer asked too): unchanged.
        s.handle_offer(now, &offer(peer, 0x42), RELAY.parse().unwrap());
        assert!(s.is_bound(&peer));
        assert_eq!(s.poll_transmit(now), None);
        // Nothing else's bind messages are taken.
        let stranger = BindMsg::new(BindKind::Bound, 0x43, 1, 1).to_bytes();
        assert!(!s.handle_datagram(now, RELAY.parse().unwrap(), &stranger));
    }

    /// Someone who knows the session id sends challenges with a cookie of
    /// their own and a bound, from their own address, before and while
    /// the relay's own replies come: none is taken (the binder still
    /// answers the relay's cookie, and is bound only by the relay's bound),
    /// each is counted, and the relay's replies (its address as an
    /// IPv4-mapped source too, as a dual-stack socket reports it) bind
    /// the session.
    #[test]
    fn bind_replies_count_only_from_the_relay() {
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let relay: SocketAddr = RELAY.parse().unwrap();
        let mapped: SocketAddr = "[::ffff:192.0.2.9]:3479".parse().unwrap();
        let stranger: SocketAddr = "198.51.100.66:3479".parse().unwrap();
        let mut s = RelaySessions::new(SessionTiming::default());
        s.want(now, peer);
        s.poll_allocate(now).unwrap();
        s.handle_offer(now, &offer(peer, 0x51), relay);
        let (_, bind) = s.poll_transmit(now).unwrap();
        let generation = BindMsg::parse(&bind).unwrap().generation;
        let forged_challenge = BindMsg {
            cookie: [0xee; 32],
            ..BindMsg::new(BindKind::Challenge, 0x51, 1, generation)
        }
        .to_bytes();
        let forged_bound = BindMsg::new(BindKind::Bound, 0x51, 1, generation).to_bytes();
        // Before the relay's challenge: still binding, nothing to answer.
        assert!(!s.handle_datagram(now, stranger, &forged_challenge));
        assert!(!s.handle_datagram(now, stranger, &forged_bound));
        assert_eq!(s.poll_transmit(now), None, "a forged challenge answered");
        // The relay's challenge, then more forgeries before the answer.
        let genuine = relay_reply(relay, &bind);
        assert!(s.handle_datagram(now, mapped, &genuine));
        assert!(!s.handle_datagram(now, stranger, &forged_challenge));
        assert!(!s.handle_datagram(now, stranger, &forged_bound));
        assert!(!s.is_bound(&peer), "bound by a stranger");
        let (to, answer) = s.poll_transmit(now).unwrap();
        let m = BindMsg::parse(&answer).unwrap();
        assert_eq!((to, m.kind, m.cookie), (relay, BindKind::Answer, [3; 32]));
        assert_eq!(s.foreign_replies(), 4);
        // The relay's bound binds it.
        assert!(s.handle_datagram(now, relay, &relay_reply(relay, &answer)));
        assert!(s.is_bound(&peer));
        assert_eq!(s.poll_change(), Some((peer, Some((0x51, relay)))));
    }

    /// Bind messages for a session id nobody has, from anywhere: with
    /// 2,000 peers binding, each costs one lookup as with one peer, not a
    /// look at every peer (a flood would otherwise cost the whole table
    /// per datagram). Measured as a ratio of two runs on this machine,
    /// with a wide margin: a look at every peer is about 2,000 times the
    /// work.
    #[test]
    fn a_bind_message_costs_one_lookup_however_many_sessions() {
        const FLOOD: usize = 20_000;
        let relay: SocketAddr = RELAY.parse().unwrap();
        let stranger: SocketAddr = "198.51.100.66:3479".parse().unwrap();
        let forged = BindMsg {
            cookie: [0xee; 32],
            ..BindMsg::new(BindKind::Challenge, 0xfffffe, 0, 1)
        }
        .to_bytes();
        let cost = |peers: u32| {
            let now = Instant::now();
            let mut s = RelaySessions::new(SessionTiming::default());
            for i in 0..peers {
                let mut k = [1u8; 32];
                k[..4].copy_from_slice(&i.to_be_bytes());
                let peer = NodePublic::from_bytes(k);
                s.want(now, peer);
                s.poll_allocate(now).unwrap();
                s.handle_offer(now, &offer(peer, 1 + i), relay);
            }
            let t = Instant::now();
            for _ in 0..FLOOD {
                assert!(!s.handle_datagram(now, stranger, &forged));
            }
            t.elapsed()
        };
        let one = cost(1);
        let many = cost(2000);
        assert!(
            many <= one * 5 + Duration::from_millis(20),
            "{FLOOD} bind messages: {many:?} with 2000 peers, {one:?} with one"
        );
    }

    /// The session-id index holds one entry per binding or bound peer,
    /// however many sessions came and went (offers, losses, binds that
    /// timed out, removals).
    #[test]
    fn the_session_index_follows_the_binders() {
        let t = SessionTiming {
            retry_max: SessionTiming::default().retry,
            ..SessionTiming::default()
        };
        let relay: SocketAddr = RELAY.parse().unwrap();
        let mut at = Instant::now();
        let mut s = RelaySessions::new(t.clone());
        let peers: Vec<NodePublic> = (1..=3u8).map(|n| NodePublic::from_bytes([n; 32])).collect();
        let indexed = |s: &RelaySessions| s.by_vni.values().map(Vec::len).sum::<usize>();
        let mut vni = 0;
        for round in 0..20 {
            for p in &peers {
                s.want(at, *p);
                s.poll_allocate(at);
                vni += 1;
                s.handle_offer(at, &offer(*p, vni), relay);
                if round % 3 == 0 {
                    // A second offer replaces the first.
                    vni += 1;
                    s.handle_offer(at, &offer(*p, vni), relay);
                }
            }
            assert_eq!(indexed(&s), peers.len(), "round {round}");
            match round % 3 {
                0 => peers.iter().for_each(|p| s.lost(at, p)),
                1 => {
                    at += Duration::from_secs(31);
                    s.handle_timeout(at);
                }
                _ => peers.iter().for_each(|p| s.remove(p)),
            }
            assert_eq!(indexed(&s), 0, "round {round}");
            at += t.retry_max;
        }
    }

    #[test]
    fn starts_over_after_refusal_silence_and_loss() {
        // Without the doubling: this is about what starts over.
        let t = SessionTiming {
            retry_max: SessionTiming::default().retry,
            ..SessionTiming::default()
        };
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let mut s = RelaySessions::new(t.clone());
        s.want(now, peer);
        s.poll_allocate(now).unwrap();
        s.handle_refused(now, &peer);
        assert_eq!(
            s.poll_allocate(now + t.retry - Duration::from_millis(1)),
            None
        );
        let t1 = now + t.retry;
        assert_eq!(s.poll_allocate(t1), Some(peer));
        // No answer at all.
        s.handle_timeout(t1 + t.answer_timeout);
        let t2 = t1 + t.answer_timeout + t.retry;
        assert_eq!(s.poll_allocate(t2), Some(peer));
        s.handle_offer(t2, &offer(peer, 5), RELAY.parse().unwrap());
        // A bind nobody answers fails after the bind lifetime.
        let mut at = t2;
        for _ in 0..100 {
            let _ = s.poll_transmit(at);
            at = s.poll_timeout().unwrap();
            s.handle_timeout(at);
            if s.poll_allocate(at + t.retry).is_some() {
                break;
            }
        }
        assert!(
            at - t2 >= Duration::from_secs(30),
            "gave up after {:?}",
            at - t2
        );
        assert!(
            at - t2 <= Duration::from_secs(31),
            "gave up after {:?}",
            at - t2
        );
        // Bound, then lost: the path goes, a new session is sought with a
        // higher generation.
        s.handle_offer(at, &offer(peer, 6), RELAY.parse().unwrap());
        let (_, first) = s.poll_transmit(at).unwrap();
        let generation = BindMsg::parse(&first).unwrap().generation;
        let reply = BindMsg {
            cookie: [3; 32],
            ..BindMsg::new(BindKind::Challenge, 6, 1, generation)
        };
        assert!(s.handle_datagram(at, RELAY.parse().unwrap(), &reply.to_bytes()));
        assert!(relay_answers(&mut s, at).is_some());
        s.lost(at, &peer);
        assert_eq!(s.poll_change(), Some((peer, None)));
        let again = at + t.retry;
        assert_eq!(s.poll_allocate(again), Some(peer));
        s.handle_offer(again, &offer(peer, 6), RELAY.parse().unwrap());
        let (_, bind) = s.poll_transmit(again).unwrap();
        assert!(BindMsg::parse(&bind).unwrap().generation > generation);
        s.remove(&peer);
        assert_eq!(s.poll_timeout(), None);
    }

    /// The times a peer is asked for, driven as the endpoint's driver
    /// does, from `from` until `until`; `answer` plays the relay and the
    /// peer for each allocation.
    fn asked_at(
        s: &mut RelaySessions,
        peer: NodePublic,
        from: Instant,
        until: Instant,
        mut answer: impl FnMut(&mut RelaySessions, Instant),
    ) -> Vec<Instant> {
        let mut asked = Vec::new();
        let mut at = from;
        for _ in 0..10_000 {
            s.handle_timeout(at);
            for p in s.bound() {
                s.check_path(at, &p, Some(PathState::Unconfirmed));
            }
            while s.poll_change().is_some() {}
            if let Some(p) = s.poll_allocate(at) {
                assert_eq!(p, peer);
                asked.push(at);
                answer(s, at);
            }
            while s.poll_transmit(at).is_some() {}
            // A bound session has no deadline of its own: the driver
            // checks its path at the path manager's (every second or so).
            let checks = (!s.bound().is_empty()).then(|| at + Duration::from_secs(1));
            match s.poll_timeout().or(checks) {
                Some(next) if next > at && next < until => at = next,
                Some(next) if next <= at => {}
                _ => break,
            }
        }
        asked
    }

    /// A peer that never takes part: its allocations go unanswered (or
    /// are refused, or the session is bound but never confirmed because the
    /// peer never binds). The waits double from 10 s to the cap instead of
    /// staying at 10 s; a reset asks at once and starts the waits over; a
    /// confirmed session forgets the failures.
    #[test]
    fn a_peer_that_never_takes_part_is_asked_ever_more_rarely() {
        let t = SessionTiming::default();
        let start = Instant::now();
        let peer = NodePrivate::generate().public();
        let hour = start + Duration::from_secs(3600);
        let gaps = |asked: &[Instant], after: Duration| -> Vec<Duration> {
            asked.windows(2).map(|w| w[1] - w[0] - after).collect()
        };
        let expected = |n: usize| -> Vec<Duration> {
            (0..n)
                .map(|i| (t.retry * (1 << i.min(20))).min(t.retry_max))
                .collect()
        };
        // Unanswered: each attempt waits answer_timeout, then the backoff.
        let mut s = RelaySessions::new(t.clone());
        s.want(start, peer);
        let asked = asked_at(&mut s, peer, start, hour, |_, _| {});
        let g = gaps(&asked, t.answer_timeout);
        assert_eq!(g, expected(g.len()), "unanswered");
        assert_eq!(g[..6], expected(6)[..]);
        assert!(asked.len() < 20, "{} allocations in an hour", asked.len());
        // Refused at once.
        let mut s = RelaySessions::new(t.clone());
        s.want(start, peer);
        let asked = asked_at(&mut s, peer, start, hour, |s, at| {
            s.handle_refused(at, &peer)
        });
        let g = gaps(&asked, Duration::ZERO);
        assert_eq!(g, expected(g.len()), "refused");
        // Bound, but the peer never binds its slot: never confirmed.
        let mut s = RelaySessions::new(t.clone());
        s.want(start, peer);
        let mut vni = 0;
        let asked = asked_at(&mut s, peer, start, hour, |s, at| {
            vni += 1;
            s.handle_offer(at, &offer(peer, vni), RELAY.parse().unwrap());
            assert!(relay_answers(s, at).is_some());
        });
        let g = gaps(&asked, t.confirm_within);
        assert_eq!(g, expected(g.len()), "never confirmed");
        assert!(g.len() >= 6, "{g:?}");

        // A reset asks at once and starts over from the first wait.
        let mut s = RelaySessions::new(t.clone());
        s.want(start, peer);
        let asked = asked_at(
            &mut s,
            peer,
            start,
            start + Duration::from_secs(400),
            |s, at| s.handle_refused(at, &peer),
        );
        let at = *asked.last().unwrap() + Duration::from_secs(1);
        assert_eq!(s.poll_allocate(at), None);
        s.reset(at, &peer);
        assert_eq!(s.poll_allocate(at), Some(peer));
        s.handle_refused(at, &peer);
        assert_eq!(
            s.poll_allocate(at + t.retry),
            Some(peer),
            "first wait again"
        );

        // A confirmed session forgets the failures: lost later, it is
        // asked again at once, and a refusal then waits the first wait.
        s.handle_offer(at + t.retry, &offer(peer, 99), RELAY.parse().unwrap());
        assert!(relay_answers(&mut s, at + t.retry).is_some());
        let later = at + t.retry + Duration::from_secs(1);
        s.check_path(later, &peer, Some(PathState::Working));
        s.lost(later, &peer);
        assert_eq!(s.poll_allocate(later), Some(peer));
        s.handle_refused(later, &peer);
        assert_eq!(
            s.poll_allocate(later + t.retry - Duration::from_millis(1)),
            None
        );
        assert_eq!(s.poll_allocate(later + t.retry), Some(peer));
    }

    #[test]
    fn a_bound_session_is_lost_when_its_path_dies_or_is_never_confirmed() {
        let t = SessionTiming::default();
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let bind = |s: &mut RelaySessions, at: Instant, vni: u32| {
            s.want(at, peer);
            s.poll_allocate(at).unwrap();
            s.handle_offer(at, &offer(peer, vni), RELAY.parse().unwrap());
            assert!(relay_answers(s, at).is_some());
        };
        let mut s = RelaySessions::new(t.clone());
        bind(&mut s, now, 9);
        assert_eq!(s.bound(), vec![peer]);
        let soon = now + t.confirm_within - Duration::from_millis(1);
        s.check_path(soon, &peer, Some(PathState::Unconfirmed));
        s.check_path(soon, &peer, Some(PathState::Working));
        assert!(s.is_bound(&peer));
        s.check_path(now + t.confirm_within, &peer, Some(PathState::Unconfirmed));
        assert!(!s.is_bound(&peer));
        assert_eq!(s.poll_change(), Some((peer, None)));

        let mut s = RelaySessions::new(t.clone());
        bind(&mut s, now, 9);
        s.check_path(now, &peer, Some(PathState::Dead));
        assert!(!s.is_bound(&peer));
        let mut s = RelaySessions::new(t);
        bind(&mut s, now, 9);
        s.check_path(now, &peer, None);
        assert!(!s.is_bound(&peer), "no relay path at all");
    }

    #[test]
    fn a_session_seen_working_is_asked_again_at_once_when_lost() {
        let t = SessionTiming::default();
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let mut s = RelaySessions::new(t.clone());
        s.want(now, peer);
        s.poll_allocate(now).unwrap();
        s.handle_offer(now, &offer(peer, 9), RELAY.parse().unwrap());
        assert!(relay_answers(&mut s, now).is_some());
        s.check_path(now, &peer, Some(PathState::Working));
        // Its host goes: the path dies; the peer is asked for at once.
        let later = now + Duration::from_secs(60);
        s.check_path(later, &peer, Some(PathState::Dead));
        assert_eq!(s.poll_change(), Some((peer, None)));
        assert_eq!(
            s.poll_allocate(later),
            Some(peer),
            "not asked again at once"
        );
        // The new ask is refused: from now on, the wait.
        s.handle_refused(later, &peer);
        assert_eq!(
            s.poll_allocate(later + t.retry - Duration::from_millis(1)),
            None
        );
        assert_eq!(s.poll_allocate(later + t.retry), Some(peer));
        // A session never seen working that is lost waits too.
        s.handle_offer(later + t.retry, &offer(peer, 10), RELAY.parse().unwrap());
        let bound_at = later + t.retry;
        assert!(relay_answers(&mut s, bound_at).is_some());
        s.check_path(bound_at, &peer, Some(PathState::Dead));
        assert_eq!(s.poll_allocate(bound_at + Duration::from_secs(1)), None);
    }

    #[test]
    fn a_draining_host_s_end_asks_again_at_once_and_only_for_its_session() {
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let mut s = RelaySessions::new(SessionTiming::default());
        s.want(now, peer);
        s.poll_allocate(now).unwrap();
        s.handle_offer(now, &offer(peer, 9), RELAY.parse().unwrap());
        assert!(relay_answers(&mut s, now).is_some());
        s.ended(now, &peer, 8, true);
        assert!(s.is_bound(&peer), "another session's end is ignored");
        // Never confirmed: a loss would wait; a drain does not.
        s.ended(now, &peer, 9, true);
        assert_eq!(s.poll_change(), Some((peer, None)));
        assert_eq!(s.poll_allocate(now), Some(peer), "not asked again at once");
        // That ask went out on the draining node's connection; the relay
        // reconnects: asked again, not after the answer timeout.
        assert_eq!(s.poll_allocate(now), None);
        s.reset(now, &peer);
        assert_eq!(
            s.poll_allocate(now),
            Some(peer),
            "the lost ask not repeated"
        );
        // A session freed (not drained) and never confirmed: the wait.
        s.handle_offer(now, &offer(peer, 10), RELAY.parse().unwrap());
        assert!(relay_answers(&mut s, now).is_some());
        s.ended(now, &peer, 10, false);
        assert!(!s.is_bound(&peer));
        assert_eq!(s.poll_allocate(now + Duration::from_secs(1)), None);
    }
}
