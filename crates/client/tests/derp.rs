//! The SDK's DERP client against Ferry and Tailscale's derper in the same
//! run (see `support` for how each is started): handshake, relay both
//! ways, ping, peerGone, reconnect after a restart, `restarting` honoured,
//! and all of it over TLS with a test CA.

mod support;

use ferry_client::{BackoffOptions, DerpClient, Error, Event, Options};
use ferry_proto::frame::PeerGoneReason;
use ferry_proto::key::NodePrivate;
use std::sync::Arc;
use std::time::Duration;
use support::{kinds, wait_for, Kind, TestCa, TestServer};

/// Generous bound for anything that should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);

fn options(tls: Option<&TestCa>) -> Options {
    let mut o = Options::default();
    if let Some(ca) = tls {
        o.tls_roots = ca.roots();
    }
    o.backoff = BackoffOptions {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(500),
        seed: Some(1),
    };
    o
}

async fn connect(server: &TestServer, tls: Option<&TestCa>) -> DerpClient {
    let mut c = DerpClient::connect(&server.url(), NodePrivate::generate(), options(tls))
        .await
        .unwrap_or_else(|e| panic!("{:?}: connect to {}: {e}", server.kind, server.url()));
    let (first, _) = wait_for(&mut c, QUICK, "Connected", |_| true).await;
    match first {
        Event::Connected { server_key, .. } => assert_eq!(Some(server_key), c.server_key()),
        other => panic!("first event {other:?}"),
    }
    c
}

/// Sends `data` from `a` to `b` and checks it arrives from `a`.
async fn relay(a: &DerpClient, b: &mut DerpClient, data: &[u8]) {
    a.send(&b.public_key(), data.to_vec()).await.unwrap();
    let src = a.public_key();
    let (got, _) = wait_for(b, QUICK, "the packet", |e| {
        matches!(e, Event::Packet { .. })
    })
    .await;
    match got {
        Event::Packet { src: s, data: d } => {
            assert_eq!(s, src);
            assert_eq!(d, data);
        }
        _ => unreachable!(),
    }
}

/// A client can send to itself: the quickest check that frames flow.
async fn relay_to_self(c: &mut DerpClient) {
    let me = c.public_key();
    c.send(&me, b"self".to_vec()).await.unwrap();
    let (e, _) = wait_for(c, QUICK, "own packet", |e| {
        matches!(e, Event::Packet { .. })
    })
    .await;
    assert!(matches!(e, Event::Packet { src, data } if src == me && data == b"self"));
}

async fn handshake_relay_ping_and_peer_gone(kind: Kind, tls: Option<Arc<TestCa>>) {
    let server = TestServer::start(kind, tls.clone());
    let ca = tls.as_deref();
    let mut a = connect(&server, ca).await;
    let mut b = connect(&server, ca).await;
    assert!(a.is_connected() && b.is_connected());
    assert_eq!(a.server_key(), b.server_key());

    relay(&a, &mut b, b"from a to b").await;
    relay(&b, &mut a, b"from b to a").await;
    let big = vec![0x5a; 60_000];
    relay(&a, &mut b, &big).await;

    let rtt = a.ping().await.unwrap();
    assert!(rtt > Duration::ZERO && rtt < QUICK, "{kind:?}: rtt {rtt:?}");
    let (pong, _) = wait_for(&mut a, QUICK, "Pong", |e| matches!(e, Event::Pong { .. })).await;
    assert!(
        matches!(pong, Event::Pong { rtt: r } if r == rtt),
        "{pong:?}"
    );

    // A sent to B, so the server tells A when B leaves.
    let gone = b.public_key();
    b.close().await;
    let (e, _) = wait_for(&mut a, QUICK, "PeerGone", |e| {
        matches!(e, Event::PeerGone { .. })
    })
    .await;
    match e {
        Event::PeerGone { peer, reason } => {
            assert_eq!(peer, gone);
            assert_eq!(reason, PeerGoneReason::Disconnected);
        }
        _ => unreachable!(),
    }
    assert_eq!(a.stats().connects, 1);
}

#[tokio::test]
async fn handshake_relay_ping_peer_gone() {
    for kind in kinds() {
        handshake_relay_ping_and_peer_gone(kind, None).await;
    }
}

