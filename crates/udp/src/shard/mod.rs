//! One shard: a thread, pinned to a core, that owns one socket of every
//! listening group, the bounce clients the kernel sends to it, and its
//! replica of the hub.
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
//! outboxes and tables are reused, and maps only grow when a new bounce
//! client or relay session appears.
//!
//! A socket still full after [`ROUNDS`] batches is revisited next turn
//! without waiting, so one busy socket cannot starve the others (mio is
//! edge-triggered: a socket is drained before it can signal again).

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_engine::mailbox::MsgTx;
use ferry_sys::mmsg::{RecvBatch, RecvMeta, SendBatch, MAX_BATCH};
use ferry_sys::train::Trains;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::hub::{Event, Hub};
use crate::live::SourceRate;
use crate::metrics::ShardMetrics;
use crate::peer_relay::PeerRelays;
use crate::published::Published;
use crate::ratelimit::SourceLimiter;
use crate::session::{self, Sessions};
use crate::socket::SocketOptions;

mod bounce;
mod hub_listener;
mod peer_relay;
mod recv;
mod relay_sessions;
mod send;
mod unanswered;

use bounce::BounceClient;
pub use bounce::{screen_bounce, ClientCap, Route, Screened, TargetCell};
pub use hub_listener::HubPart;
use hub_listener::RingInbox;

/// Batches read from one socket per turn before moving on.
pub const ROUNDS: usize = 8;
/// Timer period: idle sweeps, index expiry, gauges, target changes.
const TICK: Duration = Duration::from_millis(250);
const WAKER: Token = Token(usize::MAX - 1);

/// Tokens from here on are bounce clients' upstream sockets (slab key +
/// base).
const CLIENT_BASE: usize = 1 << 20;

/// What a listening socket is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Clients of bounce route `n`.
    Bounce(usize),
    /// The hub, through its listening address `via`.
    Hub(u16),
    /// The relay-session port ([`crate::session`]).
    RelaySessions,
    /// The peer-relay port ([`crate::peer_relay`]).
    PeerRelay,
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
    pub relay_sessions: Option<Arc<Sessions>>,
    /// Peer-relay endpoints' shared table, if the relay serves them.
    pub peer_relays: Option<Arc<PeerRelays>>,
    /// Options for upstream sockets.
    pub socket_options: SocketOptions,
    /// Use GSO.
    pub gso: bool,
    /// Per source IP: new bounce clients, and initiations through a
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

/// A running shard's state.
pub struct Shard {
    id: usize,
    poll: Poll,
    listeners: Vec<Listener>,
    /// Listener index of each hub `via`.
    hub_listeners: Vec<usize>,
    routes: Arc<Vec<Route>>,
    route_generation: Vec<u64>,
    route_targets: Vec<Option<SocketAddr>>,
    clients: Slab<BounceClient>,
    by_client: HashMap<(usize, SocketAddr), usize>,
    unanswered: unanswered::Unanswered,
    next_serial: u64,
    touched: Vec<usize>,
    hub: Option<Hub>,
    repl_tx: Vec<MsgTx<Event>>,
    relay_sessions: Option<Arc<Sessions>>,
    peer_relays: Option<Arc<PeerRelays>>,
    /// The relay-session port's bind messages, handled outside the
    /// table's lock.
    relay_session_binds: Option<session::port::Binds>,
    /// The peer-relay port's per-source limit on control datagrams.
    peer_relay_controls: Option<crate::peer_relay::port::Controls>,
    socket_options: SocketOptions,
    gso: bool,
    client_limiter: SourceLimiter,
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
            clients: Slab::new(),
            by_client: HashMap::new(),
            unanswered: unanswered::Unanswered::new(routes),
            next_serial: 0,
            touched: Vec::with_capacity(MAX_BATCH),
            hub,
            repl_tx,
            relay_session_binds: setup
                .relay_sessions
                .as_ref()
                .map(|s| session::port::Binds::new(s.limits())),
            relay_sessions: setup.relay_sessions,
            peer_relay_controls: setup
                .peer_relays
                .as_ref()
                .map(|p| crate::peer_relay::port::Controls::new(&p.limits())),
            peer_relays: setup.peer_relays,
            socket_options: setup.socket_options,
            gso: setup.gso,
            client_limiter: SourceLimiter::new(4096, rate, burst),
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
                self.client_limiter = SourceLimiter::new(4096, rate, burst);
                self.handshake_limiter = SourceLimiter::new(4096, rate, burst);
            }
            if let Some(hub) = &mut self.hub {
                hub.sync();
            }
            ready.clear();
            ready.append(&mut self.again);
            ready.extend(events.iter().map(|e| e.token()).filter(|&t| t != WAKER));
            for &token in &ready {
                let more = if token.0 < CLIENT_BASE {
                    match self.listeners.get(token.0).map(|l| l.role) {
                        Some(Role::Bounce(route)) => self.bounce_in(token.0, route),
                        Some(Role::Hub(via)) => self.hub_in(token.0, via),
                        Some(Role::RelaySessions) => self.relay_sessions_in(token.0),
                        Some(Role::PeerRelay) => self.peer_relay_in(token.0),
                        None => false,
                    }
                } else {
                    self.bounce_out(token.0 - CLIENT_BASE)
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

    /// Timers: target changes, idle clients, relay sessions' and the hub's
    /// expiry, gauges.
    fn tick(&mut self) {
        if self.id == 0 {
            if let Some(s) = &self.relay_sessions {
                s.tick(self.now);
            }
            if let Some(p) = &self.peer_relays {
                p.tick(self.now);
                // The port's address probe leaves from the port itself.
                if let Some((to, req)) = p.stun().take_request() {
                    let port = self
                        .listeners
                        .iter()
                        .find(|l| matches!(l.role, Role::PeerRelay));
                    if let Some(Err(e)) = port.map(|l| l.sock.send_to(&req, to)) {
                        tracing::debug!(%to, error = %e, "peer relay: STUN request not sent");
                    }
                }
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
        for (key, s) in &self.clients {
            if self.now.saturating_duration_since(s.last_active) > self.routes[s.route].idle_timeout
            {
                expired.push(key);
            }
        }
        for key in expired {
            self.close_client(key);
            self.metrics.sessions_expired.add(1);
        }
        let clients = &self.clients;
        self.unanswered.prune(|k, serial| {
            clients
                .get(k)
                .is_some_and(|s| s.serial == serial && !s.answered)
        });
        self.metrics.sessions.set(self.clients.len() as i64);
        if let Some(hub) = &mut self.hub {
            hub.expire(self.now);
            let c = hub.counts();
            self.metrics.hub_indices.set(c.wg_sessions as i64);
            self.metrics.hub_pending.set(c.pending as i64);
            self.metrics.hub_known_peers.set(c.known_peers as i64);
            self.metrics.hub_collisions.set(c.collisions as i64);
        }
    }
}
