//! The relay over loopback, in process: bounce sessions, idle expiry,
//! target re-resolution, start-up errors, the hub learning and forwarding
//! across shards, and the metrics endpoint. (Real WireGuard peers in
//! network namespaces are in `tests/netns/run.sh`.)

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::wireguard::{self as wg, PublicKey};
use ferry_udp::config::{Bounce, Config, Hub, Listen, Tuning};
use ferry_udp::metrics::Drop;
use ferry_udp::{Relay, Resolve};

mod support;

fn listen(s: &str) -> Listen {
    Listen {
        addr: s.parse().unwrap(),
        field: "--listen".into(),
    }
}

fn tuning(workers: usize) -> Tuning {
    Tuning {
        workers,
        pin: false,
        recv_buffer: 4 << 20,
        send_buffer: 4 << 20,
        ..Tuning::default()
    }
}

/// A bounce relay to `target` with sessions idle after `idle`, and the
/// address it listens on.
fn start_bounce(target: SocketAddr, idle: Duration) -> (Relay, SocketAddr) {
    let relay = Relay::start(&bounce(&target.to_string(), idle, Duration::ZERO)).unwrap();
    let at = relay.bound()[0].1;
    (relay, at)
}

fn bounce(target: &str, idle: Duration, resolve: Duration) -> Config {
    Config {
        bounce: vec![Bounce {
            listen: vec![listen("127.0.0.1:0")],
            target: target.into(),
            target_field: "--target".into(),
            idle_timeout: idle,
            resolve_interval: resolve,
            wireguard_only: false,
            max_sessions: 1000,
        }],
        hub: None,
        tuning: tuning(2),
        metrics_addr: None,
    }
}

/// A UDP server that echoes datagrams and remembers who sent them.
struct Echo {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<SocketAddr>>>,
    count: Arc<AtomicUsize>,
}

/// A UDP server that echoes every datagram and remembers who sent it.
fn echo() -> Echo {
    echo_if(|_| true)
}

/// A UDP server that echoes the datagrams `answer` accepts and remembers
/// who sent those.
fn echo_if(answer: fn(&[u8]) -> bool) -> Echo {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let (s2, c2) = (seen.clone(), count.clone());
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                if !answer(&buf[..n]) {
                    continue;
                }
                c2.fetch_add(1, Ordering::Relaxed);
                let mut seen = s2.lock().unwrap();
                if !seen.contains(&from) {
                    seen.push(from);
                }
                let _ = sock.send_to(&buf[..n], from);
            }
        }
    });
    Echo { addr, seen, count }
}

fn client() -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c
}

