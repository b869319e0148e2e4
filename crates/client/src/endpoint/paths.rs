//! The path manager: for every peer, which paths exist, which of them work,
//! and which one carries the next datagram. Sans-IO: time comes in as an
//! argument, probes go out as [`Transmit`]s, switches as [`PathEvent`]s,
//! and [`crate::Endpoint`] (or a test with simulated time) drives it.
//!
//! A peer's paths:
//!
//! - **DERP**, always there: the floor. It is pinged now and then for its
//!   round-trip time, but chosen whether it answers or not.
//! - **Direct** UDP, one path per candidate address: the addresses the peer
//!   sent in call-me-maybe, and the sources of its authenticated probes.
//! - **Relay session**: a bound relay session (session id and relay
//!   address), once the endpoint has one.
//!
//! A UDP path is **confirmed** (state [`PathState::Working`]) only by an
//! authenticated pong that answers a ping this side sent *on that path*;
//! it is [`PathState::Dead`] once no pong came for [`Timing::dead_after`].
//! Working paths are pinged every [`Timing::probe_interval`], the others
//! every [`Timing::discover_interval`]; an unconfirmed UDP path is also
//! pinged at once when the peer's authenticated ping arrives on it, so a
//! relay session whose two sides bound at different times is confirmed
//! one round trip after the second bind, not at the next discovery ping.
//!
//! The choice: the best working kind, direct > relay > DERP (a peer's
//! `prefer` moves one kind first, `only` allows one kind alone); among paths
//! of one kind the one with the lowest round trip, kept until it dies. A
//! better kind is taken as soon as its first pong arrives; a dead active
//! path is left as soon as it is found dead. The datagrams sent on the old
//! path since its last pong are reported as possibly lost when it died.
//!
//! Every datagram is counted on its path and in the peer's totals by kind
//! ([`PeerStatus::totals`]), which outlive the paths, so they never go
//! backwards. A datagram longer than its path carries ([`PathMtu`]) is
//! refused before it is counted.
//!
//! Inputs: [`Paths::add_peer`], [`Paths::set_local_candidates`],
//! [`Paths::set_relay`], [`Paths::handle_probe`], [`Paths::handle_timeout`];
//! the per-datagram [`Paths::on_send`] and [`Paths::on_receive`]. Outputs,
//! drained after every input: [`Paths::poll_transmit`],
//! [`Paths::poll_event`], [`Paths::poll_timeout`].

use super::mtu::PathMtu;
pub use super::path_status::{PathStats, PathStatus, PeerStatus, PeerTotals};
use ferry_proto::key::NodePublic;
use ferry_proto::peer_msg::{Probe, MAX_ENDPOINTS, TX_ID_LEN};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

/// The kinds of path, best first. A closed set (not `#[non_exhaustive]`):
/// a match over it needs no catch-all arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathKind {
    /// UDP straight to the peer.
    Direct,
    /// UDP through a relay session.
    RelaySession,
    /// Packets through the peer's DERP server.
    Derp,
}

/// One path to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathAddr {
    /// UDP to this address, header VNI 0.
    Direct(SocketAddr),
    /// UDP to a relay's session socket, header VNI `vni`.
    RelaySession {
        /// The session id.
        vni: u32,
        /// The relay's session address.
        addr: SocketAddr,
    },
    /// Through the peer's DERP server.
    Derp,
}

impl PathAddr {
    /// The path's kind.
    pub fn kind(&self) -> PathKind {
        match self {
            PathAddr::Direct(_) => PathKind::Direct,
            PathAddr::RelaySession { .. } => PathKind::RelaySession,
            PathAddr::Derp => PathKind::Derp,
        }
    }

    /// How large a datagram the path carries.
    pub fn mtu(&self) -> PathMtu {
        PathMtu::of(self)
    }
}

