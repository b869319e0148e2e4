//! The peer relay's endpoints, without I/O.
//!
//! - **Allocation** ([`PeerRelayTable::allocate`]): an endpoint serves a
//!   pair of disco keys, sorted bytewise (a client's slot is its index).
//!   The same pair gets the same endpoint (VNI and Lamport id) with the
//!   relay's current addresses; a new one gets a random VNI in 1 ..= 2²⁴ −
//!   1, the next Lamport id (starting at the wall clock in nanoseconds, so
//!   ids grow across restarts) and each slot's box key, computed once. A
//!   client key equal to the relay's, a pair of one key twice, no address
//!   to offer, or a limit (per requester node, per disco key, in all)
//!   refuses.
//! - **Binds** ([`ferry_proto::peer_relay`]): a bind is challenged with a
//!   stateless cookie under a secret that rotates every
//!   [`SECRET_ROTATION`](crate::session::SECRET_ROTATION) (the previous
//!   one still accepted); an answer
//!   whose cookie is its source's binds the slot to that source, unless a
//!   newer generation is bound. The challenge is written over the bind
//!   (160 bytes each), so nothing is amplified.
//! - **Forwarding**: a data datagram (control bit clear, any protocol)
//!   with a known VNI from one bound address goes, unchanged, to the
//!   other, and counts as that side's last sign of life.
//! - **Lifetimes**, as Tailscale's relay keeps them: an endpoint not bound
//!   on both sides [`Limits::bind_lifetime`] after its allocation is
//!   freed; a bound one is freed as soon as **either** side has been
//!   silent for [`Limits::steady_state_lifetime`].
//!
//! Every drop is counted by [`Drop`] reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::disco::{AllocateRequest, AllocateResponse, BindBody, RelayEndpoint};
use ferry_proto::key::{DiscoPrivate, DiscoPublic, NodePublic};
use ferry_proto::nacl::SharedKey;
use ferry_proto::peer_relay::{self as pr, BindError, BindStep};
use ferry_proto::udp_header::{self, Header};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::forward::{self, Route, Train};
use crate::session::{Binding, Rotation, Secrets};

/// Attempts at a random unused VNI before an allocation is refused.
const VNI_TRIES: usize = 64;

/// The table's limits and lifetimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Endpoints one requester (a node key) may have asked for.
    pub per_requester: usize,
    /// Endpoints one disco key may be in.
    pub per_disco: usize,
    /// Endpoints in all.
    pub total: usize,
    /// How long an endpoint waits for both sides to bind.
    pub bind_lifetime: Duration,
    /// How long a bound endpoint lives while one side is silent.
    pub steady_state_lifetime: Duration,
    /// Control datagrams per second one source (an IPv4 address, or an
    /// IPv6 /64) may send to the port, on each shard ...
    pub bind_rate: u32,
    /// ... and their burst. Beyond, they are dropped before any crypto
    /// ([`Drop::RateLimited`]).
    pub bind_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_requester: 256,
            per_disco: 256,
            total: 65_536,
            bind_lifetime: Duration::from_secs(30),
            steady_state_lifetime: Duration::from_secs(300),
            bind_rate: 64,
            bind_burst: 128,
        }
    }
}

/// Why an allocation was refused (Tailscale has no refusal message: the
/// control half stays silent and counts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A client key is the relay's own.
    ServerDisco,
    /// Both client keys are the same.
    SamePair,
    /// The relay has no address to offer yet.
    NotReady,
    /// The requester has [`Limits::per_requester`] endpoints.
    RequesterLimit,
    /// A client key is in [`Limits::per_disco`] endpoints.
    DiscoLimit,
    /// The table holds [`Limits::total`] endpoints (or no free VNI was
    /// found).
    TotalLimit,
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Drop {
    /// No valid 8-byte header.
    BadHeader,
    /// A control datagram refused before any crypto: wrong protocol,
    /// length, VNI 0 or no disco magic.
    BadControl,
    /// No endpoint has this VNI.
    UnknownVni,
    /// The sender is neither client of the endpoint.
    UnknownSender,
    /// The box did not open.
    BadBox,
    /// Opened, but not a bind or an answer.
    UnexpectedType,
    /// The sealed VNI is not the header's.
    VniMismatch,
    /// The remote key is not the other client.
    WrongRemoteKey,
    /// Generation 0.
    ZeroGeneration,
    /// An answer whose challenge is not this source's under either secret.
    BadChallenge,
    /// An answer older than the slot's bound generation.
    StaleGeneration,
    /// Data for an endpoint not bound on both sides.
    Unbound,
    /// Data from an address that is neither side's.
    WrongSource,
    /// A control datagram from a source over its rate
    /// ([`Limits::bind_rate`]), dropped by the port before the table.
    RateLimited,
}

