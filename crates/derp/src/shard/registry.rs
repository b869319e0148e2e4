//! Who is connected: registering keys on their owner shard, the
//! duplicate-connection policy, peerGone bookkeeping, and closing.

use super::control_queue::Origin;
use super::*;
use crate::metrics::Notice;

impl Shard {
    /// Ends a connection now: it leaves every table at once, and its socket
    /// is released after the turn.
    pub(super) fn close(&mut self, slot: Slot, reason: CloseReason) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if !conn.mark_closed(reason) {
            return;
        }
        let phase = conn.phase();
        let (disco_n, data_n) = conn.derp().queued_packets();
        let queued = conn.regauge();
        let bp_paused = conn.release(Hold::Backpressure);
        self.closing.push(slot);
        let m = &self.m;
        m.closes[reason as usize].inc();
        m.queued_bytes.add(queued);
        if bp_paused {
            m.senders_paused.add(-1);
        }
        m.packets_dropped[DropReason::GoneDisconnected as usize][PacketKind::Disco as usize]
            .add(disco_n.into());
        m.packets_dropped[DropReason::GoneDisconnected as usize][PacketKind::Other as usize]
            .add(data_n.into());
        if phase == Phase::Active {
            self.unregister(slot);
        }
    }

    /// Ends a connection after writing what is already queued for it (the
    /// serverInfo a client waits for, say), as derper does when it hangs up
    /// on a protocol violation. It stops being read and leaves the routing
    /// tables at once; a client that does not take the bytes within
    /// [`FINISH_GRACE`] is closed anyway.
    pub(super) fn finish(&mut self, slot: Slot, reason: CloseReason) {
        let now = self.now;
        let conn = &mut self.conns[slot];
        if conn.is_ending() {
            return;
        }
        if !conn.has_output() && conn.derp().sending_since().is_none() {
            self.close(slot, reason);
            return;
        }
        let was_active = conn.phase() == Phase::Active;
        conn.set_phase(Phase::Responding);
        conn.close_when_flushed(reason);
        conn.derp_mut().set_deadline(now + FINISH_GRACE);
        self.hold_input(slot, Hold::Closing);
        if was_active {
            self.unregister(slot);
        }
        self.mark_dirty(slot);
    }

    /// Whether the connection is closed or on its way out.
    pub(super) fn ended(&self, slot: Slot) -> bool {
        self.conns[slot].is_ending()
    }

    pub(super) fn register(&mut self, slot: Slot) {
        let now = self.now;
        let cfg = self.shared.config.clone();
        self.activity += 1;
        let activity = self.activity;
        let jitter = Duration::from_millis(self.jitter.gen_range(0..KEEPALIVE_JITTER_MS));
        let ferry_derp = self.relay_capability(slot);
        let ferry_mesh =
            self.conns[slot]
                .speaks_ferry_mesh()
                .then_some(handshake::MeshCapability {
                    version: ferry_proto::mesh_session::VERSION,
                });
        let conn = &mut self.conns[slot];
        let write_timeout = if conn.is_mesh() {
            Some(cfg.mesh_write_timeout)
        } else {
            cfg.write_timeout
        };
        let rate = limits::bucket_for(&self.rate, conn.is_mesh());
        conn.register(
            now,
            now + cfg.keepalive + jitter,
            cfg.keepalive,
            write_timeout,
            rate,
        );
        if rate.is_some() {
            self.ops.push(Op::LimitRecv(slot));
        }
        conn.note_active(activity);
        let key = conn.key();
        let nonce = nacl::random_nonce();
        let info = handshake::seal_server_info(
            &cfg.private_key,
            &key,
            &ServerInfo {
                version: 2,
                ferry_derp,
                ferry_mesh,
                ..Default::default()
            },
            &nonce,
        );
        conn.derp_mut().control_mut().extend_from_slice(&info);
        let (addr, flags, app_name) = (conn.peer(), conn.presence_flags(), conn.app_name());

        let not_ideal = self.conns[slot].is_not_ideal();
        let m = &self.m;
        m.current_connections.add(1);
        if not_ideal {
            m.current_notideal.add(1);
        }
        let entry = self.keys.entry(key).or_default();
        match entry.conns.len() {
            0 if self.forward.contains_key(&key) => m.remote_keys.add(-1),
            0 => {}
            1 => {
                m.total_dup_client_conns.inc();
                m.current_dup_client_keys.add(1);
                m.current_dup_client_conns.add(2);
            }
            _ => {
                m.total_dup_client_conns.inc();
                m.current_dup_client_conns.add(1);
            }
        }
        entry.conns.push(slot);
        entry.active = Some(slot);
        if entry.conns.len() > 1 {
            for &s in &entry.conns {
                self.conns[s].set_dup(true);
            }
        }
        self.mark_dirty(slot);
        self.broadcast_watch(WatchEvent::Present {
            key,
            addr,
            flags,
            app_name,
        });
    }

    pub(super) fn unregister(&mut self, slot: Slot) {
        self.release_waiters(slot);
        let conn = &mut self.conns[slot];
        let key = conn.key();
        let (preferred, watcher, not_ideal) =
            (conn.is_preferred(), conn.is_watcher(), conn.is_not_ideal());
        let recv_from = conn.take_sources();
        if conn.clear_not_draining() {
            // Its packets go to the key's other connection, if any, again.
            self.announce_draining(key, false);
        }
        self.m.current_connections.add(-1);
        if preferred {
            self.m.current_home_connections.add(-1);
        }
        if not_ideal {
            self.m.current_notideal.add(-1);
        }
        for src in recv_from {
            if let Some(list) = self.receivers.get_mut(&src) {
                list.retain(|&(s, _)| s != slot);
                if list.is_empty() {
                    self.receivers.remove(&src);
                }
            }
        }
        if watcher {
            self.m.watchers.add(-1);
            let me = self.conn_ref(slot);
            for shard in 0..self.shards {
                if shard == self.id {
                    self.watchers.retain(|w| *w != me);
                } else {
                    self.mail(shard, Mail::RemoveWatcher(me));
                }
            }
        }

        let Some(entry) = self.keys.get_mut(&key) else {
            return;
        };
        entry.conns.retain(|&s| s != slot);
        match entry.conns.len() {
            0 => {
                self.keys.remove(&key);
                self.broadcast_watch(WatchEvent::Gone(key));
                // A key another node of the region still has is not gone.
                if self.forward.contains_key(&key) {
                    self.m.remote_keys.add(1);
                } else {
                    self.broadcast_key_gone(key);
                }
            }
            1 => {
                let last = entry.conns[0];
                entry.active = Some(last);
                self.conns[last].set_dup(false);
                self.m.current_dup_client_keys.add(-1);
                self.m.current_dup_client_conns.add(-2);
            }
            _ => {
                self.m.current_dup_client_conns.add(-1);
                if entry.active == Some(slot) {
                    entry.active = entry
                        .conns
                        .iter()
                        .copied()
                        .max_by_key(|&s| self.conns[s].last_active());
                }
            }
        }
    }

    /// Tells the receivers of `key` on every shard that it left.
    pub(super) fn broadcast_key_gone(&mut self, key: NodePublic) {
        for shard in 0..self.shards {
            if shard == self.id {
                self.key_gone(key);
            } else {
                self.mail(shard, Mail::KeyGone(key));
            }
        }
    }

    /// Tells local receivers of `key` that it left.
    pub(super) fn key_gone(&mut self, key: NodePublic) {
        self.stuck_remote.remove(&key);
        let Some(list) = self.receivers.remove(&key) else {
            return;
        };
        for (slot, gen) in list {
            let Some(conn) = self.conns.get_mut(slot) else {
                continue;
            };
            if conn.gen() != gen || conn.is_closed() {
                continue;
            }
            conn.forget_source(&key);
            let notice = Origin::Other(Notice::PeerGone);
            if self.queue_control(slot, notice, |q| {
                frame::put_peer_gone(q, &key, PeerGoneReason::Disconnected)
            }) {
                self.m.peer_gone_disconnected_frames.inc();
            }
        }
    }

    pub(super) fn note_activity(&mut self, slot: Slot) {
        self.activity += 1;
        let conn = &mut self.conns[slot];
        conn.note_active(self.activity);
        if let Some(entry) = self.keys.get_mut(&conn.key()) {
            entry.active = Some(slot);
        }
    }

    pub(super) fn close_peer(&mut self, key: NodePublic) {
        let Some(entry) = self.keys.get(&key) else {
            return;
        };
        for slot in entry.conns.clone() {
            let peer = self.conns[slot].peer();
            conn_log!(self, info, %peer, client = %key, "closing connection at a mesh peer's request");
            self.close(slot, CloseReason::ClosePeer);
        }
    }

    pub(super) fn release_closed(&mut self, driver: &mut dyn DriverOps) {
        let mut closing = std::mem::take(&mut self.closing);
        for slot in closing.drain(..) {
            if let Some(conn) = self.conns.try_remove(slot) {
                driver.close(slot);
                let m = &self.m;
                m.open_sockets.add(-1);
                count_transport(m, &conn, -1);
            }
        }
        std::mem::swap(&mut self.closing, &mut closing);
        self.closing.append(&mut closing);
    }
}