impl std::fmt::Display for PathAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathAddr::Direct(a) => write!(f, "direct {a}"),
            PathAddr::RelaySession { vni, addr } => write!(f, "relay {addr} session {vni:#x}"),
            PathAddr::Derp => f.write_str("DERP"),
        }
    }
}

/// How a path is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathState {
    /// No pong yet.
    Unconfirmed,
    /// A pong answered within [`Timing::dead_after`].
    Working,
    /// Worked once, silent for [`Timing::dead_after`] since.
    Dead,
}

/// The probing schedule: [`Timing::default`] or [`Timing::for_tunnels`],
/// fields changed as needed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timing {
    /// Pings on a working UDP path (keepalive and liveness).
    pub probe_interval: Duration,
    /// A working path without a pong for this long is dead.
    pub dead_after: Duration,
    /// Pings on paths not (or no longer) confirmed, and on DERP.
    pub discover_interval: Duration,
    /// This side's candidate addresses are sent to every peer over DERP this
    /// often (and at once when they change).
    pub call_me_maybe_interval: Duration,
    /// A direct candidate neither refreshed (call-me-maybe, probe) nor
    /// answering for this long is forgotten.
    pub candidate_lifetime: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            probe_interval: Duration::from_millis(500),
            dead_after: Duration::from_millis(1500),
            discover_interval: Duration::from_secs(2),
            call_me_maybe_interval: Duration::from_secs(10),
            candidate_lifetime: Duration::from_secs(60),
        }
    }
}

impl Timing {
    /// The schedule for a tunnel carrying TCP (`ferry link` uses it): the
    /// active UDP path pinged every 250 ms and dead after 1 s without a
    /// pong, faster than the default (500 ms, 1.5 s). A TCP connection
    /// inside the tunnel retransmits 0.2, 0.6 and 1.4 s after a loss (its
    /// RTO doubling from 200 ms), so with the path declared dead within
    /// 1.25 s the 1.4 s retransmission goes out on the next path, and the
    /// transfer stalls for about 1.5 s rather than 3.
    pub fn for_tunnels() -> Timing {
        Timing {
            probe_interval: Duration::from_millis(250),
            dead_after: Duration::from_secs(1),
            ..Timing::default()
        }
    }

    /// How long a working path may go without a pong: DERP is pinged only
    /// every discovery interval (and its state is for show: it stays the
    /// floor whatever it is).
    fn silence_limit(&self, path: &PathAddr) -> Duration {
        match path {
            PathAddr::Derp => self.discover_interval + self.dead_after,
            _ => self.dead_after,
        }
    }
}

/// Which paths a peer may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// This kind first, when it works.
    pub prefer: Option<PathKind>,
    /// This kind alone; datagrams are dropped while it does not work.
    pub only: Option<PathKind>,
}

impl Policy {
    /// Lower is better; `None` when the policy rules the kind out.
    fn rank(&self, kind: PathKind) -> Option<u8> {
        match self.only {
            Some(only) if only != kind => None,
            _ if self.prefer == Some(kind) => Some(0),
            _ => Some(1 + kind as u8),
        }
    }
}

/// Why the active path changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SwitchReason {
    /// A better path answered a ping.
    Better,
    /// The active path went silent.
    Silent,
    /// The active path was removed (a relay session ended).
    Removed,
    /// The peer's policy (`prefer`, `only`) changed.
    Policy,
}

/// A change of a peer's active path.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathEvent {
    /// The peer.
    pub peer: NodePublic,
    /// The old path (`None`: there was none, under `only`).
    pub from: Option<PathAddr>,
    /// The new path (`None`: none is allowed and working, under `only`).
    pub to: Option<PathAddr>,
    /// Why.
    pub reason: SwitchReason,
    /// Datagrams sent on the old path since its last pong, when it died or
    /// was removed (possibly lost); 0 when it still worked.
    pub lost: u64,
    /// When, by the wall clock (see [`Paths::wall_time`]).
    pub at: SystemTime,
}

