//! Relay sessions' table, without I/O (`docs/relay-sessions.md` §2, §4, §5).
//!
//! Two SDK clients with admitted DERP connections ask (over DERP) for a
//! session; [`SessionTable::allocate`] finds the pair's session or makes
//! one: a random 24-bit VNI (never 0) and a random bind token per slot.
//! Each client then binds its slot from its UDP socket:
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
//! received batch, not per datagram.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::{self as rs, BindKind, BindMsg, RefuseReason};
use ferry_proto::udp_header::{self, Header};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How often the cookie secret rotates (the previous one stays valid for
/// as long again).
pub const SECRET_ROTATION: Duration = Duration::from_secs(120);
/// Attempts at a random unused VNI before the allocation is refused.
const VNI_TRIES: usize = 64;

/// A session table's limits and lifetimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sessions one key may be in.
    pub per_key: usize,
    /// Sessions asked for from one source IP (of the asker's DERP
    /// connection).
    pub per_ip: usize,
    /// How long a session waits for both slots to bind.
    pub bind_lifetime: Duration,
    /// How long a bound session lives without a forwarded datagram.
    pub idle_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_key: 32,
            per_ip: 256,
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
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
}

impl Drop {
    /// Every reason, in counter order.
    pub const ALL: [Drop; 8] = [
        Drop::BadHeader,
        Drop::BadBind,
        Drop::UnknownVni,
        Drop::BadCookie,
        Drop::BadProof,
        Drop::StaleGeneration,
        Drop::Unbound,
        Drop::WrongSource,
    ];

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

/// Where the last datagram of a received train went, so the next one of
/// the same session skips the lookup ([`SessionTable::handle_in_train`]).
/// Start a new one for every train: it holds for one source only.
#[derive(Clone, Copy, Debug, Default)]
pub struct Train {
    /// The VNI and destination of the last datagram, if it was forwarded.
    last: Option<(u32, SocketAddr)>,
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
    /// Sessions freed without being bound in time.
    pub freed_bind_timeout: u64,
    /// Bound sessions freed for silence.
    pub freed_idle: u64,
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
        self.drops[Drop::ALL.iter().position(|&d| d == why).expect("listed")]
    }
}

#[derive(Clone, Copy, Debug)]
struct Binding {
    addr: SocketAddr,
    generation: u32,
}

#[derive(Debug)]
struct Session {
    keys: [NodePublic; 2],
    tokens: [[u8; 32]; 2],
    bound: [Option<Binding>; 2],
    ip: IpAddr,
    created: Instant,
    last_active: Instant,
}

