//! Sans-IO tests of the hub: real wireguard-go handshake bytes where the
//! scenario allows, synthetic messages sealed with real MAC1 otherwise.

use super::*;
use ferry_proto::wireguard::{self as wg, Message};
use std::net::Ipv6Addr;
use std::sync::Mutex;

fn hex(text: &str) -> Vec<u8> {
    let t = text.trim().as_bytes();
    t.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

const INIT: &str = include_str!("../../../proto/src/wireguard/fixtures/a_to_b_initiation_0.hex");
const RESP: &str = include_str!("../../../proto/src/wireguard/fixtures/b_to_a_response_0.hex");
const COOKIE: &str =
    include_str!("../../../proto/src/wireguard/fixtures/b_to_flood_cookie_reply_0.hex");
const A_KEEPALIVE: &str =
    include_str!("../../../proto/src/wireguard/fixtures/a_to_b_keepalive_0.hex");
const B_PING: &str = include_str!("../../../proto/src/wireguard/fixtures/b_to_a_transport_0.hex");
const A_PUB: &str = include_str!("../../../proto/src/wireguard/fixtures/a.public");
const B_PUB: &str = include_str!("../../../proto/src/wireguard/fixtures/b.public");

fn key(text: &str) -> PublicKey {
    PublicKey::from_base64(text).unwrap()
}

fn synthetic_key(n: u8) -> PublicKey {
    PublicKey::from_bytes([n; 32])
}

fn peer(name: &str, key: PublicKey) -> PeerInfo {
    PeerInfo {
        name: name.into(),
        key,
        mac1: Mac1Key::new(&key),
        allow: None,
        fixed: None,
        active: true,
    }
}

fn settings(peers: Vec<PeerInfo>) -> Arc<HubSettings> {
    Arc::new(HubSettings {
        peers,
        max_indices: 1024,
        handshake_rate: 1000.0,
        handshake_burst: 1000.0,
    })
}

fn ep(s: &str) -> Endpoint {
    Endpoint {
        addr: s.parse().unwrap(),
        via: 0,
    }
}

const XA: &str = "10.77.1.2:51820";
const XB: &str = "10.77.2.2:51820";

/// A (fixture key), B (fixture key, fixed endpoint XB), C (synthetic).
fn abc() -> Hub {
    let mut b = peer("b", key(B_PUB));
    b.fixed = Some(ep(XB));
    Hub::new(
        0,
        settings(vec![peer("a", key(A_PUB)), b, peer("c", synthetic_key(3))]),
        Box::new(NoInbox),
    )
}

fn go(h: &mut Hub, now: Instant, from: &str, msg: &[u8]) -> Verdict {
    h.route(now, from.parse().unwrap(), 0, msg)
}

fn transport(receiver: Index, counter: u64) -> Vec<u8> {
    let mut m = vec![0u8; 48];
    m[0] = 4;
    m[4..8].copy_from_slice(&receiver.to_le_bytes());
    m[8..16].copy_from_slice(&counter.to_le_bytes());
    m
}

fn indices() -> (Index, Index) {
    match wg::classify(&hex(RESP)).unwrap() {
        Message::Response { sender, receiver } => (receiver, sender),
        m => panic!("{m:?}"),
    }
}

/// A handshake message with a random sender index, sealed for `to`.
fn initiation(sender: Index, to: &PublicKey) -> Vec<u8> {
    let mut m = vec![0x55u8; wg::INITIATION_LEN];
    m[..4].copy_from_slice(&[1, 0, 0, 0]);
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    assert!(wg::seal_mac1(&mut m, &Mac1Key::new(to)));
    m
}

fn response(sender: Index, receiver: Index, to: &PublicKey) -> Vec<u8> {
    let mut m = vec![0x66u8; wg::RESPONSE_LEN];
    m[..4].copy_from_slice(&[2, 0, 0, 0]);
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    m[8..12].copy_from_slice(&receiver.to_le_bytes());
    assert!(wg::seal_mac1(&mut m, &Mac1Key::new(to)));
    m
}

#[test]
fn learns_a_session_from_a_real_handshake() {
    let t = Instant::now();
    let mut h = abc();
    let (a_index, b_index) = indices();

    assert_eq!(go(&mut h, t, XA, &hex(INIT)), Verdict::Forward(ep(XB)));
    let evs: Vec<_> = h.take_events().collect();
    assert!(
        matches!(evs[..], [Event::Candidate { .. }, Event::Pending { index, responder: 1, initiator: None, .. }] if index == a_index),
        "{evs:?}"
    );
    assert_eq!(h.counts().pending, 1);

    assert_eq!(go(&mut h, t, XB, &hex(RESP)), Verdict::Forward(ep(XA)));
    let c = h.counts();
    assert_eq!((c.wg_sessions, c.pending, c.known_peers), (2, 0, 2));
    assert_eq!(
        h.endpoint(0),
        Some(ep(XA)),
        "A identified by the response's MAC1"
    );

    // A speaks first, to B's index; B answers to A's.
    assert_eq!(
        go(&mut h, t, XA, &hex(A_KEEPALIVE)),
        Verdict::Forward(ep(XB))
    );
    assert_eq!(go(&mut h, t, XB, &hex(B_PING)), Verdict::Forward(ep(XA)));
    assert_eq!(
        go(&mut h, t, XA, &transport(a_index ^ b_index ^ 1, 5)),
        Verdict::Drop(DropReason::UnknownIndex)
    );
    // A known peer cannot use an index of a session it is not in.
    assert_eq!(
        go(&mut h, t, XB, &hex(A_KEEPALIVE)),
        Verdict::Drop(DropReason::WrongSource)
    );
    // The response cannot be replayed into a second session.
    assert_eq!(
        go(&mut h, t, XB, &hex(RESP)),
        Verdict::Drop(DropReason::UnknownIndex)
    );
}

#[test]
fn initiation_mac1_names_the_recipient() {
    let t = Instant::now();
    // Without B in the configuration nobody matches.
    let mut h = Hub::new(
        0,
        settings(vec![peer("a", key(A_PUB)), peer("c", synthetic_key(3))]),
        Box::new(NoInbox),
    );
    assert_eq!(
        go(&mut h, t, XA, &hex(INIT)),
        Verdict::Drop(DropReason::UnknownRecipient)
    );
    let mut bad = hex(INIT);
    bad[40] ^= 1;
    assert_eq!(
        go(&mut abc(), t, XA, &bad),
        Verdict::Drop(DropReason::UnknownRecipient)
    );
}

#[test]
fn cookie_reply_goes_back_to_the_initiator_only_from_the_responder() {
    let t = Instant::now();
    let mut h = abc();
    go(&mut h, t, XA, &hex(INIT));
    assert_eq!(
        go(&mut h, t, "10.77.9.9:1", &hex(COOKIE)),
        Verdict::Drop(DropReason::WrongSource)
    );
    assert_eq!(go(&mut h, t, XB, &hex(COOKIE)), Verdict::Forward(ep(XA)));
}

#[test]
fn roaming_commits_only_after_fresh_counters() {
    let t = Instant::now();
    let (mut h, a_index, b_index) = a_and_b(t);
    for c in 0..10 {
        assert_eq!(
            go(&mut h, t, XA, &transport(b_index, c)),
            Verdict::Forward(ep(XB))
        );
    }
    h.take_events().for_each(drop);

    // A replay from elsewhere is dropped and moves nothing.
    let xa2 = "10.77.1.3:40000";
    assert_eq!(
        go(&mut h, t, xa2, &transport(b_index, 7)),
        Verdict::Drop(DropReason::StaleCounter)
    );
    // Fresh data is forwarded at once; the endpoint moves on the second.
    assert_eq!(
        go(&mut h, t, xa2, &transport(b_index, 10)),
        Verdict::Forward(ep(XB))
    );
    assert_eq!(h.endpoint(0), Some(ep(XA)));
    assert_eq!(
        go(&mut h, t, xa2, &transport(b_index, 10)),
        Verdict::Drop(DropReason::StaleCounter),
        "the same counter twice is a replay"
    );
    assert_eq!(
        go(&mut h, t, xa2, &transport(b_index, 11)),
        Verdict::Forward(ep(XB))
    );
    assert_eq!(h.endpoint(0), Some(ep(xa2)));
    let evs: Vec<_> = h.take_events().collect();
    assert!(
        matches!(evs[..], [Event::Endpoint { peer: 0, .. }]),
        "{evs:?}"
    );
    // B's replies follow A.
    assert_eq!(
        go(&mut h, t, XB, &transport(a_index, 1)),
        Verdict::Forward(ep(xa2))
    );
    // The old address is nobody now; its stale packets are dropped.
    assert_eq!(
        go(&mut h, t, XA, &transport(b_index, 5)),
        Verdict::Drop(DropReason::StaleCounter)
    );
}

/// Routes each `(source, datagram, expected verdict)` at `t`, in order.
fn steps(h: &mut Hub, t: Instant, steps: &[(&str, Vec<u8>, Verdict)]) {
    for (i, (from, msg, want)) in steps.iter().enumerate() {
        assert_eq!(go(h, t, from, msg), *want, "step {i}, from {from}");
    }
}

/// [`p1_p2`] after a handshake: p1 at XA (index 1), p2 at XB (index 2);
/// p1's and p2's keys.
fn p1_p2_session(t: Instant) -> (Hub, PublicKey, PublicKey) {
    let (mut h, k2) = p1_p2(64, 1e6, 1e6);
    let k1 = synthetic_key(1);
    let to = |s| Verdict::Forward(ep(s));
    steps(
        &mut h,
        t,
        &[
            (XA, initiation(1, &k2), to(XB)),
            (XB, response(2, 1, &k1), to(XA)),
        ],
    );
    (h, k1, k2)
}

/// A forged handshake between p1 (key `k1`) and p2 (`k2`) from two
/// addresses of an attacker's: the verdict on its response.
fn forge(h: &mut Hub, t: Instant, k1: &PublicKey, k2: &PublicKey) -> Verdict {
    let _ = go(h, t, "203.0.113.1:1", &initiation(77, k2));
    go(h, t, "203.0.113.2:2", &response(78, 77, k1))
}

#[test]
fn a_forged_handshake_pair_does_not_move_a_live_endpoint() {
    let t = Instant::now();
    let (mut h, k1, k2) = p1_p2_session(t);
    let to = |s| Verdict::Forward(ep(s));
    steps(&mut h, t, &[(XB, transport(1, 1), to(XA))]);
    // Whoever knows both public keys: an initiation for p2 from one
    // address of theirs, its response "from p2" from another.
    let wrong = Verdict::Drop(DropReason::WrongSource);
    assert_eq!(forge(&mut h, t, &k1, &k2), wrong);
    steps(&mut h, t, &[(XB, transport(1, 2), to(XA))]);
    assert_eq!((h.endpoint(0), h.endpoint(1)), (Some(ep(XA)), Some(ep(XB))));
}

#[test]
fn a_live_peer_that_moved_gets_through_by_its_data_then_its_handshakes() {
    let t = Instant::now();
    let (mut h, k1, k2) = p1_p2_session(t);
    let to = |s| Verdict::Forward(ep(s));
    let (xa2, xa3) = ("10.77.1.3:40000", "10.77.1.4:40000");
    steps(
        &mut h,
        t,
        &[
            (XA, transport(2, 1), to(XB)),
            (XB, transport(1, 1), to(XA)),
            // p1 moves while its old address is live: its data moves it
            // (on the second fresh counter) ...
            (xa2, transport(2, 2), to(XB)),
            (xa2, transport(2, 3), to(XB)),
            (XB, transport(1, 2), to(xa2)),
            // ... and its next handshake, from there, completes.
            (xa2, initiation(3, &k2), to(XB)),
            (XB, response(4, 3, &k1), to(xa2)),
        ],
    );
    assert_eq!(h.endpoint(0), Some(ep(xa2)));

    // p1 moves again and handshakes before sending data: refused while
    // its old address was heard within the hold ...
    let t1 = t + Duration::from_secs(1);
    steps(
        &mut h,
        t1,
        &[
            (xa2, transport(4, 1), to(XB)),
            (xa3, initiation(5, &k2), to(XB)),
            (
                XB,
                response(6, 5, &k1),
                Verdict::Drop(DropReason::WrongSource),
            ),
        ],
    );
    assert_eq!(h.endpoint(0), Some(ep(xa2)));
    // ... and accepted once that address has been quiet for the hold
    // (WireGuard retries a handshake after REKEY_TIMEOUT).
    steps(
        &mut h,
        t1 + LIVE_ENDPOINT_HOLD,
        &[
            (xa3, initiation(7, &k2), to(XB)),
            (XB, response(8, 7, &k1), to(xa3)),
        ],
    );
    assert_eq!(h.endpoint(0), Some(ep(xa3)));
}

#[test]
fn replicas_learn_that_a_peer_was_heard() {
    let t = Instant::now();
    let (mut h0, k1, k2) = p1_p2_session(t);
    let (mut h1, _) = p1_p2(64, 1e6, 1e6);
    let evs: Vec<_> = h0.take_events().collect();
    evs.into_iter().for_each(|e| h1.apply(e));
    // p2's data lands on shard 0, a forged pair on shard 1.
    let to = |s| Verdict::Forward(ep(s));
    steps(&mut h0, t, &[(XB, transport(1, 1), to(XA))]);
    let evs: Vec<_> = h0.take_events().collect();
    assert!(matches!(evs[..], [Event::Heard { peer: 1, .. }]), "{evs:?}");
    evs.into_iter().for_each(|e| h1.apply(e));
    // Heard again within the period: no new event.
    steps(&mut h0, t, &[(XB, transport(1, 2), to(XA))]);
    assert!(!h0.has_events());
    let wrong = Verdict::Drop(DropReason::WrongSource);
    assert_eq!(forge(&mut h1, t, &k1, &k2), wrong);
}

#[test]
fn unknown_peers_bootstrap_through_flood_candidates() {
    let t = Instant::now();
    let (k1, k2) = (synthetic_key(1), synthetic_key(2));
    let mut h = Hub::new(
        0,
        settings(vec![peer("p1", k1), peer("p2", k2)]),
        Box::new(NoInbox),
    );
    let (x1, x2) = ("10.77.5.1:1000", "10.77.5.2:2000");
    // p1 calls p2: nobody knows where p2 is, and there is nobody to ask.
    assert_eq!(
        go(&mut h, t, x1, &initiation(0x11, &k2)),
        Verdict::Drop(DropReason::NoEndpoint)
    );
    // p2 calls p1: p1 is unknown too, but x1 is a candidate.
    assert_eq!(go(&mut h, t, x2, &initiation(0x22, &k1)), Verdict::Flood);
    assert_eq!(h.flood_targets(), &[ep(x1)]);
    // p1 answers (MAC1 keyed with p2's key): both are identified.
    assert_eq!(
        go(&mut h, t, x1, &response(0x33, 0x22, &k2)),
        Verdict::Forward(ep(x2))
    );
    assert_eq!(h.endpoint(0), Some(ep(x1)));
    assert_eq!(h.endpoint(1), Some(ep(x2)));
    assert_eq!(
        go(&mut h, t, x2, &transport(0x33, 0)),
        Verdict::Forward(ep(x1))
    );
    assert_eq!(
        go(&mut h, t, x1, &transport(0x22, 0)),
        Verdict::Forward(ep(x2))
    );
    // Now p1's retry reaches p2 directly.
    assert_eq!(
        go(&mut h, t, x1, &initiation(0x44, &k2)),
        Verdict::Forward(ep(x2))
    );
}

#[test]
fn pairs_must_be_allowed() {
    let t = Instant::now();
    let (k1, k2, k3) = (synthetic_key(1), synthetic_key(2), synthetic_key(3));
    let mut p1 = peer("p1", k1);
    p1.allow = Some(vec![2]);
    let mut p2 = peer("p2", k2);
    p2.fixed = Some(ep(XB));
    let mut h = Hub::new(0, settings(vec![p1, p2, peer("p3", k3)]), Box::new(NoInbox));
    let x1 = "10.77.5.1:1000";
    // Unknown source: forwarded, but the response reveals p1 and is refused.
    assert_eq!(
        go(&mut h, t, x1, &initiation(7, &k2)),
        Verdict::Forward(ep(XB))
    );
    assert_eq!(
        go(&mut h, t, XB, &response(8, 7, &k1)),
        Verdict::Drop(DropReason::NotAllowed)
    );
    assert_eq!(h.counts().wg_sessions, 0);
    assert!(!h.settings.allowed(0, 1) && h.settings.allowed(0, 2) && h.settings.allowed(1, 2));
}

#[test]
fn indices_expire_on_wireguards_clock() {
    let t = Instant::now();
    let mut h = abc();
    let (a_index, b_index) = indices();
    go(&mut h, t, XA, &hex(INIT));
    h.expire(t + PENDING_LIFETIME + Duration::from_millis(1));
    assert_eq!(h.counts().pending, 0);
    assert_eq!(
        go(&mut h, t, XB, &hex(RESP)),
        Verdict::Drop(DropReason::UnknownIndex)
    );

    go(&mut h, t, XA, &hex(INIT));
    go(&mut h, t, XB, &hex(RESP));
    h.expire(t + WG_SESSION_LIFETIME - Duration::from_secs(1));
    assert_eq!(
        go(&mut h, t, XB, &transport(a_index, 1)),
        Verdict::Forward(ep(XA))
    );
    h.expire(t + WG_SESSION_LIFETIME + Duration::from_millis(1));
    assert_eq!(h.counts().wg_sessions, 0);
    assert_eq!(
        go(&mut h, t, XA, &transport(b_index, 2)),
        Verdict::Drop(DropReason::UnknownIndex)
    );
    assert_eq!(h.entries, 0, "entry count follows the tables");
}

#[test]
fn colliding_indices_are_told_apart_by_source() {
    let t = Instant::now();
    let keys: Vec<_> = (1..=4).map(synthetic_key).collect();
    let peers = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut p = peer(&format!("p{i}"), *k);
            p.fixed = Some(ep(&format!("10.77.6.{}:1", i + 1)));
            p
        })
        .collect();
    let mut h = Hub::new(0, settings(peers), Box::new(NoInbox));
    let x = |i: u8| format!("10.77.6.{i}:1");
    // p0→p1 and p2→p3 both end up with index 0xAAAA on the responder side.
    go(&mut h, t, &x(1), &initiation(0x10, &keys[1]));
    go(&mut h, t, &x(2), &response(0xAAAA, 0x10, &keys[0]));
    go(&mut h, t, &x(3), &initiation(0x20, &keys[3]));
    go(&mut h, t, &x(4), &response(0xAAAA, 0x20, &keys[2]));
    assert_eq!(h.counts().wg_sessions, 4);
    assert_eq!(
        go(&mut h, t, &x(1), &transport(0xAAAA, 1)),
        Verdict::Forward(ep(&x(2)))
    );
    assert_eq!(
        go(&mut h, t, &x(3), &transport(0xAAAA, 1)),
        Verdict::Forward(ep(&x(4)))
    );
    assert_eq!(
        go(&mut h, t, "10.77.6.99:1", &transport(0xAAAA, 5)),
        Verdict::Drop(DropReason::IndexCollision)
    );
    // A third session on the same index evicts the oldest.
    go(&mut h, t, &x(2), &initiation(0x30, &keys[2]));
    go(&mut h, t, &x(3), &response(0xAAAA, 0x30, &keys[1]));
    assert_eq!(h.counts().collisions, 1);
}

