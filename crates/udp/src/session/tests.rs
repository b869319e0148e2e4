use super::*;
use ferry_proto::relay_session::{
    BindKind, BindMsg, Binder, RefuseReason, SessionOffer, Via, BIND_LEN,
};
use ferry_proto::udp_header;
use ferry_proto::udp_header::Protocol;

fn key(b: u8) -> NodePublic {
    NodePublic([b; 32])
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

const RELAY: &str = "192.0.2.1:3479";
const IP: &str = "203.0.113.9";

fn table(now: Instant) -> SessionTable {
    SessionTable::with_seed(Limits::default(), 1, now)
}

fn offer(a: &Allocation, slot: u8, peer: NodePublic) -> SessionOffer {
    SessionOffer {
        request_id: 0,
        vni: a.vni,
        peer,
        slot,
        token: a.tokens[usize::from(slot)],
        endpoints: vec![addr(RELAY)],
        bind_lifetime: Duration::from_secs(30),
        idle_lifetime: Duration::from_secs(60),
    }
}

/// Runs a binder against the table until it is bound (or `rounds` pass);
/// every datagram from `from`.
fn bind(t: &mut SessionTable, b: &mut Binder, from: SocketAddr, now: Instant) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for _ in 0..4 {
        let Some(mut msg) = b.poll_transmit(now) else {
            break;
        };
        let v = t.handle(now, from, &mut msg);
        verdicts.push(v);
        if v == Verdict::Reply {
            assert!(b.handle(now, &msg));
        }
    }
    verdicts
}

/// A table with one session, between keys 1 and 2 (1 asked).
fn one_session(now: Instant) -> (SessionTable, Allocation) {
    let mut t = table(now);
    let al = t
        .allocate(&key(1), &key(2), IP.parse().unwrap(), now)
        .unwrap();
    (t, al)
}

/// Sends `b`'s bind from `from`, hands it the challenge, and returns the
/// answer it makes (not sent).
fn answer_of(
    t: &mut SessionTable,
    b: &mut Binder,
    from: SocketAddr,
    now: Instant,
) -> [u8; BIND_LEN] {
    let mut m = b.poll_transmit(now).unwrap();
    assert_eq!(t.handle(now, from, &mut m), Verdict::Reply);
    assert!(b.handle(now, &m));
    b.poll_transmit(now).unwrap()
}

fn data(vni: u32, body: &[u8]) -> Vec<u8> {
    let mut d = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
    d.extend_from_slice(body);
    d
}

/// A session between keys 1 and 2, both bound: (table, allocation, a, b).
fn bound_pair(now: Instant) -> (SessionTable, Allocation, SocketAddr, SocketAddr) {
    let (mut t, al) = one_session(now);
    let (a, b) = (addr("198.51.100.1:1000"), addr("198.51.100.2:2000"));
    let mut ba = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 1, now);
    let mut bb = Binder::new(&offer(&al, 1, key(1)), addr(RELAY), 1, now);
    bind(&mut t, &mut ba, a, now);
    bind(&mut t, &mut bb, b, now);
    assert!(ba.is_bound() && bb.is_bound());
    (t, al, a, b)
}

#[test]
fn allocation_is_per_unordered_pair() {
    let now = Instant::now();
    let mut t = table(now);
    let ip = IP.parse().unwrap();
    let a = t.allocate(&key(1), &key(2), ip, now).unwrap();
    assert!(a.vni != 0 && a.vni <= udp_header::MAX_VNI);
    assert_eq!((a.slot, a.existing), (0, false));
    assert_ne!(a.tokens[0], a.tokens[1]);
    // The peer asking gets the same session, its own slot.
    let b = t.allocate(&key(2), &key(1), ip, now).unwrap();
    assert_eq!(
        (b.vni, b.slot, b.tokens, b.existing),
        (a.vni, 1, a.tokens, true)
    );
    let again = t.allocate(&key(1), &key(2), ip, now).unwrap();
    assert_eq!((again.vni, again.slot), (a.vni, 0));
    let other = t.allocate(&key(1), &key(3), ip, now).unwrap();
    assert_ne!(other.vni, a.vni);
    assert_ne!(other.tokens, a.tokens);
    assert_eq!(t.len(), 2);
    assert_eq!(t.sessions_of(&key(1)), 2);
    assert_eq!(t.counters().allocated, 2);
    assert_eq!(t.counters().reused, 2);
    assert_eq!(
        t.allocate(&key(4), &key(4), ip, now),
        Err(RefuseReason::SelfPeer)
    );
}

