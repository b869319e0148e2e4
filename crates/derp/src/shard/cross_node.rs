//! Relay sessions whose two keys are on different nodes of the region
//! (`docs/relay-sessions.md` §9): the host chosen by the anchor rule
//! ([`crate::mesh::route`]), the allocation carried over the mesh as
//! meshSession frames, and the offers each client gets from its own node.
//!
//! On the asker's node (the peer's key's owner shard, where version 1
//! decides): when the peer has no local connection but a mesh link
//! announced it and the asker speaks version 2, the anchor rule picks
//! the host (only if that link speaks the Ferry mesh extension: a
//! derper node, or an older Ferry, can neither host nor tell its client
//! of a session hosted here, so the asker is refused `no_host`). This node: it allocates (the peer's slot numbered by the
//! link and the link's generation here, so the peer is told once per
//! link generation), answers the asker with a cross-node relaySession2,
//! and sends the peer's offer (kind 2) to the peer's node. The peer's
//! node: the ask goes there as kind 1 and the asker's answer comes back as
//! kind 2 (an offer) or kind 3 (a refusal); nothing is kept here meanwhile
//! (the asker's own timeout covers a loss). No node can host: refused
//! `no_host` (7).
//!
//! On the host (kind 1 from the asker's node): the host must be able to
//! host (endpoints the asker can reach, else `no_host`), and the peer
//! must have an active local connection that speaks version 2; the session is made as
//! version 1 makes it (limits, per-key and per-source, with the asker's
//! source address as its node saw it), the peer gets its offer here and
//! the asker's goes back over the link; a refusal goes back as kind 3.
//!
//! On the node of the client to tell (kind 2 or 3): delivered to the
//! key's active local connection if it speaks version 2 (an offer must
//! name the sending node as its host), else dropped and counted.

use std::net::IpAddr;

use ferry_proto::mesh_session::{MeshMsg, MeshSession};
use std::time::Duration;

use ferry_proto::relay_session::v2::{self, EndReason, SessionEnd, SessionOffer2, FLAG_CROSS_NODE};
use ferry_proto::relay_session::{
    self as rs, Allocate, AllocateRequest, Ended, RefuseReason, Refused, SessionOffer, Via,
};

use super::control_queue::Origin;
use super::sessions::{refusal, RelayMail};
use super::STATE_HEARD;
use super::*;
use crate::mesh::route::{self, Host, Location, PairView};
use crate::metrics::{MeshSessionDrop, Notice};
use ferry_proto::mesh_session as ms;

/// The low bits of a remote slot's connection number.
const REMOTE_ID_MASK: u64 = (1 << 48) - 1;

impl Shard {
    /// Whether this node can host a session whose other key is elsewhere:
    /// sessions on, with endpoints a client of another node can reach.
    pub(super) fn here_can_host(&self) -> bool {
        self.shared
            .config
            .relay_sessions
            .as_ref()
            .is_some_and(|s| s.hosts_cross_node())
    }

    /// Whether the node at the other end of `link` can host: its link
    /// speaks the Ferry mesh extension and it last said it hosts sessions
    /// and is not draining.
    fn can_host(&self, link: usize) -> bool {
        let speaks = self.speaks_ferry_mesh(link);
        let state = self
            .shared
            .mesh
            .as_ref()
            .and_then(|m| m.link_state.get(link))
            .map_or(0, |s| s.load(Ordering::Acquire));
        speaks
            && state & STATE_HEARD != 0
            && state & ms::STATE_SESSIONS_ON != 0
            && state & ms::STATE_DRAINING == 0
    }

    /// Whether `link` is up and its node speaks the Ferry mesh extension.
    pub(super) fn speaks_ferry_mesh(&self, link: usize) -> bool {
        self.mesh
            .links
            .get(link)
            .is_some_and(|l| l.is_some_and(|l| l.ferry_mesh))
    }

    /// A number for a client on the node behind `link` (`id` numbers it
    /// there) that no local connection has: the session table tells each
    /// connection of a slot once.
    fn remote_conn(&self, link: usize, id: u64) -> u64 {
        1 << 63 | ((link as u64) & 0x7fff) << 48 | (id & REMOTE_ID_MASK)
    }

