//! Entry point for fuzzing the SDK's path manager ([`Paths`]) as a state
//! machine, for the `paths` fuzz target in `fuzz/` and the corpus replay
//! test (`tests/fuzz_corpus.rs`).
//!
//! [`paths`] reads `data[0]` as the timing (bit 0: the defaults, or a
//! tight schedule) and the rest as 4-byte operations (op, a, b, c) over
//! three peers, eight direct addresses (some unusable: port 0,
//! unspecified, multicast, IPv4-mapped) and two relay addresses: adding a
//! peer or changing its policy, removing it, this side's candidates, a
//! relay session set or removed, an authenticated ping, pong or
//! call-me-maybe from a peer on any path (pongs either answer a ping the
//! manager sent, on its path or replayed on another, or carry an unknown
//! id), time passing (to a chosen instant or to the next timer), and
//! datagrams sent and received. Every probe the manager sends and every
//! switch it reports is drained after each operation. Checked after each:
//!
//! - nothing panics;
//! - a datagram goes on exactly one path: the active one, whose counter
//!   alone moves; a peer with no active path, or an unknown one, gets an
//!   error;
//! - the active path exists, is usable (DERP, or a UDP path a pong
//!   confirmed), is allowed by the peer's policy, and no usable allowed
//!   path ranks better;
//! - a UDP path is working only if a pong answered a ping sent on that
//!   path; a direct path's address came from the peer (call-me-maybe or
//!   the source of its probe) and is usable; paths per peer stay bounded;
//! - every UDP path's owner is its peer, and an address owned by a peer is
//!   one of its paths;
//! - switches chain: each starts where the previous one (or the active
//!   path before the operation) ended, and the last ends on the active
//!   path;
//! - pings go only on existing paths, pongs only answer pings on the path
//!   they came on, call-me-maybe only over DERP with this side's
//!   candidates;
//! - timers are finite and make progress: with a peer there is always a
//!   next timer, and after running the timers of `now` it is later than
//!   `now` and within the longest interval.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferry_proto::key::NodePublic;
use ferry_proto::peer_msg::{Probe, MAX_ENDPOINTS, TX_ID_LEN};

use crate::endpoint::paths::{
    NoPath, PathAddr, PathKind, PathState, Paths, PeerStatus, Policy, Timing,
};

/// Operations read from one input at most.
const MAX_OPS: usize = 1024;
/// Peers.
const PEERS: usize = 3;
/// Pings kept for pongs to answer (more than the manager remembers).
const RECENT_PINGS: usize = 256;
/// Direct paths a peer may have at most: DERP, the candidates, a relay.
const MAX_PATHS: usize = 1 + 16 + 1;

fn peer(i: u8) -> NodePublic {
    NodePublic::from_bytes([0x40 + i % PEERS as u8; 32])
}

/// Direct addresses: five usable, three that never become paths.
fn direct(i: u8) -> SocketAddr {
    match i % 8 {
        n @ 0..=2 => SocketAddr::from((Ipv4Addr::new(192, 0, 2, n + 1), 41641)),
        3 => SocketAddr::from((Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), 41641)),
        // The same host as 0, written IPv4-mapped.
        4 => SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped(), 41641)),
        5 => SocketAddr::from((Ipv4Addr::new(192, 0, 2, 9), 0)),
        6 => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 41641)),
        _ => SocketAddr::from((Ipv4Addr::new(224, 0, 0, 1), 41641)),
    }
}

fn usable(a: &SocketAddr) -> bool {
    a.port() != 0 && !a.ip().is_unspecified() && !a.ip().is_multicast()
}

fn relay_addr(i: u8) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(198, 51, 100, 1 + i % 2), 3479))
}

/// A relay session of peer `p`: one of four per peer, never shared.
fn relay(p: u8, i: u8) -> PathAddr {
    PathAddr::RelaySession {
        vni: 0x100 * u32::from(1 + p % PEERS as u8) + u32::from(i % 4),
        addr: relay_addr(i >> 2),
    }
}

/// Any path of peer `p`: DERP, a direct address, or one of its relays.
fn path(p: u8, sel: u8) -> PathAddr {
    match sel % 4 {
        0 => PathAddr::Derp,
        3 => relay(p, sel >> 2),
        _ => PathAddr::Direct(direct(sel >> 2)),
    }
}

