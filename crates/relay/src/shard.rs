//! The DERP shard: one thread's connections, routing and timers.
//!
//! # Who owns a key
//!
//! Every client key has one owner shard, `hash(key) % shards`, with a hash
//! seeded randomly at start-up so clients cannot aim at one shard. A
//! connection is accepted by whichever shard the kernel's `SO_REUSEPORT`
//! picks, runs its TLS, HTTP and DERP handshakes there, and as soon as its
//! key is known moves (socket, TLS state, buffered bytes and all) to the
//! owner shard, where it registers. So all connections of one key live on
//! one shard: the duplicate-connection policy and the per-key tables are
//! local, and routing a packet needs no shared table — the sender's shard
//! computes the destination's owner and either delivers locally or copies
//! the packet into the byte ring to that shard.
//!
//! # One packet
//!
//! `Received` bytes go through TLS (if any) into the connection's deframer,
//! which hands out whole frames, in place when they lie whole in the read
//! buffer. A `sendPacket` to a local key becomes a `recvPacket` frame
//! appended to the destination's queue; to a remote key, a record in the
//! ring to its owner, read there in place and appended the same way. After
//! the turn, every connection with queued output gets one send.
//!
//! # Bounded everything
//!
//! Client queues have byte and packet caps (drops are counted with derper's
//! reasons); a full cross-shard ring pauses the sending connection until
//! the ring drains (its socket stops being read, so TCP pushes back); a
//! client that does not read for the write timeout is cut off; a
//! connection that has not finished its handshake by its deadline is
//! closed. None of it waits on another connection.
//!
//! # Backpressure has a budget
//!
//! A destination over its queue cap pauses the senders feeding it, so a
//! relay or a reader that is merely slower than its senders slows them
//! through TCP instead of dropping. But a tailscaled node sends everything
//! it relays over one connection: a destination that does not read at all
//! must not hold that connection's traffic to everyone else. So a
//! destination may hold senders only while its socket keeps taking bytes.
//! Half the budget (`backpressure_budget`) into a hold, the shard notes the
//! socket's acknowledged-bytes count (TCP's `bytes_acked`, which moves when
//! the peer reads, however slowly); at the full budget, a count that has not
//! moved marks the destination `not_draining`: its senders are released at
//! once and its queue drops its own new packets over the cap
//! (`queue_tail`) until a write to it completes. A count that moved starts
//! the next half-budget window. The write timeout still cuts off a
//! destination that never reads. The check runs every turn but reads the
//! socket only for holds that last half a budget, which a busy relay whose
//! readers read never reaches (every flush releases the holds). Cross-shard
//! rings need no rule of their own: a shard empties its incoming rings
//! every turn whatever its clients do, so a ring is only ever full while
//! its consumer's core is busy; mesh-forwarded packets never pause their
//! link (they are dropped over the cap instead).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferry_engine::mailbox::{ByteRx, ByteTx, Doorbell, MsgRx, MsgTx};
use ferry_engine::{Completion, Driver, Handler, Slot};
use ferry_proto::frame::{self, ClientFrame, PeerGoneReason, ServerFramePolicy};
use ferry_proto::handshake::{self, HandshakeError, ServerInfo};
use ferry_proto::key::NodePublic;
use ferry_proto::{http, nacl};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use slab::Slab;

use crate::config::{ListenerKind, RelayConfig};
use crate::conn::{Conn, Phase};
use crate::front::{self, Answer};
use crate::metrics::{
    CloseReason, DropReason, HandshakeFailure, Metrics, PacketKind, ShardMetrics,
};

/// How often deadlines, keepalives and write timeouts are checked.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Starting capacity of a shard's per-turn work lists (slots to flush,
/// stalled senders, pending operations, outgoing mail).
const WORK_LIST_START: usize = 256;
/// How long a shard with paused senders waits before retrying its rings.
const STALL_RETRY: Duration = Duration::from_millis(1);
/// Largest HTTP request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// Bytes of plaintext pulled from TLS at a time.
const PLAIN_CHUNK: usize = 64 * 1024;
/// Jitter added to the keepalive interval, chosen once per connection.
const KEEPALIVE_JITTER_MS: u64 = 5_000;
/// Send buffers larger than this are released when a connection goes idle.
const IDLE_BUFFER_KEEP: usize = 64 * 1024;
/// How long a connection being closed for a protocol violation may take to
/// receive what was queued for it.
const FINISH_GRACE: Duration = Duration::from_secs(2);
/// Capacity a data queue gets when it first carries data.
const QUEUE_START: usize = 64 * 1024;
/// How long a TLS connection keeps trying to move into kernel TLS (it can
/// only move between records, with nothing buffered).
const KTLS_TRY_FOR: Duration = Duration::from_secs(5);
/// Messages per cross-shard control ring.
pub const MSG_RING: usize = 4096;

/// Bytes in front of a packet in a cross-shard record.
const RECORD_HEADER: usize = 1 + 32 + 32 + 4 + 4;
const RECORD_SEND: u8 = 0;
const RECORD_FORWARD: u8 = 1;

/// A reference to a connection on some shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRef {
    /// Shard id.
    pub shard: usize,
    /// Slot on that shard.
    pub slot: Slot,
    /// Generation of the connection in that slot.
    pub gen: u32,
}

/// A presence change for a watcher.
#[derive(Clone, Copy, Debug)]
pub enum WatchEvent {
    /// A connection of `key` registered.
    Present {
        /// The key.
        key: NodePublic,
        /// Its remote address.
        addr: SocketAddr,
        /// peerPresent flags.
        flags: u8,
    },
    /// The last connection of `key` left.
    Gone(NodePublic),
}

/// Control messages between shards.
pub enum Mail {
    /// A connection whose handshake finished elsewhere; register it here.
    Migrate(Box<Conn>),
    /// A disco packet from this connection had an unknown destination.
    NotHere {
        /// The sending connection.
        to: ConnRef,
        /// The unknown destination.
        dst: NodePublic,
    },
    /// The last connection of a key left the server.
    KeyGone(NodePublic),
    /// Subscribe a watcher to this shard's connections.
    AddWatcher(ConnRef),
    /// Unsubscribe a watcher.
    RemoveWatcher(ConnRef),
    /// Deliver a presence change to a watcher on this shard.
    Watch(ConnRef, WatchEvent),
    /// Close every connection of this key (closePeer from a mesh peer).
    ClosePeer(NodePublic),
    /// Stop reading this sender: a destination it feeds is backed up.
    Pause(ConnRef),
    /// The destination drained (or left): the sender may read again.
    Resume(ConnRef),
}

/// What all shards share, read-only.
pub struct Shared {
    /// Settings.
    pub config: Arc<RelayConfig>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// One per shard; filled once every shard's driver exists.
    pub doorbells: OnceLock<Vec<Arc<Doorbell>>>,
    /// Key-to-shard hash, seeded randomly.
    pub hasher: RandomState,
    /// Set to start a graceful shutdown.
    pub shutdown: AtomicBool,
    /// What each listener index serves (same order on every shard).
    pub listener_kinds: Vec<ListenerKind>,
}

impl Shared {
    /// The shard that owns `key`.
    pub fn owner_of(&self, key: &NodePublic, shards: usize) -> usize {
        if shards == 1 {
            0
        } else {
            (self.hasher.hash_one(key.as_bytes()) % shards as u64) as usize
        }
    }
}

/// The rings of one shard: to (`tx`) and from (`rx`) every other shard,
/// indexed by shard id (`None` at its own index).
pub struct Rings {
    /// Packet records to each shard.
    pub bytes_tx: Vec<Option<ByteTx>>,
    /// Packet records from each shard.
    pub bytes_rx: Vec<Option<ByteRx>>,
    /// Control messages to each shard.
    pub msg_tx: Vec<Option<MsgTx<Mail>>>,
    /// Control messages from each shard.
    pub msg_rx: Vec<Option<MsgRx<Mail>>>,
}

#[derive(Default)]
struct KeyEntry {
    conns: Vec<Slot>,
    active: Option<Slot>,
}

enum Op {
    Attach(Slot, TcpStream),
    SetRecv(Slot, bool),
    /// Read this socket in kernel-TLS mode (after a move between shards).
    KtlsRx(Slot),
}

