//! Forwarding to the region's other nodes: the keys each mesh link
//! announced (peerPresent on the links this relay dials, see
//! [`crate::mesh`]), and packets for them sent on as `forwardPacket`.
//!
//! The table lives on each key's owner shard, beside the key's local
//! connections, so one lookup decides: a local connection wins (as in
//! derper); otherwise the earliest link that announced the key carries the
//! packet; when it withdraws the key, the next one does. Only packets sent
//! by this relay's own clients are forwarded, never packets that came in
//! from a mesh peer (one hop, as derper).
//!
//! A packet for a link goes straight into that link's ring to the mesh
//! thread. When the ring is full the packet waits in the link's overflow
//! queue here, and past the send-queue cap its sender is paused, exactly
//! as for a local destination over its cap: a slow link slows the clients
//! feeding it through TCP instead of dropping their packets. The mesh
//! thread rings this shard's doorbell when it takes from a ring this shard
//! waits on; the overflow then moves on and the waiting senders resume.
//! Only past the hard cap (senders on other shards learn of their pause a
//! turn late) is a packet dropped, as `queue_tail`.
//!
//! When a link goes down every key it announced leaves the table at once,
//! its overflow is dropped (`gone_disconnected`) and its waiting senders
//! resume. A key that leaves the table and has no local connection is gone
//! from the region: the clients that received from it get peerGone, as
//! when a local client leaves.
//!
//! The table is bounded: a link contributes at most
//! [`crate::mesh::MESH_LINK_MAX_KEYS`] keys at once, since the mesh thread
//! drops (and counts) a peer's announcements past that before they reach
//! a shard's inbox, and sends no news for a key the link announced already.

use ferry_engine::limit::Bucket;

use super::*;
use crate::mesh::{MESH_SESSION_BURST, MESH_SESSION_RATE};
use crate::metrics::MeshSessionSent;

/// A forwardPacket frame's header and its two keys.
const FORWARD_HEAD: usize = frame::HEADER_LEN + 64;

/// The length of the whole frame that `queued` starts with (an overflow
/// queue holds whole frames only).
pub(super) fn framed_len(queued: &[u8]) -> usize {
    frame::HEADER_LEN + u32::from_be_bytes(queued[1..5].try_into().expect("4 bytes")) as usize
}

/// The mesh links as one shard sees them.
pub struct MeshOut {
    /// Per link: forwardPacket frames to the mesh thread.
    pub tx: Vec<ByteTx>,
    /// Per link: frames waiting for room in `tx` (forwardPacket, and the
    /// meshSession frames of `mesh_session.rs`).
    pub(super) overflow: Vec<Vec<u8>>,
    /// Per link: senders paused by its overflow.
    waiters: Vec<Vec<ConnRef>>,
    /// Per link: what this shard knows of it while it is up.
    pub(super) links: Vec<Option<MeshLink>>,
    /// Per link: how many times it came up (its generation).
    pub(super) ups: Vec<u32>,
    /// Per link: the rate of the meshSession frames its node sends
    /// (`mesh_session.rs`).
    pub(super) session_rate: Vec<Bucket>,
    /// Whether anything was pushed this turn (the mesh thread is woken once).
    pub(super) pushed: bool,
}

impl MeshOut {
    /// One shard's ends of the links' rings, in link order.
    pub fn new(tx: Vec<ByteTx>) -> MeshOut {
        let n = tx.len();
        MeshOut {
            tx,
            overflow: (0..n).map(|_| Vec::new()).collect(),
            waiters: (0..n).map(|_| Vec::new()).collect(),
            links: vec![None; n],
            ups: vec![0; n],
            session_rate: (0..n)
                .map(|_| Bucket::new(MESH_SESSION_RATE, MESH_SESSION_BURST))
                .collect(),
            pushed: false,
        }
    }

    /// Whether a link's overflow waits for room in its ring.
    pub(super) fn backed_up(&self) -> bool {
        self.overflow.iter().any(|o| !o.is_empty())
    }
}

/// The mesh thread's side of what the shards share: how to wake it and
/// which (link, shard) rings a shard waits on.
pub struct MeshShared {
    /// Number of mesh peers (one mesh conn each).
    pub peers: usize,
    /// Wakes the mesh thread (something was pushed into a ring).
    pub wake: Arc<dyn Fn() + Send + Sync>,
    /// Per `peer * shards + shard`: the shard has overflow for the link
    /// and wants its doorbell rung when the ring has room.
    pub waiting: Vec<AtomicBool>,
    /// Per link: the state flags its node last sent in a meshSession
    /// (`docs/relay-sessions.md` §9.3, kind 6), with [`STATE_HEARD`] set
    /// once one came; cleared by the mesh thread when the link comes up.
    /// Any shard that reads a state frame writes it; every shard reads it.
    pub link_state: Vec<AtomicU8>,
}