fn kind(sel: u8) -> Option<PathKind> {
    match sel % 4 {
        0 => None,
        1 => Some(PathKind::Direct),
        2 => Some(PathKind::RelaySession),
        _ => Some(PathKind::Derp),
    }
}

fn policy(sel: u8) -> Policy {
    Policy {
        prefer: kind(sel),
        only: if sel & 0x10 != 0 {
            kind(sel >> 2)
        } else {
            None
        },
    }
}

/// Lower is better; `None` when the policy rules the kind out (the
/// documented order: `only` alone, `prefer` first, then direct, relay,
/// DERP).
fn rank(p: &Policy, k: PathKind) -> Option<u8> {
    match p.only {
        Some(only) if only != k => None,
        _ if p.prefer == Some(k) => Some(0),
        _ => Some(1 + k as u8),
    }
}

/// A ping: to whom, on which path, its id.
type Ping = (NodePublic, PathAddr, [u8; TX_ID_LEN]);

/// What the driver knows, to check the manager against.
struct Model {
    policies: HashMap<NodePublic, Policy>,
    /// Every ping the manager sent: (peer, path, tx).
    sent: HashSet<Ping>,
    /// The latest of them, for pongs to answer.
    recent: VecDeque<Ping>,
    /// Paths that a pong answering a ping sent on them reached.
    confirmed: HashSet<(NodePublic, PathAddr)>,
    /// Direct addresses each peer gave (call-me-maybe, probe sources).
    told: HashSet<(NodePublic, SocketAddr)>,
    /// Pings of the peers this side must answer: (peer, path, tx).
    owed: Vec<Ping>,
}

fn status(paths: &Paths, key: &NodePublic) -> PeerStatus {
    paths.status(key).expect("a known peer has a status")
}

/// Drains and checks what the manager sends and reports after one
/// operation; `before` is each peer's active path before it.
fn drain(paths: &mut Paths, m: &mut Model, before: &HashMap<NodePublic, Option<PathAddr>>) {
    while let Some(t) = paths.poll_transmit() {
        let st = status(paths, &t.peer);
        assert!(
            st.paths.iter().any(|p| p.addr == t.path) || matches!(t.probe, Probe::Pong { .. }),
            "a probe on {:?}, which is no path of the peer",
            t.path
        );
        match t.probe {
            Probe::Ping { tx } => {
                m.sent.insert((t.peer, t.path, tx));
                if m.recent.len() == RECENT_PINGS {
                    m.recent.pop_front();
                }
                m.recent.push_back((t.peer, t.path, tx));
            }
            Probe::Pong { tx, .. } => {
                let owed = m
                    .owed
                    .iter()
                    .position(|o| *o == (t.peer, t.path, tx))
                    .expect("a pong answers a ping on the path it came on");
                m.owed.swap_remove(owed);
            }
            Probe::CallMeMaybe { endpoints } => {
                assert_eq!(t.path, PathAddr::Derp, "call-me-maybe goes over DERP");
                assert_eq!(endpoints, paths.local_candidates());
                assert!(!endpoints.is_empty() && endpoints.len() <= MAX_ENDPOINTS);
            }
        }
    }
    let mut at: HashMap<NodePublic, Option<PathAddr>> = before.clone();
    while let Some(e) = paths.poll_event() {
        let from = at.get(&e.peer).expect("a switch of a known peer");
        assert_eq!(e.from, *from, "switches chain: {e:?}");
        assert_ne!(e.from, e.to, "a switch changes the path");
        at.insert(e.peer, e.to);
    }
    for (key, active) in at {
        if m.policies.contains_key(&key) {
            assert_eq!(
                status(paths, &key).active,
                active,
                "the last switch ends on the active path"
            );
        }
    }
}