#[test]
fn limits_per_key_and_per_source_ip() {
    let now = Instant::now();
    let limits = Limits {
        per_key: 3,
        per_ip: 5,
        ..Limits::default()
    };
    let mut t = SessionTable::with_seed(limits, 2, now);
    let ip: IpAddr = IP.parse().unwrap();
    for p in 2..5 {
        t.allocate(&key(1), &key(p), ip, now).unwrap();
    }
    // Key 1 is in three sessions: as asker and as peer, no more.
    assert_eq!(
        t.allocate(&key(1), &key(9), ip, now),
        Err(RefuseReason::Limit)
    );
    assert_eq!(
        t.allocate(&key(9), &key(1), ip, now),
        Err(RefuseReason::Limit)
    );
    // An existing session is still found.
    assert!(t.allocate(&key(1), &key(2), ip, now).unwrap().existing);
    t.allocate(&key(10), &key(11), ip, now).unwrap();
    t.allocate(&key(12), &key(13), ip, now).unwrap();
    // Five from this IP.
    assert_eq!(
        t.allocate(&key(14), &key(15), ip, now),
        Err(RefuseReason::Limit)
    );
    let elsewhere: IpAddr = "203.0.113.10".parse().unwrap();
    t.allocate(&key(14), &key(15), elsewhere, now).unwrap();
    assert_eq!(t.counters().refused_limit, 3);
    // Freed sessions give their room back.
    t.expire(now + Duration::from_secs(31));
    assert!(t.is_empty());
    t.allocate(&key(1), &key(9), ip, now).unwrap();
}

/// Sessions others opened with a key count against it only once it asks
/// for them or binds its slot. 32 strangers (each from its own address)
/// asking for V used to lock V out of sessions of its own; now V's own
/// allocations evict the strangers' sessions it never took part in,
/// oldest first, and V is refused only when it has taken part in as many
/// as its limit allows.
#[test]
fn strangers_asking_for_a_key_do_not_use_up_its_limit() {
    let t0 = Instant::now();
    let mut t = table(t0);
    let victim = key(200);
    let stranger_ip = |s: u8| IpAddr::from([198, 51, 100, s]);
    let mut theirs = Vec::new();
    for s in 0..32u8 {
        let at = t0 + Duration::from_millis(u64::from(s));
        theirs.push(t.allocate(&key(s), &victim, stranger_ip(s), at).unwrap());
    }
    // The victim binds its slot of stranger 0's session: it takes part.
    let mut bv = Binder::new(&offer(&theirs[0], 1, key(0)), addr(RELAY), 1, t0);
    bind(&mut t, &mut bv, addr("198.51.100.200:5000"), t0);
    assert!(bv.is_bound());
    let ip: IpAddr = IP.parse().unwrap();
    let later = t0 + Duration::from_secs(1);
    for f in 0..31u8 {
        let own = t.allocate(&victim, &key(100 + f), ip, later).unwrap();
        assert!(!own.existing);
    }
    // 31 of its own and the one it bound: the limit.
    assert_eq!(
        t.allocate(&victim, &key(150), ip, later),
        Err(RefuseReason::Limit)
    );
    assert_eq!(t.sessions_of(&victim), 32);
    // Stranger 0's session, which the victim bound, was kept; the others'
    // were evicted (asking again makes a new one, which evicts nothing
    // the victim took part in: refused).
    assert!(
        t.allocate(&key(0), &victim, stranger_ip(0), later)
            .unwrap()
            .existing
    );
    assert_eq!(
        t.allocate(&key(1), &victim, stranger_ip(1), later),
        Err(RefuseReason::Limit)
    );
}