/// A probe to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// To whom.
    pub peer: NodePublic,
    /// On which path.
    pub path: PathAddr,
    /// What.
    pub probe: Probe,
}

/// Why [`Paths::on_send`] has no path for a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoPath {
    /// The peer was never added.
    #[error("unknown peer")]
    UnknownPeer,
    /// Under `only`, no path of that kind works now.
    #[error("no allowed path works")]
    NoneAllowed,
    /// Longer than the active path carries.
    #[error("{len} bytes, at most {max} on {path:?}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The path's limit ([`PathMtu::max`]).
        max: usize,
        /// The active path's kind.
        path: PathKind,
    },
}

/// Direct candidates kept per peer (the active one is never evicted).
const MAX_CANDIDATES: usize = 16;
/// Pings remembered per path for matching pongs.
const MAX_PENDING: usize = 16;
/// A peer's ping tx ids remembered to refuse replays.
const SEEN_PINGS: usize = 256;
/// This side's addresses as peers' pongs reported them, kept (latest
/// first) and announced besides the local candidates.
const MAX_REFLEXIVE: usize = 4;

#[derive(Debug)]
struct Path {
    addr: PathAddr,
    state: PathState,
    rtt: Option<Duration>,
    last_pong: Option<Instant>,
    next_ping: Instant,
    pending: VecDeque<([u8; TX_ID_LEN], Instant)>,
    since_pong: u64,
    refreshed: Instant,
    stats: PathStats,
}

impl Path {
    fn new(addr: PathAddr, now: Instant) -> Path {
        Path {
            addr,
            state: PathState::Unconfirmed,
            rtt: None,
            last_pong: None,
            next_ping: now,
            pending: VecDeque::new(),
            since_pong: 0,
            refreshed: now,
            stats: PathStats::default(),
        }
    }

    /// Whether the choice may take it: DERP always, UDP when confirmed.
    fn usable(&self) -> bool {
        self.addr == PathAddr::Derp || self.state == PathState::Working
    }

    fn status(&self) -> PathStatus {
        PathStatus {
            addr: self.addr,
            mtu: self.addr.mtu(),
            state: self.state,
            rtt: self.rtt,
            stats: self.stats,
        }
    }
}

#[derive(Debug)]
struct Peer {
    policy: Policy,
    /// DERP at index 0, always.
    paths: Vec<Path>,
    active: Option<PathAddr>,
    last_switch: Option<PathEvent>,
    next_call_me_maybe: Instant,
    /// The tx ids of the peer's latest pings, answered once each.
    seen_pings: VecDeque<[u8; TX_ID_LEN]>,
    /// Every path's traffic since the peer was added, by kind.
    totals: PeerTotals,
}

impl Peer {
    fn path(&self, addr: &PathAddr) -> Option<&Path> {
        self.paths.iter().find(|p| p.addr == *addr)
    }

    fn path_mut(&mut self, addr: &PathAddr) -> Option<&mut Path> {
        self.paths.iter_mut().find(|p| p.addr == *addr)
    }

    /// The best usable path the policy allows.
    fn best(&self) -> Option<&Path> {
        self.paths
            .iter()
            .filter(|p| p.usable())
            .filter_map(|p| Some((self.policy.rank(p.addr.kind())?, p)))
            .min_by_key(|(rank, p)| (*rank, p.rtt.unwrap_or(Duration::MAX)))
            .map(|(_, p)| p)
    }

    fn rank(&self, addr: &PathAddr) -> Option<u8> {
        self.policy.rank(addr.kind())
    }
}

