//! The receiver-index hub's routing state, without I/O.
//!
//! Peers are stock WireGuard. Each is configured with the hub as the
//! endpoint of every other peer, so the hub sees every datagram between
//! them and must decide, from the clear-text fields alone, where each one
//! goes. [`Hub::route`] takes a datagram, its source and the time, and
//! returns a [`Verdict`]; it never touches a socket or a clock.
//!
//! How routes are learned:
//!
//! 1. **Initiation** (type 1) from address X with sender index `i`. Its
//!    MAC1 is keyed with the *recipient's* public key, so trying each
//!    configured key names the recipient R. The hub remembers
//!    `pending[i] = (X, R)` and forwards the initiation to R's endpoint.
//!    When R's endpoint is not known yet (nobody has heard from R), it is
//!    sent to the few recently seen unidentified sources instead (a bounded,
//!    rate-limited flood: a peer that is not R drops it, since its MAC1 does
//!    not match); if there are none, it is dropped and X becomes such a
//!    candidate, so R's own initiation will reach X.
//! 2. **Response** (type 2) from Y with sender `r` and receiver `i`: it
//!    answers `pending[i]`. Its MAC1 is keyed with the *initiator's* key,
//!    which names the initiator I. Now the hub knows: X is I, Y is R, and
//!    the session uses index `i` (owned by I, data to it comes from R) and
//!    `r` (owned by R, data from I). Both endpoints are committed, both
//!    indices recorded, and the response goes to X. A response is accepted
//!    only if the pair is allowed to talk.
//! 3. **Cookie reply** (type 3) to index `i`: goes to whoever owns `i`
//!    (the pending initiator, or a session's owner), and only if it comes
//!    from that handshake's other side.
//! 4. **Transport** (type 4) to index `k`: goes to `k`'s owner. If it comes
//!    from somewhere other than the partner's committed endpoint (the
//!    partner roamed, or someone is spoofing), it is still forwarded (the
//!    owner authenticates it and drops forgeries), but the new address is
//!    committed as the partner's endpoint only after
//!    [`ROAM_CONFIRMATIONS`] packets from it whose counters rise above
//!    every counter seen on that index: replayed packets never move an
//!    endpoint. An address already known as a different peer cannot use
//!    someone else's index at all.
//!
//! Indices expire on WireGuard's own clock: a session's keys are refused by
//! both peers [`SESSION_LIFETIME`] after the handshake (REJECT_AFTER_TIME,
//! plus slack), and a handshake that got no response is forgotten after
//! [`PENDING_LIFETIME`]. Because each kind's lifetime is fixed, expiry is
//! one FIFO queue per kind, not a scan (one queue for both would hold a
//! short-lived pending entry behind a session queued before it).
//!
//! The table has a cap. Initiations from strangers (sources that are no
//! configured peer's endpoint) may fill it only up to all but a quarter
//! ([`STRANGER_RESERVE`]): MAC1 proves only that the sender knows the
//! recipient's public key, so a flood of valid initiations from many
//! sources must leave room for the known peers' next handshakes.
//!
//! Index collisions: WireGuard picks indices at random per interface, so
//! two peers may pick the same one. Each index holds up to two entries; a
//! transport message is matched by also comparing its source with each
//! entry's partner. When a third entry arrives, the oldest one goes.
//!
//! ## Shards
//!
//! The relay runs one [`Hub`] per shard (one per core, each with its own
//! `SO_REUSEPORT` socket), and the kernel spreads peers over shards by
//! their address. The state is *replicated*: every change a shard makes is
//! an [`Event`], applied locally and queued in [`Hub::take_events`] for the
//! other shards, which apply it with [`Hub::apply`] (endpoints carry a
//! version so replicas converge whatever the order). The shard pushes its
//! events to the other shards' rings *before* sending the datagrams of the
//! same batch, so when a reply provoked by a forwarded datagram reaches
//! another shard, the event that explains it is already in that shard's
//! ring; a lookup that misses drains the [`Inbox`] and tries again once.
//! Data packets — nearly all the traffic — are looked up in the local
//! replica with no lock and no message. Handshakes, rare by comparison,
//! pay for the replication. (Steering every packet to an index-owner shard
//! instead would cost a cross-core copy per data packet, and GRO can glue
//! datagrams for different indices into one receive.)
//!
//! ## Reconfiguration
//!
//! A reload publishes new [`HubSettings`] ([`crate::live`]); each replica
//! takes them at its next [`Hub::sync`] ([`Hub::reconfigure`]). Peer ids
//! are stable across settings (a removed peer's id stays, inactive), so
//! the replicas' tables and the events between them keep their meaning
//! while the shards switch one after another: an event naming an id a
//! replica does not know yet makes it take the new settings first, and an
//! event about an inactive peer is dropped. A removed peer is forgotten
//! at once (endpoint, sessions, pending handshakes) and no longer matches
//! an initiation's MAC1.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::wireguard::{self as wg, Index, Mac1Key, Message, PublicKey};

