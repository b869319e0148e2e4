//! The table in simulated time: allocation, binds, forwarding, lifetimes.

use super::*;
use crate::session::SECRET_ROTATION;
use ferry_proto::disco::{self, BindBody, Message};
use ferry_proto::udp_header::Protocol;

fn t0() -> Instant {
    Instant::now()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn relay_addrs() -> Vec<SocketAddr> {
    vec![addr("192.0.2.10:40000"), addr("[2001:db8::10]:40000")]
}

struct Client {
    key: DiscoPrivate,
}

impl Client {
    fn new(b: u8) -> Client {
        Client {
            key: DiscoPrivate::from_bytes([b; 32]),
        }
    }

    fn public(&self) -> DiscoPublic {
        self.key.public()
    }

    /// A control datagram with `msg` sealed to the relay.
    fn control(&self, table: &PeerRelayTable, vni: u32, msg: &Message) -> Vec<u8> {
        let mut d = Vec::new();
        let key = self.key.shared(&table.server_disco());
        pr::put_control(&mut d, vni, &key, &self.public(), &[7; 24], msg);
        d
    }

    fn body(&self, vni: u32, generation: u32, remote: &Client) -> BindBody {
        BindBody {
            vni,
            generation,
            remote_key: remote.public(),
            challenge: [0; 32],
        }
    }

    /// Sends a bind from `from` and returns the challenge's body.
    fn challenge(
        &self,
        table: &mut PeerRelayTable,
        now: Instant,
        vni: u32,
        generation: u32,
        remote: &Client,
        from: SocketAddr,
    ) -> BindBody {
        let mut d = self.control(
            table,
            vni,
            &Message::Bind(self.body(vni, generation, remote)),
        );
        let Verdict::Reply(n) = table.handle(now, from, &mut d) else {
            panic!("bind not challenged");
        };
        assert_eq!(n, 160);
        assert_eq!(d.len(), 160, "the reply is no larger than the bind");
        let key = self.key.shared(&table.server_disco());
        match disco::open(&key, &d[8..n]).unwrap() {
            Message::BindChallenge(b) => b,
            m => panic!("{m:?}"),
        }
    }

    fn answer(
        &self,
        table: &mut PeerRelayTable,
        now: Instant,
        challenge: BindBody,
        from: SocketAddr,
    ) -> Verdict {
        let mut d = self.control(table, challenge.vni, &Message::BindAnswer(challenge));
        table.handle(now, from, &mut d)
    }

    fn bind(
        &self,
        table: &mut PeerRelayTable,
        now: Instant,
        vni: u32,
        generation: u32,
        remote: &Client,
        from: SocketAddr,
    ) {
        let c = self.challenge(table, now, vni, generation, remote, from);
        assert_eq!(self.answer(table, now, c, from), Verdict::Bound);
    }
}

fn data(vni: u32) -> Vec<u8> {
    let mut d = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
    d.extend_from_slice(&[4, 0, 0, 0, 1, 2, 3]);
    d
}

fn table(now: Instant) -> PeerRelayTable {
    PeerRelayTable::with_seed(
        DiscoPrivate::from_bytes([0x41; 32]),
        Limits::default(),
        1,
        1000,
        now,
    )
}

fn requester(b: u8) -> NodePublic {
    NodePublic([b; 32])
}

fn allocate(t: &mut PeerRelayTable, a: &Client, b: &Client, now: Instant) -> u32 {
    let req = AllocateRequest {
        client_disco: [a.public(), b.public()],
        generation: 1,
    };
    t.allocate(&requester(1), &req, &relay_addrs(), now)
        .unwrap()
        .response
        .endpoint
        .vni
}

/// Allocates and binds both sides: a from 192.0.2.1:1, b from
/// 192.0.2.2:2.
fn open_endpoint(t: &mut PeerRelayTable, a: &Client, b: &Client, now: Instant) -> u32 {
    let vni = allocate(t, a, b, now);
    a.bind(t, now, vni, 1, b, addr("192.0.2.1:1"));
    b.bind(t, now, vni, 1, a, addr("192.0.2.2:2"));
    vni
}

#[test]
fn a_pair_gets_one_endpoint() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let req = AllocateRequest {
        client_disco: [b.public(), a.public()],
        generation: 77,
    };
    let first = t
        .allocate(&requester(1), &req, &relay_addrs(), now)
        .unwrap();
    assert!(!first.existing);
    let r = &first.response;
    assert_eq!(r.generation, 77);
    let e = &r.endpoint;
    assert_eq!(e.server_disco, t.server_disco());
    let mut pair = [a.public(), b.public()];
    pair.sort();
    assert_eq!(e.client_disco, pair);
    assert!((1..=udp_header::MAX_VNI).contains(&e.vni));
    assert_eq!(e.lamport_id, 1001);
    assert_eq!(e.bind_lifetime, Duration::from_secs(30));
    assert_eq!(e.steady_state_lifetime, Duration::from_secs(300));
    assert_eq!(e.endpoints, relay_addrs());
    // The other order, another requester, newer addresses: the same
    // endpoint with the current addresses and this request's generation.
    let again = AllocateRequest {
        client_disco: [a.public(), b.public()],
        generation: 78,
    };
    let newer = vec![addr("198.51.100.1:40000")];
    let second = t.allocate(&requester(2), &again, &newer, now).unwrap();
    assert!(second.existing);
    assert_eq!(second.response.generation, 78);
    assert_eq!(second.response.endpoint.vni, e.vni);
    assert_eq!(second.response.endpoint.lamport_id, e.lamport_id);
    assert_eq!(second.response.endpoint.endpoints, newer);
    assert_eq!(t.len(), 1);
    // Another pair: a new VNI and the next Lamport id.
    let c = Client::new(3);
    let other = AllocateRequest {
        client_disco: [a.public(), c.public()],
        generation: 1,
    };
    let third = t
        .allocate(&requester(1), &other, &relay_addrs(), now)
        .unwrap();
    assert_ne!(third.response.endpoint.vni, e.vni);
    assert_eq!(third.response.endpoint.lamport_id, 1002);
    assert_eq!(t.counters().allocated, 2);
    assert_eq!(t.counters().existing, 1);
}

