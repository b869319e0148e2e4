//! Bytes in: raw socket bytes through the transport into the
//! connection's phase, frames from active clients, and resuming input
//! after a pause.

use super::*;
use crate::transport::{End, Sink};

impl Shard {
    pub(super) fn on_received(&mut self, slot: Slot, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.is_closed() {
            return;
        }
        if conn.proxy() != crate::conn::ProxyPrelude::Done {
            self.proxy_prelude(slot, data);
            return;
        }
        if conn.must_stash() {
            conn.stash(data);
            return;
        }
        self.ingest(slot, data);
    }

    /// Feeds raw socket bytes through the transport into the protocol:
    /// the transport is taken out of the connection once and does one
    /// read. Bytes not read because input paused are stashed.
    pub(super) fn ingest(&mut self, slot: Slot, data: &[u8]) {
        let mut transport = self.conns[slot].take_transport();
        let mut plain = std::mem::take(&mut self.plain);
        let read = transport.read(data, &mut plain, &mut PhaseSink { shard: self, slot });
        self.plain = plain;
        self.conns[slot].set_transport(transport);
        if read.moved {
            self.m.records_sockets.add(1);
        }
        match read.end {
            None => {
                let conn = &mut self.conns[slot];
                if read.unread > 0 && conn.closed().is_none() {
                    conn.stash(&data[data.len() - read.unread..]);
                }
            }
            // close_notify: an orderly end.
            Some(End::Closed) => self.on_eof(slot),
            Some(End::Io(e)) => self.tls_failed(slot, &e),
            Some(End::Handoff(e)) => self.tls_failed(slot, &e),
            Some(End::Rustls(e)) => {
                self.tls_failed_after_alert(slot, &e);
                return;
            }
            Some(End::Records(e)) => {
                let conn = &self.conns[slot];
                let peer = conn.peer();
                conn_log!(self, info, %peer, error = %e, "TLS error; closing connection");
                if e.alert().is_some() && self.conns[slot].closed().is_none() {
                    // The alert goes out, nothing after it, then the
                    // connection closes.
                    self.finish(slot, CloseReason::IoError);
                } else {
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
        if self.conns[slot].transport().wants_write() {
            self.mark_dirty(slot);
        }
        let conn = &self.conns[slot];
        if conn.transport().may_hand_off() && conn.closed().is_none() {
            let gen = conn.gen();
            if !self
                .ktls_candidates
                .iter()
                .any(|&(s, g, _)| s == slot && g == gen)
            {
                // A move is tried between turns until it works, is refused
                // for good, or this deadline passes.
                let deadline = self.now + KTLS_TRY_FOR;
                self.ktls_candidates.push((slot, gen, deadline));
            }
        }
    }

    pub(super) fn tls_failed(&mut self, slot: Slot, e: &dyn std::fmt::Display) {
        if self.conns[slot].phase() == Phase::Active {
            let peer = self.conns[slot].peer();
            conn_log!(self, info, %peer, error = %e, "TLS error; closing connection");
            self.close(slot, CloseReason::IoError);
        } else {
            self.fail_handshake(slot, HandshakeFailure::Tls, e);
        }
    }

    /// As [`Shard::tls_failed`], for a rustls session that queued an
    /// alert: the connection closes once the alert is written (or the
    /// finishing grace passes), and reads nothing more.
    fn tls_failed_after_alert(&mut self, slot: Slot, e: &dyn std::fmt::Display) {
        if self.conns[slot].phase() == Phase::Active {
            let peer = self.conns[slot].peer();
            conn_log!(self, info, %peer, error = %e, "TLS error; closing connection");
        } else {
            self.count_handshake_failure(slot, HandshakeFailure::Tls, e);
        }
        self.finish(slot, CloseReason::IoError);
        self.mark_dirty(slot);
    }

    /// Feeds decrypted bytes to the connection's current phase. Breaks when
    /// input paused or the connection closed; unconsumed bytes are kept by
    /// the connection (deframer or stash).
    pub(super) fn process_plain(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        match self.conns[slot].phase() {
            Phase::Http => self.read_head(slot, data),
            Phase::ClientInfo | Phase::Active if self.conns[slot].is_websocket() => {
                self.ws_input(slot, data)
            }
            Phase::ClientInfo | Phase::Active => self.deframe(slot, data),
            Phase::Migrating | Phase::Admitting => {
                self.conns[slot].stash(data);
                ControlFlow::Break(())
            }
            Phase::Responding => ControlFlow::Continue(()),
        }
    }

    pub(super) fn deframe(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        let mut reader = self.conns[slot].derp_mut().take_reader();
        let was_handshake = self.conns[slot].phase() == Phase::ClientInfo;
        let policy = self.conns[slot].frame_policy();
        let result = if was_handshake {
            reader.handshake_bytes(data, |ty, payload| self.on_client_info(slot, ty, payload))
        } else {
            reader.handle_bytes(data, policy, |len, action| self.on_frame(slot, len, action))
        };
        self.conns[slot].derp_mut().put_reader(reader);
        if was_handshake
            && result == Ok(frame::Fed::Paused)
            && self.conns[slot].phase() == Phase::Active
        {
            // clientInfo registered the connection here: what followed it
            // in the same read is held by the reader and now read under
            // the steady-state rules.
            return self.resume_frames(slot);
        }
        self.after_deframe(slot, result)
    }

    /// Continues with frames the reader holds (after a pause).
    pub(super) fn resume_frames(&mut self, slot: Slot) -> ControlFlow<()> {
        let mut reader = self.conns[slot].derp_mut().take_reader();
        let policy = self.conns[slot].frame_policy();
        let result = reader.resume(policy, |len, action| self.on_frame(slot, len, action));
        self.conns[slot].derp_mut().put_reader(reader);
        self.after_deframe(slot, result)
    }

    pub(super) fn after_deframe(
        &mut self,
        slot: Slot,
        result: Result<frame::Fed, frame::FrameError>,
    ) -> ControlFlow<()> {
        match result {
            Ok(frame::Fed::Drained) => {
                if self.ended(slot) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }
            Ok(frame::Fed::Paused) => {
                if self.conns[slot].phase() == Phase::ClientInfo {
                    // clientInfo was read; what follows waits for the
                    // connection to register (here or on its owner shard).
                }
                ControlFlow::Break(())
            }
            Err(e) => {
                let conn = &self.conns[slot];
                let peer = conn.peer();
                if !self.ended(slot) {
                    if conn.phase() == Phase::ClientInfo {
                        self.fail_handshake(slot, HandshakeFailure::BadFirstFrame, &e);
                    } else {
                        let key = conn.key();
                        conn_log!(self, info, %peer, client = %key, error = %e, "protocol violation; closing connection");
                        self.finish(slot, CloseReason::FrameError);
                    }
                }
                ControlFlow::Break(())
            }
        }
    }

    #[inline]
    pub(super) fn on_frame(
        &mut self,
        slot: Slot,
        len: usize,
        action: Action<'_>,
    ) -> ControlFlow<()> {
        let flow = self.handle_action(slot, action);
        if self.conns[slot].is_rate_limited() {
            return self.charge_frame(slot, len, flow);
        }
        flow
    }

    /// What a client frame asks for (see [`Action`]).
    #[inline]
    fn handle_action(&mut self, slot: Slot, action: Action<'_>) -> ControlFlow<()> {
        if self.ended(slot) {
            return ControlFlow::Break(());
        }
        if self.conns[slot].is_dup() {
            self.note_activity(slot);
        }
        let src = self.conns[slot].key();
        match action {
            Action::Send { dst, packet } => {
                self.conns[slot].tally_mut().received(packet.len());
                let m = &self.m;
                m.packets_received.inc();
                m.bytes_received.add(packet.len() as u64);
                m.packets_received_kind[PacketKind::of(packet) as usize].inc();
                self.route(slot, Via::Send, &src, &dst, packet)
            }
            Action::Forward { src, dst, packet } => {
                self.conns[slot].tally_mut().received(packet.len());
                self.m.packets_forwarded_in.inc();
                self.route(slot, Via::Forward, &src, &dst, packet)
            }
            Action::NotePreferred(preferred) => {
                let young = self.now.duration_since(self.conns[slot].registered_at())
                    < Duration::from_secs(5);
                if self.conns[slot].note_preferred(preferred) {
                    let m = &self.m;
                    m.current_home_connections
                        .add(if preferred { 1 } else { -1 });
                    if !young {
                        if preferred {
                            m.home_moves_in.inc()
                        } else {
                            m.home_moves_out.inc()
                        }
                    }
                }
                ControlFlow::Continue(())
            }
            Action::Ping(data) => {
                self.m.got_ping.inc();
                if self.conns[slot].derp_mut().answer_ping(&data) {
                    self.m.sent_pong.inc();
                    self.mark_dirty(slot);
                }
                ControlFlow::Continue(())
            }
            Action::WatchConns => {
                if src != self.shared.config.public_key && self.conns[slot].become_watcher() {
                    self.m.watchers.add(1);
                    let me = self.conn_ref(slot);
                    for shard in 0..self.shards {
                        if shard == self.id {
                            self.add_watcher(me);
                        } else {
                            self.mail(shard, Mail::AddWatcher(me));
                        }
                    }
                }
                ControlFlow::Continue(())
            }
            Action::ClosePeer(key) => {
                let owner = self.shared.owner_of(&key, self.shards);
                if owner == self.id {
                    self.close_peer(key);
                } else {
                    self.mail(owner, Mail::ClosePeer(key));
                }
                if self.ended(slot) {
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            }
            Action::Unknown { ty, payload }
                if ty == frame::RELAY_ALLOCATE && self.conns[slot].has_relay_sessions() =>
            {
                self.on_relay_allocate(slot, payload)
            }
            Action::Unknown { ty, payload }
                if ty == ferry_proto::mesh_session::MESH_SESSION
                    && self.conns[slot].speaks_ferry_mesh() =>
            {
                self.on_mesh_session(slot, payload);
                ControlFlow::Continue(())
            }
            Action::Unknown { .. } => {
                self.m.unknown_frames.inc();
                ControlFlow::Continue(())
            }
        }
    }

    pub(super) fn on_eof(&mut self, slot: Slot) {
        let conn = &self.conns[slot];
        if conn.is_closed() || conn.close_after_flush().is_some() {
            return;
        }
        match conn.phase() {
            Phase::Active => self.close(slot, CloseReason::Eof),
            _ => {
                self.m.handshake_failures[HandshakeFailure::Eof as usize].inc();
                self.close(slot, CloseReason::Handshake);
            }
        }
    }

    /// Restarts input after a pause: frames held by the deframer, then
    /// plaintext held by TLS, then stashed raw bytes.
    pub(super) fn resume_input(&mut self, slot: Slot) {
        if !self.conns[slot].resume() {
            return; // still held: its owner resumes it when it lets go
        }
        if self.resume_frames(slot).is_break() {
            return;
        }
        // Plaintext the transport still holds (rustls's).
        self.ingest(slot, &[]);
        let conn = &self.conns[slot];
        if conn.is_closed() || conn.is_paused() {
            return;
        }
        let stash = self.conns[slot].take_stash();
        if !stash.is_empty() {
            self.ingest(slot, &stash);
        }
        // Keep the capacity for the next pause.
        self.conns[slot].recycle_stash(stash);
        if !self.conns[slot].is_paused() && self.conns[slot].closed().is_none() {
            self.ops.push(Op::SetRecv(slot, true));
        }
    }
}

/// The connection's current phase as a transport's [`Sink`].
struct PhaseSink<'a> {
    shard: &'a mut Shard,
    slot: Slot,
}

impl Sink for PhaseSink<'_> {
    #[inline]
    fn open(&self) -> bool {
        let conn = &self.shard.conns[self.slot];
        !conn.is_closed() && !conn.is_paused()
    }

    #[inline]
    fn deliver(&mut self, plain: &[u8]) -> ControlFlow<()> {
        self.shard.process_plain(self.slot, plain)
    }
}