fn round_trip(c: &UdpSocket, to: SocketAddr, msg: &[u8]) -> Vec<u8> {
    c.send_to(msg, to).unwrap();
    let mut buf = [0u8; 65536];
    let (n, from) = c.recv_from(&mut buf).expect("reply through the relay");
    assert_eq!(from, to, "replies come from the relay's address");
    buf[..n].to_vec()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn each_client_gets_its_own_upstream_socket() {
    let server = echo();
    let (relay, at) = start_bounce(server.addr, Duration::from_secs(60));
    let clients: Vec<_> = (0..4).map(|_| client()).collect();
    for (i, c) in clients.iter().enumerate() {
        for k in 0..3 {
            let msg = format!("client {i} message {k}");
            assert_eq!(round_trip(c, at, msg.as_bytes()), msg.as_bytes());
        }
    }
    let seen: HashSet<_> = server.seen.lock().unwrap().iter().copied().collect();
    assert_eq!(seen.len(), 4, "one upstream socket per client: {seen:?}");
    for c in &clients {
        assert!(
            !seen.contains(&c.local_addr().unwrap()),
            "the server never sees a client"
        );
    }
    let m = relay.metrics();
    assert_eq!(m.sum(|s| s.to_target.packets.get()), 12);
    // Counted right after the send the client may already have seen.
    wait_for("the last reply to be counted", || {
        m.sum(|s| s.to_client.packets.get()) == 12
    });
    assert_eq!(m.sum(|s| s.sessions_opened.get()), 4);
    relay.shutdown();
}

#[test]
fn bursts_of_full_size_datagrams_arrive_intact() {
    let server = echo();
    let (relay, at) = start_bounce(server.addr, Duration::from_secs(60));
    let c = client();
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut got = 0usize;
    let mut buf = [0u8; 2048];
    for burst in 0..20u8 {
        for k in 0..32u8 {
            let msg = [burst ^ k; 1400];
            c.send_to(&msg, at).unwrap();
        }
        for _ in 0..32 {
            match c.recv_from(&mut buf) {
                Ok((n, _)) => {
                    assert_eq!(n, 1400);
                    assert!(buf[..n].iter().all(|&b| b == buf[0]));
                    got += 1;
                }
                Err(_) => break,
            }
        }
    }
    // Loopback with large buffers does not lose datagrams in practice.
    assert!(got >= 600, "only {got} of 640 came back");
    let m = relay.metrics();
    eprintln!(
        "recvmmsg calls {}, sendmmsg calls {}, GRO datagrams {}, GSO messages {}",
        m.sum(|s| s.recv_calls.get()),
        m.sum(|s| s.send_calls.get()),
        m.sum(|s| s.gro_datagrams.get()),
        m.sum(|s| s.gso_messages.get())
    );
    relay.shutdown();
}

/// An echo server behind a bounce relay that lets one initiation per
/// second through per client, after a burst of `burst`; and the relay's
/// address.
fn handshake_limited_bounce(burst: u32) -> (Echo, Relay, SocketAddr) {
    let server = echo();
    let mut cfg = bounce(
        &server.addr.to_string(),
        Duration::from_secs(60),
        Duration::ZERO,
    );
    cfg.tuning.handshake_rate = 1;
    cfg.tuning.handshake_burst = burst;
    let relay = Relay::start(&cfg).unwrap();
    let at = relay.bound()[0].1;
    (server, relay, at)
}

/// A WireGuard-shaped initiation (the bounce relay does not check MAC1).
fn bounce_initiation() -> [u8; wg::INITIATION_LEN] {
    let mut init = [0x77u8; wg::INITIATION_LEN];
    init[..4].copy_from_slice(&[1, 0, 0, 0]);
    init
}

#[test]
fn one_client_cannot_flood_the_server_with_initiations() {
    let started = Instant::now();
    let (_server, relay, at) = handshake_limited_bounce(5);
    let c = client();
    let init = bounce_initiation();
    for _ in 0..20 {
        c.send_to(&init, at).unwrap();
    }
    // The burst's worth passes (and is echoed back).
    let mut buf = [0u8; 256];
    for _ in 0..5 {
        let (n, _) = c.recv_from(&mut buf).expect("an initiation echoed");
        assert_eq!(n, wg::INITIATION_LEN);
    }
    // Other traffic of the same client is not limited.
    assert_eq!(round_trip(&c, at, b"data"), b"data");
    let m = relay.metrics().clone();
    let limited = || m.drops(Drop::Hub(ferry_udp::hub::DropReason::RateLimited));
    let passed = || m.sum(|s| s.to_target.packets.get());
    wait_for("the flood to be counted", || passed() + limited() == 21);
    // The burst, plus at most one token per second since the start.
    let refills = started.elapsed().as_secs() + 1;
    let initiations = passed() - 1;
    assert!(
        (5..=5 + refills).contains(&initiations),
        "{initiations} of 20 initiations passed (and the data)"
    );
    relay.shutdown();
}

/// A 148-byte initiation at the end of a GRO train of larger
/// datagrams (the segment size is not 148) is rate-limited like any other.
#[test]
fn initiations_ending_gro_trains_are_rate_limited() {
    use std::os::fd::AsFd;

    let started = Instant::now();
    let (server, relay, at) = handshake_limited_bounce(2);
    let m = relay.metrics().clone();
    if !(m.info.gro && ferry_sys::gso::probe(client().as_fd()).gso) {
        return ferry_testkit::skip!("this kernel has no UDP GSO/GRO, so no trains");
    }
    // Each train: two 200-byte datagrams and an initiation, sent as one
    // GSO message of segment size 200, so the relay receives it as one GRO
    // slot whose last datagram is shorter.
    let train = [&[0xd0u8; 200][..], &[0xd1; 200], &bounce_initiation()].concat();
    const TRAINS: u64 = 10;
    let c = client();
    for _ in 0..TRAINS {
        support::send_gso_train(&c, at, &train, 200);
    }
    let limited = || m.drops(Drop::Hub(ferry_udp::hub::DropReason::RateLimited));
    wait_for("every datagram to be forwarded or dropped", || {
        m.sum(|s| s.to_target.packets.get()) + limited() == 3 * TRAINS
    });
    // The burst, plus at most one token per second since the start.
    let refills = started.elapsed().as_secs() + 1;
    let passed_initiations = TRAINS - limited();
    assert!(
        (2..=2 + refills).contains(&passed_initiations),
        "{passed_initiations} of {TRAINS} initiations passed"
    );
    assert!(
        m.sum(|s| s.gro_datagrams.get()) > 0,
        "the trains arrived as GRO slots"
    );
    wait_for("the echo server to see the data", || {
        server.count.load(Ordering::Relaxed) as u64 == 2 * TRAINS + passed_initiations
    });
    relay.shutdown();
}

#[test]
fn idle_sessions_expire() {
    let server = echo();
    let (relay, at) = start_bounce(server.addr, Duration::from_millis(300));
    let c = client();
    round_trip(&c, at, b"one");
    let m = relay.metrics().clone();
    wait_for("the session to expire", || {
        m.sum(|s| s.sessions_expired.get()) == 1
    });
    assert_eq!(m.sum(|s| s.sessions.get() as u64), 0);
    round_trip(&c, at, b"two");
    assert_eq!(
        server.seen.lock().unwrap().len(),
        2,
        "a new session, a new upstream port"
    );
    relay.shutdown();
}

/// At `max_sessions`, sources whose target never answered (a spoofed
/// flood, say) do not lock new clients out: once the oldest of them is
/// a few seconds old, a new client takes its place; a session the target
/// answered is never taken.
#[test]
fn a_new_client_takes_the_place_of_a_session_nobody_answered() {
    let target = echo_if(|d| d.starts_with(b"legit"));
    let mut config = bounce(
        &target.addr.to_string(),
        Duration::from_secs(60),
        Duration::ZERO,
    );
    config.bounce[0].max_sessions = 3;
    config.tuning = tuning(1);
    let relay = Relay::start(&config).unwrap();
    let at = relay.bound()[0].1;
    let m = relay.metrics().clone();
    let silent: Vec<UdpSocket> = (0..3).map(|_| client()).collect();
    for s in &silent {
        s.send_to(b"junk", at).unwrap();
    }
    wait_for("three sessions", || m.sum(|s| s.sessions_opened.get()) == 3);

    // A client the target answers gets in once the silent sessions are old
    // enough to give way (it retries, as WireGuard does).
    let legit = client();
    legit
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 64];
    loop {
        assert!(
            Instant::now() < deadline,
            "the new client never got in ({} refused at the limit)",
            m.drops(Drop::ClientLimit)
        );
        legit.send_to(b"legit 1", at).unwrap();
        if let Ok((n, _)) = legit.recv_from(&mut buf) {
            assert_eq!(&buf[..n], b"legit 1");
            break;
        }
    }
    assert_eq!(m.sum(|s| s.sessions_evicted.get()), 1);

    // More newcomers take the other silent places, never the answered one.
    for _ in 0..2 {
        let c = client();
        c.send_to(b"junk", at).unwrap();
    }
    wait_for("two more evictions", || {
        m.sum(|s| s.sessions_evicted.get()) == 3
    });
    assert_eq!(round_trip(&legit, at, b"legit 2"), b"legit 2");
    assert_eq!(
        target.seen.lock().unwrap().len(),
        1,
        "the answered session kept its port"
    );
    let refused = m.drops(Drop::ClientLimit);
    let late = client();
    late.send_to(b"junk", at).unwrap();
    wait_for("a newcomer refused: the silent ones are too young", || {
        m.drops(Drop::ClientLimit) > refused
    });
    relay.shutdown();
}