#[test]
fn refusals() {
    let now = t0();
    let mut t = table(now);
    let a = Client::new(1);
    let req = |x: DiscoPublic, y: DiscoPublic| AllocateRequest {
        client_disco: [x, y],
        generation: 1,
    };
    let server = t.server_disco();
    let r = requester(1);
    assert_eq!(
        t.allocate(&r, &req(a.public(), server), &relay_addrs(), now),
        Err(Refusal::ServerDisco)
    );
    assert_eq!(
        t.allocate(&r, &req(a.public(), a.public()), &relay_addrs(), now),
        Err(Refusal::SamePair)
    );
    assert_eq!(
        t.allocate(&r, &req(a.public(), Client::new(2).public()), &[], now),
        Err(Refusal::NotReady)
    );
    assert!(t.is_empty());
    assert_eq!(t.counters().refused, 3);
}

#[test]
fn binds_then_forwards_both_ways() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = allocate(&mut t, &a, &b, now);
    let (pa, pb) = (addr("192.0.2.1:1"), addr("192.0.2.2:2"));
    // Before both are bound, data (a disco ping through the relay, say)
    // is dropped.
    a.bind(&mut t, now, vni, 1, &b, pa);
    assert_eq!(
        t.states(),
        States {
            connecting: 1,
            open: 0
        }
    );
    assert_eq!(
        t.handle(now, pa, &mut data(vni)),
        Verdict::Drop(Drop::Unbound)
    );
    b.bind(&mut t, now, vni, 1, &a, pb);
    assert_eq!(
        t.states(),
        States {
            connecting: 0,
            open: 1
        }
    );
    assert_eq!(t.handle(now, pa, &mut data(vni)), Verdict::Forward(pb));
    assert_eq!(t.handle(now, pb, &mut data(vni)), Verdict::Forward(pa));
    // The IPv4-mapped form of a bound address is that address.
    let mapped = addr("[::ffff:192.0.2.1]:1");
    assert_eq!(t.handle(now, mapped, &mut data(vni)), Verdict::Forward(pb));
    // Disco-protocol data (control bit clear) is forwarded too.
    let mut ping = Header::data(Protocol::Control, vni).to_bytes().to_vec();
    ping.extend_from_slice(&[0; 40]);
    assert_eq!(t.handle(now, pb, &mut ping), Verdict::Forward(pa));
    assert_eq!(
        t.handle(now, addr("192.0.2.3:3"), &mut data(vni)),
        Verdict::Drop(Drop::WrongSource)
    );
    assert_eq!(
        t.handle(now, pa, &mut data(vni ^ 1)),
        Verdict::Drop(Drop::UnknownVni)
    );
    assert_eq!(t.counters().forwarded_packets, 4);
    assert_eq!(t.counters().binds, 2);
    assert_eq!(t.counters().challenges, 2);
}

