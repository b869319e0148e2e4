//! One replica among the shards': events applied here and sent to the
//! others, settings taken from the published cell, endpoints committed
//! with a version so that replicas converge, and expiry.

use std::sync::Arc;
use std::time::Instant;

use super::table::{expire_queue, insert, remove_all, remove_where, Pending, WgSession};
use super::{
    Endpoint, Event, Hub, HubSettings, NoInbox, PeerId, CANDIDATE_LIFETIME, MAX_CANDIDATES,
    PENDING_LIFETIME, WG_SESSION_LIFETIME,
};
use crate::published::Published;
use crate::ratelimit::SourceLimiter;

impl Hub {
    /// Follows the settings published in `cell` from now on (taken at
    /// the start of each [`Hub::sync`]).
    pub fn follow(&mut self, cell: Arc<Published<HubSettings>>) {
        self.published = Some((cell, u64::MAX));
        self.refresh();
    }

    /// Takes newly published settings, if any.
    pub(super) fn refresh(&mut self) {
        let Some((cell, seen)) = &mut self.published else {
            return;
        };
        let generation = cell.generation();
        if generation != *seen {
            *seen = generation;
            let settings = cell.get();
            self.reconfigure(settings);
        }
    }

    /// Switches to `new` settings: peers whose id became inactive are
    /// forgotten (endpoint, sessions and pending handshakes), new fixed
    /// endpoints are set, and the per-source limit takes the new rate
    /// (every source starts with a full bucket). Ids must be stable
    /// between the two ([`crate::live::hub_settings`]).
    pub fn reconfigure(&mut self, new: Arc<HubSettings>) {
        if Arc::ptr_eq(&new, &self.settings) {
            return;
        }
        let old = std::mem::replace(&mut self.settings, new.clone());
        if self.endpoints.len() < new.peers.len() {
            self.endpoints.resize(new.peers.len(), None);
            self.heard.resize(new.peers.len(), None);
        }
        for (i, p) in new.peers.iter().enumerate() {
            let id = i as PeerId;
            let before = old.peers.get(i).filter(|q| q.active);
            if !p.active {
                if before.is_some() {
                    self.forget(id);
                }
                continue;
            }
            if let Some(ep) = p.fixed {
                if before.and_then(|q| q.fixed) != Some(ep) {
                    let version = self.endpoints[i]
                        .map_or(0, |(_, v)| (((v >> 8) + 1) << 8) | u64::from(self.shard));
                    self.set_endpoint(id, ep, version);
                }
            }
        }
        if (old.handshake_rate, old.handshake_burst) != (new.handshake_rate, new.handshake_burst) {
            self.limiter = SourceLimiter::new(4096, new.handshake_rate, new.handshake_burst);
        }
    }

    /// Forgets everything about peer `id`: its endpoint and every session
    /// or pending handshake it is part of.
    pub(super) fn forget(&mut self, id: PeerId) {
        self.heard[usize::from(id)] = None;
        if let Some((ep, _)) = self.endpoints[usize::from(id)].take() {
            if self.by_addr.get(&ep.addr) == Some(&id) {
                self.by_addr.remove(&ep.addr);
            }
        }
        self.entries -= remove_all(&mut self.wg_sessions, |s| s.owner == id || s.partner == id);
        self.entries -= remove_all(&mut self.pending, |p| {
            p.responder == id || p.initiator == Some(id)
        });
    }

    /// Whether an event about `peers` can be applied here: each is an
    /// active peer of this replica's settings, after taking new settings
    /// if another shard already uses ids this replica does not know.
    pub(super) fn knows(&mut self, peers: &[PeerId]) -> bool {
        let n = self.settings.peers.len();
        if peers.iter().any(|&p| usize::from(p) >= n) {
            self.refresh();
        }
        peers.iter().all(|&p| {
            self.settings
                .peers
                .get(usize::from(p))
                .is_some_and(|q| q.active)
        })
    }

    /// Applies the waiting events of other shards, after taking newly
    /// published settings.
    pub fn sync(&mut self) {
        self.refresh();
        let mut inbox = std::mem::replace(&mut self.inbox, Box::new(NoInbox));
        inbox.drain(&mut |ev| self.apply(ev));
        self.inbox = inbox;
    }

    /// Forgets entries whose time is up.
    pub fn expire(&mut self, now: Instant) {
        self.entries -= expire_queue(&mut self.pending_expiry, &mut self.pending, now, |p| p.at);
        self.entries -= expire_queue(
            &mut self.wg_session_expiry,
            &mut self.wg_sessions,
            now,
            |s| s.at,
        );
        for c in &mut self.candidates {
            if c.is_some_and(|(_, at)| now.saturating_duration_since(at) > CANDIDATE_LIFETIME) {
                *c = None;
            }
        }
    }

