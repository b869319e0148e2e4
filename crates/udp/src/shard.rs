//! One shard: a thread, pinned to a core, that owns one socket of every
//! listening group, the bounce sessions whose clients the kernel sends to
//! it, and its replica of the hub.
//!
//! A turn: wait for readiness (epoll through mio, bounded so timers run),
//! apply the other shards' hub events, then for each ready socket receive
//! up to [`ROUNDS`] batches. Each batch is received into one buffer by a
//! single `recvmmsg`; every datagram (or GRO run) in it is routed and
//! queued as a span of that buffer in the outbox of the socket it leaves
//! through; then the hub's new events go to the other shards, and every
//! outbox touched is flushed with `sendmmsg` (as GSO trains, by the rules
//! of [`ferry_sys::train`]). Nothing is
//! copied in user space and nothing is allocated per packet: buffers,
//! outboxes and tables are reused, and maps only grow when a new client or
//! session appears.
//!
//! A socket still full after [`ROUNDS`] batches is revisited next turn
//! without waiting, so one busy socket cannot starve the others (mio is
//! edge-triggered: a socket is drained before it can signal again).

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_engine::mailbox::{MsgRx, MsgTx};
use ferry_proto::wireguard as wg;
use ferry_sys::mmsg::{RecvBatch, RecvMeta, SendBatch, MAX_BATCH};
use ferry_sys::train::{Sent, Trains};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::hub::{self, DropReason, Endpoint, Event, Hub, HubSettings, Inbox, Verdict};
use crate::live::SourceRate;
use crate::metrics::{Drop, ShardMetrics};
use crate::published::Published;
use crate::ratelimit::SourceLimiter;
use crate::session::{self, Sessions};
use crate::socket::{self, SocketOptions};

mod unanswered;

/// Batches read from one socket per turn before moving on.
pub const ROUNDS: usize = 8;
/// Most bytes one receive batch should bring in. Each datagram is copied
/// into the shard's buffer by `recvmmsg` and out of it by `sendmmsg` in the
/// same turn; a batch that fits the core's L2 cache (512 KiB on the
/// machines we measure) is still there for the second copy. Sixty-four GRO
/// trains of 64 KiB (4 MiB) are not: with trains, fewer slots are asked
/// for ([`batch_slots`]).
const BATCH_BYTES: usize = 512 << 10;
/// Fewest slots one receive asks for.
const MIN_BATCH: usize = 8;
/// Timer period: idle sweeps, index expiry, gauges, target changes.
const TICK: Duration = Duration::from_millis(250);
const WAKER: Token = Token(usize::MAX - 1);
mod relay_sessions;

/// Tokens from here on are bounce sessions (slab key + base).
const SESSION_BASE: usize = 1 << 20;

/// A bounce target's current address, updated by the resolver thread and
/// read by shards when its generation changes.
pub type TargetCell = Published<SocketAddr>;

/// A bounce route as every shard sees it.
#[derive(Debug)]
pub struct Route {
    /// Where clients are relayed to.
    pub target: Arc<TargetCell>,
    /// Session idle timeout.
    pub idle_timeout: Duration,
    /// Forward only WireGuard-shaped datagrams.
    pub wireguard_only: bool,
    /// The route's sessions on every shard, and their limit.
    pub sessions: Arc<SessionCap>,
}

/// The limit on a bounce route's concurrent sessions, over all shards
/// (`max_sessions`): one count that every shard serving the route shares.
/// A shard takes a place when it opens a session and the place is given
/// back when the session is dropped, whatever removes it (idle expiry, a
/// failed open, the shard stopping). Touched only when a session opens or
/// closes, never per packet.
#[derive(Debug)]
pub struct SessionCap {
    max: usize,
    open: AtomicUsize,
}

impl SessionCap {
    /// A count of none out of `max`.
    pub fn new(max: usize) -> Arc<SessionCap> {
        Arc::new(SessionCap {
            max,
            open: AtomicUsize::new(0),
        })
    }

    /// Sessions open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A place for one more session, unless `max` are open.
    fn take(self: &Arc<Self>) -> Option<SessionPlace> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionPlace(self.clone()))
    }
}

/// One session's place in its route's [`SessionCap`], given back on drop.
#[derive(Debug)]
struct SessionPlace(Arc<SessionCap>);

impl std::ops::Drop for SessionPlace {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a listening socket is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Clients of bounce route `n`.
    Bounce(usize),
    /// The hub, through its listening address `via`.
    Hub(u16),
    /// Relay sessions (`crate::session`).
    Sessions,
}

/// A shard's share of the hub: settings, and the rings to and from every
/// other shard.
pub struct HubPart {
    /// The hub's settings, as published (they change on a reload).
    pub settings: Arc<Published<HubSettings>>,
    /// Rings to the other shards.
    pub tx: Vec<MsgTx<Event>>,
    /// Rings from the other shards.
    pub rx: Vec<MsgRx<Event>>,
}