use crate::published::Published;
use crate::ratelimit::{SourceLimiter, TokenBucket};

/// A peer's position in the configuration.
pub type PeerId = u16;

/// How long after its handshake a session's indices are kept: WireGuard's
/// REJECT_AFTER_TIME (180 s) plus slack for clocks and the path.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(195);
/// How long an initiation waits for its response: REKEY_TIMEOUT (5 s),
/// doubled.
pub const PENDING_LIFETIME: Duration = Duration::from_secs(10);
/// The share of the index table (one in this many entries) that
/// initiations from strangers cannot take: it stays for the handshakes of
/// peers whose endpoint the hub knows.
pub const STRANGER_RESERVE: usize = 4;
/// How long an unidentified source stays a flood candidate.
pub const CANDIDATE_LIFETIME: Duration = Duration::from_secs(30);
/// Unidentified sources remembered for flooding.
pub const MAX_CANDIDATES: usize = 8;
/// Packets with fresh counters needed from a new address before a
/// roaming endpoint is committed.
pub const ROAM_CONFIRMATIONS: u8 = 2;
/// Entries one index can hold (collisions beyond that evict the oldest).
const WAYS: usize = 2;

/// Where a peer is: its address and which of the hub's listening sockets
/// it talks to (replies must leave from that one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The peer's address as the hub sees it.
    pub addr: SocketAddr,
    /// Index of the hub's listening address it sends to.
    pub via: u16,
}

/// A configured peer, as the hub needs it.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// Name for logs.
    pub name: String,
    /// Public key.
    pub key: PublicKey,
    /// MAC1 key for messages to this peer.
    pub mac1: Mac1Key,
    /// Peers it may talk to (sorted); `None`: all.
    pub allow: Option<Vec<PeerId>>,
    /// A fixed endpoint from the configuration.
    pub fixed: Option<Endpoint>,
    /// Configured now; `false` for a peer removed while the relay runs,
    /// whose id stays reserved ([`crate::live`]).
    pub active: bool,
}

/// The hub's static settings, shared by every shard's replica.
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// The peers.
    pub peers: Vec<PeerInfo>,
    /// Most index entries (pending and sessions) per replica.
    pub max_indices: usize,
    /// Handshake messages per second per source IP.
    pub handshake_rate: f64,
    /// Handshake burst per source IP.
    pub handshake_burst: f64,
}

impl HubSettings {
    /// Whether `a` and `b` may talk: both are configured and each allows
    /// the other.
    pub fn allowed(&self, a: PeerId, b: PeerId) -> bool {
        let permits = |x: PeerId, y: PeerId| {
            let p = &self.peers[usize::from(x)];
            p.active
                && p.allow
                    .as_ref()
                    .is_none_or(|list| list.binary_search(&y).is_ok())
        };
        a != b && permits(a, b) && permits(b, a)
    }
}

/// Why the hub did not forward a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Not a WireGuard-shaped datagram (type 1–4 with its exact size).
    NotWireGuard,
    /// The source sent more handshake messages than its rate allows.
    RateLimited,
    /// An initiation whose MAC1 matches no configured peer.
    UnknownRecipient,
    /// The two peers are not allowed to talk.
    NotAllowed,
    /// The recipient's address is not known yet (and nobody to flood to).
    NoEndpoint,
    /// No session or pending handshake has this index.
    UnknownIndex,
    /// Several sessions share the index and the source matches none.
    IndexCollision,
    /// A response whose MAC1 matches no peer that could have initiated.
    BadMac1,
    /// A handshake message or cookie from an address that is not the
    /// other side of that handshake.
    WrongSource,
    /// Data from a new address with a counter already seen: a replay.
    StaleCounter,
    /// The index table is full.
    TableFull,
    /// Flooding an initiation was refused by the flood rate limit.
    FloodLimited,
}

impl DropReason {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::NotWireGuard => "not_wireguard",
            DropReason::RateLimited => "rate_limited",
            DropReason::UnknownRecipient => "unknown_recipient",
            DropReason::NotAllowed => "not_allowed",
            DropReason::NoEndpoint => "no_endpoint",
            DropReason::UnknownIndex => "unknown_index",
            DropReason::IndexCollision => "index_collision",
            DropReason::BadMac1 => "bad_mac1",
            DropReason::WrongSource => "wrong_source",
            DropReason::StaleCounter => "stale_counter",
            DropReason::TableFull => "table_full",
            DropReason::FloodLimited => "flood_limited",
        }
    }

    /// Every reason, for metrics.
    pub const ALL: [DropReason; 12] = [
        DropReason::NotWireGuard,
        DropReason::RateLimited,
        DropReason::UnknownRecipient,
        DropReason::NotAllowed,
        DropReason::NoEndpoint,
        DropReason::UnknownIndex,
        DropReason::IndexCollision,
        DropReason::BadMac1,
        DropReason::WrongSource,
        DropReason::StaleCounter,
        DropReason::TableFull,
        DropReason::FloodLimited,
    ];
}