#[tokio::test]
async fn over_tls_with_fast_start() {
    let ca = TestCa::new();
    for kind in kinds() {
        let server = TestServer::start(kind, Some(ca.clone()));
        // Both serve the meta-certificate over TLS 1.3: fast start; and
        // without it, the classic upgrade.
        for fast_start in [true, false] {
            let mut o = options(Some(&ca));
            o.fast_start = fast_start;
            let mut c = DerpClient::connect(&server.url(), NodePrivate::generate(), o)
                .await
                .unwrap();
            let (e, _) = wait_for(&mut c, QUICK, "Connected", |_| true).await;
            assert!(
                matches!(e, Event::Connected { fast_start: f, .. } if f == fast_start),
                "{kind:?}: {e:?}"
            );
            relay_to_self(&mut c).await;
        }
        // A certificate from a CA the client does not trust is refused.
        let err = DerpClient::connect(&server.url(), NodePrivate::generate(), Options::default())
            .await
            .expect_err("the test CA is not a system root");
        assert!(
            matches!(err, Error::Tls { .. } | Error::TlsSetup { .. }),
            "{kind:?}: {err}"
        );
        drop(server);
        handshake_relay_ping_and_peer_gone(kind, Some(ca.clone())).await;
    }
}

#[tokio::test]
async fn reconnects_after_a_server_restart() {
    for kind in kinds() {
        let mut server = TestServer::start(kind, None);
        let mut a = connect(&server, None).await;
        let mut b = connect(&server, None).await;
        relay(&a, &mut b, b"before").await;
        let key = a.server_key();

        server.restart();
        for c in [&mut a, &mut b] {
            let (e, before) = wait_for(c, Duration::from_secs(20), "reconnect", |e| {
                matches!(e, Event::Connected { .. })
            })
            .await;
            assert!(
                before
                    .iter()
                    .any(|e| matches!(e, Event::Disconnected { .. })),
                "{kind:?}: {before:?}"
            );
            assert!(matches!(e, Event::Connected { server_key, .. } if Some(server_key) == key));
            assert_eq!(c.stats().connects, 2);
        }
        // While the client was away, sends were refused rather than lost.
        relay(&a, &mut b, b"after").await;
        relay(&b, &mut a, b"and back").await;
    }
}

#[tokio::test]
async fn restarting_frame_sets_the_reconnect_time() {
    // Ferry sends `restarting` on graceful shutdown; derper does not.
    let mut server = TestServer::start_with(Kind::Ferry, None, |cfg| {
        cfg.restart_reconnect_in = Duration::from_millis(1500);
        cfg.restart_try_for = Duration::from_secs(20);
    });
    let mut c = connect(&server, None).await;
    server.stop();
    let (e, _) = wait_for(&mut c, QUICK, "Restarting", |e| {
        matches!(e, Event::Restarting { .. })
    })
    .await;
    let heard = tokio::time::Instant::now();
    assert!(
        matches!(e, Event::Restarting { reconnect_in, try_for }
            if reconnect_in == Duration::from_millis(1500) && try_for == Duration::from_secs(20)),
        "{e:?}"
    );
    let (e, _) = wait_for(&mut c, QUICK, "Disconnected", |e| {
        matches!(e, Event::Disconnected { .. })
    })
    .await;
    // The backoff alone would retry within 50 ms.
    match e {
        Event::Disconnected { retry_in, .. } => assert!(
            retry_in > Duration::from_millis(1000) && retry_in <= Duration::from_millis(1500),
            "{retry_in:?}"
        ),
        _ => unreachable!(),
    }
    assert!(matches!(
        c.send(&c.public_key(), b"x".to_vec()).await,
        Err(Error::NotConnected)
    ));
    server.restart();
    let (_, before) = wait_for(&mut c, QUICK, "reconnect", |e| {
        matches!(e, Event::Connected { .. })
    })
    .await;
    let waited = heard.elapsed();
    assert!(
        waited >= Duration::from_millis(1400),
        "reconnected after {waited:?}"
    );
    // No attempt was made before the advised time.
    assert!(
        !before
            .iter()
            .any(|e| matches!(e, Event::Disconnected { .. })),
        "{before:?}"
    );
    assert!(c.ping().await.is_ok());
}