/// Everything a shard is built from.
pub struct ShardSetup {
    /// Shard number.
    pub id: usize,
    /// This shard's socket of each listening group, with its role.
    pub listeners: Vec<(UdpSocket, Role)>,
    /// Bounce routes, by index.
    pub routes: Arc<Vec<Route>>,
    /// The hub's part, if the relay runs a hub.
    pub hub: Option<HubPart>,
    /// Relay sessions' shared table, if the relay runs them.
    pub sessions: Option<Arc<Sessions>>,
    /// Options for upstream sockets.
    pub socket_options: SocketOptions,
    /// Use GSO.
    pub gso: bool,
    /// Per source IP: new bounce sessions, and initiations through a
    /// bounce, per second and burst (each has its own buckets); they
    /// change on a reload.
    pub source_rate: Arc<Published<SourceRate>>,
    /// Counters.
    pub metrics: Arc<ShardMetrics>,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
    /// The shard's poller (made by the starter so it can hand out the waker).
    pub poll: Poll,
}

struct Listener {
    sock: UdpSocket,
    role: Role,
    outbox: Trains,
    drops_seen: u32,
}

struct Session {
    sock: UdpSocket,
    route: usize,
    listener: usize,
    client: SocketAddr,
    target: SocketAddr,
    last_active: Instant,
    outbox: Trains,
    touched: bool,
    drops_seen: u32,
    /// Tells this session from a later one in the same slab slot.
    serial: u64,
    /// The target sent something back (see [`unanswered`]).
    answered: bool,
    /// Its place in the route's session limit.
    _place: SessionPlace,
}

struct RingInbox(Vec<MsgRx<Event>>);

impl Inbox for RingInbox {
    fn drain(&mut self, apply: &mut dyn FnMut(Event)) {
        for rx in &mut self.0 {
            while let Some(ev) = rx.recv() {
                apply(ev);
            }
        }
    }
}

/// How many slots the next receive should ask for, after one that
/// brought `n` slots of `bytes` in all while asking for `asked`: as many as
/// keep a batch of slots that size within [`BATCH_BYTES`], between
/// [`MIN_BATCH`] and [`MAX_BATCH`]. Single datagrams (1.5 KiB a slot) keep
/// the full batch; GRO trains of 64 KiB get eight.
fn batch_slots(n: usize, bytes: usize, asked: usize) -> usize {
    if n == 0 || bytes == 0 {
        return asked;
    }
    (BATCH_BYTES * n / bytes).clamp(MIN_BATCH, MAX_BATCH)
}

/// What [`screen_bounce`] decided for part of a received slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screened {
    /// Forward `len` bytes from offset `start` of the slot: whole
    /// datagrams of the slot's segment size (the last may be shorter).
    Pass {
        /// Offset in the slot.
        start: usize,
        /// Bytes.
        len: usize,
    },
    /// Drop one datagram.
    Drop(DropReason),
}

/// Screens one received slot of a bounce route: `slot` holds datagrams of
/// `seg` bytes each, glued by GRO, of which only the last may be shorter
/// (`seg == slot.len()` for a single datagram).
///
/// Every datagram that may be a WireGuard initiation (148 bytes) is
/// classified, and an initiation passes only if `allow_initiation` grants
/// it (the per-source handshake limit, so one client cannot use up the
/// server's handshake budget for everyone behind the relay). That includes
/// a 148-byte initiation at the end of a train of larger datagrams, where
/// the segment size is not 148. On a `wireguard_only` route every datagram
/// is classified and the ones that are not WireGuard are dropped.
///
/// `out` gets, in order, runs of datagrams to forward and one drop per
/// refused datagram; runs are as long as the refusals allow, so a slot with
/// nothing to refuse passes as one run (one GSO message).
pub fn screen_bounce(
    slot: &[u8],
    seg: usize,
    wireguard_only: bool,
    mut allow_initiation: impl FnMut() -> bool,
    mut out: impl FnMut(Screened),
) {
    let seg = seg.max(1);
    let mut run = 0;
    let mut at = 0;
    while at < slot.len() {
        let len = seg.min(slot.len() - at);
        if wireguard_only || len == wg::INITIATION_LEN {
            let refused = match wg::classify(&slot[at..at + len]) {
                Ok(wg::Message::Initiation { .. }) if !allow_initiation() => {
                    Some(DropReason::RateLimited)
                }
                Err(_) if wireguard_only => Some(DropReason::NotWireGuard),
                _ => None,
            };
            if let Some(why) = refused {
                if run < at {
                    out(Screened::Pass {
                        start: run,
                        len: at - run,
                    });
                }
                out(Screened::Drop(why));
                run = at + len;
            }
        }
        at += len;
    }
    if run < slot.len() {
        out(Screened::Pass {
            start: run,
            len: slot.len() - run,
        });
    }
}

