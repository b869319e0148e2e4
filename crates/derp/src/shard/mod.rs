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
//! appended to the destination's queue; to a remote key, a packet in the
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
//! every turn (what was there when the turn began, so a producer cannot
//! keep it from its own sockets), whatever its clients do; a ring is only
//! ever full while its consumer's core is busy. But a sender flooding a
//! non-draining destination would fill the ring with packets that are only
//! dropped at the other end, at the cost of everyone else's traffic
//! through it: so the destination's shard tells the others when it stops
//! and starts draining, and they drop its packets before the ring. Mesh-
//! forwarded packets never pause their link (they are dropped over the cap
//! instead).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry_engine::mailbox::{ByteRx, ByteTx, Doorbell, MsgRx, MsgTx};
use ferry_engine::{Completion, Driver, Handler, Slot};
use ferry_proto::app_name::{self, AppName};
use ferry_proto::frame::{self, PeerGoneReason};
use ferry_proto::handshake::{self, HandshakeError, ServerInfo};
use ferry_proto::key::NodePublic;
use ferry_proto::{http, nacl};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use slab::Slab;

use crate::admission::{Admission, Verdict};
use crate::config::{DerpConfig, ListenerKind, Placement, TlsRecords};
use crate::conn::{Action, Caps, Conn, Hold, Phase, Queued, Timeout};
use crate::front::{self, Answer};
use crate::metrics::{
    CloseReason, DropReason, HandshakeFailure, Metrics, PacketKind, ShardMetrics,
};
use crate::transport::Transport;
use ferry_engine::limit::Bucket;
use ferry_proto::rate_config::RateConfig;
use log_limit::LogLimiter;
use ring::{RingHeader, RingPacket, Via};

/// How often deadlines, keepalives and write timeouts are checked.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Starting capacity of a shard's per-turn work lists (slots to flush,
/// stalled senders, pending operations, outgoing mail).
const WORK_LIST_START: usize = 256;
/// How long a shard with paused senders waits before retrying its rings.
const STALL_RETRY: Duration = Duration::from_millis(1);
/// Jitter added to the keepalive interval, chosen once per connection.
const KEEPALIVE_JITTER_MS: u64 = 5_000;
/// How long a connection being closed for a protocol violation may take to
/// receive what was queued for it.
const FINISH_GRACE: Duration = Duration::from_secs(2);
/// How long a TLS connection keeps trying to move into kernel TLS (it can
/// only move between records, with nothing buffered).
const KTLS_TRY_FOR: Duration = Duration::from_secs(5);
/// Messages per cross-shard control ring.
pub const MSG_RING: usize = 4096;

pub use crate::conn::ConnRef;
pub use debug_clients::DebugMail;
pub use forward::{MeshLink, MeshNews, MeshOut, MeshShared, STATE_HEARD};
pub use sessions::RelayMail;

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
        /// The client's application name.
        app_name: Option<AppName>,
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
    /// A connection of `key` stopped draining (`true`: drop its packets
    /// here instead of sending them through the ring) or drains again.
    NotDraining {
        /// The destination's key.
        key: NodePublic,
        /// Whether it is not draining now.
        stuck: bool,
    },
    /// Deliver a presence change to a watcher on this shard.
    Watch(ConnRef, WatchEvent),
    /// Close every connection of this key (closePeer from a mesh peer).
    ClosePeer(NodePublic),
    /// Stop reading this sender: a destination it feeds is backed up.
    Pause(ConnRef),
    /// The destination drained (or left): the sender may read again.
    Resume(ConnRef),
    /// A relay-session allocation or its answer (see `sessions`).
    Relay(RelayMail),
    /// A `/debug/clients/` request or a shard's answer to one.
    DebugClients(Box<DebugMail>),
}

/// What all shards share, read-only.
pub struct Shared {
    /// Settings.
    pub config: Arc<DerpConfig>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// One per shard; filled once every shard's driver exists.
    pub doorbells: OnceLock<Vec<Arc<Doorbell>>>,
    /// Key-to-shard hash, seeded randomly (used with
    /// [`Placement::Random`]).
    pub hasher: RandomState,
    /// Set to start a graceful shutdown.
    pub shutdown: AtomicBool,
    /// What each listener index serves (same order on every shard).
    pub listener_kinds: Vec<ListenerKind>,
    /// Messages to each shard from threads that are not shards.
    pub inboxes: Vec<Inbox>,
    /// The admission pool, when admission is on.
    pub admission: OnceLock<Admission<ConnRef>>,
    /// `--accept-connection-limit`, shared by every shard's accepts.
    pub accept_limit: Option<Mutex<Bucket>>,
    /// The mesh links this relay dials (`--mesh-with`), if any.
    pub mesh: Option<MeshShared>,
    /// Connections upgraded to DERP so far: the last connection number.
    pub conn_nums: std::sync::atomic::AtomicI64,
    /// A moment as both clocks read it, taken once: connection times on
    /// `/debug/clients/` are wall-clock times counted from it, so one
    /// connection's time never moves between two pages.
    pub epoch: (Instant, std::time::SystemTime),
}

