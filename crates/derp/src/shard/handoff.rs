//! Hand-offs on the shard: when to move a TLS session into the kernel
//! (between turns, once nothing would be lost; how is in
//! `transport::handoff` and `transport::kernel`), and the control records
//! (alerts, KeyUpdate) that come up after.

use super::*;
use crate::metrics::KtlsRefusal;
use crate::transport::KernelMove;

impl Shard {
    /// A non-data TLS record on a kernel-TLS socket: kept for after the
    /// turn, when the driver (and so the socket) is at hand.
    pub(super) fn on_tls_record(&mut self, slot: Slot, record_type: u8, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.is_closed() {
            return;
        }
        let Some(kernel) = conn.transport_mut().kernel() else {
            let peer = conn.peer();
            conn_log!(self, info, %peer, record_type, "TLS control record on a connection without kernel TLS; closing");
            self.close(slot, CloseReason::IoError);
            return;
        };
        if kernel.hold_record(record_type, data) {
            self.record_slots.push(slot);
        }
    }

    /// Moves TLS sessions into the kernel where it is safe now: between
    /// turns (no receive pending), no send in flight, nothing stashed, at a
    /// record boundary, rustls holding nothing (see `crate::transport::kernel`). A
    /// candidate that cannot move yet is tried again after later turns
    /// until its deadline.
    pub(super) fn try_ktls(&mut self, driver: &mut dyn DriverOps) {
        let mut i = 0;
        while i < self.ktls_candidates.len() {
            let (slot, gen, deadline) = self.ktls_candidates[i];
            match self.ktls_attempt(slot, gen, driver) {
                Attempt::Wait { .. } if self.now < deadline => i += 1,
                Attempt::Wait { why, refusal } => {
                    self.ktls_candidates.swap_remove(i);
                    if let Some(user) = self.conns[slot].transport_mut().user() {
                        user.boundary = None;
                    }
                    if let Some(r) = refusal {
                        self.ktls_refused(r);
                    }
                    let peer = self.conns[slot].peer();
                    conn_log!(self, debug, %peer, why, "kTLS move given up at its deadline; TLS stays in userspace");
                }
                Attempt::Done => {
                    self.ktls_candidates.swap_remove(i);
                }
            }
        }
    }

    /// One try at moving `slot` (of generation `gen`) into the kernel.
    fn ktls_attempt(&mut self, slot: Slot, gen: u32, driver: &mut dyn DriverOps) -> Attempt {
        let Some(conn) = self.conns.get_mut(slot).filter(|c| c.gen() == gen) else {
            return Attempt::Done;
        };
        let (closing, responding) = (conn.is_closed(), conn.phase() == Phase::Responding);
        let waiting = if conn.derp().sending_since().is_some() {
            Some("a send is in flight")
        } else if conn.has_stash() {
            Some("input is stashed")
        } else if conn.phase() == Phase::Migrating {
            Some("the connection is moving to another shard")
        } else {
            None
        };
        let paused = conn.is_paused();
        let Some(user) = conn.transport_mut().user() else {
            return Attempt::Done;
        };
        if closing || responding {
            user.boundary = None;
            return Attempt::Done;
        }
        if let Some(why) = waiting {
            return Attempt::wait(why);
        }
        if !user.boundary.as_ref().is_some_and(|b| b.at_boundary()) {
            if paused {
                return Attempt::wait("input paused inside a record");
            }
            // A peer that keeps sending may never let a read end on a
            // boundary: read the rest of this record, and no more, from
            // the socket (nothing else reads it between turns). The back
            // end must read kTLS records from now on, so ask it first: one
            // that cannot has a receive pending and must not be bypassed.
            if driver.set_ktls_rx(slot).is_err() {
                self.conns[slot]
                    .transport_mut()
                    .user()
                    .expect("tls")
                    .boundary = None;
                self.ktls_refused(KtlsRefusal::Backend);
                return Attempt::Done;
            }
            self.complete_record(slot, driver);
            let whole = self.conns.get_mut(slot).is_some_and(|c| {
                c.gen() == gen
                    && !c.has_stash()
                    && c.transport_mut()
                        .user()
                        .and_then(|u| u.boundary.as_ref())
                        .is_some_and(|b| b.at_boundary())
            });
            if !whole {
                return Attempt::wait("the rest of a record is not in the socket yet");
            }
            // What the record held may have changed the connection (a
            // phase, its output, a close): every check again, once (it is
            // at a boundary now).
            return self.ktls_attempt(slot, gen, driver);
        }
        use crate::transport::handoff::Handoff;
        let user = self.conns[slot].transport_mut().user().expect("tls");
        if let Err(reason) = user.conn.ready() {
            if reason.is_transient() {
                return Attempt::Wait {
                    why: reason.label(),
                    refusal: Some(reason.refusal()),
                };
            }
            user.boundary = None;
            self.ktls_refused(reason.refusal());
            return Attempt::Done;
        }
        user.boundary = None;
        if driver.set_ktls_rx(slot).is_err() {
            self.ktls_refused(KtlsRefusal::Backend);
            return Attempt::Done;
        }
        let Some(fd) = driver.fd(slot) else {
            self.ktls_refused(KtlsRefusal::Backend);
            return Attempt::Done;
        };
        match self.conns[slot].transport_mut().move_into_kernel(fd) {
            KernelMove::Moved => {
                self.m.ktls_sockets.add(1);
                let peer = self.conns[slot].peer();
                conn_log!(self, debug, %peer, "TLS session moved into the kernel");
            }
            KernelMove::NotRustls => {}
            KernelMove::Refused(reason) => self.ktls_refused(reason.refusal()),
            KernelMove::Failed(e) => {
                self.ktls_refused(KtlsRefusal::Failed);
                let peer = self.conns[slot].peer();
                conn_log!(self, info, %peer, error = %e, "moving TLS into the kernel failed; closing connection");
                self.close(slot, CloseReason::IoError);
            }
        }
        Attempt::Done
    }

