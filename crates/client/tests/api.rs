//! The SDK as a program that depends on `ferry-client` alone sees it (no
//! `ferry-proto` import here): keys and limits from the crate root, one
//! switch for relay sessions, a peer's DERP server checked, typed send
//! errors, a `send` that waits for room beside a `try_send` that does
//! not, received datagrams with their peer and path, and events with the
//! wall-clock time that tell a lagging subscriber how many it missed.

mod support;

use ferry_client::{
    AddPeerError, BackoffOptions, Datagram, Datagrams, DerpServerOptions, Endpoint,
    EndpointOptions, EventKind, NodePrivate, NodePublic, Options, PathAddr, PathKind, PeerOptions,
    SendError, MAX_DATAGRAM, MAX_DERP_DATAGRAM,
};
use std::time::{Duration, SystemTime};
use support::{Kind, SessionRelay, TestServer};

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);

fn server(url: &str) -> DerpServerOptions {
    let mut o = Options::default();
    o.backoff =
        BackoffOptions::new(Duration::from_millis(50), Duration::from_millis(200)).with_seed(1);
    // Nothing listens there: no STUN.
    DerpServerOptions::new("test", url)
        .with_options(o)
        .with_stun("127.0.0.1:9".parse().unwrap())
}

fn options(server: DerpServerOptions) -> EndpointOptions {
    let mut o = EndpointOptions::new(NodePrivate::generate(), vec![server]);
    o.bind = "127.0.0.1:0".parse().unwrap();
    o
}

