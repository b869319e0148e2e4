//! Bytes in: raw socket bytes through TLS (if any) into the connection's
//! phase, frames from active clients, and resuming input after a pause.

use super::*;

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

    /// Feeds raw socket bytes through TLS (if any) into the protocol.
    /// Bytes not consumed because input paused are stashed.
    pub(super) fn ingest(&mut self, slot: Slot, data: &[u8]) {
        let Some(mut user) = self.conns[slot].transport_mut().take_user() else {
            if let Some(records) = self.conns[slot].transport_mut().take_records() {
                self.ingest_records(slot, records, data);
                return;
            }
            // Without TLS, whatever is not consumed is kept by the phase
            // that stopped (deframer or stash).
            let _ = self.process_plain(slot, data);
            return;
        };
        let mut rest = data;
        let mut ok = true;
        let mut failure = None;
        'feed: loop {
            if !self.drain_tls(slot, &mut user.conn) {
                break 'feed;
            }
            if user.own_records && !user.conn.is_handshaking() {
                match self.move_to_own_records(slot, user) {
                    Some(back) => user = back,
                    None => {
                        if self.conns[slot].closed().is_none() {
                            self.ingest(slot, rest);
                        }
                        return;
                    }
                }
            }
            if rest.is_empty() {
                break;
            }
            let before = rest;
            // Before a move to Ferry's record layer, rustls gets whole
            // records only (a header, then its body), so that the move
            // finds it at a record boundary.
            let mut input = match user.boundary.as_ref().filter(|_| user.own_records) {
                Some(b) => {
                    let upto = match b.bytes_to_next() {
                        0 => ferry_proto::tls_record::HEADER_LEN,
                        n => n,
                    };
                    &rest[..upto.min(rest.len())]
                }
                None => rest,
            };
            match user.conn.read_tls(&mut input) {
                Ok(n) => {
                    rest = &before[n..];
                    if let Some(b) = user.boundary.as_mut() {
                        b.feed(&before[..n]);
                    }
                }
                Err(e) => {
                    ok = false;
                    self.tls_failed(slot, &e);
                    break;
                }
            }
            if let Err(e) = user.conn.process_new_packets() {
                // rustls queued its alert: that goes out, then the end.
                ok = false;
                user.failed = true;
                failure = Some(e);
                break;
            }
        }
        let conn = &mut self.conns[slot];
        if ok && !rest.is_empty() && conn.closed().is_none() {
            conn.stash(rest);
        }
        let wants_write = user.conn.wants_write();
        let handshaken = !user.conn.is_handshaking();
        let may_move = user.boundary.is_some() && !user.own_records;
        conn.transport_mut().put_user(user);
        if let Some(e) = failure {
            self.tls_failed_after_alert(slot, &e);
            return;
        }
        if wants_write {
            self.mark_dirty(slot);
        }
        let conn = &self.conns[slot];
        if handshaken && may_move && conn.closed().is_none() {
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

    /// Moves a finished TLS 1.3 session from rustls to Ferry's record
    /// layer (the bytes given to rustls end on a record boundary, and it
    /// holds no plaintext: `drain_tls` emptied it). `None`: moved, or the
    /// connection failed; `Some`: it stays on rustls (TLS 1.2, or input
    /// paused with plaintext still in rustls: tried again on the next
    /// input).
    fn move_to_own_records(&mut self, slot: Slot, user: Box<UserTls>) -> Option<Box<UserTls>> {
        if !user.boundary.as_ref().is_some_and(|b| b.at_boundary()) {
            return Some(user);
        }
        let UserTls { conn, boundary, .. } = *user;
        match crate::transport::records::RecordLayer::start(conn) {
            Ok(layer) => {
                let pending = layer.has_pending();
                self.conns[slot]
                    .transport_mut()
                    .put_records(Box::new(layer));
                self.m().records_sockets.add(1);
                if pending {
                    self.mark_dirty(slot);
                }
                None
            }
            Err(crate::transport::handoff::Refused::Usable { conn, reason }) => {
                // TLS 1.2 (not transient): rustls for the whole connection.
                let own_records = reason.is_transient();
                Some(Box::new(UserTls {
                    conn,
                    boundary: boundary.filter(|_| own_records),
                    own_records,
                    failed: false,
                }))
            }
            Err(crate::transport::handoff::Refused::Dead(e)) => {
                self.tls_failed(slot, &e);
                None
            }
        }
    }

    /// Feeds raw socket bytes through Ferry's TLS record layer into the
    /// protocol: each record's plaintext goes to the connection's phase
    /// where it was opened. Bytes not consumed because input paused are
    /// stashed.
    fn ingest_records(
        &mut self,
        slot: Slot,
        mut records: Box<crate::transport::records::RecordLayer>,
        data: &[u8],
    ) {
        use crate::transport::records::Content;
        let mut plain = std::mem::take(&mut self.tls_plain);
        if plain.len() < PLAINTEXT_BUFFER {
            plain.resize(PLAINTEXT_BUFFER, 0);
        }
        let mut rest = data;
        let mut end = None;
        loop {
            let conn = &self.conns[slot];
            if conn.is_closed() || conn.is_paused() {
                break;
            }
            match records.read(&mut rest, &mut plain) {
                Ok(Some(Content::Data(data))) => {
                    // The phase keeps whatever it does not consume, so the
                    // record is used either way.
                    let _ = self.process_plain(slot, data);
                }
                Ok(Some(Content::Closed)) => {
                    end = Some(Ok(()));
                    break;
                }
                Ok(None) => break,
                Err(e) => {
                    end = Some(Err(e));
                    break;
                }
            }
        }
        self.tls_plain = plain;
        let conn = &mut self.conns[slot];
        if end.is_none() && !rest.is_empty() && conn.closed().is_none() {
            conn.stash(rest);
        }
        match end {
            None => conn.transport_mut().put_records(records),
            Some(Ok(())) => {
                conn.transport_mut().put_records(records);
                // close_notify: an orderly end.
                self.on_eof(slot);
            }
            Some(Err(e)) => {
                let peer = conn.peer();
                conn_log!(self, info, %peer, error = %e, "TLS error; closing connection");
                let conn = &mut self.conns[slot];
                match e.alert() {
                    Some(alert) if conn.closed().is_none() => {
                        // The alert goes out, nothing after it, then the
                        // connection closes.
                        records.queue_alert(alert);
                        conn.transport_mut().put_records(records);
                        self.finish(slot, CloseReason::IoError);
                    }
                    _ => {
                        conn.transport_mut().put_records(records);
                        self.close(slot, CloseReason::IoError);
                    }
                }
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

    /// Moves decrypted bytes from TLS into the protocol, parsing them where
    /// rustls keeps them (one plaintext chunk per record) instead of
    /// copying them out first. Returns `false` when input paused or the
    /// connection closed.
    pub(super) fn drain_tls(&mut self, slot: Slot, tls: &mut rustls::ServerConnection) -> bool {
        loop {
            let conn = &self.conns[slot];
            if conn.is_closed() || conn.is_paused() {
                return false;
            }
            match tls.reader().into_first_chunk() {
                Ok([]) => {
                    // close_notify: an orderly end.
                    self.on_eof(slot);
                    return false;
                }
                Ok(chunk) => {
                    let n = chunk.len();
                    // The phase keeps whatever it does not consume (partial
                    // frame, stash), so the whole chunk is used either way.
                    let flow = self.process_plain(slot, chunk);
                    tls.reader().consume(n);
                    if flow.is_break() {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) => {
                    self.tls_failed(slot, &e);
                    return false;
                }
            }
        }
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
                let m = self.m();
                m.packets_received.inc();
                m.bytes_received.add(packet.len() as u64);
                m.packets_received_kind[PacketKind::of(packet) as usize].inc();
                self.route(slot, RECORD_SEND, &src, &dst, packet)
            }
            Action::Forward { src, dst, packet } => {
                self.m().packets_forwarded_in.inc();
                self.route(slot, RECORD_FORWARD, &src, &dst, packet)
            }
            Action::NotePreferred(preferred) => {
                let young = self.now.duration_since(self.conns[slot].registered_at())
                    < Duration::from_secs(5);
                if self.conns[slot].note_preferred(preferred) {
                    let m = &self.shared.metrics.shards[self.id];
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
                self.m().got_ping.inc();
                if self.conns[slot].derp_mut().answer_ping(&data) {
                    self.m().sent_pong.inc();
                    self.mark_dirty(slot);
                }
                ControlFlow::Continue(())
            }
            Action::WatchConns => {
                if src != self.shared.config.public_key && self.conns[slot].become_watcher() {
                    self.m().watchers.add(1);
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
            Action::Unknown { .. } => {
                self.m().unknown_frames.inc();
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
                self.m().handshake_failures[HandshakeFailure::Eof as usize].inc();
                self.close(slot, CloseReason::Handshake);
            }
        }
    }

    /// Restarts input after a pause: frames held by the deframer, then
    /// plaintext held by TLS, then stashed raw bytes.
    pub(super) fn resume_input(&mut self, slot: Slot) {
        self.conns[slot].unpause();
        if self.resume_frames(slot).is_break() {
            return;
        }
        if let Some(mut user) = self.conns[slot].transport_mut().take_user() {
            let go_on = self.drain_tls(slot, &mut user.conn);
            self.conns[slot].transport_mut().put_user(user);
            if !go_on {
                return;
            }
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