/// The path manager of one endpoint: every peer's paths.
#[derive(Debug)]
pub struct Paths {
    timing: Timing,
    peers: HashMap<NodePublic, Peer>,
    /// Direct addresses and relay sessions → the peer they lead to, for
    /// datagrams that carry no key (payloads).
    owners: HashMap<PathAddr, NodePublic>,
    local: Vec<SocketAddr>,
    /// The candidates last set, without the reflexive ones.
    base: Vec<SocketAddr>,
    /// This side's addresses as peers saw them (pongs on direct paths).
    reflexive: VecDeque<SocketAddr>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<PathEvent>,
    rng: StdRng,
    /// A monotonic instant and the wall-clock time it was, for events.
    epoch: (Instant, SystemTime),
}

impl Paths {
    /// A manager without peers. `seed` fixes the ping ids (tests).
    pub fn new(timing: Timing, seed: Option<u64>) -> Paths {
        Paths {
            timing,
            peers: HashMap::new(),
            owners: HashMap::new(),
            local: Vec::new(),
            base: Vec::new(),
            reflexive: VecDeque::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            rng: match seed {
                Some(s) => StdRng::seed_from_u64(s),
                None => StdRng::from_entropy(),
            },
            epoch: (Instant::now(), SystemTime::now()),
        }
    }

    /// The wall-clock time of the monotonic instant `at`, as events carry
    /// it: the time this manager was made plus the monotonic time since
    /// (so a simulated clock maps to a simulated wall clock one for one,
    /// and a change of the system clock later does not reorder events).
    pub fn wall_time(&self, at: Instant) -> SystemTime {
        let (mono, wall) = self.epoch;
        if at >= mono {
            wall + (at - mono)
        } else {
            wall.checked_sub(mono - at).unwrap_or(wall)
        }
    }

    /// Adds a peer (DERP path only, call-me-maybe due now), or changes the
    /// policy of a known one.
    pub fn add_peer(&mut self, now: Instant, key: NodePublic, policy: Policy) {
        if let Some(peer) = self.peers.get_mut(&key) {
            peer.policy = policy;
            self.choose(now, key, SwitchReason::Policy);
            return;
        }
        let mut peer = Peer {
            policy,
            paths: vec![Path::new(PathAddr::Derp, now)],
            active: None,
            last_switch: None,
            next_call_me_maybe: now,
            seen_pings: VecDeque::new(),
            totals: PeerTotals::default(),
        };
        peer.active = peer.best().map(|p| p.addr);
        self.peers.insert(key, peer);
    }

    /// Forgets a peer and its paths.
    pub fn remove_peer(&mut self, key: &NodePublic) {
        if self.peers.remove(key).is_some() {
            self.owners.retain(|_, k| k != key);
        }
    }

    /// Whether `key` is a peer.
    pub fn is_peer(&self, key: &NodePublic) -> bool {
        self.peers.contains_key(key)
    }

    /// The peers.
    pub fn peers(&self) -> impl Iterator<Item = &NodePublic> {
        self.peers.keys()
    }

    /// This side's candidate direct addresses (local interfaces, STUN). A
    /// change is sent to every peer at once. The addresses peers' pongs
    /// reported (at most four, the latest) are announced with them.
    pub fn set_local_candidates(&mut self, now: Instant, addrs: Vec<SocketAddr>) {
        self.base = addrs;
        self.announce(now);
    }

    /// Announces the base candidates and the reflexive ones, deduplicated,
    /// at most [`MAX_ENDPOINTS`] (base first).
    fn announce(&mut self, now: Instant) {
        let mut addrs: Vec<SocketAddr> = Vec::with_capacity(MAX_ENDPOINTS);
        for a in self.base.iter().chain(&self.reflexive) {
            if addrs.len() < MAX_ENDPOINTS && !addrs.contains(a) {
                addrs.push(*a);
            }
        }
        addrs.sort();
        if addrs != self.local {
            self.local = addrs;
            for peer in self.peers.values_mut() {
                peer.next_call_me_maybe = now;
            }
        }
    }

    /// This side's candidates as last set.
    pub fn local_candidates(&self) -> &[SocketAddr] {
        &self.local
    }