#[test]
fn not_bound_on_both_sides_in_30_seconds_is_freed() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = allocate(&mut t, &a, &b, now);
    a.bind(&mut t, now, vni, 1, &b, addr("192.0.2.1:1"));
    assert_eq!(t.expire(now + Duration::from_secs(29)), 0);
    assert_eq!(t.expire(now + Duration::from_secs(30)), 1);
    assert!(t.is_empty());
    assert_eq!(t.counters().freed_bind_timeout, 1);
    // The pair gets a new endpoint afterwards.
    let again = allocate(&mut t, &a, &b, now + Duration::from_secs(31));
    assert_eq!(t.len(), 1);
    let _ = again;
}

#[test]
fn either_side_silent_for_5_minutes_frees_a_bound_endpoint() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = open_endpoint(&mut t, &a, &b, now);
    let pa = addr("192.0.2.1:1");
    // a keeps sending every minute; b never does.
    for m in 1..=4 {
        let at = now + Duration::from_secs(60 * m);
        assert!(matches!(
            t.handle(at, pa, &mut data(vni)),
            Verdict::Forward(_)
        ));
        assert_eq!(t.expire(at), 0);
    }
    assert_eq!(t.expire(now + Duration::from_secs(299)), 0);
    assert_eq!(
        t.expire(now + Duration::from_secs(300)),
        1,
        "b has been silent"
    );
    assert_eq!(t.counters().freed_idle, 1);
}

#[test]
fn both_sides_talking_keep_it_open() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = open_endpoint(&mut t, &a, &b, now);
    for m in 1..=10 {
        let at = now + Duration::from_secs(60 * m);
        t.handle(at, addr("192.0.2.1:1"), &mut data(vni));
        t.handle(at, addr("192.0.2.2:2"), &mut data(vni));
        assert_eq!(t.expire(at), 0);
    }
    assert_eq!(t.len(), 1);
}

#[test]
fn a_newer_generation_rebinds_and_a_late_older_answer_does_not() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = open_endpoint(&mut t, &a, &b, now);
    let (old, new, pb) = (
        addr("192.0.2.1:1"),
        addr("203.0.113.1:5"),
        addr("192.0.2.2:2"),
    );
    // a's handshake 2 from its old address is challenged but its answer
    // is late; handshake 3 from a new address completes first.
    let late = a.challenge(&mut t, now, vni, 2, &b, old);
    a.bind(&mut t, now, vni, 3, &b, new);
    assert_eq!(t.handle(now, pb, &mut data(vni)), Verdict::Forward(new));
    assert_eq!(
        a.answer(&mut t, now, late, old),
        Verdict::Drop(Drop::StaleGeneration)
    );
    assert_eq!(t.handle(now, pb, &mut data(vni)), Verdict::Forward(new));
    // A repeated answer of the bound generation changes nothing.
    let binds = t.counters().binds;
    let c = a.challenge(&mut t, now, vni, 3, &b, new);
    assert_eq!(a.answer(&mut t, now, c, new), Verdict::Bound);
    assert_eq!(t.counters().binds, binds);
}