/// The invariants that hold between operations.
fn check(paths: &Paths, m: &Model) {
    for p in 0..PEERS as u8 {
        let key = peer(p);
        let Some(policy) = m.policies.get(&key) else {
            assert!(paths.status(&key).is_none(), "a removed peer has no status");
            continue;
        };
        let st = status(paths, &key);
        assert_eq!(st.paths[0].addr, PathAddr::Derp, "DERP comes first");
        assert!(st.paths.len() <= MAX_PATHS, "{} paths", st.paths.len());
        let relays = st
            .paths
            .iter()
            .filter(|p| p.addr.kind() == PathKind::RelaySession);
        assert!(relays.count() <= 1, "more than one relay path");
        let is_usable =
            |s: &crate::PathStatus| s.addr == PathAddr::Derp || s.state == PathState::Working;
        for (i, s) in st.paths.iter().enumerate() {
            assert!(
                st.paths[..i].iter().all(|o| o.addr != s.addr),
                "a path listed twice"
            );
            if s.addr != PathAddr::Derp {
                assert_eq!(paths.owner(&s.addr), Some(key), "the owner of {}", s.addr);
                if s.state != PathState::Unconfirmed {
                    assert!(
                        m.confirmed.contains(&(key, s.addr)),
                        "{} {:?} without a pong that answered a ping on it",
                        s.addr,
                        s.state
                    );
                }
            }
            if let PathAddr::Direct(a) = s.addr {
                assert!(usable(&a), "an unusable direct path {a}");
                assert!(
                    m.told.contains(&(key, a)),
                    "a direct path to {a}, which the peer never gave"
                );
            }
        }
        let best = st
            .paths
            .iter()
            .filter(|s| is_usable(s))
            .filter_map(|s| rank(policy, s.addr.kind()))
            .min();
        match st.active {
            Some(a) => {
                let s = st
                    .paths
                    .iter()
                    .find(|s| s.addr == a)
                    .expect("the active path exists");
                assert!(is_usable(s), "the active path {a} is not usable");
                let r = rank(policy, a.kind()).expect("the policy allows the active path");
                assert!(
                    best.is_some_and(|b| r <= b),
                    "{a} active while a better path works"
                );
            }
            None => assert!(best.is_none(), "no active path while an allowed one works"),
        }
    }
    // Every address a peer owns is one of its paths.
    for i in 0..8 {
        for addr in [
            PathAddr::Direct(direct(i)),
            relay(0, i),
            relay(1, i),
            relay(2, i),
        ] {
            if let Some(owner) = paths.owner(&addr) {
                let st = paths.status(&owner).expect("an owner is a peer");
                assert!(
                    st.paths.iter().any(|p| p.addr == addr),
                    "{addr} owned by a peer without it"
                );
            }
        }
    }
    assert!(paths.local_candidates().len() <= MAX_ENDPOINTS);
}