    /// Sets (or with `None` removes) the peer's relay-session path.
    pub fn set_relay(&mut self, now: Instant, key: &NodePublic, relay: Option<(u32, SocketAddr)>) {
        let Some(peer) = self.peers.get_mut(key) else {
            return;
        };
        let new = relay.map(|(vni, addr)| PathAddr::RelaySession { vni, addr });
        let old = peer
            .paths
            .iter()
            .position(|p| p.addr.kind() == PathKind::RelaySession);
        if old.map(|i| peer.paths[i].addr) == new {
            return;
        }
        if let Some(addr) = new {
            peer.paths.push(Path::new(addr, now));
            self.owners.insert(addr, *key);
        }
        if let Some(i) = old {
            let gone = self.peers.get_mut(key).expect("known").paths.remove(i);
            self.owners.remove(&gone.addr);
            self.forget_active(now, *key, gone);
        }
    }

    /// The peer a datagram from this path belongs to (direct address or
    /// relay session), for payloads, which carry no key.
    pub fn owner(&self, path: &PathAddr) -> Option<NodePublic> {
        self.owners.get(path).copied()
    }

    /// An authenticated probe from `key` (the caller opened the box with
    /// the key shared with `key`, a configured peer) that came on `path`.
    /// A ping is answered on the same path; a pong confirms `path` if it
    /// answers a ping sent on it; a call-me-maybe adds candidates.
    ///
    /// Sealed probes can be captured and sent again from anywhere, so only
    /// what cannot be replayed makes an address a candidate: the source of
    /// a ping on direct UDP whose tx id is not among the peer's last 256
    /// (a replayed ping gets nothing at all), and call-me-maybe over DERP
    /// (the only way it is sent; on UDP it is ignored). A pong counts only
    /// on a path that exists, answering an outstanding ping sent there,
    /// once; from any other address it is ignored.
    pub fn handle_probe(&mut self, now: Instant, key: &NodePublic, path: PathAddr, probe: Probe) {
        let Some(peer) = self.peers.get_mut(key) else {
            return;
        };
        match &probe {
            Probe::Ping { tx } => {
                // A replayed ping (from a forged source, say) gets nothing.
                if peer.seen_pings.contains(tx) {
                    return;
                }
                if peer.seen_pings.len() == SEEN_PINGS {
                    peer.seen_pings.pop_front();
                }
                peer.seen_pings.push_back(*tx);
                match path {
                    PathAddr::Direct(addr) => self.add_candidate(now, key, addr),
                    PathAddr::RelaySession { .. } => {
                        // The peer's side of the session is bound (its
                        // ping came through): a ping of ours sent before
                        // that was dropped by the relay, so ping again now
                        // rather than at the next discovery interval.
                        if let Some(p) = peer.path_mut(&path) {
                            if p.state != PathState::Working {
                                p.next_ping = p.next_ping.min(now);
                            }
                        }
                    }
                    PathAddr::Derp => {}
                }
            }
            Probe::CallMeMaybe { .. } if path != PathAddr::Derp => return,
            Probe::CallMeMaybe { .. } | Probe::Pong { .. } => {}
        }
        match probe {
            Probe::Ping { tx } => {
                let observed = match path {
                    PathAddr::Direct(a) | PathAddr::RelaySession { addr: a, .. } => a,
                    PathAddr::Derp => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
                };
                self.transmits.push_back(Transmit {
                    peer: *key,
                    path,
                    probe: Probe::Pong { tx, observed },
                });
            }
            Probe::Pong { tx, observed } => {
                if self.pong(now, key, path, tx) {
                    self.note_reflexive(now, path, observed);
                }
            }
            Probe::CallMeMaybe { endpoints } => {
                for addr in endpoints {
                    self.add_candidate(now, key, addr);
                }
            }
        }
    }