impl Drop {
    /// Every reason, in counter order.
    pub const ALL: [Drop; 14] = [
        Drop::BadHeader,
        Drop::BadControl,
        Drop::UnknownVni,
        Drop::UnknownSender,
        Drop::BadBox,
        Drop::UnexpectedType,
        Drop::VniMismatch,
        Drop::WrongRemoteKey,
        Drop::ZeroGeneration,
        Drop::BadChallenge,
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
            Drop::BadControl => "bad_control",
            Drop::UnknownVni => "unknown_vni",
            Drop::UnknownSender => "unknown_sender",
            Drop::BadBox => "bad_box",
            Drop::UnexpectedType => "unexpected_type",
            Drop::VniMismatch => "vni_mismatch",
            Drop::WrongRemoteKey => "wrong_remote_key",
            Drop::ZeroGeneration => "zero_generation",
            Drop::BadChallenge => "bad_challenge",
            Drop::StaleGeneration => "stale_generation",
            Drop::Unbound => "unbound",
            Drop::WrongSource => "wrong_source",
            Drop::RateLimited => "rate_limited",
        }
    }
}

/// Why an endpoint was freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freed {
    /// Not bound on both sides within the bind lifetime.
    BindTimeout,
    /// Bound, but one side silent for the steady-state lifetime.
    Idle,
    /// Freed by the control half ([`PeerRelayTable::revoke`]).
    Revoked,
}

/// What to do with a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it, unchanged, to this address.
    Forward(SocketAddr),
    /// The first this many bytes of the datagram were rewritten into the
    /// reply (a challenge): send them back to the source.
    Reply(usize),
    /// A valid answer: the slot is bound (or stays bound); nothing to send.
    Bound,
    /// Drop it.
    Drop(Drop),
}

/// A successful allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// What to answer the requester with (its generation echoed), sealed
    /// to its disco key over DERP.
    pub response: AllocateResponse,
    /// Whether the pair already had this endpoint.
    pub existing: bool,
}

/// Endpoints per state, for gauges (Tailscale's two states).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct States {
    /// Not bound on both sides yet.
    pub connecting: usize,
    /// Bound on both: forwarding.
    pub open: usize,
}

/// Cumulative counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// New endpoints made.
    pub allocated: u64,
    /// Allocations answered with an existing endpoint.
    pub existing: u64,
    /// Refused allocations (all reasons).
    pub refused: u64,
    /// Freed without being bound in time.
    pub freed_bind_timeout: u64,
    /// Freed for one side's silence.
    pub freed_idle: u64,
    /// Freed by the control half.
    pub freed_revoked: u64,
    /// Slots bound (first binds and rebinds).
    pub binds: u64,
    /// Challenges sent.
    pub challenges: u64,
    /// Datagrams forwarded.
    pub forwarded_packets: u64,
    /// Bytes forwarded.
    pub forwarded_bytes: u64,
    /// Data datagrams looked up in the table: the first of each run of
    /// one endpoint's datagrams in a received train (the rest go where it
    /// went).
    pub lookups: u64,
    /// Drops, indexed like [`Drop::ALL`].
    pub drops: [u64; Drop::ALL.len()],
}

impl Counters {
    /// Drops for one reason.
    pub fn dropped(&self, why: Drop) -> u64 {
        self.drops[why.index()]
    }
}