/// Waits until `e`'s DERP server is connected.
async fn connected(e: &Endpoint) {
    let deadline = tokio::time::Instant::now() + QUICK;
    while !e.relay_status()[0].connected {
        assert!(tokio::time::Instant::now() < deadline, "DERP not up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn recv(e: &Endpoint) -> Datagram {
    tokio::time::timeout(QUICK, e.recv())
        .await
        .expect("a datagram within the bound")
        .expect("endpoint open")
}

/// Two endpoints whose peers go over DERP alone, `queue` datagrams of
/// room towards the server.
async fn derp_pair(url: &str, queue: usize) -> (Endpoint, Endpoint) {
    let mut oa = options(server(url));
    oa.queue = queue;
    let a = Endpoint::bind(oa).await.expect("bind a");
    let b = Endpoint::bind(options(server(url))).await.expect("bind b");
    let only = PeerOptions::new().only(PathKind::Derp);
    a.add_peer(b.public_key(), only).unwrap();
    b.add_peer(a.public_key(), only).unwrap();
    connected(&a).await;
    connected(&b).await;
    (a, b)
}

#[test]
fn the_limits_every_path_and_derp_carry() {
    assert_eq!(MAX_DATAGRAM, 65_499);
    assert_eq!(MAX_DERP_DATAGRAM, 65_528);
    let derp = PathAddr::Derp.mtu();
    assert_eq!(
        (derp.max, derp.unfragmented),
        (MAX_DERP_DATAGRAM, MAX_DERP_DATAGRAM)
    );
    let direct = PathAddr::Direct("192.0.2.1:1".parse().unwrap()).mtu();
    assert_eq!((direct.max, direct.unfragmented), (MAX_DATAGRAM, 1464));
}

/// One switch: the DERP client's [`Options::relay_sessions`], on by
/// default; off for one server, the endpoint gets no relay sessions
/// from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sessions_are_one_switch_on_by_default() {
    assert!(Options::default().relay_sessions);
    assert!(
        DerpServerOptions::new("x", "http://127.0.0.1:1/derp")
            .options
            .relay_sessions
    );
    let relay = SessionRelay::start();
    let on = Endpoint::bind(options(server(&relay.url))).await.unwrap();
    let mut off_server = server(&relay.url);
    off_server.options.relay_sessions = false;
    let off = Endpoint::bind(options(off_server)).await.unwrap();
    connected(&on).await;
    connected(&off).await;
    assert!(on.relay_status()[0].relay_port.is_some());
    assert_eq!(off.relay_status()[0].relay_port, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_on_a_derp_server_that_does_not_exist_is_refused() {
    // Nothing listens: the endpoint binds and retries in the background.
    let e = Endpoint::bind(options(server("http://127.0.0.1:9/derp")))
        .await
        .unwrap();
    let peer: NodePublic = NodePrivate::generate().public();
    assert_eq!(
        e.add_peer(peer, PeerOptions::new().relay(1)),
        Err(AddPeerError::UnknownRelay {
            relay: 1,
            relays: 1
        })
    );
    assert!(e.peer_status(&peer).is_none(), "not added");
    assert_eq!(e.try_send(&peer, b"x"), Err(SendError::UnknownPeer));
    e.add_peer(peer, PeerOptions::new().relay(0)).unwrap();
    assert!(e.peer_status(&peer).is_some());
}

/// On a current-thread runtime nothing drains the DERP queue while the
/// test runs without awaiting, so a queue of one is full after one
/// datagram: `try_send` says so, `send` waits and every datagram
/// arrives, in order, with its peer and path.
#[tokio::test(flavor = "current_thread")]
async fn send_waits_for_room_where_try_send_finds_the_queue_full() {
    let server = TestServer::start(Kind::Ferry, None);
    let (a, b) = derp_pair(&server.url(), 1).await;
    let (ka, kb) = (a.public_key(), b.public_key());
    a.try_send(&kb, &[0]).unwrap();
    assert_eq!(
        a.try_send(&kb, &[1]),
        Err(SendError::QueueFull {
            path: PathKind::Derp
        })
    );
    for i in 1..=100u8 {
        a.send(&kb, &[i]).await.expect("send waits for room");
    }
    for i in 0..=100u8 {
        let d = recv(&b).await;
        assert_eq!((d.peer, d.path, d.data), (ka, PathAddr::Derp, vec![i]));
    }
    // Batches alike: the non-waiting one sends what fits.
    let mut batch = Datagrams::new();
    for i in 0..5u8 {
        batch.push(&kb, &[i]);
    }
    let r = a.try_send_batch(&mut batch);
    assert_eq!((r.sent, r.queue_full, r.failed()), (1, 4, 4), "{r:?}");
    let r = a.send_batch(&mut batch).await;
    assert_eq!((r.sent, r.failed()), (5, 0), "{r:?}");
    for i in [0u8, 0, 1, 2, 3, 4] {
        assert_eq!(recv(&b).await.data, vec![i]);
    }
    // Failed sends are counted: one QueueFull, four in the batch.
    assert_eq!(a.stats().send_dropped, 5);
    let totals = a.peer_status(&kb).unwrap().totals;
    assert_eq!(totals.derp.tx_packets, 101 + 6, "{totals:?}");
}

/// DERP carries more than a UDP path: up to [`MAX_DERP_DATAGRAM`]
/// bytes, whole; one byte more is refused with the path's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derp_takes_its_limit_and_refuses_one_byte_more() {
    let server = TestServer::start(Kind::Ferry, None);
    let (a, b) = derp_pair(&server.url(), 64).await;
    let kb = b.public_key();
    let big: Vec<u8> = (0..MAX_DERP_DATAGRAM).map(|i| i as u8).collect();
    a.send(&kb, &big).await.unwrap();
    assert_eq!(recv(&b).await.data, big);
    let over = vec![0; MAX_DERP_DATAGRAM + 1];
    let refused = Err(SendError::TooLarge {
        len: MAX_DERP_DATAGRAM + 1,
        max: MAX_DERP_DATAGRAM,
        path: PathKind::Derp,
    });
    assert_eq!(a.try_send(&kb, &over), refused);
    assert_eq!(a.send(&kb, &over).await, refused);
}

/// A subscription that falls behind by more than its queue is told how
/// many events it missed, then gets the newest in order; each event has
/// the wall-clock time it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_subscriber_is_told_how_many_events_it_missed() {
    let before = SystemTime::now();
    // Nothing listens: every attempt to connect fails, an event each.
    let mut o = options(server("http://127.0.0.1:9/derp"));
    o.event_queue = 2;
    let e = Endpoint::bind(o).await.unwrap();
    let mut fast = e.events();
    let mut slow = e.events();
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + QUICK;
    while seen < 6 {
        let ev = tokio::time::timeout_at(deadline, fast.recv())
            .await
            .expect("six failed attempts within the bound")
            .expect("events go on");
        match ev.kind {
            EventKind::RelayDown { .. } => seen += 1,
            EventKind::Lagged { missed } => panic!("the reader lagged by {missed}"),
            _ => {}
        }
    }
    let first = slow.try_recv().expect("an event waiting");
    let EventKind::Lagged { missed } = first.kind else {
        panic!("not told it lagged: {first:?}");
    };
    assert!(missed >= 4, "missed {missed}");
    let next = slow.try_recv().expect("the newest events kept");
    assert!(matches!(next.kind, EventKind::RelayDown { .. }), "{next:?}");
    assert!(
        before <= next.at && next.at <= SystemTime::now(),
        "{next:?}"
    );
    e.close().await;
    let deadline = tokio::time::Instant::now() + QUICK;
    while tokio::time::timeout_at(deadline, slow.recv())
        .await
        .expect("the subscription ends after close")
        .is_some()
    {}
}
