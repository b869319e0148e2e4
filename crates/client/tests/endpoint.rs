//! Two SDK endpoints on loopback, through Ferry and through Tailscale's
//! derper: datagrams over DERP at once, direct UDP once probes confirm it,
//! back to DERP when direct UDP goes silent (a UDP "wire" the test cuts;
//! within [`down_bound`]) and up again when it returns; STUN against Ferry's STUN
//! server; `only` and `prefer`; the relay-session path through a Ferry
//! with relay sessions (in this process): allocated, bound and used under
//! `only` relay, and taken when direct UDP dies while it works; with two
//! relays and the peers at home on different ones, one session for the
//! pair, on the lower key's home. A third
//! party against them: forged relay bind replies from its own address while
//! the endpoints bind a session whose id it knows, and a peer's sealed pong
//! sent again from its own address; neither stops a path or gives the
//! stranger one.

mod support;

use ferry_client::{
    BackoffOptions, Datagram, DerpServerOptions, Endpoint, EndpointOptions, EventKind, Events,
    Options, PathAddr, PathEvent, PathKind, PathState, PeerOptions, SwitchReason,
};
use ferry_derp::DerpConfig;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::relay_session::{BindKind, BindMsg};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use support::{kinds, Kind, SessionRelay, TestServer};
use tokio::net::UdpSocket;

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(10);

/// The longest a switch down may take after a cut here: the endpoint's
/// silence limit (its last pong came at the cut at the latest), and as
/// much again for a debug build's timers on a loaded two-core machine.
/// The exact bound (2 s with the default schedule, at every phase of the
/// probe cycle) is checked with simulated time in `paths_tests.rs`.
fn down_bound(o: &EndpointOptions) -> Duration {
    o.timing.dead_after * 2
}

fn relay(url: String) -> DerpServerOptions {
    let mut r = DerpServerOptions::new("test", url);
    let mut o = Options::default();
    o.backoff =
        BackoffOptions::new(Duration::from_millis(50), Duration::from_millis(500)).with_seed(1);
    r.options = o;
    // Nothing listens there: no STUN unless a test starts one.
    r.stun = Some("127.0.0.1:9".parse().unwrap());
    r
}

fn options(url: &str) -> EndpointOptions {
    options_with_key(url, NodePrivate::generate())
}

fn options_with_key(url: &str, key: NodePrivate) -> EndpointOptions {
    let mut o = EndpointOptions::new(key, vec![relay(url.to_owned())]);
    o.bind = "127.0.0.1:0".parse().unwrap();
    o
}

async fn pair(a: EndpointOptions, b: EndpointOptions, peer: PeerOptions) -> (Endpoint, Endpoint) {
    let a = Endpoint::bind(a).await.expect("bind a");
    let b = Endpoint::bind(b).await.expect("bind b");
    a.add_peer(b.public_key(), peer).unwrap();
    b.add_peer(a.public_key(), PeerOptions::default()).unwrap();
    (a, b)
}

/// The next datagram at `e`, checked to be from `want`, and the path it
/// came on.
async fn recv_on(e: &Endpoint, want: &NodePublic) -> (Vec<u8>, PathAddr) {
    let d = tokio::time::timeout(QUICK, e.recv())
        .await
        .expect("a datagram within the bound")
        .expect("endpoint open");
    assert_eq!(&d.peer, want);
    (d.data, d.path)
}

async fn recv_from(e: &Endpoint, want: &NodePublic) -> Vec<u8> {
    let Datagram {
        peer: from, data, ..
    } = tokio::time::timeout(QUICK, e.recv())
        .await
        .expect("a datagram within the bound")
        .expect("endpoint open");
    assert_eq!(&from, want);
    data
}

