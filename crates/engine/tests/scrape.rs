//! The `/metrics` listener's edges: slow requests, oversize requests, idle
//! connections past the cap, paths and methods it does not serve.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferry_engine::stat::scrape::{Limits, Pages, ScrapeServer};

const PAGE: &str = "# HELP t_total T.\n# TYPE t_total counter\nt_total 1\n";

fn server(limits: Limits) -> ScrapeServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut pages = Pages::metrics(|| PAGE.to_owned());
    pages.other = Box::new(|path| {
        (path == "/healthz").then(|| b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n".to_vec())
    });
    pages.limits = limits;
    ScrapeServer::start(listener, "test-scrape", pages).unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_nodelay(true).unwrap();
    c
}

/// Everything the server sends until it closes (an error ends it too).
fn read_all(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn request(addr: SocketAddr, req: &[u8]) -> String {
    let mut c = connect(addr);
    c.write_all(req).unwrap();
    read_all(&mut c)
}

#[test]
fn a_request_sent_a_byte_at_a_time_is_answered() {
    let s = server(Limits::default());
    let mut c = connect(s.addr());
    for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" {
        c.write_all(&[*b]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let answer = read_all(&mut c);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.contains("Content-Type: text/plain; version=0.0.4"),
        "{answer}"
    );
    assert!(answer.ends_with(PAGE), "{answer}");
}

/// A client that keeps sending a byte now and then, never finishing its
/// request, is cut off when the request's time is up (a per-read timeout
/// would keep it forever).
#[test]
fn a_request_that_never_ends_is_cut_off_at_its_deadline() {
    let s = server(Limits {
        request_time: Duration::from_millis(400),
        ..Limits::default()
    });
    let mut c = connect(s.addr());
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let start = Instant::now();
    let mut closed = false;
    for i in 0..200 {
        let line = if i % 2 == 0 { b"X" } else { b"\r" };
        if c.write_all(line).is_err() {
            closed = true;
            break;
        }
        let mut byte = [0u8; 1];
        match c.read(&mut byte) {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = true;
                break;
            }
            Ok(_) => panic!("an answer to an unfinished request"),
        }
    }
    assert!(closed, "still open after {:?}", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "closed only after {:?}",
        start.elapsed()
    );
}

#[test]
fn an_oversize_request_is_refused_with_431() {
    let s = server(Limits {
        max_request: 1024,
        ..Limits::default()
    });
    let mut req = b"GET /metrics HTTP/1.1\r\n".to_vec();
    while req.len() < 4096 {
        req.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let mut c = connect(s.addr());
    // The server may close before taking it all: a failed write is fine.
    let _ = c.write_all(&req);
    let answer = read_all(&mut c);
    assert!(
        answer.starts_with("HTTP/1.1 431 "),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert!(!answer.contains("t_total"), "{answer}");
}

/// Connections that send nothing hold a place each until their time is
/// up; past the cap a new one is closed at once, and once the idle ones
/// are gone a scrape is answered again.
#[test]
fn idle_connections_past_the_cap_are_closed_and_scrapes_resume() {
    let s = server(Limits {
        max_connections: 4,
        request_time: Duration::from_millis(1500),
        ..Limits::default()
    });
    let idle: Vec<TcpStream> = (0..4).map(|_| connect(s.addr())).collect();
    // Each is taken in turn: a connection past them finds all places held
    // once a probe is refused. The first probes may still find a place
    // while the accept loop has not reached all four.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut extra = connect(s.addr());
        extra
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let start = Instant::now();
        let mut byte = [0u8; 1];
        let r = extra.read(&mut byte);
        if matches!(r, Ok(0)) && start.elapsed() < Duration::from_millis(400) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a connection past the cap was kept: {r:?}"
        );
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(10);
    loop {
        let answer = request(s.addr(), b"GET /metrics HTTP/1.0\r\n\r\n");
        if answer.starts_with("HTTP/1.1 200 OK") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no scrape after the idle ones: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(idle);
}

#[test]
fn other_paths_get_404_other_methods_405_and_named_pages_their_answer() {
    let s = server(Limits::default());
    let not_found = request(s.addr(), b"GET / HTTP/1.1\r\n\r\n");
    assert!(not_found.starts_with("HTTP/1.1 404 "), "{not_found}");
    let near = request(s.addr(), b"GET /metrics/x HTTP/1.1\r\n\r\n");
    assert!(near.starts_with("HTTP/1.1 404 "), "{near}");
    let post = request(
        s.addr(),
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    let garbage = request(s.addr(), b"hello\n\n");
    assert!(garbage.starts_with("HTTP/1.1 400 "), "{garbage}");
    let health = request(s.addr(), b"GET /healthz?x=1 HTTP/1.1\r\n\r\n");
    assert!(health.ends_with("ok\n"), "{health}");
    let query = request(s.addr(), b"GET /metrics?name[]=t_total HTTP/1.1\r\n\r\n");
    assert!(query.ends_with(PAGE), "{query}");
}

#[test]
fn dropping_the_server_closes_its_listener() {
    let s = server(Limits::default());
    let addr = s.addr();
    drop(s);
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening on {addr}"
    );
}
