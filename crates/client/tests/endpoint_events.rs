//! The endpoint when relays and peers come and go: a relay that is down
//! at bind does not fail it (retried in the background, its state in
//! `relay_status`, each failure an event), DERP and relay sessions start
//! once it is up; a peer that leaves its relay is reported gone, and back
//! when it returns; events tell all of it. And an endpoint bound to
//! `[::]` is dual-stack: it announces IPv4 candidates besides IPv6 ones
//! and reaches an IPv4-only peer directly.

mod support;

use ferry_client::{
    BackoffOptions, Datagram, DerpServerOptions, Endpoint, EndpointOptions, EventKind, Events,
    Options, PathKind, PeerOptions,
};
use ferry_proto::key::NodePrivate;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{kinds, Kind, SessionRelay, TestServer};
use tokio::net::{TcpListener, TcpStream};

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);

fn options(url: &str, key: NodePrivate) -> EndpointOptions {
    options_at(url, key, "127.0.0.1:0")
}

fn options_at(url: &str, key: NodePrivate, bind: &str) -> EndpointOptions {
    let mut r = DerpServerOptions::new("test", url);
    let mut o = Options::default();
    o.backoff =
        BackoffOptions::new(Duration::from_millis(50), Duration::from_millis(1600)).with_seed(1);
    r.options = o;
    // Nothing listens there: no STUN.
    r.stun = Some("127.0.0.1:9".parse().unwrap());
    let mut e = EndpointOptions::new(key, vec![r]);
    e.bind = bind.parse().unwrap();
    e
}

/// The next event `want` accepts, within `limit` (others are skipped).
async fn event(
    rx: &mut Events,
    limit: Duration,
    what: &str,
    want: impl Fn(&EventKind) -> bool,
) -> EventKind {
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = Vec::new();
    for _ in 0..10_000 {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) if want(&e.kind) => return e.kind,
            Ok(Some(e)) => seen.push(e),
            Ok(None) => panic!("{what}: events ended"),
            Err(_) => panic!("no {what} within {limit:?}; saw {seen:?}"),
        }
    }
    panic!("no {what} among 10000 events");
}

/// Two endpoints on the relay at `url`, peers of nobody yet, with their
/// keys, and a subscription to A's events made before B binds.
async fn two_on(url: &str) -> (NodePrivate, NodePrivate, Endpoint, Events, Endpoint) {
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let a = Endpoint::bind(options(url, ka.clone())).await.unwrap();
    let events = a.events();
    let b = Endpoint::bind(options(url, kb.clone())).await.unwrap();
    (ka, kb, a, events, b)
}

/// Sends numbered datagrams from `a` to `to` until `b` gets one from `a`.
async fn delivered(a: &Endpoint, b: &Endpoint, what: &str) {
    let (ka, kb) = (a.public_key(), b.public_key());
    let deadline = tokio::time::Instant::now() + QUICK;
    for n in 0u32.. {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: nothing arrived; {:?}",
            a.relay_status()
        );
        let _ = a.try_send(&kb, &n.to_be_bytes());
        if let Ok(Ok(Datagram { peer: from, .. })) =
            tokio::time::timeout(Duration::from_millis(100), b.recv()).await
        {
            assert_eq!(from, ka);
            return;
        }
    }
}

