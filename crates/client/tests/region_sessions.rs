//! Two SDK endpoints on two nodes of one region (two in-process Ferry
//! nodes meshed over TLS): under `only` relay session, the pair gets one
//! session, hosted by the node of the lower key (the anchor rule of
//! `docs/relay-sessions.md` §9), and 10,000 datagrams cross it; the
//! session exists on the host node only. When the hosting node stops
//! (gracefully: it ends its sessions first, and the gap is measured),
//! endpoints that list both nodes' URLs move to the other node and get a
//! session there. The tests have their own binary: it sets
//! `SSL_CERT_FILE`, which the nodes' mesh links read (once, see
//! [`region`]).

mod support;

use ferry_client::{
    BackoffOptions, DerpServerOptions, Endpoint, EndpointOptions, Options, PathAddr, PathKind,
    PeerOptions,
};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_testkit_servers::region::{RegionNode, SessionRegion};
use std::time::Duration;
use support::TestCa;

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);
/// The pair's new session after its host stops: the dead path's time,
/// a reconnect, an allocation and a bind (a session lost after working
/// was asked again only after a 10 s wait before).
const MOVE: Duration = Duration::from_secs(5);
/// Datagrams sent each way in windows of this many.
const WINDOW: u32 = 50;

/// The CA every test's region uses, trusted through `SSL_CERT_FILE` (set
/// once, before any region's threads read it).
fn ca() -> &'static TestCa {
    static CA: std::sync::OnceLock<std::sync::Arc<TestCa>> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let ca = TestCa::new();
        SessionRegion::trust(&ca);
        ca
    })
}

/// Two endpoints, each with one relay: a region with these nodes' URLs;
/// each the other's peer, `only` relay session. Whether a's key is the
/// anchor (the lower).
async fn pair(urls_a: &[&str], urls_b: &[&str], ca: &TestCa) -> (Endpoint, Endpoint, bool) {
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let a_is_anchor = ka.public() < kb.public();
    let a = Endpoint::bind(region_options(urls_a, ka, ca))
        .await
        .expect("bind a");
    let b = Endpoint::bind(region_options(urls_b, kb, ca))
        .await
        .expect("bind b");
    let only = PeerOptions::new().only(PathKind::RelaySession);
    a.add_peer(b.public_key(), only).unwrap();
    b.add_peer(a.public_key(), only).unwrap();
    (a, b, a_is_anchor)
}