#[test]
fn handshakes_are_rate_limited_per_source() {
    let t = Instant::now();
    let mut b = peer("b", key(B_PUB));
    b.fixed = Some(ep(XB));
    let mut h = Hub::new(
        0,
        Arc::new(HubSettings {
            peers: vec![peer("a", key(A_PUB)), b],
            max_indices: 1024,
            handshake_rate: 1.0,
            handshake_burst: 3.0,
        }),
        Box::new(NoInbox),
    );
    for _ in 0..3 {
        assert_eq!(go(&mut h, t, XA, &hex(INIT)), Verdict::Forward(ep(XB)));
    }
    assert_eq!(
        go(&mut h, t, XA, &hex(INIT)),
        Verdict::Drop(DropReason::RateLimited)
    );
    assert_eq!(
        go(&mut h, t, "10.77.1.9:1", &hex(INIT)),
        Verdict::Forward(ep(XB)),
        "another source is not affected"
    );
    assert_eq!(
        go(&mut h, t + Duration::from_secs(1), XA, &hex(INIT)),
        Verdict::Forward(ep(XB))
    );
}

#[test]
fn only_wireguard_shaped_datagrams_pass() {
    let t = Instant::now();
    let mut h = abc();
    for bad in [
        &b"hello"[..],
        &[1, 0, 0, 0],
        &[4; 100],
        &hex(INIT)[..147],
        &[0u8; 0],
    ] {
        assert_eq!(
            go(&mut h, t, XA, bad),
            Verdict::Drop(DropReason::NotWireGuard)
        );
    }
}

