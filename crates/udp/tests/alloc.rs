//! "No per-packet allocation": once a bounce session, a hub session, a
//! relay session or a peer-relay endpoint is set up, relaying more
//! datagrams (and, for the last two, answering repeated bind messages)
//! must not allocate at all. A counting
//! global allocator (from ferry-sys, where unsafe code lives) watches every
//! thread of this test process, the relay's shards included, while traffic
//! flows; the test's own sockets use pre-allocated buffers. Counting starts
//! right after the warm-up's last datagram came back: no pause to let the
//! relay "settle", since nothing it does in a steady state may allocate.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use ferry_proto::wireguard::{self as wg, Mac1Key, PublicKey};
use ferry_udp::config::{Bounce, Config, Hub, Listen, Tuning};
use ferry_udp::Relay;

#[global_allocator]
static GLOBAL: ferry_sys::alloc_count::Counting = ferry_sys::alloc_count::Counting;

fn tuning() -> Tuning {
    Tuning {
        workers: 2,
        pin: false,
        recv_buffer: 4 << 20,
        send_buffer: 4 << 20,
        ..Tuning::default()
    }
}

fn socket() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s
}

/// Sends `msg` from `from` to `to` through the relay and receives it on
/// `at`, `n` times, without allocating in this thread.
fn pump(
    from: &UdpSocket,
    to: SocketAddr,
    at: &UdpSocket,
    msg: &mut [u8],
    n: u64,
    counter_at: Option<usize>,
) {
    let mut buf = [0u8; 2048];
    for i in 0..n {
        if let Some(off) = counter_at {
            msg[off..off + 8].copy_from_slice(&(1000 + i).to_le_bytes());
        }
        from.send_to(msg, to).unwrap();
        let (len, _) = at.recv_from(&mut buf).expect("relayed");
        assert_eq!(len, msg.len());
    }
}

/// Both tests share the global counter: run them in one test so they
/// cannot overlap.
#[test]
fn relaying_does_not_allocate_per_packet() {
    bounce_steady_state();
    hub_steady_state();
    session_steady_state();
    peer_relay_steady_state();
}

fn bounce_steady_state() {
    let server = socket();
    let cfg = Config {
        bounce: vec![Bounce {
            listen: vec![Listen {
                addr: "127.0.0.1:0".parse().unwrap(),
                field: "--listen".into(),
            }],
            target: server.local_addr().unwrap().to_string(),
            target_field: "--target".into(),
            idle_timeout: Duration::from_secs(60),
            resolve_interval: Duration::ZERO,
            wireguard_only: true,
            max_sessions: 10,
        }],
        hub: None,
        tuning: tuning(),
        metrics_addr: None,
    };
    let relay = Relay::start(&cfg).unwrap();
    assert!(
        ferry_sys::alloc_count::allocations() > 0,
        "the counting allocator is in place"
    );
    let at = relay.bound()[0].1;
    let client = socket();
    let mut msg = vec![0u8; 1452];
    msg[0] = 4;
    // The first datagram opens the session; learn the upstream address.
    client.send_to(&msg, at).unwrap();
    let mut buf = [0u8; 2048];
    let (_, upstream) = server.recv_from(&mut buf).unwrap();
    // Warm up both directions (outboxes reach their working size).
    for _ in 0..200 {
        pump(&client, at, &server, &mut msg, 1, None);
        pump(&server, upstream, &client, &mut msg, 1, None);
    }
    let before = ferry_sys::alloc_count::allocations();
    for _ in 0..1000 {
        pump(&client, at, &server, &mut msg, 1, None);
        pump(&server, upstream, &client, &mut msg, 1, None);
    }
    let allocated = ferry_sys::alloc_count::allocations() - before;
    assert_eq!(
        allocated,
        0,
        "2000 datagrams through the bounce made {allocated} allocations (last of {} bytes)",
        ferry_sys::alloc_count::last_size()
    );
    relay.shutdown();
}

mod common;