impl Session {
    fn both_bound(&self) -> bool {
        self.bound[0].is_some() && self.bound[1].is_some()
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
    secret: [u8; 32],
    previous: Option<[u8; 32]>,
    rotated_at: Instant,
    sessions: HashMap<u32, Session>,
    by_pair: HashMap<(NodePublic, NodePublic), u32>,
    per_key: HashMap<NodePublic, usize>,
    per_ip: HashMap<IpAddr, usize>,
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
            secret: rng.gen(),
            rng,
            previous: None,
            rotated_at: now,
            sessions: HashMap::new(),
            by_pair: HashMap::new(),
            per_key: HashMap::new(),
            per_ip: HashMap::new(),
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

    /// Sessions `key` is in.
    pub fn sessions_of(&self, key: &NodePublic) -> usize {
        self.per_key.get(key).copied().unwrap_or(0)
    }

    /// The session of `asker` and `peer`, made if they have none: a new one
    /// gives the asker slot 0, an existing one is returned unchanged (each
    /// keeps its slot). `ip` is the asker's DERP connection's source
    /// address, for the per-IP limit. Refuses [`RefuseReason::SelfPeer`]
    /// and [`RefuseReason::Limit`].
    pub fn allocate(
        &mut self,
        asker: &NodePublic,
        peer: &NodePublic,
        ip: IpAddr,
        now: Instant,
    ) -> Result<Allocation, RefuseReason> {
        if asker == peer {
            return Err(RefuseReason::SelfPeer);
        }
        let key = pair(asker, peer);
        if let Some(&vni) = self.by_pair.get(&key) {
            let s = &self.sessions[&vni];
            self.counters.reused += 1;
            return Ok(Allocation {
                vni,
                slot: u8::from(s.keys[1] == *asker),
                tokens: s.tokens,
                existing: true,
            });
        }
        let full = |m: &HashMap<NodePublic, usize>, k| m.get(k).copied().unwrap_or(0);
        if full(&self.per_key, asker) >= self.limits.per_key
            || full(&self.per_key, peer) >= self.limits.per_key
            || self.per_ip.get(&ip).copied().unwrap_or(0) >= self.limits.per_ip
        {
            self.counters.refused_limit += 1;
            return Err(RefuseReason::Limit);
        }
        let Some(vni) = (0..VNI_TRIES)
            .map(|_| self.rng.gen_range(1..=udp_header::MAX_VNI))
            .find(|v| !self.sessions.contains_key(v))
        else {
            self.counters.refused_limit += 1;
            return Err(RefuseReason::Limit);
        };
        let tokens = [self.rng.gen(), self.rng.gen()];
        self.sessions.insert(
            vni,
            Session {
                keys: [*asker, *peer],
                tokens,
                bound: [None, None],
                ip,
                created: now,
                last_active: now,
            },
        );
        self.by_pair.insert(key, vni);
        *self.per_key.entry(*asker).or_default() += 1;
        *self.per_key.entry(*peer).or_default() += 1;
        *self.per_ip.entry(ip).or_default() += 1;
        self.counters.allocated += 1;
        Ok(Allocation {
            vni,
            slot: 0,
            tokens,
            existing: false,
        })
    }

    /// Starts a new secret if the current one is [`SECRET_ROTATION`] old;
    /// the current one becomes the previous (still accepted).
    pub fn rotate(&mut self, now: Instant) {
        if now.saturating_duration_since(self.rotated_at) >= SECRET_ROTATION {
            self.previous = Some(self.secret);
            self.secret = self.rng.gen();
            self.rotated_at = now;
        }
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
            if let Some(n) = self.per_key.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.per_key.remove(k);
                }
            }
        }
        if let Some(n) = self.per_ip.get_mut(&s.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&s.ip);
            }
        }
        match why {
            Freed::BindTimeout => self.counters.freed_bind_timeout += 1,
            Freed::Idle => self.counters.freed_idle += 1,
        }
    }

    fn drop(&mut self, why: Drop) -> Verdict {
        self.counters.drops[Drop::ALL.iter().position(|&d| d == why).expect("listed")] += 1;
        Verdict::Drop(why)
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
    pub fn handle_in_train(
        &mut self,
        now: Instant,
        src: SocketAddr,
        datagram: &mut [u8],
        train: &mut Train,
    ) -> Verdict {
        let Ok(h) = Header::parse(datagram) else {
            train.last = None;
            return self.drop(Drop::BadHeader);
        };
        if let Some((vni, to)) = train.last {
            if !h.control && h.vni == vni {
                self.counters.forwarded_packets += 1;
                self.counters.forwarded_bytes += datagram.len() as u64;
                return Verdict::Forward(to);
            }
        }
        let src = ferry_proto::frame::canonical_addr(src);
        let v = if h.control {
            self.bind(now, src, datagram)
        } else {
            self.data(now, src, h.vni, datagram.len())
        };
        train.last = match v {
            Verdict::Forward(to) => Some((h.vni, to)),
            Verdict::Reply | Verdict::Drop(_) => None,
        };
        v
    }

    /// A data datagram of `len` bytes for session `vni` from `src`.
    fn data(&mut self, now: Instant, src: SocketAddr, vni: u32, len: usize) -> Verdict {
        let Some(s) = self.sessions.get_mut(&vni) else {
            return self.drop(Drop::UnknownVni);
        };
        let (Some(a), Some(b)) = (s.bound[0], s.bound[1]) else {
            return self.drop(Drop::Unbound);
        };
        let to = if src == a.addr {
            b.addr
        } else if src == b.addr {
            a.addr
        } else {
            return self.drop(Drop::WrongSource);
        };
        if to == src {
            // Both slots bound from one socket: never send a datagram
            // back where it came from.
            return self.drop(Drop::WrongSource);
        }
        s.last_active = now;
        self.counters.forwarded_packets += 1;
        self.counters.forwarded_bytes += len as u64;
        Verdict::Forward(to)
    }

    fn bind(&mut self, now: Instant, src: SocketAddr, datagram: &mut [u8]) -> Verdict {
        let Ok(m) = BindMsg::parse(datagram) else {
            return self.drop(Drop::BadBind);
        };
        let slot = usize::from(m.slot);
        let (secret, previous) = (self.secret, self.previous);
        let Some(s) = self.sessions.get_mut(&m.vni) else {
            return self.drop(Drop::UnknownVni);
        };
        let reply = match m.kind {
            BindKind::Bind => {
                self.counters.challenges += 1;
                BindMsg {
                    cookie: rs::cookie(&secret, m.vni, m.slot, m.generation, src),
                    ..BindMsg::new(BindKind::Challenge, m.vni, m.slot, m.generation)
                }
            }
            BindKind::Answer => {
                let cookie_ok = |secret: &[u8; 32]| {
                    rs::mac_eq(
                        &m.cookie,
                        &rs::cookie(secret, m.vni, m.slot, m.generation, src),
                    )
                };
                if !cookie_ok(&secret) && !previous.as_ref().is_some_and(cookie_ok) {
                    return self.drop(Drop::BadCookie);
                }
                let proof = rs::proof(&s.tokens[slot], m.vni, m.slot, m.generation, &m.cookie);
                if !rs::mac_eq(&m.proof, &proof) {
                    return self.drop(Drop::BadProof);
                }
                match s.bound[slot] {
                    Some(b) if m.generation < b.generation => {
                        return self.drop(Drop::StaleGeneration);
                    }
                    Some(b) if m.generation == b.generation && b.addr == src => {
                        // A repeated answer: bound again, nothing changes.
                    }
                    _ => {
                        s.bound[slot] = Some(Binding {
                            addr: src,
                            generation: m.generation,
                        });
                        s.last_active = now;
                        self.counters.binds += 1;
                    }
                }
                BindMsg::new(BindKind::Bound, m.vni, m.slot, m.generation)
            }
            BindKind::Challenge | BindKind::Bound => return self.drop(Drop::BadBind),
        };
        datagram.copy_from_slice(&reply.to_bytes());
        Verdict::Reply
    }
}

mod service;
#[cfg(test)]
mod tests;

pub use service::Sessions;