/// Peers p1 and p2 (fixed endpoint XB) with synthetic keys, a table of
/// `max_indices` and a handshake limit; p2's key.
fn p1_p2(max_indices: usize, rate: f64, burst: f64) -> (Hub, PublicKey) {
    let (k1, k2) = (synthetic_key(1), synthetic_key(2));
    let mut p2 = peer("p2", k2);
    p2.fixed = Some(ep(XB));
    let hub = Hub::new(
        0,
        Arc::new(HubSettings {
            peers: vec![peer("p1", k1), p2],
            max_indices,
            handshake_rate: rate,
            handshake_burst: burst,
        }),
        Box::new(NoInbox),
    );
    (hub, k2)
}

#[test]
fn full_table_refuses_new_handshakes() {
    let t = Instant::now();
    let (mut h, k2) = p1_p2(16, 1e6, 1e6);
    // XA is nobody's endpoint yet: a stranger, who may fill all but the
    // reserved quarter.
    for i in 0..12 {
        assert_eq!(
            go(&mut h, t, XA, &initiation(i, &k2)),
            Verdict::Forward(ep(XB))
        );
    }
    assert_eq!(
        go(&mut h, t, XA, &initiation(99, &k2)),
        Verdict::Drop(DropReason::TableFull)
    );
}

