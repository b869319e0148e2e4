//! The sweep (handshake deadlines, write timeouts, keepalives, memory
//! given back when idle) and the start of a graceful drain, which stops
//! accepting at once: new connections wait in the listening socket's
//! backlog for whoever else holds it (the next process under socket
//! activation) instead of being accepted and closed here.

use super::*;

impl Shard {
    pub(super) fn sweep(&mut self) {
        let now = self.now;
        let mut expired: Vec<(Slot, CloseReason, bool)> = Vec::new();
        for (slot, conn) in self.conns.iter_mut() {
            if conn.is_closed() || conn.is_detached() {
                continue;
            }
            if conn.derp().poll_timeout().is_none_or(|at| now < at) {
                continue;
            }
            let jitter = &mut self.jitter;
            let jitter = || Duration::from_millis(jitter.gen_range(0..KEEPALIVE_JITTER_MS));
            match conn.derp_mut().handle_timeout(now, jitter) {
                None => {}
                Some(Timeout::Deadline) => match conn.close_after_flush() {
                    // A response or farewell the client did not take.
                    Some(reason) => expired.push((slot, reason, false)),
                    None => expired.push((slot, CloseReason::Handshake, false)),
                },
                Some(Timeout::WriteTimeout) => {
                    expired.push((slot, CloseReason::WriteTimeout, true));
                }
                // A keepAlive was queued: flush it. A quiet moment, too:
                // Ferry's TLS record layer gives back a cut record's room.
                Some(Timeout::KeepAlive) => {
                    if let Some(records) = conn.transport_mut().records() {
                        records.release();
                    }
                    if conn.mark_dirty() {
                        self.dirty.push(slot);
                    }
                }
            }
        }
        for (slot, reason, write_timeout) in expired {
            let peer = self.conns[slot].peer();
            if write_timeout {
                self.m.sclient_write_timeouts.inc();
                let key = self.conns[slot].key();
                conn_log!(self, info, %peer, client = %key, "client stopped reading for the write timeout; closing connection");
                self.close(slot, reason);
            } else if reason != CloseReason::Handshake {
                self.close(slot, reason);
            } else {
                let phase = self.conns[slot].phase();
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
        self.end_hosted_sessions();
        let reconnect = self.shared.config.restart_reconnect_in.as_millis() as u32;
        let try_for = self.shared.config.restart_try_for.as_millis() as u32;
        let slots: Vec<Slot> = self.conns.iter().map(|(s, _)| s).collect();
        for slot in slots {
            let conn = &mut self.conns[slot];
            if conn.is_closed() || conn.is_detached() {
                continue;
            }
            if conn.phase() == Phase::Active {
                // After everything already queued for it (control frames
                // go out first, so a data queue takes it at its end): a
                // client that leaves when told loses nothing. Its input
                // stops, so nothing new lands behind it.
                conn.derp_mut().queue_restarting(reconnect, try_for);
                conn.close_when_flushed(CloseReason::Shutdown);
                self.hold_input(slot, Hold::Closing);
                self.mark_dirty(slot);
            } else if conn.phase() != Phase::Responding {
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
