//! Handshake messages: an initiation names its recipient by MAC1 and
//! leaves a pending entry, a response completes it (naming the initiator
//! by MAC1) and commits both endpoints unless that would move a live one,
//! a cookie reply goes back to whoever is waiting for it.

use std::time::Instant;

use ferry_proto::wireguard::{self as wg, Index};

use super::{
    DropReason, Endpoint, Event, Hub, PeerId, Verdict, CANDIDATE_LIFETIME, LIVE_ENDPOINT_HOLD,
    STRANGER_RESERVE,
};

impl Hub {
    pub(super) fn table_full(&self, adding: usize) -> bool {
        self.entries + adding > self.settings.max_indices
    }

    pub(super) fn initiation(
        &mut self,
        now: Instant,
        from: Endpoint,
        sender: Index,
        msg: &[u8],
    ) -> Verdict {
        let settings = self.settings.clone();
        let Some(responder) = settings
            .peers
            .iter()
            .position(|p| p.active && wg::verify_mac1(msg, &p.mac1))
            .map(|i| i as PeerId)
        else {
            return Verdict::Drop(DropReason::UnknownRecipient);
        };
        let initiator = self.by_addr.get(&from.addr).copied();
        if let Some(i) = initiator {
            if !settings.allowed(i, responder) {
                return Verdict::Drop(DropReason::NotAllowed);
            }
        }
        // Strangers (no configured peer's endpoint) may fill only part of
        // the table: whoever knows a peer's public key can make valid
        // initiations from many sources, and must not lock the known
        // peers out of their next handshake.
        let reserved = if initiator.is_none() {
            settings.max_indices / STRANGER_RESERVE
        } else {
            0
        };
        if self.table_full(1 + reserved) {
            return Verdict::Drop(DropReason::TableFull);
        }
        let target = self.endpoint(responder);
        if target.is_some_and(|t| t.addr == from.addr) {
            return Verdict::Drop(DropReason::NotAllowed);
        }
        if initiator.is_none() {
            self.emit(Event::Candidate {
                endpoint: from,
                at: now,
            });
        }
        self.emit(Event::Pending {
            index: sender,
            src: from,
            initiator,
            responder,
            at: now,
        });
        if let Some(t) = target {
            return Verdict::Forward(t);
        }
        self.flood.clear();
        for (ep, at) in self.candidates.iter().flatten() {
            if ep.addr != from.addr
                && !self.by_addr.contains_key(&ep.addr)
                && now.saturating_duration_since(*at) <= CANDIDATE_LIFETIME
            {
                self.flood.push(*ep);
            }
        }
        if self.flood.is_empty() {
            Verdict::Drop(DropReason::NoEndpoint)
        } else if !self.flood_budget.try_take_one(now) {
            Verdict::Drop(DropReason::FloodLimited)
        } else {
            Verdict::Flood
        }
    }

    pub(super) fn response(
        &mut self,
        now: Instant,
        from: Endpoint,
        sender: Index,
        receiver: Index,
        msg: &[u8],
    ) -> Verdict {
        let Some(bucket) = self.pending.get(&receiver).copied() else {
            return Verdict::Drop(DropReason::UnknownIndex);
        };
        let settings = self.settings.clone();
        let from_peer = self.by_addr.get(&from.addr).copied();
        let mut verdict = Verdict::Drop(DropReason::WrongSource);
        for p in bucket.iter().flatten() {
            // The response must come from the responder (or from an
            // address nobody owns yet: the responder, newly seen).
            if from_peer.is_some_and(|q| q != p.responder) {
                continue;
            }
            let mac_ok = |i: PeerId| wg::verify_mac1(msg, &settings.peers[usize::from(i)].mac1);
            let initiator = match p.initiator {
                Some(i) if mac_ok(i) => Some(i),
                _ => (0..settings.peers.len() as PeerId).find(|&i| {
                    i != p.responder && settings.peers[usize::from(i)].active && mac_ok(i)
                }),
            };
            let Some(initiator) = initiator else {
                verdict = Verdict::Drop(DropReason::BadMac1);
                continue;
            };
            if !settings.allowed(initiator, p.responder) {
                verdict = Verdict::Drop(DropReason::NotAllowed);
                continue;
            }
            // Anyone who knows both public keys can forge this pair of
            // messages: it must not take a working peer's traffic.
            if self.moves_live(p.responder, from, now) || self.moves_live(initiator, p.src, now) {
                verdict = Verdict::Drop(DropReason::WrongSource);
                continue;
            }
            if self.table_full(2) {
                return Verdict::Drop(DropReason::TableFull);
            }
            self.commit_endpoint(p.responder, from);
            self.commit_endpoint(initiator, p.src);
            self.emit(Event::WgSession {
                initiator_index: receiver,
                initiator,
                responder_index: sender,
                responder: p.responder,
                at: now,
            });
            return Verdict::Forward(p.src);
        }
        verdict
    }

    /// Whether committing `to` for `peer` would move an endpoint that
    /// sent fresh data within [`LIVE_ENDPOINT_HOLD`].
    fn moves_live(&self, peer: PeerId, to: Endpoint, now: Instant) -> bool {
        self.endpoint(peer).is_some_and(|e| e.addr != to.addr)
            && self.heard[usize::from(peer)]
                .is_some_and(|t| now.saturating_duration_since(t) < LIVE_ENDPOINT_HOLD)
    }

    pub(super) fn cookie(&mut self, from: Endpoint, receiver: Index) -> Verdict {
        if let Some(bucket) = self.pending.get(&receiver) {
            for p in bucket.iter().flatten() {
                let responder_at = self.endpoint(p.responder);
                let from_responder = match responder_at {
                    Some(e) => e.addr == from.addr,
                    None => !self.by_addr.contains_key(&from.addr),
                };
                if from_responder {
                    return Verdict::Forward(p.src);
                }
            }
            return Verdict::Drop(DropReason::WrongSource);
        }
        if let Some(bucket) = self.wg_sessions.get(&receiver) {
            for s in bucket.iter().flatten() {
                if self
                    .endpoint(s.partner)
                    .is_some_and(|e| e.addr == from.addr)
                {
                    return match self.endpoint(s.owner) {
                        Some(e) => Verdict::Forward(e),
                        None => Verdict::Drop(DropReason::NoEndpoint),
                    };
                }
            }
            return Verdict::Drop(DropReason::WrongSource);
        }
        Verdict::Drop(DropReason::UnknownIndex)
    }
}