#[test]
fn answers_must_carry_this_sources_challenge() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = allocate(&mut t, &a, &b, now);
    let pa = addr("192.0.2.1:1");
    let c = a.challenge(&mut t, now, vni, 1, &b, pa);
    // From elsewhere (a spoofed or replayed answer).
    assert_eq!(
        a.answer(&mut t, now, c, addr("192.0.2.9:1")),
        Verdict::Drop(Drop::BadChallenge)
    );
    let forged = BindBody {
        challenge: [9; 32],
        ..c
    };
    assert_eq!(
        a.answer(&mut t, now, forged, pa),
        Verdict::Drop(Drop::BadChallenge)
    );
    // One rotation later the challenge still holds; two, it does not.
    assert!(t.rotate(now + SECRET_ROTATION));
    assert!(!t.rotate(now + SECRET_ROTATION));
    assert_eq!(a.answer(&mut t, now, c, pa), Verdict::Bound);
    let c2 = a.challenge(&mut t, now, vni, 2, &b, pa);
    t.rotate(now + 2 * SECRET_ROTATION);
    t.rotate(now + 3 * SECRET_ROTATION);
    assert_eq!(
        a.answer(&mut t, now, c2, pa),
        Verdict::Drop(Drop::BadChallenge)
    );
}

/// Replays: the exact datagram of a's answer that bound it, sent again
/// from another address (a spoofed source), and a's older answer sent
/// again after a newer one bound it elsewhere, are dropped by reason and
/// answered by nothing; the endpoint keeps forwarding to where a bound
/// last.
#[test]
fn replayed_answers_move_nothing() {
    let now = t0();
    let mut t = table(now);
    let (a, b) = (Client::new(1), Client::new(2));
    let vni = open_endpoint(&mut t, &a, &b, now);
    let (pa, pb, spoofed, moved) = (
        addr("192.0.2.1:1"),
        addr("192.0.2.2:2"),
        addr("198.51.100.7:1"),
        addr("203.0.113.1:5"),
    );
    // a's handshake 2 from pa, its answer's bytes kept as on the wire.
    let c2 = a.challenge(&mut t, now, vni, 2, &b, pa);
    let wire = a.control(&t, vni, &Message::BindAnswer(c2));
    assert_eq!(t.handle(now, pa, &mut wire.clone()), Verdict::Bound);
    let before = *t.counters();
    for _ in 0..100 {
        assert_eq!(
            t.handle(now, spoofed, &mut wire.clone()),
            Verdict::Drop(Drop::BadChallenge)
        );
    }
    assert_eq!(t.handle(now, pb, &mut data(vni)), Verdict::Forward(pa));
    // Handshake 3 from a new address; the old answer replayed from the
    // old one (where it was valid) is stale.
    a.bind(&mut t, now, vni, 3, &b, moved);
    for _ in 0..100 {
        assert_eq!(
            t.handle(now, pa, &mut wire.clone()),
            Verdict::Drop(Drop::StaleGeneration)
        );
    }
    assert_eq!(t.handle(now, pb, &mut data(vni)), Verdict::Forward(moved));
    let after = *t.counters();
    assert_eq!(
        after.dropped(Drop::BadChallenge) - before.dropped(Drop::BadChallenge),
        100
    );
    assert_eq!(
        after.dropped(Drop::StaleGeneration) - before.dropped(Drop::StaleGeneration),
        100
    );
    assert_eq!(after.binds - before.binds, 1, "only handshake 3 bound");
}