/// A resolver whose answer the test changes.
struct Switch(Mutex<Result<Vec<SocketAddr>, String>>);

impl Resolve for Switch {
    fn resolve(&self, _: &str) -> std::io::Result<Vec<SocketAddr>> {
        self.0
            .lock()
            .unwrap()
            .clone()
            .map_err(std::io::Error::other)
    }
}

#[test]
fn sessions_follow_a_moved_target_without_changing_port() {
    let (old, new) = (echo(), echo());
    let dns = Arc::new(Switch(Mutex::new(Ok(vec![old.addr]))));
    let relay = Relay::start_with(
        &bounce(
            "server.test:51820",
            Duration::from_secs(60),
            Duration::from_millis(100),
        ),
        dns.clone(),
    )
    .unwrap();
    let at = relay.bound()[0].1;
    let c = client();
    round_trip(&c, at, b"before");
    // A failed lookup keeps the old address.
    *dns.0.lock().unwrap() = Err("temporary failure".into());
    let m = relay.metrics().clone();
    wait_for("a failed resolution", || {
        m.resolves_failed.load(Ordering::Relaxed) > 0
    });
    round_trip(&c, at, b"still old");
    *dns.0.lock().unwrap() = Ok(vec![new.addr]);
    wait_for("the target to move", || {
        m.sum(|s| s.sessions_retargeted.get()) == 1
    });
    assert_eq!(round_trip(&c, at, b"after"), b"after");
    assert_eq!(old.count.load(Ordering::Relaxed), 2);
    assert_eq!(new.count.load(Ordering::Relaxed), 1);
    assert_eq!(
        old.seen.lock().unwrap()[..],
        new.seen.lock().unwrap()[..],
        "the session kept its upstream port"
    );
    assert_eq!(m.sum(|s| s.sessions_opened.get()), 1);
    relay.shutdown();
}

