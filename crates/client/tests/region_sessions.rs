//! Two SDK endpoints on two nodes of one region (two in-process Ferry
//! nodes meshed over TLS): under `only` relay session, the pair gets one
//! session, hosted by the node of the lower key (the anchor rule of
//! `docs/relay-sessions.md` §9), and 10,000 datagrams cross it; the
//! session exists on the host node only. One test in its own binary: it
//! sets `SSL_CERT_FILE`, which the nodes' mesh links read.

mod support;

use ferry_client::{
    BackoffOptions, DerpServerOptions, Endpoint, EndpointOptions, Options, PathAddr, PathKind,
    PeerOptions,
};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_testkit_servers::region::SessionRegion;
use std::time::Duration;
use support::TestCa;

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);
/// Datagrams sent each way in windows of this many.
const WINDOW: u32 = 50;

fn options(url: &str, key: NodePrivate, ca: &TestCa) -> EndpointOptions {
    let mut r = DerpServerOptions::new("region", url.to_owned());
    let mut o = Options::default();
    o.backoff =
        BackoffOptions::new(Duration::from_millis(50), Duration::from_millis(500)).with_seed(1);
    o.tls_roots = support::roots(ca);
    r.options = o;
    r.stun = Some("127.0.0.1:9".parse().unwrap());
    let mut e = EndpointOptions::new(key, vec![r]);
    e.bind = "127.0.0.1:0".parse().unwrap();
    e
}

/// Polls until `e`'s active path to `peer` is a relay session; its id.
async fn until_session(e: &Endpoint, peer: &NodePublic) -> u32 {
    let deadline = tokio::time::Instant::now() + QUICK;
    loop {
        let st = e.peer_status(peer).expect("a peer");
        if let Some(PathAddr::RelaySession { vni, .. }) = st.active {
            return vni;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no relay session within {QUICK:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_on_two_nodes_talk_over_one_cross_node_session() {
    let ca = TestCa::new();
    SessionRegion::trust(&ca);
    let region = SessionRegion::start(&ca);
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let a_is_anchor = ka.public() < kb.public();
    let a = Endpoint::bind(options(&region.nodes[0].url, ka, &ca))
        .await
        .expect("bind a");
    let b = Endpoint::bind(options(&region.nodes[1].url, kb, &ca))
        .await
        .expect("bind b");
    let (pa, pb) = (a.public_key(), b.public_key());
    let only = PeerOptions::new().only(PathKind::RelaySession);
    a.add_peer(pb, only).unwrap();
    b.add_peer(pa, only).unwrap();
    let (va, vb) = (until_session(&a, &pb).await, until_session(&b, &pa).await);
    assert_eq!(va, vb, "one session for the pair");

    let mut got = 0u32;
    for w in 0..10_000 / WINDOW {
        for i in 0..WINDOW {
            a.try_send(&pb, &(w * WINDOW + i).to_be_bytes()).unwrap();
        }
        for i in 0..WINDOW {
            let d = tokio::time::timeout(QUICK, b.recv())
                .await
                .expect("a datagram within the bound")
                .expect("endpoint open");
            assert_eq!(d.peer, pa);
            assert_eq!(d.data, (w * WINDOW + i).to_be_bytes(), "in order");
            assert_eq!(d.path.kind(), PathKind::RelaySession);
            got += 1;
        }
    }
    assert_eq!(got, 10_000);

    let (host, other) = if a_is_anchor { (0, 1) } else { (1, 0) };
    let hosted = |n: usize| region.nodes[n].sessions.lock().len();
    assert_eq!(
        (hosted(host), hosted(other)),
        (1, 0),
        "the session lives on the anchor's node (node {host}) only"
    );
    let st = a.peer_status(&pb).unwrap();
    let Some(PathAddr::RelaySession { addr, .. }) = st.active else {
        panic!("{st:?}")
    };
    assert_eq!(addr, region.nodes[host].sessions.bound().unwrap());
}