#[test]
fn a_host_moving_over_its_ipv6_addresses_cannot_fill_the_table() {
    let t = Instant::now();
    let (mut h, k2) = p1_p2(64, 1.0, 3.0);
    // Someone who knows p2's public key, sending each initiation from
    // another address of its /64.
    for i in 0..200u16 {
        let from = SocketAddr::from((Ipv6Addr::new(0x2001, 0xdb8, 9, 9, 0, 0, 0, i + 1), 4000));
        let _ = h.route(t, from, 0, &initiation(u32::from(i) + 1000, &k2));
    }
    assert!(
        h.counts().pending <= 3,
        "{} pending entries",
        h.counts().pending
    );
    assert_eq!(
        go(&mut h, t, XA, &initiation(7, &k2)),
        Verdict::Forward(ep(XB)),
        "another peer's handshake still gets through"
    );
}

#[test]
fn strangers_cannot_fill_the_table_against_known_peers() {
    let t = Instant::now();
    let (mut h, k2) = p1_p2(64, 1.0, 3.0);
    let k1 = synthetic_key(1);
    // p1 (at XA) and p2 (at XB) complete a handshake: p1 is known at XA.
    assert_eq!(
        go(&mut h, t, XA, &initiation(1, &k2)),
        Verdict::Forward(ep(XB))
    );
    assert_eq!(
        go(&mut h, t, XB, &response(2, 1, &k1)),
        Verdict::Forward(ep(XA))
    );
    // Someone who knows p2's public key, from many IPv4 sources, each
    // within its handshake limit.
    for i in 0..200u32 {
        let from = format!("198.51.{}.{}:4000", i / 250, i % 250 + 1);
        for n in 0..3 {
            let _ = go(&mut h, t, &from, &initiation(1000 + 3 * i + n, &k2));
        }
    }
    assert_eq!(
        go(&mut h, t, XA, &initiation(3, &k2)),
        Verdict::Forward(ep(XB)),
        "a known peer's handshake still finds room"
    );
}