/// Log lines per second per shard about misbehaving clients, beyond which
/// they are counted but not printed.
const LOG_BURST: u32 = 20;

struct LogLimiter {
    window: Instant,
    lines: u32,
    suppressed: u64,
}

impl LogLimiter {
    fn allow(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            if self.suppressed > 0 {
                tracing::info!(
                    suppressed = self.suppressed,
                    "connection log lines suppressed in the last second"
                );
            }
            self.window = now;
            self.lines = 0;
            self.suppressed = 0;
        }
        self.lines += 1;
        if self.lines > LOG_BURST {
            self.suppressed += 1;
            false
        } else {
            true
        }
    }
}

/// One shard's state; implements the engine's [`Handler`].
pub struct Shard {
    id: usize,
    shards: usize,
    shared: Arc<Shared>,
    conns: Slab<Conn>,
    next_gen: u32,
    keys: HashMap<NodePublic, KeyEntry>,
    /// Local connections that received from a key, for peerGone.
    receivers: HashMap<NodePublic, Vec<(Slot, u32)>>,
    watchers: Vec<ConnRef>,
    rings: Rings,
    notify: Vec<bool>,
    ops: Vec<Op>,
    dirty: Vec<Slot>,
    dirty_spare: Vec<Slot>,
    closing: Vec<Slot>,
    migrating: Vec<Slot>,
    /// TLS connections that may move into kernel TLS, with a deadline.
    ktls_candidates: Vec<(Slot, u32, Instant)>,
    /// Connections with control records to handle after the turn.
    record_slots: Vec<Slot>,
    stalled: Vec<Slot>,
    /// Destinations holding paused senders, watched against the
    /// backpressure budget.
    holders: Vec<(Slot, u32)>,
    plain: Box<[u8]>,
    plain_out: Vec<u8>,
    record: Vec<u8>,
    mail_batch: Vec<Mail>,
    activity: u64,
    /// Keepalive jitter (seeded by the caller, so tests can fix it).
    jitter: StdRng,
    now: Instant,
    next_sweep: Instant,
    draining: Option<Instant>,
    done: bool,
    /// Queue size past which even paused-sender overshoot is dropped.
    hard_cap: usize,
    log: LogLimiter,
}

macro_rules! conn_log {
    ($shard:expr, $lvl:ident, $($arg:tt)*) => {
        if $shard.log.allow($shard.now) {
            tracing::$lvl!($($arg)*);
        }
    };
}

impl Shard {
    /// A shard with its id, the shared state and its rings, created at
    /// `now`. `seed` seeds its keepalive jitter.
    pub fn new(
        id: usize,
        shards: usize,
        shared: Arc<Shared>,
        rings: Rings,
        now: Instant,
        seed: u64,
    ) -> Self {
        let cfg = &shared.config;
        // Per other shard: a full ring plus one turn of reads.
        let per_shard =
            cfg.ring_bytes + ferry_engine::epoll::READ_CHUNK * ferry_engine::epoll::READ_BUDGET;
        let hard_cap = cfg.send_queue_bytes + (shards - 1) * per_shard + frame::MAX_PACKET_SIZE;
        Shard {
            id,
            shards,
            shared,
            conns: Slab::new(),
            next_gen: 0,
            keys: HashMap::new(),
            receivers: HashMap::new(),
            watchers: Vec::new(),
            rings,
            notify: vec![false; shards],
            // The per-turn work lists start at a working size, so that the
            // first turn needing one (a ring stall, say, which depends on
            // scheduling) does not allocate in the middle of forwarding.
            ops: Vec::with_capacity(WORK_LIST_START),
            dirty: Vec::with_capacity(WORK_LIST_START),
            dirty_spare: Vec::with_capacity(WORK_LIST_START),
            closing: Vec::with_capacity(WORK_LIST_START),
            migrating: Vec::with_capacity(WORK_LIST_START),
            ktls_candidates: Vec::new(),
            record_slots: Vec::with_capacity(WORK_LIST_START),
            stalled: Vec::with_capacity(WORK_LIST_START),
            holders: Vec::with_capacity(WORK_LIST_START),
            plain: vec![0u8; PLAIN_CHUNK].into_boxed_slice(),
            plain_out: Vec::new(),
            record: Vec::with_capacity(RECORD_HEADER + frame::MAX_PACKET_SIZE),
            mail_batch: Vec::with_capacity(WORK_LIST_START),
            activity: 0,
            jitter: StdRng::seed_from_u64(seed),
            now,
            next_sweep: now + SWEEP_EVERY,
            draining: None,
            done: false,
            hard_cap,
            log: LogLimiter {
                window: now,
                lines: 0,
                suppressed: 0,
            },
        }
    }

    fn m(&self) -> &ShardMetrics {
        &self.shared.metrics.shards[self.id]
    }

    fn cfg(&self) -> &RelayConfig {
        &self.shared.config
    }

    fn conn_ref(&self, slot: Slot) -> ConnRef {
        ConnRef {
            shard: self.id,
            slot,
            gen: self.conns[slot].gen,
        }
    }

    fn live(&self, r: ConnRef) -> Option<Slot> {
        match self.conns.get(r.slot) {
            Some(c) if c.gen == r.gen && c.closing.is_none() => Some(r.slot),
            _ => None,
        }
    }

    fn mark_dirty(&mut self, slot: Slot) {
        let c = &mut self.conns[slot];
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }

    fn mail(&mut self, shard: usize, mail: Mail) {
        if let Some(tx) = self.rings.msg_tx[shard].as_mut() {
            tx.send(mail);
            self.notify[shard] = true;
        }
    }

    // ----- accepting and closing -----