#[test]
fn bad_control_datagrams_are_dropped_by_reason() {
    let now = t0();
    let mut t = table(now);
    let (a, b, stranger) = (Client::new(1), Client::new(2), Client::new(3));
    let vni = allocate(&mut t, &a, &b, now);
    let pa = addr("192.0.2.1:1");
    let mut check = |d: &mut Vec<u8>, why: Drop| {
        assert_eq!(t.handle(now, pa, d), Verdict::Drop(why), "{why:?}");
    };
    check(&mut vec![1, 0, 0, 0], Drop::BadHeader);
    let mut short = a.control(&table(now), vni, &Message::Bind(a.body(vni, 1, &b)));
    short.truncate(100);
    check(&mut short, Drop::BadControl);
    let bind = |c: &Client, remote: &Client, vni: u32, g: u32| {
        let tt = table(now);
        c.control(&tt, vni, &Message::Bind(c.body(vni, g, remote)))
    };
    check(&mut bind(&a, &b, vni ^ 1, 1), Drop::UnknownVni);
    check(&mut bind(&stranger, &b, vni, 1), Drop::UnknownSender);
    check(&mut bind(&a, &stranger, vni, 1), Drop::WrongRemoteKey);
    check(&mut bind(&a, &b, vni, 0), Drop::ZeroGeneration);
    let mut tampered = bind(&a, &b, vni, 1);
    tampered[100] ^= 1;
    check(&mut tampered, Drop::BadBox);
    let chal = table(now);
    let mut challenge = a.control(&chal, vni, &Message::BindChallenge(a.body(vni, 1, &b)));
    check(&mut challenge, Drop::UnexpectedType);
    // Only if the other VNI exists does the sealed one get compared.
    let c = Client::new(4);
    let mut t2 = table(now);
    let v1 = allocate(&mut t2, &a, &b, now);
    let v2 = allocate(&mut t2, &a, &c, now);
    let mut wrong_vni = a.control(&t2, v2, &Message::Bind(a.body(v1, 1, &b)));
    assert_eq!(
        t2.handle(now, pa, &mut wrong_vni),
        Verdict::Drop(Drop::VniMismatch)
    );
    assert_eq!(t.len(), 1, "nothing bad input did changed the table");
    assert_eq!(t.counters().binds, 0);
    assert_eq!(t.counters().drops.iter().sum::<u64>(), 8);
}

#[test]
fn floods_stay_bounded() {
    let now = t0();
    let limits = Limits {
        per_requester: 4,
        per_disco: 2,
        total: 6,
        ..Limits::default()
    };
    let mut t = PeerRelayTable::with_seed(DiscoPrivate::from_bytes([0x41; 32]), limits, 2, 0, now);
    let clients: Vec<Client> = (1..=20).map(Client::new).collect();
    let ask = |t: &mut PeerRelayTable, r: u8, x: usize, y: usize| {
        let req = AllocateRequest {
            client_disco: [clients[x].public(), clients[y].public()],
            generation: 1,
        };
        t.allocate(&requester(r), &req, &relay_addrs(), now)
    };
    // One requester: four endpoints, then refused.
    for x in [0, 2, 4, 6] {
        ask(&mut t, 1, x, x + 1).unwrap();
    }
    assert_eq!(ask(&mut t, 1, 8, 9), Err(Refusal::RequesterLimit));
    // Client 0 may be in two endpoints, whoever asks.
    ask(&mut t, 2, 0, 10).unwrap();
    assert_eq!(ask(&mut t, 2, 0, 11), Err(Refusal::DiscoLimit));
    ask(&mut t, 3, 12, 13).unwrap();
    assert_eq!(ask(&mut t, 4, 14, 15), Err(Refusal::TotalLimit));
    assert_eq!(t.len(), 6);
    // A flood of binds from strangers and forged senders: dropped, the
    // table unchanged.
    let vni = ask(&mut t, 1, 0, 1).unwrap().response.endpoint.vni;
    for i in 0..1000u32 {
        let c = &clients[(i % 20) as usize];
        let mut d = c.control(&t, vni, &Message::Bind(c.body(vni, i + 1, &clients[1])));
        let from = SocketAddr::from(([198, 51, 100, (i % 250) as u8], 1000 + i as u16));
        t.handle(now, from, &mut d);
    }
    assert_eq!(t.len(), 6);
    assert_eq!(t.counters().binds, 0);
    // Expired endpoints give their room back.
    t.expire(now + Duration::from_secs(30));
    assert!(t.is_empty());
    ask(&mut t, 4, 14, 15).unwrap();
}