/// What to do with one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it to this endpoint.
    Forward(Endpoint),
    /// Send it to every endpoint in [`Hub::flood_targets`].
    Flood,
    /// Drop it.
    Drop(DropReason),
}

/// A run of transport messages to one index within a received train, so
/// the run's next datagrams skip the lookup ([`Hub::route_in_train`]).
/// Start a new one for every train: it holds for one source only.
#[derive(Clone, Copy, Debug, Default)]
pub struct Train {
    run: Option<TrainRun>,
}

#[derive(Clone, Copy, Debug)]
struct TrainRun {
    receiver: Index,
    /// The session entry's way in its bucket.
    way: usize,
    dest: Endpoint,
    /// The highest counter of the run so far.
    max_counter: u64,
}

/// A change to the hub's state, replicated to every shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An initiation was forwarded and awaits its response.
    Pending {
        /// The initiator's sender index.
        index: Index,
        /// Where the initiation came from.
        src: Endpoint,
        /// The initiator, if its address was already known.
        initiator: Option<PeerId>,
        /// The recipient named by MAC1.
        responder: PeerId,
        /// When.
        at: Instant,
    },
    /// A response completed a handshake.
    Session {
        /// The initiator's index (data to the initiator carries it).
        initiator_index: Index,
        /// The initiator.
        initiator: PeerId,
        /// The responder's index.
        responder_index: Index,
        /// The responder.
        responder: PeerId,
        /// When.
        at: Instant,
    },
    /// A peer's endpoint changed.
    Endpoint {
        /// The peer.
        peer: PeerId,
        /// Its new endpoint.
        endpoint: Endpoint,
        /// Version: `(counter << 8) | shard`; higher wins.
        version: u64,
    },
    /// An unidentified source sent a valid-looking initiation.
    Candidate {
        /// The source.
        endpoint: Endpoint,
        /// When.
        at: Instant,
    },
}

/// Where a replica gets the other shards' events from.
pub trait Inbox: Send {
    /// Hands every waiting event to `apply`.
    fn drain(&mut self, apply: &mut dyn FnMut(Event));
}

/// An inbox that never has anything (a single shard).
pub struct NoInbox;

impl Inbox for NoInbox {
    fn drain(&mut self, _: &mut dyn FnMut(Event)) {}
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    src: Endpoint,
    initiator: Option<PeerId>,
    responder: PeerId,
    at: Instant,
}

#[derive(Clone, Copy, Debug)]
struct Session {
    owner: PeerId,
    partner: PeerId,
    at: Instant,
    max_counter: u64,
    roam: Option<(Endpoint, u64, u8)>,
}

type Bucket<T> = [Option<T>; WAYS];

/// Counts a replica can report for gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HubCounts {
    /// Session indices.
    pub sessions: usize,
    /// Initiations awaiting a response.
    pub pending: usize,
    /// Peers whose endpoint is known.
    pub known_peers: usize,
    /// Entries evicted by index collisions.
    pub collisions: u64,
}

/// One shard's replica of the hub state.
pub struct Hub {
    shard: u8,
    settings: Arc<HubSettings>,
    /// Where new settings are published, and the generation last taken.
    published: Option<(Arc<Published<HubSettings>>, u64)>,
    endpoints: Vec<Option<(Endpoint, u64)>>,
    by_addr: HashMap<SocketAddr, PeerId>,
    pending: HashMap<Index, Bucket<Pending>>,
    sessions: HashMap<Index, Bucket<Session>>,
    /// (deadline, index, made at) of each pending entry, oldest first.
    pending_expiry: VecDeque<(Instant, Index, Instant)>,
    /// The same for session entries.
    session_expiry: VecDeque<(Instant, Index, Instant)>,
    candidates: [Option<(Endpoint, Instant)>; MAX_CANDIDATES],
    limiter: SourceLimiter,
    flood_budget: TokenBucket,
    inbox: Box<dyn Inbox>,
    events: Vec<Event>,
    flood: Vec<Endpoint>,
    entries: usize,
    collisions: u64,
}