#[test]
fn a_target_that_does_not_resolve_yet_is_retried_until_it_does() {
    let server = echo();
    let dns = Arc::new(Switch(Mutex::new(Err("Name or service not known".into()))));
    // Re-resolution off: the retries at start do not depend on it.
    let relay = Relay::start_with(
        &bounce("later.test:51820", Duration::from_secs(60), Duration::ZERO),
        dns.clone(),
    )
    .expect("the relay starts although its target does not resolve");
    let at = relay.bound()[0].1;
    let m = relay.metrics().clone();
    let c = client();
    c.send_to(b"too early", at).unwrap();
    wait_for("the early datagram dropped", || {
        m.drops(Drop::TargetUnresolved) == 1
    });
    wait_for("a retry that fails", || {
        m.resolves_failed.load(Ordering::Relaxed) >= 1
    });
    *dns.0.lock().unwrap() = Ok(vec![server.addr]);
    // The second retry comes 2 s after the first; a shard may still drop
    // a datagram sent before it saw the new address, so ask until answered.
    wait_for("the target to resolve", || {
        m.resolves_ok.load(Ordering::Relaxed) == 1
    });
    c.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 64];
    wait_for("a reply through the resolved target", || {
        c.send_to(b"now", at).unwrap();
        matches!(c.recv_from(&mut buf), Ok((3, from)) if from == at && &buf[..3] == b"now")
    });
    assert!(server.count.load(Ordering::Relaxed) >= 1);
    relay.shutdown();
}