/// Calls `f(source, offset, length, segment)` for each slot of a received
/// batch (`meta`, slots of `slot` bytes): one datagram, or a GRO train of
/// datagrams of `segment` bytes (the last may be shorter) from one source;
/// truncated slots are counted and skipped.
fn each_train(
    meta: &[RecvMeta],
    slot: usize,
    metrics: &ShardMetrics,
    mut f: impl FnMut(SocketAddr, usize, usize, usize),
) {
    for (i, m) in meta.iter().enumerate() {
        let Some(src) = m.src else { continue };
        if m.truncated {
            metrics.count_drop(Drop::Truncated, 1);
            continue;
        }
        f(src, i * slot, m.len, m.segment.max(1));
    }
}

/// Calls `f(offset, length)` for each datagram of a train of `len` bytes
/// at `start`, `seg` bytes each but the last.
fn each_datagram(start: usize, len: usize, seg: usize, mut f: impl FnMut(usize, usize)) {
    let mut at = start;
    while at < start + len {
        let n = seg.min(start + len - at);
        f(at, n);
        at += n;
    }
}

/// Consecutive datagrams of one train that go to the same place, gathered
/// into one span so they are queued with one [`Trains::push`] (one GSO
/// message) instead of one each.
struct Run<K> {
    to: K,
    start: usize,
    len: usize,
}

impl<K: Copy + PartialEq> Run<K> {
    /// Adds the datagram at `start` (`len` bytes) bound for `to`: to this
    /// run if it continues it, else it starts a new run and the finished
    /// one is handed to `queue`.
    fn add(run: &mut Option<Self>, to: K, start: usize, len: usize, queue: impl FnOnce(Self)) {
        if let Some(r) = run {
            if r.to == to && r.start + r.len == start {
                r.len += len;
                return;
            }
        }
        if let Some(done) = run.replace(Run { to, start, len }) {
            queue(done);
        }
    }
}

/// The outbox of the hub listener through which datagrams for `via` leave.
fn hub_outbox<'a>(
    listeners: &'a mut [Listener],
    hub_listeners: &[usize],
    via: u16,
) -> Option<&'a mut Trains> {
    let &out = hub_listeners.get(usize::from(via))?;
    listeners.get_mut(out).map(|l| &mut l.outbox)
}

/// Which flow a flush counts in.
#[derive(Clone, Copy)]
enum Out {
    Client,
    Target,
    Hub,
    Sessions,
}

/// A running shard's state.
pub struct Shard {
    id: usize,
    poll: Poll,
    listeners: Vec<Listener>,
    /// Listener index of each hub `via`.
    hub_listeners: Vec<usize>,
    routes: Arc<Vec<Route>>,
    route_generation: Vec<u64>,
    route_targets: Vec<SocketAddr>,
    sessions: Slab<Session>,
    by_client: HashMap<(usize, SocketAddr), usize>,
    unanswered: unanswered::Unanswered,
    next_serial: u64,
    touched: Vec<usize>,
    hub: Option<Hub>,
    repl_tx: Vec<MsgTx<Event>>,
    relay_sessions: Option<Arc<Sessions>>,
    /// The session port's bind messages, handled outside the table's lock.
    session_binds: Option<session::port::Binds>,
    socket_options: SocketOptions,
    gso: bool,
    session_limiter: SourceLimiter,
    handshake_limiter: SourceLimiter,
    source_rate: Arc<Published<SourceRate>>,
    /// Generation of `source_rate` the limiters were made from.
    rate_seen: u64,
    buf: Vec<u8>,
    slot: usize,
    meta: Vec<RecvMeta>,
    /// Slots the next receive asks for ([`batch_slots`]).
    want: usize,
    /// Slots the last receive asked for: a batch that filled them means
    /// the socket may hold more.
    asked: usize,
    rx: RecvBatch,
    tx: SendBatch,
    again: Vec<Token>,
    metrics: Arc<ShardMetrics>,
    stop: Arc<AtomicBool>,
    now: Instant,
    last_warning: Option<Instant>,
}

