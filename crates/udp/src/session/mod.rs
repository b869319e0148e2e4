//! Relay sessions' table, without I/O (`docs/relay-sessions.md` §2, §4, §5).
//!
//! Two SDK clients with admitted DERP connections ask (over DERP) for a
//! session; [`SessionTable::allocate_on`] finds the pair's session or makes
//! one: a random 24-bit VNI (never 0) and a random bind token per slot
//! (its doc says who a session counts against and who hears of it). Each
//! client then binds its slot from its UDP socket:
//!
//! 1. **bind** → the relay answers a **challenge** whose cookie is a MAC
//!    over the VNI, slot, generation and the datagram's source address,
//!    under a secret that rotates every [`SECRET_ROTATION`]
//!    ([`SessionTable::rotate`]; the previous one is still accepted). No
//!    state is kept for it.
//! 2. **answer** (cookie ‖ proof keyed by the slot's token) → if the cookie
//!    is this source's under either secret, the proof is the token's and
//!    the generation is not older than the slot's, the slot is bound to the
//!    source and the relay says **bound**.
//!
//! Replies are written over the datagram that caused them (every bind
//! message is 78 bytes), so nothing is ever amplified and the shard sends
//! the reply straight from its receive buffer. Once both slots are bound,
//! a data datagram with the session's VNI from one slot's address goes,
//! unchanged, to the other's; everything else is dropped and counted by
//! [`Drop`] reason. Sessions not bound on both sides within the bind
//! lifetime, or bound but silent for the idle lifetime, are freed by
//! [`SessionTable::expire`]. Times are passed in; tests drive it with
//! simulated time.
//!
//! The relay's shards share one table ([`Sessions`]), taken once per
//! received batch for its data datagrams, not per datagram. Bind messages
//! are checked in steps ([`Checked`], [`SessionTable::look_up`],
//! [`SessionTable::bind_proven`]) so that a shard computes every MAC
//! without the lock and a forged answer never takes it;
//! [`SessionTable::handle`] runs the same steps at once for a caller that
//! holds the table.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

pub(crate) use crate::forward::Train;
use crate::forward::{self, Route};
use ferry_proto::key::NodePublic;
use ferry_proto::udp_header::Header;
use rand::rngs::StdRng;
use rand::SeedableRng;

pub(crate) use control::Rotation;
pub use control::{Checked, Secrets};

/// How often the cookie secret rotates (the previous one stays valid for
/// as long again).
pub const SECRET_ROTATION: Duration = Duration::from_secs(120);

/// A session table's limits and lifetimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sessions one key may take part in (ask for, or bind a slot of), and
    /// may be in at all: sessions others asked for, which it never took
    /// part in, give way to its own ([`SessionTable::allocate_on`]).
    pub per_key: usize,
    /// Sessions asked for from one source (of the asker's DERP
    /// connection): an IPv4 address, or an IPv6 /64.
    pub per_ip: usize,
    /// Sessions whose other key is behind one mesh link of the DERP
    /// server (a pair split across the nodes of a region): a node of the
    /// region, however it behaves, holds at most this many here.
    pub per_link: usize,
    /// How long a session waits for both slots to bind.
    pub bind_lifetime: Duration,
    /// How long a bound session lives without a forwarded datagram.
    pub idle_lifetime: Duration,
    /// How often a connection asking again for a session it has is
    /// answered at most.
    pub answer_interval: Duration,
    /// Binds and answers per second that one source (an IPv4 address, or
    /// an IPv6 /64) may send to the session port, on each shard ...
    pub bind_rate: u32,
    /// ... and their burst. Beyond, they are dropped before any MAC is
    /// computed ([`Drop::RateLimited`]).
    pub bind_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_key: 32,
            per_ip: 256,
            per_link: 65_536,
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
            answer_interval: Duration::from_secs(1),
            bind_rate: 64,
            bind_burst: 128,
        }
    }
}

/// Why a datagram on the session port was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Drop {
    /// Not a relay-session datagram (no valid header).
    BadHeader,
    /// A control datagram that is not a well-formed bind or answer.
    BadBind,
    /// No session has this VNI.
    UnknownVni,
    /// An answer whose cookie is not this source's under either secret.
    BadCookie,
    /// An answer whose proof is not the slot's token's.
    BadProof,
    /// An answer older than the slot's current generation.
    StaleGeneration,
    /// Data for a session not bound on both sides.
    Unbound,
    /// Data from an address that is neither slot's.
    WrongSource,
    /// A bind or answer from a source over its rate ([`Limits::bind_rate`]).
    RateLimited,
}