#[test]
fn both_sides_bind_and_data_passes_both_ways() {
    let now = Instant::now();
    let (mut t, al, a, b) = bound_pair(now);
    assert_eq!(
        t.states(),
        States {
            bound: 1,
            ..States::default()
        }
    );
    let mut d = data(al.vni, b"hello");
    let before = d.clone();
    assert_eq!(t.handle(now, a, &mut d), Verdict::Forward(b));
    assert_eq!(d, before, "forwarded unchanged");
    assert_eq!(t.handle(now, b, &mut d), Verdict::Forward(a));
    // A probe (data bit, control protocol) is forwarded too.
    let mut probe = Header::data(Protocol::Control, al.vni).to_bytes().to_vec();
    assert_eq!(t.handle(now, b, &mut probe), Verdict::Forward(a));
    let c = t.counters();
    assert_eq!((c.forwarded_packets, c.binds, c.challenges), (3, 2, 2));
    assert_eq!(c.forwarded_bytes, 2 * 13 + 8);
    // IPv4-mapped sources are the same address.
    let mapped = addr("[::ffff:198.51.100.1]:1000");
    assert_eq!(t.handle(now, mapped, &mut d), Verdict::Forward(b));
}

#[test]
fn nothing_passes_before_both_slots_bind() {
    let now = Instant::now();
    let (mut t, al) = one_session(now);
    let a = addr("198.51.100.1:1000");
    let mut d = data(al.vni, b"x");
    assert_eq!(t.handle(now, a, &mut d), Verdict::Drop(Drop::Unbound));
    let mut ba = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 1, now);
    bind(&mut t, &mut ba, a, now);
    assert_eq!(
        t.states(),
        States {
            half_bound: 1,
            ..States::default()
        }
    );
    assert_eq!(t.handle(now, a, &mut d), Verdict::Drop(Drop::Unbound));
    assert_eq!(t.counters().dropped(Drop::Unbound), 2);
}

#[test]
fn strangers_wrong_tokens_vnis_and_replays_are_dropped() {
    let now = Instant::now();
    let (mut t, al, a, b) = bound_pair(now);
    let stranger = addr("198.51.100.66:6666");
    // Data from a third address, and to an unknown VNI.
    let mut d = data(al.vni, b"x");
    assert_eq!(
        t.handle(now, stranger, &mut d),
        Verdict::Drop(Drop::WrongSource)
    );
    let mut d = data(al.vni ^ 1, b"x");
    assert_eq!(t.handle(now, a, &mut d), Verdict::Drop(Drop::UnknownVni));
    // A bind for an unknown VNI is not challenged.
    let mut m = BindMsg::new(BindKind::Bind, al.vni ^ 1, 0, 1).to_bytes();
    assert_eq!(
        t.handle(now, stranger, &mut m),
        Verdict::Drop(Drop::UnknownVni)
    );
    // The stranger gets a challenge (to its own address) but has no token.
    let mut wrong = offer(&al, 0, key(2));
    wrong.token = [7; 32];
    let mut bs = Binder::new(&wrong, addr(RELAY), 5, now);
    let v = bind(&mut t, &mut bs, stranger, now);
    assert_eq!(v, vec![Verdict::Reply, Verdict::Drop(Drop::BadProof)]);
    // A's valid answer (a rebind) replayed from the stranger's address:
    // the cookie is A's address's.
    let mut ba = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 9, now);
    let mut replayed = answer_of(&mut t, &mut ba, a, now);
    assert_eq!(
        t.handle(now, stranger, &mut replayed),
        Verdict::Drop(Drop::BadCookie)
    );
    // Slot 0 is still A's: data flows as before.
    let mut d = data(al.vni, b"x");
    assert_eq!(t.handle(now, a, &mut d), Verdict::Forward(b));
    // Garbage, a wrong-size bind, a client sending a challenge.
    assert_eq!(
        t.handle(now, a, &mut [1, 0, 0, 0, 9, 9, 9, 9]),
        Verdict::Drop(Drop::BadHeader)
    );
    let mut short = BindMsg::new(BindKind::Bind, al.vni, 0, 1).to_bytes()[..70].to_vec();
    assert_eq!(t.handle(now, a, &mut short), Verdict::Drop(Drop::BadBind));
    let mut ch = BindMsg::new(BindKind::Challenge, al.vni, 0, 1).to_bytes();
    assert_eq!(t.handle(now, a, &mut ch), Verdict::Drop(Drop::BadBind));
    let c = t.counters();
    assert_eq!(c.dropped(Drop::WrongSource), 1);
    assert_eq!(c.dropped(Drop::UnknownVni), 2);
    assert_eq!(c.dropped(Drop::BadProof), 1);
    assert_eq!(c.dropped(Drop::BadCookie), 1);
    assert_eq!(c.dropped(Drop::BadHeader), 1);
    assert_eq!(c.dropped(Drop::BadBind), 2);
}

