//! Kernel TLS on the shard: moving sessions into the kernel between
//! turns, and the control records (alerts, KeyUpdate) that come up after.

use super::*;
use crate::metrics::KtlsRefusal;

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
        if kernel.records.is_empty() {
            self.record_slots.push(slot);
        }
        kernel.records.push((record_type, data.to_vec()));
    }

    /// Moves TLS sessions into the kernel where it is safe now: between
    /// turns (no receive pending), no send in flight, nothing stashed, at a
    /// record boundary, rustls holding nothing (see `crate::ktls`).
    pub(super) fn try_ktls(&mut self, driver: &mut dyn DriverOps) {
        let mut i = 0;
        while i < self.ktls_candidates.len() {
            let (slot, gen, deadline) = self.ktls_candidates[i];
            let Some(conn) = self.conns.get_mut(slot).filter(|c| c.gen() == gen) else {
                self.ktls_candidates.swap_remove(i);
                continue;
            };
            let busy = conn.session().sending_since().is_some()
                || conn.has_stash()
                || conn.phase() == Phase::Migrating;
            let (closing, responding) = (conn.is_closed(), conn.phase() == Phase::Responding);
            let Some(user) = conn.transport_mut().user() else {
                self.ktls_candidates.swap_remove(i);
                continue;
            };
            if closing || responding {
                user.boundary = None;
                self.ktls_candidates.swap_remove(i);
                continue;
            }
            if busy || !user.boundary.as_ref().is_some_and(|b| b.at_boundary()) {
                if self.now >= deadline {
                    user.boundary = None;
                    self.ktls_candidates.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            }
            use crate::ktls::Handoff;
            if let Err(reason) = user.conn.ready() {
                if reason.is_transient() && self.now < deadline {
                    i += 1;
                } else {
                    user.boundary = None;
                    self.ktls_refused(reason.refusal());
                    self.ktls_candidates.swap_remove(i);
                }
                continue;
            }
            user.boundary = None;
            self.ktls_candidates.swap_remove(i);
            if driver.set_ktls_rx(slot).is_err() {
                self.ktls_refused(KtlsRefusal::Backend);
                continue;
            }
            let Some(fd) = driver.fd(slot) else {
                self.ktls_refused(KtlsRefusal::Backend);
                continue;
            };
            let user = self.conns[slot].transport_mut().take_user().expect("tls");
            match crate::ktls::KtlsSession::start(user.conn, fd) {
                Ok(session) => {
                    self.conns[slot].set_transport(Transport::Kernel(Box::new(KernelTls {
                        session,
                        records: Vec::new(),
                    })));
                    self.m().ktls_sockets.add(1);
                }
                Err(crate::ktls::Refused::Usable { conn, reason }) => {
                    self.conns[slot].transport_mut().put_user(Box::new(UserTls {
                        conn,
                        boundary: None,
                    }));
                    self.ktls_refused(reason.refusal());
                }
                Err(crate::ktls::Refused::Dead(e)) => {
                    self.ktls_refused(KtlsRefusal::Failed);
                    let peer = self.conns[slot].peer();
                    conn_log!(self, info, %peer, error = %e, "moving TLS into the kernel failed; closing connection");
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
    }

    pub(super) fn ktls_refused(&self, why: KtlsRefusal) {
        self.m().ktls_refused[why as usize].inc();
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
            let records = std::mem::take(&mut kernel.records);
            let session = &mut kernel.session;
            let mut end: Option<Result<(), String>> = None;
            for (record_type, data) in &records {
                match session.on_record(fd, *record_type, data) {
                    Ok(crate::ktls::RecordOutcome::KeyUpdated) => {}
                    Ok(crate::ktls::RecordOutcome::Closed) => {
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