    fn add_candidate(&mut self, now: Instant, key: &NodePublic, addr: SocketAddr) {
        if addr.port() == 0 || addr.ip().is_unspecified() || addr.ip().is_multicast() {
            return;
        }
        let peer = self.peers.get_mut(key).expect("checked by the caller");
        let path = PathAddr::Direct(addr);
        if let Some(p) = peer.path_mut(&path) {
            p.refreshed = now;
            if p.state != PathState::Working {
                // The peer is probing or just told us: probe back now, so
                // both sides' first packets cross (NAT traversal).
                p.next_ping = p.next_ping.min(now);
            }
            return;
        }
        if self.owners.contains_key(&path) {
            // Another peer's address already; one address, one owner.
            return;
        }
        let direct = peer
            .paths
            .iter()
            .filter(|p| p.addr.kind() == PathKind::Direct)
            .count();
        if direct >= MAX_CANDIDATES {
            let active = peer.active;
            let Some(i) = peer
                .paths
                .iter()
                .enumerate()
                .filter(|(_, p)| p.addr.kind() == PathKind::Direct && Some(p.addr) != active)
                .min_by_key(|(_, p)| (p.state == PathState::Working, p.refreshed))
                .map(|(i, _)| i)
            else {
                return;
            };
            let gone = peer.paths.remove(i);
            self.owners.remove(&gone.addr);
        }
        peer.paths.push(Path::new(path, now));
        self.owners.insert(path, *key);
    }

    /// A pong on `path`; `true` when it answered a ping sent there.
    fn pong(
        &mut self,
        now: Instant,
        key: &NodePublic,
        path: PathAddr,
        tx: [u8; TX_ID_LEN],
    ) -> bool {
        let peer = self.peers.get_mut(key).expect("checked by the caller");
        let Some(p) = peer.path_mut(&path) else {
            return false;
        };
        let Some(i) = p.pending.iter().position(|(id, _)| *id == tx) else {
            return false;
        };
        let (_, sent) = p.pending.remove(i).expect("found");
        p.refreshed = now;
        p.rtt = Some(now.saturating_duration_since(sent));
        p.last_pong = Some(now);
        p.since_pong = 0;
        p.stats.pongs += 1;
        let confirmed = p.state != PathState::Working;
        if confirmed {
            p.state = PathState::Working;
            p.next_ping = now + self.timing.probe_interval;
        }
        peer.totals.of_mut(path.kind()).pongs += 1;
        if confirmed {
            self.choose(now, *key, SwitchReason::Better);
        }
        true
    }

    /// The address a pong on a direct path says the peer saw this side
    /// at: a candidate of this side (through a NAT, the mapped address;
    /// STUN may not know it, or not for this peer's network). Pongs on a
    /// relay session or DERP report the relay's view, not this side's.
    fn note_reflexive(&mut self, now: Instant, path: PathAddr, observed: SocketAddr) {
        let observed = ferry_proto::frame::canonical_addr(observed);
        let usable = observed.port() != 0
            && !observed.ip().is_unspecified()
            && !observed.ip().is_multicast();
        if !matches!(path, PathAddr::Direct(_)) || !usable {
            return;
        }
        if self.reflexive.front() == Some(&observed) {
            return;
        }
        self.reflexive.retain(|a| *a != observed);
        self.reflexive.push_front(observed);
        self.reflexive.truncate(MAX_REFLEXIVE);
        self.announce(now);
    }

