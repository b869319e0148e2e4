//! The SDK's DERP client against Ferry and Tailscale's derper in the same
//! run (see `support` for how each is started): handshake, relay both
//! ways, ping, peerGone, reconnect after a restart, `restarting` honoured,
//! and all of it over TLS with a test CA.

mod support;

use ferry_client::{BackoffOptions, DerpClient, Error, Event, Options};
use ferry_proto::client::ClientError;
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
        o.tls_roots = support::roots(ca);
    }
    o.backoff =
        BackoffOptions::new(Duration::from_millis(50), Duration::from_millis(500)).with_seed(1);
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
    // The backoff alone would retry within 50 ms; the frame says 1.5 s,
    // counted from when it was read.
    match e {
        Event::Disconnected { retry_in, .. } => assert!(
            retry_in > Duration::from_millis(500) && retry_in <= Duration::from_millis(1500),
            "{retry_in:?}"
        ),
        _ => unreachable!(),
    }
    assert!(matches!(
        c.send(&c.public_key(), b"x".to_vec()).await,
        Err(Error::NotConnected)
    ));
    server.restart();
    // The first attempt (a success, or a failure if the restart was slow)
    // comes no earlier than the frame said.
    let (first, _) = wait_for(&mut c, QUICK, "an attempt", |e| {
        matches!(e, Event::Connected { .. } | Event::Disconnected { .. })
    })
    .await;
    let waited = heard.elapsed();
    assert!(
        waited >= Duration::from_millis(1200),
        "first attempt after {waited:?}: {first:?}"
    );
    if !matches!(first, Event::Connected { .. }) {
        wait_for(&mut c, QUICK, "reconnect", |e| {
            matches!(e, Event::Connected { .. })
        })
        .await;
    }
    assert!(c.ping().await.is_ok());
}

#[tokio::test]
async fn a_silent_connection_is_declared_dead_and_replaced() {
    for kind in kinds() {
        let server = TestServer::start(kind, None);
        let hole = support::Blackhole::start(server.addr).await;
        let mut o = options(None);
        o.keepalive_timeout = Duration::from_millis(800);
        let url = format!("http://{}/derp", hole.addr);
        let mut c = DerpClient::connect(&url, NodePrivate::generate(), o)
            .await
            .unwrap();
        relay_to_self(&mut c).await;
        hole.silence();
        let started = tokio::time::Instant::now();
        // A ping sent into the silence fails when the connection is given
        // up, well before its own 5 s limit.
        let sender = c.sender();
        let ping = tokio::spawn(async move { sender.ping().await });
        let (e, _) = wait_for(&mut c, QUICK, "Disconnected", |e| {
            matches!(e, Event::Disconnected { .. })
        })
        .await;
        let waited = started.elapsed();
        assert!(
            matches!(
                &e,
                Event::Disconnected {
                    error: Error::Protocol {
                        source: ClientError::KeepaliveTimeout { .. },
                        ..
                    },
                    ..
                }
            ),
            "{kind:?}: {e:?}"
        );
        assert!(
            waited >= Duration::from_millis(700),
            "declared dead after {waited:?}"
        );
        assert!(matches!(ping.await.unwrap(), Err(Error::PingLost)));
        wait_for(&mut c, QUICK, "reconnect", |e| {
            matches!(e, Event::Connected { .. })
        })
        .await;
        relay_to_self(&mut c).await;
        assert!(c.ping().await.is_ok());
    }
}