#[test]
fn start_errors_name_the_field() {
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut c = bounce("127.0.0.1:9", Duration::from_secs(1), Duration::ZERO);
    c.bounce[0].listen = vec![Listen {
        addr: taken.local_addr().unwrap(),
        field: "bounce[0].listen[0]".into(),
    }];
    let e = Relay::start(&c).err().unwrap();
    assert!(
        e.to_string().starts_with("bounce[0].listen[0]:") && e.to_string().contains("in use"),
        "{e}"
    );
}

mod common;

use common::{data, handshake};

fn hub_config(keys: &[PublicKey], workers: usize) -> Config {
    Config {
        bounce: vec![],
        hub: Some(Hub {
            listen: vec![listen("127.0.0.1:0")],
            peers: common::hub_peers(keys, None),
            max_indices: 1024,
        }),
        tuning: tuning(workers),
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
    }
}

fn expect(peer: &UdpSocket, want: &[u8]) {
    let mut buf = [0u8; 2048];
    let (n, _) = peer
        .recv_from(&mut buf)
        .expect("a datagram through the hub");
    assert_eq!(&buf[..n], want);
}

/// A fresh client socket that the kernel's `SO_REUSEPORT` hash gives to
/// `shard` of the relay at `at`: found by sending junk from new sockets
/// and seeing which shard counts it (the hash of a socket's addresses does
/// not change, so it stays there). Each probe is one `not_wireguard` drop.
fn client_on_shard(m: &ferry_udp::metrics::Metrics, at: SocketAddr, shard: usize) -> UdpSocket {
    let junk = Drop::Hub(ferry_udp::hub::DropReason::NotWireGuard);
    for _ in 0..64 {
        let c = client();
        let before: Vec<u64> = m.shards.iter().map(|s| s.drops(junk)).collect();
        c.send_to(b"which shard?", at).unwrap();
        let total: u64 = before.iter().sum::<u64>() + 1;
        wait_for("the probe to be counted", || m.drops(junk) == total);
        if m.shards[shard].drops(junk) > before[shard] {
            return c;
        }
    }
    panic!("no client socket landed on shard {shard} in 64 tries");
}

