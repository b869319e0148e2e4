//! The HTTP front door through real sockets: what a client that
//! misbehaves before the DERP upgrade costs the relay and the others (a
//! request head dribbled a byte at a time, to the relay or to its metrics
//! listener), and who counts as local for the debug pages behind a proxy.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{start, stop};

/// The value of a metric that must be there (a missing one is an error,
/// not a zero).
fn metric(server: &ferry_derp::Server, name: &str) -> f64 {
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

/// `/debug` is for local clients. A loopback peer that says it forwards
/// for someone (`X-Forwarded-For` or `Forwarded`) is not local unless it
/// is a trusted proxy; then the client the headers name decides, and each
/// header present must name a local one (a proxy writes one of them, a
/// client may have written the other).
#[test]
fn debug_pages_behind_a_proxy_follow_the_forwarded_client() {
    let status = |addr, headers: &str| {
        let r = support::http(
            addr,
            &format!("GET /debug/varz HTTP/1.1\r\nHost: x\r\n{headers}\r\n"),
        );
        r.get(9..12).unwrap_or_default().to_owned()
    };
    // Nobody trusted: any forwarding header makes the request non-local.
    let (server, addr) = start(1, |_| {});
    assert_eq!(status(addr, ""), "200");
    for h in [
        "X-Forwarded-For: 127.0.0.1\r\n",
        "Forwarded: for=1.2.3.4\r\n",
        "Forwarded: for=127.0.0.1\r\n",
    ] {
        assert_eq!(status(addr, h), "403", "untrusted peer with {h:?}");
    }
    stop(server);

    // A loopback proxy is trusted: the forwarded client decides.
    let (server, addr) = start(1, |cfg| {
        cfg.trusted_proxies = "127.0.0.1".parse().unwrap();
    });
    for (h, want) in [
        ("", "200"),
        ("X-Forwarded-For: 127.0.0.1\r\n", "200"),
        ("Forwarded: for=127.0.0.1\r\n", "200"),
        ("X-Forwarded-For: 1.2.3.4\r\n", "403"),
        ("X-Forwarded-For: 127.0.0.1, 1.2.3.4\r\n", "403"),
        ("Forwarded: for=\"[2001:db8::1]:4711\"\r\n", "403"),
        // A hop that names nobody: the client is unknown, not local.
        ("Forwarded: for=unknown\r\n", "403"),
        // The proxy wrote one header, the client the other.
        (
            "X-Forwarded-For: 1.2.3.4\r\nForwarded: for=127.0.0.1\r\n",
            "403",
        ),
        (
            "X-Forwarded-For: 127.0.0.1\r\nForwarded: for=1.2.3.4\r\n",
            "403",
        ),
    ] {
        assert_eq!(status(addr, h), want, "trusted proxy with {h:?}");
    }
    stop(server);
}

/// The metrics listener answers a few requests at once. A client that
/// sends its request a byte at a time holds one of those places for the
/// request's time limit (5 s), not for as long as it keeps sending: a
/// crowd of them delays a scrape, never keeps it out.
#[test]
fn slow_metrics_clients_cannot_keep_the_scrapes_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    let (server, _, metrics) = support::start_with_metrics();
    let scrape = || {
        let r = support::http(metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        r.starts_with("HTTP/1.1 200")
    };
    assert!(scrape());
    // More slow clients than the listener serves at once, each sending a
    // byte every 300 ms for up to 20 s.
    let quit = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..12)
        .map(|_| {
            let quit = quit.clone();
            let mut s = TcpStream::connect(metrics).unwrap();
            std::thread::spawn(move || {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
                let until = Instant::now() + Duration::from_secs(20);
                while !quit.load(Ordering::Relaxed) && Instant::now() < until {
                    if s.write_all(b"a").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            })
        })
        .collect();
    // While they hold every place, a scrape is turned away...
    assert!(
        support::eventually(Duration::from_secs(5), || !scrape()),
        "the slow clients never took the listener's places"
    );
    // ...but only until their time limit: the scrapes come back.
    let started = Instant::now();
    let back = support::eventually(Duration::from_secs(12), scrape);
    quit.store(true, Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    assert!(
        back,
        "no scrape answered for 12 s while slow clients dribbled"
    );
    assert!(started.elapsed() < Duration::from_secs(12));
    stop(server);
}