    /// An offer of a session this node hosts, for a pair split across
    /// nodes.
    fn cross_offer(&self, offer: SessionOffer) -> SessionOffer2 {
        SessionOffer2 {
            offer,
            host: self.shared.config.public_key,
            flags: FLAG_CROSS_NODE,
        }
    }

    /// On the peer's owner shard, a version-2 asker's relayAllocate for a
    /// peer that link `link` announced: the asker's answer now, if it has
    /// one (see the module doc).
    pub(super) fn allocate_across(
        &mut self,
        from: ConnRef,
        asker: NodePublic,
        ip: IpAddr,
        ask: &Allocate,
        link: usize,
    ) -> Option<Vec<u8>> {
        if !self.speaks_ferry_mesh(link) {
            // The peer's node (derper, or an older Ferry) can neither host
            // nor tell the peer of a session hosted here.
            self.count_refusal(v2::REFUSED_NO_HOST);
            return Some(refusal(ask, v2::REFUSED_NO_HOST));
        }
        let view = PairView {
            a: (asker, Location::Here),
            b: (ask.peer, Location::Node(link)),
            both_v2: true,
            here_can_host: self.here_can_host(),
        };
        let reason = match route::host(&view, |n| self.can_host(n)) {
            Host::Here => {
                let service = self.shared.config.relay_sessions.clone()?;
                let gen = u64::from(self.mesh.ups[link]);
                let request = AllocateRequest {
                    asker,
                    peer: ask.peer,
                    ip,
                    request_id: ask.request_id,
                    conns: [from.id(), self.remote_conn(link, gen)],
                };
                // Counted against the peer's link, like the sessions its
                // node asks for: a client here asking for sessions with
                // keys on that node fills no more of the table.
                let via = Via {
                    link: link as u16,
                    key: ask.peer,
                };
                match service.allocate_via(&request, via, self.now) {
                    Ok(offers) => {
                        if let Some(theirs) = offers.peer {
                            let msg = MeshSession {
                                dst: ask.peer,
                                msg: MeshMsg::Offer(self.cross_offer(theirs)),
                            };
                            self.send_mesh_session(link, &msg);
                        }
                        return offers.asker.map(|mine| {
                            let mut out = Vec::new();
                            v2::put_session2(&mut out, &self.cross_offer(mine));
                            out
                        });
                    }
                    Err(reason) => reason,
                }
            }
            Host::Node(n) => {
                let msg = MeshSession {
                    dst: ask.peer,
                    msg: MeshMsg::Allocate {
                        asker,
                        request_id: ask.request_id,
                        asker_ip: ip,
                        conn_id: from.id(),
                    },
                };
                if self.send_mesh_session(n, &msg) {
                    return None;
                }
                v2::REFUSED_NO_HOST
            }
            Host::NoHost => v2::REFUSED_NO_HOST,
            Host::NotInRegion | Host::NotCapable => RefuseReason::PeerNotHere,
        };
        self.count_refusal(reason);
        Some(refusal(ask, reason))
    }

    /// On the asker's owner shard: an allocate (kind 1) that came over
    /// `link` goes on to the peer's owner shard only if `link` announced
    /// the asker (a node asks only for its own clients, so a host never
    /// makes a session for a key on no node of the region); otherwise it
    /// is dropped as `not_announced` and logged (rate-limited).
    pub(super) fn on_mesh_ask(&mut self, link: usize, msg: MeshSession) {
        let MeshMsg::Allocate { asker, .. } = msg.msg else {
            return;
        };
        if self.forward.get(&asker).is_some_and(|l| l.contains(&link)) {
            let owner = self.shared.owner_of(&msg.dst, self.shards);
            return self.relay_mail_to(owner, RelayMail::Mesh { link, msg });
        }
        conn_log!(self, info, link, %asker, "mesh allocate for a key its node never announced; dropped");
        self.m.mesh_session_dropped[MeshSessionDrop::NotAnnounced as usize].inc();
    }

