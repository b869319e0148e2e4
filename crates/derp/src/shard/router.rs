//! Routing a packet: delivered to a local queue (caps and drop
//! accounting) or recorded into the ring to the key's owner shard; mail
//! between shards.

use super::control_queue::Origin;
use super::*;

impl Shard {
    /// Sends a packet on its way: delivered here, or pushed into the ring
    /// to the destination's owner. Breaks (pausing the sender) when that
    /// ring is full.
    pub(super) fn route(
        &mut self,
        slot: Slot,
        via: Via,
        src: &NodePublic,
        dst: &NodePublic,
        packet: &[u8],
    ) -> ControlFlow<()> {
        let owner = self.shared.owner_of(dst, self.shards);
        if owner == self.id {
            let from = self.conn_ref(slot);
            if self.deliver(via, src, dst, packet, from) {
                self.pause_sender(slot);
                return ControlFlow::Break(());
            }
            return ControlFlow::Continue(());
        }
        if !self.stuck_remote.is_empty() && self.stuck_remote.contains(dst) {
            let kind = PacketKind::of(packet);
            if kind == PacketKind::Other {
                // Its shard would only drop it (see the module doc).
                let m = &self.m;
                m.dropped(DropReason::QueueTail, kind, packet.len());
                return ControlFlow::Continue(());
            }
        }
        let gen = self.conns[slot].gen();
        let header = RingHeader {
            via,
            src: *src,
            dst: *dst,
            slot: slot as u32,
            gen,
        }
        .encode();
        let tx = self.rings.bytes_tx[owner]
            .as_mut()
            .expect("ring to another shard");
        if tx.try_push(&[&header, packet]) {
            self.notify[owner] = true;
            self.m.cross_shard_out.inc();
            return ControlFlow::Continue(());
        }
        // The owner is behind: keep this packet, stop reading the sender.
        self.conns[slot].stall(owner, [&header, packet]);
        self.hold_input(slot, Hold::Ring);
        self.stalled.push(slot);
        self.m.ring_stalls.inc();
        ControlFlow::Break(())
    }

    /// Queues a packet to the local active connection of `dst`. Returns
    /// `true` when the sender `from` must pause: the destination's data
    /// queue went over its cap, and `from` is now among its waiters.
    ///
    /// Backpressure replaces derper's drops for ordinary senders: the
    /// packet is taken, the sender stops being read until the destination
    /// drains, and TCP carries the signal back to it. Only senders feeding
    /// that destination pause. Mesh-forwarded packets are dropped instead
    /// (a paused mesh link would stall a whole peer server). A sender on
    /// another shard learns of its pause one turn later, so the queue may
    /// overshoot by what its ring holds plus one turn of reading; the hard
    /// cap (see [`Shard::new`]) is that bound, and drops only beyond it.
    pub(super) fn deliver(
        &mut self,
        via: Via,
        src: &NodePublic,
        dst: &NodePublic,
        packet: &[u8],
        from: ConnRef,
    ) -> bool {
        let kind = PacketKind::of(packet);
        let m = &self.m;
        let drop = |m: &ShardMetrics, reason: DropReason| m.dropped(reason, kind, packet.len());
        let Some(entry) = self.keys.get(dst) else {
            if via == Via::Send {
                if let Some(peer) = self.forwarder(dst) {
                    return self.forward_packet(peer, src, dst, packet, from);
                }
            }
            drop(
                m,
                if via == Via::Forward {
                    DropReason::UnknownDestOnFwd
                } else {
                    DropReason::UnknownDest
                },
            );
            if kind == PacketKind::Disco {
                if from.shard == self.id {
                    self.not_here(from, *dst);
                } else {
                    self.mail(
                        from.shard,
                        Mail::NotHere {
                            to: from,
                            dst: *dst,
                        },
                    );
                }
            }
            return false;
        };
        let Some(slot) = entry.active else {
            drop(m, DropReason::DupClient);
            return false;
        };
        let conn = &mut self.conns[slot];
        if conn.is_closed() {
            drop(m, DropReason::GoneDisconnected);
            return false;
        }
        // Mesh-forwarded packets never pause their link, nor does a
        // destination that stopped draining pause anyone.
        let may_pause = via != Via::Forward && !conn.is_not_draining();
        let (queued, frame_len) = conn
            .derp_mut()
            .queue_packet(src, packet, kind, &self.caps, may_pause);
        let mut pause = false;
        match queued {
            Queued::Dropped => {
                drop(m, DropReason::QueueTail);
                return false;
            }
            Queued::Yes => {}
            Queued::OverCap => {
                if !conn.is_waiting(&from) {
                    // A new hold's budget starts now, or half a budget
                    // before an earlier reading of the socket.
                    let half = self.shared.config.backpressure_budget / 2;
                    if conn.add_waiter(from, self.now, half) {
                        self.holders.push((slot, conn.gen()));
                    }
                    pause = true;
                }
            }
        }
        m.packets_sent.inc();
        m.bytes_sent.add(packet.len() as u64);
        conn.tally_mut().queued(packet.len());
        conn.gauge_queued(frame_len);
        m.queued_bytes.add(frame_len as i64);
        if conn.note_source(src) {
            let gen = conn.gen();
            self.receivers.entry(*src).or_default().push((slot, gen));
        }
        self.mark_dirty(slot);
        pause
    }

