//! The HTTP front door through real sockets: what a client that
//! misbehaves before the DERP upgrade costs the relay and the others (a
//! request head dribbled a byte at a time), and who counts as local for
//! the debug pages behind a proxy.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{start, stop};

/// The value of a metric that must be there (a missing one is an error,
/// not a zero).
fn metric(server: &ferry_relay::Server, name: &str) -> f64 {
    let text = server.metrics().render();
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no metric {name}"));
    line[name.len() + 1..].parse().unwrap()
}

/// A 16 KiB request head sent a byte at a time is looked at in time
/// linear in its size: each byte is scanned once for the end of the head,
/// and the head is parsed once (not once per read, as a re-parse of the
/// whole head after every read would: about n²/2 bytes).
#[test]
fn a_head_sent_a_byte_at_a_time_is_parsed_once() {
    let (server, addr) = start(1, |_| {});
    let mut head = String::from("GET /generate_204 HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    let pad = ferry_proto::http::MAX_HEAD - head.len() - 8;
    head.push_str(&"a".repeat(pad));
    head.push_str("\r\n\r\n");
    assert!(head.len() < ferry_proto::http::MAX_HEAD);
    let before = metric(&server, "ferry_http_head_bytes_scanned_total");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    for b in head.bytes() {
        s.write_all(&[b]).unwrap();
    }
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let scanned = metric(&server, "ferry_http_head_bytes_scanned_total") - before;
    assert!(
        scanned <= 3.0 * head.len() as f64,
        "{scanned} bytes looked at for a head of {} bytes",
        head.len()
    );
    stop(server);
}
