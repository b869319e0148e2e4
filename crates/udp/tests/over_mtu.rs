//! Datagrams of every size, from 1 byte to the largest UDP payload, mixed
//! in one batch, through each mode of the UDP relay (bounce both ways, the
//! hub, relay sessions) over a path whose MTU is 1,500 bytes: a namespace
//! the test makes, whose loopback has that MTU (the host's has 65,536, on
//! which nothing is ever over the MTU). A datagram larger than a frame is
//! fragmented by the kernel when it is sent alone; in a GSO train with the
//! shorter ones after it, the kernel refuses the whole train (`EMSGSIZE`)
//! and all of them were lost. Every datagram must arrive, intact, and the
//! relay must count no send failure, full buffer or fallback.
//!
//! Needs root and `ip` (it says why it skips without them, and fails
//! under `CI=true`).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::relay_session::Binder;
use ferry_proto::udp_header::{Header, Protocol};
use ferry_proto::wireguard::PublicKey;
use ferry_testkit::netns::Netns;
use ferry_testkit::udp::{allocate_pair, mixed_sizes as sizes, send_burst};
use ferry_udp::config::{Bounce, Config, Hub, Listen, Tuning};
use ferry_udp::metrics::{Drop, Metrics};
use ferry_udp::Relay;

mod common;

use common::{data, handshake};

/// The path MTU of the test's namespace.
const MTU: u32 = 1500;
/// Loopback of one family, and the largest UDP payload over it.
#[derive(Clone, Copy, Debug)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn loopback(self) -> SocketAddr {
        match self {
            Family::V4 => "127.0.0.1:0".parse().unwrap(),
            Family::V6 => "[::1]:0".parse().unwrap(),
        }
    }

    fn max_udp(self) -> usize {
        match self {
            Family::V4 => 65_535 - 20 - 8,
            Family::V6 => 65_535 - 8,
        }
    }
}
/// Bound for what takes milliseconds.
const T: Duration = Duration::from_secs(10);
/// Rounds of [`sizes`] per direction.
const ROUNDS: usize = 4;

/// A socket on loopback of `family` with room for a whole round in its
/// buffers.
fn socket(family: Family) -> UdpSocket {
    let at = family.loopback();
    let s =
        socket2::Socket::new(socket2::Domain::for_address(at), socket2::Type::DGRAM, None).unwrap();
    s.set_recv_buffer_size(4 << 20).unwrap();
    s.set_send_buffer_size(4 << 20).unwrap();
    s.bind(&at.into()).unwrap();
    let s = UdpSocket::from(s);
    s.set_read_timeout(Some(T)).unwrap();
    s
}

/// `len` bytes after `head` that tell datagram `i` from the others.
fn datagram(head: &[u8], i: usize, len: usize) -> Vec<u8> {
    let mut d = head.to_vec();
    d.extend((0..len - head.len()).map(|j| (i * 7 + j * 13) as u8));
    d
}

/// Receives `want.len()` datagrams on `at` (bounded by [`T`] each) and
/// checks they are `want`, each once and intact, in any order.
fn receive_all(at: &UdpSocket, want: &[Vec<u8>], what: &str) {
    let mut got = Vec::with_capacity(want.len());
    let mut buf = vec![0u8; 1 << 16];
    while got.len() < want.len() {
        match at.recv_from(&mut buf) {
            Ok((n, _)) => got.push(buf[..n].to_vec()),
            Err(e) => panic!(
                "{what}: {} of {} datagrams arrived ({e}); sizes missing: {:?}",
                got.len(),
                want.len(),
                missing(want, &got)
            ),
        }
    }
    assert_eq!(missing(want, &got), Vec::<usize>::new(), "{what}");
}