    /// On `msg.dst`'s owner shard: an allocation, offer or refusal that
    /// came over `link`; `Err` says why it was dropped.
    pub(super) fn on_mesh_mail(
        &mut self,
        link: usize,
        msg: MeshSession,
    ) -> Result<(), MeshSessionDrop> {
        let slot = self.keys.get(&msg.dst).and_then(|e| e.active);
        match msg.msg {
            MeshMsg::Allocate {
                asker,
                request_id,
                asker_ip,
                conn_id,
            } => {
                let peer = msg.dst;
                let verdict = match (self.shared.config.relay_sessions.clone(), slot) {
                    (None, _) => Err(RefuseReason::Off),
                    _ if !self.here_can_host() => Err(v2::REFUSED_NO_HOST),
                    _ if asker == peer => Err(RefuseReason::SelfPeer),
                    (_, None) => Err(RefuseReason::PeerNotHere),
                    (_, Some(p)) if u32::from(self.conns[p].relay_version()) < v2::VERSION => {
                        Err(RefuseReason::PeerNotCapable)
                    }
                    (Some(service), Some(p)) => {
                        let request = AllocateRequest {
                            asker,
                            peer,
                            ip: asker_ip,
                            request_id,
                            conns: [self.remote_conn(link, conn_id), self.conn_ref(p).id()],
                        };
                        let via = Via {
                            link: link as u16,
                            key: asker,
                        };
                        service
                            .allocate_via(&request, via, self.now)
                            .map(|o| (p, o))
                    }
                };
                match verdict {
                    Ok((p, offers)) => {
                        if let Some(theirs) = offers.peer {
                            let mut frame = Vec::new();
                            v2::put_session2(&mut frame, &self.cross_offer(theirs));
                            let notice = Origin::Other(Notice::RelaySession);
                            self.queue_control(p, notice, |q| q.extend_from_slice(&frame));
                        }
                        if let Some(mine) = offers.asker {
                            let msg = MeshSession {
                                dst: asker,
                                msg: MeshMsg::Offer(self.cross_offer(mine)),
                            };
                            self.send_mesh_session(link, &msg);
                        }
                    }
                    Err(reason) => {
                        self.count_refusal(reason);
                        let msg = MeshSession {
                            dst: asker,
                            msg: MeshMsg::Refused(Refused {
                                request_id,
                                peer,
                                reason,
                            }),
                        };
                        self.send_mesh_session(link, &msg);
                    }
                }
                Ok(())
            }
            MeshMsg::Offer(offer) => {
                let why = match slot {
                    None => Some((MeshSessionDrop::NotHere, RefuseReason::PeerNotHere)),
                    Some(s) if u32::from(self.conns[s].relay_version()) < v2::VERSION => {
                        Some((MeshSessionDrop::NotCapable, RefuseReason::PeerNotCapable))
                    }
                    Some(_) => None,
                };
                let (Some(slot), None) = (slot, why) else {
                    // The host frees the half-made session.
                    let (drop, reason) = why.expect("no slot, or one that cannot take it");
                    let msg = MeshSession {
                        dst: offer.offer.peer,
                        msg: MeshMsg::Declined {
                            vni: offer.offer.vni,
                            key: msg.dst,
                            reason: reason.to_u8(),
                        },
                    };
                    self.send_mesh_session(link, &msg);
                    return Err(drop);
                };
                let mut frame = Vec::new();
                v2::put_session2(&mut frame, &offer);
                let notice = Origin::Other(Notice::RelaySession);
                self.queue_control(slot, notice, |q| q.extend_from_slice(&frame));
                Ok(())
            }
            MeshMsg::Refused(r) => {
                let slot = slot.ok_or(MeshSessionDrop::NotHere)?;
                let mut frame = Vec::new();
                rs::put_refused(&mut frame, &r);
                let notice = Origin::Other(Notice::RelaySession);
                self.queue_control(slot, notice, |q| q.extend_from_slice(&frame));
                Ok(())
            }
            MeshMsg::Declined { vni, key, .. } => {
                let via = Via {
                    link: link as u16,
                    key,
                };
                self.end_remote(vni, via, false)
            }
            MeshMsg::End(end) if end.host == self.shared.config.public_key => {
                // The node of the session's other key ended it.
                let via = Via {
                    link: link as u16,
                    key: end.peer,
                };
                self.end_remote(end.vni, via, true)
            }
            MeshMsg::End(end) if Some(end.host) == self.link_key(link) => {
                let slot = slot.ok_or(MeshSessionDrop::NotHere)?;
                if u32::from(self.conns[slot].relay_version()) < v2::VERSION {
                    return Err(MeshSessionDrop::NotCapable);
                }
                let mut frame = Vec::new();
                v2::put_end(&mut frame, &end);
                let notice = Origin::Other(Notice::RelaySession);
                self.queue_control(slot, notice, |q| q.extend_from_slice(&frame));
                Ok(())
            }
            MeshMsg::End(_) => Err(MeshSessionDrop::WrongHost),
            MeshMsg::State { .. } => Err(MeshSessionDrop::Unhandled),
        }
    }