struct Endpoint {
    pair: [DiscoPublic; 2],
    /// Box keys between the relay and each slot's client (shared with
    /// the ports' [`Opener`]s).
    keys: Arc<[SharedKey; 2]>,
    lamport_id: u64,
    requester: NodePublic,
    allocated_at: Instant,
    bound: [Option<Binding>; 2],
    last_seen: [Instant; 2],
}

impl Endpoint {
    fn both_bound(&self) -> bool {
        self.bound.iter().all(Option::is_some)
    }

    fn addrs(&self) -> [Option<SocketAddr>; 2] {
        self.bound.map(|b| b.map(|b| b.addr))
    }
}

fn sorted(a: DiscoPublic, b: DiscoPublic) -> [DiscoPublic; 2] {
    if a <= b {
        [a, b]
    } else {
        [b, a]
    }
}

/// The relay's endpoints: allocation, binds, forwarding, expiry.
pub struct PeerRelayTable {
    server: DiscoPrivate,
    limits: Limits,
    rng: StdRng,
    secrets: Rotation,
    next_lamport: u64,
    endpoints: HashMap<u32, Endpoint>,
    by_pair: HashMap<[DiscoPublic; 2], u32>,
    per_disco: HashMap<DiscoPublic, usize>,
    per_requester: HashMap<NodePublic, usize>,
    counters: Counters,
}

