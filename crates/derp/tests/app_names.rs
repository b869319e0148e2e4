//! Application names (`docs/derp-protocol.md` §7.3): what the relay does
//! with the `AppName` a client puts in clientInfo; every case on each back
//! end (the list at the end).

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferry_proto::client::{self as derp, Event};
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::NodePrivate;
use ferry_proto::nacl;
use support::{eventually, info, metric, start, stop, Client};

const T: Duration = Duration::from_secs(5);

/// Runs a classic handshake saying `name` until the relay closes the
/// connection (or `T` passes, which fails); returns whether the client got
/// as far as `Connected`.
fn handshake_until_closed(addr: SocketAddr, name: &str) -> bool {
    let info = ClientInfo {
        app_name: Some(name.into()),
        ..info(None)
    };
    let config = support::config(NodePrivate::generate(), info);
    let mut client = derp::Client::new(config, Instant::now(), nacl::random_nonce()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut connected = false;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096];
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        client.poll_transmit(&mut out);
        if !out.is_empty() {
            if s.write_all(&out).is_err() {
                return connected;
            }
            out.clear();
        }
        let n = match s.read(&mut buf) {
            Ok(0) => return connected,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return connected,
            Err(e) => panic!("not closed within {T:?}: {e}"),
        };
        let fed = client.handle_bytes(Instant::now(), &buf[..n], |e| {
            connected |= matches!(e, Event::Connected { .. });
        });
        if fed.is_err() {
            return connected;
        }
    }
    panic!("not closed within {T:?}");
}

/// derper closes a client whose `AppName` is invalid as soon as it opens
/// clientInfo; Ferry does the same and counts it by its own reason.
fn invalid_app_names_are_closed_and_counted() {
    let (server, addr) = start(2, |_| {});
    for name in ["a".repeat(33), "bad\u{1f}".into(), "bad\u{7f}".into()] {
        assert!(!handshake_until_closed(addr, &name), "{name:?} connected");
    }
    assert!(eventually(T, || metric(
        addr,
        "ferry_handshake_failures_total{reason=\"invalid_app_name\"}"
    ) == 3.0));
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

ferry_testkit::per_backend!(invalid_app_names_are_closed_and_counted);
