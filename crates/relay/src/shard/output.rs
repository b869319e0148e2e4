//! Bytes out: one send per connection per turn, control frames first,
//! and what a finished send releases.

use super::*;

impl Shard {
    pub(super) fn flush(&mut self, driver: &mut dyn DriverOps) {
        let now = self.now;
        // Connections marked while flushing go on the other list (both keep
        // their memory from turn to turn).
        let mut dirty = std::mem::take(&mut self.dirty);
        std::mem::swap(&mut self.dirty, &mut self.dirty_spare);
        for slot in dirty.drain(..) {
            let Some(conn) = self.conns.get_mut(slot) else {
                continue;
            };
            conn.dirty = false;
            if conn.closing.is_some() || conn.in_flight.is_some() || conn.stream.is_some() {
                continue;
            }
            if let Some(KernelTls { session, .. }) = conn.transport.kernel() {
                if session.key_update_due() {
                    match driver.fd(slot).map(|fd| session.rekey_tx(fd)) {
                        Some(Ok(true)) => {}
                        // The socket cannot take our KeyUpdate now: next turn.
                        Some(Ok(false)) => {
                            self.dirty.push(slot);
                            conn.dirty = true;
                            continue;
                        }
                        Some(Err(_)) | None => {
                            self.close(slot, CloseReason::IoError);
                            continue;
                        }
                    }
                }
            }
            let moved = conn.queued_bytes() as i64;
            if conn.ws.is_some() {
                self.ws_frame_output(slot);
            }
            let conn = &mut self.conns[slot];
            let mut buf = std::mem::take(&mut conn.spare);
            buf.clear();
            if let Some(UserTls { conn: tls, .. }) = conn.transport.user() {
                if !tls.is_handshaking() {
                    // One plaintext write per flush: rustls cuts it into as
                    // few records as the 16 KiB record limit allows, so many
                    // small frames share records.
                    let parts = [&conn.ctrl, &conn.disco, &conn.data];
                    let mut w = tls.writer();
                    if parts.iter().filter(|p| !p.is_empty()).count() > 1 {
                        let plain = &mut self.plain_out;
                        plain.clear();
                        for p in parts {
                            plain.extend_from_slice(p);
                        }
                        let _ = w.write_all(plain);
                    } else if let Some(p) = parts.into_iter().find(|p| !p.is_empty()) {
                        let _ = w.write_all(p);
                    }
                    conn.ctrl.clear();
                    conn.disco.clear();
                    conn.data.clear();
                } else if conn.phase == Phase::Responding || !conn.ctrl.is_empty() {
                    // A TLS alert (written into ctrl after a failure) goes out raw.
                    buf.extend_from_slice(&conn.ctrl);
                    conn.ctrl.clear();
                }
                while tls.wants_write() {
                    if tls.write_tls(&mut buf).is_err() {
                        break;
                    }
                }
            } else if conn.ctrl.is_empty() && conn.disco.is_empty() {
                // The common case under load: only data frames. The queue
                // itself becomes the send buffer and the spare becomes the
                // queue — no copy.
                std::mem::swap(&mut buf, &mut conn.data);
            } else {
                buf.extend_from_slice(&conn.ctrl);
                buf.extend_from_slice(&conn.disco);
                buf.extend_from_slice(&conn.data);
                conn.ctrl.clear();
                conn.disco.clear();
                conn.data.clear();
            }
            conn.disco_n = 0;
            conn.data_n = 0;
            conn.pong_pending = false;
            if buf.is_empty() {
                conn.spare = buf;
                let delta = conn.regauge();
                self.shared.metrics.shards[self.id].queued_bytes.add(delta);
                if let Some(reason) = conn.close_after_flush {
                    self.close(slot, reason);
                }
                continue;
            }
            conn.in_flight = Some(now);
            conn.in_flight_bytes = moved as usize;
            let delta = conn.regauge();
            self.shared.metrics.shards[self.id].queued_bytes.add(delta);
            if let Some(KernelTls { session, .. }) = conn.transport.kernel() {
                // Counts records against the cipher's limit; where keys
                // cannot be renewed in time, the session must end.
                if session.note_sent(buf.len()).is_err() {
                    self.close(slot, CloseReason::IoError);
                    continue;
                }
            }
            driver.send(slot, buf);
            // The queue moved into this send: senders held back for this
            // destination may go on.
            if !conn.waiters.is_empty() {
                self.release_waiters(slot);
            }
        }
        self.dirty_spare = dirty;
    }

    pub(super) fn on_sent(&mut self, slot: Slot, buf: Vec<u8>, result: io::Result<()>) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        conn.in_flight = None;
        conn.spare = buf;
        conn.in_flight_bytes = 0;
        let delta = conn.regauge();
        self.shared.metrics.shards[self.id].queued_bytes.add(delta);
        if let Err(e) = result {
            if conn.closing.is_none() {
                let peer = conn.peer;
                conn_log!(self, debug, %peer, error = %e, "write failed; closing connection");
                self.close(slot, CloseReason::IoError);
            }
            return;
        }
        // The socket took a whole send: it drains again, and an earlier
        // reading of it says nothing any more.
        conn.probe = None;
        if std::mem::take(&mut conn.not_draining) {
            let key = conn.key;
            self.announce_draining(key, false);
        }
        let conn = &self.conns[slot];
        if conn.has_output() || conn.close_after_flush.is_some() {
            self.mark_dirty(slot);
        }
    }
}