impl Drop {
    /// Every reason, in counter order.
    pub const ALL: [Drop; 9] = [
        Drop::BadHeader,
        Drop::BadBind,
        Drop::UnknownVni,
        Drop::BadCookie,
        Drop::BadProof,
        Drop::StaleGeneration,
        Drop::Unbound,
        Drop::WrongSource,
        Drop::RateLimited,
    ];

    /// Its index in [`Drop::ALL`] (and in [`Counters::drops`]).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The metric label.
    pub const fn label(self) -> &'static str {
        match self {
            Drop::BadHeader => "bad_header",
            Drop::BadBind => "bad_bind",
            Drop::UnknownVni => "unknown_vni",
            Drop::BadCookie => "bad_cookie",
            Drop::BadProof => "bad_proof",
            Drop::StaleGeneration => "stale_generation",
            Drop::Unbound => "unbound",
            Drop::WrongSource => "wrong_source",
            Drop::RateLimited => "rate_limited",
        }
    }
}

/// Why a session was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freed {
    /// Not bound on both sides within the bind lifetime.
    BindTimeout,
    /// Bound, but nothing forwarded for the idle lifetime.
    Idle,
    /// Made room for a session of one of its keys, which never took part
    /// in this one ([`SessionTable::allocate_on`]).
    Evicted,
    /// Its key behind a mesh link is gone: the link went down before
    /// that key bound, or that key's node declined or ended it.
    Mesh,
}

/// What to do with a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it, unchanged, to this address.
    Forward(SocketAddr),
    /// It was rewritten in place into the reply: send it back to its
    /// source.
    Reply,
    /// Drop it.
    Drop(Drop),
}

/// A session as [`SessionTable::allocate`] returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The session id.
    pub vni: u32,
    /// The asker's slot (0 in a new session).
    pub slot: u8,
    /// Bind tokens of slots 0 and 1.
    pub tokens: [[u8; 32]; 2],
    /// Whether the pair already had this session.
    pub existing: bool,
    /// Whether the asker is to be answered (not a repeat within
    /// [`Limits::answer_interval`] on the same connection).
    pub tell_asker: bool,
    /// Whether the peer is to be told (its connection has not been).
    pub tell_peer: bool,
}

/// Sessions per state, for gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct States {
    /// No slot bound yet.
    pub allocated: usize,
    /// One slot bound.
    pub half_bound: usize,
    /// Both bound: forwarding.
    pub bound: usize,
}

/// Cumulative counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// New sessions made.
    pub allocated: u64,
    /// Allocations answered with an existing session.
    pub reused: u64,
    /// Allocations refused for a limit.
    pub refused_limit: u64,
    /// Of those, refused for the cap of sessions behind one mesh link.
    pub refused_link: u64,
    /// Allocations of a session the asker's connection had been answered
    /// for within the answer interval: not answered again.
    pub repeats_unanswered: u64,
    /// Sessions freed to make room for another of one of their keys,
    /// which had never taken part in them.
    pub evicted: u64,
    /// Sessions freed without being bound in time.
    pub freed_bind_timeout: u64,
    /// Bound sessions freed for silence.
    pub freed_idle: u64,
    /// Sessions freed for their key behind a mesh link ([`Freed::Mesh`]).
    pub freed_mesh: u64,
    /// Slots bound (first binds and rebinds).
    pub binds: u64,
    /// Challenges sent.
    pub challenges: u64,
    /// Datagrams forwarded, and their bytes.
    pub forwarded_packets: u64,
    /// Bytes forwarded.
    pub forwarded_bytes: u64,
    /// Drops, indexed like [`Drop::ALL`].
    pub drops: [u64; Drop::ALL.len()],
}

impl Counters {
    /// Drops for one reason.
    pub fn dropped(&self, why: Drop) -> u64 {
        self.drops[why.index()]
    }
}

/// A bound slot: its address and the generation that bound it (relay
/// sessions' and peer-relay endpoints' slots alike).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Binding {
    pub(crate) addr: SocketAddr,
    pub(crate) generation: u32,
}

/// What a slot's key last heard of its session: on which DERP connection,
/// and when that connection was last answered as the asker.
#[derive(Clone, Copy, Debug, Default)]
struct Told {
    conn: Option<u64>,
    answered: Option<Instant>,
}

#[derive(Debug)]
struct Session {
    keys: [NodePublic; 2],
    tokens: [[u8; 32]; 2],
    bound: [Option<Binding>; 2],
    /// Whether each slot's key took part: asked for the session or bound
    /// its slot. Only then does the session count against it.
    joined: [bool; 2],
    told: [Told; 2],
    /// The asker's source, as counted against the per-IP limit.
    ip: IpAddr,
    /// The mesh link a key is behind, for a pair split across nodes
    /// (counted against [`Limits::per_link`]), and that key's slot.
    via: Option<(u16, usize)>,
    created: Instant,
    last_active: Instant,
}

