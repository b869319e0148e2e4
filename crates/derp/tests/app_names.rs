//! Application names (`docs/derp-protocol.md` §7.3): what the relay does
//! with the `AppName` a client puts in clientInfo; every case on each back
//! end (the list at the end).

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferry_proto::client::{self as derp, Event};
use ferry_proto::frame;
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{MeshKey, NodePrivate};
use ferry_proto::nacl;
use support::{eventually, http, info, metric, start, stop, Client};

const T: Duration = Duration::from_secs(5);

/// derper closes a client whose `AppName` is invalid as soon as it opens
/// clientInfo; Ferry does the same and counts it by its own reason.
fn invalid_app_names_are_closed_and_counted() {
    let (server, addr) = start(2, |_| {});
    let bad = ["a".repeat(33), "bad\u{1f}".into(), "bad\u{7f}".into()];
    let more = ["x\u{1}", "y\u{2}", "z\u{3}"].map(String::from);
    for name in bad.iter().chain(&more).chain(&more) {
        assert!(!handshake(addr, named(name)), "{name:?} connected");
    }
    assert!(eventually(T, || metric(
        addr,
        "ferry_handshake_failures_total{reason=\"invalid_app_name\"}"
    ) == 9.0));
    // The first four names are kept (quoted, as the log shows them), the
    // rest counted only above.
    let page = http(addr, "GET /debug/varz HTTP/1.1\r\nHost: x\r\n\r\n");
    let kept: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("ferry_refused_app_names_total{reason=\"invalid_app_name\""))
        .collect();
    assert_eq!(kept.len(), 4, "{kept:?}");
    assert!(
        kept.iter()
            .any(|l| l.ends_with("app_name=\"\\\"x\\\\x01\\\"\"} 2")),
        "{kept:?}"
    );
    assert_eq!(
        metric(addr, "ferry_handshake_failures_total{reason=\"box_open\"}"),
        0.0
    );
    // The longest valid name, and the printable edges, are welcome.
    for name in ["a".repeat(32), " ~".into(), String::new()] {
        let info = ClientInfo {
            app_name: Some(name),
            ..info(None)
        };
        let mut c = Client::connect_as(addr, NodePrivate::generate(), info);
        c.ping(*b"appnames");
        assert!(matches!(c.next_meaningful(T), Ok(Event::Pong(_))));
    }
    stop(server);
}

fn named(name: &str) -> ClientInfo {
    ClientInfo {
        app_name: (!name.is_empty()).then(|| name.into()),
        ..info(None)
    }
}

/// Whether a client saying `info` gets through the handshake and a ping.
fn welcome(addr: SocketAddr, info: ClientInfo) -> bool {
    if !handshake(addr, info.clone()) {
        return false;
    }
    let mut c = Client::connect_as(addr, NodePrivate::generate(), info);
    c.ping(*b"welcome!");
    matches!(c.next_meaningful(T), Ok(Event::Pong(_)))
}

/// Runs a classic handshake saying `info`: `true` once the relay answers
/// with serverInfo, `false` when it closes the connection first (no answer
/// within `T` fails the test).
fn handshake(addr: SocketAddr, info: ClientInfo) -> bool {
    let config = support::config(NodePrivate::generate(), info);
    let mut client = derp::Client::new(config, Instant::now(), nacl::random_nonce()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut connected = false;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096];
    let deadline = Instant::now() + T;
    while Instant::now() < deadline && !connected {
        client.poll_transmit(&mut out);
        if !out.is_empty() {
            if s.write_all(&out).is_err() {
                return false;
            }
            out.clear();
        }
        let n = match s.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return false,
            Err(e) => panic!("no answer within {T:?}: {e}"),
        };
        let fed = client.handle_bytes(Instant::now(), &buf[..n], |e| {
            connected |= matches!(e, Event::Connected { .. });
        });
        if fed.is_err() {
            return false;
        }
    }
    assert!(connected, "no answer within {T:?}");
    connected
}

/// `--disallow-app-names` refuses those names (counted, by reason), lets
/// other names and nameless clients in, and exempts mesh peers.
fn disallowed_app_names_are_refused_but_not_mesh_peers() {
    let mesh_key = MeshKey::parse(&"cd".repeat(32)).unwrap();
    let mk = mesh_key.clone();
    let (server, addr) = start(2, move |cfg| {
        cfg.mesh_key = Some(mk);
        cfg.disallowed_app_names = ["bad".to_string(), "worse".to_string()].into();
    });
    assert!(!welcome(addr, named("bad")));
    assert!(!welcome(addr, named("worse")));
    assert!(welcome(addr, named("good")));
    assert!(welcome(addr, named("")));
    let mesh = ClientInfo {
        app_name: Some("bad".into()),
        ..info(Some(mesh_key))
    };
    assert!(welcome(addr, mesh), "a mesh peer is exempt");
    assert!(eventually(T, || metric(
        addr,
        "ferry_handshake_failures_total{reason=\"disallowed_app_name\"}"
    ) == 2.0));
    for name in ["bad", "worse"] {
        let series = format!(
            "ferry_refused_app_names_total{{reason=\"disallowed_app_name\",app_name=\"\\\"{name}\\\"\"}}"
        );
        assert_eq!(metric(addr, &series), 1.0, "{series}");
    }
    stop(server);
}

/// An empty element (`--disallow-app-names=bad,`) refuses clients without
/// a name, as derper's comma split does.
fn empty_disallowed_name_refuses_nameless_clients() {
    let (server, addr) = start(1, |cfg| {
        cfg.disallowed_app_names = ["bad".to_string(), String::new()].into();
    });
    assert!(!welcome(addr, named("")));
    assert!(welcome(addr, named("named")));
    stop(server);
}

/// A watcher (mesh peer) sees each client's name in peerPresent: in the
/// initial dump of those already there and for a client that comes later.
fn watchers_see_app_names() {
    let mesh_key = MeshKey::parse(&"ef".repeat(32)).unwrap();
    let mk = mesh_key.clone();
    let (server, addr) = start(3, move |cfg| cfg.mesh_key = Some(mk));
    let early = Client::connect_as(addr, NodePrivate::generate(), named("early-bird"));
    let plain = Client::connect(addr);
    let mut mesh = Client::connect_as(addr, NodePrivate::generate(), info(Some(mesh_key)));
    let mut v = Vec::new();
    frame::put_watch_conns(&mut v);
    mesh.write(&v).unwrap();
    let late = Client::connect_as(addr, NodePrivate::generate(), named("late ~"));
    let want = [
        (early.public, Some("early-bird")),
        (plain.public, None),
        (mesh.public, None),
        (late.public, Some("late ~")),
    ];
    let mut seen = Vec::new();
    while seen.len() < want.len() {
        if let Event::PeerPresent { key, app_name, .. } = mesh.next_meaningful(T).unwrap() {
            let name = app_name.map(|n| n.as_str().to_owned());
            if !seen.iter().any(|(k, _)| *k == key) {
                seen.push((key, name));
            }
        }
    }
    for (key, name) in want {
        let got = seen
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, n)| n.as_deref());
        assert_eq!(got, Some(name), "{key:?} in {seen:?}");
    }
    stop(server);
}

ferry_testkit::per_backend!(
    invalid_app_names_are_closed_and_counted,
    disallowed_app_names_are_refused_but_not_mesh_peers,
    empty_disallowed_name_refuses_nameless_clients,
    watchers_see_app_names,
);
