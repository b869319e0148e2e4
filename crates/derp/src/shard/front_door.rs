//! The front door: accepting a socket, the HTTP request, and the DERP
//! handshake up to a registered (or migrating) connection.

use super::*;
use crate::transport::websocket::WsFraming;

impl Shard {
    pub(super) fn accept(&mut self, listener: usize, stream: TcpStream, peer: SocketAddr) {
        let m = &self.m;
        m.tcp_accepts.inc();
        if self.draining.is_some() {
            return; // dropping the stream closes it
        }
        if !self.accept_allowed() {
            self.m.accept_rejects.inc();
            return; // closed at once, as derper does
        }
        let sock = socket2::SockRef::from(&stream);
        let _ = sock.set_nodelay(true);
        if let Some(idle) = self.shared.config.tcp_keepalive {
            let _ = sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(idle));
        }
        if let Some(t) = self.shared.config.tcp_user_timeout {
            let _ = sock.set_tcp_user_timeout(Some(t));
        }
        let kind = self
            .shared
            .listener_kinds
            .get(listener)
            .copied()
            .unwrap_or(ListenerKind::Derp);
        let deadline = self.now + self.shared.config.handshake_timeout;
        self.next_gen = self.next_gen.wrapping_add(1);
        let mut conn = Conn::new(self.next_gen, peer, kind, self.now, deadline);
        conn.set_proxy(self.proxy_prelude_for(&peer));
        if kind == ListenerKind::Derp {
            if let Some(tls) = &self.shared.config.tls {
                match rustls::ServerConnection::new(tls.clone()) {
                    Ok(mut t) => {
                        t.set_buffer_limit(None);
                        let cfg = &self.shared.config;
                        // Ferry's record layer needs the keys out of
                        // rustls (`server::shard_config` allows that).
                        let own_records = cfg.tls_records == TlsRecords::Ferry
                            && !cfg.ktls
                            && tls.enable_secret_extraction;
                        conn.set_transport(Transport::rustls(t, cfg.ktls, own_records));
                        self.m.tls_sockets.add(1);
                    }
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "could not start TLS");
                        return;
                    }
                }
            }
        }
        self.m.open_sockets.add(1);
        let slot = self.conns.insert(conn);
        self.ops.push(Op::Attach(slot, stream));
    }

    pub(super) fn fail_handshake(
        &mut self,
        slot: Slot,
        why: HandshakeFailure,
        detail: &dyn std::fmt::Display,
    ) {
        self.count_handshake_failure(slot, why, detail);
        self.close(slot, CloseReason::Handshake);
    }

    /// Counts and logs a failed handshake.
    pub(super) fn count_handshake_failure(
        &mut self,
        slot: Slot,
        why: HandshakeFailure,
        detail: &dyn std::fmt::Display,
    ) {
        self.m.handshake_failures[why as usize].inc();
        let peer = self.conns[slot].peer();
        conn_log!(self, info, %peer, reason = why.label(), %detail, "handshake failed; closing connection");
    }

    pub(super) fn read_head(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        let (got, work) = self.conns[slot].read_head(data);
        self.m.head_bytes_scanned.add(work as u64);
        let conn = &mut self.conns[slot];
        let req = match got {
            Ok(Some(req)) => req,
            Ok(None) => return ControlFlow::Continue(()),
            Err(http::HttpError::TooLarge { .. }) => {
                self.reject_http(
                    slot,
                    HandshakeFailure::HttpTooLarge,
                    431,
                    "Request Header Fields Too Large",
                );
                return ControlFlow::Break(());
            }
            Err(e) => {
                let detail = e.to_string();
                self.m.handshake_failures[HandshakeFailure::HttpMalformed as usize].inc();
                let peer = self.conns[slot].peer();
                conn_log!(self, info, %peer, error = %detail, "malformed HTTP request");
                self.respond(
                    slot,
                    http::response(400, "Bad Request", &[], b"bad request\n"),
                );
                return ControlFlow::Break(());
            }
        };
        let head = conn.take_head();
        // The peer before a forwarding header names another: who may see
        // the debug pages depends on both.
        let peer = conn.peer();
        self.forwarded_client(slot, &req);
        let conn = &self.conns[slot];
        let kind = conn.listener();
        let now_ns = self.wall_ns(self.now);
        let cfg = &self.shared.config;
        match front::answer(cfg, &self.shared.metrics, kind, &peer, &req, now_ns) {
            Answer::Respond(route, bytes) => {
                self.m.http_requests[route as usize].inc();
                self.respond(slot, bytes);
                ControlFlow::Break(())
            }
            Answer::DebugClients(q) => {
                self.m.http_requests[crate::metrics::Route::Debug as usize].inc();
                self.ask_debug_clients(slot, q);
                ControlFlow::Break(())
            }
            Answer::Upgrade {
                fast_start,
                websocket,
            } => {
                let m = &self.m;
                m.http_requests[crate::metrics::Route::Derp as usize].inc();
                m.accepts.inc();
                let num = self.shared.conn_nums.fetch_add(1, Ordering::Relaxed) + 1;
                self.conns[slot].set_num(num);
                let m = &self.m;
                if fast_start {
                    m.fast_starts.inc();
                }
                let public = self.shared.config.public_key;
                let deadline = self.now + self.shared.config.handshake_timeout;
                if websocket.is_some() {
                    m.websocket_accepts.inc();
                }
                let conn = &mut self.conns[slot];
                if let Some(key) = websocket {
                    let response = ferry_proto::websocket::accept_response(&key);
                    conn.put_ws(Box::new(WsFraming::new(response)));
                } else if !fast_start {
                    conn.derp_mut()
                        .control_mut()
                        .extend_from_slice(&http::switching_protocols(&public));
                }
                conn.derp_mut()
                    .control_mut()
                    .extend_from_slice(&handshake::server_key_frame(&public));
                conn.set_not_ideal(req.ideal_node.as_deref().is_some_and(|n| !n.is_empty()));
                conn.set_phase(Phase::ClientInfo);
                conn.derp_mut().set_deadline(deadline);
                self.mark_dirty(slot);
                let rest = head.get(req.head_len..).unwrap_or_default();
                if rest.is_empty() {
                    ControlFlow::Continue(())
                } else {
                    self.process_plain(slot, rest)
                }
            }
        }
    }

    pub(super) fn reject_http(
        &mut self,
        slot: Slot,
        why: HandshakeFailure,
        status: u16,
        reason: &str,
    ) {
        self.m.handshake_failures[why as usize].inc();
        let peer = self.conns[slot].peer();
        conn_log!(self, info, %peer, reason = why.label(), "rejecting HTTP request");
        self.respond(slot, http::response(status, reason, &[], b""));
    }

    pub(super) fn respond(&mut self, slot: Slot, bytes: Vec<u8>) {
        let conn = &mut self.conns[slot];
        conn.derp_mut().control_mut().extend_from_slice(&bytes);
        conn.set_phase(Phase::Responding);
        conn.close_when_flushed(CloseReason::HttpDone);
        self.mark_dirty(slot);
    }

    pub(super) fn on_client_info(
        &mut self,
        slot: Slot,
        _ty: u8,
        payload: &[u8],
    ) -> ControlFlow<()> {
        let result = handshake::open_client_info(&self.shared.config.private_key, payload);
        let (key, info) = match result {
            Ok(v) => v,
            Err(e) => {
                if let HandshakeError::InvalidAppName { shown } = &e {
                    let reason = HandshakeFailure::InvalidAppName;
                    self.shared.metrics.note_refused_name(reason, shown);
                }
                let why = match &e {
                    HandshakeError::ZeroKey => HandshakeFailure::ZeroKey,
                    HandshakeError::Json { .. } => HandshakeFailure::BadJson,
                    HandshakeError::InvalidAppName { .. } => HandshakeFailure::InvalidAppName,
                    HandshakeError::TooShort { .. } | HandshakeError::TooLong { .. } => {
                        HandshakeFailure::BadFirstFrame
                    }
                    _ => HandshakeFailure::BoxOpen,
                };
                self.fail_handshake(slot, why, &e);
                return ControlFlow::Break(());
            }
        };
        let mesh = match (&self.shared.config.mesh_key, &info.mesh_key) {
            (Some(ours), Some(theirs)) => ours.ct_eq(theirs),
            _ => false,
        };
        let name = info.app_name.as_deref().unwrap_or("");
        if !mesh && self.shared.config.disallowed_app_names.contains(name) {
            let shown = app_name::shown_app_name(name);
            let reason = HandshakeFailure::DisallowedAppName;
            self.shared.metrics.note_refused_name(reason, &shown);
            let why = format!("disallowed app name {shown}");
            self.fail_handshake(slot, HandshakeFailure::DisallowedAppName, &why);
            return ControlFlow::Break(());
        }
        let relay_sessions = self.wants_relay_sessions(&info);
        let conn = &mut self.conns[slot];
        conn.identify(key, mesh, info.is_prober);
        conn.set_app_name(info.app_name);
        conn.set_version(info.version);
        conn.set_relay_sessions(relay_sessions);
        conn.set_ferry_mesh(mesh && info.ferry_mesh >= ferry_proto::mesh_session::VERSION);
        if self.begin_admission(slot) {
            // Frames after clientInfo wait in the deframer for the verdict.
            return ControlFlow::Break(());
        }
        self.after_client_info(slot)
    }

    /// Registers a connection whose clientInfo was read (and admitted)
    /// here, or sends it to the shard that owns its key.
    pub(super) fn after_client_info(&mut self, slot: Slot) -> ControlFlow<()> {
        let key = self.conns[slot].key();
        let owner = self.shared.owner_of(&key, self.shards);
        let conn = &mut self.conns[slot];
        if owner == self.id {
            conn.set_phase(Phase::Active);
            self.register(slot);
            // Stop here: the frames after clientInfo follow other rules.
            ControlFlow::Break(())
        } else {
            // Frames after clientInfo stay in the deframer and travel along.
            conn.set_phase(Phase::Migrating);
            self.hold_input(slot, Hold::Migrating);
            self.migrating.push(slot);
            ControlFlow::Break(())
        }
    }
}