    fn accept(&mut self, listener: usize, stream: TcpStream, peer: SocketAddr) {
        let m = self.m();
        m.tcp_accepts.inc();
        if self.draining.is_some() {
            return; // dropping the stream closes it
        }
        let sock = socket2::SockRef::from(&stream);
        let _ = sock.set_nodelay(true);
        if let Some(idle) = self.cfg().tcp_keepalive {
            let _ = sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(idle));
        }
        if let Some(t) = self.cfg().tcp_user_timeout {
            let _ = sock.set_tcp_user_timeout(Some(t));
        }
        let kind = self
            .shared
            .listener_kinds
            .get(listener)
            .copied()
            .unwrap_or(ListenerKind::Derp);
        let deadline = self.now + self.cfg().handshake_timeout;
        self.next_gen = self.next_gen.wrapping_add(1);
        let mut conn = Conn::new(self.next_gen, peer, kind, self.now, deadline);
        if kind == ListenerKind::Derp {
            if let Some(tls) = &self.shared.config.tls {
                match rustls::ServerConnection::new(tls.clone()) {
                    Ok(mut t) => {
                        t.set_buffer_limit(None);
                        conn.tls = Some(Box::new(t));
                        if self.shared.config.ktls {
                            conn.ktls_boundary = Some(crate::ktls::RecordBoundary::new());
                        }
                        self.m().tls_sockets.add(1);
                    }
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "could not start TLS");
                        return;
                    }
                }
            }
        }
        self.m().open_sockets.add(1);
        let slot = self.conns.insert(conn);
        self.ops.push(Op::Attach(slot, stream));
    }

    /// Ends a connection now: it leaves every table at once, and its socket
    /// is released after the turn.
    fn close(&mut self, slot: Slot, reason: CloseReason) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.closing.is_some() {
            return;
        }
        conn.closing = Some(reason);
        let phase = conn.phase;
        let (disco_n, data_n) = (conn.disco_n, conn.data_n);
        let queued = conn.regauge();
        let bp_paused = std::mem::take(&mut conn.bp_paused);
        self.closing.push(slot);
        let m = &self.shared.metrics.shards[self.id];
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
    fn finish(&mut self, slot: Slot, reason: CloseReason) {
        let now = self.now;
        let conn = &mut self.conns[slot];
        if conn.closing.is_some() || conn.close_after_flush.is_some() {
            return;
        }
        if !conn.has_output() && conn.in_flight.is_none() {
            self.close(slot, reason);
            return;
        }
        let was_active = conn.phase == Phase::Active;
        conn.phase = Phase::Responding;
        conn.close_after_flush = Some(reason);
        conn.deadline = now + FINISH_GRACE;
        conn.paused = true;
        self.ops.push(Op::SetRecv(slot, false));
        if was_active {
            self.unregister(slot);
        }
        self.mark_dirty(slot);
    }

    /// Whether the connection is closed or on its way out.
    fn ended(&self, slot: Slot) -> bool {
        let conn = &self.conns[slot];
        conn.closing.is_some() || conn.close_after_flush.is_some()
    }

    fn fail_handshake(
        &mut self,
        slot: Slot,
        why: HandshakeFailure,
        detail: &dyn std::fmt::Display,
    ) {
        self.m().handshake_failures[why as usize].inc();
        let peer = self.conns[slot].peer;
        conn_log!(self, info, %peer, reason = why.label(), %detail, "handshake failed; closing connection");
        self.close(slot, CloseReason::Handshake);
    }

    // ----- input -----

    fn on_received(&mut self, slot: Slot, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.closing.is_some() {
            return;
        }
        if conn.paused || !conn.stash.is_empty() {
            conn.stash.extend_from_slice(data);
            return;
        }
        self.ingest(slot, data);
    }

    /// Feeds raw socket bytes through TLS (if any) into the protocol.
    /// Bytes not consumed because input paused are stashed.
    fn ingest(&mut self, slot: Slot, data: &[u8]) {
        let Some(mut tls) = self.conns[slot].tls.take() else {
            // Without TLS, whatever is not consumed is kept by the phase
            // that stopped (deframer or stash).
            let _ = self.process_plain(slot, data);
            return;
        };
        let mut rest = data;
        let mut ok = true;
        'feed: loop {
            if !self.drain_tls(slot, &mut tls) {
                break 'feed;
            }
            if rest.is_empty() {
                break;
            }
            let before = rest;
            match tls.read_tls(&mut rest) {
                Ok(n) => {
                    if let Some(b) = self.conns[slot].ktls_boundary.as_mut() {
                        b.feed(&before[..n]);
                    }
                }
                Err(e) => {
                    ok = false;
                    self.tls_failed(slot, &e);
                    break;
                }
            }
            if let Err(e) = tls.process_new_packets() {
                // Let rustls send its alert, then close.
                ok = false;
                let _ = tls.write_tls(&mut self.conns[slot].ctrl);
                self.tls_failed(slot, &e);
                break;
            }
        }
        let conn = &mut self.conns[slot];
        if ok && !rest.is_empty() && conn.closing.is_none() {
            conn.stash.extend_from_slice(rest);
        }
        let wants_write = tls.wants_write();
        let handshaken = !tls.is_handshaking();
        conn.tls = Some(tls);
        if wants_write {
            self.mark_dirty(slot);
        }
        let conn = &self.conns[slot];
        if handshaken && conn.ktls_boundary.is_some() && conn.closing.is_none() {
            let gen = conn.gen;
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

    fn tls_failed(&mut self, slot: Slot, e: &dyn std::fmt::Display) {
        if self.conns[slot].phase == Phase::Active {
            let peer = self.conns[slot].peer;
            conn_log!(self, info, %peer, error = %e, "TLS error; closing connection");
            self.close(slot, CloseReason::IoError);
        } else {
            self.fail_handshake(slot, HandshakeFailure::Tls, e);
        }
    }

    /// Moves decrypted bytes from TLS into the protocol. Returns `false`
    /// when input paused or the connection closed.
    fn drain_tls(&mut self, slot: Slot, tls: &mut rustls::ServerConnection) -> bool {
        let mut plain = std::mem::take(&mut self.plain);
        let mut go_on = true;
        loop {
            let conn = &self.conns[slot];
            if conn.closing.is_some() || conn.paused {
                go_on = false;
                break;
            }
            match tls.reader().read(&mut plain) {
                Ok(0) => {
                    // close_notify: an orderly end.
                    self.on_eof(slot);
                    go_on = false;
                    break;
                }
                Ok(n) => {
                    if self.process_plain(slot, &plain[..n]).is_break() {
                        go_on = false;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.tls_failed(slot, &e);
                    go_on = false;
                    break;
                }
            }
        }
        self.plain = plain;
        go_on
    }

    /// Feeds decrypted bytes to the connection's current phase. Breaks when
    /// input paused or the connection closed; unconsumed bytes are kept by
    /// the connection (deframer or stash).
    fn process_plain(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        match self.conns[slot].phase {
            Phase::Http => self.read_head(slot, data),
            Phase::ClientInfo | Phase::Active => self.deframe(slot, data),
            Phase::Migrating => {
                self.conns[slot].stash.extend_from_slice(data);
                ControlFlow::Break(())
            }
            Phase::Responding => ControlFlow::Continue(()),
        }
    }

    fn read_head(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        let conn = &mut self.conns[slot];
        conn.head.extend_from_slice(data);
        let req = match http::parse_request(&conn.head) {
            Ok(Some(req)) => req,
            Ok(None) if conn.head.len() < MAX_HEAD => return ControlFlow::Continue(()),
            Ok(None) | Err(http::HttpError::TooLarge { .. }) => {
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
                self.m().handshake_failures[HandshakeFailure::HttpMalformed as usize].inc();
                let peer = self.conns[slot].peer;
                conn_log!(self, info, %peer, error = %detail, "malformed HTTP request");
                self.respond(
                    slot,
                    http::response(400, "Bad Request", &[], b"bad request\n"),
                );
                return ControlFlow::Break(());
            }
        };
        let head = std::mem::take(&mut conn.head);
        let peer = conn.peer;
        let kind = conn.listener;
        match front::answer(&self.shared.config, &self.shared.metrics, kind, &peer, &req) {
            Answer::Respond(route, bytes) => {
                self.m().http_requests[route as usize].inc();
                self.respond(slot, bytes);
                ControlFlow::Break(())
            }
            Answer::Upgrade { fast_start } => {
                let m = self.m();
                m.http_requests[crate::metrics::Route::Derp as usize].inc();
                m.accepts.inc();
                if fast_start {
                    m.fast_starts.inc();
                }
                let public = self.cfg().public_key;
                let deadline = self.now + self.cfg().handshake_timeout;
                let conn = &mut self.conns[slot];
                if !fast_start {
                    conn.ctrl
                        .extend_from_slice(&http::switching_protocols(&public));
                }
                conn.ctrl
                    .extend_from_slice(&handshake::server_key_frame(&public));
                conn.not_ideal = req.ideal_node.as_deref().is_some_and(|n| !n.is_empty());
                conn.phase = Phase::ClientInfo;
                conn.deadline = deadline;
                self.mark_dirty(slot);
                let rest = head.get(req.head_len..).unwrap_or_default();
                if rest.is_empty() {
                    ControlFlow::Continue(())
                } else {
                    self.deframe(slot, rest)
                }
            }
        }
    }

    fn reject_http(&mut self, slot: Slot, why: HandshakeFailure, status: u16, reason: &str) {
        self.m().handshake_failures[why as usize].inc();
        let peer = self.conns[slot].peer;
        conn_log!(self, info, %peer, reason = why.label(), "rejecting HTTP request");
        self.respond(slot, http::response(status, reason, &[], b""));
    }

    fn respond(&mut self, slot: Slot, bytes: Vec<u8>) {
        let conn = &mut self.conns[slot];
        conn.ctrl.extend_from_slice(&bytes);
        conn.phase = Phase::Responding;
        conn.close_after_flush = Some(CloseReason::HttpDone);
        self.mark_dirty(slot);
    }

    fn deframe(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        let mut deframer = std::mem::take(&mut self.conns[slot].deframer);
        let was_handshake = self.conns[slot].phase == Phase::ClientInfo;
        let result = match self.conns[slot].phase {
            Phase::ClientInfo => {
                deframer.feed(data, &frame::ClientInfoFramePolicy, |ty, payload| {
                    self.on_client_info(slot, ty, payload)
                })
            }
            _ => {
                let policy = ServerFramePolicy {
                    mesh: self.conns[slot].mesh,
                };
                deframer.feed(data, &policy, |ty, payload| {
                    self.on_frame(slot, ty, payload)
                })
            }
        };
        self.conns[slot].deframer = deframer;
        if was_handshake
            && result == Ok(frame::Fed::Paused)
            && self.conns[slot].phase == Phase::Active
        {
            // clientInfo registered the connection here: what followed it
            // in the same read is held by the deframer and now read under
            // the steady-state rules.
            return self.resume_frames(slot);
        }
        self.after_deframe(slot, result)
    }

    /// Continues with frames the deframer holds (after a pause).
    fn resume_frames(&mut self, slot: Slot) -> ControlFlow<()> {
        let mut deframer = std::mem::take(&mut self.conns[slot].deframer);
        let policy = ServerFramePolicy {
            mesh: self.conns[slot].mesh,
        };
        let result = deframer.resume(&policy, |ty, payload| self.on_frame(slot, ty, payload));
        self.conns[slot].deframer = deframer;
        self.after_deframe(slot, result)
    }

    fn after_deframe(
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
                if self.conns[slot].phase == Phase::ClientInfo {
                    // clientInfo was read; what follows waits for the
                    // connection to register (here or on its owner shard).
                }
                ControlFlow::Break(())
            }
            Err(e) => {
                let conn = &self.conns[slot];
                let peer = conn.peer;
                if !self.ended(slot) {
                    if conn.phase == Phase::ClientInfo {
                        self.fail_handshake(slot, HandshakeFailure::BadFirstFrame, &e);
                    } else {
                        let key = conn.key;
                        conn_log!(self, info, %peer, client = %key, error = %e, "protocol violation; closing connection");
                        self.finish(slot, CloseReason::FrameError);
                    }
                }
                ControlFlow::Break(())
            }
        }
    }

    fn on_client_info(&mut self, slot: Slot, _ty: u8, payload: &[u8]) -> ControlFlow<()> {
        let result = handshake::open_client_info(&self.shared.config.private_key, payload);
        let (key, info) = match result {
            Ok(v) => v,
            Err(e) => {
                let why = match &e {
                    HandshakeError::ZeroKey => HandshakeFailure::ZeroKey,
                    HandshakeError::Json(_) => HandshakeFailure::BadJson,
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
        let owner = self.shared.owner_of(&key, self.shards);
        let conn = &mut self.conns[slot];
        conn.key = key;
        conn.mesh = mesh;
        conn.prober = info.is_prober;
        if owner == self.id {
            conn.phase = Phase::Active;
            self.register(slot);
            // Stop here: the frames after clientInfo follow other rules.
            ControlFlow::Break(())
        } else {
            // Frames after clientInfo stay in the deframer and travel along.
            conn.phase = Phase::Migrating;
            conn.paused = true;
            self.ops.push(Op::SetRecv(slot, false));
            self.migrating.push(slot);
            ControlFlow::Break(())
        }
    }

    // ----- registration -----

    fn register(&mut self, slot: Slot) {
        let now = self.now;
        let cfg = self.shared.config.clone();
        self.activity += 1;
        let activity = self.activity;
        let jitter = Duration::from_millis(self.jitter.gen_range(0..KEEPALIVE_JITTER_MS));
        let conn = &mut self.conns[slot];
        conn.phase = Phase::Active;
        conn.registered_at = now;
        conn.next_keepalive = now + cfg.keepalive + jitter;
        conn.last_active = activity;
        let key = conn.key;
        let nonce = nacl::random_nonce();
        let info = handshake::seal_server_info(
            &cfg.private_key,
            &key,
            &ServerInfo {
                version: 2,
                ..Default::default()
            },
            &nonce,
        );
        conn.ctrl.extend_from_slice(&info);
        let (addr, flags) = (conn.peer, conn.presence_flags());

        let m = &self.shared.metrics.shards[self.id];
        m.current_connections.add(1);
        let entry = self.keys.entry(key).or_default();
        match entry.conns.len() {
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
                self.conns[s].dup = true;
            }
        }
        self.mark_dirty(slot);
        self.broadcast_watch(WatchEvent::Present { key, addr, flags });
    }

    fn unregister(&mut self, slot: Slot) {
        self.release_waiters(slot);
        let conn = &mut self.conns[slot];
        let key = conn.key;
        let (preferred, watcher) = (conn.preferred, conn.watcher);
        let recv_from = std::mem::take(&mut conn.recv_from);
        conn.last_src = None;
        let metrics = self.shared.metrics.clone();
        let m = &metrics.shards[self.id];
        m.current_connections.add(-1);
        if preferred {
            m.current_home_connections.add(-1);
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
            m.watchers.add(-1);
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
                for shard in 0..self.shards {
                    if shard == self.id {
                        self.key_gone(key);
                    } else {
                        self.mail(shard, Mail::KeyGone(key));
                    }
                }
            }
            1 => {
                let last = entry.conns[0];
                entry.active = Some(last);
                self.conns[last].dup = false;
                m.current_dup_client_keys.add(-1);
                m.current_dup_client_conns.add(-2);
            }
            _ => {
                m.current_dup_client_conns.add(-1);
                if entry.active == Some(slot) {
                    entry.active = entry
                        .conns
                        .iter()
                        .copied()
                        .max_by_key(|&s| self.conns[s].last_active);
                }
            }
        }
    }

    /// Tells local receivers of `key` that it left.
    fn key_gone(&mut self, key: NodePublic) {
        let Some(list) = self.receivers.remove(&key) else {
            return;
        };
        for (slot, gen) in list {
            let Some(conn) = self.conns.get_mut(slot) else {
                continue;
            };
            if conn.gen != gen || conn.closing.is_some() {
                continue;
            }
            conn.recv_from.remove(&key);
            if conn.last_src == Some(key) {
                conn.last_src = None;
            }
            frame::put_peer_gone(&mut conn.ctrl, &key, PeerGoneReason::Disconnected);
            self.shared.metrics.shards[self.id]
                .peer_gone_disconnected_frames
                .inc();
            self.mark_dirty(slot);
        }
    }

    fn broadcast_watch(&mut self, ev: WatchEvent) {
        if self.watchers.is_empty() {
            return;
        }
        let watchers = std::mem::take(&mut self.watchers);
        for w in &watchers {
            self.watch_event(*w, ev);
        }
        self.watchers = watchers;
    }

    fn watch_event(&mut self, w: ConnRef, ev: WatchEvent) {
        if w.shard != self.id {
            self.mail(w.shard, Mail::Watch(w, ev));
            return;
        }
        let Some(slot) = self.live(w) else { return };
        let conn = &mut self.conns[slot];
        match ev {
            WatchEvent::Present { key, addr, flags } => {
                frame::put_peer_present(&mut conn.ctrl, &key, Some(addr), flags)
            }
            WatchEvent::Gone(key) => {
                frame::put_peer_gone(&mut conn.ctrl, &key, PeerGoneReason::Disconnected)
            }
        }
        self.mark_dirty(slot);
    }

    fn add_watcher(&mut self, w: ConnRef) {
        if !self.watchers.contains(&w) {
            self.watchers.push(w);
        }
        let present: Vec<WatchEvent> = self
            .keys
            .iter()
            .filter_map(|(key, e)| e.active.map(|s| (key, s)))
            .map(|(key, s)| {
                let c = &self.conns[s];
                WatchEvent::Present {
                    key: *key,
                    addr: c.peer,
                    flags: c.presence_flags(),
                }
            })
            .collect();
        for ev in present {
            self.watch_event(w, ev);
        }
    }

    // ----- frames from an active client -----

    fn on_frame(&mut self, slot: Slot, ty: u8, payload: &[u8]) -> ControlFlow<()> {
        if self.ended(slot) {
            return ControlFlow::Break(());
        }
        let parsed = match frame::parse_client_frame(ty, payload) {
            Ok(f) => f,
            Err(e) => {
                let peer = self.conns[slot].peer;
                conn_log!(self, info, %peer, error = %e, "malformed frame; closing connection");
                self.finish(slot, CloseReason::FrameError);
                return ControlFlow::Break(());
            }
        };
        if self.conns[slot].dup {
            self.note_activity(slot);
        }
        let src = self.conns[slot].key;
        match parsed {
            ClientFrame::SendPacket { dst, packet } => {
                let m = self.m();
                m.packets_received.inc();
                m.bytes_received.add(packet.len() as u64);
                m.packets_received_kind[kind_of(packet) as usize].inc();
                self.route(slot, RECORD_SEND, &src, &dst, packet)
            }
            ClientFrame::ForwardPacket { src, dst, packet } => {
                self.m().packets_forwarded_in.inc();
                self.route(slot, RECORD_FORWARD, &src, &dst, packet)
            }
            ClientFrame::NotePreferred(preferred) => {
                let young = self.now.duration_since(self.conns[slot].registered_at)
                    < Duration::from_secs(5);
                let conn = &mut self.conns[slot];
                if conn.preferred != preferred {
                    conn.preferred = preferred;
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
            ClientFrame::Ping(data) => {
                self.m().got_ping.inc();
                let conn = &mut self.conns[slot];
                if !conn.pong_pending {
                    conn.pong_pending = true;
                    frame::put_pong(&mut conn.ctrl, &data);
                    self.m().sent_pong.inc();
                    self.mark_dirty(slot);
                }
                ControlFlow::Continue(())
            }
            ClientFrame::WatchConns => {
                let conn = &mut self.conns[slot];
                if conn.key != self.shared.config.public_key && !conn.watcher {
                    conn.watcher = true;
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
            ClientFrame::ClosePeer(key) => {
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
            ClientFrame::Pong(_) | ClientFrame::Other { .. } => {
                self.m().unknown_frames.inc();
                ControlFlow::Continue(())
            }
        }
    }

    fn note_activity(&mut self, slot: Slot) {
        self.activity += 1;
        let conn = &mut self.conns[slot];
        conn.last_active = self.activity;
        if let Some(entry) = self.keys.get_mut(&conn.key) {
            entry.active = Some(slot);
        }
    }

    fn close_peer(&mut self, key: NodePublic) {
        let Some(entry) = self.keys.get(&key) else {
            return;
        };
        for slot in entry.conns.clone() {
            let peer = self.conns[slot].peer;
            conn_log!(self, info, %peer, client = %key, "closing connection at a mesh peer's request");
            self.close(slot, CloseReason::ClosePeer);
        }
    }

    /// Sends a packet on its way: delivered here, or recorded into the ring
    /// to the destination's owner. Breaks (pausing the sender) when that
    /// ring is full.
    fn route(
        &mut self,
        slot: Slot,
        record_kind: u8,
        src: &NodePublic,
        dst: &NodePublic,
        packet: &[u8],
    ) -> ControlFlow<()> {
        let owner = self.shared.owner_of(dst, self.shards);
        if owner == self.id {
            let from = self.conn_ref(slot);
            if self.deliver(record_kind, src, dst, packet, from) {
                self.pause_sender(slot);
                return ControlFlow::Break(());
            }
            return ControlFlow::Continue(());
        }
        let gen = self.conns[slot].gen;
        let mut header = [0u8; RECORD_HEADER];
        write_record_header(&mut header, record_kind, src, dst, slot as u32, gen);
        let tx = self.rings.bytes_tx[owner]
            .as_mut()
            .expect("ring to another shard");
        if tx.try_push(&[&header, packet]) {
            self.notify[owner] = true;
            self.shared.metrics.shards[self.id].cross_shard_out.inc();
            return ControlFlow::Continue(());
        }
        // The owner is behind: keep this packet, stop reading the sender.
        let conn = &mut self.conns[slot];
        conn.stall_record.clear();
        conn.stall_record.extend_from_slice(&header);
        conn.stall_record.extend_from_slice(packet);
        conn.stalled_to = Some(owner);
        conn.paused = true;
        self.ops.push(Op::SetRecv(slot, false));
        self.stalled.push(slot);
        self.m().ring_stalls.inc();
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
    fn deliver(
        &mut self,
        record_kind: u8,
        src: &NodePublic,
        dst: &NodePublic,
        packet: &[u8],
        from: ConnRef,
    ) -> bool {
        let kind = kind_of(packet);
        let m = &self.shared.metrics.shards[self.id];
        let drop = |m: &ShardMetrics, reason: DropReason| {
            m.packets_dropped[reason as usize][kind as usize].inc();
            m.bytes_dropped[reason as usize][kind as usize].add(packet.len() as u64);
        };
        let Some(entry) = self.keys.get(dst) else {
            drop(
                m,
                if record_kind == RECORD_FORWARD {
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
        let cap_bytes = self.shared.config.send_queue_bytes;
        let cap_disco = self.shared.config.disco_queue_packets as u32;
        let conn = &mut self.conns[slot];
        if conn.closing.is_some() {
            drop(m, DropReason::GoneDisconnected);
            return false;
        }
        let frame_len = frame::HEADER_LEN + 32 + packet.len();
        let mut pause = false;
        match kind {
            PacketKind::Disco => {
                if conn.disco_n >= cap_disco {
                    drop(m, DropReason::QueueTail);
                    return false;
                }
                frame::put_recv_packet(&mut conn.disco, src, packet);
                conn.disco_n += 1;
            }
            PacketKind::Other => {
                let after = conn.data.len() + frame_len;
                if after > cap_bytes
                    && (record_kind == RECORD_FORWARD || conn.not_draining || after > self.hard_cap)
                {
                    drop(m, DropReason::QueueTail);
                    return false;
                }
                if conn.data.capacity() < QUEUE_START {
                    // A queue that carries data gets a working size at once
                    // (it and the spare swap roles on every flush), so it
                    // grows in a few large steps, never packet by packet.
                    conn.data.reserve(QUEUE_START);
                }
                frame::put_recv_packet(&mut conn.data, src, packet);
                conn.data_n += 1;
                if after > cap_bytes
                    && record_kind != RECORD_FORWARD
                    && !conn.waiters.contains(&from)
                {
                    if conn.waiters.is_empty() {
                        // A new hold: its budget starts now.
                        conn.held_since = self.now;
                        conn.acked_mark = None;
                        if !conn.holding {
                            conn.holding = true;
                            self.holders.push((slot, conn.gen));
                        }
                    }
                    conn.waiters.push(from);
                    pause = true;
                }
            }
        }
        m.packets_sent.inc();
        m.bytes_sent.add(packet.len() as u64);
        conn.gauged_bytes += frame_len;
        m.queued_bytes.add(frame_len as i64);
        if conn.last_src != Some(*src) {
            conn.last_src = Some(*src);
            if conn.recv_from.insert(*src) {
                let gen = conn.gen;
                self.receivers.entry(*src).or_default().push((slot, gen));
            }
        }
        self.mark_dirty(slot);
        pause
    }

    /// Stops reading a local sender until every destination that paused
    /// it has drained.
    fn pause_sender(&mut self, slot: Slot) {
        let conn = &mut self.conns[slot];
        if !conn.bp_paused {
            conn.bp_paused = true;
            let m = &self.shared.metrics.shards[self.id];
            m.backpressure_pauses.inc();
            m.senders_paused.add(1);
        }
        if !conn.paused {
            conn.paused = true;
            self.ops.push(Op::SetRecv(slot, false));
        }
    }

    /// A destination that paused `r` drained or left.
    fn resume_sender(&mut self, r: ConnRef) {
        if r.shard != self.id {
            self.mail(r.shard, Mail::Resume(r));
            return;
        }
        let Some(slot) = self.live(r) else { return };
        let conn = &mut self.conns[slot];
        if conn.bp_paused {
            conn.bp_paused = false;
            self.shared.metrics.shards[self.id].senders_paused.add(-1);
        }
        self.try_resume(slot);
    }

    /// Resumes input if nothing holds it any more.
    fn try_resume(&mut self, slot: Slot) {
        let conn = &self.conns[slot];
        if conn.paused
            && !conn.bp_paused
            && conn.stalled_to.is_none()
            && conn.phase == Phase::Active
            && !self.ended(slot)
        {
            self.resume_input(slot);
        }
    }

    /// Lets every sender waiting on `slot` go.
    fn release_waiters(&mut self, slot: Slot) {
        if self.conns[slot].waiters.is_empty() {
            return;
        }
        // Reuse the list's memory; senders resumed here may queue again
        // (and wait again) while it is being walked.
        let mut waiting = std::mem::take(&mut self.conns[slot].waiters);
        for r in waiting.drain(..) {
            self.resume_sender(r);
        }
        let conn = &mut self.conns[slot];
        std::mem::swap(&mut conn.waiters, &mut waiting);
        conn.waiters.append(&mut waiting);
    }

    /// Releases the senders held by destinations that took nothing from
    /// their sockets for the backpressure budget (see the module doc).
    fn enforce_budget(&mut self, driver: &mut dyn DriverOps) {
        let now = self.now;
        let budget = self.shared.config.backpressure_budget;
        let half = budget / 2;
        let mut i = 0;
        while i < self.holders.len() {
            let (slot, gen) = self.holders[i];
            let conn = match self.conns.get_mut(slot) {
                Some(c) if c.gen == gen && c.closing.is_none() && !c.waiters.is_empty() => c,
                Some(c) if c.gen == gen => {
                    c.holding = false;
                    self.holders.swap_remove(i);
                    continue;
                }
                _ => {
                    self.holders.swap_remove(i);
                    continue;
                }
            };
            let held = now.saturating_duration_since(conn.held_since);
            if held < half {
                i += 1;
                continue;
            }
            let Some(mark) = conn.acked_mark else {
                // Half the budget gone: note how far the peer has read.
                conn.acked_mark = Some(driver.bytes_acked(slot));
                i += 1;
                continue;
            };
            if held < budget {
                i += 1;
                continue;
            }
            let acked = driver.bytes_acked(slot);
            if mark.is_some() && acked.is_some() && acked != mark {
                // It reads, just slowly: a new half-budget window.
                conn.held_since = now - half;
                conn.acked_mark = Some(acked);
                i += 1;
                continue;
            }
            conn.not_draining = true;
            conn.holding = false;
            self.holders.swap_remove(i);
            let (peer, key, held_for) = (conn.peer, conn.key, held);
            self.m().backpressure_expired.inc();
            conn_log!(self, info, %peer, client = %key, held_ms = held_for.as_millis() as u64,
                "client is taking nothing from its socket; dropping its packets instead of pausing the senders feeding it");
            self.release_waiters(slot);
        }
    }

    /// When the next hold reaches a point [`Shard::enforce_budget`] acts on.
    fn next_budget_check(&self) -> Option<Instant> {
        let budget = self.shared.config.backpressure_budget;
        self.holders
            .iter()
            .filter_map(|&(slot, _)| self.conns.get(slot))
            .filter(|c| !c.waiters.is_empty())
            .map(|c| {
                c.held_since
                    + if c.acked_mark.is_none() {
                        budget / 2
                    } else {
                        budget
                    }
            })
            .min()
    }

    fn not_here(&mut self, to: ConnRef, dst: NodePublic) {
        let Some(slot) = self.live(to) else { return };
        let now = self.now;
        let conn = &mut self.conns[slot];
        if conn.take_not_here_token(now) {
            frame::put_peer_gone(&mut conn.ctrl, &dst, PeerGoneReason::NotHere);
            self.shared.metrics.shards[self.id]
                .peer_gone_not_here_frames
                .inc();
            self.mark_dirty(slot);
        }
    }

    /// A non-data TLS record on a kernel-TLS socket: kept for after the
    /// turn, when the driver (and so the socket) is at hand.
    fn on_tls_record(&mut self, slot: Slot, record_type: u8, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.closing.is_some() {
            return;
        }
        if conn.ktls.is_none() {
            let peer = conn.peer;
            conn_log!(self, info, %peer, record_type, "TLS control record on a connection without kernel TLS; closing");
            self.close(slot, CloseReason::IoError);
            return;
        }
        if conn.tls_records.is_empty() {
            self.record_slots.push(slot);
        }
        conn.tls_records.push((record_type, data.to_vec()));
    }

    fn on_eof(&mut self, slot: Slot) {
        let conn = &self.conns[slot];
        if conn.closing.is_some() || conn.close_after_flush.is_some() {
            return;
        }
        match conn.phase {
            Phase::Active => self.close(slot, CloseReason::Eof),
            _ => {
                self.m().handshake_failures[HandshakeFailure::Eof as usize].inc();
                self.close(slot, CloseReason::Handshake);
            }
        }
    }

    // ----- after each turn -----

    fn run_ops(&mut self, driver: &mut dyn DriverOps) {
        let mut ops = std::mem::take(&mut self.ops);
        for op in ops.drain(..) {
            match op {
                Op::Attach(slot, stream) => {
                    if let Err(e) = driver.attach(slot, stream) {
                        tracing::warn!(error = %e, "could not register a socket");
                        self.close(slot, CloseReason::IoError);
                    }
                }
                Op::SetRecv(slot, on) => {
                    if self.conns.get(slot).is_some_and(|c| c.closing.is_none()) {
                        driver.set_recv(slot, on);
                    }
                }
                Op::KtlsRx(slot) => {
                    if let Err(e) = driver.set_ktls_rx(slot) {
                        // The session is in the kernel already: without
                        // record-aware reads it cannot go on.
                        let peer = self.conns[slot].peer;
                        conn_log!(self, info, %peer, error = %e, "kernel TLS connection moved to a back end that cannot read it; closing");
                        self.close(slot, CloseReason::IoError);
                    }
                }
            }
        }
        std::mem::swap(&mut self.ops, &mut ops);
        self.ops.append(&mut ops);
    }

    /// Reads everything shard `from` left for this one.
    fn drain_from(&mut self, from: usize) {
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
        let backed_up = rx.len() * 2 > rx.capacity();
        let mut scratch = std::mem::take(&mut self.record);
        while rx
            .pop_with(|a, b| {
                if b.is_empty() {
                    self.on_record(from, a);
                } else {
                    scratch.clear();
                    scratch.extend_from_slice(a);
                    scratch.extend_from_slice(b);
                    self.on_record(from, &scratch);
                }
            })
            .is_some()
        {}
        self.record = scratch;
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

    fn on_record(&mut self, from: usize, record: &[u8]) {
        let Some((kind, src, dst, slot, gen, packet)) = read_record(record) else {
            debug_assert!(false, "malformed cross-shard record");
            return;
        };
        // The sender lives on the shard whose ring this is.
        let sender = ConnRef {
            shard: from,
            slot: slot as usize,
            gen,
        };
        if self.deliver(kind, &src, &dst, packet, sender) {
            self.mail(from, Mail::Pause(sender));
        }
    }

    fn on_mail(&mut self, mail: Mail) {
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
        }
    }

    fn migrate_in(&mut self, mut conn: Box<Conn>) {
        let Some(stream) = conn.stream.take() else {
            return;
        };
        self.next_gen = self.next_gen.wrapping_add(1);
        conn.gen = self.next_gen;
        conn.dirty = false;
        let m = self.m();
        m.migrations_in.inc();
        m.open_sockets.add(1);
        conn.gauged_bytes = 0;
        m.queued_bytes.add(conn.regauge());
        count_transport(m, &conn, 1);
        let ktls = conn.ktls.is_some();
        let slot = self.conns.insert(*conn);
        self.ops.push(Op::Attach(slot, stream));
        if ktls {
            self.ops.push(Op::KtlsRx(slot));
        }
        self.register(slot);
        self.resume_input(slot);
    }

    /// Restarts input after a pause: frames held by the deframer, then
    /// plaintext held by TLS, then stashed raw bytes.
    fn resume_input(&mut self, slot: Slot) {
        let conn = &mut self.conns[slot];
        conn.paused = false;
        if self.resume_frames(slot).is_break() {
            return;
        }
        if let Some(mut tls) = self.conns[slot].tls.take() {
            let go_on = self.drain_tls(slot, &mut tls);
            self.conns[slot].tls = Some(tls);
            if !go_on {
                return;
            }
        }
        let stash = std::mem::take(&mut self.conns[slot].stash);
        if !stash.is_empty() {
            self.ingest(slot, &stash);
        }
        let conn = &mut self.conns[slot];
        if conn.stash.is_empty() {
            // Keep the capacity for the next pause.
            conn.stash = stash;
            conn.stash.clear();
        }
        if !self.conns[slot].paused && self.conns[slot].closing.is_none() {
            self.ops.push(Op::SetRecv(slot, true));
        }
    }

    fn retry_stalled(&mut self) {
        let mut i = 0;
        while i < self.stalled.len() {
            let slot = self.stalled[i];
            let Some(conn) = self.conns.get_mut(slot) else {
                self.stalled.swap_remove(i);
                continue;
            };
            if conn.closing.is_some() {
                conn.stalled_to = None;
                self.stalled.swap_remove(i);
                continue;
            }
            let Some(shard) = conn.stalled_to else {
                self.stalled.swap_remove(i);
                continue;
            };
            let tx = self.rings.bytes_tx[shard].as_mut().expect("ring");
            if !tx.try_push(&[&conn.stall_record]) {
                i += 1;
                continue;
            }
            conn.stalled_to = None;
            self.notify[shard] = true;
            self.shared.metrics.shards[self.id].cross_shard_out.inc();
            self.stalled.swap_remove(i);
            self.try_resume(slot);
        }
    }

    fn finish_migrations(&mut self, driver: &mut dyn DriverOps) {
        let mut i = 0;
        while i < self.migrating.len() {
            let slot = self.migrating[i];
            let Some(conn) = self.conns.get(slot) else {
                self.migrating.swap_remove(i);
                continue;
            };
            if conn.closing.is_some() {
                self.migrating.swap_remove(i);
                continue;
            }
            // The socket moves once everything queued here (the 101 and
            // serverKey) is written.
            if conn.in_flight.is_some() || conn.has_output() {
                i += 1;
                continue;
            }
            let Some(stream) = driver.detach(slot) else {
                i += 1;
                continue;
            };
            self.migrating.swap_remove(i);
            let mut conn = self.conns.remove(slot);
            conn.stream = Some(stream);
            conn.dirty = false;
            let m = self.m();
            m.open_sockets.add(-1);
            m.queued_bytes
                .add(-(std::mem::take(&mut conn.gauged_bytes) as i64));
            count_transport(m, &conn, -1);
            let owner = self.shared.owner_of(&conn.key, self.shards);
            self.mail(owner, Mail::Migrate(Box::new(conn)));
        }
    }

    /// Moves TLS sessions into the kernel where it is safe now: between
    /// turns (no receive pending), no send in flight, nothing stashed, at a
    /// record boundary, rustls holding nothing (see `crate::ktls`).
    fn try_ktls(&mut self, driver: &mut dyn DriverOps) {
        let mut i = 0;
        while i < self.ktls_candidates.len() {
            let (slot, gen, deadline) = self.ktls_candidates[i];
            let Some(conn) = self.conns.get_mut(slot).filter(|c| c.gen == gen) else {
                self.ktls_candidates.swap_remove(i);
                continue;
            };
            let waiting = conn.in_flight.is_some()
                || !conn.stash.is_empty()
                || conn.phase == Phase::Migrating
                || !conn.ktls_boundary.as_ref().is_some_and(|b| b.at_boundary());
            if conn.closing.is_some() || conn.tls.is_none() || conn.phase == Phase::Responding {
                conn.ktls_boundary = None;
                self.ktls_candidates.swap_remove(i);
                continue;
            }
            if waiting {
                if self.now >= deadline {
                    conn.ktls_boundary = None;
                    self.ktls_candidates.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            }
            use crate::ktls::Handoff;
            if let Err(reason) = conn.tls.as_ref().expect("tls").ready() {
                if reason.is_transient() && self.now < deadline {
                    i += 1;
                } else {
                    self.ktls_refused(reason.label());
                    self.conns[slot].ktls_boundary = None;
                    self.ktls_candidates.swap_remove(i);
                }
                continue;
            }
            self.ktls_candidates.swap_remove(i);
            self.conns[slot].ktls_boundary = None;
            if driver.set_ktls_rx(slot).is_err() {
                self.ktls_refused("backend");
                continue;
            }
            let Some(fd) = driver.fd(slot) else {
                self.ktls_refused("backend");
                continue;
            };
            let tls = self.conns[slot].tls.take().expect("tls");
            match crate::ktls::KtlsSession::start(*tls, fd) {
                Ok(session) => {
                    self.conns[slot].ktls = Some(Box::new(session));
                    self.m().ktls_sockets.add(1);
                }
                Err(crate::ktls::Refused::Usable { conn: tls, reason }) => {
                    self.conns[slot].tls = Some(Box::new(tls));
                    self.ktls_refused(reason.label());
                }
                Err(crate::ktls::Refused::Dead(e)) => {
                    self.ktls_refused("failed");
                    let peer = self.conns[slot].peer;
                    conn_log!(self, info, %peer, error = %e, "moving TLS into the kernel failed; closing connection");
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
    }

    fn ktls_refused(&self, label: &str) {
        if let Some(i) = crate::metrics::KTLS_REFUSALS
            .iter()
            .position(|l| *l == label)
        {
            self.m().ktls_refused[i].inc();
        }
    }

    /// Handles alerts and KeyUpdates that arrived on kernel-TLS sockets.
    fn handle_tls_records(&mut self, driver: &mut dyn DriverOps) {
        let mut slots = std::mem::take(&mut self.record_slots);
        for slot in slots.drain(..) {
            let Some(conn) = self.conns.get_mut(slot) else {
                continue;
            };
            let records = std::mem::take(&mut conn.tls_records);
            let (Some(session), Some(fd)) = (conn.ktls.as_mut(), driver.fd(slot)) else {
                continue;
            };
            let mut end: Option<Result<(), String>> = None;
            for (record_type, data) in &records {
                match session.on_record(fd, *record_type, data) {
                    Ok(crate::ktls::RecordOutcome::KeyUpdated) => {}
                    Ok(crate::ktls::RecordOutcome::Closed) => {
                        end = Some(Ok(()));
                        break;
                    }
                    Err(e) => {
                        let _ = session.send_close_notify(fd);
                        end = Some(Err(e.to_string()));
                        break;
                    }
                }
            }
            match end {
                None => {}
                Some(Ok(())) => self.on_eof(slot),
                Some(Err(e)) => {
                    let peer = self.conns[slot].peer;
                    conn_log!(self, info, %peer, error = %e, "kernel TLS session ended; closing connection");
                    self.close(slot, CloseReason::IoError);
                }
            }
        }
        std::mem::swap(&mut self.record_slots, &mut slots);
        self.record_slots.append(&mut slots);
    }

    fn flush(&mut self, driver: &mut dyn DriverOps) {
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
            if let Some(session) = conn.ktls.as_mut() {
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
            let mut buf = std::mem::take(&mut conn.spare);
            buf.clear();
            let moved = conn.queued_bytes() as i64;
            if let Some(tls) = conn.tls.as_mut() {
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
            if let Some(session) = conn.ktls.as_mut() {
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

    fn on_sent(&mut self, slot: Slot, buf: Vec<u8>, result: io::Result<()>) {
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
        // The socket took a whole send: it drains again.
        conn.not_draining = false;
        if conn.has_output() || conn.close_after_flush.is_some() {
            self.mark_dirty(slot);
        }
    }

    fn sweep(&mut self) {
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

    fn start_drain(&mut self) {
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
                frame::put_restarting(&mut conn.ctrl, reconnect, try_for);
                conn.close_after_flush = Some(CloseReason::Shutdown);
                self.mark_dirty(slot);
            } else if conn.phase != Phase::Responding {
                self.close(slot, CloseReason::Shutdown);
            }
        }
    }

    fn release_closed(&mut self, driver: &mut dyn DriverOps) {
        let mut closing = std::mem::take(&mut self.closing);
        for slot in closing.drain(..) {
            if let Some(conn) = self.conns.try_remove(slot) {
                driver.close(slot);
                let m = self.m();
                m.open_sockets.add(-1);
                count_transport(m, &conn, -1);
            }
        }
        std::mem::swap(&mut self.closing, &mut closing);
        self.closing.append(&mut closing);
    }

    fn ring_doorbells(&mut self) {
        let Some(bells) = self.shared.doorbells.get() else {
            return;
        };
        for (shard, pending) in self.notify.iter_mut().enumerate() {
            if *pending {
                *pending = false;
                if let Some(tx) = self.rings.msg_tx[shard].as_mut() {
                    if tx.flush() {
                        *pending = true; // still backlogged: try again next turn
                    }
                }
                bells[shard].notify();
            }
        }
    }
}

/// The driver operations the shard uses after a turn (object-safe subset).
trait DriverOps {
    fn attach(&mut self, slot: Slot, stream: TcpStream) -> io::Result<()>;
    fn detach(&mut self, slot: Slot) -> Option<TcpStream>;
    fn close(&mut self, slot: Slot);
    fn set_recv(&mut self, slot: Slot, enabled: bool);
    fn send(&mut self, slot: Slot, buf: Vec<u8>);
    fn fd(&self, slot: Slot) -> Option<std::os::fd::BorrowedFd<'_>>;
    fn set_ktls_rx(&mut self, slot: Slot) -> io::Result<()>;
    fn bytes_acked(&self, slot: Slot) -> Option<u64>;
}

impl<D: Driver> DriverOps for D {
    fn attach(&mut self, slot: Slot, stream: TcpStream) -> io::Result<()> {
        Driver::attach(self, slot, stream)
    }
    fn detach(&mut self, slot: Slot) -> Option<TcpStream> {
        Driver::detach(self, slot)
    }
    fn close(&mut self, slot: Slot) {
        Driver::close(self, slot)
    }
    fn set_recv(&mut self, slot: Slot, enabled: bool) {
        Driver::set_recv(self, slot, enabled)
    }
    fn send(&mut self, slot: Slot, buf: Vec<u8>) {
        Driver::send(self, slot, buf)
    }
    fn fd(&self, slot: Slot) -> Option<std::os::fd::BorrowedFd<'_>> {
        Driver::fd(self, slot)
    }
    fn set_ktls_rx(&mut self, slot: Slot) -> io::Result<()> {
        Driver::set_ktls_rx(self, slot)
    }
    fn bytes_acked(&self, slot: Slot) -> Option<u64> {
        Driver::bytes_acked(self, slot)
    }
}

impl<D: Driver> Handler<D> for Shard {
    fn on_completion(&mut self, c: Completion<'_>, now: Instant) {
        self.now = now;
        match c {
            Completion::Accepted {
                listener,
                stream,
                peer,
            } => self.accept(listener, stream, peer),
            Completion::Received { slot, data } => self.on_received(slot, data),
            Completion::RecvClosed { slot, error } => {
                if self.conns.get(slot).is_some_and(|c| c.closing.is_none()) {
                    match error {
                        None => {
                            if self.conns[slot].paused || !self.conns[slot].stash.is_empty() {
                                // Finish what was stashed first; the next
                                // read after resuming reports the end again.
                            } else {
                                self.on_eof(slot);
                            }
                        }
                        Some(e) => {
                            let peer = self.conns[slot].peer;
                            conn_log!(self, debug, %peer, error = %e, "read failed; closing connection");
                            if self.conns[slot].phase == Phase::Active {
                                self.close(slot, CloseReason::IoError);
                            } else {
                                self.fail_handshake(slot, HandshakeFailure::Eof, &e);
                            }
                        }
                    }
                }
            }
            Completion::Sent { slot, buf, result } => self.on_sent(slot, buf, result),
            Completion::Record {
                slot,
                record_type,
                data,
            } => self.on_tls_record(slot, record_type, data),
            Completion::Woken => {}
        }
    }

    fn after_turn(&mut self, driver: &mut D, now: Instant) {
        self.now = now;
        self.run_ops(driver);
        for from in 0..self.shards {
            if from != self.id {
                self.drain_from(from);
            }
        }
        self.retry_stalled();
        if self.shared.shutdown.load(Ordering::Relaxed) && self.draining.is_none() {
            self.start_drain();
        }
        if self.now >= self.next_sweep {
            self.next_sweep = self.now + SWEEP_EVERY;
            self.sweep();
            let b = driver.recv_buffers();
            let m = self.m();
            m.recv_buffer_bytes.set(b.bytes as i64);
            m.recv_buffer_exhausted.set(b.exhausted as i64);
            m.recv_buffer_growths.set(b.growths as i64);
        }
        self.finish_migrations(driver);
        self.run_ops(driver);
        if !self.record_slots.is_empty() {
            self.handle_tls_records(driver);
        }
        if !self.ktls_candidates.is_empty() {
            self.try_ktls(driver);
        }
        if !self.holders.is_empty() {
            self.enforce_budget(driver);
        }
        self.flush(driver);
        self.release_closed(driver);
        self.ring_doorbells();
        if let Some(deadline) = self.draining {
            if self.conns.is_empty() || self.now >= deadline {
                let slots: Vec<Slot> = self.conns.iter().map(|(s, _)| s).collect();
                for slot in slots {
                    self.close(slot, CloseReason::Shutdown);
                }
                self.release_closed(driver);
                self.done = true;
            }
        }
        self.m().turns.inc();
    }

    fn turn_done(&mut self, busy: Duration) {
        self.m().busy_ns.add(busy.as_nanos() as u64);
    }

    fn timeout(&mut self, now: Instant) -> Option<Duration> {
        if !self.dirty.is_empty() || !self.ops.is_empty() || !self.closing.is_empty() {
            return Some(Duration::ZERO);
        }
        let mut t = self.next_sweep.saturating_duration_since(now);
        if !self.stalled.is_empty() || !self.migrating.is_empty() || self.notify.iter().any(|&n| n)
        {
            t = t.min(STALL_RETRY);
        }
        if self.draining.is_some() {
            t = t.min(Duration::from_millis(10));
        }
        if let Some(at) = self.next_budget_check() {
            t = t.min(at.saturating_duration_since(now));
        }
        Some(t)
    }

    fn has_mail(&self) -> bool {
        (0..self.shards).any(|s| {
            self.rings.bytes_rx[s]
                .as_ref()
                .is_some_and(|r| !r.is_empty())
                || self.rings.msg_rx[s].as_ref().is_some_and(|r| !r.is_empty())
        }) || self.shared.shutdown.load(Ordering::Relaxed) && self.draining.is_none()
    }

    fn finished(&self) -> bool {
        self.done
    }
}

/// Adds `sign` to the TLS gauges a connection counts in.
fn count_transport(m: &ShardMetrics, conn: &Conn, sign: i64) {
    if conn.tls.is_some() || conn.ktls.is_some() {
        m.tls_sockets.add(sign);
    }
    if conn.ktls.is_some() {
        m.ktls_sockets.add(sign);
    }
}

fn kind_of(packet: &[u8]) -> PacketKind {
    if frame::is_disco(packet) {
        PacketKind::Disco
    } else {
        PacketKind::Other
    }
}

fn write_record_header(
    out: &mut [u8; RECORD_HEADER],
    kind: u8,
    src: &NodePublic,
    dst: &NodePublic,
    slot: u32,
    gen: u32,
) {
    out[0] = kind;
    out[1..33].copy_from_slice(src.as_bytes());
    out[33..65].copy_from_slice(dst.as_bytes());
    out[65..69].copy_from_slice(&slot.to_le_bytes());
    out[69..73].copy_from_slice(&gen.to_le_bytes());
}

type Record<'a> = (u8, NodePublic, NodePublic, u32, u32, &'a [u8]);

fn read_record(r: &[u8]) -> Option<Record<'_>> {
    if r.len() < RECORD_HEADER {
        return None;
    }
    let key = |b: &[u8]| NodePublic::from_bytes(b.try_into().expect("32 bytes"));
    Some((
        r[0],
        key(&r[1..33]),
        key(&r[33..65]),
        u32::from_le_bytes(r[65..69].try_into().ok()?),
        u32::from_le_bytes(r[69..73].try_into().ok()?),
        &r[RECORD_HEADER..],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_header_round_trips() {
        let src = NodePublic::from_bytes([1; 32]);
        let dst = NodePublic::from_bytes([2; 32]);
        let mut h = [0u8; RECORD_HEADER];
        write_record_header(&mut h, RECORD_FORWARD, &src, &dst, 7, 9);
        let mut rec = h.to_vec();
        rec.extend_from_slice(b"pkt");
        let (k, s, d, slot, gen, p) = read_record(&rec).unwrap();
        assert_eq!(
            (k, s, d, slot, gen, p),
            (RECORD_FORWARD, src, dst, 7, 9, &b"pkt"[..])
        );
        assert!(read_record(&rec[..10]).is_none());
    }
}