/// The sizes of the datagrams of `want` that are not in `got`.
fn missing(want: &[Vec<u8>], got: &[Vec<u8>]) -> Vec<usize> {
    let mut got: Vec<&Vec<u8>> = got.iter().collect();
    let mut gone = Vec::new();
    for w in want {
        match got.iter().position(|g| *g == w) {
            Some(i) => {
                got.swap_remove(i);
            }
            None => gone.push(w.len()),
        }
    }
    gone
}

/// The relay dropped nothing on sending and never needed a fallback.
fn nothing_lost(m: &Metrics, what: &str) {
    for why in [Drop::SendFailed, Drop::SendBufferFull, Drop::Truncated] {
        assert_eq!(m.drops(why), 0, "{what}: {why:?}");
    }
    assert_eq!(
        m.sum(|s| s.gso_fallbacks.get()),
        0,
        "{what}: trains refused"
    );
    if m.info.gso {
        assert!(
            m.sum(|s| s.gso_messages.get()) > 0,
            "{what}: no train at all"
        );
    }
}

fn tuning() -> Tuning {
    Tuning {
        workers: 1,
        pin: false,
        recv_buffer: 4 << 20,
        send_buffer: 4 << 20,
        ..Tuning::default()
    }
}

fn listen(family: Family) -> Listen {
    Listen {
        addr: family.loopback(),
        field: "--listen".into(),
    }
}

/// Client → bounce → target, then the target's answers back through the
/// client's session (the relay's connected upstream socket one way, its
/// listening socket the other).
fn bounce_carries_every_size(family: Family) {
    let Some(ns) = Netns::new("udp-mtu-bounce", MTU) else {
        return;
    };
    ns.run(move || {
        let target = socket(family);
        let relay = Relay::start(&Config {
            bounce: vec![Bounce {
                listen: vec![listen(family)],
                target: target.local_addr().unwrap().to_string(),
                target_field: "--target".into(),
                idle_timeout: Duration::from_secs(60),
                resolve_interval: Duration::ZERO,
                wireguard_only: false,
                max_sessions: 10,
            }],
            hub: None,
            tuning: tuning(),
            metrics_addr: None,
        })
        .unwrap();
        let at = relay.bound()[0].1;
        let client = socket(family);
        let mut upstream = None;
        for round in 0..ROUNDS {
            let out: Vec<Vec<u8>> = sizes(1, family.max_udp())
                .into_iter()
                .enumerate()
                .map(|(i, n)| datagram(&[], round * 100 + i, n))
                .collect();
            send_burst(&client, at, &out);
            receive_all(&target, &out, "client to target");
            if upstream.is_none() {
                // The session's upstream address, as the target sees it.
                client.send_to(b"where from?", at).unwrap();
                let mut b = [0u8; 64];
                upstream = Some(target.recv_from(&mut b).unwrap().1);
            }
            send_burst(&target, upstream.unwrap(), &out);
            receive_all(&client, &out, "target to client");
        }
        nothing_lost(relay.metrics(), &format!("bounce over {family:?}"));
        relay.shutdown();
    });
}

#[test]
fn bounce_carries_every_size_both_ways_over_a_1500_byte_mtu() {
    bounce_carries_every_size(Family::V4);
}

#[test]
fn bounce_carries_every_size_both_ways_over_a_1500_byte_mtu_on_ipv6() {
    bounce_carries_every_size(Family::V6);
}