#[test]
fn replies_are_never_larger_than_what_caused_them() {
    let now = Instant::now();
    let (mut t, al) = one_session(now);
    let mut b = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 1, now);
    let mut msg = b.poll_transmit(now).unwrap();
    assert_eq!(
        t.handle(now, addr("198.51.100.1:1"), &mut msg),
        Verdict::Reply
    );
    assert_eq!(msg.len(), BIND_LEN);
    assert_eq!(BindMsg::parse(&msg).unwrap().kind, BindKind::Challenge);
}

#[test]
fn a_repeated_answer_is_answered_again_and_rebinding_needs_a_newer_generation() {
    let now = Instant::now();
    let (mut t, al) = one_session(now);
    let (a, a2, b) = (
        addr("198.51.100.1:1000"),
        addr("198.51.100.1:1001"),
        addr("198.51.100.2:2000"),
    );
    let mut ba = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 3, now);
    let mut bb = Binder::new(&offer(&al, 1, key(1)), addr(RELAY), 1, now);
    let answer = answer_of(&mut t, &mut ba, a, now);
    for _ in 0..3 {
        let mut again = answer;
        assert_eq!(t.handle(now, a, &mut again), Verdict::Reply);
        assert_eq!(BindMsg::parse(&again).unwrap().kind, BindKind::Bound);
    }
    assert_eq!(t.counters().binds, 1, "repeats change nothing");
    bind(&mut t, &mut bb, b, now);
    // The NAT moved A to a new port: an old generation from there fails.
    let mut old = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 2, now);
    let v = bind(&mut t, &mut old, a2, now);
    assert_eq!(
        v,
        vec![Verdict::Reply, Verdict::Drop(Drop::StaleGeneration)]
    );
    let mut d = data(al.vni, b"x");
    assert_eq!(t.handle(now, b, &mut d), Verdict::Forward(a));
    // A newer one moves the slot.
    ba.rebind(now, addr(RELAY), 4);
    bind(&mut t, &mut ba, a2, now);
    assert!(ba.is_bound());
    assert_eq!(t.handle(now, b, &mut d), Verdict::Forward(a2));
    assert_eq!(t.handle(now, a, &mut d), Verdict::Drop(Drop::WrongSource));
}

#[test]
fn the_cookie_secret_rotates_and_the_previous_one_still_counts() {
    let t0 = Instant::now();
    let (mut t, al) = one_session(t0);
    let a = addr("198.51.100.1:1000");
    let mut b = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 1, t0);
    let answer = answer_of(&mut t, &mut b, a, t0);
    t.rotate(t0 + Duration::from_secs(119));
    t.rotate(t0 + SECRET_ROTATION);
    // One rotation: the cookie is the previous secret's, still good.
    let mut once = answer;
    assert_eq!(t.handle(t0, a, &mut once), Verdict::Reply);
    t.rotate(t0 + 2 * SECRET_ROTATION);
    let mut twice = answer;
    assert_eq!(t.handle(t0, a, &mut twice), Verdict::Drop(Drop::BadCookie));
}