    pub(super) fn not_here(&mut self, to: ConnRef, dst: NodePublic) {
        let Some(slot) = self.live(to) else { return };
        let now = self.now;
        if self.conns[slot].take_not_here_token(now)
            && self.queue_control(slot, Origin::Own, |q| {
                frame::put_peer_gone(q, &dst, PeerGoneReason::NotHere)
            })
        {
            self.m.peer_gone_not_here_frames.inc();
        }
    }

    /// Reads everything shard `from` left for this one.
    pub(super) fn drain_from(&mut self, from: usize) {
        // Take the control messages visible now before reading packets:
        // every packet pushed before them is then visible too, so a KeyGone
        // is never applied ahead of a packet its key sent earlier.
        if let Some(rx) = self.rings.msg_rx[from].as_mut() {
            while let Some(mail) = rx.recv() {
                self.mail_batch.push(mail);
            }
        }
        let mut rx = self.rings.bytes_rx[from]
            .take()
            .expect("ring from another shard");
        // Read what is there now (every packet pushed before the mail
        // above included) and no more: a producer that refills the ring as
        // fast as this shard empties it must not keep it from its own
        // sockets. The rest waits for the next turn.
        let avail = rx.len();
        let backed_up = avail * 2 > rx.capacity();
        let mut scratch = std::mem::take(&mut self.ring_packet);
        rx.pop_until(avail, |a, b| {
            if b.is_empty() {
                self.on_ring_packet(from, a);
            } else {
                scratch.clear();
                scratch.extend_from_slice(a);
                scratch.extend_from_slice(b);
                self.on_ring_packet(from, &scratch);
            }
        });
        self.ring_packet = scratch;
        self.rings.bytes_rx[from] = Some(rx);
        if backed_up {
            // The producer may have paused senders on this ring.
            self.notify[from] = true;
        }
        let mut batch = std::mem::take(&mut self.mail_batch);
        for mail in batch.drain(..) {
            self.on_mail(mail);
        }
        self.mail_batch = batch;
    }

    pub(super) fn on_ring_packet(&mut self, from: usize, bytes: &[u8]) {
        let Some(RingPacket { header, packet }) = RingPacket::parse(bytes) else {
            debug_assert!(false, "malformed cross-shard ring packet");
            return;
        };
        let RingHeader {
            via,
            src,
            dst,
            slot,
            gen,
        } = header;
        // The sender lives on the shard whose ring this is.
        let sender = ConnRef {
            shard: from,
            slot: slot as usize,
            gen,
        };
        if self.deliver(via, &src, &dst, packet, sender) {
            self.mail(from, Mail::Pause(sender));
        }
    }

    pub(super) fn on_mail(&mut self, mail: Mail) {
        match mail {
            Mail::Migrate(conn) => self.migrate_in(conn),
            Mail::NotHere { to, dst } => self.not_here(to, dst),
            Mail::KeyGone(key) => self.key_gone(key),
            Mail::AddWatcher(w) => self.add_watcher(w),
            Mail::RemoveWatcher(w) => self.watchers.retain(|x| *x != w),
            Mail::Watch(w, ev) => self.watch_event(w, ev),
            Mail::ClosePeer(key) => self.close_peer(key),
            Mail::Pause(r) => {
                if let Some(slot) = self.live(r) {
                    self.pause_sender(slot);
                }
            }
            Mail::Resume(r) => self.resume_sender(r),
            Mail::Relay(m) => self.on_relay_mail(m),
            Mail::DebugClients(m) => self.on_debug_mail(*m),
            Mail::NotDraining { key, stuck } => {
                if stuck {
                    self.stuck_remote.insert(key);
                } else {
                    self.stuck_remote.remove(&key);
                }
            }
        }
    }

    pub(super) fn retry_stalled(&mut self) {
        let mut i = 0;
        while i < self.stalled.len() {
            let slot = self.stalled[i];
            let Some(conn) = self.conns.get_mut(slot) else {
                self.stalled.swap_remove(i);
                continue;
            };
            if conn.is_closed() {
                conn.clear_stall();
                conn.release(Hold::Ring);
                self.stalled.swap_remove(i);
                continue;
            }
            let Some((shard, packet)) = conn.stalled() else {
                self.stalled.swap_remove(i);
                continue;
            };
            let tx = self.rings.bytes_tx[shard].as_mut().expect("ring");
            if !tx.try_push(&[packet]) {
                i += 1;
                continue;
            }
            conn.clear_stall();
            self.notify[shard] = true;
            self.m.cross_shard_out.inc();
            self.stalled.swap_remove(i);
            self.release_input(slot, Hold::Ring);
        }
    }
}