fn hub_steady_state() {
    let keys: Vec<PublicKey> = (1..=2).map(|n| PublicKey::from_bytes([n; 32])).collect();
    let (p0, p1) = (socket(), socket());
    let cfg = Config {
        bounce: vec![],
        hub: Some(Hub {
            listen: vec![Listen {
                addr: "127.0.0.1:0".parse().unwrap(),
                field: "--listen".into(),
            }],
            // p1 has a known address, so p0's initiation goes straight to it.
            peers: common::hub_peers(&keys, Some((1, p1.local_addr().unwrap()))),
            max_indices: 1024,
        }),
        tuning: tuning(),
        metrics_addr: None,
    };
    let relay = Relay::start(&cfg).unwrap();
    let hub = relay.bound()[0].1;
    let mut init = vec![0x11u8; wg::INITIATION_LEN];
    init[..8].copy_from_slice(&[1, 0, 0, 0, 0xaa, 0, 0, 0]);
    wg::seal_mac1(&mut init, &Mac1Key::new(&keys[1]));
    pump(&p0, hub, &p1, &mut init, 1, None);
    let mut resp = vec![0x22u8; wg::RESPONSE_LEN];
    resp[..12].copy_from_slice(&[2, 0, 0, 0, 0xbb, 0, 0, 0, 0xaa, 0, 0, 0]);
    wg::seal_mac1(&mut resp, &Mac1Key::new(&keys[0]));
    pump(&p1, hub, &p0, &mut resp, 1, None);
    let mut to_p1 = vec![0u8; 1452];
    to_p1[..8].copy_from_slice(&[4, 0, 0, 0, 0xbb, 0, 0, 0]);
    let mut to_p0 = to_p1.clone();
    to_p0[4] = 0xaa;
    pump(&p0, hub, &p1, &mut to_p1, 200, Some(8));
    pump(&p1, hub, &p0, &mut to_p0, 200, Some(8));
    // What one shard learns reaches the other's replica a little later
    // (and allocates there, once): wait for both sessions and both peers'
    // endpoints in every shard before counting.
    let m = relay.metrics().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !m
        .shards
        .iter()
        .all(|s| s.hub_indices.get() == 2 && s.hub_known_peers.get() == 2)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the shards' replicas never agreed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = ferry_sys::alloc_count::allocations();
    pump(&p0, hub, &p1, &mut to_p1, 1000, Some(8));
    pump(&p1, hub, &p0, &mut to_p0, 1000, Some(8));
    let allocated = ferry_sys::alloc_count::allocations() - before;
    assert_eq!(
        allocated,
        0,
        "2000 datagrams through the hub made {allocated} allocations (last of {} bytes)",
        ferry_sys::alloc_count::last_size()
    );
    relay.shutdown();
}

/// A relay session bound on both sides: data both ways, and every tenth
/// round a repeated answer (handled apart from the data, outside the
/// table's lock) and a forged one.
fn session_steady_state() {
    use ferry_proto::key::NodePublic;
    use ferry_proto::relay_session::{BindMsg, Binder, SessionOffer};
    use ferry_udp::session::{Limits, Sessions};
    use std::sync::Arc;
    use std::time::Instant;

    // One source sends all the bind messages here: no per-source limit.
    let sessions = Arc::new(Sessions::new(Limits {
        bind_rate: 1_000_000,
        bind_burst: 1_000_000,
        ..Limits::default()
    }));
    let relay = Relay::start_sessions(
        "--relay-port",
        "127.0.0.1:0".parse().unwrap(),
        sessions.clone(),
        tuning(),
    )
    .unwrap();
    let port = sessions.bound().unwrap();
    let (ka, kb) = (NodePublic([1; 32]), NodePublic([2; 32]));
    let now = Instant::now();
    let al = sessions
        .lock()
        .allocate(&ka, &kb, "127.0.0.1".parse().unwrap(), now)
        .unwrap();
    let (a, b) = (socket(), socket());
    let mut answers = Vec::new();
    for (slot, sock, peer) in [(0u8, &a, kb), (1, &b, ka)] {
        let offer = SessionOffer {
            request_id: 0,
            vni: al.vni,
            peer,
            slot,
            token: al.tokens[usize::from(slot)],
            endpoints: vec![port],
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
        };
        let mut binder = Binder::new(&offer, port, 1, now);
        let mut buf = [0u8; 128];
        for _ in 0..2 {
            let msg = binder.poll_transmit(now).expect("a bind message due");
            sock.send_to(&msg, port).unwrap();
            let (n, _) = sock.recv_from(&mut buf).expect("a reply");
            assert!(binder.handle(now, &buf[..n]));
            if BindMsg::parse(&msg).unwrap().kind == ferry_proto::relay_session::BindKind::Answer {
                answers.push(msg);
            }
        }
        assert!(binder.is_bound(), "slot {slot} bound");
    }
    let mut forged = answers[0];
    forged[20] ^= 1;
    pair_rounds(
        "a relay session",
        [&a, &b],
        port,
        al.vni,
        [&forged, &answers[0]],
        answers[0].len(),
    );
    relay.shutdown();
}

