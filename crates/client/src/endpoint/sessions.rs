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
//! ([`Sessions::lost`]) starts over after [`SessionTiming::retry`], with a
//! higher bind generation each time.
//!
//! Inputs: [`Sessions::want`], [`Sessions::handle_offer`],
//! [`Sessions::handle_refused`], [`Sessions::handle_datagram`],
//! [`Sessions::lost`], [`Sessions::check_path`] (the path manager's view of
//! the session's path), [`Sessions::handle_timeout`]. Outputs:
//! [`Sessions::poll_allocate`] (ask the relay, over DERP),
//! [`Sessions::poll_transmit`] (bind messages to send on the UDP socket),
//! [`Sessions::poll_change`] (the peer's relay path, or none),
//! [`Sessions::poll_timeout`].

use super::paths::PathState;
use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::{Binder, SessionOffer, BIND_LEN};
use ferry_proto::udp_header::Header;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How persistently sessions are sought.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionTiming {
    /// Wait before asking again after a refusal, a failed bind or a lost
    /// session.
    pub retry: Duration,
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
            answer_timeout: Duration::from_secs(5),
            confirm_within: Duration::from_secs(10),
        }
    }
}

/// A bound session: its id and the relay address datagrams go to.
pub type RelayPath = (u32, SocketAddr);

#[derive(Debug)]
enum State {
    Idle { at: Instant },
    Asked { until: Instant },
    Binding(Binder),
    Bound(Binder, Instant),
}

/// The relay sessions of one endpoint.
#[derive(Debug, Default)]
pub struct Sessions {
    timing: SessionTiming,
    peers: HashMap<NodePublic, State>,
    changes: VecDeque<(NodePublic, Option<RelayPath>)>,
    generation: u32,
}

impl Sessions {
    /// No sessions yet.
    pub fn new(timing: SessionTiming) -> Sessions {
        Sessions {
            timing,
            ..Sessions::default()
        }
    }

    /// Seek a session with `peer` (its relay offers them); asks at once.
    pub fn want(&mut self, now: Instant, peer: NodePublic) {
        self.peers.entry(peer).or_insert(State::Idle { at: now });
    }

    /// Stop: the peer is gone, or its relay no longer offers sessions.
    pub fn remove(&mut self, peer: &NodePublic) {
        if let Some(State::Bound(..)) = self.peers.remove(peer) {
            self.changes.push_back((*peer, None));
        }
    }

    /// The next peer to ask the relay a session for (the caller sends
    /// relayAllocate over DERP; if that fails, [`Sessions::lost`]).
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
        if let State::Binding(b) | State::Bound(b, _) = state {
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
        let was_bound = matches!(state, State::Bound(..));
        tracing::debug!(
            peer = %offer.peer,
            vni = offer.vni,
            slot = offer.slot,
            %relay,
            was_bound,
            "session offered: binding"
        );
        self.generation = self.generation.wrapping_add(1).max(1);
        *state = State::Binding(Binder::new(offer, relay, self.generation, now));
        if was_bound {
            self.changes.push_back((offer.peer, None));
        }
    }

    /// The relay refused an allocation for `peer`: ask again later.
    pub fn handle_refused(&mut self, now: Instant, peer: &NodePublic) {
        if let Some(state @ State::Asked { .. }) = self.peers.get_mut(peer) {
            *state = State::Idle {
                at: now + self.timing.retry,
            };
        }
    }