#[test]
fn unbound_sessions_expire_after_the_bind_lifetime_bound_ones_when_idle() {
    let t0 = Instant::now();
    let (mut t, al, a, b) = bound_pair(t0);
    let ip = IP.parse().unwrap();
    let lonely = t.allocate(&key(3), &key(4), ip, t0).unwrap();
    assert_eq!(t.expire(t0 + Duration::from_millis(29_999)), 0);
    assert_eq!(t.expire(t0 + Duration::from_secs(30)), 1);
    assert_eq!(t.counters().freed_bind_timeout, 1);
    let mut d = data(lonely.vni, b"x");
    assert_eq!(t.handle(t0, a, &mut d), Verdict::Drop(Drop::UnknownVni));
    // Traffic at 50 s keeps the bound one until 110 s.
    let mut d = data(al.vni, b"x");
    assert_eq!(
        t.handle(t0 + Duration::from_secs(50), a, &mut d),
        Verdict::Forward(b)
    );
    assert_eq!(t.expire(t0 + Duration::from_secs(109)), 0);
    assert_eq!(t.expire(t0 + Duration::from_secs(110)), 1);
    assert_eq!(t.counters().freed_idle, 1);
    assert!(t.is_empty());
    assert_eq!(t.sessions_of(&key(1)), 0);
    // The pair gets a new session (a new VNI, new tokens).
    let again = t.allocate(&key(2), &key(1), ip, t0).unwrap();
    assert!(!again.existing);
    assert_eq!(again.slot, 0);
}

#[test]
fn a_session_bound_twice_from_one_socket_sends_nothing_back() {
    let now = Instant::now();
    let (mut t, al) = one_session(now);
    let a = addr("198.51.100.1:1000");
    let mut ba = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 1, now);
    let mut bb = Binder::new(&offer(&al, 1, key(1)), addr(RELAY), 1, now);
    bind(&mut t, &mut ba, a, now);
    bind(&mut t, &mut bb, a, now);
    let mut d = data(al.vni, b"x");
    assert_eq!(t.handle(now, a, &mut d), Verdict::Drop(Drop::WrongSource));
}

/// Handles the datagrams of one train (one source) as the shard does.
fn train(
    t: &mut SessionTable,
    from: SocketAddr,
    now: Instant,
    msgs: &mut [Vec<u8>],
) -> Vec<Verdict> {
    let mut train = Train::default();
    msgs.iter_mut()
        .map(|m| t.handle_in_train(now, from, m, &mut train))
        .collect()
}