/// A peer-relay endpoint bound on both sides: data both ways, and every
/// tenth round a repeated bind (challenged again, outside the table's
/// lock) and a forged one (dropped).
fn peer_relay_steady_state() {
    use ferry_proto::disco::{self, AllocateRequest, BindBody, Message};
    use ferry_proto::key::{DiscoPrivate, NodePublic};
    use ferry_proto::peer_relay as pr;
    use ferry_udp::peer_relay::{Limits, PeerRelays};
    use std::sync::Arc;
    use std::time::Instant;

    // One source sends all the binds here: no per-source limit.
    let relays = Arc::new(PeerRelays::new(
        DiscoPrivate::generate(),
        Limits {
            bind_rate: 1_000_000,
            bind_burst: 1_000_000,
            ..Limits::default()
        },
    ));
    let relay = Relay::start_peer_relay(
        "--peer-relay-port",
        "127.0.0.1:0".parse().unwrap(),
        relays.clone(),
        tuning(),
    )
    .unwrap();
    let port = relays.bound().unwrap();
    relays.set_addrs(vec![port]);
    let (ka, kb) = (DiscoPrivate::generate(), DiscoPrivate::generate());
    let e = relays
        .allocate(
            &NodePublic([1; 32]),
            &AllocateRequest {
                client_disco: [ka.public(), kb.public()],
                generation: 1,
            },
            Instant::now(),
        )
        .unwrap()
        .response
        .endpoint;
    let server = e.server_disco;
    let (a, b) = (socket(), socket());
    let control = |from: &DiscoPrivate, msg: &Message| {
        let mut d = Vec::new();
        let nonce = ferry_proto::nacl::random_nonce();
        pr::put_control(
            &mut d,
            e.vni,
            &from.shared(&server),
            &from.public(),
            &nonce,
            msg,
        );
        d
    };
    let mut binds = Vec::new();
    for (k, sock, remote) in [(&ka, &a, &kb), (&kb, &b, &ka)] {
        let bind = control(
            k,
            &Message::Bind(BindBody {
                vni: e.vni,
                generation: 1,
                remote_key: remote.public(),
                challenge: [0; 32],
            }),
        );
        sock.send_to(&bind, port).unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = sock.recv_from(&mut buf).expect("a challenge");
        let Message::BindChallenge(c) = disco::open(&k.shared(&server), &buf[8..n]).unwrap() else {
            panic!("not a challenge");
        };
        sock.send_to(&control(k, &Message::BindAnswer(c)), port)
            .unwrap();
        binds.push(bind);
    }
    let open = std::time::Instant::now() + Duration::from_secs(10);
    while relays.lock().states().open != 1 {
        assert!(
            std::time::Instant::now() < open,
            "the endpoint never opened"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut forged = binds[0].clone();
    forged[100] ^= 1;
    pair_rounds(
        "a peer-relay endpoint",
        [&a, &b],
        port,
        e.vni,
        [&forged, &binds[0]],
        pr::CONTROL_LEN,
    );
    let c = *relays.lock().counters();
    assert!(c.forwarded_packets >= 2400, "{c:?}");
    assert!(c.challenges >= 122, "{c:?}");
    relay.shutdown();
}

/// Data both ways between `a` and `b` through `vni` at `port`, and every
/// tenth round a forged control message and a repeated one, the repeat
/// answered with `reply_len` bytes: 200 rounds to warm up, then 1000 that
/// must not allocate.
fn pair_rounds(
    what: &str,
    [a, b]: [&UdpSocket; 2],
    port: SocketAddr,
    vni: u32,
    [forged, repeat]: [&[u8]; 2],
    reply_len: usize,
) {
    use ferry_proto::udp_header::{Header, Protocol};

    let mut to_b = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
    to_b.resize(1452, 7);
    let mut to_a = to_b.clone();
    let mut round = |i: u32| {
        pump(a, port, b, &mut to_b, 1, None);
        pump(b, port, a, &mut to_a, 1, None);
        if i.is_multiple_of(10) {
            // A repeat is answered again; a forgery is not.
            let mut buf = [0u8; 512];
            a.send_to(forged, port).unwrap();
            a.send_to(repeat, port).unwrap();
            let (n, _) = a.recv_from(&mut buf).expect("answered again");
            assert_eq!(n, reply_len);
        }
    };
    for i in 0..200 {
        round(i);
    }
    let before = ferry_sys::alloc_count::allocations();
    for i in 0..1000 {
        round(i);
    }
    let allocated = ferry_sys::alloc_count::allocations() - before;
    assert_eq!(
        allocated,
        0,
        "2000 datagrams and 200 control messages through {what} made {allocated} allocations (last of {} bytes)",
        ferry_sys::alloc_count::last_size()
    );
}