impl PeerRelayTable {
    /// An empty table serving with `server` (the relay's disco key: fresh
    /// per process, as Tailscale's), random VNIs, secrets and nonces, and
    /// Lamport ids from the wall clock, at `now`.
    pub fn new(server: DiscoPrivate, limits: Limits, now: Instant) -> PeerRelayTable {
        let lamport = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2));
        Self::with_rng(server, limits, StdRng::from_entropy(), lamport, now)
    }

    /// A table whose randomness comes from `seed` and whose Lamport ids
    /// start after `lamport` (tests and fuzzing).
    pub fn with_seed(
        server: DiscoPrivate,
        limits: Limits,
        seed: u64,
        lamport: u64,
        now: Instant,
    ) -> PeerRelayTable {
        Self::with_rng(server, limits, StdRng::seed_from_u64(seed), lamport, now)
    }

    fn with_rng(
        server: DiscoPrivate,
        limits: Limits,
        mut rng: StdRng,
        lamport: u64,
        now: Instant,
    ) -> PeerRelayTable {
        PeerRelayTable {
            server,
            limits,
            secrets: Rotation::new(&mut rng, now),
            rng,
            next_lamport: lamport,
            endpoints: HashMap::new(),
            by_pair: HashMap::new(),
            per_disco: HashMap::new(),
            per_requester: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// The relay's disco key (the `ServerDisco` of every endpoint).
    pub fn server_disco(&self) -> DiscoPublic {
        self.server.public()
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Endpoints now.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Whether an endpoint has this VNI.
    pub fn has_endpoint(&self, vni: u32) -> bool {
        self.endpoints.contains_key(&vni)
    }

    /// Endpoints per state now.
    pub fn states(&self) -> States {
        let open = self.endpoints.values().filter(|e| e.both_bound()).count();
        States {
            connecting: self.endpoints.len() - open,
            open,
        }
    }

    /// The endpoint of `request`'s pair, made if it has none, answered
    /// with `addrs` (the relay's current addresses) and the request's
    /// generation. `requester` is the node that asked (the control half
    /// has checked that it may, and that its disco key is in the pair).
    pub fn allocate(
        &mut self,
        requester: &NodePublic,
        request: &AllocateRequest,
        addrs: &[SocketAddr],
        now: Instant,
    ) -> Result<Allocated, Refusal> {
        let r = self.try_allocate(requester, request, addrs, now);
        match &r {
            Ok(a) if a.existing => self.counters.existing += 1,
            Ok(_) => self.counters.allocated += 1,
            Err(_) => self.counters.refused += 1,
        }
        r
    }

    fn try_allocate(
        &mut self,
        requester: &NodePublic,
        request: &AllocateRequest,
        addrs: &[SocketAddr],
        now: Instant,
    ) -> Result<Allocated, Refusal> {
        let [a, b] = request.client_disco;
        let server = self.server.public();
        if a == server || b == server {
            return Err(Refusal::ServerDisco);
        }
        if a == b {
            return Err(Refusal::SamePair);
        }
        if addrs.is_empty() {
            return Err(Refusal::NotReady);
        }
        let pair = sorted(a, b);
        if let Some(&vni) = self.by_pair.get(&pair) {
            let lamport = self.endpoints[&vni].lamport_id;
            return Ok(self.answer(pair, vni, lamport, request.generation, addrs, true));
        }
        if self.endpoints.len() >= self.limits.total {
            return Err(Refusal::TotalLimit);
        }
        if self.per_requester.get(requester).copied().unwrap_or(0) >= self.limits.per_requester {
            return Err(Refusal::RequesterLimit);
        }
        if pair
            .iter()
            .any(|k| self.per_disco.get(k).copied().unwrap_or(0) >= self.limits.per_disco)
        {
            return Err(Refusal::DiscoLimit);
        }
        let Some(vni) = (0..VNI_TRIES)
            .map(|_| self.rng.gen_range(1..=udp_header::MAX_VNI))
            .find(|v| !self.endpoints.contains_key(v))
        else {
            return Err(Refusal::TotalLimit);
        };
        self.next_lamport = self.next_lamport.wrapping_add(1);
        let lamport = self.next_lamport;
        self.endpoints.insert(
            vni,
            Endpoint {
                pair,
                keys: Arc::new(pair.map(|k| self.server.shared(&k))),
                lamport_id: lamport,
                requester: *requester,
                allocated_at: now,
                bound: [None, None],
                last_seen: [now; 2],
            },
        );
        self.by_pair.insert(pair, vni);
        for k in pair {
            *self.per_disco.entry(k).or_default() += 1;
        }
        *self.per_requester.entry(*requester).or_default() += 1;
        Ok(self.answer(pair, vni, lamport, request.generation, addrs, false))
    }

    fn answer(
        &self,
        pair: [DiscoPublic; 2],
        vni: u32,
        lamport_id: u64,
        generation: u32,
        addrs: &[SocketAddr],
        existing: bool,
    ) -> Allocated {
        Allocated {
            response: AllocateResponse {
                generation,
                endpoint: RelayEndpoint {
                    server_disco: self.server.public(),
                    client_disco: pair,
                    lamport_id,
                    vni,
                    bind_lifetime: self.limits.bind_lifetime,
                    steady_state_lifetime: self.limits.steady_state_lifetime,
                    endpoints: addrs.to_vec(),
                },
            },
            existing,
        }
    }

    /// Starts a new cookie secret if the current one is
    /// [`SECRET_ROTATION`](crate::session::SECRET_ROTATION) old; `true` if
    /// it rotated.
    pub fn rotate(&mut self, now: Instant) -> bool {
        self.secrets.rotate(&mut self.rng, now)
    }

    /// Frees endpoints past their lifetimes (see the module doc); returns
    /// how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let l = self.limits;
        let since = |t: Instant| now.saturating_duration_since(t);
        let gone: Vec<(u32, Freed)> = self
            .endpoints
            .iter()
            .filter_map(|(&vni, e)| {
                if !e.both_bound() {
                    (since(e.allocated_at) >= l.bind_lifetime).then_some((vni, Freed::BindTimeout))
                } else {
                    e.last_seen
                        .iter()
                        .any(|&t| since(t) >= l.steady_state_lifetime)
                        .then_some((vni, Freed::Idle))
                }
            })
            .collect();
        for &(vni, why) in &gone {
            self.free(vni, why);
        }
        gone.len()
    }

    /// Frees every endpoint `requester` asked for that `keep` refuses
    /// (the control half's grant was withdrawn); returns how many.
    pub fn revoke(&mut self, mut keep: impl FnMut(&NodePublic) -> bool) -> usize {
        let gone: Vec<u32> = self
            .endpoints
            .iter()
            .filter(|(_, e)| !keep(&e.requester))
            .map(|(&vni, _)| vni)
            .collect();
        for &vni in &gone {
            self.free(vni, Freed::Revoked);
        }
        gone.len()
    }

    fn free(&mut self, vni: u32, why: Freed) {
        let Some(e) = self.endpoints.remove(&vni) else {
            return;
        };
        self.by_pair.remove(&e.pair);
        for k in e.pair {
            decrement(&mut self.per_disco, &k);
        }
        decrement(&mut self.per_requester, &e.requester);
        match why {
            Freed::BindTimeout => self.counters.freed_bind_timeout += 1,
            Freed::Idle => self.counters.freed_idle += 1,
            Freed::Revoked => self.counters.freed_revoked += 1,
        }
    }

    fn drop(&mut self, why: Drop) -> Verdict {
        self.counters.drops[why.index()] += 1;
        Verdict::Drop(why)
    }

    /// Decides what happens to `datagram`, received from `src` at `now`.
    /// A challenge is written over the datagram ([`Verdict::Reply`]).
    pub fn handle(&mut self, now: Instant, src: SocketAddr, datagram: &mut [u8]) -> Verdict {
        self.handle_in_train(now, src, datagram, &mut Train::default())
    }

    /// [`PeerRelayTable::handle`] for one datagram of a received train
    /// (`train` starts empty for each): every header is checked, but a data
    /// datagram for the endpoint of the one before it, which was
    /// forwarded, goes the same way without a lookup (see [`Train`]).
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
        let to = match v {
            Verdict::Forward(to) => Some(to),
            Verdict::Reply(_) | Verdict::Bound | Verdict::Drop(_) => None,
        };
        train.note(h.vni, to);
        v
    }

    /// A data datagram of `len` bytes for endpoint `vni` from `src`.
    fn data(&mut self, now: Instant, src: SocketAddr, vni: u32, len: usize) -> Verdict {
        self.counters.lookups += 1;
        let Some(e) = self.endpoints.get_mut(&vni) else {
            return self.drop(Drop::UnknownVni);
        };
        match forward::between(e.addrs(), src) {
            Route::To { from, to } => {
                e.last_seen[from] = now;
                self.counters.forwarded_packets += 1;
                self.counters.forwarded_bytes += len as u64;
                Verdict::Forward(to)
            }
            Route::Unbound => self.drop(Drop::Unbound),
            Route::WrongSource => self.drop(Drop::WrongSource),
        }
    }

    /// A control datagram from `src` (canonical), opened and applied in
    /// one go (the sans-IO path; the port splits the same steps around
    /// its lock, see [`super::port`]).
    fn control(&mut self, now: Instant, src: SocketAddr, datagram: &mut [u8]) -> Verdict {
        let Ok(c) = pr::parse_control(datagram) else {
            return self.drop(Drop::BadControl);
        };
        let opened = self
            .opener(&c)
            .and_then(|o| o.open(datagram).map(|step| (o, step)));
        let (o, step) = match opened {
            Ok(x) => x,
            Err(why) => return self.drop(why),
        };
        let secrets = self.secrets.secrets();
        match step {
            BindStep::Bind(body) => {
                let nonce: [u8; 24] = self.rng.gen();
                let server = self.server.public();
                let n = o.challenge(&secrets, &server, &body, src, &nonce, datagram);
                self.counters.challenges += 1;
                Verdict::Reply(n)
            }
            BindStep::Answer(body) => {
                if !o.answer_is_valid(&secrets, &body, src) {
                    return self.drop(Drop::BadChallenge);
                }
                self.bind(now, &o, &body, src)
            }
        }
    }

    /// What opening a control datagram (through [`pr::parse_control`]:
    /// `c`) needs of its endpoint, looked up (no crypto).
    pub(crate) fn opener(&self, c: &pr::Control) -> Result<Opener, Drop> {
        let e = self.endpoints.get(&c.vni).ok_or(Drop::UnknownVni)?;
        let slot = e
            .pair
            .iter()
            .position(|k| *k == c.sender)
            .ok_or(Drop::UnknownSender)?;
        Ok(Opener {
            vni: c.vni,
            slot,
            lamport_id: e.lamport_id,
            keys: Arc::clone(&e.keys),
            remote: e.pair[1 - slot],
        })
    }

    /// The cookie secrets now (current and previous).
    pub(crate) fn secrets(&self) -> Secrets {
        self.secrets.secrets()
    }

    /// Binds `o`'s slot to `src` (canonical) for a valid answer carrying
    /// `body`: unless the endpoint is gone (or is another one by now) or
    /// the slot is bound at a newer generation.
    pub(crate) fn bind(
        &mut self,
        now: Instant,
        o: &Opener,
        body: &BindBody,
        src: SocketAddr,
    ) -> Verdict {
        let Some(e) = self
            .endpoints
            .get_mut(&o.vni)
            .filter(|e| e.lamport_id == o.lamport_id)
        else {
            return self.drop(Drop::UnknownVni);
        };
        match e.bound[o.slot] {
            Some(b) if !pr::generation_is_current(body.generation, b.generation) => {
                return self.drop(Drop::StaleGeneration);
            }
            Some(b) if b.generation == body.generation && b.addr == src => {
                // A repeated answer: still bound, nothing changes.
            }
            _ => {
                e.bound[o.slot] = Some(Binding {
                    addr: src,
                    generation: body.generation,
                });
                e.last_seen[o.slot] = now;
                self.counters.binds += 1;
            }
        }
        Verdict::Bound
    }

    /// Adds drops (by [`Drop`] index) and challenges counted by the port
    /// outside the lock, and zeroes them there.
    pub(crate) fn add_from_port(
        &mut self,
        drops: &mut [u64; Drop::ALL.len()],
        challenges: &mut u64,
    ) {
        for (total, n) in self.counters.drops.iter_mut().zip(drops.iter_mut()) {
            *total += std::mem::take(n);
        }
        self.counters.challenges += std::mem::take(challenges);
    }
}