/// Runs the operations in `data` against one path manager (see the module
/// doc).
pub fn paths(data: &[u8]) {
    let Some((&ctl, ops)) = data.split_first() else {
        return;
    };
    let timing = if ctl & 1 == 0 {
        Timing::default()
    } else {
        Timing {
            probe_interval: Duration::from_millis(100),
            dead_after: Duration::from_millis(250),
            discover_interval: Duration::from_millis(300),
            call_me_maybe_interval: Duration::from_secs(1),
            candidate_lifetime: Duration::from_secs(2),
        }
    };
    let longest = [
        timing.probe_interval,
        timing.discover_interval,
        timing.call_me_maybe_interval,
    ]
    .into_iter()
    .max()
    .expect("three");
    let t0 = Instant::now();
    let mut now = t0;
    let mut paths = Paths::new(timing, Some(u64::from(ctl)));
    let mut m = Model {
        policies: HashMap::new(),
        sent: HashSet::new(),
        recent: VecDeque::new(),
        confirmed: HashSet::new(),
        told: HashSet::new(),
        owed: Vec::new(),
    };
    for op in ops.chunks_exact(4).take(MAX_OPS) {
        let [op, a, b, c] = [op[0], op[1], op[2], op[3]];
        let key = peer(a);
        let before: HashMap<NodePublic, Option<PathAddr>> = m
            .policies
            .keys()
            .map(|k| (*k, status(&paths, k).active))
            .collect();
        match op % 10 {
            0 => {
                paths.add_peer(now, key, policy(b));
                m.policies.insert(key, policy(b));
            }
            1 => {
                paths.remove_peer(&key);
                m.policies.remove(&key);
                m.owed.retain(|o| o.0 != key);
            }
            2 => {
                let addrs = (0..8).filter(|i| b & (1 << i) != 0).map(direct).collect();
                paths.set_local_candidates(now, addrs);
            }
            3 => {
                let r = (b & 0x80 == 0).then(|| match relay(a, c) {
                    PathAddr::RelaySession { vni, addr } => (vni, addr),
                    _ => unreachable!("relay() makes relay paths"),
                });
                paths.set_relay(now, &key, r);
            }
            4 => {
                // The peer pings on a path.
                let on = path(a, b);
                let tx = [c; TX_ID_LEN];
                let fresh = m.policies.contains_key(&key);
                if let (true, PathAddr::Direct(from)) = (fresh, on) {
                    if usable(&from) {
                        // Either form, should the manager canonicalize.
                        m.told
                            .insert((key, ferry_proto::frame::canonical_addr(from)));
                        m.told.insert((key, from));
                    }
                }
                if fresh {
                    m.owed.push((key, on, tx));
                }
                paths.handle_probe(now, &key, on, Probe::Ping { tx });
            }
            5 => {
                // A pong: for a ping this side sent (on its path, or
                // replayed on another), or with an id never sent.
                let observed = direct(c >> 4);
                let (on, tx) = match m.recent.get(usize::from(c) % (m.recent.len() + 1)) {
                    Some(&(to, on, tx)) if to == key && b & 0x80 == 0 => (on, tx),
                    Some(&(_, _, tx)) => (path(a, b), tx),
                    None => (path(a, b), [b; TX_ID_LEN]),
                };
                let answered = m.sent.contains(&(key, on, tx));
                if let (true, PathAddr::Direct(from)) = (m.policies.contains_key(&key), on) {
                    if usable(&from) {
                        m.told.insert((key, from));
                    }
                }
                if answered && m.policies.contains_key(&key) {
                    m.confirmed.insert((key, on));
                }
                paths.handle_probe(now, &key, on, Probe::Pong { tx, observed });
            }
            6 => {
                let endpoints: Vec<SocketAddr> =
                    (0..8).filter(|i| b & (1 << i) != 0).map(direct).collect();
                let on = path(a, c);
                if m.policies.contains_key(&key) {
                    let source = match on {
                        PathAddr::Direct(from) => Some(from),
                        _ => None,
                    };
                    for e in endpoints.iter().chain(&source).filter(|e| usable(e)) {
                        m.told.insert((key, *e));
                    }
                }
                paths.handle_probe(now, &key, on, Probe::CallMeMaybe { endpoints });
            }
            7 => {
                now = if b & 0x80 != 0 {
                    paths.poll_timeout().map_or(now, |t| t.max(now))
                } else {
                    now + Duration::from_millis(u64::from(u16::from_le_bytes([b, c])) * 4)
                };
                paths.handle_timeout(now);
                let next = paths.poll_timeout();
                assert_eq!(next.is_some(), !m.policies.is_empty(), "a peer has a timer");
                if let Some(next) = next {
                    assert!(next > now, "a timer still due after running the timers");
                    assert!(next <= now + longest, "a timer {:?} away", next - now);
                }
            }
            8 => {
                let len = usize::from(b) * 8;
                let st = paths.status(&key);
                let sent = paths.on_send(&key, len);
                match (st, sent) {
                    (None, r) => assert_eq!(r, Err(NoPath::UnknownPeer)),
                    (Some(before), Ok(on)) => {
                        assert_eq!(before.active, Some(on), "sent on the active path");
                        let after = status(&paths, &key);
                        let moved: Vec<PathAddr> = before
                            .paths
                            .iter()
                            .zip(&after.paths)
                            .filter(|(x, y)| x.stats.tx_packets != y.stats.tx_packets)
                            .map(|(x, y)| {
                                assert_eq!(x.stats.tx_packets + 1, y.stats.tx_packets);
                                assert_eq!(x.stats.tx_bytes + len as u64, y.stats.tx_bytes);
                                y.addr
                            })
                            .collect();
                        assert_eq!(moved, vec![on], "a datagram goes on exactly one path");
                    }
                    (Some(before), Err(e)) => {
                        assert_eq!(e, NoPath::NoneAllowed);
                        assert_eq!(before.active, None);
                    }
                }
            }
            _ => paths.on_receive(&key, &path(a, b), usize::from(c)),
        }
        drain(&mut paths, &mut m, &before);
        // Pongs go out at once: a ping not answered now (a replay) never
        // will be.
        m.owed.clear();
        check(&paths, &m);
    }
}
