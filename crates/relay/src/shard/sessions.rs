//! Relay sessions on the DERP side (`docs/relay-sessions.md` §1, §2): the
//! capability in serverInfo, relayAllocate from a client that asked, and
//! the relaySession offers to both peers (or a relayRefused to the asker).
//!
//! The session table and its UDP socket live outside this crate (in
//! `ferry-udp`, glued by the `ferry` binary) behind [`SessionService`].
//!
//! A relayAllocate is read on the asker's shard (its key's owner) and
//! handled on the peer's key's owner shard, which alone knows whether the
//! peer is connected and asked for sessions: the asker's shard mails the
//! request there when it is another shard. The peer's offer is queued
//! there; the asker's offer (or refusal) goes back by mail to the asker's
//! connection, like any cross-shard control message.

use std::net::IpAddr;

use ferry_proto::relay_session::{self as rs, Allocate, RefuseReason, Refused};

use super::*;

pub use ferry_proto::relay_session::SessionService;

/// An allocation on its way to the peer's owner shard, or an answer on its
/// way back to the asker's.
pub enum RelayMail {
    /// Handle this relayAllocate here (the peer's key is this shard's).
    Ask {
        /// The asking connection.
        from: ConnRef,
        /// Its key.
        asker: NodePublic,
        /// Its DERP source address.
        ip: IpAddr,
        /// What it asked.
        ask: Allocate,
    },
    /// Queue this relaySession or relayRefused frame to a connection here.
    Frame(ConnRef, Vec<u8>),
}

impl Shard {
    fn session_service(&self) -> Option<&Arc<dyn SessionService>> {
        self.shared.config.relay_sessions.as_ref()
    }

    /// Whether a client's clientInfo asks for sessions this relay offers.
    pub(super) fn wants_relay_sessions(&self, info: &handshake::ClientInfo) -> bool {
        info.ferry_relay >= rs::VERSION && self.session_service().is_some()
    }

    /// The capability for a client's serverInfo.
    pub(super) fn relay_capability(&self, slot: Slot) -> Option<handshake::RelayCapability> {
        let service = self.session_service()?;
        self.conns[slot]
            .has_relay_sessions()
            .then(|| handshake::RelayCapability {
                version: rs::VERSION,
                port: service.port(),
            })
    }

    /// A relayAllocate from the client in `slot` (admitted by the frame
    /// policy only for clients that asked).
    pub(super) fn on_relay_allocate(&mut self, slot: Slot, payload: &[u8]) -> ControlFlow<()> {
        let ask = match rs::parse_allocate(payload) {
            Ok(a) => a,
            Err(e) => {
                let peer = self.conns[slot].peer();
                conn_log!(self, info, %peer, error = %e, "malformed frame; closing connection");
                self.finish(slot, CloseReason::FrameError);
                return ControlFlow::Break(());
            }
        };
        let conn = &self.conns[slot];
        let (asker, ip) = (conn.key(), conn.peer().ip());
        let from = self.conn_ref(slot);
        let owner = self.shared.owner_of(&ask.peer, self.shards);
        let mail = RelayMail::Ask {
            from,
            asker,
            ip,
            ask,
        };
        if owner == self.id {
            self.on_relay_mail(mail);
        } else {
            self.mail(owner, Mail::Relay(mail));
        }
        ControlFlow::Continue(())
    }

    pub(super) fn on_relay_mail(&mut self, mail: RelayMail) {
        match mail {
            RelayMail::Ask {
                from,
                asker,
                ip,
                ask,
            } => {
                let frame = self.allocate_here(&asker, ip, &ask);
                self.relay_frame_to(from, frame);
            }
            RelayMail::Frame(to, frame) => self.relay_frame_to(to, frame),
        }
    }

    /// On the peer's owner shard: the asker's answer, after queueing the
    /// peer's offer if there is one.
    fn allocate_here(&mut self, asker: &NodePublic, ip: IpAddr, ask: &Allocate) -> Vec<u8> {
        let mut out = Vec::new();
        let refuse = |out: &mut Vec<u8>, reason| {
            rs::put_refused(
                out,
                &Refused {
                    request_id: ask.request_id,
                    peer: ask.peer,
                    reason,
                },
            );
        };
        let peer_slot = self.keys.get(&ask.peer).and_then(|e| e.active);
        let verdict = match (self.session_service(), peer_slot) {
            (None, _) => Err(RefuseReason::Off),
            _ if *asker == ask.peer => Err(RefuseReason::SelfPeer),
            (_, None) => Err(RefuseReason::PeerNotHere),
            (_, Some(p)) if !self.conns[p].has_relay_sessions() => {
                Err(RefuseReason::PeerNotCapable)
            }
            (Some(service), Some(p)) => service
                .allocate(asker, &ask.peer, ip, ask.request_id)
                .map(|offers| (p, offers)),
        };
        match verdict {
            Ok((p, [mine, theirs])) => {
                rs::put_session(self.conns[p].session_mut().control_mut(), &theirs);
                self.mark_dirty(p);
                rs::put_session(&mut out, &mine);
            }
            Err(reason) => refuse(&mut out, reason),
        }
        out
    }

    /// Queues a relay-session frame to a connection on this or another
    /// shard; dropped if the connection is gone.
    fn relay_frame_to(&mut self, to: ConnRef, frame: Vec<u8>) {
        if to.shard != self.id {
            self.mail(to.shard, Mail::Relay(RelayMail::Frame(to, frame)));
            return;
        }
        if let Some(slot) = self.live(to) {
            self.conns[slot]
                .session_mut()
                .control_mut()
                .extend_from_slice(&frame);
            self.mark_dirty(slot);
        }
    }
}
