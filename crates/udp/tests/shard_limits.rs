//! The UDP relay's limits over two shards, each one count for everything
//! it limits whichever shard each client's address hashes to: a bounce
//! route's `--max-sessions` (`bounce[].max_sessions`) and the hub's
//! `hub.max_indices`. Clients are placed by the kernel's `SO_REUSEPORT`
//! hash; each test sends from new sockets and reads which shard counted
//! each one, so the shards each client met are known, not hoped for.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::wireguard::{self as wg, Mac1Key, PublicKey};
use ferry_udp::config::{Bounce, Config, Hub, Listen, Tuning};
use ferry_udp::hub::{DropReason, STRANGER_RESERVE};
use ferry_udp::metrics::{Drop, Metrics, ShardMetrics};
use ferry_udp::Relay;

mod common;

const WORKERS: usize = 2;

/// A UDP target that counts the datagrams it receives and never answers.
fn sink() -> (SocketAddr, Arc<AtomicU64>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let datagrams = Arc::new(AtomicU64::new(0));
    let d = datagrams.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if sock.recv(&mut buf).is_ok() {
                d.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (addr, datagrams)
}

/// A bounce relay over two shards to `target`, at most `max` sessions,
/// closed after `idle` without traffic; and where it listens.
fn start(target: SocketAddr, max: usize, idle: Duration) -> (Relay, SocketAddr) {
    let relay = Relay::start(&Config {
        bounce: vec![Bounce {
            listen: vec![loopback()],
            target: target.to_string(),
            target_field: "--target".into(),
            idle_timeout: idle,
            resolve_interval: Duration::ZERO,
            wireguard_only: false,
            max_sessions: max,
        }],
        hub: None,
        tuning: tuning(),
        metrics_addr: None,
    })
    .unwrap();
    let at = relay.bound()[0].1;
    (relay, at)
}

fn loopback() -> Listen {
    Listen {
        addr: "127.0.0.1:0".parse().unwrap(),
        field: "--listen".into(),
    }
}

fn tuning() -> Tuning {
    Tuning {
        workers: WORKERS,
        pin: false,
        recv_buffer: 4 << 20,
        send_buffer: 4 << 20,
        // No client here is refused for coming too fast.
        handshake_rate: 1000,
        handshake_burst: 1000,
        ..Tuning::default()
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every new client a shard has seen: admitted or refused at the limit.
fn met(s: &ShardMetrics) -> u64 {
    s.sessions_opened.get() + s.drops(Drop::ClientLimit)
}

/// A WireGuard transport-data message.
const DATA: [u8; 32] = {
    let mut m = [0xd0; 32];
    m[0] = 4;
    m[1] = 0;
    m[2] = 0;
    m[3] = 0;
    m
};

/// A new client: a fresh socket sends one datagram to `at`. Returns it,
/// the shard that counted it, and whether that shard gave it a session.
fn new_client(m: &Metrics, at: SocketAddr) -> (UdpSocket, usize, bool) {
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    let before: Vec<(u64, u64)> = m
        .shards
        .iter()
        .map(|s| (met(s), s.sessions_opened.get()))
        .collect();
    let total: u64 = before.iter().map(|b| b.0).sum();
    c.send_to(&DATA, at).unwrap();
    wait_for("the new client to be counted", || m.sum(met) == total + 1);
    let shard = (0..WORKERS)
        .find(|&k| met(&m.shards[k]) > before[k].0)
        .unwrap();
    let admitted = m.shards[shard].sessions_opened.get() > before[shard].1;
    (c, shard, admitted)
}

/// `--max-sessions 1` over two shards: a client on one shard holds the
/// only session, a client on the other shard is refused (with a limit of
/// one per shard it got in), and gets in once the first session expired
/// and gave its place back; then the first is refused in turn.
#[test]
fn one_session_over_two_shards() {
    let (target, received) = sink();
    // Long enough that nothing expires while the clients are placed.
    let (relay, at) = start(target, 1, Duration::from_secs(3));
    let m = relay.metrics().clone();
    let (first, a, admitted) = new_client(&m, at);
    assert!(admitted, "the first client gets the session");
    // New clients until one lands on the other shard; the ones landing on
    // the first client's shard are refused there.
    let mut second = None;
    for _ in 0..64 {
        let (c, shard, admitted) = new_client(&m, at);
        assert!(!admitted, "a client on shard {shard} got a second session");
        if shard != a {
            second = Some((c, shard));
            break;
        }
    }
    let (second, b) = second.expect("no client landed on the other shard in 64 tries");
    assert_eq!(
        m.sum(|s| s.sessions_expired.get()),
        0,
        "nothing expired yet"
    );
    assert_eq!(m.sum(|s| s.sessions_opened.get()), 1);
    assert_eq!(m.shards[b].drops(Drop::ClientLimit), 1);
    wait_for("the session's datagram at the target", || {
        received.load(Ordering::Relaxed) == 1
    });

    // The first session goes idle and expires: its place is free.
    wait_for("the first session to expire", || {
        m.shards[a].sessions_expired.get() == 1
    });
    second.send_to(&DATA, at).unwrap();
    wait_for("the second client's session", || {
        m.shards[b].sessions_opened.get() == 1
    });
    wait_for("its datagram at the target", || {
        received.load(Ordering::Relaxed) == 2
    });
    // Now the second holds the place, and the first is refused.
    let refused = m.shards[a].drops(Drop::ClientLimit);
    first.send_to(&DATA, at).unwrap();
    wait_for("the first client to be refused", || {
        m.shards[a].drops(Drop::ClientLimit) == refused + 1
    });
    assert_eq!(m.sum(|s| s.sessions_opened.get()), 2);
    relay.shutdown();
}

/// `--max-sessions 3` over two shards, with at least three clients on
/// each (so a limit split per shard would let four in): three sessions in
/// all, every other client refused and counted; once the sessions expire,
/// a refused client gets in.
#[test]
fn max_sessions_caps_concurrent_clients_across_shards() {
    const N: usize = 3;
    let (target, received) = sink();
    let (relay, at) = start(target, N, Duration::from_secs(3));
    let m = relay.metrics().clone();
    let mut clients: Vec<(UdpSocket, bool)> = Vec::new();
    let mut per_shard = [0usize; WORKERS];
    for _ in 0..64 {
        if per_shard.iter().all(|&n| n >= N) {
            break;
        }
        let (c, shard, admitted) = new_client(&m, at);
        per_shard[shard] += 1;
        clients.push((c, admitted));
    }
    assert!(
        per_shard.iter().all(|&n| n >= N),
        "clients per shard after 64 tries: {per_shard:?}"
    );
    assert_eq!(
        m.sum(|s| s.sessions_expired.get()),
        0,
        "nothing expired yet"
    );
    let admitted = clients.iter().filter(|c| c.1).count();
    assert_eq!(
        admitted,
        N,
        "sessions of {} clients {per_shard:?}",
        clients.len()
    );
    assert!(clients[..N].iter().all(|c| c.1), "the first N got in");
    assert_eq!(m.drops(Drop::ClientLimit), (clients.len() - N) as u64);
    wait_for("the sessions' datagrams at the target", || {
        received.load(Ordering::Relaxed) == N as u64
    });

    wait_for("the sessions to expire", || {
        m.sum(|s| s.sessions_expired.get()) == N as u64
    });
    let opened = m.sum(|s| s.sessions_opened.get());
    clients[N].0.send_to(&DATA, at).unwrap();
    wait_for("the refused client to get a session", || {
        m.sum(|s| s.sessions_opened.get()) == opened + 1
    });
    wait_for("its datagram at the target", || {
        received.load(Ordering::Relaxed) == N as u64 + 1
    });
    relay.shutdown();
}

/// A WireGuard handshake initiation from sender index `sender` to the
/// peer whose public key is `to` (only its MAC1 is real).
fn initiation(sender: u32, to: &PublicKey) -> Vec<u8> {
    let mut m = vec![0x5a; wg::INITIATION_LEN];
    m[..4].copy_from_slice(&[1, 0, 0, 0]);
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    assert!(wg::seal_mac1(&mut m, &Mac1Key::new(to)));
    m
}

/// A fresh socket that the kernel gives to `shard` of the hub at `at`:
/// found by sending junk from new sockets and seeing which shard counts it
/// (each probe is one `not_wireguard` drop).
fn hub_client_on(m: &Metrics, at: SocketAddr, shard: usize) -> UdpSocket {
    let junk = Drop::Hub(DropReason::NotWireGuard);
    for _ in 0..64 {
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = m.shards[shard].drops(junk);
        let total = m.drops(junk);
        c.send_to(b"which shard?", at).unwrap();
        wait_for("the probe to be counted", || m.drops(junk) == total + 1);
        if m.shards[shard].drops(junk) > before {
            return c;
        }
    }
    panic!("no client socket landed on shard {shard} in 64 tries");
}

/// `hub.max_indices` is the hub's whole table, not a share per shard:
/// every shard's replica holds every entry. Ten pending handshakes from a
/// client on shard 0, then ten from a client on shard 1 with a limit of
/// 16, of which strangers (these clients are no peer's endpoint) may take
/// 12: shard 1 refuses the last eight (with a table per shard, all ten got
/// through).
#[test]
fn hub_max_indices_counts_every_shards_entries() {
    const EACH: u64 = 10;
    const MAX: u64 = 16;
    let (responder, received) = sink();
    let keys = [
        PublicKey::from_bytes([1; 32]),
        PublicKey::from_bytes([2; 32]),
    ];
    let relay = Relay::start(&Config {
        bounce: vec![],
        hub: Some(Hub {
            listen: vec![loopback()],
            // p1 has a fixed endpoint, so initiations to it are forwarded
            // (and each leaves a pending entry).
            peers: common::hub_peers(&keys, Some((1, responder))),
            max_indices: MAX as usize,
        }),
        tuning: tuning(),
        metrics_addr: None,
    })
    .unwrap();
    let at = relay.bound()[0].1;
    let m = relay.metrics().clone();
    let on0 = hub_client_on(&m, at, 0);
    let on1 = hub_client_on(&m, at, 1);
    for i in 0..EACH as u32 {
        on0.send_to(&initiation(0x100 + i, &keys[1]), at).unwrap();
    }
    // Shard 0 queues its entries to shard 1 before it forwards the
    // datagrams, and shard 1 takes them in before its next batch.
    wait_for("shard 0's initiations at p1", || {
        received.load(Ordering::Relaxed) == EACH
    });
    assert_eq!(m.shards[0].drops(Drop::Hub(DropReason::TableFull)), 0);
    for i in 0..EACH as u32 {
        on1.send_to(&initiation(0x200 + i, &keys[1]), at).unwrap();
    }
    let full = || m.shards[1].drops(Drop::Hub(DropReason::TableFull));
    wait_for("shard 1's initiations forwarded or refused", || {
        received.load(Ordering::Relaxed) + full() == 2 * EACH
    });
    let strangers = MAX - MAX / STRANGER_RESERVE as u64;
    assert_eq!(received.load(Ordering::Relaxed), strangers);
    assert_eq!(full(), 2 * EACH - strangers);
    relay.shutdown();
}
