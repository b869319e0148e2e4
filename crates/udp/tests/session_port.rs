//! The relay-session port in process on loopback, on one shard: what bind
//! messages from strangers cost the session table's lock (which every
//! shard and the DERP side share) and the per-source limit on binds and
//! answers.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::{BindKind, BindMsg};
use ferry_testkit::wait::eventually;
use ferry_udp::config::Tuning;
use ferry_udp::session::{Limits, Sessions};
use ferry_udp::Relay;

fn key(b: u8) -> NodePublic {
    NodePublic([b; 32])
}

/// Relay sessions on one shard on loopback, with `limits`; the session
/// port's address.
fn start(limits: Limits) -> (Relay, Arc<Sessions>, SocketAddr) {
    let sessions = Arc::new(Sessions::new(limits));
    let tuning = Tuning {
        workers: 1,
        pin: false,
        ..Tuning::default()
    };
    let relay = Relay::start_sessions(
        "--relay-port",
        "127.0.0.1:0".parse().unwrap(),
        sessions.clone(),
        tuning,
    )
    .expect("relay sessions start");
    let port = sessions.bound().expect("bound");
    (relay, sessions, port)
}

/// A session between two keys; its VNI.
fn one_session(sessions: &Sessions) -> u32 {
    let ip = "127.0.0.1".parse().unwrap();
    let al = sessions
        .lock()
        .allocate(&key(1), &key(2), ip, Instant::now());
    al.expect("a session").vni
}

/// `n` answers for session `vni`, slot 0, whose cookies are not the
/// relay's.
fn bad_answers(vni: u32, n: usize) -> Vec<[u8; 78]> {
    (0..n)
        .map(|i| {
            let mut m = BindMsg::new(BindKind::Answer, vni, 0, 1);
            m.cookie = [i as u8; 32];
            m.proof = [7; 32];
            m.to_bytes()
        })
        .collect()
}

/// The value of `series` in the table's metrics; a missing series fails.
fn table_metric(sessions: &Sessions, series: &str) -> u64 {
    let mut text = String::new();
    sessions.render(&mut text);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(n, _)| *n == series)
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
        .1
        .parse()
        .unwrap()
}

/// Answers whose cookie is not the relay's are judged (dropped and
/// counted) without the session table's lock: a flood of them cannot keep
/// the lock that every shard's forwarding needs busy. Here the lock is
/// held by the test the whole time the answers arrive; the shard takes
/// and judges them all the same.
#[test]
fn bad_answers_are_judged_without_the_table_lock() {
    let (relay, sessions, port) = start(Limits::default());
    let vni = one_session(&sessions);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    const N: usize = 100;
    let held = sessions.lock();
    for m in bad_answers(vni, N) {
        sock.send_to(&m, port).unwrap();
    }
    let taken = || relay.metrics().sum(|s| s.relay_session_in.packets.get());
    let judged = eventually(Duration::from_secs(5), || taken() >= N as u64);
    let got = taken();
    drop(held);
    assert!(
        judged,
        "the shard waited for the table lock: {got} of {N} answers taken in 5 s"
    );
    let series = "ferry_udp_relay_session_drops_total{reason=\"bad_cookie\"}";
    assert!(
        eventually(Duration::from_secs(5), || table_metric(&sessions, series)
            == N as u64),
        "{series}: {}",
        table_metric(&sessions, series)
    );
    relay.shutdown();
}

/// Binds and answers from one source beyond its rate are dropped before
/// any MAC is computed, and counted as `rate_limited`.
#[test]
fn binds_and_answers_from_one_source_are_rate_limited() {
    let limits = Limits {
        bind_rate: 10,
        bind_burst: 20,
        ..Limits::default()
    };
    let (relay, sessions, port) = start(limits);
    let vni = one_session(&sessions);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    const N: u64 = 200;
    for m in bad_answers(vni, N as usize) {
        sock.send_to(&m, port).unwrap();
    }
    let taken = || relay.metrics().sum(|s| s.relay_session_in.packets.get());
    assert!(eventually(Duration::from_secs(5), || taken() >= N));
    let limited = "ferry_udp_relay_session_drops_total{reason=\"rate_limited\"}";
    let bad = "ferry_udp_relay_session_drops_total{reason=\"bad_cookie\"}";
    assert!(eventually(Duration::from_secs(5), || table_metric(
        &sessions, limited
    ) + table_metric(
        &sessions, bad
    ) == N));
    // The burst, and what refilled while the answers arrived.
    let judged = table_metric(&sessions, bad);
    assert!(
        (20..=40).contains(&judged),
        "{judged} answers got their cookie checked"
    );
    // Another source has a bucket of its own.
    let other = UdpSocket::bind("127.0.0.2:0").unwrap();
    let mut bind = BindMsg::new(BindKind::Bind, vni, 0, 1).to_bytes();
    other.send_to(&bind, port).unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let (n, from) = other.recv_from(&mut bind).expect("a challenge");
    assert_eq!((n, from), (78, port));
    assert_eq!(BindMsg::parse(&bind).unwrap().kind, BindKind::Challenge);
    relay.shutdown();
}
