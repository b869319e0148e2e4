//! The sweep (handshake deadlines, write timeouts, keepalives, memory
//! given back when idle) and the start of a graceful drain, which stops
//! accepting at once: new connections wait in the listening socket's
//! backlog for whoever else holds it (the next process under socket
//! activation) instead of being accepted and closed here.

use super::*;

impl Shard {
    pub(super) fn sweep(&mut self) {
        let now = self.now;
        let cfg = self.shared.config.clone();
        let mut expired: Vec<(Slot, CloseReason, bool)> = Vec::new();
        for (slot, conn) in self.conns.iter_mut() {
            if conn.closing.is_some() || conn.stream.is_some() {
                continue;
            }
            if conn.phase != Phase::Active {
                if now >= conn.deadline {
                    match conn.close_after_flush {
                        // A response or farewell the client did not take.
                        Some(reason) => expired.push((slot, reason, false)),
                        None => expired.push((slot, CloseReason::Handshake, false)),
                    }
                }
                continue;
            }
            if let Some(since) = conn.in_flight {
                let limit = if conn.mesh {
                    Some(cfg.mesh_write_timeout)
                } else {
                    cfg.write_timeout
                };
                if limit.is_some_and(|l| now.duration_since(since) >= l) {
                    expired.push((slot, CloseReason::WriteTimeout, true));
                    continue;
                }
            }
            if now >= conn.next_keepalive {
                conn.next_keepalive = now
                    + cfg.keepalive
                    + Duration::from_millis(self.jitter.gen_range(0..KEEPALIVE_JITTER_MS));
                frame::put_keepalive(&mut conn.ctrl);
                if !conn.dirty {
                    conn.dirty = true;
                    self.dirty.push(slot);
                }
                // A quiet moment: give back memory an earlier burst took.
                if conn.in_flight.is_none() && conn.spare.capacity() > IDLE_BUFFER_KEEP {
                    conn.spare = Vec::new();
                }
                if conn.data.is_empty() && conn.data.capacity() > IDLE_BUFFER_KEEP {
                    conn.data = Vec::new();
                }
                conn.deframer.shrink_if_idle();
            }
        }
        for (slot, reason, write_timeout) in expired {
            let peer = self.conns[slot].peer;
            if write_timeout {
                self.m().sclient_write_timeouts.inc();
                let key = self.conns[slot].key;
                conn_log!(self, info, %peer, client = %key, "client stopped reading for the write timeout; closing connection");
                self.close(slot, reason);
            } else if reason != CloseReason::Handshake {
                self.close(slot, reason);
            } else {
                let phase = self.conns[slot].phase;
                self.fail_handshake(
                    slot,
                    HandshakeFailure::Timeout,
                    &format_args!("no complete handshake within the deadline (phase {phase:?})"),
                );
            }
        }
    }

    pub(super) fn start_drain(&mut self) {
        self.draining = Some(self.now + self.shared.config.shutdown_grace);
        let reconnect = self.shared.config.restart_reconnect_in.as_millis() as u32;
        let try_for = self.shared.config.restart_try_for.as_millis() as u32;
        let slots: Vec<Slot> = self.conns.iter().map(|(s, _)| s).collect();
        for slot in slots {
            let conn = &mut self.conns[slot];
            if conn.closing.is_some() || conn.stream.is_some() {
                continue;
            }
            if conn.phase == Phase::Active {
                // After everything already queued for it (control frames
                // go out first, so a data queue takes it at its end): a
                // client that leaves when told loses nothing. Its input
                // stops, so nothing new lands behind it.
                let tail = if conn.data.is_empty() && conn.disco.is_empty() {
                    &mut conn.ctrl
                } else {
                    &mut conn.data
                };
                frame::put_restarting(tail, reconnect, try_for);
                conn.close_after_flush = Some(CloseReason::Shutdown);
                self.hold_input(slot, Hold::Closing);
                self.mark_dirty(slot);
            } else if conn.phase != Phase::Responding {
                self.close(slot, CloseReason::Shutdown);
            }
        }
    }

    /// Stops accepting on every listener of this shard (see the module
    /// docs). Connections the driver took before the stop took effect are
    /// closed on arrival ([`Shard::accept`] while draining).
    pub(super) fn stop_accepting(&mut self, driver: &mut dyn DriverOps) {
        for listener in 0..self.shared.listener_kinds.len() {
            driver.stop_accepting(listener);
        }
    }

    /// Logs, once, that the stop took effect on every listener.
    pub(super) fn note_accepts_stopped(&mut self, driver: &dyn DriverOps) {
        if (0..self.shared.listener_kinds.len()).any(|l| driver.accepting(l)) {
            return;
        }
        self.accepts_stopped = true;
        tracing::info!(
            shard = self.id,
            connections = self.conns.len(),
            "draining: stopped accepting new connections"
        );
    }
}