/// Events between replicas through a shared queue per destination.
struct TestInbox(Arc<Mutex<VecDeque<Event>>>);

impl Inbox for TestInbox {
    fn drain(&mut self, apply: &mut dyn FnMut(Event)) {
        let evs: Vec<_> = self.0.lock().unwrap().drain(..).collect();
        evs.into_iter().for_each(apply);
    }
}

#[test]
fn replicas_on_two_shards_agree() {
    let t = Instant::now();
    let mut b = peer("b", key(B_PUB));
    b.fixed = Some(ep(XB));
    let s = settings(vec![peer("a", key(A_PUB)), b]);
    let to0 = Arc::new(Mutex::new(VecDeque::new()));
    let to1 = Arc::new(Mutex::new(VecDeque::new()));
    let mut h0 = Hub::new(0, s.clone(), Box::new(TestInbox(to0.clone())));
    let mut h1 = Hub::new(1, s, Box::new(TestInbox(to1.clone())));
    let ship = |from: &mut Hub, to: &Arc<Mutex<VecDeque<Event>>>| {
        let evs: Vec<_> = from.take_events().collect();
        to.lock().unwrap().extend(evs);
    };
    let (a_index, b_index) = indices();

    // The initiation lands on shard 0, the response on shard 1.
    assert_eq!(go(&mut h0, t, XA, &hex(INIT)), Verdict::Forward(ep(XB)));
    ship(&mut h0, &to1);
    assert_eq!(go(&mut h1, t, XB, &hex(RESP)), Verdict::Forward(ep(XA)));
    ship(&mut h1, &to0);
    // Shard 0 learns the session when its lookup misses.
    assert_eq!(
        go(&mut h0, t, XA, &hex(A_KEEPALIVE)),
        Verdict::Forward(ep(XB))
    );
    assert_eq!(
        go(&mut h1, t, XB, &transport(a_index, 3)),
        Verdict::Forward(ep(XA))
    );
    assert_eq!(h0.counts(), h1.counts());

    // Both shards see A roam at once (its new address hashes to either):
    // each commits with its own version; after exchanging, they agree.
    for c in 10..12 {
        go(&mut h0, t, "10.77.1.50:1", &transport(b_index, c));
        go(&mut h1, t, "10.77.1.51:1", &transport(b_index, c));
    }
    ship(&mut h0, &to1);
    ship(&mut h1, &to0);
    h0.sync();
    h1.sync();
    assert_eq!(h0.endpoint(0), h1.endpoint(0));
    assert_eq!(
        h0.endpoint(0),
        Some(ep("10.77.1.51:1")),
        "shard 1 wins the tie"
    );
}