impl Hub {
    /// A replica for shard `shard`, fed by `inbox`.
    pub fn new(shard: u8, settings: Arc<HubSettings>, inbox: Box<dyn Inbox>) -> Self {
        let mut hub = Hub {
            shard,
            endpoints: vec![None; settings.peers.len()],
            by_addr: HashMap::with_capacity(settings.peers.len() * 2),
            pending: HashMap::new(),
            sessions: HashMap::with_capacity(settings.max_indices.min(1 << 16)),
            pending_expiry: VecDeque::new(),
            session_expiry: VecDeque::new(),
            candidates: [None; MAX_CANDIDATES],
            limiter: SourceLimiter::new(4096, settings.handshake_rate, settings.handshake_burst),
            flood_budget: TokenBucket::new(20.0, 40.0),
            inbox,
            events: Vec::new(),
            flood: Vec::with_capacity(MAX_CANDIDATES),
            entries: 0,
            collisions: 0,
            settings,
            published: None,
        };
        for (i, p) in hub.settings.clone().peers.iter().enumerate() {
            if let Some(ep) = p.fixed {
                hub.set_endpoint(i as PeerId, ep, 0);
            }
        }
        hub
    }

    /// Decides where `datagram`, received from `src` on listening socket
    /// `via`, goes. Events it causes are queued for [`Hub::take_events`].
    pub fn route(&mut self, now: Instant, src: SocketAddr, via: u16, datagram: &[u8]) -> Verdict {
        let mut train = Train::default();
        let v = self.route_in_train(now, src, via, datagram, &mut train);
        self.end_train(&mut train);
        v
    }

    /// [`Hub::route`] for one datagram of a received train (the datagrams
    /// of one source that GRO glued into one receive; `train` starts empty
    /// for each, and [`Hub::end_train`] closes it). Every datagram is
    /// classified and its receiver index read; a transport message to the
    /// index of the one before it, which came from its session partner's
    /// endpoint, goes the same way without another lookup (nothing else
    /// can change the replica in between: any other datagram ends the
    /// run), and the highest counter of the run is recorded when it ends.
    pub fn route_in_train(
        &mut self,
        now: Instant,
        src: SocketAddr,
        via: u16,
        datagram: &[u8],
        train: &mut Train,
    ) -> Verdict {
        let msg = wg::classify(datagram);
        if let (Some(run), Ok(Message::Transport { receiver, counter })) = (&mut train.run, &msg) {
            if *receiver == run.receiver {
                run.max_counter = run.max_counter.max(*counter);
                return Verdict::Forward(run.dest);
            }
        }
        self.end_train(train);
        let Ok(msg) = msg else {
            return Verdict::Drop(DropReason::NotWireGuard);
        };
        let from = Endpoint { addr: src, via };
        match msg {
            Message::Transport { receiver, counter } => {
                let (v, home) = match self.transport(from, receiver, counter) {
                    (Verdict::Drop(DropReason::UnknownIndex), _) => {
                        self.sync();
                        self.transport(from, receiver, counter)
                    }
                    v => v,
                };
                if let (Verdict::Forward(dest), Some(way)) = (v, home) {
                    train.run = Some(TrainRun {
                        receiver,
                        way,
                        dest,
                        max_counter: counter,
                    });
                }
                v
            }
            _ if !self.limiter.allow(src.ip(), now) => Verdict::Drop(DropReason::RateLimited),
            // Handshake messages are rare and rate-limited: bring the
            // replica up to date before deciding on one.
            Message::Initiation { sender } => {
                self.sync();
                self.initiation(now, from, sender, datagram)
            }
            Message::Response { sender, receiver } => {
                self.sync();
                self.response(now, from, sender, receiver, datagram)
            }
            Message::CookieReply { receiver } => {
                self.sync();
                self.cookie(from, receiver)
            }
        }
    }

    /// Ends a train's run of transport messages: records its highest
    /// counter on the session entry, as routing each of them one by one
    /// would have.
    pub fn end_train(&mut self, train: &mut Train) {
        let Some(run) = train.run.take() else {
            return;
        };
        if let Some(s) = self
            .sessions
            .get_mut(&run.receiver)
            .and_then(|b| b[run.way].as_mut())
        {
            s.max_counter = s.max_counter.max(run.max_counter);
        }
    }

    /// Endpoints a [`Verdict::Flood`] goes to.
    pub fn flood_targets(&self) -> &[Endpoint] {
        &self.flood
    }