/// Polls `e`'s status for `peer` until its active path has `kind`.
async fn until_active(e: &Endpoint, peer: &NodePublic, kind: PathKind, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let st = e.peer_status(peer).expect("a peer");
        if st.active.map(|a| a.kind()) == Some(kind) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {kind:?} within {limit:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next path event for `peer`, within `limit` (other events are
/// skipped; a lagged subscription fails the test).
async fn next_event(rx: &mut Events, peer: &NodePublic, limit: Duration) -> PathEvent {
    let deadline = tokio::time::Instant::now() + limit;
    for _ in 0..1000 {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no path event within {limit:?}"))
            .expect("events not ended");
        match ev.kind {
            EventKind::Path(p) if &p.peer == peer => return p,
            EventKind::Lagged { missed } => panic!("events lagged: {missed} missed"),
            _ => {}
        }
    }
    panic!("no event for the peer among 1000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derp_at_once_then_direct_after_probes() {
    for kind in kinds() {
        let server = TestServer::start(kind, None);
        // Direct UDP is cut until the first datagram went: it must go by
        // DERP, before any probe could be answered.
        let (a, b, wire) = wired(&server.url(), PeerOptions::default(), false).await;
        let (ka, kb) = (a.public_key(), b.public_key());
        assert_eq!(
            a.peer_status(&kb).unwrap().active,
            Some(PathAddr::Derp),
            "{kind:?}: DERP before any probe"
        );
        a.try_send(&kb, b"over derp").unwrap();
        assert_eq!(
            recv_on(&b, &ka).await,
            (b"over derp".to_vec(), PathAddr::Derp),
            "{kind:?}: the path it came on"
        );

        wire.set_up(true);
        until_active(&a, &kb, PathKind::Direct, QUICK).await;
        until_active(&b, &ka, PathKind::Direct, QUICK).await;
        let st = a.peer_status(&kb).unwrap();
        assert_eq!(
            st.active,
            Some(PathAddr::Direct(wire.addr_of_b())),
            "{kind:?}"
        );
        let b_direct = b.peer_status(&ka).unwrap().active.unwrap();
        assert_eq!(b_direct.kind(), PathKind::Direct);
        for i in 0..50u32 {
            a.try_send(&kb, &i.to_be_bytes()).unwrap();
            assert_eq!(
                recv_on(&b, &ka).await,
                (i.to_be_bytes().to_vec(), b_direct),
                "{kind:?}: on B's direct path"
            );
            b.try_send(&ka, &i.to_be_bytes()).unwrap();
            assert_eq!(recv_from(&a, &kb).await, i.to_be_bytes(), "{kind:?}");
        }
        let st = a.peer_status(&kb).unwrap();
        let direct = st.paths.iter().find(|p| Some(p.addr) == st.active).unwrap();
        assert_eq!(direct.stats.tx_packets, 50, "{kind:?}: {st:?}");
        assert_eq!(direct.stats.rx_packets, 50, "{kind:?}: {st:?}");
        assert!(direct.rtt.is_some());
        let derp = st.paths.iter().find(|p| p.addr == PathAddr::Derp).unwrap();
        assert_eq!(derp.stats.tx_packets, 1, "{kind:?}: the first datagram");
        assert!(a.relay_status()[0].connected);
        assert_eq!(a.stats().send_dropped, 0);
    }
}

/// A UDP relay between two endpoints that the test can cut, as a NAT in
/// between would look: B reaches A at `to_a`, A reaches B at `to_b`, and
/// each sees the other's datagrams come from the wire's far socket.
struct Wire {
    to_a: Arc<UdpSocket>,
    to_b: Arc<UdpSocket>,
    up: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Wire {
    async fn new() -> Wire {
        Wire {
            to_a: Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()),
            to_b: Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()),
            up: Arc::new(AtomicBool::new(true)),
            tasks: Vec::new(),
        }
    }

    fn addr_of_a(&self) -> SocketAddr {
        self.to_a.local_addr().unwrap()
    }

    fn addr_of_b(&self) -> SocketAddr {
        self.to_b.local_addr().unwrap()
    }

    /// Starts carrying datagrams between the endpoints at `a` and `b`.
    fn start(&mut self, a: SocketAddr, b: SocketAddr) {
        let (ta, tb) = (self.to_a.clone(), self.to_b.clone());
        self.tasks = vec![
            tokio::spawn(forward(ta.clone(), tb.clone(), a, self.up.clone())),
            tokio::spawn(forward(tb, ta, b, self.up.clone())),
        ];
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Datagrams arriving at `from` leave by `out` towards `dst`; dropped
/// while the wire is cut.
async fn forward(from: Arc<UdpSocket>, out: Arc<UdpSocket>, dst: SocketAddr, up: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 65536];
    while let Ok((n, _)) = from.recv_from(&mut buf).await {
        if up.load(Ordering::SeqCst) {
            let _ = out.send_to(&buf[..n], dst).await;
        }
    }
}

/// Two endpoints whose only direct path is through a [`Wire`].
async fn wired(url: &str, peer: PeerOptions, up: bool) -> (Endpoint, Endpoint, Wire) {
    let mut wire = Wire::new().await;
    wire.set_up(up);
    let mut oa = options(url);
    oa.discover = false;
    oa.advertise = vec![wire.addr_of_a()];
    let mut ob = options(url);
    ob.discover = false;
    ob.advertise = vec![wire.addr_of_b()];
    let (a, b) = pair(oa, ob, peer).await;
    wire.start(a.local_addr(), b.local_addr());
    (a, b, wire)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_derp_when_direct_goes_silent_and_returns_to_direct() {
    for kind in kinds() {
        let server = TestServer::start(kind, None);
        // Cut until A listens to events, so the first switch is seen.
        let (a, b, wire) = wired(&server.url(), PeerOptions::default(), false).await;
        let (ka, kb) = (a.public_key(), b.public_key());
        let mut events = a.events();
        wire.set_up(true);
        until_active(&a, &kb, PathKind::Direct, QUICK).await;
        assert_eq!(
            a.peer_status(&kb).unwrap().active,
            Some(PathAddr::Direct(wire.addr_of_b())),
            "{kind:?}"
        );
        let up = next_event(&mut events, &kb, QUICK).await;
        assert_eq!(
            (up.from, up.reason),
            (Some(PathAddr::Derp), SwitchReason::Better)
        );

        // A sends every 10 ms from here on; B counts what arrives.
        let sending = Arc::new(AtomicBool::new(true));
        let sender = {
            let (a, sending) = (Arc::new(a), sending.clone());
            let task_a = a.clone();
            let task = tokio::spawn(async move {
                let mut i = 0u32;
                while sending.load(Ordering::SeqCst) && i < 100_000 {
                    let _ = task_a.try_send(&kb, &i.to_be_bytes());
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                i
            });
            (a, task)
        };
        let (a, task) = sender;
        let receiver = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Ok(Ok(Datagram {
                peer: from, data, ..
            })) = tokio::time::timeout(Duration::from_secs(3), b.recv()).await
            {
                assert_eq!(from, ka);
                got.push(u32::from_be_bytes(data.try_into().unwrap()));
            }
            (b, got)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;

        let cut = SystemTime::now();
        wire.set_up(false);
        let down = next_event(&mut events, &kb, QUICK).await;
        assert_eq!(down.to, Some(PathAddr::Derp), "{kind:?}: {down:?}");
        assert_eq!(down.reason, SwitchReason::Silent);
        let took = down.at.duration_since(cut).unwrap_or_default();
        let bound = down_bound(&options(&server.url()));
        assert!(
            took <= bound,
            "{kind:?}: down after {took:?} (bound {bound:?})"
        );
        assert!(down.lost > 0, "{kind:?}: datagrams went into the cut wire");

        tokio::time::sleep(Duration::from_millis(500)).await;
        let restored = SystemTime::now();
        wire.set_up(true);
        let back = next_event(&mut events, &kb, QUICK).await;
        assert_eq!(
            (back.from, back.to, back.reason),
            (
                Some(PathAddr::Derp),
                Some(PathAddr::Direct(wire.addr_of_b())),
                SwitchReason::Better
            ),
            "{kind:?}"
        );
        let took = back.at.duration_since(restored).unwrap_or_default();
        assert!(
            took <= Duration::from_secs(10),
            "{kind:?}: up after {took:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        sending.store(false, Ordering::SeqCst);
        let sent = task.await.unwrap();
        let (_b, got) = receiver.await.unwrap();

        // Nothing twice; everything sent after the switch down arrived (by
        // DERP, then direct), so only datagrams of the silent interval are
        // missing, no more than reported.
        let mut unique = got.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            got.len(),
            "{kind:?}: a datagram arrived twice"
        );
        let missing = sent as u64 - got.len() as u64;
        assert!(
            missing <= down.lost,
            "{kind:?}: {missing} missing of {sent}, {} reported",
            down.lost
        );
        let st = a.peer_status(&kb).unwrap();
        let derp = st.paths.iter().find(|p| p.addr == PathAddr::Derp).unwrap();
        assert!(derp.stats.tx_packets > 0, "{kind:?}: {st:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_and_prefer_hold_while_direct_works() {
    let server = TestServer::start(Kind::Ferry, None);
    for (peer, want) in [
        (PeerOptions::new().only(PathKind::Derp), PathKind::Derp),
        (PeerOptions::new().prefer(PathKind::Derp), PathKind::Derp),
    ] {
        let (a, b) = pair(options(&server.url()), options(&server.url()), peer).await;
        let (ka, kb) = (a.public_key(), b.public_key());
        // B goes direct: the path works both ways, A's policy keeps DERP.
        until_active(&b, &ka, PathKind::Direct, QUICK).await;
        let st = a.peer_status(&kb).unwrap();
        assert_eq!(st.active.map(|p| p.kind()), Some(want), "{peer:?}: {st:?}");
        a.try_send(&kb, b"kept").unwrap();
        assert_eq!(recv_from(&b, &ka).await, b"kept");
        let st = a.peer_status(&kb).unwrap();
        let derp = st.paths.iter().find(|p| p.addr == PathAddr::Derp).unwrap();
        assert_eq!(derp.stats.tx_packets, 1, "{peer:?}");
    }
    // only = direct: nothing goes until direct is confirmed (it is cut
    // at first).
    let only_direct = PeerOptions::new().only(PathKind::Direct);
    let (a, b, wire) = wired(&server.url(), only_direct, false).await;
    let kb = b.public_key();
    assert_eq!(a.try_send(&kb, b"x"), Err(ferry_client::SendError::NoPath));
    assert_eq!(a.stats().send_dropped, 1);
    wire.set_up(true);
    until_active(&a, &kb, PathKind::Direct, QUICK).await;
    a.try_send(&kb, b"direct").unwrap();
    assert_eq!(recv_from(&b, &a.public_key()).await, b"direct");
    assert_eq!(
        a.try_send(&NodePrivate::generate().public(), b"x"),
        Err(ferry_client::SendError::UnknownPeer)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stun_learns_the_public_address_and_announces_it() {
    let stun = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (server, url) =
        ferry_testkit_servers::start(DerpConfig::new(NodePrivate::generate()), Some(stun));
    let mut o = options(&url);
    o.relays[0].stun = Some(stun);
    let e = Endpoint::bind(o).await.expect("bind");
    let deadline = tokio::time::Instant::now() + QUICK;
    loop {
        let st = &e.relay_status()[0];
        if st.public_addr.is_some() {
            // On loopback the public address is the socket's own.
            assert_eq!(st.public_addr, Some(e.local_addr()));
            assert_eq!(st.stun, Some(stun));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no STUN answer: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(e.local_candidates(), vec![e.local_addr()]);
    drop(e);
    server.shutdown();
    server.wait().expect("ferry stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_probes_and_strangers_payloads_are_dropped() {
    use ferry_proto::nacl::{random_nonce, SharedKey};
    use ferry_proto::peer_msg::{self, Probe};
    let server = TestServer::start(Kind::Ferry, None);
    let (a, b) = pair(
        options(&server.url()),
        options(&server.url()),
        PeerOptions::default(),
    )
    .await;
    let (ka, kb) = (a.public_key(), b.public_key());
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mallory = NodePrivate::generate();
    let mut datagrams = Vec::new();
    // A ping claiming to be A, sealed with another key.
    let mut forged = Vec::new();
    peer_msg::put_probe(
        &mut forged,
        0,
        &ka,
        &SharedKey::new(&mallory, &kb),
        &random_nonce(),
        &Probe::Ping { tx: [1; 12] },
    );
    datagrams.push(forged);
    // A well-sealed ping from a key B does not know.
    let mut unknown = Vec::new();
    peer_msg::put_probe(
        &mut unknown,
        0,
        &mallory.public(),
        &SharedKey::new(&mallory, &kb),
        &random_nonce(),
        &Probe::Ping { tx: [2; 12] },
    );
    datagrams.push(unknown);
    // A payload from an address that is no peer's path, and garbage.
    let mut payload = Vec::new();
    peer_msg::put_payload(&mut payload, 0, b"inject");
    datagrams.push(payload);
    datagrams.push(b"\x01\x02garbage".to_vec());
    for d in &datagrams {
        stranger.send_to(d, b.local_addr()).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + QUICK;
    while b.stats().rejected.total() < datagrams.len() as u64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rejected {:?}",
            b.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Counted by reason: two probes that do not open for a peer, one
    // payload from no peer's path, the garbage.
    let rejected = b.stats().rejected;
    assert_eq!(
        (
            rejected.bad_probe,
            rejected.unknown_source,
            rejected.total()
        ),
        (2, 1, 4),
        "{rejected:?}"
    );
    // Nothing was answered, nothing delivered, the stranger is no path.
    let mut buf = [0u8; 1500];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stranger.recv_from(&mut buf))
            .await
            .is_err(),
        "B answered a stranger"
    );
    let st = b.peer_status(&ka).unwrap();
    let from = stranger.local_addr().unwrap();
    assert!(
        st.paths.iter().all(|p| p.addr != PathAddr::Direct(from)),
        "{st:?}"
    );
    a.try_send(&kb, b"real").unwrap();
    assert_eq!(
        recv_from(&b, &ka).await,
        b"real",
        "the first delivery is A's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derp_resumes_after_the_relay_restarts() {
    for kind in kinds() {
        let mut server = TestServer::start(kind, None);
        let only_derp = PeerOptions::new().only(PathKind::Derp);
        let (a, b) = pair(options(&server.url()), options(&server.url()), only_derp).await;
        let (ka, kb) = (a.public_key(), b.public_key());
        a.try_send(&kb, b"before").unwrap();
        assert_eq!(recv_from(&b, &ka).await, b"before", "{kind:?}");
        server.restart();
        // Both reconnect by themselves; sends in between are dropped (DERP
        // is best effort), so send until one arrives.
        let deadline = tokio::time::Instant::now() + QUICK;
        let mut n = 0u32;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{kind:?}: nothing through the restarted relay: {:?}",
                a.relay_status()
            );
            n += 1;
            let _ = a.try_send(&kb, &n.to_be_bytes());
            if let Ok(Ok(Datagram { peer: from, .. })) =
                tokio::time::timeout(Duration::from_millis(100), b.recv()).await
            {
                assert_eq!(from, ka);
                break;
            }
        }
        assert!(a.relay_status()[0].connected, "{kind:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_relay_goes_through_a_bound_session() {
    let relay = SessionRelay::start();
    let only = PeerOptions::new().only(PathKind::RelaySession);
    let (a, b) = pair(options(&relay.url), options(&relay.url), only).await;
    let port = a.relay_status()[0].relay_port;
    assert!(port.is_some(), "{:?}", a.relay_status());
    let (ka, kb) = (a.public_key(), b.public_key());
    b.add_peer(ka, only).unwrap();
    until_active(&a, &kb, PathKind::RelaySession, QUICK).await;
    until_active(&b, &ka, PathKind::RelaySession, QUICK).await;
    for i in 0..20u32 {
        a.try_send(&kb, &i.to_be_bytes()).unwrap();
        assert_eq!(recv_from(&b, &ka).await, i.to_be_bytes());
        b.try_send(&ka, &i.to_be_bytes()).unwrap();
        assert_eq!(recv_from(&a, &kb).await, i.to_be_bytes());
    }
    let st = a.peer_status(&kb).unwrap();
    let Some(PathAddr::RelaySession { addr, .. }) = st.active else {
        panic!("{st:?}")
    };
    assert_eq!(Some(addr.port()), port);
    let path = st.paths.iter().find(|p| Some(p.addr) == st.active).unwrap();
    assert_eq!((path.stats.tx_packets, path.stats.rx_packets), (20, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_dies_down_to_the_relay_session_not_derp() {
    let relay = SessionRelay::start();
    let (a, b, wire) = wired(&relay.url, PeerOptions::default(), true).await;
    let (ka, kb) = (a.public_key(), b.public_key());
    until_active(&a, &kb, PathKind::Direct, QUICK).await;
    // The session is bound and confirmed in the background.
    let deadline = tokio::time::Instant::now() + QUICK;
    loop {
        let st = a.peer_status(&kb).unwrap();
        let relay_works = st
            .paths
            .iter()
            .any(|p| p.addr.kind() == PathKind::RelaySession && p.state == PathState::Working);
        if relay_works {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no relay path: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut events = a.events();
    let cut = SystemTime::now();
    wire.set_up(false);
    let ev = next_event(&mut events, &kb, QUICK).await;
    assert_eq!(
        ev.to.map(|p| p.kind()),
        Some(PathKind::RelaySession),
        "{ev:?}"
    );
    assert_eq!(ev.reason, SwitchReason::Silent);
    let took = ev.at.duration_since(cut).unwrap_or_default();
    let bound = down_bound(&options(&relay.url));
    assert!(took <= bound, "down after {took:?} (bound {bound:?})");
    a.try_send(&kb, b"via relay").unwrap();
    assert_eq!(recv_from(&b, &ka).await, b"via relay");
}

/// Two relays with sessions, each peer at home on its own (first in its
/// list) and connected to both, each reaching the other through the
/// other's home: the pair gets one session, on the home of the lower
/// key, and both sides use it. (Asking on the peer's relay made two, one
/// per relay, and each side bound whichever offer came last.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_homes_make_one_session_for_the_pair() {
    let (r0, r1) = (SessionRelay::start(), SessionRelay::start());
    let mut oa = options(&r0.url);
    oa.relays.push(relay(r1.url.clone()));
    let mut ob = options(&r1.url);
    ob.relays.push(relay(r0.url.clone()));
    let a = Endpoint::bind(oa).await.expect("bind a");
    let b = Endpoint::bind(ob).await.expect("bind b");
    // Both on both relays before either asks, so that neither ask is
    // refused for a peer not there yet (which would hide a second one
    // behind the retry wait).
    let deadline = tokio::time::Instant::now() + QUICK;
    while ![&a, &b].iter().all(|e| {
        e.relay_status()
            .iter()
            .all(|r| r.connected && r.relay_port.is_some())
    }) {
        assert!(tokio::time::Instant::now() < deadline, "relays not up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let only = PeerOptions::new().only(PathKind::RelaySession).relay(1);
    let (ka, kb) = (a.public_key(), b.public_key());
    a.add_peer(kb, only).unwrap();
    b.add_peer(ka, only).unwrap();
    let active = |e: &Endpoint, peer: &NodePublic| e.peer_status(peer).and_then(|s| s.active);
    let deadline = tokio::time::Instant::now() + QUICK;
    let mut last = (None, None);
    while tokio::time::Instant::now() < deadline {
        last = (active(&a, &kb), active(&b, &ka));
        if let (Some(PathAddr::RelaySession { .. }), Some(PathAddr::RelaySession { .. })) = last {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let made = (r0.sessions.lock().len(), r1.sessions.lock().len());
    assert_eq!(
        made.0 + made.1,
        1,
        "sessions on the two relays {made:?}; paths {last:?}"
    );
    let home = if ka < kb { &r0 } else { &r1 };
    assert_eq!(home.sessions.lock().len(), 1, "not on the lower key's home");
    let (
        Some(PathAddr::RelaySession { vni: va, .. }),
        Some(PathAddr::RelaySession { vni: vb, .. }),
    ) = last
    else {
        panic!("not both on the relay session within {QUICK:?}: {last:?}")
    };
    assert_eq!(va, vb, "the two sides on different sessions");
    for i in 0..20u32 {
        a.try_send(&kb, &i.to_be_bytes()).unwrap();
        assert_eq!(recv_from(&b, &ka).await, i.to_be_bytes());
        b.try_send(&ka, &i.to_be_bytes()).unwrap();
        assert_eq!(recv_from(&a, &kb).await, i.to_be_bytes());
    }
}

/// Two relays (two regions), each endpoint at home on its own and
/// connected to both: a reaches b over DERP through b's home, not its
/// own. With a's home gone, a's datagrams still reach b (b's to a, sent
/// through a's home, cannot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_at_home_on_another_relay_is_reached_through_that_relay() {
    let (r0, r1) = (SessionRelay::start(), SessionRelay::start());
    let mut oa = options(&r0.url);
    oa.relays.push(relay(r1.url.clone()));
    let mut ob = options(&r1.url);
    ob.relays.push(relay(r0.url.clone()));
    let derp = PeerOptions::new().only(PathKind::Derp).relay(1);
    let (a, b) = pair(oa, ob, derp).await;
    let (ka, kb) = (a.public_key(), b.public_key());
    b.add_peer(ka, derp).unwrap();
    a.try_send(&kb, b"to b").unwrap();
    assert_eq!(recv_on(&b, &ka).await, (b"to b".to_vec(), PathAddr::Derp));
    drop(r0);
    let deadline = tokio::time::Instant::now() + QUICK;
    while a.relay_status()[0].connected {
        assert!(tokio::time::Instant::now() < deadline, "a's home still up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.try_send(&kb, b"still").unwrap();
    assert_eq!(recv_from(&b, &ka).await, b"still");
}

/// Sends forged challenges (a cookie of its own) and bounds for session
/// `vni`, slot `slot`, generations 1–4, to `to` from a socket of its own,
/// burst after burst until `stop` (at most 30 s), so that some arrive
/// within any fraction of a millisecond.
fn flood(
    to: SocketAddr,
    vni: u32,
    slot: u8,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_nonblocking(true).unwrap();
        let mut burst = Vec::new();
        for generation in 1..=4 {
            let challenge = BindMsg {
                cookie: [0xee; 32],
                ..BindMsg::new(BindKind::Challenge, vni, slot, generation)
            };
            burst.push(challenge.to_bytes());
            burst.push(BindMsg::new(BindKind::Bound, vni, slot, generation).to_bytes());
        }
        let (mut sent, until) = (0u64, Instant::now() + Duration::from_secs(30));
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            for m in &burst {
                sent += u64::from(sock.send_to(m, to).is_ok());
            }
            std::thread::yield_now();
        }
        sent
    })
}

/// Someone who knows the session id of A and B (here: read from the
/// relay's table before the endpoints ask) floods both with challenges
/// of its own and bounds from its own address while they bind. Both
/// still bind with the relay's cookie, the session carries datagrams,
/// and the forgeries are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_bind_replies_from_a_stranger_do_not_stop_the_relay_path() {
    let relay = SessionRelay::start();
    let (pa, pb) = (NodePrivate::generate(), NodePrivate::generate());
    let (ka, kb) = (pa.public(), pb.public());
    let a = Endpoint::bind(options_with_key(&relay.url, pa))
        .await
        .expect("bind a");
    let b = Endpoint::bind(options_with_key(&relay.url, pb))
        .await
        .expect("bind b");
    let (for_a, for_b) = ferry_testkit::udp::allocate_pair(&*relay.sessions, ka, kb);
    let stop = Arc::new(AtomicBool::new(false));
    let floods = [
        flood(a.local_addr(), for_a.vni, for_a.slot, stop.clone()),
        flood(b.local_addr(), for_b.vni, for_b.slot, stop.clone()),
    ];
    let only = PeerOptions::new().only(PathKind::RelaySession);
    a.add_peer(kb, only).unwrap();
    b.add_peer(ka, only).unwrap();
    until_active(&a, &kb, PathKind::RelaySession, QUICK).await;
    until_active(&b, &ka, PathKind::RelaySession, QUICK).await;
    for i in 0..10u32 {
        a.try_send(&kb, &i.to_be_bytes()).unwrap();
        let Datagram {
            peer: from, data, ..
        } = tokio::time::timeout(QUICK, b.recv())
            .await
            .expect("a datagram within the bound")
            .unwrap();
        assert_eq!((from, data), (ka, i.to_be_bytes().to_vec()));
    }
    stop.store(true, Ordering::Relaxed);
    for ((e, peer), f) in [(&a, &kb), (&b, &ka)].into_iter().zip(floods) {
        let sent = f.join().unwrap();
        let st = e.peer_status(peer).unwrap();
        assert!(
            matches!(st.active, Some(PathAddr::RelaySession { vni, .. }) if vni == for_a.vni),
            "{st:?}"
        );
        let stats = e.stats();
        assert!(
            sent > 0 && stats.foreign_bind_replies > 0,
            "{sent} sent, {stats:?}"
        );
    }
}

/// A pong sealed by B (valid, as one captured on the wire would be) sent
/// to A from a stranger's address: A neither pings the stranger nor lists
/// its address among B's paths; B's own direct path is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_pong_gives_the_stranger_no_path() {
    use ferry_proto::nacl::{random_nonce, SharedKey};
    use ferry_proto::peer_msg::{self, Probe};
    let server = TestServer::start(Kind::Ferry, None);
    let (pa, pb) = (NodePrivate::generate(), NodePrivate::generate());
    let (ka, kb) = (pa.public(), pb.public());
    let sealed_by_b = SharedKey::new(&pb, &ka);
    let a = Endpoint::bind(options_with_key(&server.url(), pa))
        .await
        .expect("bind a");
    let b = Endpoint::bind(options_with_key(&server.url(), pb))
        .await
        .expect("bind b");
    a.add_peer(kb, PeerOptions::default()).unwrap();
    b.add_peer(ka, PeerOptions::default()).unwrap();
    until_active(&a, &kb, PathKind::Direct, QUICK).await;
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let from = stranger.local_addr().unwrap();
    for i in 0..4u8 {
        let mut pong = Vec::new();
        peer_msg::put_probe(
            &mut pong,
            0,
            &kb,
            &sealed_by_b,
            &random_nonce(),
            &Probe::Pong {
                tx: [i; 12],
                observed: a.local_addr(),
            },
        );
        stranger.send_to(&pong, a.local_addr()).await.unwrap();
    }
    // A new candidate is pinged at once: a discovery interval (2 s) and
    // more is ample.
    let mut buf = [0u8; 2048];
    let got = tokio::time::timeout(Duration::from_secs(3), stranger.recv_from(&mut buf)).await;
    assert!(got.is_err(), "A sent the stranger {got:?}");
    let st = a.peer_status(&kb).unwrap();
    assert!(
        st.paths.iter().all(|p| p.addr != PathAddr::Direct(from)),
        "{st:?}"
    );
    assert_eq!(st.active, Some(PathAddr::Direct(b.local_addr())));
}
