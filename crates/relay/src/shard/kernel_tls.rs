//! Kernel TLS on the shard: moving sessions into the kernel between
//! turns, and the control records (alerts, KeyUpdate) that come up after.

use super::*;

impl Shard {
    /// A non-data TLS record on a kernel-TLS socket: kept for after the
    /// turn, when the driver (and so the socket) is at hand.
    pub(super) fn on_tls_record(&mut self, slot: Slot, record_type: u8, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.closing.is_some() {
            return;
        }
        if conn.ktls.is_none() {
            let peer = conn.peer;
            conn_log!(self, info, %peer, record_type, "TLS control record on a connection without kernel TLS; closing");
            self.close(slot, CloseReason::IoError);
            return;
        }
        if conn.tls_records.is_empty() {
            self.record_slots.push(slot);
        }
        conn.tls_records.push((record_type, data.to_vec()));
    }

    /// Moves TLS sessions into the kernel where it is safe now: between
    /// turns (no receive pending), no send in flight, nothing stashed, at a
    /// record boundary, rustls holding nothing (see `crate::ktls`).
    pub(super) fn try_ktls(&mut self, driver: &mut dyn DriverOps) {
        let mut i = 0;
        while i < self.ktls_candidates.len() {
            let (slot, gen, deadline) = self.ktls_candidates[i];
            let Some(conn) = self.conns.get_mut(slot).filter(|c| c.gen == gen) else {
                self.ktls_candidates.swap_remove(i);
                continue;
            };
            let waiting = conn.in_flight.is_some()
                || !conn.stash.is_empty()
                || conn.phase == Phase::Migrating
                || !conn.ktls_boundary.as_ref().is_some_and(|b| b.at_boundary());
            if conn.closing.is_some() || conn.tls.is_none() || conn.phase == Phase::Responding {
                conn.ktls_boundary = None;
                self.ktls_candidates.swap_remove(i);
                continue;
            }
            if waiting {
                if self.now >= deadline {
                    conn.ktls_boundary = None;
                    self.ktls_candidates.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            }
            use crate::ktls::Handoff;
            if let Err(reason) = conn.tls.as_ref().expect("tls").ready() {
                if reason.is_transient() && self.now < deadline {
                    i += 1;
                } else {
                    self.ktls_refused(reason.label());
                    self.conns[slot].ktls_boundary = None;
                    self.ktls_candidates.swap_remove(i);
                }
                continue;
            }
            self.ktls_candidates.swap_remove(i);
            self.conns[slot].ktls_boundary = None;
            if driver.set_ktls_rx(slot).is_err() {
                self.ktls_refused("backend");
                continue;
            }
            let Some(fd) = driver.fd(slot) else {
                self.ktls_refused("backend");
                continue;
            };
            let tls = self.conns[slot].tls.take().expect("tls");
            match crate::ktls::KtlsSession::start(*tls, fd) {
                Ok(session) => {
                    self.conns[slot].ktls = Some(Box::new(session));
                    self.m().ktls_sockets.add(1);
                }
                Err(crate::ktls::Refused::Usable { conn: tls, reason }) => {
                    self.conns[slot].tls = Some(Box::new(tls));
                    self.ktls_refused(reason.label());
                }
                Err(crate::ktls::Refused::Dead(e)) => {
                    self.ktls_refused("failed");
                    let peer = self.conns[slot].peer;
                    conn_log!(self, info, %peer, error = %e, "moving TLS into the kernel failed; closing connection");
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
    }

    pub(super) fn ktls_refused(&self, label: &str) {
        if let Some(i) = crate::metrics::KTLS_REFUSALS
            .iter()
            .position(|l| *l == label)
        {
            self.m().ktls_refused[i].inc();
        }
    }

    /// Handles alerts and KeyUpdates that arrived on kernel-TLS sockets.
    pub(super) fn handle_tls_records(&mut self, driver: &mut dyn DriverOps) {
        let mut slots = std::mem::take(&mut self.record_slots);
        for slot in slots.drain(..) {
            let Some(conn) = self.conns.get_mut(slot) else {
                continue;
            };
            let records = std::mem::take(&mut conn.tls_records);
            let (Some(session), Some(fd)) = (conn.ktls.as_mut(), driver.fd(slot)) else {
                continue;
            };
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
                    let peer = self.conns[slot].peer;
                    conn_log!(self, info, %peer, error = %e, "kernel TLS session ended; closing connection");
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
        std::mem::swap(&mut self.record_slots, &mut slots);
        self.record_slots.append(&mut slots);
    }
}