    /// Reads the rest of the TLS record that `slot`'s last read ended in
    /// straight from its socket, never past the record's end, and feeds it
    /// in as a receive would. Only between turns, on a back end that reads
    /// kTLS records (so no receive of its own is pending). What stays in
    /// the socket is read by the back end as before: this takes no
    /// readiness from it (epoll still holds the socket as readable, or an
    /// edge for what arrived since its last read).
    fn complete_record(&mut self, slot: Slot, driver: &mut dyn DriverOps) {
        // At most a header's rest and then the body.
        for _ in 0..2 {
            let Some(need) = self.conns[slot]
                .transport_mut()
                .user()
                .and_then(|u| u.boundary.as_ref())
                .map(|b| b.bytes_to_next())
                .filter(|&n| n > 0)
            else {
                return;
            };
            let Some(fd) = driver.fd(slot) else { return };
            let mut buf = vec![0; need];
            match ferry_sys::ktls::recv_record(fd, &mut buf) {
                // A plain socket: every read is application data.
                Ok(rec) if rec.len > 0 => self.ingest(slot, &buf[..rec.len]),
                // Nothing there yet, the end or an error: the back end's
                // next read sees them.
                _ => return,
            }
            let conn = &self.conns[slot];
            if conn.is_closed() || conn.is_paused() || conn.has_stash() {
                return;
            }
        }
    }

    pub(super) fn ktls_refused(&self, why: KtlsRefusal) {
        self.m.ktls_refused[why as usize].inc();
    }

    /// Handles alerts and KeyUpdates that arrived on kernel-TLS sockets.
    pub(super) fn handle_tls_records(&mut self, driver: &mut dyn DriverOps) {
        let mut slots = std::mem::take(&mut self.record_slots);
        for slot in slots.drain(..) {
            let Some(conn) = self.conns.get_mut(slot) else {
                continue;
            };
            let (Some(kernel), Some(fd)) = (conn.transport_mut().kernel(), driver.fd(slot)) else {
                continue;
            };
            let records = kernel.take_held();
            let session = kernel;
            let mut end: Option<Result<(), String>> = None;
            for (record_type, data) in &records {
                match session.on_record(fd, *record_type, data) {
                    Ok(crate::transport::kernel::RecordOutcome::KeyUpdated) => {}
                    Ok(crate::transport::kernel::RecordOutcome::Closed) => {
                        end = Some(Ok(()));
                        break;
                    }
                    Err(e) => {
                        let _ = session.send_close_notify(fd);
                        end = Some(Err(e.to_string()));
                        break;
                    }
                }
            }
            match end {
                None => {}
                Some(Ok(())) => self.on_eof(slot),
                Some(Err(e)) => {
                    let peer = self.conns[slot].peer();
                    conn_log!(self, info, %peer, error = %e, "kernel TLS session ended; closing connection");
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
        std::mem::swap(&mut self.record_slots, &mut slots);
        self.record_slots.append(&mut slots);
    }
}

/// The outcome of one try at moving a session into the kernel.
enum Attempt {
    /// Not now; try again after a later turn, until the deadline. Past it,
    /// `refusal` (if any) is counted.
    Wait {
        why: &'static str,
        refusal: Option<KtlsRefusal>,
    },
    /// Moved, refused for good, or no longer a candidate.
    Done,
}

impl Attempt {
    fn wait(why: &'static str) -> Attempt {
        Attempt::Wait { why, refusal: None }
    }
}