#[test]
fn a_train_is_checked_datagram_by_datagram() {
    let now = Instant::now();
    let (mut t, al, a, b) = bound_pair(now);
    // A second session, of keys 1 and 3, bound from the same socket `a`.
    let al2 = t
        .allocate(&key(1), &key(3), IP.parse().unwrap(), now)
        .unwrap();
    let c = addr("198.51.100.3:3000");
    let mut b1 = Binder::new(&offer(&al2, 0, key(3)), addr(RELAY), 1, now);
    let mut b3 = Binder::new(&offer(&al2, 1, key(1)), addr(RELAY), 1, now);
    bind(&mut t, &mut b1, a, now);
    bind(&mut t, &mut b3, c, now);
    let before = *t.counters();

    let mut bad = data(al.vni, b"x");
    bad[0] = 0x80;
    let mut msgs = [
        data(al.vni, b"1"),
        data(al.vni, b"2"),
        bad,
        data(al.vni, b"3"),
        data(al2.vni, b"4"),
        data(al.vni ^ 0x5a5a, b"5"),
        data(al.vni, b"6"),
    ];
    assert_eq!(
        train(&mut t, a, now, &mut msgs),
        [
            Verdict::Forward(b),
            Verdict::Forward(b),
            Verdict::Drop(Drop::BadHeader),
            Verdict::Forward(b),
            Verdict::Forward(c),
            Verdict::Drop(Drop::UnknownVni),
            Verdict::Forward(b),
        ]
    );
    let after = *t.counters();
    assert_eq!(after.forwarded_packets - before.forwarded_packets, 5);
    assert_eq!(after.forwarded_bytes - before.forwarded_bytes, 5 * 9);
    assert_eq!(after.dropped(Drop::BadHeader), 1);
    assert_eq!(after.dropped(Drop::UnknownVni), 1);
    // From a stranger, every datagram of a train is refused.
    let mut msgs = [data(al.vni, b"1"), data(al.vni, b"2")];
    assert_eq!(
        train(&mut t, addr("198.51.100.9:9"), now, &mut msgs),
        [Verdict::Drop(Drop::WrongSource); 2]
    );
}

#[test]
fn a_bind_inside_a_train_is_seen_by_the_datagrams_after_it() {
    let now = Instant::now();
    let (mut t, al, a, b) = bound_pair(now);
    // `a` binds B's slot too (a newer generation), in the middle of a
    // train of data from `a`: after it, both slots are `a`, and data from
    // `a` must not be sent back to it.
    let mut b2 = Binder::new(&offer(&al, 1, key(1)), addr(RELAY), 2, now);
    let answer = answer_of(&mut t, &mut b2, a, now).to_vec();
    let mut msgs = [data(al.vni, b"1"), answer, data(al.vni, b"2")];
    assert_eq!(
        train(&mut t, a, now, &mut msgs),
        [
            Verdict::Forward(b),
            Verdict::Reply,
            Verdict::Drop(Drop::WrongSource)
        ]
    );
}

/// Asking again for a session answers the asker at most once per answer
/// interval on one connection (at once on a new one); the peer hears of
/// the session once per connection of its own.
#[test]
fn repeats_are_answered_once_per_interval_and_the_peer_once_per_connection() {
    let t0 = Instant::now();
    let mut t = table(t0);
    let ip: IpAddr = IP.parse().unwrap();
    let ms = Duration::from_millis;
    let told = |a: &Allocation| (a.tell_asker, a.tell_peer);
    let (k1, k2) = (key(1), key(2));
    let first = t.allocate_on(&k1, &k2, ip, [10, 20], t0).unwrap();
    assert_eq!(told(&first), (true, true));
    let again = t.allocate_on(&k1, &k2, ip, [10, 20], t0 + ms(999)).unwrap();
    assert_eq!(told(&again), (false, false), "a repeat within the interval");
    assert_eq!(t.counters().repeats_unanswered, 1);
    let later = t
        .allocate_on(&k1, &k2, ip, [10, 20], t0 + ms(1000))
        .unwrap();
    assert_eq!(told(&later), (true, false), "the interval passed");
    let moved = t
        .allocate_on(&k1, &k2, ip, [11, 20], t0 + ms(1001))
        .unwrap();
    assert_eq!(told(&moved), (true, false), "the asker's new connection");
    // The peer asks: answered, although it heard of it as the peer.
    let peer = t
        .allocate_on(&k2, &k1, ip, [20, 11], t0 + ms(1002))
        .unwrap();
    assert_eq!((told(&peer), peer.slot), ((true, false), 1));
    // The peer comes back on a new connection: the next ask tells it, once.
    let back = t
        .allocate_on(&k1, &k2, ip, [11, 21], t0 + ms(3000))
        .unwrap();
    assert_eq!(told(&back), (true, true));
    let same = t
        .allocate_on(&k1, &k2, ip, [11, 21], t0 + ms(5000))
        .unwrap();
    assert_eq!(told(&same), (true, false));
    assert_eq!(t.counters().repeats_unanswered, 1);
    assert_eq!(t.len(), 1);
}

