//! The receiver-index hub's routing state, without I/O.
//!
//! Peers are stock WireGuard. Each is configured with the hub as the
//! endpoint of every other peer, so the hub sees every datagram between
//! them and must decide, from the clear-text fields alone, where each one
//! goes. [`Hub::route`] takes a datagram, its source and the time, and
//! returns a [`Verdict`]; it never touches a socket or a clock. A
//! *session* in this module is always WireGuard's own: the pair of
//! indices (and keys, which the hub never sees) one handshake sets up.
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
//!    only if the pair is allowed to talk, and only if it moves no peer's
//!    endpoint that sent data within [`LIVE_ENDPOINT_HOLD`] (see below).
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
//! Handshakes are not authenticated to the hub: MAC1 needs only the
//! recipient's *public* key, so whoever knows two allowed peers' public
//! keys can forge an initiation and its response from addresses of their
//! own. Such a pair must not take a working peer's traffic, so a handshake
//! never moves the endpoint of a peer heard from within
//! [`LIVE_ENDPOINT_HOLD`]: data from its committed endpoint, on a session's
//! index, with a counter above every counter seen on that index. A peer
//! that really moved still gets through: its data from the new address
//! moves the endpoint by the roaming rule above (which no handshake can
//! stop), and its next handshake, once the old address has been quiet for
//! the hold, moves it too. Replicas learn that a peer was heard through
//! [`Event::Heard`], at most once per [`HEARD_PERIOD`] per peer and shard.
//!
//! Indices expire on WireGuard's own clock: a session's keys are refused by
//! both peers [`WG_SESSION_LIFETIME`] after the handshake (REJECT_AFTER_TIME,
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

use ferry_proto::wireguard::{Index, Mac1Key, PublicKey};

use crate::published::Published;
use crate::ratelimit::{SourceLimiter, TokenBucket};
use table::{Bucket, Pending, WgSession};

/// A peer's position in the configuration.
pub type PeerId = u16;

/// How long after its handshake a WireGuard session's indices are kept:
/// REJECT_AFTER_TIME (180 s) plus slack for clocks and the path.
pub const WG_SESSION_LIFETIME: Duration = Duration::from_secs(195);
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
/// How long after a peer's last fresh data from its endpoint a handshake
/// cannot move that endpoint elsewhere (WireGuard's REKEY_TIMEOUT: a
/// handshake refused for it is retried after as long).
pub const LIVE_ENDPOINT_HOLD: Duration = Duration::from_secs(5);
/// How often a replica tells the others that a peer was heard.
pub const HEARD_PERIOD: Duration = Duration::from_secs(1);

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
    /// other side of that handshake, or a response that would move the
    /// endpoint of a peer heard from within [`LIVE_ENDPOINT_HOLD`].
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
    WgSession {
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
    /// Fresh data came from a peer's committed endpoint.
    Heard {
        /// The peer.
        peer: PeerId,
        /// When.
        at: Instant,
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

/// Counts a replica can report for gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HubCounts {
    /// Index entries of WireGuard sessions.
    pub wg_sessions: usize,
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
    /// When each peer last sent fresh data from its endpoint, as far as
    /// this replica knows ([`Event::Heard`]).
    heard: Vec<Option<Instant>>,
    by_addr: HashMap<SocketAddr, PeerId>,
    pending: HashMap<Index, Bucket<Pending>>,
    wg_sessions: HashMap<Index, Bucket<WgSession>>,
    /// (deadline, index, made at) of each pending entry, oldest first.
    pending_expiry: VecDeque<(Instant, Index, Instant)>,
    /// The same for WireGuard session entries.
    wg_session_expiry: VecDeque<(Instant, Index, Instant)>,
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
            heard: vec![None; settings.peers.len()],
            by_addr: HashMap::with_capacity(settings.peers.len() * 2),
            pending: HashMap::new(),
            wg_sessions: HashMap::with_capacity(settings.max_indices.min(1 << 16)),
            pending_expiry: VecDeque::new(),
            wg_session_expiry: VecDeque::new(),
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

    /// Counts for gauges.
    pub fn counts(&self) -> HubCounts {
        fn count<T>(b: &Bucket<T>) -> usize {
            b.iter().filter(|e| e.is_some()).count()
        }
        HubCounts {
            wg_sessions: self.wg_sessions.values().map(count).sum(),
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
}

mod handshake;
mod replica;
mod route;
mod table;

#[cfg(test)]
mod tests;
