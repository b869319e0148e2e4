//! The peer-relay port in process on loopback: two clients allocate an
//! endpoint, bind their slots with sealed disco messages (bind, challenge,
//! answer, made by the proto code as a Tailscale client makes them) and
//! then exchange datagrams through the relay both ways.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::disco::{self, AllocateRequest, BindBody, Message, RelayEndpoint};
use ferry_proto::key::{DiscoPrivate, DiscoPublic, NodePublic};
use ferry_proto::peer_relay as pr;
use ferry_proto::udp_header::{Header, Protocol};
use ferry_testkit::wait::eventually;
use ferry_udp::config::Tuning;
use ferry_udp::peer_relay::{Limits, PeerRelays};
use ferry_udp::Relay;

mod support;

struct Client {
    key: DiscoPrivate,
    sock: UdpSocket,
}

impl Client {
    fn new() -> Client {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Client {
            key: DiscoPrivate::generate(),
            sock,
        }
    }

    /// A control datagram carrying `msg`, sealed for the relay.
    fn control(&self, server: &DiscoPublic, vni: u32, msg: &Message) -> Vec<u8> {
        let mut d = Vec::new();
        let nonce = ferry_proto::nacl::random_nonce();
        pr::put_control(
            &mut d,
            vni,
            &self.key.shared(server),
            &self.key.public(),
            &nonce,
            msg,
        );
        d
    }

    fn send_control(&self, relay: SocketAddr, server: &DiscoPublic, vni: u32, msg: &Message) {
        let d = self.control(server, vni, msg);
        self.sock.send_to(&d, relay).unwrap();
    }

    /// Binds its slot (bind, challenge, answer), retrying the bind until
    /// the challenge comes, within a bounded time.
    fn bind(&self, relay: SocketAddr, server: &DiscoPublic, vni: u32, remote: &DiscoPublic) {
        let challenge = self.challenge(relay, server, vni, remote);
        self.send_control(relay, server, vni, &Message::BindAnswer(challenge));
    }

