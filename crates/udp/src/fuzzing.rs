//! Entry points for fuzzing the receiver-index hub ([`hub`]) and the
//! relay-session table ([`sessions`]) as state machines.
//!
//! [`hub`] reads its input as a configuration byte and then a sequence of
//! operations against one [`Hub`] replica: WireGuard datagrams of each
//! kind with indices drawn from a small pool (so they collide and match),
//! sent from a configured peer's current address or from a stranger, time
//! passing, a peer roaming to a new address, a reload removing a peer or
//! configuring it again, expiry, and garbage. After
//! every operation it checks what the hub promises whatever the traffic:
//!
//! - it forwards or floods only to endpoints that earned it: a configured
//!   fixed endpoint, the source of a handshake message with a valid MAC1,
//!   or the source of [`ROAM_CONFIRMATIONS`] data packets (never to an
//!   address that only sent garbage, a bad MAC1, a cookie or one packet);
//! - data and responses are forwarded only by an index a handshake created
//!   and that has not outlived its lifetime at the last expiry, and after
//!   an expiry no more entries remain than handshakes still within their
//!   lifetimes;
//! - the index table never holds more than its cap;
//! - nothing panics.
//!
//! The `hub` fuzz target in `fuzz/` calls it, and so does
//! `tests/fuzz_corpus.rs` over the committed corpus.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferry_proto::wireguard::{self as wg, Index, Mac1Key, PublicKey};

use crate::hub::{
    Endpoint, Event, Hub, HubSettings, NoInbox, PeerInfo, Verdict, PENDING_LIFETIME,
    ROAM_CONFIRMATIONS, WG_SESSION_LIFETIME,
};

mod peer_relay;
mod peer_relay_controls;
pub use peer_relay::peer_relay_port;
pub use peer_relay_controls::peer_relay_controls;

/// Configured peers.
const PEERS: usize = 3;
/// Sources: each peer's current address, then two strangers.
const SOURCES: usize = PEERS + 2;
/// Operations read from one input at most.
const MAX_OPS: usize = 1024;
/// Indices datagrams carry: few, so that they collide and match.
const INDEX_POOL: [Index; 8] = [0x11, 0x22, 0x33, 0x44, 0xaaaa, u32::MAX, 0, 0x5555_5555];

fn keys() -> &'static ([PublicKey; PEERS], [Mac1Key; PEERS + 1]) {
    static KEYS: OnceLock<([PublicKey; PEERS], [Mac1Key; PEERS + 1])> = OnceLock::new();
    KEYS.get_or_init(|| {
        let keys = [1u8, 2, 3].map(|n| PublicKey::from_bytes([n; 32]));
        // The last MAC1 key belongs to nobody configured.
        let macs = [1u8, 2, 3, 9].map(|n| Mac1Key::new(&PublicKey::from_bytes([n; 32])));
        (keys, macs)
    })
}

/// The fixed endpoint peer 1 has when the configuration byte asks for it.
fn fixed_home() -> Endpoint {
    Endpoint {
        addr: home(1, 0),
        via: 0,
    }
}

/// Peer `p`'s address after `moves` roams.
fn home(p: usize, moves: u8) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 0, p as u8, moves), 51820))
}

fn settings(config: u8) -> Arc<HubSettings> {
    let (keys, macs) = keys();
    let peers = (0..PEERS)
        .map(|p| PeerInfo {
            name: format!("p{p}"),
            key: keys[p],
            mac1: macs[p],
            // Bit 3: peer 0 may talk to peer 1 only.
            allow: (p == 0 && config & 8 != 0).then(|| vec![1]),
            // Bit 2: peer 1 has a fixed endpoint.
            fixed: (p == 1 && config & 4 != 0).then(fixed_home),
            active: true,
        })
        .collect();
    // Bits 4-5: a tight or a loose handshake limit.
    let (rate, burst) = match (config >> 4) & 3 {
        0 => (1.0, 3.0),
        1 => (20.0, 40.0),
        _ => (1e9, 1e9),
    };
    Arc::new(HubSettings {
        peers,
        // Bits 0-1: the table's cap.
        max_indices: [4, 8, 16, 1024][usize::from(config & 3)],
        handshake_rate: rate,
        handshake_burst: burst,
    })
}