/// Placement is pinned: p0 on shard 0, p1 and p2 on shard 1, so every
/// exchange below crosses shards, every time.
#[test]
fn hub_learns_indices_and_forwards_across_shards() {
    let keys: Vec<PublicKey> = (1..=3).map(|n| PublicKey::from_bytes([n; 32])).collect();
    let relay = Relay::start(&hub_config(&keys, 2)).unwrap();
    let hub = relay.bound()[0].1;
    let m = relay.metrics().clone();
    let peers: Vec<UdpSocket> = [0, 1, 1]
        .into_iter()
        .map(|shard| client_on_shard(&m, hub, shard))
        .collect();
    let probes = m.drops(Drop::Hub(ferry_udp::hub::DropReason::NotWireGuard));

    // p0 calls p1 before anyone is known: dropped, p0 becomes a candidate.
    peers[0]
        .send_to(&handshake(1, 0x100, 0, &keys[1]), hub)
        .unwrap();
    wait_for("the first drop", || {
        m.drops(Drop::Hub(ferry_udp::hub::DropReason::NoEndpoint)) == 1
    });
    // p1 calls p0: flooded to the candidate, which is p0, once p0's shard
    // has published it to p1's (right after its batch). Until then p1's
    // initiation is dropped for want of an endpoint, and p1 sends it
    // again, as WireGuard would.
    let init = handshake(1, 0x200, 0, &keys[0]);
    let out = || m.sum(|s| s.hub_out.packets.get());
    let no_endpoint = || m.drops(Drop::Hub(ferry_udp::hub::DropReason::NoEndpoint));
    for tries in 1.. {
        let before = out() + no_endpoint();
        let out0 = out();
        peers[1].send_to(&init, hub).unwrap();
        wait_for("the initiation to be forwarded or dropped", || {
            out() + no_endpoint() > before
        });
        if out() > out0 {
            break;
        }
        assert!(tries < 200, "p0 never became p1's shard's candidate");
    }
    expect(&peers[0], &init);
    // p0 answers; MAC1 keyed with p1's key identifies the initiator.
    let resp = handshake(2, 0x300, 0x200, &keys[1]);
    peers[0].send_to(&resp, hub).unwrap();
    expect(&peers[1], &resp);
    // Data both ways, many times, across the shards.
    for c in 0..50u64 {
        let d = data(0x300, c, 48 + 16 * (c as usize % 4));
        peers[1].send_to(&d, hub).unwrap();
        expect(&peers[0], &d);
        let d = data(0x200, c, 1452);
        peers[0].send_to(&d, hub).unwrap();
        expect(&peers[1], &d);
    }
    // p2 calls p0, now known: straight through.
    let init = handshake(1, 0x400, 0, &keys[0]);
    peers[2].send_to(&init, hub).unwrap();
    expect(&peers[0], &init);
    let resp = handshake(2, 0x500, 0x400, &keys[2]);
    peers[0].send_to(&resp, hub).unwrap();
    expect(&peers[2], &resp);
    let d = data(0x500, 0, 64);
    peers[2].send_to(&d, hub).unwrap();
    expect(&peers[0], &d);

    // Garbage and unknown indices go nowhere.
    peers[2].send_to(b"not wireguard", hub).unwrap();
    peers[2].send_to(&data(0xdead, 1, 64), hub).unwrap();
    wait_for("drops to be counted", || {
        m.drops(Drop::Hub(ferry_udp::hub::DropReason::NotWireGuard)) == probes + 1
            && m.drops(Drop::Hub(ferry_udp::hub::DropReason::UnknownIndex)) == 1
    });

    // The metrics endpoint serves the counters.
    let mut conn = TcpStream::connect(relay.metrics_addr().unwrap()).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(
        text.contains("ferry_udp_packets_total{mode=\"hub\",direction=\"out\"} 105"),
        "{text}"
    );
    assert!(text.contains("ferry_udp_hub_messages_total{kind=\"initiation\"} 3"));
    assert!(text.contains(&format!(
        "ferry_udp_drops_total{{reason=\"not_wireguard\"}} {}",
        probes + 1
    )));
    relay.shutdown();
}

/// A GRO train through the hub: each datagram is routed on its own (junk
/// and an unknown index inside the train are dropped and counted), and
/// the rest leave in order, as one GSO message.
#[test]
fn a_mixed_train_through_the_hub_is_split_and_its_bad_datagrams_dropped() {
    use ferry_udp::hub::DropReason;
    use std::os::fd::AsFd;

    let keys: Vec<PublicKey> = (1..=2).map(|n| PublicKey::from_bytes([n; 32])).collect();
    let p1 = client();
    let mut config = hub_config(&keys, 1);
    config.hub.as_mut().unwrap().peers =
        common::hub_peers(&keys, Some((1, p1.local_addr().unwrap())));
    let relay = Relay::start(&config).unwrap();
    let hub = relay.bound()[0].1;
    let m = relay.metrics().clone();
    let p0 = client();
    if !(m.info.gro && ferry_sys::gso::probe(p0.as_fd()).gso) {
        relay.shutdown();
        return ferry_testkit::skip!("this kernel has no UDP GSO/GRO, so no trains");
    }
    // p0 calls p1 (whose endpoint is fixed), p1 answers.
    let init = handshake(1, 0x100, 0, &keys[1]);
    p0.send_to(&init, hub).unwrap();
    expect(&p1, &init);
    let resp = handshake(2, 0x200, 0x100, &keys[0]);
    p1.send_to(&resp, hub).unwrap();
    expect(&p0, &resp);

    let mut junk = data(0x200, 3, 1000);
    junk[0] = 9;
    let good: Vec<Vec<u8>> = (1..=4).map(|c| data(0x200, c, 1000)).collect();
    let train = [
        good[0].clone(),
        good[1].clone(),
        junk,
        good[2].clone(),
        data(0xdead, 9, 1000),
        good[3].clone(),
    ]
    .concat();
    let gso_before = m.sum(|s| s.gso_messages.get());
    support::send_gso_train(&p0, hub, &train, 1000);
    for d in &good {
        expect(&p1, d);
    }
    // Counted once the send returns, which may be after p1 has them.
    wait_for("the train's drops and sends to be counted", || {
        m.drops(Drop::Hub(DropReason::NotWireGuard)) == 1
            && m.drops(Drop::Hub(DropReason::UnknownIndex)) == 1
            && m.sum(|s| s.hub_out.packets.get()) == 2 + 4
    });
    assert!(
        m.sum(|s| s.gro_datagrams.get()) >= 6,
        "the train arrived as one GRO slot"
    );
    assert_eq!(m.sum(|s| s.hub_in.packets.get()), 2 + 6);
    assert_eq!(
        m.sum(|s| s.gso_messages.get()) - gso_before,
        1,
        "the four left as one GSO message"
    );
    relay.shutdown();
}