    /// A control datagram from the UDP socket; `true` if it was a bind
    /// message of one of these sessions (consumed).
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) -> bool {
        let Ok(header) = Header::parse(datagram) else {
            return false;
        };
        for (peer, state) in &mut self.peers {
            let (State::Binding(b) | State::Bound(b, _)) = state else {
                continue;
            };
            if b.vni() != header.vni || !b.handle(now, datagram) {
                continue;
            }
            if let State::Binding(b) = state {
                if b.is_bound() {
                    let path = (b.vni(), b.relay());
                    let bound = b.clone();
                    tracing::debug!(%peer, vni = b.vni(), "session bound");
                    *state = State::Bound(bound, now);
                    self.changes.push_back((*peer, Some(path)));
                }
            }
            return true;
        }
        false
    }

    /// The peer's session stopped working (its relay path went silent, or
    /// the allocation could not be sent): start over after the retry wait.
    pub fn lost(&mut self, now: Instant, peer: &NodePublic) {
        let Some(state) = self.peers.get_mut(peer) else {
            return;
        };
        tracing::debug!(%peer, "session lost: asking again after the retry wait");
        if matches!(state, State::Bound(..)) {
            self.changes.push_back((*peer, None));
        }
        *state = State::Idle {
            at: now + self.timing.retry,
        };
    }

    /// How the path manager sees the peer's relay path: a bound session
    /// whose path died, or that no pong confirmed within
    /// [`SessionTiming::confirm_within`] of binding, is lost.
    pub fn check_path(&mut self, now: Instant, peer: &NodePublic, state: Option<PathState>) {
        let Some(State::Bound(_, at)) = self.peers.get(peer) else {
            return;
        };
        let unconfirmed = now.saturating_duration_since(*at) >= self.timing.confirm_within;
        match state {
            Some(PathState::Working) => {}
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
            .filter(|(_, s)| matches!(s, State::Bound(..)))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Gives up on binds and allocations past their time.
    pub fn handle_timeout(&mut self, now: Instant) {
        let retry = now + self.timing.retry;
        for state in self.peers.values_mut() {
            let expired = match state {
                State::Asked { until } => *until <= now,
                State::Binding(b) => {
                    // Only the lifetime: a due retransmission is left for
                    // poll_transmit, which the caller calls next.
                    b.handle_timeout(now);
                    b.is_failed()
                }
                State::Idle { .. } | State::Bound(..) => false,
            };
            if expired {
                let what = if matches!(state, State::Asked { .. }) {
                    "allocation unanswered"
                } else {
                    "bind lifetime passed"
                };
                tracing::debug!(what, "no session: asking again after the retry wait");
                *state = State::Idle { at: retry };
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
                State::Bound(..) => None,
            })
            .min()
    }

    /// Whether `peer` has a bound session.
    pub fn is_bound(&self, peer: &NodePublic) -> bool {
        matches!(self.peers.get(peer), Some(State::Bound(..)))
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
    fn relay_answers(s: &mut Sessions, now: Instant) -> Option<RelayPath> {
        for _ in 0..4 {
            let Some((to, msg)) = s.poll_transmit(now) else {
                break;
            };
            assert!(s.handle_datagram(now, &relay_reply(to, &msg)));
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
            let mut s = Sessions::new(SessionTiming::default());
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
                        assert!(s.handle_datagram(at, &relay_reply(to, &msg)));
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
        let mut s = Sessions::new(SessionTiming::default());
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
        assert!(!s.handle_datagram(now, &stranger));
    }

    #[test]
    fn starts_over_after_refusal_silence_and_loss() {
        let t = SessionTiming::default();
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let mut s = Sessions::new(t.clone());
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
        assert!(s.handle_datagram(at, &reply.to_bytes()));
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

    #[test]
    fn a_bound_session_is_lost_when_its_path_dies_or_is_never_confirmed() {
        let t = SessionTiming::default();
        let now = Instant::now();
        let peer = NodePrivate::generate().public();
        let bind = |s: &mut Sessions, at: Instant, vni: u32| {
            s.want(at, peer);
            s.poll_allocate(at).unwrap();
            s.handle_offer(at, &offer(peer, vni), RELAY.parse().unwrap());
            assert!(relay_answers(s, at).is_some());
        };
        let mut s = Sessions::new(t.clone());
        bind(&mut s, now, 9);
        assert_eq!(s.bound(), vec![peer]);
        let soon = now + t.confirm_within - Duration::from_millis(1);
        s.check_path(soon, &peer, Some(PathState::Unconfirmed));
        s.check_path(soon, &peer, Some(PathState::Working));
        assert!(s.is_bound(&peer));
        s.check_path(now + t.confirm_within, &peer, Some(PathState::Unconfirmed));
        assert!(!s.is_bound(&peer));
        assert_eq!(s.poll_change(), Some((peer, None)));

        let mut s = Sessions::new(t.clone());
        bind(&mut s, now, 9);
        s.check_path(now, &peer, Some(PathState::Dead));
        assert!(!s.is_bound(&peer));
        let mut s = Sessions::new(t);
        bind(&mut s, now, 9);
        s.check_path(now, &peer, None);
        assert!(!s.is_bound(&peer), "no relay path at all");
    }
}