/// What opening a control datagram needs of its endpoint, taken from the
/// table ([`PeerRelayTable::opener`]) so that the box is opened, checked
/// and the challenge sealed without holding it.
pub(crate) struct Opener {
    vni: u32,
    /// The sender's slot.
    slot: usize,
    /// Which endpoint of this VNI it was: an answer binds only that one.
    lamport_id: u64,
    keys: Arc<[SharedKey; 2]>,
    /// The other client's key.
    remote: DiscoPublic,
}

impl Opener {
    /// Opens `datagram` in place and checks it against the endpoint.
    pub(crate) fn open(&self, datagram: &mut [u8]) -> Result<BindStep, Drop> {
        pr::open_bind(&self.keys[self.slot], datagram, self.vni, &self.remote).map_err(|err| {
            match err {
                BindError::BadBox => Drop::BadBox,
                BindError::WrongType => Drop::UnexpectedType,
                BindError::VniMismatch => Drop::VniMismatch,
                BindError::WrongRemoteKey => Drop::WrongRemoteKey,
                BindError::ZeroGeneration => Drop::ZeroGeneration,
                _ => Drop::BadControl,
            }
        })
    }

    /// Writes the challenge to a bind carrying `body` from `src` over
    /// `datagram`, from `server` under `secrets`' current one, sealed with
    /// `nonce`; its length.
    pub(crate) fn challenge(
        &self,
        secrets: &Secrets,
        server: &DiscoPublic,
        body: &BindBody,
        src: SocketAddr,
        nonce: &[u8; 24],
        datagram: &mut [u8],
    ) -> usize {
        let slot = self.slot as u8;
        let cookie = pr::challenge(&secrets.current, body.vni, slot, body.generation, src);
        pr::write_challenge(datagram, &self.keys[self.slot], server, nonce, body, cookie)
    }

    /// Whether an answer carrying `body` from `src` echoes its challenge
    /// under either secret.
    pub(crate) fn answer_is_valid(
        &self,
        secrets: &Secrets,
        body: &BindBody,
        src: SocketAddr,
    ) -> bool {
        let slot = self.slot as u8;
        pr::answer_is_valid(&secrets.current, secrets.previous.as_ref(), slot, body, src)
    }
}

fn decrement<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = map.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            map.remove(k);
        }
    }
}

#[cfg(test)]
mod tests;