#[test]
fn pending_entries_expire_behind_longer_lived_sessions() {
    // Found by the `hub` fuzz target: one FIFO for both lifetimes kept a
    // pending entry alive until the session queued before it expired.
    let t = Instant::now();
    let mut h = abc();
    go(&mut h, t, XA, &hex(INIT));
    go(&mut h, t, XB, &hex(RESP));
    assert_eq!(h.counts().wg_sessions, 2);
    let later = t + Duration::from_secs(1);
    assert_eq!(
        go(&mut h, later, XA, &initiation(0x77, &key(B_PUB))),
        Verdict::Forward(ep(XB))
    );
    h.expire(later + PENDING_LIFETIME);
    let c = h.counts();
    assert_eq!((c.wg_sessions, c.pending), (2, 0));
    assert_eq!(
        go(
            &mut h,
            later + PENDING_LIFETIME,
            XB,
            &response(0x78, 0x77, &key(A_PUB))
        ),
        Verdict::Drop(DropReason::UnknownIndex),
        "a response to a forgotten initiation"
    );
    assert_eq!(h.entries, 2, "entry count follows the tables");
}

#[test]
fn removed_peers_are_forgotten_and_added_ones_reachable() {
    let t = Instant::now();
    let cell = Arc::new(Published::new(HubSettings {
        peers: vec![],
        max_indices: 1024,
        handshake_rate: 1000.0,
        handshake_burst: 1000.0,
    }));
    let mut h = abc();
    let (a_index, _) = indices();
    assert_eq!(go(&mut h, t, XA, &hex(INIT)), Verdict::Forward(ep(XB)));
    assert_eq!(go(&mut h, t, XB, &hex(RESP)), Verdict::Forward(ep(XA)));
    assert_eq!(h.counts().wg_sessions, 2);

    // B removed (its id stays, inactive), D added with a fixed endpoint.
    let mut peers = h.settings.peers.clone();
    peers[1].active = false;
    let mut d = peer("d", synthetic_key(4));
    d.fixed = Some(ep("10.77.4.2:51820"));
    peers.push(d);
    cell.set(HubSettings {
        peers,
        max_indices: 1024,
        handshake_rate: 1000.0,
        handshake_burst: 1000.0,
    });
    h.follow(cell.clone());
    let c = h.counts();
    assert_eq!(
        (c.wg_sessions, c.pending, c.known_peers),
        (0, 0, 2),
        "B's session and endpoint are gone"
    );
    assert_eq!(h.endpoint(1), None);
    assert_eq!(
        go(&mut h, t, XA, &hex(A_KEEPALIVE)),
        Verdict::Drop(DropReason::UnknownIndex)
    );
    assert_eq!(
        go(&mut h, t, XA, &hex(INIT)),
        Verdict::Drop(DropReason::UnknownRecipient),
        "nobody configured has B's key now"
    );
    assert_eq!(
        go(&mut h, t, XA, &initiation(7, &synthetic_key(4))),
        Verdict::Forward(ep("10.77.4.2:51820"))
    );
    // An event about B from a shard that has not switched yet is ignored.
    h.apply(Event::Endpoint {
        peer: 1,
        endpoint: ep(XB),
        version: 1 << 20,
    });
    assert_eq!(h.endpoint(1), None);

    // A replica that meets an id it does not know takes the published
    // settings first.
    let mut other = abc();
    other.follow(Arc::new(Published::new((*h.settings).clone())));
    let mut late = abc();
    let behind = Arc::new(Published::new((*abc().settings).clone()));
    late.follow(behind.clone());
    behind.set((*h.settings).clone());
    late.apply(Event::WgSession {
        initiator_index: a_index,
        initiator: 0,
        responder_index: 99,
        responder: 3,
        at: t,
    });
    assert_eq!(late.counts().wg_sessions, 2);
    assert_eq!(other.settings.peers.len(), 4);
}