    /// Events caused since the last call, for the other shards.
    pub fn take_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain(..)
    }

    /// Whether events are waiting for [`Hub::take_events`].
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Follows the settings published in `cell` from now on (taken at
    /// the start of each [`Hub::sync`]).
    pub fn follow(&mut self, cell: Arc<Published<HubSettings>>) {
        self.published = Some((cell, u64::MAX));
        self.refresh();
    }

    /// Takes newly published settings, if any.
    fn refresh(&mut self) {
        let Some((cell, seen)) = &mut self.published else {
            return;
        };
        let generation = cell.generation();
        if generation != *seen {
            *seen = generation;
            let settings = cell.get();
            self.reconfigure(settings);
        }
    }

    /// Switches to `new` settings: peers whose id became inactive are
    /// forgotten (endpoint, sessions and pending handshakes), new fixed
    /// endpoints are set, and the per-source limit takes the new rate
    /// (every source starts with a full bucket). Ids must be stable
    /// between the two ([`crate::live::hub_settings`]).
    pub fn reconfigure(&mut self, new: Arc<HubSettings>) {
        if Arc::ptr_eq(&new, &self.settings) {
            return;
        }
        let old = std::mem::replace(&mut self.settings, new.clone());
        if self.endpoints.len() < new.peers.len() {
            self.endpoints.resize(new.peers.len(), None);
        }
        for (i, p) in new.peers.iter().enumerate() {
            let id = i as PeerId;
            let before = old.peers.get(i).filter(|q| q.active);
            if !p.active {
                if before.is_some() {
                    self.forget(id);
                }
                continue;
            }
            if let Some(ep) = p.fixed {
                if before.and_then(|q| q.fixed) != Some(ep) {
                    let version = self.endpoints[i]
                        .map_or(0, |(_, v)| (((v >> 8) + 1) << 8) | u64::from(self.shard));
                    self.set_endpoint(id, ep, version);
                }
            }
        }
        if (old.handshake_rate, old.handshake_burst) != (new.handshake_rate, new.handshake_burst) {
            self.limiter = SourceLimiter::new(4096, new.handshake_rate, new.handshake_burst);
        }
    }

    /// Forgets everything about peer `id`: its endpoint and every session
    /// or pending handshake it is part of.
    fn forget(&mut self, id: PeerId) {
        if let Some((ep, _)) = self.endpoints[usize::from(id)].take() {
            if self.by_addr.get(&ep.addr) == Some(&id) {
                self.by_addr.remove(&ep.addr);
            }
        }
        self.entries -= remove_all(&mut self.sessions, |s| s.owner == id || s.partner == id);
        self.entries -= remove_all(&mut self.pending, |p| {
            p.responder == id || p.initiator == Some(id)
        });
    }

    /// Whether an event about `peers` can be applied here: each is an
    /// active peer of this replica's settings, after taking new settings
    /// if another shard already uses ids this replica does not know.
    fn knows(&mut self, peers: &[PeerId]) -> bool {
        let n = self.settings.peers.len();
        if peers.iter().any(|&p| usize::from(p) >= n) {
            self.refresh();
        }
        peers.iter().all(|&p| {
            self.settings
                .peers
                .get(usize::from(p))
                .is_some_and(|q| q.active)
        })
    }

    /// Applies the waiting events of other shards, after taking newly
    /// published settings.
    pub fn sync(&mut self) {
        self.refresh();
        let mut inbox = std::mem::replace(&mut self.inbox, Box::new(NoInbox));
        inbox.drain(&mut |ev| self.apply(ev));
        self.inbox = inbox;
    }

    /// Forgets entries whose time is up.
    pub fn expire(&mut self, now: Instant) {
        self.entries -= expire_queue(&mut self.pending_expiry, &mut self.pending, now, |p| p.at);
        self.entries -= expire_queue(&mut self.session_expiry, &mut self.sessions, now, |s| s.at);
        for c in &mut self.candidates {
            if c.is_some_and(|(_, at)| now.saturating_duration_since(at) > CANDIDATE_LIFETIME) {
                *c = None;
            }
        }
    }

    /// Counts for gauges.
    pub fn counts(&self) -> HubCounts {
        fn count<T>(b: &Bucket<T>) -> usize {
            b.iter().filter(|e| e.is_some()).count()
        }
        HubCounts {
            sessions: self.sessions.values().map(count).sum(),
            pending: self.pending.values().map(count).sum(),
            known_peers: self.endpoints.iter().filter(|e| e.is_some()).count(),
            collisions: self.collisions,
        }
    }

    /// A peer's current endpoint.
    pub fn endpoint(&self, peer: PeerId) -> Option<Endpoint> {
        self.endpoints
            .get(usize::from(peer))
            .copied()
            .flatten()
            .map(|(e, _)| e)
    }

    /// Applies one event (from this shard or another). An event about a
    /// peer that is no longer configured is dropped.
    pub fn apply(&mut self, ev: Event) {
        let known = match ev {
            Event::Pending {
                initiator,
                responder,
                ..
            } => self.knows(&[responder]) && initiator.is_none_or(|i| self.knows(&[i])),
            Event::Session {
                initiator,
                responder,
                ..
            } => self.knows(&[initiator, responder]),
            Event::Endpoint { peer, .. } => self.knows(&[peer]),
            Event::Candidate { .. } => true,
        };
        if !known {
            return;
        }
        match ev {
            Event::Pending {
                index,
                src,
                initiator,
                responder,
                at,
            } => {
                let p = Pending {
                    src,
                    initiator,
                    responder,
                    at,
                };
                let bucket = self.pending.entry(index).or_default();
                let (added, evicted) = insert(bucket, p, |old| old.src == src, |e| e.at);
                self.entries += usize::from(added);
                self.collisions += u64::from(evicted);
                self.pending_expiry
                    .push_back((at + PENDING_LIFETIME, index, at));
            }
            Event::Session {
                initiator_index,
                initiator,
                responder_index,
                responder,
                at,
            } => {
                if remove_where(&mut self.pending, initiator_index, |p| {
                    p.responder == responder
                }) {
                    self.entries -= 1;
                }
                for (index, owner, partner) in [
                    (initiator_index, initiator, responder),
                    (responder_index, responder, initiator),
                ] {
                    let s = Session {
                        owner,
                        partner,
                        at,
                        max_counter: 0,
                        roam: None,
                    };
                    let bucket = self.sessions.entry(index).or_default();
                    let (added, evicted) = insert(bucket, s, |old| old.owner == owner, |e| e.at);
                    self.entries += usize::from(added);
                    self.collisions += u64::from(evicted);
                    self.session_expiry
                        .push_back((at + SESSION_LIFETIME, index, at));
                }
            }
            Event::Endpoint {
                peer,
                endpoint,
                version,
            } => {
                let newer = self.endpoints[usize::from(peer)].is_none_or(|(_, v)| version > v);
                if newer {
                    self.set_endpoint(peer, endpoint, version);
                }
            }
            Event::Candidate { endpoint, at } => {
                if self.by_addr.contains_key(&endpoint.addr) {
                    return;
                }
                let slot = self
                    .candidates
                    .iter()
                    .position(|c| c.is_some_and(|(e, _)| e.addr == endpoint.addr))
                    .or_else(|| self.candidates.iter().position(|c| c.is_none()))
                    .unwrap_or_else(|| {
                        (0..MAX_CANDIDATES)
                            .min_by_key(|&i| self.candidates[i].map(|(_, t)| t))
                            .unwrap_or(0)
                    });
                self.candidates[slot] = Some((endpoint, at));
            }
        }
    }

    fn emit(&mut self, ev: Event) {
        self.apply(ev);
        self.events.push(ev);
    }

    fn set_endpoint(&mut self, peer: PeerId, endpoint: Endpoint, version: u64) {
        if let Some((old, _)) = self.endpoints[usize::from(peer)] {
            if self.by_addr.get(&old.addr) == Some(&peer) {
                self.by_addr.remove(&old.addr);
            }
        }
        self.endpoints[usize::from(peer)] = Some((endpoint, version));
        self.by_addr.insert(endpoint.addr, peer);
        for c in &mut self.candidates {
            if c.is_some_and(|(e, _)| e.addr == endpoint.addr) {
                *c = None;
            }
        }
    }

    /// Commits `endpoint` for `peer` if it differs from what is known.
    fn commit_endpoint(&mut self, peer: PeerId, endpoint: Endpoint) {
        let current = self.endpoints[usize::from(peer)];
        if current.is_some_and(|(e, _)| e == endpoint) {
            return;
        }
        let counter = current.map_or(0, |(_, v)| v >> 8) + 1;
        self.emit(Event::Endpoint {
            peer,
            endpoint,
            version: (counter << 8) | u64::from(self.shard),
        });
    }

    fn table_full(&self, adding: usize) -> bool {
        self.entries + adding > self.settings.max_indices
    }

    fn initiation(&mut self, now: Instant, from: Endpoint, sender: Index, msg: &[u8]) -> Verdict {
        let settings = self.settings.clone();
        let Some(responder) = settings
            .peers
            .iter()
            .position(|p| p.active && wg::verify_mac1(msg, &p.mac1))
            .map(|i| i as PeerId)
        else {
            return Verdict::Drop(DropReason::UnknownRecipient);
        };
        let initiator = self.by_addr.get(&from.addr).copied();
        if let Some(i) = initiator {
            if !settings.allowed(i, responder) {
                return Verdict::Drop(DropReason::NotAllowed);
            }
        }
        // Strangers (no configured peer's endpoint) may fill only part of
        // the table: whoever knows a peer's public key can make valid
        // initiations from many sources, and must not lock the known
        // peers out of their next handshake.
        let reserved = if initiator.is_none() {
            settings.max_indices / STRANGER_RESERVE
        } else {
            0
        };
        if self.table_full(1 + reserved) {
            return Verdict::Drop(DropReason::TableFull);
        }
        let target = self.endpoint(responder);
        if target.is_some_and(|t| t.addr == from.addr) {
            return Verdict::Drop(DropReason::NotAllowed);
        }
        if initiator.is_none() {
            self.emit(Event::Candidate {
                endpoint: from,
                at: now,
            });
        }
        self.emit(Event::Pending {
            index: sender,
            src: from,
            initiator,
            responder,
            at: now,
        });
        if let Some(t) = target {
            return Verdict::Forward(t);
        }
        self.flood.clear();
        for (ep, at) in self.candidates.iter().flatten() {
            if ep.addr != from.addr
                && !self.by_addr.contains_key(&ep.addr)
                && now.saturating_duration_since(*at) <= CANDIDATE_LIFETIME
            {
                self.flood.push(*ep);
            }
        }
        if self.flood.is_empty() {
            Verdict::Drop(DropReason::NoEndpoint)
        } else if !self.flood_budget.try_take_one(now) {
            Verdict::Drop(DropReason::FloodLimited)
        } else {
            Verdict::Flood
        }
    }

    fn response(
        &mut self,
        now: Instant,
        from: Endpoint,
        sender: Index,
        receiver: Index,
        msg: &[u8],
    ) -> Verdict {
        let Some(bucket) = self.pending.get(&receiver).copied() else {
            return Verdict::Drop(DropReason::UnknownIndex);
        };
        let settings = self.settings.clone();
        let from_peer = self.by_addr.get(&from.addr).copied();
        let mut verdict = Verdict::Drop(DropReason::WrongSource);
        for p in bucket.iter().flatten() {
            // The response must come from the responder (or from an
            // address nobody owns yet: the responder, newly seen).
            if from_peer.is_some_and(|q| q != p.responder) {
                continue;
            }
            let mac_ok = |i: PeerId| wg::verify_mac1(msg, &settings.peers[usize::from(i)].mac1);
            let initiator = match p.initiator {
                Some(i) if mac_ok(i) => Some(i),
                _ => (0..settings.peers.len() as PeerId).find(|&i| {
                    i != p.responder && settings.peers[usize::from(i)].active && mac_ok(i)
                }),
            };
            let Some(initiator) = initiator else {
                verdict = Verdict::Drop(DropReason::BadMac1);
                continue;
            };
            if !settings.allowed(initiator, p.responder) {
                verdict = Verdict::Drop(DropReason::NotAllowed);
                continue;
            }
            if self.table_full(2) {
                return Verdict::Drop(DropReason::TableFull);
            }
            self.commit_endpoint(p.responder, from);
            self.commit_endpoint(initiator, p.src);
            self.emit(Event::Session {
                initiator_index: receiver,
                initiator,
                responder_index: sender,
                responder: p.responder,
                at: now,
            });
            return Verdict::Forward(p.src);
        }
        verdict
    }

    fn cookie(&mut self, from: Endpoint, receiver: Index) -> Verdict {
        if let Some(bucket) = self.pending.get(&receiver) {
            for p in bucket.iter().flatten() {
                let responder_at = self.endpoint(p.responder);
                let from_responder = match responder_at {
                    Some(e) => e.addr == from.addr,
                    None => !self.by_addr.contains_key(&from.addr),
                };
                if from_responder {
                    return Verdict::Forward(p.src);
                }
            }
            return Verdict::Drop(DropReason::WrongSource);
        }
        if let Some(bucket) = self.sessions.get(&receiver) {
            for s in bucket.iter().flatten() {
                if self
                    .endpoint(s.partner)
                    .is_some_and(|e| e.addr == from.addr)
                {
                    return match self.endpoint(s.owner) {
                        Some(e) => Verdict::Forward(e),
                        None => Verdict::Drop(DropReason::NoEndpoint),
                    };
                }
            }
            return Verdict::Drop(DropReason::WrongSource);
        }
        Verdict::Drop(DropReason::UnknownIndex)
    }

    /// Routes a transport message; with the way of its entry when it came
    /// from the partner's committed endpoint (the common case, which a
    /// train's next datagrams may repeat without a lookup).
    fn transport(
        &mut self,
        from: Endpoint,
        receiver: Index,
        counter: u64,
    ) -> (Verdict, Option<usize>) {
        let endpoints = &self.endpoints;
        let Some(bucket) = self.sessions.get_mut(&receiver) else {
            return (Verdict::Drop(DropReason::UnknownIndex), None);
        };
        let at = |p: PeerId| endpoints[usize::from(p)].map(|(e, _)| e);
        // Which entry: the one whose partner sends from here; failing that
        // (a roaming partner), the only entry.
        let mut way = None;
        let mut live = 0;
        for (i, s) in bucket.iter().enumerate() {
            if let Some(s) = s {
                live += 1;
                if at(s.partner).is_some_and(|e| e.addr == from.addr) {
                    way = Some((i, true));
                }
            }
        }
        if way.is_none() {
            if self.by_addr.contains_key(&from.addr) {
                // A known peer may not use an index of a session it is not in.
                return (Verdict::Drop(DropReason::WrongSource), None);
            }
            if live > 1 {
                return (Verdict::Drop(DropReason::IndexCollision), None);
            }
            way = bucket.iter().position(|s| s.is_some()).map(|i| (i, false));
        }
        let Some((i, at_home)) = way else {
            return (Verdict::Drop(DropReason::UnknownIndex), None);
        };
        let s = bucket[i].as_mut().expect("chosen entry exists");
        let Some(dest) = at(s.owner) else {
            return (Verdict::Drop(DropReason::NoEndpoint), None);
        };
        if at_home {
            s.max_counter = s.max_counter.max(counter);
            s.roam = None;
            return (Verdict::Forward(dest), Some(i));
        }
        // From a new address: forward only what could be fresh, and move
        // the endpoint once it has proven itself a few times.
        let floor = match s.roam {
            Some((ep, last, _)) if ep == from => last,
            _ => s.max_counter,
        };
        if counter <= floor && !(counter == 0 && s.max_counter == 0 && s.roam.is_none()) {
            return (Verdict::Drop(DropReason::StaleCounter), None);
        }
        let seen = match s.roam {
            Some((ep, _, n)) if ep == from => n + 1,
            _ => 1,
        };
        s.roam = Some((from, counter, seen));
        if seen >= ROAM_CONFIRMATIONS {
            s.max_counter = s.max_counter.max(counter);
            s.roam = None;
            let partner = s.partner;
            self.commit_endpoint(partner, from);
        }
        (Verdict::Forward(dest), None)
    }
}

