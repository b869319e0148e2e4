//! Relay sessions end to end (`docs/relay-sessions.md`): `ferry
//! --relay-port` with two SDK clients on loopback that allocate a session
//! over DERP, bind it from real UDP sockets with the sans-IO `Binder`, and
//! pass datagrams both ways through it; a third socket's wrong token, wrong
//! VNI, wrong source and replayed answer are dropped and counted in the
//! metrics; an idle session is freed and its id then unknown; clients that
//! did not ask, and derper, see nothing of it. (The same across network
//! namespaces, with an attacker forging sources: `relay_sessions_netns.rs`.)

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_client::{DerpClient, Error, Event};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::relay_session::{BindKind, BindMsg, Binder, RefuseReason};
use support::sessions::{data, next, offer, options};
use support::{ferry, url_addr, Ferry, TempDir, T};
use tokio::net::UdpSocket;

/// `ferry` with relay sessions on a port the system picks, two shards (so
/// the two clients' datagrams may land on different ones) and `extra`
/// flags; returns the DERP URL, the session address and the metrics
/// address.
fn start(dir: &TempDir, extra: &[&str]) -> (Ferry, String, SocketAddr, SocketAddr) {
    let mut f = Ferry::spawn(
        ferry()
            .args(["-a", "127.0.0.1:0", "--stun=false", "--workers", "2"])
            .args(["-c", &dir.path("ferry.key")])
            .args(["--metrics-addr", "127.0.0.1:0", "--relay-port", "0"])
            .args(extra),
    );
    let relay: SocketAddr = f.field("relay sessions on", "addr").parse().unwrap();
    let url = f.field("ferry relay running", "url");
    let metrics = url_addr(&f.field("ferry relay running", "metrics"));
    (f, url, relay, metrics)
}

async fn refused(c: &mut DerpClient) -> (u32, NodePublic, RefuseReason) {
    next(c, |e| match e {
        Event::RelayRefused {
            request_id,
            peer,
            reason,
        } => Some((request_id, peer, reason)),
        _ => None,
    })
    .await
}

/// Runs `b` over `sock` until the relay says bound; bounded by [`T`].
async fn bind(sock: &UdpSocket, b: &mut Binder) {
    let deadline = Instant::now() + T;
    let mut buf = [0u8; 1500];
    while !b.is_bound() {
        assert!(Instant::now() < deadline && !b.is_failed(), "not bound");
        let now = Instant::now();
        if let Some(msg) = b.poll_transmit(now) {
            sock.send_to(&msg, b.relay()).await.unwrap();
        }
        let wait = b
            .poll_timeout()
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        if let Ok(r) = tokio::time::timeout(wait, sock.recv_from(&mut buf)).await {
            let (n, _) = r.unwrap();
            assert!(b.handle(Instant::now(), &buf[..n]), "a bind reply");
        }
    }
}

async fn recv(sock: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    let mut buf = [0u8; 1500];
    let (n, from) = tokio::time::timeout(T, sock.recv_from(&mut buf))
        .await
        .expect("a datagram within the deadline")
        .unwrap();
    (buf[..n].to_vec(), from)
}

/// One counter's value from the metrics page; a missing one fails the test.
fn metric(addr: SocketAddr, series: &str) -> u64 {
    ferry_testkit::metrics::Scrape::fetch(addr, "/metrics").value(series) as u64
}