    /// Applies one event (from this shard or another). An event about a
    /// peer that is no longer configured is dropped.
    pub fn apply(&mut self, ev: Event) {
        let known = match ev {
            Event::Pending {
                initiator,
                responder,
                ..
            } => self.knows(&[responder]) && initiator.is_none_or(|i| self.knows(&[i])),
            Event::WgSession {
                initiator,
                responder,
                ..
            } => self.knows(&[initiator, responder]),
            Event::Endpoint { peer, .. } | Event::Heard { peer, .. } => self.knows(&[peer]),
            Event::Candidate { .. } => true,
        };
        if !known {
            return;
        }
        match ev {
            Event::Pending {
                index,
                src,
                initiator,
                responder,
                at,
            } => {
                let p = Pending {
                    src,
                    initiator,
                    responder,
                    at,
                };
                let bucket = self.pending.entry(index).or_default();
                let (added, evicted) = insert(bucket, p, |old| old.src == src, |e| e.at);
                self.entries += usize::from(added);
                self.collisions += u64::from(evicted);
                self.pending_expiry
                    .push_back((at + PENDING_LIFETIME, index, at));
            }
            Event::WgSession {
                initiator_index,
                initiator,
                responder_index,
                responder,
                at,
            } => {
                if remove_where(&mut self.pending, initiator_index, |p| {
                    p.responder == responder
                }) {
                    self.entries -= 1;
                }
                for (index, owner, partner) in [
                    (initiator_index, initiator, responder),
                    (responder_index, responder, initiator),
                ] {
                    let s = WgSession {
                        owner,
                        partner,
                        at,
                        max_counter: 0,
                        roam: None,
                    };
                    let bucket = self.wg_sessions.entry(index).or_default();
                    let (added, evicted) = insert(bucket, s, |old| old.owner == owner, |e| e.at);
                    self.entries += usize::from(added);
                    self.collisions += u64::from(evicted);
                    self.wg_session_expiry
                        .push_back((at + WG_SESSION_LIFETIME, index, at));
                }
            }
            Event::Endpoint {
                peer,
                endpoint,
                version,
            } => {
                let newer = self.endpoints[usize::from(peer)].is_none_or(|(_, v)| version > v);
                if newer {
                    self.set_endpoint(peer, endpoint, version);
                }
            }
            Event::Heard { peer, at } => {
                let heard = &mut self.heard[usize::from(peer)];
                if heard.is_none_or(|t| t < at) {
                    *heard = Some(at);
                }
            }
            Event::Candidate { endpoint, at } => {
                if self.by_addr.contains_key(&endpoint.addr) {
                    return;
                }
                let slot = self
                    .candidates
                    .iter()
                    .position(|c| c.is_some_and(|(e, _)| e.addr == endpoint.addr))
                    .or_else(|| self.candidates.iter().position(|c| c.is_none()))
                    .unwrap_or_else(|| {
                        (0..MAX_CANDIDATES)
                            .min_by_key(|&i| self.candidates[i].map(|(_, t)| t))
                            .unwrap_or(0)
                    });
                self.candidates[slot] = Some((endpoint, at));
            }
        }
    }

    pub(super) fn emit(&mut self, ev: Event) {
        self.apply(ev);
        self.events.push(ev);
    }

    pub(super) fn set_endpoint(&mut self, peer: PeerId, endpoint: Endpoint, version: u64) {
        if let Some((old, _)) = self.endpoints[usize::from(peer)] {
            if self.by_addr.get(&old.addr) == Some(&peer) {
                self.by_addr.remove(&old.addr);
            }
        }
        self.endpoints[usize::from(peer)] = Some((endpoint, version));
        self.by_addr.insert(endpoint.addr, peer);
        for c in &mut self.candidates {
            if c.is_some_and(|(e, _)| e.addr == endpoint.addr) {
                *c = None;
            }
        }
    }

    /// Commits `endpoint` for `peer` if it differs from what is known.
    pub(super) fn commit_endpoint(&mut self, peer: PeerId, endpoint: Endpoint) {
        let current = self.endpoints[usize::from(peer)];
        if current.is_some_and(|(e, _)| e == endpoint) {
            return;
        }
        let counter = current.map_or(0, |(_, v)| v >> 8) + 1;
        self.emit(Event::Endpoint {
            peer,
            endpoint,
            version: (counter << 8) | u64::from(self.shard),
        });
    }
}
