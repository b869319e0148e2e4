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
            conn.clear_dirty();
            if conn.is_closed() || conn.derp().sending_since().is_some() || conn.is_detached() {
                continue;
            }
            if let Some(session) = conn.transport_mut().kernel() {
                if session.key_update_due() {
                    match driver.fd(slot).map(|fd| session.rekey_tx(fd)) {
                        Some(Ok(true)) => {}
                        // The socket cannot take our KeyUpdate now: next turn.
                        Some(Ok(false)) => {
                            self.dirty.push(slot);
                            conn.mark_dirty();
                            continue;
                        }
                        Some(Err(_)) | None => {
                            self.close(slot, CloseReason::IoError);
                            continue;
                        }
                    }
                }
            }
            let moved = conn.derp().queued_bytes();
            if conn.is_websocket() {
                self.ws_frame_output(slot);
            }
            let conn = &mut self.conns[slot];
            let (transport, derp) = conn.transport_and_derp();
            let mut buf = derp.take_send_buffer();
            if buf.capacity() == 0 {
                buf = self.send_pool.take();
            }
            // One write through the transport: the frames as they are
            // (under load, only data frames are queued and the queue itself
            // becomes the send buffer — no copy), sealed into records, or
            // through rustls.
            let worn = transport.write(derp, &mut buf).err();
            if let Some(e) = worn {
                // The key is worn and cannot be renewed: what was sealed
                // goes out with a close_notify, then the end.
                let peer = conn.peer();
                conn_log!(self, info, %peer, error = %e, "TLS session ends; closing connection after this send");
                conn.close_when_flushed(CloseReason::IoError);
            }
            let derp = conn.derp_mut();
            if buf.is_empty() {
                derp.keep_send_buffer(buf);
                self.send_pool.release_idle(derp);
                let delta = conn.regauge();
                self.m.queued_bytes.add(delta);
                if let Some(reason) = conn.close_after_flush() {
                    self.close(slot, reason);
                }
                continue;
            }
            derp.start_send(now, moved);
            let delta = conn.regauge();
            self.m.queued_bytes.add(delta);
            if let Some(session) = conn.transport_mut().kernel() {
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
            if conn.has_waiters() {
                self.release_waiters(slot);
            }
        }
        self.dirty_spare = dirty;
    }

    pub(super) fn on_sent(&mut self, slot: Slot, buf: Vec<u8>, result: io::Result<()>) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        // The socket took a whole send (or failed): an earlier reading of
        // it says nothing any more, and it is not stuck.
        let was_stuck = conn.on_sent(buf);
        let delta = conn.regauge();
        self.m.queued_bytes.add(delta);
        if was_stuck {
            let key = conn.key();
            self.announce_draining(key, false);
        }
        let conn = &mut self.conns[slot];
        if let Err(e) = result {
            if conn.closed().is_none() {
                let peer = conn.peer();
                conn_log!(self, debug, %peer, error = %e, "write failed; closing connection");
                self.close(slot, CloseReason::IoError);
            }
            return;
        }
        let conn = &mut self.conns[slot];
        if conn.has_output() || conn.close_after_flush().is_some() {
            self.mark_dirty(slot);
        } else {
            self.send_pool.release_idle(conn.derp_mut());
        }
    }
}
