//! The endpoint's driver task: the one task that reads the UDP socket
//! (`recvmmsg`, GRO trains cut back into datagrams), takes the relays'
//! packets and events, runs the path manager's and the session manager's
//! timers, sends what they queue (probes, binds, allocations, STUN), and
//! hands each turn's payloads to the application as one [`Datagrams`].
//! Also the relays' reader and writer tasks, which stand between each DERP
//! client and the driver.
//!
//! A turn: wait for the socket, a relay report, a deadline or a wake-up;
//! handle it; hand the payloads over; send what was queued. Every input is
//! checked where it comes in (see the module doc of [`super`]): STUN only
//! from the relay asked, bind replies only from their session's relay,
//! probes only when they open with a peer's key, payloads only from a
//! peer's path.

use super::batch::gro_segments;
use super::events::EventKind;
use super::inner::{now, FromRelay, Inner, ToRelay};
use super::status::Reject;
use super::{Datagrams, PathAddr};
use crate::{DerpClient, DerpSender};
use ferry_proto::key::NodePublic;
use ferry_proto::peer_msg::{self, PeerMessage};
use ferry_proto::relay_session::RefuseReason;
use ferry_proto::stun;
use ferry_proto::udp_header::Header;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::Interest;
use tokio::sync::mpsc;

/// Receive slots per `recvmmsg`, and each slot's size: a whole GRO train
/// (or the largest datagram) fits one.
const RECV_SLOTS: usize = 32;
const RECV_SLOT: usize = 1 << 16;
/// `recvmmsg` calls per readable turn of the driver before its timers and
/// DERP get a turn.
const RECV_ROUNDS: usize = 4;
/// DERP packets and events taken per turn of the driver.
const DERP_ROUND: usize = 64;
/// Most datagrams one GRO slot may hold.
const MAX_GRO_SEGMENTS: usize = ferry_sys::gso::MAX_SEGMENTS;

/// The driver's `recvmmsg` space.
struct UdpReceiver {
    batch: ferry_sys::mmsg::RecvBatch,
    buf: Vec<u8>,
    meta: Vec<ferry_sys::mmsg::RecvMeta>,
}

impl UdpReceiver {
    fn new() -> UdpReceiver {
        UdpReceiver {
            batch: ferry_sys::mmsg::RecvBatch::new(),
            buf: vec![0; RECV_SLOTS * RECV_SLOT],
            meta: vec![ferry_sys::mmsg::RecvMeta::default(); RECV_SLOTS],
        }
    }
}

pub(super) struct Driver {
    inner: Arc<Inner>,
    /// Payloads received this turn, handed to the application at its end.
    filling: Datagrams,
    derp: mpsc::Receiver<(usize, FromRelay)>,
    /// STUN transaction ids in flight → the relay asked.
    stun_pending: HashMap<[u8; 12], usize>,
    stun_interval: Duration,
    /// Peers their DERP server reported gone, until heard from again.
    gone: HashSet<NodePublic>,
    /// Peers whose session the relay refused because it did not have
    /// them: `true` until heard from (then their session is asked for at
    /// once), `false` once that was done, until the next offer for them.
    /// Only peers are asked for: bounded by their number.
    not_there: HashMap<NodePublic, bool>,
    /// Keys not among the peers that sent over DERP, each reported once
    /// (at most [`UNKNOWN_SENDERS_REPORTED`]).
    unknown_senders: HashSet<NodePublic>,
}

/// How many distinct unknown DERP senders an endpoint reports as events;
/// later ones are only counted.
const UNKNOWN_SENDERS_REPORTED: usize = 64;

impl Driver {
    /// The driver of `inner`, taking the relays' reports from `derp`.
    pub(super) fn new(
        inner: Arc<Inner>,
        derp: mpsc::Receiver<(usize, FromRelay)>,
        stun_interval: Duration,
    ) -> Driver {
        Driver {
            inner,
            filling: Datagrams::new(),
            derp,
            stun_pending: HashMap::new(),
            stun_interval,
            gone: HashSet::new(),
            not_there: HashMap::new(),
            unknown_senders: HashSet::new(),
        }
    }