impl Session {
    fn both_bound(&self) -> bool {
        self.bound[0].is_some() && self.bound[1].is_some()
    }

    /// The slot of `key` (which is one of the two).
    fn slot_of(&self, key: &NodePublic) -> usize {
        usize::from(self.keys[1] == *key)
    }
}

fn pair(a: &NodePublic, b: &NodePublic) -> (NodePublic, NodePublic) {
    if a.as_bytes() <= b.as_bytes() {
        (*a, *b)
    } else {
        (*b, *a)
    }
}

/// The relay's sessions: allocation, binding, forwarding, expiry.
pub struct SessionTable {
    limits: Limits,
    rng: StdRng,
    secrets: Rotation,
    sessions: HashMap<u32, Session>,
    by_pair: HashMap<(NodePublic, NodePublic), u32>,
    /// The sessions each key is in (at most `per_key`), oldest first.
    by_key: HashMap<NodePublic, Vec<u32>>,
    per_ip: HashMap<IpAddr, usize>,
    /// Sessions per mesh link ([`Limits::per_link`]).
    per_link: HashMap<u16, usize>,
    counters: Counters,
}

impl SessionTable {
    /// An empty table with a random secret, at `now`.
    pub fn new(limits: Limits, now: Instant) -> SessionTable {
        Self::with_rng(limits, StdRng::from_entropy(), now)
    }

    /// An empty table whose VNIs, tokens and secrets come from `seed`
    /// (tests and fuzzing).
    pub fn with_seed(limits: Limits, seed: u64, now: Instant) -> SessionTable {
        Self::with_rng(limits, StdRng::seed_from_u64(seed), now)
    }