/// In [`MeshShared::link_state`]: the link's node has sent its state
/// since the link came up.
pub const STATE_HEARD: u8 = 0x80;

impl MeshShared {
    /// Shared state for `peers` mesh peers and `shards` shards.
    pub fn new(peers: usize, shards: usize, wake: Arc<dyn Fn() + Send + Sync>) -> MeshShared {
        MeshShared {
            peers,
            wake,
            waiting: (0..peers * shards)
                .map(|_| AtomicBool::new(false))
                .collect(),
            link_state: (0..peers).map(|_| AtomicU8::new(0)).collect(),
        }
    }
}

/// A mesh link that is up, as each shard knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshLink {
    /// The server key of the node at its other end (also the key that
    /// node's own link to this relay presents as a client).
    pub server_key: NodePublic,
    /// Whether that node answered the Ferry mesh extension: only then may
    /// meshSession frames go to it, and only then are the ones it sends
    /// this relay acted on.
    pub ferry_mesh: bool,
}

/// What a mesh link learned: a presence change (for the key's owner
/// shard) or the link coming up or breaking (for every shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshNews {
    /// The link's node announced a client (peerPresent).
    Present(NodePublic),
    /// The link's node says the client left (peerGone).
    Gone(NodePublic),
    /// The link finished its handshake (to every shard): the node's server
    /// key and whether it speaks the Ferry mesh extension.
    Up {
        /// The node's server key.
        server_key: NodePublic,
        /// It answered the Ferry mesh extension.
        ferry_mesh: bool,
    },
    /// The link broke: forget everything it announced (to every shard).
    Down,
}

impl Shard {
    /// The link to the node whose server key is `server`, if it is up and
    /// speaks the Ferry mesh extension: the link a meshSession from that
    /// node (arriving on its own link to this relay, as a client with
    /// that key) belongs to, and the one answers to it go out on.
    pub(super) fn ferry_link_to(&self, server: &NodePublic) -> Option<usize> {
        self.mesh
            .links
            .iter()
            .position(|l| l.is_some_and(|l| l.ferry_mesh && l.server_key == *server))
    }

    /// The link that carries packets for `dst`, if any announced it.
    pub(super) fn forwarder(&self, dst: &NodePublic) -> Option<usize> {
        self.forward
            .get(dst)
            .and_then(|peers| peers.first().copied())
    }

    /// Sends a packet from a local client to mesh peer `peer` as forwardPacket.
    /// Returns `true` when `from` must pause (see the module doc).
    pub(super) fn forward_packet(
        &mut self,
        peer: usize,
        src: &NodePublic,
        dst: &NodePublic,
        packet: &[u8],
        from: ConnRef,
    ) -> bool {
        let kind = PacketKind::of(packet);
        let mut head = [0u8; FORWARD_HEAD];
        head[0] = frame::FrameType::ForwardPacket as u8;
        head[1..5].copy_from_slice(&((64 + packet.len()) as u32).to_be_bytes());
        head[5..37].copy_from_slice(src.as_bytes());
        head[37..69].copy_from_slice(dst.as_bytes());
        let (cap, hard_cap) = (self.shared.config.send_queue_bytes, self.hard_cap);
        let m = &self.m;
        let out = &mut self.mesh;
        if out.overflow[peer].is_empty() && out.tx[peer].try_push(&[&head, packet]) {
            out.pushed = true;
            m.packets_forwarded_out.inc();
            return false;
        }
        let queue = &mut out.overflow[peer];
        if queue.len() + head.len() + packet.len() > hard_cap {
            m.dropped(DropReason::QueueTail, kind, packet.len());
            return false;
        }
        if queue.is_empty() {
            if let Some(mesh) = self.shared.mesh.as_ref() {
                mesh.waiting[peer * self.shards + self.id].store(true, Ordering::Release);
            }
        }
        queue.extend_from_slice(&head);
        queue.extend_from_slice(packet);
        m.packets_forwarded_out.inc();
        if queue.len() > cap && !out.waiters[peer].contains(&from) {
            out.waiters[peer].push(from);
            return true;
        }
        false
    }