    /// Picks the active path again; switches to a better kind, or away from
    /// an active path that is no longer usable.
    fn choose(&mut self, now: Instant, key: NodePublic, reason: SwitchReason) {
        let at = self.wall_time(now);
        let peer = self.peers.get_mut(&key).expect("a known peer");
        let best = peer.best().map(|p| p.addr);
        let current = peer.active.and_then(|a| peer.path(&a));
        let keep = match (current, best) {
            (Some(cur), Some(best)) => {
                cur.usable()
                    && peer
                        .rank(&cur.addr)
                        .is_some_and(|r| Some(r) <= peer.rank(&best))
            }
            (Some(cur), None) => cur.usable() && peer.rank(&cur.addr).is_some(),
            (None, best) => best.is_none(),
        };
        if keep {
            return;
        }
        let lost = current.filter(|c| !c.usable()).map_or(0, |c| c.since_pong);
        let reason = match current {
            Some(c) if !c.usable() => SwitchReason::Silent,
            _ => reason,
        };
        let event = PathEvent {
            peer: key,
            from: peer.active,
            to: best,
            reason,
            lost,
            at,
        };
        peer.active = best;
        peer.last_switch = Some(event.clone());
        if event.from.is_some() || event.to.is_some() {
            tracing::debug!(peer = %key.short(), from = ?event.from, to = ?event.to, ?reason, lost, "path switch");
            self.events.push_back(event);
        }
    }

    /// A path was removed: if it was active, move to the best other one,
    /// reporting what was sent on it since its last pong.
    fn forget_active(&mut self, now: Instant, key: NodePublic, gone: Path) {
        let at = self.wall_time(now);
        let peer = self.peers.get_mut(&key).expect("a known peer");
        if peer.active != Some(gone.addr) {
            return;
        }
        let to = peer.best().map(|p| p.addr);
        let event = PathEvent {
            peer: key,
            from: Some(gone.addr),
            to,
            reason: SwitchReason::Removed,
            lost: gone.since_pong,
            at,
        };
        peer.active = to;
        peer.last_switch = Some(event.clone());
        self.events.push_back(event);
    }

    /// The path for one application datagram of `len` bytes to `key`, its
    /// counters updated; nothing counted when there is none or the
    /// datagram is longer than the active path carries.
    pub fn on_send(&mut self, key: &NodePublic, len: usize) -> Result<PathAddr, NoPath> {
        let peer = self.peers.get_mut(key).ok_or(NoPath::UnknownPeer)?;
        let active = peer.active.ok_or(NoPath::NoneAllowed)?;
        let max = active.mtu().max;
        if len > max {
            return Err(NoPath::TooLarge {
                len,
                max,
                path: active.kind(),
            });
        }
        let p = peer.path_mut(&active).expect("the active path exists");
        p.stats.tx_packets += 1;
        p.stats.tx_bytes += len as u64;
        p.since_pong += 1;
        let total = peer.totals.of_mut(active.kind());
        total.tx_packets += 1;
        total.tx_bytes += len as u64;
        Ok(active)
    }

    /// Takes back [`Paths::on_send`]'s count of a datagram that did not go
    /// out after all (its queue was full, its send failed).
    pub fn unsend(&mut self, key: &NodePublic, path: &PathAddr, len: usize) {
        let Some(peer) = self.peers.get_mut(key) else {
            return;
        };
        if let Some(p) = peer.path_mut(path) {
            p.stats.tx_packets = p.stats.tx_packets.saturating_sub(1);
            p.stats.tx_bytes = p.stats.tx_bytes.saturating_sub(len as u64);
            p.since_pong = p.since_pong.saturating_sub(1);
        }
        let total = peer.totals.of_mut(path.kind());
        total.tx_packets = total.tx_packets.saturating_sub(1);
        total.tx_bytes = total.tx_bytes.saturating_sub(len as u64);
    }

    /// One application datagram of `len` bytes from `key` on `path`.
    pub fn on_receive(&mut self, key: &NodePublic, path: &PathAddr, len: usize) {
        let Some(peer) = self.peers.get_mut(key) else {
            return;
        };
        if let Some(p) = peer.path_mut(path) {
            p.stats.rx_packets += 1;
            p.stats.rx_bytes += len as u64;
        }
        let total = peer.totals.of_mut(path.kind());
        total.rx_packets += 1;
        total.rx_bytes += len as u64;
    }

