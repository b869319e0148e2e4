//! The bounce relay's README flags, in process on loopback, each checked
//! by what it does to datagrams: `--wireguard-only`, `--max-sessions`,
//! the per-source limit on new clients (`--handshake-rate/-burst`), GRO
//! runs forwarded as GSO trains, and `--gro/--gso=false`. One shard, so
//! every client meets the same shard's counters and limits.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_udp::config::{Bounce, Config, Listen, Tuning};
use ferry_udp::metrics::Drop;
use ferry_udp::Relay;

mod support;

/// A UDP target that counts what it receives (and their bytes) and never
/// answers, so everything the relay sends goes one way.
struct Sink {
    addr: SocketAddr,
    datagrams: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

fn sink() -> Sink {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let datagrams = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let (d, b) = (datagrams.clone(), bytes.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(n) = sock.recv(&mut buf) {
                b.fetch_add(n as u64, Ordering::Relaxed);
                d.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Sink {
        addr,
        datagrams,
        bytes,
    }
}

/// One bounce route to `target` on one shard, with `tweak` applied.
fn start(target: SocketAddr, tweak: impl FnOnce(&mut Bounce, &mut Tuning)) -> (Relay, SocketAddr) {
    let mut bounce = Bounce {
        listen: vec![Listen {
            addr: "127.0.0.1:0".parse().unwrap(),
            field: "--listen".into(),
        }],
        target: target.to_string(),
        target_field: "--target".into(),
        idle_timeout: Duration::from_secs(60),
        resolve_interval: Duration::ZERO,
        wireguard_only: false,
        max_sessions: 1000,
    };
    let mut tuning = Tuning {
        workers: 1,
        pin: false,
        recv_buffer: 4 << 20,
        send_buffer: 4 << 20,
        ..Tuning::default()
    };
    tweak(&mut bounce, &mut tuning);
    let relay = Relay::start(&Config {
        bounce: vec![bounce],
        hub: None,
        tuning,
        metrics_addr: None,
    })
    .unwrap();
    let at = relay.bound()[0].1;
    (relay, at)
}

fn client_on(ip: &str) -> UdpSocket {
    UdpSocket::bind((ip, 0)).unwrap()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A WireGuard transport-data message of `len` bytes.
fn transport(len: usize) -> Vec<u8> {
    let mut m = vec![0xd0; len];
    m[..4].copy_from_slice(&[4, 0, 0, 0]);
    m
}

/// `--wireguard-only`: datagrams that are not WireGuard-shaped are dropped
/// and counted; WireGuard's own pass. Without it, anything passes.
#[test]
fn wireguard_only_drops_what_is_not_wireguard() {
    for only in [true, false] {
        let target = sink();
        let (relay, at) = start(target.addr, |b, _| b.wireguard_only = only);
        let m = relay.metrics().clone();
        let c = client_on("127.0.0.1");
        let junk: [&[u8]; 4] = [
            b"hello",
            &[1, 0, 0, 0, 9],
            &[4, 1, 0, 0, 0, 0, 0, 0],
            &[7; 64],
        ];
        for j in junk {
            c.send_to(j, at).unwrap();
        }
        for _ in 0..3 {
            c.send_to(&transport(64), at).unwrap();
        }
        let want = if only { 3 } else { 7 };
        wait_for("every datagram forwarded or dropped", || {
            m.sum(|s| s.to_target.packets.get())
                + m.drops(Drop::Hub(ferry_udp::hub::DropReason::NotWireGuard))
                == 7
        });
        wait_for("the target to get what passed", || {
            target.datagrams.load(Ordering::Relaxed) == want
        });
        assert_eq!(
            m.drops(Drop::Hub(ferry_udp::hub::DropReason::NotWireGuard)),
            7 - want,
            "wireguard_only={only}"
        );
        assert_eq!(
            target.bytes.load(Ordering::Relaxed),
            if only {
                3 * 64
            } else {
                3 * 64 + 5 + 5 + 8 + 64
            }
        );
        relay.shutdown();
    }
}

/// `--max-sessions N`: N clients get sessions (an upstream socket each);
/// the next is dropped and counted, and gets in once a session ends.
#[test]
fn max_sessions_caps_concurrent_clients() {
    const N: usize = 3;
    let target = sink();
    let (relay, at) = start(target.addr, |b, _| {
        b.max_sessions = N;
        // Long enough that no session expires while the clients start.
        b.idle_timeout = Duration::from_secs(3);
    });
    let m = relay.metrics().clone();
    let clients: Vec<UdpSocket> = (0..N + 2).map(|_| client_on("127.0.0.1")).collect();
    for c in &clients {
        c.send_to(&transport(32), at).unwrap();
    }
    wait_for("every client served or refused", || {
        m.sum(|s| s.to_target.packets.get()) + m.drops(Drop::ClientLimit) == (N + 2) as u64
    });
    assert_eq!(m.sum(|s| s.to_target.packets.get()), N as u64);
    assert_eq!(m.drops(Drop::ClientLimit), 2);
    assert_eq!(target.datagrams.load(Ordering::Relaxed) as usize, {
        wait_for("the target to get the sessions' datagrams", || {
            target.datagrams.load(Ordering::Relaxed) == N as u64
        });
        N
    });
    // Once the sessions go idle and expire, a refused client gets in.
    wait_for("the sessions to expire", || {
        m.sum(|s| s.sessions_expired.get()) == N as u64
    });
    clients[N].send_to(&transport(32), at).unwrap();
    wait_for("the refused client to get a session", || {
        target.datagrams.load(Ordering::Relaxed) == N as u64 + 1
    });
    relay.shutdown();
}

/// `--handshake-rate R --handshake-burst B` on a bounce: new clients
/// (sessions) from one source IP are limited to B at once plus R a second;
/// another source IP has its own allowance.
#[test]
fn new_clients_are_rate_limited_per_source_ip() {
    const BURST: u64 = 3;
    const TRIES: u64 = 10;
    let started = Instant::now();
    let target = sink();
    let (relay, at) = start(target.addr, |_, t| {
        t.handshake_rate = 1;
        t.handshake_burst = BURST as u32;
    });
    let m = relay.metrics().clone();
    let from_one: Vec<UdpSocket> = (0..TRIES).map(|_| client_on("127.0.0.1")).collect();
    for c in &from_one {
        c.send_to(&transport(32), at).unwrap();
    }
    wait_for("every new client admitted or refused", || {
        m.sum(|s| s.to_target.packets.get()) + m.drops(Drop::ClientRate) == TRIES
    });
    // The burst, plus at most one token per second since the start.
    let refills = started.elapsed().as_secs() + 1;
    let admitted = m.sum(|s| s.to_target.packets.get());
    assert!(
        (BURST..=BURST + refills).contains(&admitted),
        "{admitted} of {TRIES} new clients from one address got sessions"
    );
    // A second source address is not held back by the first one's flood.
    let other = client_on("127.0.0.2");
    other.send_to(&transport(32), at).unwrap();
    wait_for("the other source's client to get a session", || {
        m.sum(|s| s.to_target.packets.get()) == admitted + 1
    });
    relay.shutdown();
}

const TRAINS: u64 = 10;
const SEGMENTS: u64 = 4;
const SEGMENT: usize = 300;

/// Sends TRAINS trains of SEGMENTS datagrams of SEGMENT bytes, each train
/// one GSO message, waiting for the target to have each train before the
/// next (so each reaches the relay in a receive of its own).
fn send_trains(at: SocketAddr, target: &Sink) {
    let c = client_on("127.0.0.1");
    let train = transport(SEGMENT * SEGMENTS as usize);
    for i in 1..=TRAINS {
        support::send_gso_train(&c, at, &train, SEGMENT as u16);
        wait_for("a train through the relay", || {
            target.datagrams.load(Ordering::Relaxed) == i * SEGMENTS
        });
    }
    assert_eq!(
        target.bytes.load(Ordering::Relaxed),
        TRAINS * SEGMENTS * SEGMENT as u64,
        "every datagram arrives whole"
    );
}

/// With GRO and GSO (the defaults), a train that arrives as one GRO slot
/// leaves as one GSO message: every datagram is counted as received in a
/// GRO slot, and each train is one GSO send. With `--gro=false
/// --gso=false` the same trains arrive and leave datagram by datagram.
#[test]
fn gro_runs_leave_as_gso_trains_unless_switched_off() {
    let client = client_on("127.0.0.1");
    let offloads = ferry_sys::gso::probe(client.as_fd());
    if !(offloads.gro && offloads.gso) {
        // Every kernel CI runs on has both.
        return ferry_testkit::skip!("this kernel lacks UDP GRO or GSO ({offloads:?})");
    }
    for on in [true, false] {
        let target = sink();
        let (relay, at) = start(target.addr, |_, t| {
            t.gro = on;
            t.gso = on;
        });
        let m = relay.metrics().clone();
        assert_eq!((m.info.gro, m.info.gso), (on, on));
        send_trains(at, &target);
        let gro = m.sum(|s| s.gro_datagrams.get());
        let gso = m.sum(|s| s.gso_messages.get());
        println!("gro/gso {on}: {gro} datagrams in GRO slots, {gso} GSO messages");
        if on {
            assert_eq!(
                gro,
                TRAINS * SEGMENTS,
                "every train arrived as one GRO slot"
            );
            assert_eq!(gso, TRAINS, "every train left as one GSO message");
        } else {
            assert_eq!((gro, gso), (0, 0));
        }
        assert_eq!(m.sum(|s| s.to_target.packets.get()), TRAINS * SEGMENTS);
        relay.shutdown();
    }
}