/// Two hub peers after a handshake: transport messages of every size
/// from p0 to p1.
#[test]
fn the_hub_carries_every_size_over_a_1500_byte_mtu() {
    let Some(ns) = Netns::new("udp-mtu-hub", MTU) else {
        return;
    };
    ns.run(|| {
        let keys: Vec<PublicKey> = (1..=2).map(|n| PublicKey::from_bytes([n; 32])).collect();
        let (p0, p1) = (socket(Family::V4), socket(Family::V4));
        let relay = Relay::start(&Config {
            bounce: vec![],
            hub: Some(Hub {
                listen: vec![listen(Family::V4)],
                peers: common::hub_peers(&keys, Some((1, p1.local_addr().unwrap()))),
                max_indices: 1024,
            }),
            tuning: tuning(),
            metrics_addr: None,
        })
        .unwrap();
        let hub = relay.bound()[0].1;
        let init = handshake(1, 0x100, 0, &keys[1]);
        send_burst(&p0, hub, std::slice::from_ref(&init));
        receive_all(&p1, &[init], "the initiation");
        let resp = handshake(2, 0x200, 0x100, &keys[0]);
        send_burst(&p1, hub, std::slice::from_ref(&resp));
        receive_all(&p0, &[resp], "the response");
        let min = ferry_proto::wireguard::TRANSPORT_MIN_LEN;
        for round in 0..ROUNDS {
            let out: Vec<Vec<u8>> = sizes(min, Family::V4.max_udp())
                .into_iter()
                .enumerate()
                .map(|(i, n)| {
                    let head = &data(0x200, (round * 100 + i) as u64, 16)[..16];
                    datagram(head, round * 100 + i, n)
                })
                .collect();
            send_burst(&p0, hub, &out);
            receive_all(&p1, &out, "p0 to p1 through the hub");
        }
        nothing_lost(relay.metrics(), "hub");
        relay.shutdown();
    });
}

/// Binds `b` over `sock` (bind, challenge, answer, bound).
fn bind(sock: &UdpSocket, b: &mut Binder) {
    let deadline = Instant::now() + T;
    let mut buf = [0u8; 256];
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    while !b.is_bound() {
        assert!(Instant::now() < deadline, "not bound within {T:?}");
        b.handle_timeout(Instant::now());
        while let Some(msg) = b.poll_transmit(Instant::now()) {
            sock.send_to(&msg, b.relay()).unwrap();
        }
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            b.handle(Instant::now(), &buf[..n]);
        }
    }
    sock.set_read_timeout(Some(T)).unwrap();
}

/// A relay session bound from two sockets: data datagrams of every size
/// (8-byte header and payload) from A to B and back.
fn relay_sessions_carry_every_size(family: Family) {
    let Some(ns) = Netns::new("udp-mtu-sessions", MTU) else {
        return;
    };
    ns.run(move || {
        use ferry_proto::key::NodePrivate;
        let sessions = Arc::new(ferry_udp::session::Sessions::new(Default::default()));
        let relay = Relay::start_sessions(
            "--relay-port",
            family.loopback(),
            sessions.clone(),
            tuning(),
        )
        .unwrap();
        let at = relay.bound()[0].1;
        let (ka, kb) = (
            NodePrivate::generate().public(),
            NodePrivate::generate().public(),
        );
        let (oa, ob) = allocate_pair(&*sessions, ka, kb);
        let (a, b) = (socket(family), socket(family));
        bind(&a, &mut Binder::new(&oa, at, 1, Instant::now()));
        bind(&b, &mut Binder::new(&ob, at, 1, Instant::now()));
        let head = Header::data(Protocol::Payload, oa.vni).to_bytes();
        for round in 0..ROUNDS {
            let out: Vec<Vec<u8>> = sizes(head.len() + 1, family.max_udp())
                .into_iter()
                .enumerate()
                .map(|(i, n)| datagram(&head, round * 100 + i, n))
                .collect();
            send_burst(&a, at, &out);
            receive_all(&b, &out, "A to B through the session");
            send_burst(&b, at, &out);
            receive_all(&a, &out, "B to A through the session");
        }
        nothing_lost(relay.metrics(), &format!("relay sessions over {family:?}"));
        relay.shutdown();
    });
}

#[test]
fn relay_sessions_carry_every_size_over_a_1500_byte_mtu() {
    relay_sessions_carry_every_size(Family::V4);
}

#[test]
fn relay_sessions_carry_every_size_over_a_1500_byte_mtu_on_ipv6() {
    relay_sessions_carry_every_size(Family::V6);
}