    /// Sends what is due at `now`: pings, call-me-maybe; declares silent
    /// paths dead and switches away from them; forgets stale candidates.
    pub fn handle_timeout(&mut self, now: Instant) {
        let keys: Vec<NodePublic> = self.peers.keys().copied().collect();
        for key in keys {
            let mut died = false;
            let peer = self.peers.get_mut(&key).expect("listed");
            for p in &mut peer.paths {
                if p.state == PathState::Working
                    && p.last_pong
                        .is_some_and(|t| now >= t + self.timing.silence_limit(&p.addr))
                {
                    p.state = PathState::Dead;
                    p.next_ping = p.next_ping.min(now + self.timing.probe_interval);
                    died = true;
                }
            }
            let active = peer.active;
            let lifetime = self.timing.candidate_lifetime;
            peer.paths.retain(|p| {
                let stale = p.addr.kind() == PathKind::Direct
                    && Some(p.addr) != active
                    && now.saturating_duration_since(p.refreshed) >= lifetime
                    && p.last_pong
                        .is_none_or(|t| now.saturating_duration_since(t) >= lifetime);
                if stale {
                    self.owners.remove(&p.addr);
                }
                !stale
            });
            for p in &mut peer.paths {
                if p.next_ping > now {
                    continue;
                }
                let mut tx = [0u8; TX_ID_LEN];
                self.rng.fill_bytes(&mut tx);
                if p.pending.len() == MAX_PENDING {
                    p.pending.pop_front();
                }
                p.pending.push_back((tx, now));
                p.stats.pings += 1;
                peer.totals.of_mut(p.addr.kind()).pings += 1;
                let interval = if p.state == PathState::Working && p.addr != PathAddr::Derp {
                    self.timing.probe_interval
                } else {
                    self.timing.discover_interval
                };
                p.next_ping = now + interval;
                self.transmits.push_back(Transmit {
                    peer: key,
                    path: p.addr,
                    probe: Probe::Ping { tx },
                });
            }
            if peer.next_call_me_maybe <= now {
                peer.next_call_me_maybe = now + self.timing.call_me_maybe_interval;
                if !self.local.is_empty() {
                    self.transmits.push_back(Transmit {
                        peer: key,
                        path: PathAddr::Derp,
                        probe: Probe::CallMeMaybe {
                            endpoints: self.local.clone(),
                        },
                    });
                }
            }
            if died {
                self.choose(now, key, SwitchReason::Silent);
            }
        }
    }

    /// When [`Paths::handle_timeout`] has something to do next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timing = &self.timing;
        self.peers
            .values()
            .flat_map(|peer| {
                let paths = peer.paths.iter().flat_map(move |p| {
                    let dies = (p.state == PathState::Working)
                        .then(|| p.last_pong.map(|t| t + timing.silence_limit(&p.addr)))
                        .flatten();
                    [Some(p.next_ping), dies]
                });
                paths.chain([Some(peer.next_call_me_maybe)])
            })
            .flatten()
            .min()
    }

    /// The next probe to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next switch to report.
    pub fn poll_event(&mut self) -> Option<PathEvent> {
        self.events.pop_front()
    }

    /// The state of the peer's relay-session path, if it has one.
    pub fn relay_state(&self, key: &NodePublic) -> Option<PathState> {
        let peer = self.peers.get(key)?;
        peer.paths
            .iter()
            .find(|p| p.addr.kind() == PathKind::RelaySession)
            .map(|p| p.state)
    }

    /// A peer's paths and counters.
    pub fn status(&self, key: &NodePublic) -> Option<PeerStatus> {
        let peer = self.peers.get(key)?;
        Some(PeerStatus {
            active: peer.active,
            paths: peer.paths.iter().map(Path::status).collect(),
            totals: peer.totals,
            last_switch: peer.last_switch.clone(),
        })
    }
}

#[cfg(test)]
#[path = "paths_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "paths_reflexive_tests.rs"]
mod reflexive_tests;

#[cfg(test)]
#[path = "paths_hostile_tests.rs"]
mod hostile_tests;