/// [`abc`] after A's and B's real handshake: (hub, A's index, B's index).
fn a_and_b(t: Instant) -> (Hub, Index, Index) {
    let mut h = abc();
    let (a_index, b_index) = indices();
    go(&mut h, t, XA, &hex(INIT));
    go(&mut h, t, XB, &hex(RESP));
    (h, a_index, b_index)
}

/// Routes the datagrams of one train (one source) as the shard does, and
/// checks each one's verdict.
fn check_train(h: &mut Hub, now: Instant, from: &str, train: &[(Vec<u8>, Verdict)]) {
    let mut t = Train::default();
    let got: Vec<Verdict> = train
        .iter()
        .map(|(m, _)| h.route_in_train(now, from.parse().unwrap(), 0, m, &mut t))
        .collect();
    h.end_train(&mut t);
    let want: Vec<Verdict> = train.iter().map(|&(_, v)| v).collect();
    assert_eq!(got, want);
}

#[test]
fn a_train_is_checked_datagram_by_datagram_and_keeps_its_highest_counter() {
    let t = Instant::now();
    let (mut h, a_index, b_index) = a_and_b(t);
    h.take_events().for_each(drop);

    // A train from A mixing B's index, an unknown index, junk, A's own
    // index (A is not that session's partner) and B's index again: each
    // datagram gets its own verdict, in order.
    let mut junk = transport(b_index, 3);
    junk[0] = 9;
    let to_b = Verdict::Forward(ep(XB));
    check_train(
        &mut h,
        t,
        XA,
        &[
            (transport(b_index, 1), to_b),
            (transport(b_index, 2), to_b),
            (
                transport(a_index ^ b_index ^ 1, 3),
                Verdict::Drop(DropReason::UnknownIndex),
            ),
            (transport(b_index, 4), to_b),
            (junk, Verdict::Drop(DropReason::NotWireGuard)),
            (
                transport(a_index, 6),
                Verdict::Drop(DropReason::WrongSource),
            ),
            (transport(b_index, 20), to_b),
            (transport(b_index, 7), to_b),
        ],
    );
    // The run's highest counter (20, not its last, 7) was recorded: from a
    // new address, 20 is a replay and 21 fresh.
    let xa2 = "10.77.1.3:40000";
    assert_eq!(
        go(&mut h, t, xa2, &transport(b_index, 20)),
        Verdict::Drop(DropReason::StaleCounter)
    );
    assert_eq!(go(&mut h, t, xa2, &transport(b_index, 21)), to_b);
}

#[test]
fn a_train_from_a_roaming_address_is_judged_per_datagram() {
    let t = Instant::now();
    let (mut h, _, b_index) = a_and_b(t);
    go(&mut h, t, XA, &transport(b_index, 10));
    // From a new address nothing is taken on trust from the datagram
    // before: replays inside the train are dropped one by one, and the
    // endpoint moves on the second fresh one.
    let xa2 = "10.77.1.3:40000";
    let (to_b, stale) = (
        Verdict::Forward(ep(XB)),
        Verdict::Drop(DropReason::StaleCounter),
    );
    check_train(
        &mut h,
        t,
        xa2,
        &[
            (transport(b_index, 11), to_b),
            (transport(b_index, 11), stale),
            (transport(b_index, 5), stale),
            (transport(b_index, 12), to_b),
            (transport(b_index, 13), to_b),
        ],
    );
    assert_eq!(h.endpoint(0), Some(ep(xa2)));
    // At home there now, and its train's counters recorded: the old
    // address's replay of the last one is refused.
    check_train(&mut h, t, XA, &[(transport(b_index, 13), stale)]);
}