#[test]
fn a_reconfigured_hub_applies_on_every_shard() {
    let keys: Vec<PublicKey> = (1..=3).map(|n| PublicKey::from_bytes([n; 32])).collect();
    // All 64 initiations below come from 127.0.0.1, split between the two
    // shards by the kernel: the per-source handshake limit (a burst of 40
    // per shard by default) must not take any of them, or fewer than 32
    // reach the hub as unknown recipients.
    let unlimited = |mut c: Config| {
        c.tuning.handshake_rate = 100_000;
        c.tuning.handshake_burst = 100_000;
        c
    };
    let old = unlimited(hub_config(&keys[..2], 2));
    let relay = Relay::start(&old).unwrap();
    let hub = relay.bound()[0].1;
    let m = relay.metrics().clone();
    let phone = client();
    let mut new = unlimited(hub_config(&keys, 2));
    new.hub.as_mut().unwrap().peers[2].endpoint = Some(phone.local_addr().unwrap());
    let changes = relay.reconfigure(&old, &new).unwrap();
    let texts: Vec<(&str, bool)> = changes.iter().map(|c| (c.text.as_str(), c.live)).collect();
    assert_eq!(texts, [("hub.peer \"p2\": added", true)]);
    assert_eq!(m.hub_peers.load(Ordering::Relaxed), 3);
    // Sources spread over both shards by the kernel: each shard routes to
    // the new peer.
    // (32 sources all on one shard: odds of 2 in 2^32.)
    let callers: Vec<UdpSocket> = (0..32).map(|_| client()).collect();
    for (i, c) in callers.iter().enumerate() {
        let init = handshake(1, 0x1000 + i as u32, 0, &keys[2]);
        c.send_to(&init, hub).unwrap();
        expect(&phone, &init);
    }
    assert!(
        m.shards.iter().all(|s| s.hub_in.packets.get() > 0),
        "both shards routed some"
    );
    // And every shard forgets it again.
    let running = old.with_live_parts_of(&new);
    let changes = relay.reconfigure(&running, &old).unwrap();
    assert_eq!(changes[0].text, "hub.peer \"p2\": removed");
    for (i, c) in callers.iter().enumerate() {
        c.send_to(&handshake(1, 0x2000 + i as u32, 0, &keys[2]), hub)
            .unwrap();
    }
    wait_for("32 unknown recipients", || {
        m.drops(Drop::Hub(ferry_udp::hub::DropReason::UnknownRecipient)) == 32
    });
    phone.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    assert!(
        phone.recv_from(&mut buf).is_err(),
        "nothing for a removed peer"
    );
    // An invalid configuration is refused and changes nothing.
    let mut bad = old.clone();
    bad.hub.as_mut().unwrap().peers.pop();
    assert!(relay.reconfigure(&old, &bad).is_err());
    assert_eq!(m.hub_peers.load(Ordering::Relaxed), 2);
    relay.shutdown();
}