#[tokio::test]
async fn home_region_by_measured_latency() {
    use ferry_client::home;
    use ferry_proto::derp_map::DerpMap;
    let mut ks = kinds();
    // Two regions of different servers (or two Ferries without derper).
    let second = ks
        .pop()
        .filter(|k| *k == Kind::Derper)
        .unwrap_or(Kind::Ferry);
    let one = TestServer::start(Kind::Ferry, None);
    let two = TestServer::start(second, None);
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let key_of = |s: &TestServer| {
        let url = s.url();
        async move {
            DerpClient::connect(&url, NodePrivate::generate(), options(None))
                .await
                .unwrap()
                .server_key()
                .unwrap()
        }
    };
    let (key_one, key_two) = (key_of(&one).await, key_of(&two).await);
    let node = |name: &str, port: u16| {
        format!(
            r#"{{"Name":"{name}","HostName":"localhost","IPv4":"127.0.0.1","IPv6":"none","DERPPort":{port}}}"#
        )
    };
    // Region 3 has only a closed port; region 2's first node is that closed
    // port too, so it is reached through its second node; region 4 may not
    // be measured. Region 1 is penalised by its score.
    let map = format!(
        r#"{{"Regions":{{
            "1":{{"RegionID":1,"Nodes":[{}]}},
            "2":{{"RegionID":2,"Nodes":[{},{}]}},
            "3":{{"RegionID":3,"Nodes":[{}]}},
            "4":{{"RegionID":4,"NoMeasureNoHome":true,"Nodes":[{}]}}
        }},"HomeParams":{{"RegionScore":{{"1":1000}}}}}}"#,
        node("1a", one.addr.port()),
        node("2a", dead.port()),
        node("2b", two.addr.port()),
        node("3a", dead.port()),
        node("4a", one.addr.port()),
    );
    let map = DerpMap::from_json(map.as_bytes()).unwrap();
    let mut o = options(None);
    o.plain_http = true;
    let key = NodePrivate::generate();
    let (mut client, region, measured) = home::connect_home(&map, &key, &o, 3).await.unwrap();
    let ids: Vec<u64> = measured.iter().map(|m| m.region_id).collect();
    assert_eq!(ids, [1, 2, 3], "{measured:?}");
    assert!(
        measured[0].latency.is_ok() && measured[1].latency.is_ok(),
        "{measured:?}"
    );
    assert!(
        matches!(measured[2].latency, Err(Error::Connect { .. })),
        "{measured:?}"
    );
    assert_eq!(region, 2, "{measured:?}");
    assert_eq!(client.server_key(), Some(key_two));
    assert_ne!(key_one, key_two);
    relay_to_self(&mut client).await;
    // Without the penalty, whichever measured faster wins.
    let plain = DerpMap::from_json(map.to_json().replace("1000", "1").as_bytes()).unwrap();
    let best = home::choose(&plain, &measured, None).unwrap();
    let fastest = measured
        .iter()
        .filter_map(|m| Some((m.region_id, *m.latency.as_ref().ok()?)))
        .min_by_key(|(_, l)| *l)
        .unwrap()
        .0;
    assert_eq!(best, fastest);
}

#[tokio::test]
async fn backoff_follows_the_seed_on_a_paused_clock() {
    // Two clients with the same seed lose their server for good; their
    // retry delays (on tokio's paused clock, so this takes no real time)
    // double from 50 ms up to the 500 ms cap, jittered in the upper half,
    // and are the same for both.
    let mut server = TestServer::start(Kind::Ferry, None);
    let mut a = connect(&server, None).await;
    let mut b = connect(&server, None).await;
    server.stop();
    tokio::time::pause();
    let mut schedules = Vec::new();
    for c in [&mut a, &mut b] {
        let mut delays = Vec::new();
        for _ in 0..8 {
            let (e, _) = wait_for(c, Duration::from_secs(60), "Disconnected", |e| {
                matches!(e, Event::Disconnected { .. })
            })
            .await;
            if let Event::Disconnected { retry_in, .. } = e {
                delays.push(retry_in);
            }
        }
        schedules.push(delays);
    }
    // The first delay is the one the restarting frame asked for.
    assert_eq!(schedules[0][1..], schedules[1][1..]);
    let mut nominal = Duration::from_millis(50);
    for d in &schedules[0][1..] {
        assert!(
            *d >= nominal / 2 && *d <= nominal,
            "{d:?} vs {nominal:?}: {schedules:?}"
        );
        nominal = (nominal * 2).min(Duration::from_millis(500));
    }
}