impl Shard {
    /// Registers the sockets; call on the shard's own thread.
    pub fn new(setup: ShardSetup) -> io::Result<Shard> {
        let gro = setup.socket_options.gro;
        // A GRO slot holds up to 64 KiB of coalesced datagrams; without GRO
        // a slot only needs one datagram (jumbo frames included).
        let slot = if gro { 65536 } else { 9216 };
        let mut listeners = Vec::new();
        let mut hub_listeners = Vec::new();
        for (i, (sock, role)) in setup.listeners.into_iter().enumerate() {
            setup.poll.registry().register(
                &mut SourceFd(&sock.as_raw_fd()),
                Token(i),
                Interest::READABLE,
            )?;
            if let Role::Hub(via) = role {
                let via = usize::from(via);
                if hub_listeners.len() <= via {
                    hub_listeners.resize(via + 1, usize::MAX);
                }
                hub_listeners[via] = i;
            }
            listeners.push(Listener {
                sock,
                role,
                outbox: Trains::new(),
                drops_seen: 0,
            });
        }
        let (hub, repl_tx) = match setup.hub {
            Some(HubPart { settings, tx, rx }) => {
                let mut hub = Hub::new(setup.id as u8, settings.get(), Box::new(RingInbox(rx)));
                hub.follow(settings);
                (Some(hub), tx)
            }
            None => (None, Vec::new()),
        };
        let (rate, burst) = *setup.source_rate.get();
        let routes = setup.routes.len();
        let route_targets = setup.routes.iter().map(|r| *r.target.get()).collect();
        let route_generation = setup.routes.iter().map(|r| r.target.generation()).collect();
        Ok(Shard {
            id: setup.id,
            poll: setup.poll,
            listeners,
            hub_listeners,
            routes: setup.routes,
            route_generation,
            route_targets,
            sessions: Slab::new(),
            by_client: HashMap::new(),
            unanswered: unanswered::Unanswered::new(routes),
            next_serial: 0,
            touched: Vec::with_capacity(MAX_BATCH),
            hub,
            repl_tx,
            session_binds: setup
                .sessions
                .as_ref()
                .map(|s| session::port::Binds::new(s.limits())),
            relay_sessions: setup.sessions,
            socket_options: setup.socket_options,
            gso: setup.gso,
            session_limiter: SourceLimiter::new(4096, rate, burst),
            handshake_limiter: SourceLimiter::new(4096, rate, burst),
            rate_seen: setup.source_rate.generation(),
            source_rate: setup.source_rate,
            buf: vec![0u8; slot * MAX_BATCH],
            slot,
            meta: vec![RecvMeta::default(); MAX_BATCH],
            want: MAX_BATCH,
            asked: MAX_BATCH,
            rx: RecvBatch::new(),
            tx: SendBatch::new(),
            again: Vec::new(),
            metrics: setup.metrics,
            stop: setup.stop,
            now: Instant::now(),
            last_warning: None,
        })
    }

    /// Makes a waker for a poller (before it moves into its shard).
    pub fn waker(poll: &Poll) -> io::Result<Waker> {
        Waker::new(poll.registry(), WAKER)
    }