    /// Moves waiting frames into the links' rings, resumes the senders of
    /// a link whose overflow fell back under the cap, and wakes the mesh
    /// thread if anything was pushed this turn.
    pub(super) fn flush_mesh(&mut self) {
        let cap = self.shared.config.send_queue_bytes;
        for peer in 0..self.mesh.tx.len() {
            let queue = &mut self.mesh.overflow[peer];
            if !queue.is_empty() {
                let tx = &mut self.mesh.tx[peer];
                let mut at = 0;
                while at < queue.len() {
                    let len = framed_len(&queue[at..]);
                    if !tx.try_push(&[&queue[at..at + len]]) {
                        break;
                    }
                    at += len;
                }
                if at > 0 {
                    queue.drain(..at);
                    self.mesh.pushed = true;
                }
                if !queue.is_empty() {
                    if let Some(mesh) = self.shared.mesh.as_ref() {
                        mesh.waiting[peer * self.shards + self.id].store(true, Ordering::Release);
                    }
                }
            }
            if self.mesh.overflow[peer].len() <= cap && !self.mesh.waiters[peer].is_empty() {
                self.release_mesh_waiters(peer);
            }
        }
        if std::mem::take(&mut self.mesh.pushed) {
            if let Some(mesh) = self.shared.mesh.as_ref() {
                (mesh.wake)();
            }
        }
    }

    /// Applies what a mesh link learned.
    pub(super) fn on_mesh_news(&mut self, peer: usize, news: MeshNews) {
        if peer >= self.mesh.tx.len() {
            return;
        }
        match news {
            MeshNews::Present(key) => {
                let peers = self.forward.entry(key).or_default();
                if !peers.contains(&peer) {
                    peers.push(peer);
                    let n = peers.len();
                    let local = self.keys.contains_key(&key);
                    let m = &self.m;
                    match n {
                        1 if !local => m.remote_keys.add(1),
                        2 => m.multiforwarder_created.inc(),
                        _ => {}
                    }
                }
            }
            MeshNews::Gone(key) => self.withdraw(key, peer),
            MeshNews::Up {
                server_key,
                ferry_mesh,
            } => {
                self.mesh.links[peer] = Some(MeshLink {
                    server_key,
                    ferry_mesh,
                });
                self.mesh.ups[peer] = self.mesh.ups[peer].wrapping_add(1);
                if ferry_mesh && self.id == 0 {
                    self.send_state(peer);
                }
            }
            MeshNews::Down => {
                self.mesh.links[peer] = None;
                let keys: Vec<NodePublic> = self
                    .forward
                    .iter()
                    .filter(|(_, peers)| peers.contains(&peer))
                    .map(|(k, _)| *k)
                    .collect();
                for key in keys {
                    self.withdraw(key, peer);
                }
                self.drop_overflow(peer);
                if self.id == 0 {
                    self.free_link_sessions(peer);
                }
            }
        }
    }

    /// The mesh conn to `peer` no longer carries `key`; if nothing does and the
    /// key has no local connection, it has left the region.
    fn withdraw(&mut self, key: NodePublic, peer: usize) {
        let m = &self.m;
        let Some(peers) = self.forward.get_mut(&key).filter(|l| l.contains(&peer)) else {
            // derper's count of removals by a forwarder that was not the
            // key's.
            m.forwarder_delete_other.inc();
            return;
        };
        peers.retain(|&l| l != peer);
        match peers.len() {
            0 => {}
            1 => {
                m.multiforwarder_deleted.inc();
                return;
            }
            _ => return,
        }
        self.forward.remove(&key);
        if !self.keys.contains_key(&key) {
            self.m.remote_keys.add(-1);
            self.broadcast_key_gone(key);
        }
    }

    /// Drops what waits for a link that went down and lets its senders go.
    fn drop_overflow(&mut self, peer: usize) {
        let queue = std::mem::take(&mut self.mesh.overflow[peer]);
        let m = &self.m;
        let mut at = 0;
        while at + frame::HEADER_LEN <= queue.len() {
            let len = framed_len(&queue[at..]);
            if queue[at] == frame::FrameType::ForwardPacket as u8 {
                let packet = &queue[at + FORWARD_HEAD..at + len];
                m.dropped(
                    DropReason::GoneDisconnected,
                    PacketKind::of(packet),
                    packet.len(),
                );
            } else {
                m.mesh_session_sent[MeshSessionSent::LinkDown as usize].inc();
            }
            at += len;
        }
        self.release_mesh_waiters(peer);
    }

    /// Lets every sender waiting on mesh peer `peer` go. A resumed sender may
    /// be read at once and wait again: those stay on the list (which keeps its
    /// memory).
    fn release_mesh_waiters(&mut self, peer: usize) {
        let mut waiting = std::mem::take(&mut self.mesh.waiters[peer]);
        for r in waiting.drain(..) {
            self.resume_sender(r);
        }
        let again = &mut self.mesh.waiters[peer];
        std::mem::swap(again, &mut waiting);
        again.append(&mut waiting);
    }
}
