//! The peer-relay port in process on loopback: two clients allocate an
//! endpoint, bind their slots with sealed disco messages (bind, challenge,
//! answer, made by the proto code as a Tailscale client makes them) and
//! then exchange datagrams through the relay both ways.

use std::net::{SocketAddr, UdpSocket};
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

    fn send_control(&self, relay: SocketAddr, server: &DiscoPublic, vni: u32, msg: &Message) {
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
        self.sock.send_to(&d, relay).unwrap();
    }

    /// Binds its slot (bind, challenge, answer), retrying the bind until
    /// the challenge comes, within a bounded time.
    fn bind(&self, relay: SocketAddr, server: &DiscoPublic, vni: u32, remote: &DiscoPublic) {
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
        self.send_control(relay, server, vni, &Message::BindAnswer(challenge));
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
    let request = AllocateRequest {
        client_disco: [a.key.public(), b.key.public()],
        generation: 5,
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
