//! An endpoint bound to `[::]` is dual-stack: it announces IPv4 candidates
//! besides IPv6 ones, and reaches an IPv4-only peer directly (sending to
//! IPv4 addresses as IPv4-mapped).

mod support;

use ferry_client::{
    BackoffOptions, Endpoint, EndpointOptions, Options, PathKind, PeerOptions, RelayOptions,
};
use ferry_proto::key::NodePrivate;
use std::time::Duration;
use support::{Kind, TestServer};

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);

fn options(url: &str, bind: &str) -> EndpointOptions {
    let mut r = RelayOptions::new("test", url);
    let mut o = Options::default();
    o.backoff = BackoffOptions {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(400),
        seed: Some(1),
    };
    r.options = o;
    r.stun = Some("127.0.0.1:9".parse().unwrap());
    let mut e = EndpointOptions::new(NodePrivate::generate(), vec![r]);
    e.bind = bind.parse().unwrap();
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_ipv6_endpoint_is_dual_stack() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 on this host: nothing to test");
        return;
    }
    let server = TestServer::start(Kind::Ferry, None);
    let a = Endpoint::bind(options(&server.url(), "[::]:0"))
        .await
        .unwrap();
    let b = Endpoint::bind(options(&server.url(), "127.0.0.1:0"))
        .await
        .unwrap();
    let candidates = a.local_candidates();
    assert!(
        candidates.iter().any(|c| c.is_ipv4()),
        "no IPv4 candidate: {candidates:?}"
    );
    assert!(candidates.iter().all(|c| c.port() == a.local_addr().port()));
    let (ka, kb) = (a.public_key(), b.public_key());
    a.add_peer(kb, PeerOptions::default());
    b.add_peer(ka, PeerOptions::default());
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
    a.send(&kb, b"over IPv4 from [::]").unwrap();
    let (from, data) = tokio::time::timeout(QUICK, b.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((from, data.as_slice()), (ka, &b"over IPv4 from [::]"[..]));
    b.send(&ka, b"back").unwrap();
    let (from, data) = tokio::time::timeout(QUICK, a.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((from, data.as_slice()), (kb, &b"back"[..]));
}
