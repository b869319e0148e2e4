//! Control frames a peer can cause again and again, queued within a cap
//! that depends on who caused them (`DerpConfig::control_queue_bytes`):
//!
//! - **its own** (answers to its relayAllocate requests, its peerGone
//!   (NotHere) notices): a connection whose queue goes past the cap with
//!   them sends requests faster than it reads the answers, and is closed
//!   (`control_queue_full`, logged);
//! - **others'** (peerGone when a client it received from leaves, the
//!   offer of a session another client asked for): they stop at half the
//!   cap and are dropped and counted
//!   (`ferry_control_frames_dropped_total`), so what others do never
//!   closes a connection, and its own frames always have the other half;
//! - **a watcher's** (every presence change on the server, for a mesh
//!   peer): one larger cap for everything queued to it, at least
//!   `watcher_queue_bytes` and at least twice a presence frame per
//!   connection on the server, so the whole state sent when it subscribes
//!   fits. A watcher over it is closed: it reconnects and gets the whole
//!   state again, where dropped frames would leave it a wrong view.
//!
//! Pongs need no cap (one is queued per flush at most), nor do the
//! handshake's responses, keepAlives or the restarting notice (one each).

use super::*;
use crate::metrics::Notice;

/// Bytes of the largest presence frame a watcher is sent (peerPresent:
/// header, key, address, flags), rounded up.
const PRESENCE_FRAME: usize = 64;

/// Who caused a control frame: what happens to it on a full queue.
#[derive(Clone, Copy, Debug)]
pub(super) enum Origin {
    /// The connection itself: over the cap, it is closed.
    Own,
    /// Another client: over half the cap, the frame is dropped.
    Other(Notice),
    /// A presence change for a watcher: over the watcher's cap, it is
    /// closed.
    Presence,
}

impl Shard {
    /// Queues the control frame `put` writes to `slot` (see the module
    /// doc). `false` if it was not queued: dropped and counted, or the
    /// connection closed.
    pub(super) fn queue_control(
        &mut self,
        slot: Slot,
        origin: Origin,
        put: impl FnOnce(&mut Vec<u8>),
    ) -> bool {
        let cap = self.control_cap(slot, origin);
        let m = &self.m;
        let conn = &mut self.conns[slot];
        if conn.derp_mut().queue_control(cap, put) {
            let delta = conn.regauge();
            m.queued_bytes.add(delta);
            self.mark_dirty(slot);
            return true;
        }
        match origin {
            Origin::Other(notice) => m.notices_dropped[notice as usize].inc(),
            Origin::Own | Origin::Presence => {
                let peer = conn.peer();
                let key = conn.key();
                conn_log!(self, info, %peer, client = %key, cap, ?origin, "control queue full (the client does not read what it asks for); closing connection");
                self.close(slot, CloseReason::ControlQueueFull);
            }
        }
        false
    }

    /// The cap `slot`'s control queue has for a frame of `origin`.
    fn control_cap(&self, slot: Slot, origin: Origin) -> usize {
        let cfg = &self.shared.config;
        if self.conns[slot].is_watcher() {
            let conns: i64 = self
                .shared
                .metrics
                .shards
                .iter()
                .map(|s| s.current_connections.get())
                .sum();
            let state = 2 * PRESENCE_FRAME * usize::try_from(conns).unwrap_or(0);
            return cfg.watcher_queue_bytes.max(state);
        }
        match origin {
            Origin::Own | Origin::Presence => cfg.control_queue_bytes,
            Origin::Other(_) => cfg.control_queue_bytes / 2,
        }
    }
}