/// Puts `e` into `bucket`: over an entry `same` matches, else into a free
/// way, else over the oldest. Returns (a way was filled, an entry of
/// another owner was evicted).
fn insert<T: Copy>(
    bucket: &mut Bucket<T>,
    e: T,
    same: impl Fn(&T) -> bool,
    age: impl Fn(&T) -> Instant,
) -> (bool, bool) {
    if let Some(slot) = bucket.iter_mut().find(|s| s.as_ref().is_some_and(&same)) {
        *slot = Some(e);
        return (false, false);
    }
    if let Some(slot) = bucket.iter_mut().find(|s| s.is_none()) {
        *slot = Some(e);
        return (true, false);
    }
    let oldest = (0..WAYS)
        .min_by_key(|&i| bucket[i].as_ref().map(&age))
        .unwrap_or(0);
    bucket[oldest] = Some(e);
    (false, true)
}

/// Pops the due entries of an expiry queue, `(deadline, index, made at)`
/// in deadline order, and removes each from `map` unless it was replaced
/// since (its time changed). Returns how many entries were removed.
fn expire_queue<T>(
    queue: &mut VecDeque<(Instant, Index, Instant)>,
    map: &mut HashMap<Index, Bucket<T>>,
    now: Instant,
    made_at: impl Fn(&T) -> Instant,
) -> usize {
    let mut removed = 0;
    while let Some(&(deadline, index, at)) = queue.front() {
        if deadline > now {
            break;
        }
        queue.pop_front();
        removed += usize::from(remove_where(map, index, |e| made_at(e) == at));
    }
    removed
}

/// Removes every entry `pred` matches, and the buckets left empty.
/// Returns how many entries were removed.
fn remove_all<T: Copy>(map: &mut HashMap<Index, Bucket<T>>, pred: impl Fn(&T) -> bool) -> usize {
    let mut removed = 0;
    map.retain(|_, bucket| {
        for slot in bucket.iter_mut() {
            if slot.as_ref().is_some_and(&pred) {
                *slot = None;
                removed += 1;
            }
        }
        bucket.iter().any(Option::is_some)
    });
    removed
}

/// Removes the first entry of `index` that `pred` matches; drops the
/// bucket when it empties. Returns whether one was removed.
fn remove_where<T>(
    map: &mut HashMap<Index, Bucket<T>>,
    index: Index,
    pred: impl Fn(&T) -> bool,
) -> bool {
    let Some(bucket) = map.get_mut(&index) else {
        return false;
    };
    let Some(slot) = bucket.iter_mut().find(|s| s.as_ref().is_some_and(&pred)) else {
        return false;
    };
    *slot = None;
    if bucket.iter().all(|s| s.is_none()) {
        map.remove(&index);
    }
    true
}

#[cfg(test)]
mod tests;