    /// Frees session `vni` hosted here for its key behind a mesh link
    /// (`via`; see [`SessionService::end_remote`]) and tells its local
    /// key; a session that is not one is dropped as `no_session`.
    ///
    /// [`SessionService::end_remote`]: ferry_proto::relay_session::SessionService::end_remote
    fn end_remote(&mut self, vni: u32, via: Via, bound_too: bool) -> Result<(), MeshSessionDrop> {
        let service = self
            .shared
            .config
            .relay_sessions
            .clone()
            .ok_or(MeshSessionDrop::NoSession)?;
        let ended = service
            .end_remote(vni, via, bound_too)
            .ok_or(MeshSessionDrop::NoSession)?;
        self.send_end(ended);
        Ok(())
    }

    /// Mesh link `link` went down (on shard 0 only): the sessions hosted
    /// here whose key behind it had not bound are freed and their local
    /// keys told.
    pub(super) fn free_link_sessions(&mut self, link: usize) {
        let Some(service) = self.shared.config.relay_sessions.clone() else {
            return;
        };
        for ended in service.link_down(link as u16) {
            self.send_end(ended);
        }
    }

    /// Tells the local key of a session this node freed
    /// (relaySessionEnd, freed), on its owner shard.
    fn send_end(&mut self, ended: Ended) {
        let end = SessionEnd {
            vni: ended.vni,
            peer: ended.remote,
            host: self.shared.config.public_key,
            reason: EndReason::Freed,
            grace: Duration::ZERO,
        };
        let owner = self.shared.owner_of(&ended.local, self.shards);
        self.relay_mail_to(owner, RelayMail::End(ended.local, end));
    }

    /// A graceful stop, on every shard before its clients hear
    /// `restarting`: each session hosted here ends (relaySessionEnd,
    /// draining, with the shutdown grace as the time it still forwards)
    /// for its keys this shard owns, so that they ask again at once on a
    /// node that stays; shard 0 also tells the keys behind mesh links
    /// (meshSession end, which their nodes pass on) and says on every
    /// Ferry mesh link that this node is draining (it hosts nothing new).
    pub(super) fn end_hosted_sessions(&mut self) {
        let Some(service) = self.shared.config.relay_sessions.clone() else {
            return;
        };
        let host = self.shared.config.public_key;
        let grace = self.shared.config.shutdown_grace;
        for h in service.hosted() {
            for (i, key) in h.keys.into_iter().enumerate() {
                let end = SessionEnd {
                    vni: h.vni,
                    peer: h.keys[1 - i],
                    host,
                    reason: EndReason::Draining,
                    grace,
                };
                match h.via {
                    Some((link, slot)) if slot == i && self.id == 0 => {
                        let msg = MeshSession {
                            dst: key,
                            msg: MeshMsg::End(end),
                        };
                        self.send_mesh_session(usize::from(link), &msg);
                    }
                    Some((_, slot)) if slot == i => {}
                    _ if self.shared.owner_of(&key, self.shards) == self.id => {
                        self.end_to(key, end);
                    }
                    _ => {}
                }
            }
        }
        if self.id == 0 {
            for link in 0..self.mesh.links.len() {
                if self.speaks_ferry_mesh(link) {
                    self.send_state(link);
                }
            }
        }
    }

    /// On `key`'s owner shard: relaySessionEnd to its active connection,
    /// if it speaks version 2.
    pub(super) fn end_to(&mut self, key: NodePublic, end: SessionEnd) {
        let Some(slot) = self.keys.get(&key).and_then(|e| e.active) else {
            return;
        };
        if u32::from(self.conns[slot].relay_version()) < v2::VERSION {
            return;
        }
        let mut frame = Vec::new();
        v2::put_end(&mut frame, &end);
        let notice = Origin::Other(Notice::RelaySession);
        self.queue_control(slot, notice, |q| q.extend_from_slice(&frame));
    }
}
