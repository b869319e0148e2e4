//! meshSession frames (`docs/relay-sessions.md` §9.3) between the Ferry
//! nodes of a region: what a shard reads from a mesh peer that asked for
//! the Ferry mesh extension, and what it sends on its own links.
//!
//! A frame always goes out on this relay's own link to the node (as a
//! client of that node), into the same per-(link, shard) ring as
//! forwardPacket: the mesh thread copies the ring's bytes to the link
//! without reading them. Only a link whose node answered the extension
//! gets one (derper never sees the frame). When the ring is full the
//! frame waits in the link's overflow queue behind the packets already
//! there; past the queue's hard cap it is dropped and counted (nothing
//! waits on a meshSession: its sender's timeout covers the loss).
//!
//! A frame that comes in belongs to this relay's own link to the sending
//! node: the sender's client key is that node's server key. Without such
//! a link up (and speaking the extension) there is nothing to answer on
//! and no word from that node on which keys it holds: dropped as
//! `no_connection`.
//!
//! State (kind 6): each node tells the other what it can do (hosts
//! sessions, draining) when its link comes up, and answers the first
//! state it hears on a link since that link came up with its own (so the
//! two learn of each other whichever link came up first; at most one
//! answer per link and generation, however often the node repeats its
//! state). What a node last said is kept in
//! [`MeshShared::link_state`](super::MeshShared::link_state) for every
//! shard to read.

use ferry_proto::mesh_session::{self as ms, MeshMsg, MeshSession};

use super::forward::{framed_len, STATE_HEARD};
use super::sessions::RelayMail;
use super::*;
use crate::metrics::{MeshSessionDrop, MeshSessionSent};

impl Shard {
    /// The state flags this relay tells the region's other nodes: it
    /// hosts sessions for pairs split across nodes only with endpoints
    /// their clients can reach.
    fn own_state(&self) -> u8 {
        let sessions = if self.here_can_host() {
            ms::STATE_SESSIONS_ON
        } else {
            0
        };
        let draining = if self.draining.is_some() {
            ms::STATE_DRAINING
        } else {
            0
        };
        sessions | draining
    }

    /// Sends this relay's state on link `link`.
    pub(super) fn send_state(&mut self, link: usize) {
        let msg = MeshSession {
            dst: NodePublic::from_bytes([0; 32]),
            msg: MeshMsg::State {
                flags: self.own_state(),
                // Not counted yet: nothing chooses a host by load.
                hosted: 0,
            },
        };
        self.send_mesh_session(link, &msg);
    }

    /// Queues `msg` for the node at the other end of link `link`; whether
    /// it was (see the module doc).
    pub(super) fn send_mesh_session(&mut self, link: usize, msg: &MeshSession) -> bool {
        let speaks = self.speaks_ferry_mesh(link);
        let m = &self.m;
        if !speaks {
            m.mesh_session_sent[MeshSessionSent::NoLink as usize].inc();
            return false;
        }
        let mut frame = Vec::with_capacity(ms::MAX_FRAME_LEN);
        ms::put_mesh_session(&mut frame, msg);
        let out = &mut self.mesh;
        if out.overflow[link].is_empty() && out.tx[link].try_push(&[&frame]) {
            out.pushed = true;
            m.mesh_session_sent[MeshSessionSent::Queued as usize].inc();
            return true;
        }
        let queue = &mut out.overflow[link];
        if queue.len() + frame.len() > self.hard_cap {
            m.mesh_session_sent[MeshSessionSent::Full as usize].inc();
            return false;
        }
        if queue.is_empty() {
            if let Some(mesh) = self.shared.mesh.as_ref() {
                mesh.waiting[link * self.shards + self.id].store(true, Ordering::Release);
            }
        }
        debug_assert_eq!(framed_len(&frame), frame.len());
        queue.extend_from_slice(&frame);
        m.mesh_session_sent[MeshSessionSent::Queued as usize].inc();
        true
    }

    /// A meshSession from a mesh peer that asked for the Ferry mesh
    /// extension: parsed, matched to this relay's link to its sender, and
    /// acted on where this build can (state); every other one is dropped
    /// and counted by reason, a bad one also logged (rate-limited). The
    /// mesh connection is never closed for it: that would cut the region's
    /// DERP forwarding.
    pub(super) fn on_mesh_session(&mut self, slot: Slot, payload: &[u8]) {
        let why = match ms::parse_mesh_session(payload) {
            Ok(msg) => match self.ferry_link_to(&self.conns[slot].key()) {
                Some(link) => match msg.msg {
                    MeshMsg::State { flags, .. } => return self.on_state(link, flags),
                    _ if !self.mesh.session_rate[link].try_take_one(self.now) => {
                        let peer = self.conns[slot].peer();
                        conn_log!(self, info, %peer, link, "meshSession past its node's rate; dropped");
                        MeshSessionDrop::Rate
                    }
                    MeshMsg::Offer(ref o) if Some(o.host) != self.link_key(link) => {
                        MeshSessionDrop::WrongHost
                    }
                    MeshMsg::Allocate { asker, .. } => {
                        // First to the asker's owner shard, which knows
                        // whether this link announced it.
                        let owner = self.shared.owner_of(&asker, self.shards);
                        return self.relay_mail_to(owner, RelayMail::MeshAsk { link, msg });
                    }
                    MeshMsg::Offer(_)
                    | MeshMsg::Refused(_)
                    | MeshMsg::End(_)
                    | MeshMsg::Declined { .. } => {
                        let owner = self.shared.owner_of(&msg.dst, self.shards);
                        return self.relay_mail_to(owner, RelayMail::Mesh { link, msg });
                    }
                },
                None => {
                    let peer = self.conns[slot].peer();
                    conn_log!(self, info, %peer, "meshSession from a node this relay has no Ferry mesh link to; dropped");
                    MeshSessionDrop::NoConnection
                }
            },
            Err(e) => {
                let peer = self.conns[slot].peer();
                conn_log!(self, info, %peer, error = %e, "meshSession dropped");
                MeshSessionDrop::of(&e)
            }
        };
        self.m.mesh_session_dropped[why as usize].inc();
    }

    /// The server key of the node at the other end of `link`, while up.
    pub(super) fn link_key(&self, link: usize) -> Option<NodePublic> {
        self.mesh
            .links
            .get(link)
            .copied()
            .flatten()
            .map(|l| l.server_key)
    }

    /// The node at the other end of `link` says what it can do; the first
    /// time since the link came up, this relay answers with its own.
    fn on_state(&mut self, link: usize, flags: u8) {
        let Some(mesh) = self.shared.mesh.as_ref() else {
            return;
        };
        let before = mesh.link_state[link].swap(flags | STATE_HEARD, Ordering::AcqRel);
        if before & STATE_HEARD == 0 {
            self.send_state(link);
        }
    }
}