/// Evictions are counted, and a key never ends up in more sessions than
/// its limit.
#[test]
fn evictions_are_counted_and_keep_every_key_within_its_limit() {
    let t0 = Instant::now();
    let limits = Limits {
        per_key: 2,
        ..Limits::default()
    };
    let mut t = SessionTable::with_seed(limits, 3, t0);
    let ip = |b: u8| IpAddr::from([192, 0, 2, b]);
    let v = key(9);
    t.allocate(&key(1), &v, ip(1), t0).unwrap();
    t.allocate(&key(2), &v, ip(2), t0 + Duration::from_millis(1))
        .unwrap();
    // A third stranger: the oldest stranger's session gives way.
    t.allocate(&key(3), &v, ip(3), t0 + Duration::from_millis(2))
        .unwrap();
    assert_eq!((t.sessions_of(&v), t.taken_part(&v)), (2, 0));
    assert_eq!(t.counters().evicted, 1);
    assert!(!t.allocate(&key(1), &v, ip(1), t0).unwrap().existing);
    assert_eq!(t.counters().evicted, 2);
    assert_eq!(t.len(), 2);
    // The victim's own: two, then refused (it took part in both).
    t.allocate(&v, &key(4), ip(9), t0).unwrap();
    t.allocate(&v, &key(5), ip(9), t0).unwrap();
    assert_eq!((t.sessions_of(&v), t.taken_part(&v)), (2, 2));
    assert_eq!(t.allocate(&v, &key(6), ip(9), t0), Err(RefuseReason::Limit));
    assert_eq!(t.counters().evicted, 4);
}

/// The per-IP limit counts an IPv6 /64 as one source (a host with a /64
/// has as many addresses as it likes), and an IPv4-mapped address as
/// its IPv4 one.
#[test]
fn the_per_ip_limit_counts_an_ipv6_64_as_one_source() {
    let t0 = Instant::now();
    let limits = Limits {
        per_ip: 2,
        ..Limits::default()
    };
    let mut t = SessionTable::with_seed(limits, 4, t0);
    let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
    t.allocate(&key(1), &key(2), v6("2001:db8:1:2::1"), t0)
        .unwrap();
    t.allocate(&key(3), &key(4), v6("2001:db8:1:2:ffff::9"), t0)
        .unwrap();
    assert_eq!(
        t.allocate(&key(5), &key(6), v6("2001:db8:1:2:abcd::1"), t0),
        Err(RefuseReason::Limit)
    );
    t.allocate(&key(5), &key(6), v6("2001:db8:1:3::1"), t0)
        .unwrap();
    t.allocate(&key(7), &key(8), v6("::ffff:192.0.2.1"), t0)
        .unwrap();
    t.allocate(&key(9), &key(10), v6("192.0.2.1"), t0).unwrap();
    assert_eq!(
        t.allocate(&key(11), &key(12), v6("192.0.2.1"), t0),
        Err(RefuseReason::Limit)
    );
}

/// An answer whose session is freed between the table's two looks (the
/// shards check its proof in between, without the lock) binds nothing.
#[test]
fn an_answer_proven_for_a_session_freed_meanwhile_binds_nothing() {
    let t0 = Instant::now();
    let (mut t, al) = one_session(t0);
    let from = addr("198.51.100.1:1000");
    let mut b = Binder::new(&offer(&al, 0, key(2)), addr(RELAY), 1, t0);
    let answer = answer_of(&mut t, &mut b, from, t0);
    let c = Checked::new(&t.secrets(), from, &answer).unwrap();
    let token = t.look_up(&c).unwrap().expect("an answer gets the token");
    assert!(c.proven(&token));
    t.expire(t0 + Duration::from_secs(30));
    assert_eq!(t.bind_proven(t0, &c, &token), Err(Drop::UnknownVni));
    assert_eq!(t.counters().binds, 0);
}