    /// Runs until the relays' readers are gone (the endpoint dropped).
    pub(super) async fn run(mut self) {
        let mut udp = UdpReceiver::new();
        let mut stun_at = tokio::time::Instant::now();
        loop {
            let paths = self.inner.lock_paths().poll_timeout();
            let sessions = self.inner.lock_sessions().poll_timeout();
            let deadline = [paths, sessions]
                .into_iter()
                .flatten()
                .min()
                .map(tokio::time::Instant::from_std);
            let inner = self.inner.clone();
            if self.room() < MAX_GRO_SEGMENTS {
                // A lagging application first takes what is queued (on a
                // single-threaded runtime it runs only when this yields),
                // so that what is read next is not dropped for want of room.
                tokio::task::yield_now().await;
            }
            tokio::select! {
                r = inner.socket.readable() => match r {
                    Ok(()) => self.drain_udp(&mut udp),
                    Err(e) => tracing::trace!(error = %e, "UDP socket error"),
                },
                d = self.derp.recv() => match d {
                    Some((relay, input)) => {
                        self.on_relay(relay, input);
                        // What else the readers queued, in this turn.
                        for _ in 1..DERP_ROUND {
                            let Ok((relay, input)) = self.derp.try_recv() else { break };
                            self.on_relay(relay, input);
                        }
                    }
                    None => return,
                },
                _ = sleep_until(deadline) => self.handle_timeout(),
                _ = tokio::time::sleep_until(stun_at) => {
                    stun_at += self.stun_interval;
                    self.send_stun();
                }
                _ = inner.wake.notified() => self.handle_timeout(),
            }
            self.hand_over();
            self.flush();
        }
    }

    /// Room in the application's queue, in datagrams.
    fn room(&self) -> usize {
        self.inner
            .queue_limit
            .saturating_sub(self.inner.queued.load(Ordering::Relaxed) + self.filling.len())
    }

    /// Reads what the UDP socket holds, a batch (`recvmmsg`) at a time, GRO
    /// trains cut back into datagrams at their segment size. Reads no more
    /// slots than the application's queue has room for if each were a
    /// full GRO train, except one in the first round, so probes go on
    /// while the application lags (its payloads are then dropped and
    /// counted); the rest waits in the kernel's buffer.
    fn drain_udp(&mut self, udp: &mut UdpReceiver) {
        let inner = self.inner.clone();
        let socket = &inner.socket;
        for round in 0..RECV_ROUNDS {
            let slots = (self.room() / MAX_GRO_SEGMENTS).min(RECV_SLOTS);
            let slots = if round == 0 { slots.max(1) } else { slots };
            if slots == 0 {
                return;
            }
            let r = socket.try_io(Interest::READABLE, || {
                udp.batch.recv(
                    socket.as_fd(),
                    &mut udp.buf,
                    RECV_SLOT,
                    &mut udp.meta[..slots],
                )
            });
            let n = match r {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // ICMP errors surface as failed reads on some systems.
                Err(e) => {
                    tracing::trace!(error = %e, "UDP receive error");
                    return;
                }
            };
            for (i, m) in udp.meta[..n].iter().enumerate() {
                let (Some(src), false) = (m.src, m.truncated) else {
                    self.inner.reject(Reject::Truncated);
                    continue;
                };
                let slot = &udp.buf[i * RECV_SLOT..i * RECV_SLOT + m.len];
                for datagram in gro_segments(slot, m.segment) {
                    self.on_udp(datagram, src);
                }
            }
            if n < slots {
                return;
            }
        }
    }

    /// Queues the payloads received this turn for the application, unless
    /// there were none.
    fn hand_over(&mut self) {
        if self.filling.is_empty() {
            return;
        }
        {
            let mut r = self.inner.received.lock().expect("not poisoned");
            // Counted under the lock the reader subtracts under.
            self.inner
                .queued
                .fetch_add(self.filling.len(), Ordering::Relaxed);
            self.inner
                .queued_bytes
                .fetch_add(self.filling.bytes().len(), Ordering::Relaxed);
            let next = r.spare.pop().unwrap_or_default();
            let full = std::mem::replace(&mut self.filling, next);
            r.batches.push_back(full);
        }
        self.inner.received_ready.notify_one();
    }