/// A message to a shard from outside the shards.
pub enum Control {
    /// The admission verdict for a connection.
    Admitted(ConnRef, Verdict),
    /// New per-client receive limits (`--rate-config` reloaded).
    RateConfig(RateConfig),
    /// What the mesh conn to peer `peer` learned (see [`MeshNews`]).
    Mesh {
        /// The mesh peer's index in `--mesh-with` order.
        peer: usize,
        /// What it learned.
        news: MeshNews,
    },
}

/// One shard's inbox for [`Control`] messages: any thread may post. The
/// shard looks at a flag each turn and takes the lock only when it is set;
/// posting rings the shard's doorbell, so a parked shard wakes.
#[derive(Default)]
pub struct Inbox {
    queue: Mutex<Vec<Control>>,
    pending: AtomicBool,
}

impl Shared {
    /// Posts `msg` to `shard` and wakes it.
    pub fn post(&self, shard: usize, msg: Control) {
        let inbox = &self.inboxes[shard];
        inbox.queue.lock().expect("inbox lock").push(msg);
        inbox.pending.store(true, Ordering::Release);
        if let Some(bells) = self.doorbells.get() {
            bells[shard].notify();
        }
    }
}

impl Shared {
    /// The shard that owns `key`.
    pub fn owner_of(&self, key: &NodePublic, shards: usize) -> usize {
        if shards == 1 {
            return 0;
        }
        match self.config.placement {
            Placement::Random => (self.hasher.hash_one(key.as_bytes()) % shards as u64) as usize,
            Placement::FirstByte => usize::from(key.as_bytes()[0]) % shards,
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
    /// forwardPacket frames to the mesh thread, one ring per mesh link.
    pub mesh_tx: Vec<ByteTx>,
}

#[derive(Default)]
struct KeyEntry {
    conns: Vec<Slot>,
    active: Option<Slot>,
}

enum Op {
    Attach(Slot, TcpStream),
    SetRecv(Slot, bool),
    /// Bound what waits for a rate-limited client (see `limits`).
    LimitRecv(Slot),
    /// Read this socket in kernel-TLS mode (after a move between shards).
    KtlsRx(Slot),
}

/// A shard's own [`ShardMetrics`], reached as `self.m`.
struct OwnMetrics {
    all: Arc<Metrics>,
    id: usize,
}

impl std::ops::Deref for OwnMetrics {
    type Target = ShardMetrics;

    #[inline]
    fn deref(&self) -> &ShardMetrics {
        &self.all.shards[self.id]
    }
}

/// One shard's state; implements the engine's [`Handler`].
pub struct Shard {
    id: usize,
    shards: usize,
    shared: Arc<Shared>,
    /// This shard's counters, the one way to them: a field of its own, so
    /// that a method can count while it holds a connection mutably.
    m: OwnMetrics,
    conns: Slab<Conn>,
    next_gen: u32,
    keys: HashMap<NodePublic, KeyEntry>,
    /// Keys of other nodes of the region, with the mesh links that
    /// announced them, earliest first (see `forward`).
    forward: HashMap<NodePublic, Vec<usize>>,
    /// This shard's side of the mesh links.
    mesh: MeshOut,
    /// Local connections that received from a key, for peerGone.
    receivers: HashMap<NodePublic, Vec<(Slot, u32)>>,
    /// Keys on other shards whose connection is not draining: packets to
    /// them are dropped here rather than carried through a ring only to be
    /// dropped there (see the module doc).
    stuck_remote: HashSet<NodePublic>,
    /// When `probe_pending_sends` last walked the connections.
    last_probe: Option<Instant>,
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
    /// WebSocket output being framed (it then swaps with the control
    /// queue's memory).
    ws_out: Vec<u8>,
    /// Where records of Ferry's TLS record layer are opened (one record's
    /// plaintext; empty until the first), shared by the shard's
    /// connections.
    plain: Vec<u8>,
    /// Send buffers of connections with nothing in flight.
    send_pool: buffers::SendPool,
    /// A ring packet that wrapped around the ring's end, made whole.
    ring_packet: Vec<u8>,
    mail_batch: Vec<Mail>,
    /// Control messages taken from the inbox, handled after the turn.
    control: Vec<Control>,
    /// Payload of WebSocket frames decoded in one read.
    ws_payload: Vec<u8>,
    /// Per-client receive limits now.
    rate: RateConfig,
    /// Connections held by their receive limit, and when to let them go.
    rate_held: Vec<(Slot, u32, Instant)>,
    activity: u64,
    /// Keepalive jitter (seeded by the caller, so tests can fix it).
    jitter: StdRng,
    now: Instant,
    next_sweep: Instant,
    draining: Option<Instant>,
    /// Draining, and every listener's accept has ended (logged once).
    accepts_stopped: bool,
    done: bool,
    /// Queue size past which even paused-sender overshoot is dropped.
    hard_cap: usize,
    /// The client queues' caps (with `hard_cap`).
    caps: Caps,
    log: LogLimiter,
    /// `/debug/clients/` requests waiting for other shards' pages.
    debug_asks: Vec<debug_clients::Ask>,
}

macro_rules! conn_log {
    ($shard:expr, $lvl:ident, $($arg:tt)*) => {
        if $shard.log.allow($shard.now) {
            tracing::$lvl!($($arg)*);
        }
    };
}

mod admit;
mod buffers;
mod control_queue;
mod cross_node;
mod debug_clients;
mod forward;
mod front_door;
mod gate;
mod handoff;
mod input;
mod limits;
mod log_limit;
mod mesh_session;
mod migrate;
mod output;
mod presence;
mod proxied;
mod registry;
mod ring;
mod router;
mod sessions;
mod timers;
mod websocket;

impl Shard {
    /// A shard with its id, the shared state and its rings, created at
    /// `now`. `seed` seeds its keepalive jitter; `max_turn_bytes` is its
    /// driver's [`Driver::max_turn_bytes`] (every shard's is the same).
    pub fn new(
        id: usize,
        shards: usize,
        shared: Arc<Shared>,
        mut rings: Rings,
        now: Instant,
        seed: u64,
        max_turn_bytes: usize,
    ) -> Self {
        let cfg = &shared.config;
        // Per other shard: a full ring plus one turn of reads.
        let per_shard = cfg.ring_bytes + max_turn_bytes;
        let hard_cap = cfg.send_queue_bytes + (shards - 1) * per_shard + frame::MAX_PACKET_SIZE;
        let rate = cfg.rate;
        let caps = Caps {
            disco_packets: cfg.disco_queue_packets as u32,
            data_bytes: cfg.send_queue_bytes,
            hard_bytes: hard_cap,
        };
        let mesh = MeshOut::new(std::mem::take(&mut rings.mesh_tx));
        let m = OwnMetrics {
            all: shared.metrics.clone(),
            id,
        };
        Shard {
            id,
            shards,
            shared,
            m,
            conns: Slab::new(),
            next_gen: 0,
            keys: HashMap::new(),
            forward: HashMap::new(),
            mesh,
            receivers: HashMap::new(),
            stuck_remote: HashSet::new(),
            last_probe: None,
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
            ws_out: Vec::new(),
            plain: Vec::new(),
            send_pool: buffers::SendPool::default(),
            ring_packet: Vec::with_capacity(RingHeader::LEN + frame::MAX_PACKET_SIZE),
            mail_batch: Vec::with_capacity(WORK_LIST_START),
            control: Vec::new(),
            ws_payload: Vec::new(),
            rate,
            rate_held: Vec::new(),
            activity: 0,
            jitter: StdRng::seed_from_u64(seed),
            now,
            next_sweep: now + SWEEP_EVERY,
            draining: None,
            accepts_stopped: false,
            done: false,
            hard_cap,
            caps,
            log: LogLimiter::new(now),
            debug_asks: Vec::new(),
        }
    }

    fn conn_ref(&self, slot: Slot) -> ConnRef {
        ConnRef {
            shard: self.id,
            slot,
            gen: self.conns[slot].gen(),
        }
    }

    fn live(&self, r: ConnRef) -> Option<Slot> {
        match self.conns.get(r.slot) {
            Some(c) if c.gen() == r.gen && c.closed().is_none() => Some(r.slot),
            _ => None,
        }
    }

    fn mark_dirty(&mut self, slot: Slot) {
        if self.conns[slot].mark_dirty() {
            self.dirty.push(slot);
        }
    }

    fn mail(&mut self, shard: usize, mail: Mail) {
        if let Some(tx) = self.rings.msg_tx[shard].as_mut() {
            tx.send(mail);
            self.notify[shard] = true;
        }
    }

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
                    if self.conns.get(slot).is_some_and(|c| c.closed().is_none()) {
                        driver.set_recv(slot, on);
                    }
                }
                Op::LimitRecv(slot) => {
                    if self.conns.get(slot).is_some_and(|c| c.closed().is_none()) {
                        let rtt = driver.rtt(slot).unwrap_or_default();
                        driver.limit_recv(slot, limits::recv_cap(&self.rate, rtt));
                    }
                }
                Op::KtlsRx(slot) => {
                    if let Err(e) = driver.set_ktls_rx(slot) {
                        // The session is in the kernel already: without
                        // record-aware reads it cannot go on.
                        let peer = self.conns[slot].peer();
                        conn_log!(self, info, %peer, error = %e, "kernel TLS connection moved to a back end that cannot read it; closing");
                        self.close(slot, CloseReason::IoError);
                    }
                }
            }
        }
        std::mem::swap(&mut self.ops, &mut ops);
        self.ops.append(&mut ops);
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
    fn rtt(&self, slot: Slot) -> Option<Duration>;
    fn limit_recv(&mut self, slot: Slot, bytes: usize) -> Option<usize>;
    fn stop_accepting(&mut self, listener: usize);
    fn accepting(&self, listener: usize) -> bool;
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
    fn rtt(&self, slot: Slot) -> Option<Duration> {
        Driver::rtt(self, slot)
    }
    fn limit_recv(&mut self, slot: Slot, bytes: usize) -> Option<usize> {
        Driver::limit_recv(self, slot, bytes)
    }
    fn stop_accepting(&mut self, listener: usize) {
        Driver::stop_accepting(self, listener)
    }
    fn accepting(&self, listener: usize) -> bool {
        Driver::accepting(self, listener)
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
                if self.conns.get(slot).is_some_and(|c| c.closed().is_none()) {
                    match error {
                        None => {
                            if self.conns[slot].must_stash() {
                                // Finish what was stashed first; the next
                                // read after resuming reports the end again.
                            } else {
                                self.on_eof(slot);
                            }
                        }
                        Some(e) => {
                            let peer = self.conns[slot].peer();
                            conn_log!(self, debug, %peer, error = %e, "read failed; closing connection");
                            if self.conns[slot].phase() == Phase::Active {
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
        self.handle_control();
        if !self.rate_held.is_empty() {
            self.release_rate_held();
        }
        self.retry_stalled();
        if self.shared.shutdown.load(Ordering::Relaxed) && self.draining.is_none() {
            self.start_drain();
            self.stop_accepting(driver);
        }
        if self.draining.is_some() && !self.accepts_stopped {
            self.note_accepts_stopped(driver);
        }
        if self.now >= self.next_sweep {
            self.next_sweep = self.now + SWEEP_EVERY;
            self.sweep();
            let b = driver.recv_buffers();
            let m = &self.m;
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
        self.flush_mesh();
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
        self.m.turns.inc();
    }

    fn turn_done(&mut self, busy: Duration) {
        self.m.busy_ns.add(busy.as_nanos() as u64);
    }

    fn timeout(&mut self, now: Instant) -> Option<Duration> {
        if !self.dirty.is_empty() || !self.ops.is_empty() || !self.closing.is_empty() {
            return Some(Duration::ZERO);
        }
        let mut t = self.next_sweep.saturating_duration_since(now);
        if !self.stalled.is_empty()
            || !self.migrating.is_empty()
            || self.notify.iter().any(|&n| n)
            || self.mesh.backed_up()
        {
            t = t.min(STALL_RETRY);
        }
        if self.draining.is_some() {
            t = t.min(Duration::from_millis(10));
        }
        if let Some(at) = self.next_budget_check() {
            t = t.min(at.saturating_duration_since(now));
        }
        if let Some(at) = self.rate_held.iter().map(|&(_, _, at)| at).min() {
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
            || self.shared.inboxes[self.id].pending.load(Ordering::Acquire)
            || !self.control.is_empty()
    }

    fn finished(&self) -> bool {
        self.done
    }
}

/// Adds `sign` to the TLS gauges a connection counts in.
fn count_transport(m: &ShardMetrics, conn: &Conn, sign: i64) {
    if conn.transport().is_tls() {
        m.tls_sockets.add(sign);
    }
    if conn.transport().is_kernel() {
        m.ktls_sockets.add(sign);
    }
    if conn.transport().is_records() {
        m.records_sockets.add(sign);
    }
}
