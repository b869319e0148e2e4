//! The `/metrics` listener a service serves on an address of its own.
//!
//! One thread accepts; each connection gets a short-lived thread of its
//! own, at most [`Limits::max_connections`] at a time (a connection past
//! them is closed at once, and the refusal logged at most every ten
//! seconds). A request has [`Limits::request_time`] in all to arrive and to
//! take its answer — not per read, so a client sending a byte at a time
//! cannot hold its place longer — and at most [`Limits::max_request`]
//! bytes of head (431 past them). `GET /metrics` gets the page, other
//! paths what the service answers for them ([`Pages::other`], e.g.
//! `/healthz`) or 404, other methods 405. Every answer closes the
//! connection.
//!
//! It is blocking code on plain threads, so the UDP relay (no async
//! runtime) and `ferry link` (tokio) use it alike without a second
//! runtime; a scrape renders on its connection's thread, never on a
//! shard's.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a slow or hostile scraper may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of request head read at most.
    pub max_request: usize,
    /// Time a request has to arrive and its answer to be written.
    pub request_time: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request: 8192,
            request_time: Duration::from_secs(5),
            max_connections: 8,
        }
    }
}

/// Answers a `GET` of a path other than `/metrics` with a whole HTTP
/// response, or `None` for 404.
pub type Other = Box<dyn Fn(&str) -> Option<Vec<u8>> + Send + Sync>;

/// What the listener answers.
pub struct Pages {
    /// Renders the `GET /metrics` page (Prometheus text).
    pub metrics: Box<dyn Fn() -> String + Send + Sync>,
    /// A whole HTTP response for another path (the path without its
    /// query), or `None` for 404.
    pub other: Other,
    /// The limits.
    pub limits: Limits,
}

impl Pages {
    /// `GET /metrics` from `render`, nothing else, default limits.
    pub fn metrics(render: impl Fn() -> String + Send + Sync + 'static) -> Pages {
        Pages {
            metrics: Box::new(render),
            other: Box::new(|_| None),
            limits: Limits::default(),
        }
    }
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// How often a refused connection is logged, at most.
const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How long the accept loop sleeps when there is nothing to accept, and so
/// how late it sees `stop`.
const ACCEPT_IDLE: Duration = Duration::from_millis(25);

/// Serves `pages` on `listener` until `stop` is set: the accept loop, run
/// on the caller's thread.
pub fn serve(listener: TcpListener, pages: Arc<Pages>, stop: &AtomicBool) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!(error = %e, "metrics listener: cannot poll for stop");
    }
    let busy = Arc::new(AtomicUsize::new(0));
    let mut refused = 0u64;
    let mut logged: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_IDLE);
                continue;
            }
            Err(e) => {
                // Out of descriptors, usually: do not spin.
                tracing::debug!(error = %e, "metrics listener: accept failed");
                std::thread::sleep(ACCEPT_IDLE * 4);
                continue;
            }
        };
        if busy.fetch_add(1, Ordering::SeqCst) >= pages.limits.max_connections {
            busy.fetch_sub(1, Ordering::SeqCst);
            refused += 1;
            if logged.is_none_or(|t| t.elapsed() >= REFUSED_LOG_INTERVAL) {
                logged = Some(Instant::now());
                tracing::warn!(%peer, refused, max = pages.limits.max_connections,
                    "metrics listener: all places taken; connection closed");
            }
            continue; // dropped: closed
        }
        let (pages, held) = (pages.clone(), busy.clone());
        let spawned = std::thread::Builder::new()
            .name("ferry-scrape".into())
            .spawn(move || {
                let _ = answer(stream, &pages);
                held.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("metrics listener: could not start a request thread");
        }
    }
}

/// [`serve`] on a thread of its own, stopped when this is dropped.
#[derive(Debug)]
pub struct ScrapeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ScrapeServer {
    /// Serves `pages` on `listener` from a thread named `name`.
    pub fn start(listener: TcpListener, name: &str, pages: Pages) -> io::Result<ScrapeServer> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let pages = Arc::new(pages);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || serve(listener, pages, &flag))?;
        Ok(ScrapeServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ScrapeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request within the limits and answers it.
fn answer(mut stream: TcpStream, pages: &Pages) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let deadline = Instant::now() + pages.limits.request_time;
    let left = || {
        Some(deadline.saturating_duration_since(Instant::now()))
            .filter(|t| !t.is_zero())
            .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
    };
    let max = pages.limits.max_request;
    let mut head = Vec::with_capacity(max.min(1024));
    let mut buf = [0u8; 1024];
    let request = loop {
        match Request::parse(&head, max) {
            Request::Partial => {}
            done => break done,
        }
        stream.set_read_timeout(Some(left()?))?;
        let want = buf.len().min(max - head.len());
        match stream.read(&mut buf[..want]) {
            Ok(0) => return Ok(()),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let resp = match request {
        Request::Get("/metrics") => {
            let body = (pages.metrics)();
            http(200, "OK", CONTENT_TYPE, body.as_bytes())
        }
        Request::Get(path) => {
            (pages.other)(path).unwrap_or_else(|| response(404, "Not Found", b"GET /metrics\n"))
        }
        Request::OtherMethod => response(405, "Method Not Allowed", b"GET /metrics\n"),
        Request::TooLarge => response(
            431,
            "Request Header Fields Too Large",
            b"request too large\n",
        ),
        Request::Bad | Request::Partial => response(400, "Bad Request", b"bad request\n"),
    };
    write_within(&mut stream, &resp, &left)
}

/// The content type of the text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a request head asks, as far as the listener cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'h> {
    /// The head has not ended yet (and is under the cap).
    Partial,
    /// `GET` of this path (without its query).
    Get(&'h str),
    /// Another method.
    OtherMethod,
    /// The head reached the cap without ending.
    TooLarge,
    /// Not an HTTP/1 request line.
    Bad,
}

impl<'h> Request<'h> {
    /// Reads `head`, the bytes received so far, whose cap is `max`.
    pub fn parse(head: &'h [u8], max: usize) -> Request<'h> {
        let Some(end) = head_end(head) else {
            return if head.len() >= max {
                Request::TooLarge
            } else {
                Request::Partial
            };
        };
        let line = head[..end].split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Ok(line) = std::str::from_utf8(line) else {
            return Request::Bad;
        };
        let mut words = line.split(' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some(method), Some(target), Some(version), None)
                if version.starts_with("HTTP/1.") && !method.is_empty() =>
            {
                if method != "GET" {
                    return Request::OtherMethod;
                }
                Request::Get(target.split('?').next().unwrap_or(target))
            }
            _ => Request::Bad,
        }
    }
}

/// Where the head ends (after its blank line), if it has.
fn head_end(head: &[u8]) -> Option<usize> {
    let crlf = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = head.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn response(code: u16, reason: &str, body: &[u8]) -> Vec<u8> {
    http(code, reason, "text/plain; charset=utf-8", body)
}

fn http(code: u16, reason: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// Writes `bytes` while `left` gives time.
fn write_within(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    left: &dyn Fn() -> io::Result<Duration>,
) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.set_write_timeout(Some(left()?))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