    /// Runs until the stop flag is set.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut ready: Vec<Token> = Vec::with_capacity(256);
        let mut next_tick = Instant::now() + TICK;
        while !self.stop.load(Ordering::Relaxed) {
            let timeout = if self.again.is_empty() {
                next_tick.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(shard = self.id, error = %e, "poll failed; shard stops");
                    return;
                }
            }
            self.now = Instant::now();
            // A reload publishes new limits; the hub takes its new
            // settings in `sync`.
            let generation = self.source_rate.generation();
            if generation != self.rate_seen {
                self.rate_seen = generation;
                let (rate, burst) = *self.source_rate.get();
                self.session_limiter = SourceLimiter::new(4096, rate, burst);
                self.handshake_limiter = SourceLimiter::new(4096, rate, burst);
            }
            if let Some(hub) = &mut self.hub {
                hub.sync();
            }
            ready.clear();
            ready.append(&mut self.again);
            ready.extend(events.iter().map(|e| e.token()).filter(|&t| t != WAKER));
            for &token in &ready {
                let more = if token.0 < SESSION_BASE {
                    match self.listeners.get(token.0).map(|l| l.role) {
                        Some(Role::Bounce(route)) => self.bounce_in(token.0, route),
                        Some(Role::Hub(via)) => self.hub_in(token.0, via),
                        Some(Role::Sessions) => self.sessions_in(token.0),
                        None => false,
                    }
                } else {
                    self.bounce_out(token.0 - SESSION_BASE)
                };
                if more && !self.again.contains(&token) {
                    self.again.push(token);
                }
            }
            for tx in &mut self.repl_tx {
                tx.flush();
            }
            if self.now >= next_tick {
                self.tick();
                next_tick = self.now + TICK;
            }
        }
    }

    fn warn(&mut self, what: &str, error: &io::Error) {
        let quiet = self
            .last_warning
            .is_some_and(|t| self.now.saturating_duration_since(t) < Duration::from_secs(10));
        if !quiet {
            self.last_warning = Some(self.now);
            tracing::warn!(shard = self.id, error = %error, "{what}");
        }
    }

    /// One `recvmmsg` on `sock` into the shard buffer. `Ok(0)`: nothing.
    fn recv(&mut self, which: Option<usize>, session: Option<usize>) -> usize {
        let sock = match (which, session) {
            (Some(l), _) => &self.listeners[l].sock,
            (None, Some(k)) => &self.sessions[k].sock,
            _ => return 0,
        };
        let asked = self.want;
        match self.rx.recv(
            sock.as_fd(),
            &mut self.buf,
            self.slot,
            &mut self.meta[..asked],
        ) {
            Ok(n) => {
                self.metrics.recv_calls.add(1);
                self.asked = asked;
                let bytes = self.meta[..n].iter().map(|m| m.len).sum();
                self.want = batch_slots(n, bytes, asked);
                // The drop counter is cumulative per socket: count the growth.
                let seen = match (which, session) {
                    (Some(l), _) => &mut self.listeners[l].drops_seen,
                    (None, Some(k)) => &mut self.sessions[k].drops_seen,
                    _ => unreachable!(),
                };
                for m in &self.meta[..n] {
                    if let Some(d) = m.drops {
                        if d > *seen {
                            self.metrics.socket_drops.add(u64::from(d - *seen));
                            *seen = d;
                        }
                    }
                    if m.segment < m.len {
                        self.metrics
                            .gro_datagrams
                            .add(m.len.div_ceil(m.segment.max(1)) as u64);
                    }
                }
                n
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            // A connected upstream socket reports ICMP errors here; the
            // error is consumed, the socket stays usable.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => usize::MAX,
            Err(e) => {
                self.warn("receiving failed", &e);
                0
            }
        }
    }

    fn account(&mut self, f: &Sent, out: Out) {
        self.metrics.send_calls.add(f.calls);
        self.metrics.gso_messages.add(f.gso_messages);
        match out {
            Out::Client => self.metrics.to_client.add(f.sent, f.bytes),
            Out::Target => self.metrics.to_target.add(f.sent, f.bytes),
            Out::Hub => self.metrics.hub_out.add(f.sent, f.bytes),
            Out::Sessions => self.metrics.relay_session_out.add(f.sent, f.bytes),
        }
        if f.unsent > 0 {
            self.metrics.count_drop(Drop::SendBufferFull, f.unsent);
        }
        self.metrics.gso_fallbacks.add(f.fallbacks);
        if f.failed > 0 {
            self.metrics.count_drop(Drop::SendFailed, f.failed);
        }
        if f.gso_refused && self.gso {
            self.gso = false;
            tracing::warn!(
                shard = self.id,
                "the network device refused a GSO send: sending datagrams one by one from now on"
            );
        }
    }

    /// Client datagrams arriving on a bounce listener.
    fn bounce_in(&mut self, li: usize, route: usize) -> bool {
        for _ in 0..ROUNDS {
            let n = self.recv(Some(li), None);
            if n == 0 || n == usize::MAX {
                return false;
            }
            for i in 0..n {
                let m = self.meta[i];
                let Some(src) = m.src else { continue };
                if m.truncated {
                    self.metrics.count_drop(Drop::Truncated, 1);
                    continue;
                }
                let key = match self.by_client.get(&(route, src)) {
                    Some(&k) => k,
                    None => match self.open_session(route, li, src) {
                        Some(k) => k,
                        None => continue,
                    },
                };
                let start = i * self.slot;
                let seg = m.segment.max(1);
                let s = &mut self.sessions[key];
                s.last_active = self.now;
                let wireguard_only = self.routes[route].wireguard_only;
                let limiter = &mut self.handshake_limiter;
                let now = self.now;
                let (metrics, gso) = (&self.metrics, self.gso);
                screen_bounce(
                    &self.buf[start..start + m.len],
                    seg,
                    wireguard_only,
                    || limiter.allow(src.ip(), now),
                    |screened| match screened {
                        Screened::Pass { start: at, len } => {
                            s.outbox.push(None, start + at, len, seg, gso)
                        }
                        Screened::Drop(why) => metrics.count_drop(Drop::Hub(why), 1),
                    },
                );
                if !s.touched {
                    s.touched = true;
                    self.touched.push(key);
                }
            }
            let mut touched = std::mem::take(&mut self.touched);
            for &key in &touched {
                let s = &mut self.sessions[key];
                s.touched = false;
                let f = s.outbox.flush(s.sock.as_fd(), &self.buf, &mut self.tx);
                self.account(&f, Out::Target);
            }
            touched.clear();
            self.touched = touched;
            if n < self.asked {
                return false;
            }
        }
        true
    }

    fn open_session(&mut self, route: usize, li: usize, client: SocketAddr) -> Option<usize> {
        if !self.session_limiter.allow(client.ip(), self.now) {
            self.metrics.count_drop(Drop::SessionRate, 1);
            return None;
        }
        // Dropped on any refusal below, which gives the place back. At the
        // limit, the oldest session nobody answered may give way.
        let Some(place) = self.routes[route].sessions.take().or_else(|| {
            let sessions = &self.sessions;
            let live = |k: usize, serial| {
                sessions
                    .get(k)
                    .is_some_and(|s| s.serial == serial && !s.answered)
            };
            let key = self.unanswered.take_oldest(route, self.now, live)?;
            self.close_session(key);
            self.metrics.sessions_evicted.add(1);
            self.routes[route].sessions.take()
        }) else {
            self.metrics.count_drop(Drop::SessionLimit, 1);
            return None;
        };
        let target = self.route_targets[route];
        let sock = match socket::upstream(target, 0, &self.socket_options) {
            Ok(s) => s,
            Err(e) => {
                self.metrics.count_drop(Drop::SessionFailed, 1);
                self.warn("cannot open an upstream socket for a new client", &e);
                return None;
            }
        };
        let entry = self.sessions.vacant_entry();
        let key = entry.key();
        let serial = self.next_serial;
        if let Err(e) = self.poll.registry().register(
            &mut SourceFd(&sock.as_raw_fd()),
            Token(SESSION_BASE + key),
            Interest::READABLE,
        ) {
            self.metrics.count_drop(Drop::SessionFailed, 1);
            self.warn("cannot register an upstream socket", &e);
            return None;
        }
        tracing::debug!(shard = self.id, %client, %target, upstream = ?sock.local_addr().ok(), "new bounce session");
        entry.insert(Session {
            sock,
            route,
            listener: li,
            client,
            target,
            last_active: self.now,
            outbox: Trains::new(),
            touched: false,
            drops_seen: 0,
            serial,
            answered: false,
            _place: place,
        });
        self.next_serial += 1;
        self.unanswered.opened(route, key, serial, self.now);
        self.by_client.insert((route, client), key);
        self.metrics.sessions_opened.add(1);
        Some(key)
    }

    /// Target datagrams arriving on a session's upstream socket.
    fn bounce_out(&mut self, key: usize) -> bool {
        if !self.sessions.contains(key) {
            return false;
        }
        for _ in 0..ROUNDS {
            let n = self.recv(None, Some(key));
            if n == usize::MAX {
                continue;
            }
            if n == 0 {
                return false;
            }
            let s = &mut self.sessions[key];
            s.last_active = self.now;
            s.answered = true;
            let (li, client) = (s.listener, s.client);
            let l = &mut self.listeners[li];
            for (i, m) in self.meta[..n].iter().enumerate() {
                if m.truncated {
                    self.metrics.count_drop(Drop::Truncated, 1);
                    continue;
                }
                l.outbox.push(
                    Some(client),
                    i * self.slot,
                    m.len,
                    m.segment.max(1),
                    self.gso,
                );
            }
            let f = l.outbox.flush(l.sock.as_fd(), &self.buf, &mut self.tx);
            self.account(&f, Out::Client);
            if n < self.asked {
                return false;
            }
        }
        true
    }

    /// Peer datagrams arriving on a hub listener.
    fn hub_in(&mut self, li: usize, via: u16) -> bool {
        for _ in 0..ROUNDS {
            let n = self.recv(Some(li), None);
            if n == 0 || n == usize::MAX {
                return false;
            }
            let Some(hub) = self.hub.as_mut() else {
                return false;
            };
            let (listeners, hub_listeners) = (&mut self.listeners, &self.hub_listeners);
            let (buf, metrics, now, gso) = (&self.buf, &self.metrics, self.now, self.gso);
            each_train(
                &self.meta[..n],
                self.slot,
                metrics,
                |src, start, len, seg| {
                    metrics.hub_in.add(len.div_ceil(seg) as u64, len as u64);
                    let mut train = hub::Train::default();
                    let mut run: Option<Run<Endpoint>> = None;
                    let queue = |listeners: &mut [Listener], r: Run<Endpoint>| {
                        if let Some(o) = hub_outbox(listeners, hub_listeners, r.to.via) {
                            o.push(Some(r.to.addr), r.start, r.len, seg, gso);
                        }
                    };
                    each_datagram(start, len, seg, |at, n| {
                        let dgram = &buf[at..at + n];
                        if let Some(&t) = dgram.first() {
                            if (1..=4).contains(&t) {
                                metrics.hub_kinds[usize::from(t)].add(1);
                            }
                        }
                        match hub.route_in_train(now, src, via, dgram, &mut train) {
                            Verdict::Forward(ep) => {
                                Run::add(&mut run, ep, at, n, |r| queue(listeners, r));
                            }
                            Verdict::Flood => {
                                if let Some(r) = run.take() {
                                    queue(listeners, r);
                                }
                                for &ep in hub.flood_targets() {
                                    if let Some(o) = hub_outbox(listeners, hub_listeners, ep.via) {
                                        o.push(Some(ep.addr), at, n, n, gso);
                                    }
                                }
                            }
                            Verdict::Drop(why) => metrics.count_drop(Drop::Hub(why), 1),
                        }
                    });
                    if let Some(r) = run {
                        queue(listeners, r);
                    }
                    hub.end_train(&mut train);
                },
            );
            // Other shards must know what this batch taught us before its
            // datagrams leave: replies to them may land there.
            if hub.has_events() {
                for ev in hub.take_events() {
                    for tx in &mut self.repl_tx {
                        tx.send(ev);
                    }
                }
            }
            for k in 0..self.hub_listeners.len() {
                let out = self.hub_listeners[k];
                if out == usize::MAX || self.listeners[out].outbox.is_empty() {
                    continue;
                }
                let l = &mut self.listeners[out];
                let f = l.outbox.flush(l.sock.as_fd(), &self.buf, &mut self.tx);
                self.account(&f, Out::Hub);
            }
            if n < self.asked {
                return false;
            }
        }
        true
    }

    /// Timers: target changes, idle sessions, hub expiry, gauges.
    fn tick(&mut self) {
        if self.id == 0 {
            if let Some(s) = &self.relay_sessions {
                s.tick(self.now);
            }
        }
        for r in 0..self.routes.len() {
            let generation = self.routes[r].target.generation();
            if generation != self.route_generation[r] {
                self.route_generation[r] = generation;
                self.route_targets[r] = *self.routes[r].target.get();
                self.retarget(r);
            }
        }
        let mut expired = Vec::new();
        for (key, s) in &self.sessions {
            if self.now.saturating_duration_since(s.last_active) > self.routes[s.route].idle_timeout
            {
                expired.push(key);
            }
        }
        for key in expired {
            self.close_session(key);
            self.metrics.sessions_expired.add(1);
        }
        let sessions = &self.sessions;
        self.unanswered.prune(|k, serial| {
            sessions
                .get(k)
                .is_some_and(|s| s.serial == serial && !s.answered)
        });
        self.metrics.sessions.set(self.sessions.len() as i64);
        if let Some(hub) = &mut self.hub {
            hub.expire(self.now);
            let c = hub.counts();
            self.metrics.hub_indices.set(c.wg_sessions as i64);
            self.metrics.hub_pending.set(c.pending as i64);
            self.metrics.hub_known_peers.set(c.known_peers as i64);
            self.metrics.hub_collisions.set(c.collisions as i64);
        }
    }

    fn close_session(&mut self, key: usize) {
        let s = self.sessions.remove(key);
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&s.sock.as_raw_fd()));
        self.by_client.remove(&(s.route, s.client));
        self.again.retain(|t| t.0 != SESSION_BASE + key);
        tracing::debug!(shard = self.id, client = %s.client, "bounce session closed");
    }

    /// Points every session of route `r` at its new target. The upstream
    /// socket keeps its local port, so the server's view of the client
    /// does not change: it is re-connected in place when the kernel would
    /// send from the same local address, and replaced by a socket on the
    /// same port otherwise (a connected UDP socket keeps the source
    /// address it was first given, which the new route may not reach).
    fn retarget(&mut self, r: usize) {
        let target = self.route_targets[r];
        let source = socket::route_source(target).ok();
        let keys: Vec<usize> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.route == r && s.target != target)
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            let s = &mut self.sessions[key];
            let local = s.sock.local_addr().ok();
            let same_source = local.is_some_and(|l| Some(l.ip()) == source);
            if same_source
                && socket2::SockRef::from(&s.sock)
                    .connect(&target.into())
                    .is_ok()
            {
                s.target = target;
                self.metrics.sessions_retargeted.add(1);
                continue;
            }
            let port = local.map_or(0, |l| l.port());
            match self.replace_upstream(key, target, port) {
                Ok(()) => self.metrics.sessions_retargeted.add(1),
                Err(e) => self.warn("cannot move a session to the new target", &e),
            }
        }
        tracing::info!(shard = self.id, %target, "bounce sessions now go to the re-resolved target");
    }

    /// Gives session `key` a new upstream socket connected to `target`, on
    /// local port `port` if it can be had, else on any port. The old
    /// socket is closed first, to free its port.
    fn replace_upstream(&mut self, key: usize, target: SocketAddr, port: u16) -> io::Result<()> {
        let token = Token(SESSION_BASE + key);
        let registry = self.poll.registry();
        let s = &mut self.sessions[key];
        registry.deregister(&mut SourceFd(&s.sock.as_raw_fd()))?;
        // An unconnected stand-in takes the old socket's place meanwhile;
        // if everything below fails, the session idles out.
        let stand_in = UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
        drop(std::mem::replace(&mut s.sock, stand_in));
        let sock = socket::upstream(target, port, &self.socket_options)
            .or_else(|_| socket::upstream(target, 0, &self.socket_options))?;
        registry.register(&mut SourceFd(&sock.as_raw_fd()), token, Interest::READABLE)?;
        s.sock = sock;
        s.target = target;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_of_trains_are_cut_to_the_cache_budget() {
        // Single datagrams keep the full batch.
        assert_eq!(
            batch_slots(MAX_BATCH, MAX_BATCH * 1400, MAX_BATCH),
            MAX_BATCH
        );
        // 64 KiB trains: eight slots (512 KiB), and staying there.
        assert_eq!(batch_slots(MAX_BATCH, MAX_BATCH * 65_536, MAX_BATCH), 8);
        assert_eq!(batch_slots(8, 8 * 65_536, 8), 8);
        // 16 KiB trains: 32 slots; back to the full batch when they shrink.
        assert_eq!(batch_slots(8, 8 * 16_384, 8), 32);
        assert_eq!(batch_slots(32, 32 * 1400, 32), MAX_BATCH);
        // Nothing received: ask for as many as before.
        assert_eq!(batch_slots(0, 0, 8), 8);
    }

    fn initiation() -> Vec<u8> {
        let mut m = vec![0x11u8; wg::INITIATION_LEN];
        m[..4].copy_from_slice(&[1, 0, 0, 0]);
        m
    }

    fn transport(len: usize) -> Vec<u8> {
        let mut m = vec![0xd0u8; len];
        m[..4].copy_from_slice(&[4, 0, 0, 0]);
        m
    }

    /// Screens `slot` with a limiter that grants `tokens` initiations;
    /// returns what `out` got and how many initiations were asked about.
    fn screen(slot: &[u8], seg: usize, wg_only: bool, tokens: usize) -> (Vec<Screened>, usize) {
        let mut asked = 0;
        let mut got = Vec::new();
        screen_bounce(
            slot,
            seg,
            wg_only,
            || {
                asked += 1;
                asked <= tokens
            },
            |s| got.push(s),
        );
        (got, asked)
    }

    #[test]
    fn a_session_cap_is_shared_and_its_places_come_back() {
        let cap = SessionCap::new(3);
        // Two shards racing for places: three in all, never more.
        let held: Vec<Vec<SessionPlace>> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..2)
                .map(|_| scope.spawn(|| (0..100).filter_map(|_| cap.take()).collect()))
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(held.iter().map(Vec::len).sum::<usize>(), 3);
        assert_eq!(cap.open(), 3);
        assert!(cap.take().is_none(), "full");
        // A session dropped (closed, expired, or its shard stopped) gives
        // its place back, and only its own.
        let mut held: Vec<SessionPlace> = held.into_iter().flatten().collect();
        held.pop();
        assert_eq!(cap.open(), 2);
        held.push(cap.take().expect("a place came back"));
        assert!(cap.take().is_none());
        drop(held);
        assert_eq!(cap.open(), 0);
    }

    #[test]
    fn an_initiation_ending_a_train_of_larger_datagrams_is_counted() {
        // Issue 19: three 200-byte transport datagrams, then an initiation,
        // glued by GRO with a segment size of 200.
        let slot = [transport(200), transport(200), transport(200), initiation()].concat();
        let (got, asked) = screen(&slot, 200, false, 0);
        assert_eq!(asked, 1, "the initiation was looked at");
        assert_eq!(
            got,
            [
                Screened::Pass { start: 0, len: 600 },
                Screened::Drop(DropReason::RateLimited)
            ]
        );
        // With a token left it passes, and the train stays one run.
        let (got, asked) = screen(&slot, 200, false, 1);
        assert_eq!(asked, 1);
        assert_eq!(got, [Screened::Pass { start: 0, len: 748 }]);
    }

    #[test]
    fn every_initiation_of_a_148_byte_train_is_counted() {
        let init = initiation();
        // A 148-byte transport datagram is not an initiation: never counted.
        let slot = [init.clone(), transport(148), init.clone(), init].concat();
        let (got, asked) = screen(&slot, 148, false, 1);
        assert_eq!(asked, 3);
        assert_eq!(
            got,
            [
                Screened::Pass { start: 0, len: 296 },
                Screened::Drop(DropReason::RateLimited),
                Screened::Drop(DropReason::RateLimited)
            ]
        );
    }

    #[test]
    fn other_trains_pass_whole_without_asking() {
        // Neither the segment size nor the last datagram is 148 bytes.
        let slot = [transport(200), transport(200), transport(150)].concat();
        assert_eq!(
            screen(&slot, 200, false, 0),
            (vec![Screened::Pass { start: 0, len: 550 }], 0)
        );
        // Not WireGuard at all, on a route that does not care.
        assert_eq!(
            screen(b"hello", 5, false, 0),
            (vec![Screened::Pass { start: 0, len: 5 }], 0)
        );
    }

    #[test]
    fn wireguard_only_routes_drop_the_rest_datagram_by_datagram() {
        let mut junk = transport(100);
        junk[0] = 9;
        let slot = [transport(100), junk, transport(100), transport(60)].concat();
        let (got, asked) = screen(&slot, 100, true, 0);
        assert_eq!(asked, 0);
        assert_eq!(
            got,
            [
                Screened::Pass { start: 0, len: 100 },
                Screened::Drop(DropReason::NotWireGuard),
                Screened::Pass {
                    start: 200,
                    len: 160
                }
            ]
        );
        // A short, unclassifiable tail of a train.
        let slot = [transport(100), vec![4, 0, 0]].concat();
        assert_eq!(
            screen(&slot, 100, true, 0).0,
            [
                Screened::Pass { start: 0, len: 100 },
                Screened::Drop(DropReason::NotWireGuard)
            ]
        );
    }
}