/// Sessions with a key behind one mesh link are capped per link: past
/// the cap that link's are refused (and counted), another link's and
/// local pairs' are not, and a freed session makes room again.
#[test]
fn sessions_behind_one_mesh_link_are_capped_per_link() {
    let t0 = Instant::now();
    let limits = Limits {
        per_link: 2,
        ..Limits::default()
    };
    let mut t = SessionTable::with_seed(limits, 4, t0);
    let ip = |b: u8| IpAddr::from([192, 0, 2, b]);
    let ask = |t: &mut SessionTable, a: u8, link: Option<u16>| {
        let via = link.map(|link| Via {
            link,
            key: key(a + 100),
        });
        t.allocate_via(&key(a), &key(a + 100), ip(a), [0, 0], via, t0)
    };
    assert!(ask(&mut t, 1, Some(3)).is_ok());
    assert!(ask(&mut t, 2, Some(3)).is_ok());
    assert_eq!(ask(&mut t, 3, Some(3)), Err(RefuseReason::Limit));
    assert_eq!(t.counters().refused_link, 1);
    assert!(ask(&mut t, 1, Some(3)).unwrap().existing, "its own again");
    assert!(ask(&mut t, 4, Some(4)).is_ok(), "another link");
    assert!(ask(&mut t, 5, None).is_ok(), "a local pair");
    assert_eq!((t.via_link(3), t.via_link(4), t.len()), (2, 1, 4));
    // Unbound past the bind lifetime: freed, and the link has room.
    t.expire(t0 + limits.bind_lifetime);
    assert_eq!((t.via_link(3), t.len()), (0, 0));
    assert!(ask(&mut t, 3, Some(3)).is_ok());
}

/// A mesh link going down frees the sessions whose key behind it has
/// not bound its slot (their local keys returned), never one it bound;
/// an end or decline frees a session only for the key behind the
/// sender's link, a decline only while that key has not bound.
#[test]
fn sessions_behind_a_link_are_freed_by_what_happens_on_it() {
    let t0 = Instant::now();
    let mut t = table(t0);
    let ip: IpAddr = IP.parse().unwrap();
    let via = |link, k| Some(Via { link, key: key(k) });
    // 1 local, 2 behind link 5 (unbound); 3 local, 4 behind link 5
    // (bound); 6 local, 7 behind link 6.
    t.allocate_via(&key(1), &key(2), ip, [0, 0], via(5, 2), t0)
        .unwrap();
    let bound = t
        .allocate_via(&key(3), &key(4), ip, [0, 0], via(5, 4), t0)
        .unwrap();
    let mut b = Binder::new(&offer(&bound, 1, key(3)), addr(RELAY), 1, t0);
    bind(&mut t, &mut b, addr("198.51.100.4:4000"), t0);
    assert!(b.is_bound());
    let other = t
        .allocate_via(&key(6), &key(7), ip, [0, 0], via(6, 7), t0)
        .unwrap();

    let gone = t.link_down(5);
    assert_eq!(gone.len(), 1);
    assert_eq!((gone[0].local, gone[0].remote), (key(1), key(2)));
    assert_eq!((t.len(), t.via_link(5), t.counters().freed_mesh), (2, 1, 1));

    // Only link 6's key, on link 6, ends link 6's session.
    let v = |link, k| Via { link, key: key(k) };
    assert_eq!(t.end_remote(other.vni, v(5, 7), true), None);
    assert_eq!(t.end_remote(other.vni, v(6, 6), true), None);
    // A decline does not free a session its key bound; an end does.
    assert_eq!(t.end_remote(bound.vni, v(5, 4), false), None);
    assert!(t.end_remote(bound.vni, v(5, 4), true).is_some());
    assert!(t.end_remote(other.vni, v(6, 7), false).is_some());
    assert_eq!((t.len(), t.counters().freed_mesh), (0, 3));
}
