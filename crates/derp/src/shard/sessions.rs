//! Relay sessions on the DERP side (`docs/relay-sessions.md` §1, §2): the
//! capability in serverInfo, relayAllocate from a client that asked, and
//! the relaySession offers (or a relayRefused to the asker). A client that
//! asked for version 2 (§9) is answered version 2 and gets its offers as
//! relaySession2, naming this node as the host.
//!
//! The session table and its UDP socket live outside this crate (in
//! `ferry-udp`, glued by the `ferry` binary) behind [`SessionService`],
//! which also decides who hears of a session: the asker at most once per
//! interval on one connection, the peer once per connection.
//!
//! A relayAllocate is charged to its connection's rate first
//! (`conn::ALLOCATE_RATE`, `conn::ALLOCATE_BURST`, whatever
//! `--rate-config` says): over it, the asker is refused at once (reason 6)
//! and nothing else happens. Otherwise it is read on the asker's shard
//! (its key's owner) and handled on the peer's key's owner shard, which
//! alone knows whether the peer is connected and asked for sessions: the
//! asker's shard mails the request there when it is another shard. The
//! peer's offer is queued there (as a frame another client caused: it
//! never closes the peer, see `control_queue`); the asker's answer goes
//! back by mail to the asker's connection, like any cross-shard control
//! message, as a frame of its own (a client that asks faster than it reads
//! the answers is closed).

use std::net::IpAddr;

use ferry_proto::relay_session::v2::{self, SessionOffer2};
use ferry_proto::relay_session::{
    self as rs, Allocate, AllocateRequest, RefuseReason, Refused, SessionOffer, SessionService,
};

use super::control_queue::Origin;
use super::*;
use crate::metrics::{AllocateRefusal, Notice};

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
        /// The relay-session version agreed with it.
        version: u8,
        /// What it asked.
        ask: Allocate,
    },
    /// Queue this relaySession or relayRefused frame to a connection here.
    Frame(ConnRef, Vec<u8>),
    /// Tell this shard's key that a session hosted here was freed
    /// (relaySessionEnd; `cross_node.rs`).
    End(NodePublic, ferry_proto::relay_session::v2::SessionEnd),
    /// A meshSession allocate (kind 1) that came over mesh link `link`,
    /// on its way through the asker's owner shard, which checks that the
    /// link announced the asker (`cross_node.rs`).
    MeshAsk {
        /// The link to the node that sent it.
        link: usize,
        /// The frame.
        msg: ferry_proto::mesh_session::MeshSession,
    },
    /// A meshSession for a key of this shard that came over mesh link
    /// `link` (`cross_node.rs`).
    Mesh {
        /// The link to the node that sent it.
        link: usize,
        /// The frame.
        msg: ferry_proto::mesh_session::MeshSession,
    },
}

impl ConnRef {
    /// A number for this connection that no other connection to this
    /// relay has had: its shard and its generation there (a connection
    /// keeps both from registration on).
    pub fn id(&self) -> u64 {
        (self.shard as u64) << 32 | u64::from(self.gen)
    }
}

impl Shard {
    fn session_service(&self) -> Option<&Arc<dyn SessionService>> {
        self.shared.config.relay_sessions.as_ref()
    }

    /// The relay-session version a client's clientInfo asks for and this
    /// relay offers: the lower of the asked and [`v2::VERSION`], 0 for
    /// none.
    pub(super) fn wants_relay_sessions(&self, info: &handshake::ClientInfo) -> u8 {
        if info.ferry_derp >= rs::VERSION && self.session_service().is_some() {
            info.ferry_derp.min(v2::VERSION) as u8
        } else {
            0
        }
    }

    /// The capability for a client's serverInfo (the version agreed).
    pub(super) fn relay_capability(&self, slot: Slot) -> Option<handshake::RelayCapability> {
        let service = self.session_service()?;
        let conn = &self.conns[slot];
        conn.has_relay_sessions()
            .then(|| handshake::RelayCapability {
                version: conn.relay_version().into(),
                port: service.port(),
            })
    }