/// A relay that is down when the endpoints bind: the bind succeeds, the
/// failed attempts are events and show in `relay_status` with their
/// error and next attempt, spaced by the backoff; once the relay starts,
/// the connection comes up by itself and DERP carries datagrams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_late_is_connected_in_the_background() {
    for kind in kinds() {
        let mut server = TestServer::start(kind, None);
        server.stop();
        let url = server.url();
        let only_derp = PeerOptions::new().only(PathKind::Derp);
        let a = Endpoint::bind(options(&url, NodePrivate::generate()))
            .await
            .expect("bind succeeds with the relay down");
        let mut events = a.events();
        let b = Endpoint::bind(options(&url, NodePrivate::generate()))
            .await
            .expect("bind succeeds with the relay down");
        a.add_peer(b.public_key(), only_derp).unwrap();
        b.add_peer(a.public_key(), only_derp).unwrap();
        let downs: Vec<Duration> = {
            let mut d = Vec::new();
            for _ in 0..3 {
                let EventKind::RelayDown {
                    relay,
                    retry_in,
                    was_up,
                    error,
                } = event(&mut events, QUICK, "a failed attempt", |e| {
                    matches!(e, EventKind::RelayDown { .. })
                })
                .await
                else {
                    unreachable!()
                };
                assert_eq!((relay, was_up), (0, false), "{kind:?}");
                assert!(!error.is_empty());
                d.push(retry_in);
            }
            d
        };
        // Equal jitter: attempt n waits within [½, 1] of the nominal
        // delay 50·2ⁿ ms, so below the cap each wait is at least the one
        // before and two attempts later at least twice as long (the first
        // attempts may have passed before the subscription).
        assert!(
            downs.windows(2).all(|w| w[1] >= w[0]),
            "{kind:?}: {downs:?}"
        );
        assert!(
            downs[2] >= downs[0] * 2,
            "{kind:?}: not doubling: {downs:?}"
        );
        assert!(downs.iter().all(|d| *d <= Duration::from_millis(1600)));
        let st = &a.relay_status()[0];
        assert!(!st.connected, "{kind:?}: {st:?}");
        assert!(st.failures >= 3, "{kind:?}: {st:?}");
        assert!(st.last_error.is_some(), "{kind:?}: {st:?}");
        assert!(st.next_attempt.is_some(), "{kind:?}: {st:?}");
        assert_eq!(st.connects, 0);
        // Over DERP with the relay down: dropped and counted.
        let _ = a.try_send(&b.public_key(), b"nowhere");
        let deadline = tokio::time::Instant::now() + QUICK;
        while a.stats().send_dropped == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{kind:?}: not counted"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        server.restart();
        event(&mut events, QUICK, "the relay up", |e| {
            matches!(e, EventKind::RelayUp { relay: 0, .. })
        })
        .await;
        let st = &a.relay_status()[0];
        assert!(st.connected, "{kind:?}: {st:?}");
        assert_eq!((st.connects, st.last_error.as_deref()), (1, None));
        assert_eq!(st.next_attempt, None);
        delivered(&a, &b, &format!("{kind:?}: a to b")).await;
        delivered(&b, &a, &format!("{kind:?}: b to a")).await;
    }
}

/// A TCP port that refuses service (accepts and closes at once) until
/// opened, then forwards to `upstream`: a relay unreachable at first.
struct Gate {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    async fn start(upstream: SocketAddr) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(false));
        let is_open = open.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !is_open.load(Ordering::SeqCst) {
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Gate { addr, open, task }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A relay with sessions, unreachable at bind: once it is reached, the
/// endpoints learn its session port and the peers get a relay-session
/// path (under `only` relay, the only way anything arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sessions_start_once_a_late_relay_is_up() {
    let relay = SessionRelay::start();
    let upstream: SocketAddr = relay
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/derp")
        .parse()
        .unwrap();
    let gate = Gate::start(upstream).await;
    let url = format!("http://{}/derp", gate.addr);
    let only = PeerOptions::new().only(PathKind::RelaySession);
    let a = Endpoint::bind(options(&url, NodePrivate::generate()))
        .await
        .unwrap();
    let b = Endpoint::bind(options(&url, NodePrivate::generate()))
        .await
        .unwrap();
    let mut events = a.events();
    a.add_peer(b.public_key(), only).unwrap();
    b.add_peer(a.public_key(), only).unwrap();
    event(&mut events, QUICK, "a failed attempt", |e| {
        matches!(e, EventKind::RelayDown { was_up: false, .. })
    })
    .await;
    assert_eq!(a.relay_status()[0].relay_port, None);
    gate.open.store(true, Ordering::SeqCst);
    let EventKind::RelayUp { relay_port, .. } = event(&mut events, QUICK, "the relay up", |e| {
        matches!(e, EventKind::RelayUp { .. })
    })
    .await
    else {
        unreachable!()
    };
    assert!(relay_port.is_some());
    let kb = b.public_key();
    event(&mut events, QUICK, "a relay-session path", |e| {
        matches!(e, EventKind::Path(p) if p.peer == kb && p.to.map(|t| t.kind()) == Some(PathKind::RelaySession))
    })
    .await;
    delivered(&a, &b, "over the relay session").await;
}

/// A peer that leaves its relay is reported gone (the relay's peerGone),
/// once; when it comes back with the same key, its first authenticated
/// message reports it present. Against Ferry and derper.
///
/// Both relays send peerGone for a client that left only to the clients
/// that received packets from it (derper: a watcher its send loop
/// registers for each source it wrote a packet from; Ferry: the receivers
/// of a key). So B first sends to A, and A gets it, before B leaves. (B's
/// own first ping over DERP does not do: it goes out as soon as B's
/// connection is up, and is dropped when A's is not registered yet, which
/// against derper, slower to register a client than the in-process Ferry,
/// happened in about one run in five under load.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_leaving_its_relay_is_gone_then_present() {
    for kind in kinds() {
        let server = TestServer::start(kind, None);
        let url = server.url();
        let (ka, kb, a, mut events, b) = two_on(&url).await;
        let only_derp = PeerOptions::new().only(PathKind::Derp);
        a.add_peer(kb.public(), only_derp).unwrap();
        b.add_peer(ka.public(), only_derp).unwrap();
        delivered(&a, &b, &format!("{kind:?}")).await;
        // A received from B: the relay will tell A when B leaves.
        delivered(&b, &a, &format!("{kind:?}: back")).await;
        drop(b);
        let pk = kb.public();
        event(
            &mut events,
            QUICK,
            &format!("{kind:?}: peerGone"),
            |e| matches!(e, EventKind::PeerGone { peer, .. } if *peer == pk),
        )
        .await;
        let b = Endpoint::bind(options(&url, kb.clone())).await.unwrap();
        b.add_peer(ka.public(), only_derp).unwrap();
        event(
            &mut events,
            QUICK,
            "the peer present",
            |e| matches!(e, EventKind::PeerPresent { peer } if *peer == pk),
        )
        .await;
        delivered(&a, &b, &format!("{kind:?}: again")).await;
        drop(b);
    }
}