#[test]
fn revoked_requesters_lose_their_endpoints() {
    let now = t0();
    let mut t = table(now);
    let (a, b, c) = (Client::new(1), Client::new(2), Client::new(3));
    let req = |x: &Client, y: &Client| AllocateRequest {
        client_disco: [x.public(), y.public()],
        generation: 1,
    };
    t.allocate(&requester(1), &req(&a, &b), &relay_addrs(), now)
        .unwrap();
    t.allocate(&requester(2), &req(&a, &c), &relay_addrs(), now)
        .unwrap();
    assert_eq!(t.revoke(|r| *r != requester(1)), 1);
    assert_eq!(t.len(), 1);
    assert_eq!(t.counters().freed_revoked, 1);
}

/// The datagrams of one received train from one source: a run of one
/// endpoint's data is looked up once and forwarded whole; another
/// endpoint's data, a bind or a bad datagram in between ends the run, and
/// each goes where it would alone.
#[test]
fn a_train_is_looked_up_once_per_run_of_one_endpoint() {
    let now = t0();
    let mut t = table(now);
    let (a, b, c) = (Client::new(1), Client::new(2), Client::new(3));
    let (pa, pb, pc) = (
        addr("192.0.2.1:1"),
        addr("192.0.2.2:2"),
        addr("192.0.2.3:3"),
    );
    let ab = open_endpoint(&mut t, &a, &b, now);
    // a is in a second endpoint, with c, from the same socket.
    let ac = allocate(&mut t, &a, &c, now);
    a.bind(&mut t, now, ac, 1, &c, pa);
    c.bind(&mut t, now, ac, 1, &a, pc);
    let before = *t.counters();
    let mut train = Train::default();
    let mut send =
        |t: &mut PeerRelayTable, d: &mut Vec<u8>| t.handle_in_train(now, pa, d, &mut train);
    for _ in 0..16 {
        assert_eq!(send(&mut t, &mut data(ab)), Verdict::Forward(pb));
    }
    let c1 = *t.counters();
    assert_eq!(c1.lookups - before.lookups, 1, "16 datagrams, one lookup");
    assert_eq!(c1.forwarded_packets - before.forwarded_packets, 16);
    // Mixed: the other endpoint, back, a bind, data, a bad header, data.
    assert_eq!(send(&mut t, &mut data(ac)), Verdict::Forward(pc));
    assert_eq!(send(&mut t, &mut data(ac)), Verdict::Forward(pc));
    assert_eq!(send(&mut t, &mut data(ab)), Verdict::Forward(pb));
    let mut bind = a.control(&t, ab, &Message::Bind(a.body(ab, 2, &b)));
    assert!(matches!(send(&mut t, &mut bind), Verdict::Reply(160)));
    assert_eq!(send(&mut t, &mut data(ab)), Verdict::Forward(pb));
    assert_eq!(
        send(&mut t, &mut vec![0xff; 4]),
        Verdict::Drop(Drop::BadHeader)
    );
    assert_eq!(send(&mut t, &mut data(ab)), Verdict::Forward(pb));
    // Data for an unknown endpoint is never forwarded on the run's word.
    assert_eq!(
        send(&mut t, &mut data(ab ^ ac ^ 1)),
        Verdict::Drop(Drop::UnknownVni)
    );
    let c2 = *t.counters();
    assert_eq!(c2.lookups - c1.lookups, 5);
    assert_eq!(c2.forwarded_packets - c1.forwarded_packets, 5);
    // A new train starts with a lookup, even for the same endpoint.
    let mut train = Train::default();
    let mut d = data(ab);
    assert_eq!(
        t.handle_in_train(now, pb, &mut d, &mut train),
        Verdict::Forward(pa)
    );
    assert_eq!(t.counters().lookups - c2.lookups, 1);
}