    /// The first two steps of [`Client::bind`]: the challenge to answer.
    fn challenge(
        &self,
        relay: SocketAddr,
        server: &DiscoPublic,
        vni: u32,
        remote: &DiscoPublic,
    ) -> BindBody {
        let body = BindBody {
            vni,
            generation: 1,
            remote_key: *remote,
            challenge: [0; 32],
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let challenge = loop {
            assert!(Instant::now() < deadline, "no challenge from the relay");
            self.send_control(relay, server, vni, &Message::Bind(body));
            let mut buf = [0u8; 512];
            let Ok((n, from)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            assert_eq!(from, relay);
            assert_eq!(n, pr::CONTROL_LEN, "the challenge is as long as the bind");
            assert_eq!(Header::parse(&buf[..n]).unwrap(), Header::bind(vni));
            match disco::open(&self.key.shared(server), &buf[8..n]).unwrap() {
                Message::BindChallenge(c) => break c,
                m => panic!("not a challenge: {m:?}"),
            }
        };
        challenge
    }
}

/// The peer-relay port on one shard on loopback, with `limits`, offering
/// its own address: the relay, the table and the port's address.
fn start(limits: Limits) -> (Relay, Arc<PeerRelays>, SocketAddr) {
    let relays = Arc::new(PeerRelays::new(DiscoPrivate::generate(), limits));
    let tuning = Tuning {
        workers: 1,
        pin: false,
        ..Tuning::default()
    };
    let relay = Relay::start_peer_relay(
        "--peer-relay-port",
        "127.0.0.1:0".parse().unwrap(),
        relays.clone(),
        tuning,
    )
    .expect("the peer relay starts");
    let port = relays.bound().expect("bound");
    relays.set_addrs(vec![port]);
    (relay, relays, port)
}

/// The endpoint of `a` and `b`, as the control half allocates it.
fn allocate(relays: &PeerRelays, a: &Client, b: &Client) -> RelayEndpoint {
    allocate_for(relays, a, b, 5)
}

/// [`allocate`] with the request's `generation`.
fn allocate_for(relays: &PeerRelays, a: &Client, b: &Client, generation: u32) -> RelayEndpoint {
    let request = AllocateRequest {
        client_disco: [a.key.public(), b.key.public()],
        generation,
    };
    relays
        .allocate(&NodePublic([1; 32]), &request, Instant::now())
        .expect("allocated")
        .response
        .endpoint
}

#[test]
fn two_clients_bind_and_forward_both_ways() {
    let (relay, relays, port) = start(Limits::default());
    let (a, b) = (Client::new(), Client::new());
    let e = allocate(&relays, &a, &b);
    assert_eq!(e.endpoints, vec![port]);
    let server = e.server_disco;
    a.bind(port, &server, e.vni, &b.key.public());
    b.bind(port, &server, e.vni, &a.key.public());
    // Both answers reach the table; then data goes through both ways.
    let data = |tag: u8| {
        let mut d = Header::data(Protocol::Payload, e.vni).to_bytes().to_vec();
        d.extend_from_slice(&[4, 0, 0, 0, tag, 1, 2, 3]);
        d
    };
    let through = |from: &Client, to: &Client, tag: u8| {
        from.sock.send_to(&data(tag), port).unwrap();
        let mut buf = [0u8; 64];
        match to.sock.recv_from(&mut buf) {
            Ok((n, src)) => src == port && buf[..n] == data(tag)[..],
            Err(_) => false,
        }
    };
    assert!(
        eventually(Duration::from_secs(10), || through(&a, &b, 1)),
        "a → b through the relay"
    );
    assert!(
        eventually(Duration::from_secs(10), || through(&b, &a, 2)),
        "b → a through the relay"
    );
    let c = *relays.lock().counters();
    assert_eq!(c.binds, 2);
    assert!(c.forwarded_packets >= 2);
    assert_eq!(relays.lock().states().open, 1);
    drop(relay);
}

/// Binds from one source beyond its rate are dropped before any crypto
/// and counted: a flood gets at most its burst of challenges.
#[test]
fn a_bind_flood_from_one_source_is_limited() {
    let limits = Limits {
        bind_rate: 1,
        bind_burst: 5,
        ..Limits::default()
    };
    let (_relay, relays, port) = start(limits);
    let (a, b) = (Client::new(), Client::new());
    let e = allocate(&relays, &a, &b);
    let body = BindBody {
        vni: e.vni,
        generation: 1,
        remote_key: b.key.public(),
        challenge: [0; 32],
    };
    for _ in 0..200 {
        a.send_control(port, &e.server_disco, e.vni, &Message::Bind(body));
    }
    let limited = || {
        relays
            .lock()
            .counters()
            .dropped(ferry_udp::peer_relay::Drop::RateLimited)
    };
    let challenged = || relays.lock().counters().challenges;
    assert!(
        eventually(Duration::from_secs(10), || limited() + challenged() >= 200),
        "not all binds were judged"
    );
    assert!(challenged() <= 6, "{} challenges", challenged());
    assert!(limited() >= 194, "{} rate-limited", limited());
}

/// `count` datagrams of `segment` bytes for endpoint `vni`, each marked
/// with `tag` and its index: one GSO train's bytes.
fn train(vni: u32, tag: u8, count: usize, segment: usize) -> Vec<u8> {
    let mut t = Vec::new();
    for i in 0..count {
        t.extend_from_slice(&Header::data(Protocol::Payload, vni).to_bytes());
        t.extend_from_slice(&[4, 0, 0, 0, tag, i as u8]);
        t.resize((i + 1) * segment, tag);
    }
    t
}

/// Receives `n` datagrams on `at` within a bounded time.
fn receive(at: &Client, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while got.len() < n && Instant::now() < deadline {
        if let Ok((len, _)) = at.sock.recv_from(&mut buf) {
            got.push(buf[..len].to_vec());
        }
    }
    got
}

/// A GRO train of one client's data for one endpoint is looked up once
/// and leaves as one GSO message, every datagram intact; a train whose
/// datagrams alternate between two endpoints of the same client (one
/// socket, as Tailscale's) is looked up once per run and each datagram
/// reaches its own peer.
#[test]
fn a_train_is_forwarded_with_one_lookup_per_endpoint_run() {
    const SEGMENTS: usize = 8;
    const SEGMENT: usize = 400;
    let (relay, relays, port) = start(Limits::default());
    let offloads = ferry_sys::gso::probe(relays_socket_probe().as_fd());
    if !(offloads.gro && offloads.gso) {
        return ferry_testkit::skip!("this kernel lacks UDP GRO or GSO ({offloads:?})");
    }
    let (a, b, c) = (Client::new(), Client::new(), Client::new());
    let ab = allocate_for(&relays, &a, &b, 5);
    let ac = allocate_for(&relays, &a, &c, 6);
    for (e, x, y) in [(&ab, &a, &b), (&ab, &b, &a), (&ac, &a, &c), (&ac, &c, &a)] {
        x.bind(port, &e.server_disco, e.vni, &y.key.public());
    }
    assert!(
        eventually(Duration::from_secs(10), || relays.lock().states().open == 2),
        "both endpoints open"
    );
    let m = relay.metrics().clone();
    let counters = || *relays.lock().counters();
    let gso = || m.sum(|s| s.gso_messages.get());
    // One endpoint: one lookup, one GSO message per train.
    for round in 0..4u8 {
        let (before, gso_before) = (counters(), gso());
        let t = train(ab.vni, round, SEGMENTS, SEGMENT);
        support::send_gso_train(&a.sock, port, &t, SEGMENT as u16);
        let got = receive(&b, SEGMENTS);
        assert_eq!(
            got.len(),
            SEGMENTS,
            "round {round}: the whole train arrived"
        );
        for (i, d) in got.iter().enumerate() {
            assert_eq!(
                d[..],
                t[i * SEGMENT..(i + 1) * SEGMENT],
                "datagram {i} intact"
            );
        }
        let after = counters();
        assert_eq!(
            after.forwarded_packets - before.forwarded_packets,
            SEGMENTS as u64
        );
        assert_eq!(
            after.lookups - before.lookups,
            1,
            "round {round}: one lookup"
        );
        // The shard counts its send after the datagrams left.
        assert!(
            eventually(Duration::from_secs(10), || gso() > gso_before),
            "round {round}: no GSO send counted"
        );
        assert_eq!(gso() - gso_before, 1, "round {round}: one GSO send");
    }
    // Two endpoints: runs ab ab | ac | ab ab ab | ac ac.
    let order = [
        ab.vni, ab.vni, ac.vni, ab.vni, ab.vni, ab.vni, ac.vni, ac.vni,
    ];
    let mut t = Vec::new();
    for (i, &vni) in order.iter().enumerate() {
        t.extend_from_slice(&train(vni, 9, 1, SEGMENT));
        t[i * SEGMENT + 13] = i as u8;
    }
    let before = counters();
    support::send_gso_train(&a.sock, port, &t, SEGMENT as u16);
    let (to_b, to_c) = (receive(&b, 5), receive(&c, 3));
    let want = |vni: u32| {
        order
            .iter()
            .enumerate()
            .filter(|(_, &v)| v == vni)
            .map(|(i, _)| t[i * SEGMENT..(i + 1) * SEGMENT].to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(to_b, want(ab.vni), "b has its five, in order");
    assert_eq!(to_c, want(ac.vni), "c has its three, in order");
    assert_eq!(counters().lookups - before.lookups, 4, "one lookup per run");
    relay.shutdown();
}

/// A socket to probe the kernel's UDP offloads with.
fn relays_socket_probe() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").unwrap()
}

/// A flood of binds that never open (sealed by someone without the
/// client's key) on one endpoint does not hold up another endpoint's
/// data: after every burst of 64, a datagram through the other endpoint
/// still arrives, and every forged bind is counted, none challenged.
#[test]
fn a_bind_flood_does_not_hold_up_other_endpoints() {
    let limits = Limits {
        bind_rate: 1_000_000,
        bind_burst: 1_000_000,
        ..Limits::default()
    };
    let (relay, relays, port) = start(limits);
    let (a, b, c, d) = (Client::new(), Client::new(), Client::new(), Client::new());
    let ab = allocate_for(&relays, &a, &b, 5);
    let cd = allocate_for(&relays, &c, &d, 6);
    c.bind(port, &cd.server_disco, cd.vni, &d.key.public());
    d.bind(port, &cd.server_disco, cd.vni, &c.key.public());
    assert!(
        eventually(Duration::from_secs(10), || relays.lock().states().open == 1),
        "cd open"
    );
    // The flooder claims a's key but seals with its own.
    let flooder = Client::new();
    let mut forged = Vec::new();
    let body = BindBody {
        vni: ab.vni,
        generation: 1,
        remote_key: b.key.public(),
        challenge: [0; 32],
    };
    pr::put_control(
        &mut forged,
        ab.vni,
        &flooder.key.shared(&ab.server_disco),
        &a.key.public(),
        &ferry_proto::nacl::random_nonce(),
        &Message::Bind(body),
    );
    const ROUNDS: u64 = 50;
    const BURST: u64 = 64;
    for round in 0..ROUNDS {
        for _ in 0..BURST {
            flooder.sock.send_to(&forged, port).unwrap();
        }
        let t = train(cd.vni, round as u8, 1, 64);
        c.sock.send_to(&t, port).unwrap();
        assert_eq!(
            receive(&d, 1),
            vec![t],
            "round {round}: c → d through the relay"
        );
    }
    let bad = || {
        relays
            .lock()
            .counters()
            .dropped(ferry_udp::peer_relay::Drop::BadBox)
    };
    assert!(
        eventually(Duration::from_secs(10), || bad() == ROUNDS * BURST),
        "{} of {} forged binds counted",
        bad(),
        ROUNDS * BURST
    );
    assert_eq!(relays.lock().counters().challenges, 2, "only cd's binds");
    relay.shutdown();
}

/// A client's answer and the data it sends right after it can arrive in
/// one receive (here one GRO train: the answer, then a shorter data
/// datagram): the answer binds first, and the data goes through.
#[test]
fn data_right_after_an_answer_in_one_receive_finds_the_side_bound() {
    let (relay, relays, port) = start(Limits::default());
    let offloads = ferry_sys::gso::probe(relays_socket_probe().as_fd());
    if !(offloads.gro && offloads.gso) {
        return ferry_testkit::skip!("this kernel lacks UDP GRO or GSO ({offloads:?})");
    }
    let (a, b) = (Client::new(), Client::new());
    let e = allocate(&relays, &a, &b);
    let server = e.server_disco;
    b.bind(port, &server, e.vni, &a.key.public());
    assert!(
        eventually(Duration::from_secs(10), || relays.lock().counters().binds
            == 1),
        "b bound"
    );
    let challenge = a.challenge(port, &server, e.vni, &b.key.public());
    let answer = a.control(&server, e.vni, &Message::BindAnswer(challenge));
    let mut data = Header::data(Protocol::Payload, e.vni).to_bytes().to_vec();
    data.extend_from_slice(&[4, 0, 0, 0, 7, 1, 2, 3]);
    assert!(data.len() < answer.len());
    let mut t = answer.clone();
    t.extend_from_slice(&data);
    support::send_gso_train(&a.sock, port, &t, answer.len() as u16);
    let got = receive(&b, 1);
    assert_eq!(got, vec![data], "the data after the answer reached b");
    let c = *relays.lock().counters();
    assert_eq!(c.binds, 2);
    assert_eq!(c.forwarded_packets, 1);
    relay.shutdown();
}