    fn with_rng(limits: Limits, mut rng: StdRng, now: Instant) -> SessionTable {
        SessionTable {
            limits,
            secrets: Rotation::new(&mut rng, now),
            rng,
            sessions: HashMap::new(),
            by_pair: HashMap::new(),
            by_key: HashMap::new(),
            per_ip: HashMap::new(),
            per_link: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Sessions per state now.
    pub fn states(&self) -> States {
        let mut s = States::default();
        for session in self.sessions.values() {
            match session.bound.iter().filter(|b| b.is_some()).count() {
                0 => s.allocated += 1,
                1 => s.half_bound += 1,
                _ => s.bound += 1,
            }
        }
        s
    }

    /// Sessions now.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Sessions whose other key is behind mesh link `link`.
    pub fn via_link(&self, link: u16) -> usize {
        self.per_link.get(&link).copied().unwrap_or(0)
    }

    /// Frees the sessions with a key behind mesh link `link` whose slot
    /// that key has not bound, and returns them.
    pub fn link_down(&mut self, link: u16) -> Vec<ferry_proto::relay_session::Ended> {
        let gone: Vec<u32> = self
            .sessions
            .iter()
            .filter(
                |(_, s)| matches!(s.via, Some((l, slot)) if l == link && s.bound[slot].is_none()),
            )
            .map(|(&vni, _)| vni)
            .collect();
        gone.into_iter()
            .filter_map(|vni| self.free_mesh(vni))
            .collect()
    }

    /// Frees session `vni` if `via.key` is its key behind mesh link
    /// `via.link`, and (unless `bound_too`) has not bound its slot.
    pub fn end_remote(
        &mut self,
        vni: u32,
        via: ferry_proto::relay_session::Via,
        bound_too: bool,
    ) -> Option<ferry_proto::relay_session::Ended> {
        let s = self.sessions.get(&vni)?;
        let (link, slot) = s.via?;
        if link != via.link || s.keys[slot] != via.key || !(bound_too || s.bound[slot].is_none()) {
            return None;
        }
        self.free_mesh(vni)
    }

    fn free_mesh(&mut self, vni: u32) -> Option<ferry_proto::relay_session::Ended> {
        let s = self.sessions.get(&vni)?;
        let (_, slot) = s.via?;
        let ended = ferry_proto::relay_session::Ended {
            vni,
            local: s.keys[1 - slot],
            remote: s.keys[slot],
        };
        self.free(vni, Freed::Mesh);
        Some(ended)
    }

    /// Every session now, with its keys and the mesh link one of them is
    /// behind, if any.
    pub fn hosted(&self) -> Vec<ferry_proto::relay_session::Hosted> {
        self.sessions
            .iter()
            .map(|(&vni, s)| ferry_proto::relay_session::Hosted {
                vni,
                keys: s.keys,
                via: s.via,
            })
            .collect()
    }

    /// Sessions `key` is in (whether or not it took part).
    pub fn sessions_of(&self, key: &NodePublic) -> usize {
        self.by_key.get(key).map_or(0, Vec::len)
    }

    /// The cookie secrets now.
    pub fn secrets(&self) -> Secrets {
        self.secrets.secrets()
    }

    /// Starts a new secret if the current one is [`SECRET_ROTATION`] old;
    /// the current one becomes the previous (still accepted). `true` if
    /// it rotated.
    pub fn rotate(&mut self, now: Instant) -> bool {
        self.secrets.rotate(&mut self.rng, now)
    }

    /// Frees sessions past their bind or idle lifetime; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let limits = self.limits;
        let mut gone = Vec::new();
        for (&vni, s) in &self.sessions {
            let why = if s.both_bound() {
                (now.saturating_duration_since(s.last_active) >= limits.idle_lifetime)
                    .then_some(Freed::Idle)
            } else {
                (now.saturating_duration_since(s.created) >= limits.bind_lifetime)
                    .then_some(Freed::BindTimeout)
            };
            if let Some(why) = why {
                gone.push((vni, why));
            }
        }
        for &(vni, why) in &gone {
            self.free(vni, why);
        }
        gone.len()
    }

    fn free(&mut self, vni: u32, why: Freed) {
        let Some(s) = self.sessions.remove(&vni) else {
            return;
        };
        self.by_pair.remove(&pair(&s.keys[0], &s.keys[1]));
        for k in &s.keys {
            if let Some(list) = self.by_key.get_mut(k) {
                list.retain(|&v| v != vni);
                if list.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
        if let Some(n) = self.per_ip.get_mut(&s.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&s.ip);
            }
        }
        if let Some((link, _)) = s.via {
            if let Some(n) = self.per_link.get_mut(&link) {
                *n -= 1;
                if *n == 0 {
                    self.per_link.remove(&link);
                }
            }
        }
        match why {
            Freed::BindTimeout => self.counters.freed_bind_timeout += 1,
            Freed::Idle => self.counters.freed_idle += 1,
            Freed::Evicted => self.counters.evicted += 1,
            Freed::Mesh => self.counters.freed_mesh += 1,
        }
    }

    /// Counts a drop; returns the reason.
    fn count(&mut self, why: Drop) -> Drop {
        self.counters.drops[why.index()] += 1;
        why
    }

    fn drop(&mut self, why: Drop) -> Verdict {
        Verdict::Drop(self.count(why))
    }

    /// Decides what happens to `datagram`, received from `src` at `now`.
    /// A bind reply is written over `datagram` ([`Verdict::Reply`]).
    pub fn handle(&mut self, now: Instant, src: SocketAddr, datagram: &mut [u8]) -> Verdict {
        self.handle_in_train(now, src, datagram, &mut Train::default())
    }

    /// [`SessionTable::handle`] for one datagram of a received train (the
    /// datagrams of one source that GRO glued into one receive; `train`
    /// starts empty for each). Every datagram's header is checked; a data
    /// datagram with the VNI of the one before it, which was forwarded,
    /// goes the same way without another table lookup: the table cannot
    /// have changed in between, since anything else a datagram can do
    /// (a bind, a drop) ends the run.
    pub(crate) fn handle_in_train(
        &mut self,
        now: Instant,
        src: SocketAddr,
        datagram: &mut [u8],
        train: &mut Train,
    ) -> Verdict {
        let Ok(h) = Header::parse(datagram) else {
            train.note(0, None);
            return self.drop(Drop::BadHeader);
        };
        if let Some(to) = train.hit(&h) {
            self.counters.forwarded_packets += 1;
            self.counters.forwarded_bytes += datagram.len() as u64;
            return Verdict::Forward(to);
        }
        let src = ferry_proto::frame::canonical_addr(src);
        let v = if h.control {
            self.control(now, src, datagram)
        } else {
            self.data(now, src, h.vni, datagram.len())
        };
        train.note(
            h.vni,
            match v {
                Verdict::Forward(to) => Some(to),
                Verdict::Reply | Verdict::Drop(_) => None,
            },
        );
        v
    }

    /// A data datagram of `len` bytes for session `vni` from `src`.
    fn data(&mut self, now: Instant, src: SocketAddr, vni: u32, len: usize) -> Verdict {
        let Some(s) = self.sessions.get_mut(&vni) else {
            return self.drop(Drop::UnknownVni);
        };
        let to = match forward::between(s.bound.map(|b| b.map(|b| b.addr)), src) {
            Route::To { to, .. } => to,
            Route::Unbound => return self.drop(Drop::Unbound),
            Route::WrongSource => return self.drop(Drop::WrongSource),
        };
        s.last_active = now;
        self.counters.forwarded_packets += 1;
        self.counters.forwarded_bytes += len as u64;
        Verdict::Forward(to)
    }
}

pub(crate) mod allocate;
mod control;
pub(crate) mod port;
pub(crate) mod service;
#[cfg(test)]
mod tests;

pub use service::Sessions;