/// An endpoint whose one relay is a region with these nodes' URLs.
fn region_options(urls: &[&str], key: NodePrivate, ca: &TestCa) -> EndpointOptions {
    let mut r = DerpServerOptions::new("region", urls[0].to_owned())
        .with_fallback_urls(urls[1..].iter().map(|u| u.to_string()).collect());
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
    let ca = ca();
    let region = SessionRegion::start(ca);
    let (a, b, a_is_anchor) = pair(&[&region.nodes[0].url], &[&region.nodes[1].url], ca).await;
    let (pa, pb) = (a.public_key(), b.public_key());
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

/// A region whose endpoints a (first on node 0) and b (first on node 1)
/// list both nodes' URLs and have a session: the host (the anchor's
/// node), the survivor, a, b and the session's id as a sees it.
async fn hosted_pair(ca: &TestCa) -> (RegionNode, RegionNode, Endpoint, Endpoint, u32) {
    let region = SessionRegion::start(ca);
    let [n0, n1] = region.nodes;
    let (u0, u1) = (n0.url.as_str(), n1.url.as_str());
    let (a, b, a_is_anchor) = pair(&[u0, u1], &[u1, u0], ca).await;
    let (pa, pb) = (a.public_key(), b.public_key());
    let first = until_session(&a, &pb).await;
    until_session(&b, &pa).await;
    let (host, survivor) = if a_is_anchor { (n0, n1) } else { (n1, n0) };
    (host, survivor, a, b, first)
}

/// The node hosting a pair's session stops: the endpoint that was
/// connected to it moves to the next URL of its region, and the pair gets
/// a session again, on the surviving node, which now hosts it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_hosting_node_stops_the_pair_moves_to_the_other_node() {
    let (host, survivor, a, b, first) = hosted_pair(ca()).await;
    let (pa, pb) = (a.public_key(), b.public_key());
    // Each endpoint is on the first node it lists, and says which.
    let node = |e: &Endpoint| e.relay_status()[0].node.clone();
    let mut nodes = [node(&a), node(&b)];
    nodes.sort();
    let mut want = [Some(host.url.clone()), Some(survivor.url.clone())];
    want.sort();
    assert_eq!(nodes, want, "one endpoint on each node");
    // The anchor's node hosts; stop it.
    assert_eq!(host.sessions.lock().len(), 1, "the anchor's node hosts");
    let old = host.sessions.bound().unwrap();
    host.stop();
    let stopped = tokio::time::Instant::now();
    let deadline = stopped + MOVE;
    let (va, vb) = loop {
        let on_survivor = |e: &Endpoint, p: &NodePublic| match e.peer_status(p).unwrap().active {
            Some(PathAddr::RelaySession { vni, addr }) if addr != old => Some(vni),
            _ => None,
        };
        if let (Some(va), Some(vb)) = (on_survivor(&a, &pb), on_survivor(&b, &pa)) {
            break (va, vb);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new session within {MOVE:?} (first {first}): a {:?}, b {:?}",
            a.peer_status(&pb),
            b.peer_status(&pa)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("a new session {:?} after the stop", stopped.elapsed());
    assert_eq!(va, vb, "one session for the pair");
    let on = Some(survivor.url.clone());
    assert_eq!(
        [node(&a), node(&b)],
        [on.clone(), on],
        "both on the survivor"
    );
    assert_eq!(survivor.sessions.lock().len(), 1, "hosted by the survivor");
    a.try_send(&pb, b"after").unwrap();
    let d = tokio::time::timeout(QUICK, b.recv())
        .await
        .expect("a datagram within the bound")
        .expect("endpoint open");
    assert_eq!(
        (d.data.as_slice(), d.path.kind()),
        (&b"after"[..], PathKind::RelaySession)
    );
}

/// A link asks for its peer's session before the peer has connected
/// anywhere (both sides of a pair often start at once): refused, peer not
/// here. When the peer then speaks to it over DERP, from the region's
/// other node, it asks again at once, not after the 10 s retry wait: its
/// node, the anchor's, makes the session (the peer, which takes no
/// sessions, never binds it). Only once: however much the peer sends
/// after, no other session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_refused_as_absent_is_asked_for_again_when_it_speaks() {
    let ca = ca();
    let region = SessionRegion::start(ca);
    // a is the anchor: its node hosts, and counts what a asks there.
    let (ka, kb) = loop {
        let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
        if ka.public() < kb.public() {
            break (ka, kb);
        }
    };
    let (pa, pb) = (ka.public(), kb.public());
    let node = &region.nodes[0];
    let refused = || {
        ferry_testkit::metrics::Scrape::parse(node.metrics())
            .family("ferry_relay_allocate_refused_total")
    };
    let a = Endpoint::bind(region_options(&[&node.url], ka, ca))
        .await
        .expect("bind a");
    a.add_peer(pb, PeerOptions::new()).unwrap();
    let deadline = tokio::time::Instant::now() + QUICK;
    while refused() < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a's first ask not refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ob = region_options(&[&region.nodes[1].url], kb, ca);
    ob.relays[0].options.relay_sessions = false;
    let b = Endpoint::bind(ob).await.expect("bind b");
    b.add_peer(pa, PeerOptions::new()).unwrap();
    let deadline = tokio::time::Instant::now() + QUICK;
    loop {
        b.try_send(&pa, b"here").unwrap();
        if tokio::time::timeout(Duration::from_millis(100), a.recv())
            .await
            .is_ok()
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "nothing from b");
    }
    let heard = tokio::time::Instant::now();
    let soon = heard + Duration::from_secs(3);
    // Counted, not looked for in the table: b takes no sessions, so its
    // node declines the offer and the host frees the session at once.
    let made = || node.sessions.lock().counters().allocated;
    while made() == 0 {
        assert!(
            tokio::time::Instant::now() < soon,
            "no second ask within 3 s of hearing from b"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..20 {
        b.try_send(&pa, b"still here").unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(made(), 1, "asked again once, not on every datagram");
}

/// The longest a graceful stop of the hosting node may interrupt a pair's
/// datagrams: the node tells both keys their session ends and the client
/// it was serving moves to the next URL at once, so neither waits out the
/// dead-path time nor the node's advised reconnect delay.
const DRAIN_GAP: Duration = Duration::from_secs(1);

/// The node hosting a pair's session stops gracefully while datagrams
/// flow a → b every 5 ms: both keys hear that the session ends, the pair
/// gets a new session on the surviving node, and the longest silence at
/// b (between two datagrams as b received them) stays under
/// [`DRAIN_GAP`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_of_the_host_moves_the_pair_with_a_short_gap() {
    let (host, survivor, a, b, _) = hosted_pair(ca()).await;
    let (pa, pb) = (a.public_key(), b.public_key());
    let old = host.sessions.bound().unwrap();
    let a = std::sync::Arc::new(a);
    let flowing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sender = {
        let (a, flowing) = (a.clone(), flowing.clone());
        tokio::spawn(async move {
            let mut seq = 0u32;
            while flowing.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = a.try_send(&pb, &seq.to_be_bytes());
                seq += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // Datagrams flow on the old session first.
    let first = tokio::time::timeout(QUICK, b.recv())
        .await
        .expect("a datagram within the bound")
        .expect("endpoint open");
    assert_eq!(first.path.kind(), PathKind::RelaySession);
    let stopper = std::thread::spawn(move || host.stop());
    let stopped = tokio::time::Instant::now();
    let mut last = stopped;
    let mut gap = Duration::ZERO;
    let deadline = stopped + MOVE;
    // Until b receives over a session hosted by the survivor, and a while
    // after (a second of datagrams there).
    let mut moved_at = None;
    loop {
        let now = tokio::time::Instant::now();
        assert!(
            now < deadline,
            "no datagram on a new session within {MOVE:?} (longest gap so far {gap:?})"
        );
        if moved_at.is_some_and(|t: tokio::time::Instant| now > t + Duration::from_secs(1)) {
            break;
        }
        let Ok(d) = tokio::time::timeout(Duration::from_millis(100), b.recv()).await else {
            continue;
        };
        let d = d.expect("endpoint open");
        let at = tokio::time::Instant::now();
        gap = gap.max(at - last);
        last = at;
        if moved_at.is_none() {
            if let Some(PathAddr::RelaySession { addr, .. }) = b.peer_status(&pa).unwrap().active {
                if addr != old && d.path.kind() == PathKind::RelaySession {
                    moved_at = Some(at);
                }
            }
        }
    }
    flowing.store(false, std::sync::atomic::Ordering::Relaxed);
    sender.await.unwrap();
    stopper.join().expect("the host stopped cleanly");
    eprintln!(
        "longest gap in a → b datagrams across the graceful stop: {gap:?} (new session {:?} after the stop)",
        moved_at.unwrap() - stopped
    );
    assert_eq!(survivor.sessions.lock().len(), 1, "hosted by the survivor");
    assert!(
        gap < DRAIN_GAP,
        "a gap of {gap:?} across a graceful stop, bound {DRAIN_GAP:?}"
    );
}