    /// A payload from `peer` on `path` for the application, or dropped
    /// and counted when the application lags by a full queue (in
    /// datagrams or bytes).
    fn deliver(&mut self, peer: &NodePublic, path: PathAddr, bytes: &[u8]) {
        let held = self.inner.queued_bytes.load(Ordering::Relaxed) + self.filling.bytes().len();
        if self.inner.queued.load(Ordering::Relaxed) + self.filling.len() >= self.inner.queue_limit
            || held + ferry_proto::udp_header::LEN + bytes.len() > self.inner.queue_bytes_limit
        {
            self.inner.recv_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.filling.push_from(peer, Some(path), bytes);
    }

    fn handle_timeout(&mut self) {
        let now = now();
        self.inner.lock_paths().handle_timeout(now);
        let mut sessions = self.inner.lock_sessions();
        sessions.handle_timeout(now);
        for peer in sessions.bound() {
            let state = self.inner.lock_paths().relay_state(&peer);
            sessions.check_path(now, &peer, state);
        }
    }

    /// Sends what the session manager and the path manager queued, and
    /// publishes the path events.
    fn flush(&mut self) {
        let now = now();
        loop {
            let mut sessions = self.inner.lock_sessions();
            let allocate = sessions.poll_allocate(now);
            let bind = sessions.poll_transmit(now);
            let change = sessions.poll_change();
            drop(sessions);
            if allocate.is_none() && bind.is_none() && change.is_none() {
                break;
            }
            if let Some(peer) = allocate {
                let sent = self
                    .inner
                    .session_relay_of(&peer)
                    .map(|r| r.out.try_send(ToRelay::Allocate(peer)).is_ok());
                if sent != Some(true) {
                    self.inner.lock_sessions().lost(now, &peer);
                }
            }
            if let Some((addr, msg)) = bind {
                // A lost bind message is retransmitted by the binder.
                let _ = self.inner.send_udp(&msg, addr);
            }
            if let Some((peer, path)) = change {
                self.inner.lock_paths().set_relay(now, &peer, path);
            }
        }
        loop {
            let (transmit, event) = {
                let mut paths = self.inner.lock_paths();
                (paths.poll_transmit(), paths.poll_event())
            };
            if transmit.is_none() && event.is_none() {
                return;
            }
            if let Some(t) = transmit {
                self.inner.send_probe(&t);
            }
            if let Some(e) = event {
                self.inner.events.publish_at(e.at, EventKind::Path(e));
            }
        }
    }

    fn send_stun(&mut self) {
        self.stun_pending.clear();
        for (i, r) in self.inner.relays.iter().enumerate() {
            let Some(server) = r.stun else { continue };
            let txid: [u8; 12] = rand::random();
            self.stun_pending.insert(txid, i);
            let _ = self.inner.send_udp(&stun::binding_request(&txid), server);
        }
    }

    fn on_udp(&mut self, datagram: &[u8], src: SocketAddr) {
        let src = ferry_proto::frame::canonical_addr(src);
        if is_stun_response(datagram) {
            self.on_stun(datagram, src);
            return;
        }
        if Header::parse(datagram).is_ok_and(|h| h.control) {
            // Bind messages from a relay's session socket.
            if !self
                .inner
                .lock_sessions()
                .handle_datagram(now(), src, datagram)
            {
                self.inner.reject(Reject::StrayBind);
            }
            return;
        }
        let Ok((header, msg)) = peer_msg::parse(datagram) else {
            self.inner.reject(Reject::Malformed);
            return;
        };
        let path = match header.vni {
            0 => PathAddr::Direct(src),
            vni => PathAddr::RelaySession { vni, addr: src },
        };
        self.on_message(path, None, msg);
    }

    fn on_relay(&mut self, relay: usize, input: FromRelay) {
        match input {
            FromRelay::Packet(src, data) => match peer_msg::parse(&data) {
                Ok((header, msg)) if header.vni == 0 => {
                    self.on_message(PathAddr::Derp, Some(src), msg)
                }
                _ => self.inner.reject(Reject::Malformed),
            },
            FromRelay::Offer(offer) => {
                self.not_there.remove(&offer.peer);
                let Some(addr) = self.inner.relays[relay].sender.relay_endpoint(&offer) else {
                    return;
                };
                self.inner.lock_sessions().handle_offer(now(), &offer, addr);
            }
            FromRelay::Refused(peer, reason) => {
                self.inner.lock_sessions().handle_refused(now(), &peer);
                // Both links of a pair often start together: each may ask
                // before its relay (or its region's other node) knows the
                // other. The peer's first word says it is there now: ask
                // again then, once (until an offer comes), not after the
                // retry wait.
                if reason == RefuseReason::PeerNotHere {
                    self.not_there.entry(peer).or_insert(true);
                }
            }
            FromRelay::End(peer, vni, draining) => {
                self.inner
                    .lock_sessions()
                    .ended(now(), &peer, vni, draining)
            }
            FromRelay::Up(node) => self.on_relay_up(relay, node),
            FromRelay::Down { error, retry_in } => self.on_relay_down(relay, error, retry_in),
            FromRelay::Gone(peer, reason) => {
                let ours = self.inner.relay_index_of(&peer) == Some(relay);
                if ours && self.gone.insert(peer) {
                    tracing::info!(peer = %peer.short(), relay = %self.inner.relays[relay].name, ?reason, "peer gone from its relay");
                    self.inner.publish(EventKind::PeerGone { peer, reason });
                }
            }
            FromRelay::Present(peer) => self.heard_from(&peer),
        }
    }

    fn on_relay_up(&mut self, relay: usize, node: usize) {
        let r = &self.inner.relays[relay];
        {
            let mut h = r.health.lock().expect("not poisoned");
            h.connected = true;
            h.node = Some(node);
            h.connects += 1;
            h.last_error = None;
            h.next_attempt = None;
        }
        let relay_port = r.sender.relay_port();
        tracing::info!(relay = %r.name, url = %r.urls[node], stun = ?r.stun, ?relay_port, "relay connected");
        self.inner.publish(EventKind::RelayUp { relay, relay_port });
        // Its sessions offer may have changed (or come for the first time):
        // the peers whose sessions are asked of it.
        let peers: Vec<NodePublic> = self
            .inner
            .peers
            .read()
            .expect("not poisoned")
            .iter()
            .filter(|(k, p)| self.inner.session_relay(k, p.relay) == relay)
            .map(|(k, _)| *k)
            .collect();
        for peer in &peers {
            self.inner.update_sessions(peer);
            self.inner.lock_sessions().reset(now(), peer);
        }
    }

    fn on_relay_down(&mut self, relay: usize, error: String, retry_in: Duration) {
        let r = &self.inner.relays[relay];
        let (was_up, node) = {
            let mut h = r.health.lock().expect("not poisoned");
            h.failures += 1;
            h.last_error = Some(error.clone());
            h.next_attempt = Some(now() + retry_in);
            (std::mem::replace(&mut h.connected, false), h.node.take())
        };
        let next = format!("{:.1} s", retry_in.as_secs_f64());
        if was_up {
            tracing::warn!(relay = %r.name, url = %r.urls[node.unwrap_or(0)], %error, retry_in = ?retry_in, "relay connection lost; reconnecting in {next}");
        } else {
            tracing::warn!(relay = %r.name, url = %r.urls[0], %error, retry_in = ?retry_in, "relay unreachable; retrying in {next}");
        }
        self.inner.publish(EventKind::RelayDown {
            relay,
            error,
            retry_in,
            was_up,
        });
    }

    /// `peer` is there (its server said so, or an authenticated message
    /// from it arrived): if it was gone, it is back, and its session is
    /// sought again without waiting.
    fn heard_from(&mut self, peer: &NodePublic) {
        let waiting = self.not_there.get_mut(peer);
        if let Some(w @ true) = waiting {
            *w = false;
            tracing::debug!(peer = %peer.short(), "heard from a peer its relay did not have: asking for its session again");
            self.inner.lock_sessions().reset(now(), peer);
        }
        if self.gone.remove(peer) {
            tracing::info!(peer = %peer.short(), "peer back");
            self.inner.lock_sessions().reset(now(), peer);
            self.inner.publish(EventKind::PeerPresent { peer: *peer });
        }
    }

    /// `key`, which is no peer, sent over DERP (so the server vouches for
    /// the key): reported the first time, counted by the caller always.
    fn unknown_sender(&mut self, key: NodePublic) {
        if self.unknown_senders.len() < UNKNOWN_SENDERS_REPORTED && self.unknown_senders.insert(key)
        {
            self.inner.publish(EventKind::UnknownSender { key });
        }
    }

    /// A peer message on `path`; `derp_src` is the DERP-authenticated
    /// sender of a DERP packet.
    fn on_message(&mut self, path: PathAddr, derp_src: Option<NodePublic>, msg: PeerMessage<'_>) {
        match msg {
            PeerMessage::Payload(bytes) => {
                let peer = {
                    let mut paths = self.inner.lock_paths();
                    let peer = match derp_src {
                        Some(src) => paths.is_peer(&src).then_some(src),
                        None => paths.owner(&path),
                    };
                    if let Some(p) = &peer {
                        paths.on_receive(p, &path, bytes.len());
                    }
                    peer
                };
                let Some(peer) = peer else {
                    self.inner.reject(Reject::UnknownSource);
                    if let Some(src) = derp_src {
                        self.unknown_sender(src);
                    }
                    return;
                };
                self.heard_from(&peer);
                self.deliver(&peer, path, bytes);
            }
            PeerMessage::Probe { sender, sealed } => {
                if derp_src.is_some_and(|s| s != sender) {
                    self.inner.reject(Reject::BadProbe);
                    return;
                }
                let key = self
                    .inner
                    .peers
                    .read()
                    .expect("not poisoned")
                    .get(&sender)
                    .map(|p| p.key.clone());
                let known = key.is_some();
                let Some(probe) = key.and_then(|k| peer_msg::open_probe(&k, sealed).ok()) else {
                    self.inner.reject(Reject::BadProbe);
                    if let (false, Some(src)) = (known, derp_src) {
                        self.unknown_sender(src);
                    }
                    return;
                };
                self.heard_from(&sender);
                self.inner
                    .lock_paths()
                    .handle_probe(now(), &sender, path, probe);
            }
        }
    }

    fn on_stun(&mut self, datagram: &[u8], src: SocketAddr) {
        let Ok((txid, public)) = stun::parse_binding_response(datagram) else {
            self.inner.reject(Reject::StrayStun);
            return;
        };
        let Some(i) = self.stun_pending.remove(&txid) else {
            self.inner.reject(Reject::StrayStun);
            return;
        };
        let relay = &self.inner.relays[i];
        if relay.stun.map(ferry_proto::frame::canonical_addr) != Some(src) {
            self.inner.reject(Reject::StrayStun);
            return;
        }
        let changed = relay
            .public_addr
            .lock()
            .expect("not poisoned")
            .replace(public)
            != Some(public);
        if changed {
            tracing::info!(relay = %relay.name, %public, "this side's address as the relay's STUN server sees it");
            self.inner.update_candidates();
            self.inner.publish(EventKind::PublicAddr {
                relay: i,
                addr: public,
            });
        }
    }
}

impl Drop for Driver {
    /// [`Endpoint::recv`] returns what is queued, then that the endpoint
    /// is closed.
    fn drop(&mut self) {
        if let Ok(mut r) = self.inner.received.lock() {
            if !self.filling.is_empty() {
                self.inner
                    .queued
                    .fetch_add(self.filling.len(), Ordering::Relaxed);
                self.inner
                    .queued_bytes
                    .fetch_add(self.filling.bytes().len(), Ordering::Relaxed);
                r.batches.push_back(std::mem::take(&mut self.filling));
            }
            r.closed = true;
        }
        self.inner.received_ready.notify_one();
    }
}

/// A STUN binding success response opens with type 0x0101 and the magic
/// cookie; no peer message can (its byte 0 is 0).
fn is_stun_response(d: &[u8]) -> bool {
    d.len() >= stun::HEADER_LEN
        && d[..2] == stun::BINDING_SUCCESS.to_be_bytes()
        && d[4..8] == stun::MAGIC_COOKIE
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Sends the queued DERP packets and allocations of one relay.
/// A packet the DERP client refuses (not connected: DERP holds nothing
/// for a connection that does not exist) counts as dropped by `send`.
pub(super) async fn derp_writer(
    sender: DerpSender,
    mut out: mpsc::Receiver<ToRelay>,
    dropped: Arc<AtomicU64>,
) {
    while let Some(item) = out.recv().await {
        match item {
            ToRelay::Packet(dst, data) => {
                if let Err(e) = sender.send(&dst, data).await {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::trace!(error = %e, "DERP send dropped");
                }
            }
            // Unanswered, the session manager asks again.
            ToRelay::Allocate(peer) => {
                if let Err(e) = sender.allocate(&peer).await {
                    tracing::trace!(error = %e, "relay allocation not sent");
                }
            }
        }
    }
}

/// Hands one relay's packets, session answers, connection changes and
/// peer presence to the driver.
pub(super) async fn derp_reader(
    relay: usize,
    mut client: DerpClient,
    to_driver: mpsc::Sender<(usize, FromRelay)>,
) {
    while let Ok(event) = client.recv().await {
        let input = match event {
            crate::Event::Packet { src, data } => FromRelay::Packet(src, data),
            crate::Event::RelaySession(offer) => FromRelay::Offer(offer),
            crate::Event::RelayRefused { peer, reason, .. } => FromRelay::Refused(peer, reason),
            crate::Event::RelaySessionEnd {
                peer,
                vni,
                draining,
            } => FromRelay::End(peer, vni, draining),
            crate::Event::Connected { target, .. } => FromRelay::Up(target),
            crate::Event::Disconnected { error, retry_in } => FromRelay::Down {
                error: error.to_string(),
                retry_in,
            },
            crate::Event::PeerGone { peer, reason } => FromRelay::Gone(peer, reason),
            crate::Event::PeerPresent { peer, .. } => FromRelay::Present(peer),
            _ => continue,
        };
        if to_driver.send((relay, input)).await.is_err() {
            return;
        }
    }
}