/// Waits until the drop counter for `reason` reaches `n`; bounded.
fn wait_drops(addr: SocketAddr, reason: &str, n: u64) {
    let series = format!("ferry_udp_relay_session_drops_total{{reason=\"{reason}\"}}");
    let deadline = Instant::now() + T;
    while metric(addr, &series) < n {
        assert!(Instant::now() < deadline, "{series} stays below {n}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn two_clients_get_a_session_and_talk_through_it() {
    let dir = TempDir::new("relay-sessions");
    let (server, url, relay, metrics) = start(&dir, &[]);
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let mut a = DerpClient::connect(&url, ka.clone(), options(true))
        .await
        .unwrap();
    let mut b = DerpClient::connect(&url, kb.clone(), options(true))
        .await
        .unwrap();
    assert_eq!(a.relay_port(), Some(relay.port()));
    assert_eq!(b.relay_port(), Some(relay.port()));

    let id = a.allocate(&kb.public()).await.unwrap();
    let (oa, ob) = (offer(&mut a).await, offer(&mut b).await);
    assert_eq!((oa.request_id, oa.slot, oa.peer), (id, 0, kb.public()));
    assert_eq!((ob.request_id, ob.slot, ob.peer), (0, 1, ka.public()));
    assert_eq!(oa.vni, ob.vni);
    assert_ne!(oa.token, ob.token);
    assert_eq!(oa.bind_lifetime, Duration::from_secs(30));
    assert_eq!(oa.idle_lifetime, Duration::from_secs(60));
    let ra = a.relay_endpoint(&oa).unwrap();
    assert_eq!(ra, relay);
    // The peer asking again gets the same session and keeps its slot ...
    let again = b.allocate(&ka.public()).await.unwrap();
    let ob2 = offer(&mut b).await;
    assert_eq!((ob2.request_id, ob2.vni, ob2.slot), (again, ob.vni, 1));
    // ... and A, told already on this connection, hears nothing more (its
    // pong comes after anything queued for it before).
    a.ping().await.unwrap();
    let more = tokio::time::timeout(Duration::from_millis(100), offer(&mut a)).await;
    assert!(more.is_err(), "A was told again: {more:?}");

    let ua = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let ub = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut ba = Binder::new(&oa, ra, 1, Instant::now());
    let mut bb = Binder::new(&ob, b.relay_endpoint(&ob).unwrap(), 1, Instant::now());
    bind(&ua, &mut ba).await;
    bind(&ub, &mut bb).await;

    for i in 0..20u8 {
        let d = data(oa.vni, &[i; 100]);
        ua.send_to(&d, relay).await.unwrap();
        assert_eq!(recv(&ub).await, (d.clone(), relay));
        let back = data(oa.vni, &[i ^ 0xff; 1200]);
        ub.send_to(&back, relay).await.unwrap();
        assert_eq!(recv(&ua).await, (back, relay));
    }
    assert_eq!(
        metric(metrics, "ferry_udp_relay_session_forwarded_total"),
        40
    );
    assert_eq!(
        metric(metrics, "ferry_udp_relay_sessions{state=\"bound\"}"),
        1
    );

    // A third socket: a wrong token gets a challenge (to itself) but its
    // answer binds nothing.
    let uc = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut forged = oa.clone();
    forged.token = [7; 32];
    let mut bc = Binder::new(&forged, relay, 5, Instant::now());
    uc.send_to(&bc.poll_transmit(Instant::now()).unwrap(), relay)
        .await
        .unwrap();
    let (challenge, _) = recv(&uc).await;
    assert!(bc.handle(Instant::now(), &challenge));
    uc.send_to(&bc.poll_transmit(Instant::now()).unwrap(), relay)
        .await
        .unwrap();
    wait_drops(metrics, "bad_proof", 1);
    // A's genuine answer (a rebind it has not sent) replayed from C.
    let mut rebind = Binder::new(&oa, relay, 9, Instant::now());
    ua.send_to(&rebind.poll_transmit(Instant::now()).unwrap(), relay)
        .await
        .unwrap();
    let (challenge, _) = recv(&ua).await;
    assert!(rebind.handle(Instant::now(), &challenge));
    let answer = rebind.poll_transmit(Instant::now()).unwrap();
    assert_eq!(BindMsg::parse(&answer).unwrap().kind, BindKind::Answer);
    uc.send_to(&answer, relay).await.unwrap();
    wait_drops(metrics, "bad_cookie", 1);
    // Data with a wrong VNI, and with the right VNI from the wrong source.
    uc.send_to(&data(oa.vni ^ 0x1, b"x"), relay).await.unwrap();
    wait_drops(metrics, "unknown_vni", 1);
    uc.send_to(&data(oa.vni, b"x"), relay).await.unwrap();
    wait_drops(metrics, "wrong_source", 1);
    // None of it moved the session: A still reaches B, and only B.
    let d = data(oa.vni, b"still here");
    ua.send_to(&d, relay).await.unwrap();
    assert_eq!(recv(&ub).await.0, d);
    let d = data(oa.vni, b"and back");
    ub.send_to(&d, relay).await.unwrap();
    assert_eq!(recv(&ua).await.0, d);
    let mut buf = [0u8; 64];
    assert!(uc.try_recv_from(&mut buf).is_err(), "C got nothing more");

    // Refusals: oneself, a key that is not connected.
    let id = a.allocate(&ka.public()).await.unwrap();
    assert_eq!(
        refused(&mut a).await,
        (id, ka.public(), RefuseReason::SelfPeer)
    );
    let absent = NodePrivate::generate().public();
    let id = a.allocate(&absent).await.unwrap();
    assert_eq!(
        refused(&mut a).await,
        (id, absent, RefuseReason::PeerNotHere)
    );
    drop((a, b));
    server.stop();
}

#[tokio::test]
async fn an_idle_session_is_freed_and_its_id_then_unknown() {
    let dir = TempDir::new("relay-sessions-idle");
    let (server, url, relay, metrics) = start(&dir, &["--relay-idle-timeout", "1s"]);
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let mut a = DerpClient::connect(&url, ka, options(true)).await.unwrap();
    let mut b = DerpClient::connect(&url, kb.clone(), options(true))
        .await
        .unwrap();
    a.allocate(&kb.public()).await.unwrap();
    let (oa, ob) = (offer(&mut a).await, offer(&mut b).await);
    assert_eq!(oa.idle_lifetime, Duration::from_secs(1));
    let ua = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let ub = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    bind(&ua, &mut Binder::new(&oa, relay, 1, Instant::now())).await;
    bind(&ub, &mut Binder::new(&ob, relay, 1, Instant::now())).await;
    let d = data(oa.vni, b"last words");
    let last = Instant::now();
    ua.send_to(&d, relay).await.unwrap();
    assert_eq!(recv(&ub).await.0, d);

    // Quiet from here: the session is freed, not before its idle lifetime.
    let bound = "ferry_udp_relay_sessions{state=\"bound\"}";
    let deadline = Instant::now() + T;
    while metric(metrics, bound) != 0 {
        assert!(Instant::now() < deadline, "the session stays bound");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(last.elapsed() >= oa.idle_lifetime, "{:?}", last.elapsed());
    let freed = "ferry_udp_relay_session_events_total{event=\"freed_idle\"}";
    assert_eq!(metric(metrics, freed), 1);
    // Its id is unknown now: dropped and counted, B gets nothing.
    ua.send_to(&data(oa.vni, b"too late"), relay).await.unwrap();
    wait_drops(metrics, "unknown_vni", 1);
    let mut buf = [0u8; 64];
    assert!(ub.try_recv_from(&mut buf).is_err(), "B got nothing more");
    drop((a, b));
    server.stop();
}

#[tokio::test]
async fn clients_that_did_not_ask_see_nothing_and_are_refused_as_peers() {
    let dir = TempDir::new("relay-sessions-plain");
    let (server, url, _, metrics) = start(&dir, &[]);
    let (ka, kp) = (NodePrivate::generate(), NodePrivate::generate());
    let mut a = DerpClient::connect(&url, ka, options(true)).await.unwrap();
    let mut plain = DerpClient::connect(&url, kp.clone(), options(false))
        .await
        .unwrap();
    assert_eq!(plain.relay_port(), None);
    assert!(matches!(
        plain.allocate(&a.public_key()).await,
        Err(Error::NoRelaySessions)
    ));
    let id = a.allocate(&kp.public()).await.unwrap();
    assert_eq!(
        refused(&mut a).await,
        (id, kp.public(), RefuseReason::PeerNotCapable)
    );
    // DERP itself is unchanged for both.
    a.send(&kp.public(), b"hi".to_vec()).await.unwrap();
    let got = next(&mut plain, |e| match e {
        Event::Packet { src, data } => Some((src, data)),
        _ => None,
    })
    .await;
    assert_eq!(got, (a.public_key(), b"hi".to_vec()));
    assert_eq!(
        metric(
            metrics,
            "ferry_udp_relay_session_events_total{event=\"allocated\"}"
        ),
        0
    );
    drop((a, plain));
    server.stop();
}

/// derper, or a skip (a failure under CI) when it is not there.
fn derper_bin() -> Option<PathBuf> {
    let p = std::env::var_os("FERRY_DERPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/bin/derper"));
    if p.is_file() {
        return Some(p);
    }
    ferry_testkit::skip!(
        "no derper binary at {} (.ci/setup.d/10-derper.sh, or set FERRY_DERPER_BIN)",
        p.display()
    );
    None
}

struct Derper(Child);

impl Drop for Derper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn derper_offers_no_sessions_and_relays_as_before() {
    let Some(bin) = derper_bin() else { return };
    let dir = TempDir::new("relay-sessions-derper");
    let addr: SocketAddr = format!("127.0.0.1:{}", support::free_tcp_port())
        .parse()
        .unwrap();
    let _derper = Derper(
        Command::new(bin)
            .args(["-a", &addr.to_string(), "--http-port", "-1", "--stun=false"])
            .args(["-c", &dir.path("derper.key")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("derper starts"),
    );
    let url = format!("http://{addr}/derp");
    let deadline = Instant::now() + T;
    let ka = NodePrivate::generate();
    let a = loop {
        match DerpClient::connect(&url, ka.clone(), options(true)).await {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "derper not up: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut b = DerpClient::connect(&url, NodePrivate::generate(), options(true))
        .await
        .unwrap();
    assert_eq!(a.relay_port(), None);
    assert!(matches!(
        a.allocate(&b.public_key()).await,
        Err(Error::NoRelaySessions)
    ));
    a.send(&b.public_key(), b"hello".to_vec()).await.unwrap();
    let got = next(&mut b, |e| match e {
        Event::Packet { data, .. } => Some(data),
        _ => None,
    })
    .await;
    assert_eq!(got, b"hello");
}

/// `ferry --relay-port` over a path whose MTU is 1,500 bytes (a namespace
/// the test makes, whose loopback has that MTU): data datagrams of every
/// size from 9 bytes to the largest UDP payload, over-MTU ones with
/// shorter ones right after them and runs of equal ones, sent in bursts
/// both ways through a bound session, all arrive whole, and the relay
/// counts no send failure, full buffer or refused train.
#[test]
fn every_size_crosses_a_1500_byte_mtu_through_a_session() {
    let Some(ns) = ferry_testkit::netns::Netns::new("ferry-session-mtu", 1500) else {
        return;
    };
    ns.run(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(every_size_through_a_session())
    });
}

async fn every_size_through_a_session() {
    let dir = TempDir::new("relay-sessions-mtu");
    let (_server, url, relay, metrics) = start(&dir, &[]);
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let mut a = DerpClient::connect(&url, ka, options(true)).await.unwrap();
    let mut b = DerpClient::connect(&url, kb.clone(), options(true))
        .await
        .unwrap();
    a.allocate(&kb.public()).await.unwrap();
    let (oa, ob) = (offer(&mut a).await, offer(&mut b).await);
    let socket = || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = socket2::SockRef::from(&s);
        r.set_recv_buffer_size(4 << 20).unwrap();
        r.set_send_buffer_size(4 << 20).unwrap();
        s.set_nonblocking(true).unwrap();
        UdpSocket::from_std(s).unwrap()
    };
    let (ua, ub) = (socket(), socket());
    bind(&ua, &mut Binder::new(&oa, relay, 1, Instant::now())).await;
    bind(&ub, &mut Binder::new(&ob, relay, 1, Instant::now())).await;
    let sizes = ferry_testkit::udp::mixed_sizes(1, 65_507 - 8);
    for (round, (from, to)) in [(&ua, &ub), (&ub, &ua), (&ua, &ub)].into_iter().enumerate() {
        let mut want: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let body: Vec<u8> = (0..n).map(|j| (round * 31 + i * 7 + j) as u8).collect();
                data(oa.vni, &body)
            })
            .collect();
        ferry_testkit::udp::send_burst(from, relay, &want);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        while got.len() < want.len() {
            let (n, _) = tokio::time::timeout(T, to.recv_from(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!("round {round}: {} of {} arrived", got.len(), want.len())
                })
                .unwrap();
            got.push(buf[..n].to_vec());
        }
        got.sort();
        want.sort();
        assert!(got == want, "round {round}: the datagrams differ");
    }
    for reason in ["send_failed", "send_buffer_full", "truncated"] {
        let series = format!("ferry_udp_drops_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(metrics, &series), 0, "{series}");
    }
    assert_eq!(metric(metrics, "ferry_udp_gso_fallbacks_total"), 0);
}
