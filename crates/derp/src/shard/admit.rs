//! Admission: a connection whose clientInfo was read waits, its input
//! held, for the admission pool's verdict (which arrives through the
//! shard's inbox), then registers or is refused: the 101 and serverKey are written,
//! then the connection closes without `serverInfo`.
//! Mesh peers skip it. The wait is bounded by the handshake deadline, like
//! every phase before registration; a verdict for a connection that has
//! gone since is dropped.

use std::net::IpAddr;

use super::*;

impl Shard {
    /// Starts admission for a connection whose clientInfo just opened.
    /// Returns `false` when admission is off (the caller registers it).
    pub(super) fn begin_admission(&mut self, slot: Slot) -> bool {
        let shared = self.shared.clone();
        let Some(admission) = shared.admission.get() else {
            return false;
        };
        if self.conns[slot].is_mesh() {
            return false;
        }
        let me = self.conn_ref(slot);
        let conn = &mut self.conns[slot];
        conn.set_phase(Phase::Admitting);
        let (key, ip) = (conn.key(), canonical(conn.peer().ip()));
        self.hold_input(slot, Hold::Admission);
        if let Some(verdict) = admission.ask(me, key, ip, self.now) {
            // Known at once (cache, or too many waiting): handled after
            // this turn, outside the deframer that is reading clientInfo.
            self.control.push(Control::Admitted(me, verdict));
        }
        true
    }

    /// Takes what other threads posted (admission verdicts, new limits),
    /// and handles it with anything queued locally.
    pub(super) fn handle_control(&mut self) {
        let inbox = &self.shared.inboxes[self.id];
        if inbox.pending.swap(false, Ordering::Acquire) {
            let mut posted = std::mem::take(&mut *inbox.queue.lock().expect("inbox lock"));
            self.control.append(&mut posted);
        }
        if self.control.is_empty() {
            return;
        }
        let mut control = std::mem::take(&mut self.control);
        for msg in control.drain(..) {
            match msg {
                Control::Admitted(r, verdict) => self.on_admission(r, verdict),
                Control::RateConfig(rc) => self.set_rate(rc),
                Control::Mesh { peer, news } => self.on_mesh_news(peer, news),
            }
        }
        if self.control.is_empty() {
            self.control = control; // keep the capacity
        }
    }

    fn on_admission(&mut self, r: ConnRef, verdict: Verdict) {
        let Some(slot) = self.live(r) else { return };
        if self.conns[slot].phase() != Phase::Admitting {
            return;
        }
        match verdict {
            Verdict::Admit => {
                self.conns[slot].set_phase(Phase::ClientInfo);
                // Registered here or sent to its owner; either way handled.
                let _ = self.after_client_info(slot);
                self.release_input(slot, Hold::Admission);
            }
            Verdict::Reject(why) => {
                let key = self.conns[slot].key();
                self.count_handshake_failure(
                    slot,
                    HandshakeFailure::Admission,
                    &format_args!("client {key} refused by admission ({}): {why}", why.label()),
                );
                // The 101 and serverKey were queued before the question was
                // asked; the client reads them whether or not they were
                // written by the time the answer came, then the close
                // (derper's answer to a client it refuses).
                self.finish(slot, CloseReason::Handshake);
            }
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