    /// An offer as the frame a client of relay-session `version` reads:
    /// relaySession2 naming this node as the host for version 2,
    /// relaySession for version 1.
    fn offer_frame(&self, out: &mut Vec<u8>, version: u8, offer: &SessionOffer) {
        if u32::from(version) >= v2::VERSION {
            let offer = SessionOffer2 {
                offer: offer.clone(),
                host: self.shared.config.public_key,
                flags: 0,
            };
            v2::put_session2(out, &offer);
        } else {
            rs::put_session(out, offer);
        }
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
        let now = self.now;
        if !self.conns[slot].take_allocate_token(now) {
            let frame = refusal(&ask, RefuseReason::RateLimited);
            self.count_refusal(RefuseReason::RateLimited);
            let from = self.conn_ref(slot);
            self.relay_frame_to(from, frame);
            return if self.ended(slot) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            };
        }
        let conn = &self.conns[slot];
        let (asker, ip, version) = (conn.key(), conn.peer().ip(), conn.relay_version());
        let from = self.conn_ref(slot);
        let owner = self.shared.owner_of(&ask.peer, self.shards);
        let mail = RelayMail::Ask {
            from,
            asker,
            ip,
            version,
            ask,
        };
        self.relay_mail_to(owner, mail);
        if self.ended(slot) {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Handles `mail` here if `owner` is this shard, else mails it there.
    pub(super) fn relay_mail_to(&mut self, owner: usize, mail: RelayMail) {
        if owner == self.id {
            self.on_relay_mail(mail);
        } else {
            self.mail(owner, Mail::Relay(mail));
        }
    }

    pub(super) fn on_relay_mail(&mut self, mail: RelayMail) {
        match mail {
            RelayMail::Ask {
                from,
                asker,
                ip,
                version,
                ask,
            } => {
                if let Some(frame) = self.allocate_here(from, (&asker, version), ip, &ask) {
                    self.relay_frame_to(from, frame);
                }
            }
            RelayMail::Frame(to, frame) => self.relay_frame_to(to, frame),
            RelayMail::MeshAsk { link, msg } => self.on_mesh_ask(link, msg),
            RelayMail::End(key, end) => self.end_to(key, end),
            RelayMail::Mesh { link, msg } => {
                if let Err(why) = self.on_mesh_mail(link, msg) {
                    self.m.mesh_session_dropped[why as usize].inc();
                }
            }
        }
    }

    /// On the peer's owner shard: the asker's answer, if it is to have one,
    /// after queueing the peer's offer if it is to be told. `asker` is
    /// its key and its relay-session version.
    fn allocate_here(
        &mut self,
        from: ConnRef,
        (asker, asker_version): (&NodePublic, u8),
        ip: IpAddr,
        ask: &Allocate,
    ) -> Option<Vec<u8>> {
        let peer_slot = self.keys.get(&ask.peer).and_then(|e| e.active);
        if peer_slot.is_none()
            && u32::from(asker_version) >= v2::VERSION
            && self.session_service().is_some()
            && *asker != ask.peer
        {
            if let Some(link) = self.forwarder(&ask.peer) {
                return self.allocate_across(from, *asker, ip, ask, link);
            }
        }
        let verdict = match (self.session_service(), peer_slot) {
            (None, _) => Err(RefuseReason::Off),
            _ if *asker == ask.peer => Err(RefuseReason::SelfPeer),
            (_, None) => Err(RefuseReason::PeerNotHere),
            (_, Some(p)) if !self.conns[p].has_relay_sessions() => {
                Err(RefuseReason::PeerNotCapable)
            }
            (Some(service), Some(p)) => service
                .allocate(
                    &AllocateRequest {
                        asker: *asker,
                        peer: ask.peer,
                        ip,
                        request_id: ask.request_id,
                        conns: [from.id(), self.conn_ref(p).id()],
                    },
                    self.now,
                )
                .map(|offers| (p, offers)),
        };
        match verdict {
            Ok((p, offers)) => {
                if let Some(theirs) = offers.peer {
                    let notice = Origin::Other(Notice::RelaySession);
                    let mut frame = Vec::new();
                    self.offer_frame(&mut frame, self.conns[p].relay_version(), &theirs);
                    self.queue_control(p, notice, |q| q.extend_from_slice(&frame));
                }
                offers.asker.map(|mine| {
                    let mut out = Vec::new();
                    self.offer_frame(&mut out, asker_version, &mine);
                    out
                })
            }
            Err(reason) => {
                self.count_refusal(reason);
                Some(refusal(ask, reason))
            }
        }
    }

    pub(super) fn count_refusal(&self, reason: RefuseReason) {
        self.m.allocate_refused[AllocateRefusal::of(reason) as usize].inc();
    }

    /// Queues a relay-session frame to the asking connection on this or
    /// another shard (a frame it caused itself: over its cap, it is
    /// closed); dropped if the connection is gone.
    fn relay_frame_to(&mut self, to: ConnRef, frame: Vec<u8>) {
        if to.shard != self.id {
            self.mail(to.shard, Mail::Relay(RelayMail::Frame(to, frame)));
            return;
        }
        if let Some(slot) = self.live(to) {
            self.queue_control(slot, Origin::Own, |q| q.extend_from_slice(&frame));
        }
    }
}

/// The relayRefused frame answering `ask`.
pub(super) fn refusal(ask: &Allocate, reason: RefuseReason) -> Vec<u8> {
    let mut out = Vec::new();
    rs::put_refused(
        &mut out,
        &Refused {
            request_id: ask.request_id,
            peer: ask.peer,
            reason,
        },
    );
    out
}