/// A's side has a wrong key for B (B runs with another link key than A
/// was given): what B sends over DERP names B's real key in one event,
/// however much B keeps sending; the rest is counted as rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_with_an_unknown_key_is_reported_once() {
    for kind in kinds() {
        let server = TestServer::start(kind, None);
        let url = server.url();
        let (ka, kb, a, mut events, b) = two_on(&url).await;
        let only_derp = PeerOptions::new().only(PathKind::Derp);
        a.add_peer(NodePrivate::generate().public(), only_derp)
            .unwrap();
        b.add_peer(ka.public(), only_derp).unwrap();
        let pk = kb.public();
        let deadline = tokio::time::Instant::now() + QUICK;
        let mut sent = 0u32;
        let reported = loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{kind:?}: no UnknownSender for B after {sent} datagrams; {:?}",
                a.stats().rejected
            );
            let _ = b.try_send(&ka.public(), &sent.to_be_bytes());
            sent += 1;
            match tokio::time::timeout(Duration::from_millis(100), events.recv()).await {
                Ok(Some(e)) => match e.kind {
                    EventKind::UnknownSender { key } => break key,
                    _ => continue,
                },
                Ok(None) => panic!("events ended"),
                Err(_) => continue,
            }
        };
        assert_eq!(reported, pk, "{kind:?}: the event names B's real key");
        // More from B: counted, not reported again.
        let before = a.stats().rejected.total();
        let deadline = tokio::time::Instant::now() + QUICK;
        while a.stats().rejected.total() < before + 20 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{kind:?}: B's datagrams not counted"
            );
            let _ = b.try_send(&ka.public(), &sent.to_be_bytes());
            sent += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while let Ok(Some(e)) =
            tokio::time::timeout(Duration::from_millis(200), events.recv()).await
        {
            assert!(
                !matches!(e.kind, EventKind::UnknownSender { .. }),
                "{kind:?}: reported twice: {e:?}"
            );
        }
    }
}

/// Bound to `[::]`: IPv4 candidates announced, an IPv4-only peer reached
/// directly both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_ipv6_endpoint_is_dual_stack() {
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        return ferry_testkit::skip!("no IPv6 on this host ({e})");
    }
    let server = TestServer::start(Kind::Ferry, None);
    let a = Endpoint::bind(options_at(&server.url(), NodePrivate::generate(), "[::]:0"))
        .await
        .unwrap();
    let b = Endpoint::bind(options(&server.url(), NodePrivate::generate()))
        .await
        .unwrap();
    let candidates = a.local_candidates();
    assert!(
        candidates.iter().any(|c| c.is_ipv4()),
        "no IPv4 candidate: {candidates:?}"
    );
    assert!(candidates.iter().all(|c| c.port() == a.local_addr().port()));
    let (ka, kb) = (a.public_key(), b.public_key());
    a.add_peer(kb, PeerOptions::default()).unwrap();
    b.add_peer(ka, PeerOptions::default()).unwrap();
    let deadline = tokio::time::Instant::now() + QUICK;
    loop {
        let on = |e: &Endpoint, k| e.peer_status(k).unwrap().active.map(|p| p.kind());
        if on(&a, &kb) == Some(PathKind::Direct) && on(&b, &ka) == Some(PathKind::Direct) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not direct: a {:?}, b {:?}",
            a.peer_status(&kb),
            b.peer_status(&ka)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.try_send(&kb, b"over IPv4 from [::]").unwrap();
    let Datagram {
        peer: from, data, ..
    } = tokio::time::timeout(QUICK, b.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((from, data.as_slice()), (ka, &b"over IPv4 from [::]"[..]));
    b.try_send(&ka, b"back").unwrap();
    let Datagram {
        peer: from, data, ..
    } = tokio::time::timeout(QUICK, a.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((from, data.as_slice()), (kb, &b"back"[..]));
}