fn index(selector: u8) -> Index {
    INDEX_POOL[usize::from(selector) % INDEX_POOL.len()]
}

fn datagram(kind: u8, len: usize, fields: &[(usize, &[u8])]) -> Vec<u8> {
    let mut m = vec![0x5a; len];
    m[..4].copy_from_slice(&[kind, 0, 0, 0]);
    for (at, bytes) in fields {
        m[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    m
}

/// What the model knows, to check the hub against.
struct Model {
    config: u8,
    start: Instant,
    now: Duration,
    moves: [u8; PEERS],
    /// Endpoints the hub may send to.
    earned: HashSet<Endpoint>,
    /// Data packets seen from each endpoint.
    data_from: HashMap<Endpoint, u8>,
    /// Latest handshake time of each index, from the hub's own events.
    pending_at: HashMap<Index, Duration>,
    wg_session_at: HashMap<Index, Duration>,
    /// Every handshake time, for the bound after an expiry.
    pending_events: Vec<Duration>,
    wg_session_events: Vec<Duration>,
    /// When [`Hub::expire`] last ran.
    expired_at: Option<Duration>,
}

impl Model {
    fn source(&self, byte: u8) -> Endpoint {
        let s = usize::from(byte & 0x7f) % SOURCES;
        let addr = if s < PEERS {
            home(s, self.moves[s])
        } else {
            SocketAddr::from((Ipv4Addr::new(192, 0, 2, s as u8), 666))
        };
        Endpoint {
            addr,
            via: u16::from(byte >> 7),
        }
    }

    fn at(&self, t: Duration) -> Instant {
        self.start + t
    }

    /// Whether an entry made at `made` (if any) may still be in the table.
    fn alive(&self, made: Option<&Duration>, lifetime: Duration) -> bool {
        made.is_some_and(|&t| self.expired_at.is_none_or(|e| t + lifetime > e))
    }

    fn learn(&mut self, hub: &mut Hub) {
        for ev in hub.take_events() {
            match ev {
                Event::Pending { index, at, .. } => {
                    let t = at - self.start;
                    self.pending_at.insert(index, t);
                    self.pending_events.push(t);
                }
                Event::WgSession {
                    initiator_index,
                    responder_index,
                    at,
                    ..
                } => {
                    let t = at - self.start;
                    for i in [initiator_index, responder_index] {
                        self.wg_session_at.insert(i, t);
                        self.wg_session_events.push(t);
                    }
                }
                Event::Endpoint { .. } | Event::Heard { .. } | Event::Candidate { .. } => {}
            }
        }
    }
}

/// Runs the operations in `data` against one hub replica (see the module
/// doc for the input's meaning and the invariants).
pub fn hub(data: &[u8]) {
    let Some((&config, ops)) = data.split_first() else {
        return;
    };
    let configured = settings(config);
    let cap = configured.max_indices;
    let (_, macs) = keys();
    let mut current = configured.clone();
    let mut hub = Hub::new(0, configured.clone(), Box::new(NoInbox));
    let mut m = Model {
        config,
        start: Instant::now(),
        now: Duration::ZERO,
        moves: [0; PEERS],
        earned: HashSet::new(),
        data_from: HashMap::new(),
        pending_at: HashMap::new(),
        wg_session_at: HashMap::new(),
        pending_events: Vec::new(),
        wg_session_events: Vec::new(),
        expired_at: None,
    };
    if m.config & 4 != 0 {
        m.earned.insert(fixed_home());
    }

    for op in ops.chunks_exact(4).take(MAX_OPS) {
        let [kind, a, b, c] = [op[0], op[1], op[2], op[3]];
        let from = m.source(a);
        let mac = &macs[usize::from(b) % macs.len()];
        let good_mac = usize::from(b) % macs.len() < PEERS;
        let msg = match kind % 8 {
            0 => {
                let mut d = datagram(1, wg::INITIATION_LEN, &[(4, &index(c).to_le_bytes())]);
                assert!(wg::seal_mac1(&mut d, mac));
                d
            }
            1 => {
                let (sender, receiver) = (index(c & 0xf), index(c >> 4));
                let mut d = datagram(
                    2,
                    wg::RESPONSE_LEN,
                    &[(4, &sender.to_le_bytes()), (8, &receiver.to_le_bytes())],
                );
                assert!(wg::seal_mac1(&mut d, mac));
                d
            }
            2 => datagram(3, wg::COOKIE_REPLY_LEN, &[(4, &index(c).to_le_bytes())]),
            3 => datagram(
                4,
                wg::TRANSPORT_MIN_LEN + 16,
                &[
                    (4, &index(c).to_le_bytes()),
                    (8, &u64::from(b).to_le_bytes()),
                ],
            ),
            4 => {
                // Up to about 11 minutes, past every lifetime.
                m.now += Duration::from_millis(u64::from(u16::from_le_bytes([a, b])) * 10);
                continue;
            }
            5 if b & 0x80 != 0 => {
                // A reload that removes peer p, or configures it again as
                // it was at start.
                let p = usize::from(a) % PEERS;
                let mut next = (*current).clone();
                next.peers[p] = if next.peers[p].active {
                    PeerInfo {
                        active: false,
                        ..next.peers[p].clone()
                    }
                } else {
                    configured.peers[p].clone()
                };
                current = Arc::new(next);
                hub.reconfigure(current.clone());
                continue;
            }
            5 => {
                let p = usize::from(a) % PEERS;
                m.moves[p] = m.moves[p].wrapping_add(1);
                continue;
            }
            6 => {
                hub.expire(m.at(m.now));
                m.expired_at = Some(m.now);
                let live = |events: &[Duration], lifetime: Duration| {
                    events.iter().filter(|&&t| t + lifetime > m.now).count()
                };
                let counts = hub.counts();
                assert!(
                    counts.wg_sessions <= live(&m.wg_session_events, WG_SESSION_LIFETIME),
                    "{} WireGuard session entries outlived their handshakes",
                    counts.wg_sessions
                );
                assert!(
                    counts.pending <= live(&m.pending_events, PENDING_LIFETIME),
                    "{} pending entries outlived their initiations",
                    counts.pending
                );
                continue;
            }
            _ => vec![kind; usize::from(b)],
        };

        // The message type, for what follows (0: garbage).
        let ty = msg.first().copied().unwrap_or(0);
        // What the sender earns by this datagram, before the hub answers
        // (a response may be forwarded back to its own source).
        match ty {
            1 | 2 if good_mac && wg::classify(&msg).is_ok() => {
                m.earned.insert(from);
            }
            4 if wg::classify(&msg).is_ok() => {
                let n = m.data_from.entry(from).or_default();
                *n = n.saturating_add(1);
                if *n >= ROAM_CONFIRMATIONS {
                    m.earned.insert(from);
                }
            }
            _ => {}
        }
        let verdict = hub.route(m.at(m.now), from.addr, from.via, &msg);
        let pending_before = m.alive(m.pending_at.get(&index(c >> 4)), PENDING_LIFETIME);
        let cookie_index = index(c);
        let cookie_ok = m.alive(m.pending_at.get(&cookie_index), PENDING_LIFETIME)
            || m.alive(m.wg_session_at.get(&cookie_index), WG_SESSION_LIFETIME);
        m.learn(&mut hub);

        match verdict {
            Verdict::Forward(to) => {
                assert!(
                    m.earned.contains(&to),
                    "forwarded type {ty} from {from:?} to {to:?}, which never earned it"
                );
                match ty {
                    2 => assert!(pending_before, "a response forwarded by a dead index"),
                    3 => assert!(cookie_ok, "a cookie forwarded by a dead index"),
                    4 => assert!(
                        m.alive(m.wg_session_at.get(&index(c)), WG_SESSION_LIFETIME),
                        "data forwarded by an index no live WireGuard session has"
                    ),
                    _ => {}
                }
            }
            Verdict::Flood => {
                assert_eq!(ty, 1, "only initiations are flooded");
                assert!(!hub.flood_targets().is_empty());
                for to in hub.flood_targets() {
                    assert!(m.earned.contains(to), "flooded to {to:?}");
                    assert_ne!(to.addr, from.addr, "flooded back to its source");
                }
            }
            Verdict::Drop(_) => {}
        }
        let counts = hub.counts();
        assert!(
            counts.wg_sessions + counts.pending <= cap,
            "{} entries in a table of {cap}",
            counts.wg_sessions + counts.pending
        );
    }
}

/// Drives a relay-session table ([`crate::session::SessionTable`]) as a
/// state machine: the input is a sequence of 4-byte operations (op, a, b,
/// c) over four keys, eight source addresses (six IPv4, one of them also
/// written IPv4-mapped, and one IPv6) and three DERP source IPs:
/// allocations (some with the peer behind one of two mesh links), one of
/// those links going down, honest clients binding with a [`Binder`] (each holding its
/// slot's token), data with known or unknown VNIs from any source, alone
/// or as a received train of up to eight datagrams, forged bind messages,
/// answers replayed from other addresses, and time passing (expiry and
/// secret rotation). After each operation it checks:
///
/// - a reply is the datagram rewritten in place (never larger), and a
///   **bound** answers only an honest client's answer: forged and replayed
///   ones never bind a slot;
/// - data is forwarded only between two addresses honest clients bound in
///   that session, never back to its source, in a train as alone;
/// - no key is in more sessions than its limit, no source IP asked for
///   more than its limit, no mesh link holds more than its cap, and the
///   per-state counts add up to the table's
///   size; every session counted as allocated is in the table or counted
///   as freed;
/// - memory is bounded in time: after an expiry, the table holds no more
///   sessions than those still within their bind lifetime (not both
///   bound) or their idle lifetime since the last bind or forward (both
///   bound);
/// - nothing panics.
///
/// [`Binder`]: ferry_proto::relay_session::Binder
pub fn sessions(data: &[u8]) {
    use crate::session::{Limits, SessionTable, Verdict as V};
    use ferry_proto::key::NodePublic;
    use ferry_proto::relay_session::{BindKind, BindMsg, Binder, SessionOffer, Via};
    use ferry_proto::udp_header::{Header, Protocol};
    use std::net::IpAddr;

    use crate::session::Train;
    use ferry_proto::frame::canonical_addr;
    use std::net::Ipv6Addr;

    let keys: [NodePublic; 4] = [1u8, 2, 3, 4].map(|b| NodePublic([b; 32]));
    let source = |i: u8| match i % 8 {
        6 => SocketAddr::from((Ipv4Addr::new(10, 1, 0, 1).to_ipv6_mapped(), 4001)),
        7 => SocketAddr::from((Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7), 4007)),
        n => SocketAddr::from((Ipv4Addr::new(10, 1, 0, n), 4000 + u16::from(n))),
    };
    let ip = |i: u8| IpAddr::from(Ipv4Addr::new(10, 9, 0, i % 3));
    let limits = Limits {
        per_key: 2,
        per_ip: 3,
        per_link: 2,
        ..Limits::default()
    };
    let t0 = Instant::now();
    let mut now = t0;
    let mut table = SessionTable::with_seed(limits, 7, now);
    // Honest clients: (vni, slot) -> binder; what they got bound.
    let mut binders: HashMap<(u32, u8), Binder> = HashMap::new();
    let mut bound: HashMap<(u32, u8), SocketAddr> = HashMap::new();
    let mut vnis: Vec<u32> = Vec::new();
    // Per session: when it was made, and its last bind or forward.
    let mut made: HashMap<u32, (Instant, Instant)> = HashMap::new();
    let mut last_answer: Option<[u8; 78]> = None;
    // Whether data from `from` to `to` in session `vni` may be forwarded.
    let may_forward = |bound: &HashMap<(u32, u8), SocketAddr>, vni, from, to| {
        let ends = [0, 1].map(|slot| bound.get(&(vni, slot)).map(|&a| canonical_addr(a)));
        from != to && ends.contains(&Some(from)) && ends.contains(&Some(to))
    };
    for op in data.chunks_exact(4).take(MAX_OPS) {
        let (a, b, c) = (op[1], op[2], op[3]);
        match op[0] % 7 {
            0 if c & 0xc0 == 0xc0 => {
                // Mesh link c & 1 goes down: its unbound remote slots'
                // sessions are freed.
                for gone in table.link_down(u16::from(c & 1)) {
                    made.remove(&gone.vni);
                    for slot in 0..2 {
                        binders.remove(&(gone.vni, slot));
                        bound.remove(&(gone.vni, slot));
                    }
                }
            }
            0 => {
                let (ka, kb) = (keys[usize::from(a % 4)], keys[usize::from(b % 4)]);
                // With c's top bit, kb is behind mesh link (c >> 4) & 1.
                let via = (c & 0x80 != 0).then(|| Via {
                    link: u16::from((c >> 4) & 1),
                    key: kb,
                });
                if let Ok(al) = table.allocate_via(&ka, &kb, ip(c), [0, 0], via, now) {
                    if !vnis.contains(&al.vni) {
                        vnis.push(al.vni);
                    }
                    if !al.existing {
                        // A new session (its VNI may be an old one's).
                        made.insert(al.vni, (now, now));
                        for slot in 0..2 {
                            binders.remove(&(al.vni, slot));
                            bound.remove(&(al.vni, slot));
                        }
                    }
                    for slot in 0..2u8 {
                        let offer = SessionOffer {
                            request_id: 0,
                            vni: al.vni,
                            peer: kb,
                            slot,
                            token: al.tokens[usize::from(slot)],
                            endpoints: vec![source(0)],
                            bind_lifetime: limits.bind_lifetime,
                            idle_lifetime: limits.idle_lifetime,
                        };
                        binders
                            .entry((al.vni, slot))
                            .or_insert_with(|| Binder::new(&offer, source(0), 1, now));
                    }
                }
            }
            1 if !vnis.is_empty() => {
                // An honest client's next message, from source c.
                let vni = vnis[usize::from(a) % vnis.len()];
                let slot = b & 1;
                let from = source(c);
                if let Some(binder) = binders.get_mut(&(vni, slot)) {
                    if c & 0x80 != 0 {
                        let g = binder.generation() + 1;
                        binder.rebind(now, source(0), g);
                    }
                    if let Some(mut msg) = binder.poll_transmit(now + Duration::from_secs(3)) {
                        let sent = BindMsg::parse(&msg).expect("binder output parses");
                        if sent.kind == BindKind::Answer {
                            last_answer = Some(msg);
                        }
                        if table.handle(now, from, &mut msg) == V::Reply {
                            let reply = BindMsg::parse(&msg).expect("a reply parses");
                            if reply.kind == BindKind::Bound {
                                assert_eq!(sent.kind, BindKind::Answer);
                                bound.insert((vni, slot), from);
                                if let Some(m) = made.get_mut(&vni) {
                                    m.1 = now;
                                }
                            }
                            binder.handle(now, &msg);
                        }
                    }
                }
            }
            2 => {
                let vni = match vnis.get(usize::from(b) % (vnis.len() + 1)) {
                    Some(&v) => v,
                    None => u32::from(b) + 1,
                };
                let from = source(a);
                let mut d = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
                d.resize(8 + usize::from(c % 64), c);
                if let V::Forward(to) = table.handle(now, from, &mut d) {
                    assert!(
                        may_forward(&bound, vni, canonical_addr(from), to),
                        "forwarded {from} -> {to} in session {vni:#x}"
                    );
                    if let Some(m) = made.get_mut(&vni) {
                        m.1 = now;
                    }
                }
            }
            3 => {
                now += Duration::from_millis(u64::from(a) * 250 + u64::from(b));
                table.rotate(now);
                table.expire(now);
                let alive = made
                    .iter()
                    .filter(|(vni, (created, active))| {
                        let both =
                            bound.contains_key(&(**vni, 0)) && bound.contains_key(&(**vni, 1));
                        if both {
                            now.duration_since(*active) < limits.idle_lifetime
                        } else {
                            now.duration_since(*created) < limits.bind_lifetime
                        }
                    })
                    .count();
                assert!(
                    table.len() <= alive,
                    "{} sessions after an expiry, {alive} within their lifetimes",
                    table.len()
                );
            }
            6 if !vnis.is_empty() => {
                // A received train from one source: data of one or two
                // sessions (a bind message or a bad header in between).
                let from = source(a);
                let mut train = Train::default();
                for i in 0..(b % 8) + 1 {
                    let pick = if c & (1 << i) != 0 {
                        usize::from(b)
                    } else {
                        usize::from(a)
                    };
                    let vni = vnis[pick % vnis.len()];
                    let mut d = match (c >> 6, i) {
                        (1, 3) => vec![0xff; 12],
                        (2, 2) => BindMsg::new(BindKind::Bind, vni, 0, 1).to_bytes().to_vec(),
                        _ => Header::data(Protocol::Payload, vni).to_bytes().to_vec(),
                    };
                    d.resize(d.len().max(8 + usize::from(i) * 100), i);
                    if let V::Forward(to) = table.handle_in_train(now, from, &mut d, &mut train) {
                        assert!(
                            may_forward(&bound, vni, canonical_addr(from), to),
                            "a train forwarded {from} -> {to} in session {vni:#x}"
                        );
                        if let Some(m) = made.get_mut(&vni) {
                            m.1 = now;
                        }
                    }
                }
            }
            4 => {
                // A forged bind message.
                let vni = vnis
                    .get(usize::from(a) % (vnis.len() + 1))
                    .copied()
                    .unwrap_or(1);
                let kind = [
                    BindKind::Bind,
                    BindKind::Challenge,
                    BindKind::Answer,
                    BindKind::Bound,
                ][usize::from(b % 4)];
                let mut m = BindMsg::new(kind, vni, b >> 7, u32::from(c) + 1);
                if kind != BindKind::Bind && kind != BindKind::Bound {
                    m.cookie = [c; 32];
                }
                if kind == BindKind::Answer {
                    m.proof = [a; 32];
                }
                let mut bytes = m.to_bytes();
                match table.handle(now, source(c), &mut bytes) {
                    V::Reply => {
                        assert_eq!(kind, BindKind::Bind, "only a bind is answered");
                        let r = BindMsg::parse(&bytes).expect("a reply parses");
                        assert_eq!(r.kind, BindKind::Challenge);
                    }
                    V::Forward(_) => panic!("a bind message was forwarded"),
                    V::Drop(_) => {}
                }
            }
            5 => {
                // The last honest answer, replayed from another address.
                if let Some(mut msg) = last_answer {
                    let m = BindMsg::parse(&msg).expect("parses");
                    let from = source(a);
                    let v = table.handle(now, from, &mut msg);
                    if v == V::Reply {
                        // Only from the address it was made for (the
                        // cookie's): then it is a repeat or a (re)bind by
                        // the honest client itself.
                        let r = BindMsg::parse(&msg).expect("parses");
                        assert_eq!(r.kind, BindKind::Bound);
                        bound.insert((m.vni, m.slot), from);
                        if let Some(made) = made.get_mut(&m.vni) {
                            made.1 = now;
                        }
                    }
                }
            }
            _ => {}
        }
        for k in &keys {
            assert!(table.sessions_of(k) <= limits.per_key);
        }
        let s = table.states();
        assert_eq!(s.allocated + s.half_bound + s.bound, table.len());
        assert!(table.len() <= limits.per_ip * 3, "per-IP limit");
        for link in 0..2 {
            assert!(table.via_link(link) <= limits.per_link, "per-link cap");
        }
        let n = table.counters();
        assert!(
            n.allocated >= table.len() as u64 + n.freed_bind_timeout + n.freed_idle + n.freed_mesh,
            "sessions neither in the table nor freed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke() {
        hub(b"");
        hub(&[0]);
        hub(&[0xff; 401]);
        // Every operation kind once, from every source.
        let ops: Vec<u8> = (0..64u8)
            .flat_map(|k| [k, k.wrapping_mul(37), k, k])
            .collect();
        hub(&[&[0x3c][..], &ops].concat());
        peer_relay_port(&ops);
    }
}