#[tokio::test]
async fn derp_map_nodes_pinned_or_insecure() {
    use ferry_proto::derp_map::DerpMap;
    use sha2::{Digest, Sha256};
    let ca = TestCa::new();
    let pin: String = Sha256::digest(ca.leaf.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let wrong: String = pin.chars().rev().collect();
    for kind in kinds() {
        let server = TestServer::start(kind, Some(ca.clone()));
        let node = |extra: &str| {
            let map = format!(
                r#"{{"Regions":{{"1":{{"Nodes":[{{"Name":"1a","HostName":"localhost","IPv4":"127.0.0.1","DERPPort":{}{extra}}}]}}}}}}"#,
                server.addr.port()
            );
            DerpMap::from_json(map.as_bytes()).unwrap().regions[&1].clone()
        };
        // No CA is consulted for a pinned or insecure node: the default
        // options (system roots) connect.
        for extra in [
            format!(r#","CertName":"sha256-raw:{pin}""#),
            r#","InsecureForTests":true"#.into(),
        ] {
            let mut c = DerpClient::connect_region(
                &node(&extra),
                NodePrivate::generate(),
                Options::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("{kind:?} {extra}: {e}"));
            let (e, _) = wait_for(&mut c, QUICK, "Connected", |_| true).await;
            assert!(
                matches!(
                    e,
                    Event::Connected {
                        fast_start: true,
                        ..
                    }
                ),
                "{kind:?}: {e:?}"
            );
            relay_to_self(&mut c).await;
        }
        for extra in [
            format!(r#","CertName":"sha256-raw:{wrong}""#),
            String::new(),
        ] {
            let err = DerpClient::connect_region(
                &node(&extra),
                NodePrivate::generate(),
                Options::default(),
            )
            .await
            .expect_err("not trusted");
            assert!(
                matches!(err, Error::Tls { .. } | Error::TlsSetup { .. }),
                "{kind:?} {extra}: {err}"
            );
        }
    }
}

#[tokio::test]
async fn over_websocket() {
    let ca = TestCa::new();
    for kind in kinds() {
        for tls in [None, Some(ca.clone())] {
            let server = TestServer::start(kind, tls.clone());
            let mut o = options(tls.as_deref());
            o.websocket = true;
            let mut ws = DerpClient::connect(&server.url(), NodePrivate::generate(), o)
                .await
                .unwrap_or_else(|e| panic!("{kind:?} tls={}: {e}", tls.is_some()));
            let (e, _) = wait_for(&mut ws, QUICK, "Connected", |_| true).await;
            assert!(
                matches!(
                    e,
                    Event::Connected {
                        fast_start: false,
                        ..
                    }
                ),
                "{kind:?}: {e:?}"
            );
            // A raw DERP client and a WebSocket one talk through the server,
            // with a packet that spans several WebSocket messages.
            let mut raw = connect(&server, tls.as_deref()).await;
            relay(&ws, &mut raw, b"over websocket").await;
            relay(&raw, &mut ws, b"back").await;
            relay(&ws, &mut raw, &[0xa5; 60_000]).await;
            relay(&raw, &mut ws, &[0x5a; 60_000]).await;
            assert!(ws.ping().await.unwrap() < QUICK);
        }
    }
}

/// A client given the nodes of one region ([`DerpClient::start_to`])
/// that loses its node tries the next node first: a node whose port still
/// accepts connections but never answers (hung, or a load balancer in
/// front of a dead process) does not hold the reconnect for the connect
/// timeout.
#[tokio::test]
async fn a_lost_connection_tries_the_next_node_of_the_region_first() {
    let mut first = TestServer::start(Kind::Ferry, None);
    let second = TestServer::start(Kind::Ferry, None);
    let mut o = options(None);
    o.connect_timeout = Duration::from_secs(60);
    let targets = [&first, &second].map(|s| ferry_client::Target::from_url(&s.url()).unwrap());
    let mut c = DerpClient::start_to(targets.to_vec(), NodePrivate::generate(), o)
        .await
        .expect("start");
    let (e, _) = wait_for(&mut c, QUICK, "Connected", |_| true).await;
    let Event::Connected { server, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(server, first.addr.to_string(), "the first node first");
    first.stop();
    // The first node's port accepts but never answers from now on.
    let _silent = std::net::TcpListener::bind(first.addr).expect("the first node's port");
    let (e, seen) = wait_for(&mut c, QUICK, "Connected again", |e| {
        matches!(e, Event::Connected { .. })
    })
    .await;
    let Event::Connected { server, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(server, second.addr.to_string(), "after {seen:?}");
}

/// A client given the nodes of one region whose first node does not
/// answer at all (its listener's queue is full: the kernel drops the
/// SYNs, as for a blackholed address) reaches the second within about the
/// per-target deadline (1 s), not the 10 s connect timeout.
#[tokio::test]
async fn a_node_that_never_answers_costs_the_per_target_deadline() {
    use socket2::{Domain, Socket, Type};
    let full = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    full.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    full.listen(0).unwrap();
    let dead = full.local_addr().unwrap().as_socket().unwrap();
    // Never accepted: it fills the queue of one.
    let _filler = std::net::TcpStream::connect(dead).unwrap();
    let second = TestServer::start(Kind::Ferry, None);
    let o = options(None);
    assert_eq!(o.connect_timeout, Duration::from_secs(10), "the default");
    let targets = [format!("http://{dead}/derp"), second.url()]
        .map(|u| ferry_client::Target::from_url(&u).unwrap());
    let started = std::time::Instant::now();
    let mut c = DerpClient::start_to(targets.to_vec(), NodePrivate::generate(), o)
        .await
        .expect("start");
    let took = started.elapsed();
    let (e, _) = wait_for(&mut c, QUICK, "Connected", |_| true).await;
    let Event::Connected { server, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(server, second.addr.to_string());
    eprintln!("connected to the second node after {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "the silent first node cost {took:?}"
    );
}
