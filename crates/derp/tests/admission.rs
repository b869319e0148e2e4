//! The admission pool against fake controllers and a fake tailscaled
//! LocalAPI on real sockets: each rule of `--verify-client-url` and
//! `--verify-clients`, the bound on waiting questions, and the cache.
//! (The relay's use of it, with Tailscale's clients, derper beside it and
//! Headscale's real `/verify`, is tested in `interop/` and `e2e/`.)

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_derp::admission::{Admission, AdmissionStats, Rejection, Verdict};
use ferry_derp::config::AdmissionConfig;
use ferry_proto::key::{NodePrivate, NodePublic};

const WAIT: Duration = Duration::from_secs(10);

/// What the fake controller does with a request.
#[derive(Clone)]
enum Behaviour {
    /// 200 with `{"Allow": <key in set>}`.
    AllowList(Arc<HashSet<String>>),
    /// This status and body.
    Fixed(u16, &'static str),
    /// Accept the connection, read the request, answer nothing until the
    /// gate opens (the test holds it shut past the client's timeout).
    Hang(Arc<Mutex<()>>),
    /// 200 promising a 100-byte body, these bytes of it, then the
    /// connection closed (`None`) or held open until the gate opens.
    CutShort(&'static str, Option<Arc<Mutex<()>>>),
}

/// A fake admission controller on loopback; records the bodies it got.
struct Controller {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    heads: Arc<Mutex<Vec<String>>>,
    hits: Arc<AtomicUsize>,
}

fn controller(behaviour: Behaviour) -> Controller {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/verify", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let hits = Arc::new(AtomicUsize::new(0));
    let (b, hd, h) = (bodies.clone(), heads.clone(), hits.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (behaviour, b, hd, h) = (behaviour.clone(), b.clone(), hd.clone(), h.clone());
            std::thread::spawn(move || serve(stream, behaviour, (&b, &hd), &h));
        }
    });
    Controller {
        url,
        bodies,
        heads,
        hits,
    }
}

/// Bodies and heads of the requests a controller got.
type Seen<'a> = (&'a Mutex<Vec<String>>, &'a Mutex<Vec<String>>);

fn serve(mut s: TcpStream, behaviour: Behaviour, (bodies, heads): Seen, hits: &AtomicUsize) {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    // Read the head and a Content-Length body.
    let body = loop {
        let n = match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            assert!(head.starts_with("POST /verify"), "{head}");
            assert!(head.contains(" HTTP/1.1\r\n"), "{head}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("content-type: application/json"),
                "{head}"
            );
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("Content-Length");
            if buf.len() >= end + 4 + len {
                break String::from_utf8(buf[end + 4..end + 4 + len].to_vec()).unwrap();
            }
        }
    };
    hits.fetch_add(1, Ordering::SeqCst);
    bodies.lock().unwrap().push(body.clone());
    let text = String::from_utf8_lossy(&buf).into_owned();
    heads
        .lock()
        .unwrap()
        .push(text[..text.find("\r\n\r\n").unwrap_or(0)].to_owned());
    let (status, answer) = match behaviour {
        Behaviour::AllowList(keys) => {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let key = v["NodePublic"].as_str().unwrap();
            (200, format!("{{\"Allow\":{}}}", keys.contains(key)))
        }
        Behaviour::Fixed(status, body) => (status, body.to_owned()),
        Behaviour::Hang(gate) => {
            drop(gate.lock().unwrap());
            return;
        }
        Behaviour::CutShort(part, then) => {
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{part}"
            );
            let _ = s.flush();
            if let Some(gate) = then {
                drop(gate.lock().unwrap());
            }
            return;
        }
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

type Delivered = mpsc::Receiver<(u32, Verdict)>;

fn pool(cfg: AdmissionConfig) -> (Admission<u32>, Delivered, Arc<AdmissionStats>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let stats = Arc::new(AdmissionStats::default());
    let admission = Admission::start(cfg, stats.clone(), move |t, v| {
        tx.lock().unwrap().send((t, v)).unwrap();
    })
    .unwrap();
    (admission, rx, stats)
}

fn key() -> NodePublic {
    NodePrivate::generate().public()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Asks and waits for the verdict, whichever way it comes.
fn verdict(a: &Admission<u32>, rx: &Delivered, k: NodePublic, source: &str) -> Verdict {
    match a.ask(7, k, ip(source), Instant::now()) {
        Some(v) => v,
        None => {
            let (t, v) = rx.recv_timeout(WAIT).expect("a verdict within 10 s");
            assert_eq!(t, 7);
            v
        }
    }
}

fn with_url(url: &str) -> AdmissionConfig {
    AdmissionConfig {
        url: Some(url.to_owned()),
        timeout: Duration::from_millis(500),
        ..AdmissionConfig::default()
    }
}

#[test]
fn controller_admits_listed_keys_and_refuses_others() {
    let (yes, no) = (key(), key());
    let c = controller(Behaviour::AllowList(Arc::new(HashSet::from([
        yes.to_string()
    ]))));
    let (a, rx, stats) = pool(with_url(&c.url));
    assert_eq!(verdict(&a, &rx, yes, "198.51.100.7"), Verdict::Admit);
    assert_eq!(
        verdict(&a, &rx, no, "::ffff:198.51.100.8"),
        Verdict::Reject(Rejection::Denied)
    );
    let bodies = c.bodies.lock().unwrap().clone();
    assert_eq!(
        bodies,
        [
            format!("{{\"NodePublic\":\"{yes}\",\"Source\":\"198.51.100.7\"}}"),
            format!("{{\"NodePublic\":\"{no}\",\"Source\":\"198.51.100.8\"}}"),
        ]
    );
    assert_eq!(stats.admitted.load(Ordering::Relaxed), 1);
    assert_eq!(stats.rejected[2].load(Ordering::Relaxed), 1, "denied");
}

/// Credentials in the controller's URL are used as Go's client (derper's)
/// uses them: the user and password as Basic authorization, never in the
/// Host header; the query as it is. They show nowhere else: not in the
/// configuration's debug form, not in the text of a failure.
#[test]
fn credentials_in_the_url_are_sent_but_never_shown() {
    let yes = key();
    let c = controller(Behaviour::AllowList(Arc::new(HashSet::from([
        yes.to_string()
    ]))));
    let url = format!(
        "{}?token=t0ken",
        c.url.replace("http://", "http://ferry:s3cret@")
    );
    let (a, rx, _) = pool(with_url(&url));
    assert_eq!(verdict(&a, &rx, yes, "10.0.0.1"), Verdict::Admit);
    let head = c.heads.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("POST /verify?token=t0ken HTTP/1.1\r\n"),
        "{head}"
    );
    // base64("ferry:s3cret")
    assert!(
        head.contains("\r\nauthorization: Basic ZmVycnk6czNjcmV0")
            || head.contains("\r\nAuthorization: Basic ZmVycnk6czNjcmV0"),
        "{head}"
    );
    assert!(!head.contains("ferry:s3cret@"), "{head}");

    let shown = |text: &str| text.contains("s3cret") || text.contains("t0ken");
    let cfg = with_url(&url);
    assert!(!shown(&format!("{cfg:?}")), "{cfg:?}");
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!(
            "http://ferry:s3cret@{}/verify?token=t0ken",
            l.local_addr().unwrap()
        )
    };
    let (a, rx, _) = pool(AdmissionConfig {
        fail_open: false,
        ..with_url(&refused)
    });
    let v = verdict(&a, &rx, key(), "10.0.0.1");
    assert!(
        matches!(v, Verdict::Reject(Rejection::Unreachable(_))),
        "{v:?}"
    );
    assert!(!shown(&format!("{v:?}")), "{v:?}");
    let Verdict::Reject(why) = v else {
        unreachable!()
    };
    assert!(!shown(&why.to_string()), "{why}");
    assert_eq!(
        ferry_derp::admission::redact_url(&url),
        format!(
            "{}?token=[redacted]",
            c.url.replace("http://", "http://[redacted]@")
        )
    );
}

#[test]
fn answers_other_than_200_json_refuse() {
    for (status, body, want) in [
        (500, "{\"Allow\":true}", Rejection::Status(500)),
        (403, "", Rejection::Status(403)),
    ] {
        let c = controller(Behaviour::Fixed(status, body));
        let (a, rx, _) = pool(with_url(&c.url));
        assert_eq!(verdict(&a, &rx, key(), "10.0.0.1"), Verdict::Reject(want));
    }
    for body in ["<html>oops</html>", "", "[true]", "{\"Allow\":\"yes\"}"] {
        let c = controller(Behaviour::Fixed(200, body));
        let (a, rx, _) = pool(with_url(&c.url));
        let v = verdict(&a, &rx, key(), "10.0.0.1");
        assert!(
            matches!(v, Verdict::Reject(Rejection::Answer(_))),
            "body {body:?}: {v:?}"
        );
    }
}

/// A controller that never answers and one that refuses connections: with
/// fail-open (derper's default) the client is admitted and counted as
/// such; without, refused as unreachable. Either way within the timeout.
#[test]
fn unreachable_controller_follows_fail_open() {
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let hanging = controller(Behaviour::Hang(gate.clone()));
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/verify", l.local_addr().unwrap())
    };
    for url in [&hanging.url, &refused] {
        for fail_open in [true, false] {
            let cfg = AdmissionConfig {
                fail_open,
                ..with_url(url)
            };
            let (a, rx, stats) = pool(cfg);
            let started = Instant::now();
            let v = verdict(&a, &rx, key(), "10.0.0.1");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
            if fail_open {
                assert_eq!(v, Verdict::Admit, "{url}");
                assert_eq!(stats.admitted_fail_open.load(Ordering::Relaxed), 1);
            } else {
                assert!(
                    matches!(v, Verdict::Reject(Rejection::Unreachable(_))),
                    "{url}: {v:?}"
                );
            }
        }
    }
    drop(held);
}

/// A 200 whose body breaks off (the connection closes) or stalls (past
/// the timeout) before its JSON value is complete is a broken answer, not
/// an unreachable controller: it refuses the client even with fail-open,
/// as derper does (its JSON decoder fails on the short body).
#[test]
fn a_200_cut_short_refuses_even_with_fail_open() {
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    for (what, stall) in [("breaks off", None), ("stalls", Some(gate.clone()))] {
        for part in ["", "{\"Allow\": tr", "{\"Allow\": true"] {
            let c = controller(Behaviour::CutShort(part, stall.clone()));
            let (a, rx, stats) = pool(with_url(&c.url));
            let started = Instant::now();
            let v = verdict(&a, &rx, key(), "10.0.0.1");
            assert!(
                matches!(v, Verdict::Reject(Rejection::BrokenAnswer(_))),
                "body {what} after {part:?}: {v:?}"
            );
            assert_eq!(stats.admitted_fail_open.load(Ordering::Relaxed), 0);
            assert!(started.elapsed() < Duration::from_secs(5));
        }
    }
    drop(held);
}

/// The verdict is the body's first JSON value, read as it arrives (as
/// derper's `json.Decoder` does): once that value is whole, what happens to
/// the rest of the body does not matter, and a controller that holds the
/// connection open after it does not delay the client.
#[test]
fn a_whole_verdict_counts_however_the_body_ends() {
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    for stall in [None, Some(gate.clone())] {
        for (part, want) in [
            ("{\"Allow\": true}", Verdict::Admit),
            (
                "{\"Allow\": false} and the",
                Verdict::Reject(Rejection::Denied),
            ),
        ] {
            let c = controller(Behaviour::CutShort(part, stall.clone()));
            let cfg = AdmissionConfig {
                timeout: Duration::from_secs(30),
                ..with_url(&c.url)
            };
            let (a, rx, stats) = pool(cfg);
            let started = Instant::now();
            assert_eq!(verdict(&a, &rx, key(), "10.0.0.1"), want, "{part:?}");
            assert_eq!(stats.admitted_fail_open.load(Ordering::Relaxed), 0);
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{part:?} then {}: decided after {:?}",
                if stall.is_some() {
                    "a stall"
                } else {
                    "a close"
                },
                started.elapsed()
            );
        }
    }
    drop(held);
}

/// Questions beyond the threads wait in a bounded queue; past it, a new
/// client is refused at once (it does not wait), and the ones already
/// waiting get their verdicts when the controller answers.
#[test]
fn waiting_questions_are_bounded() {
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let c = controller(Behaviour::Hang(gate.clone()));
    let cfg = AdmissionConfig {
        concurrency: 2,
        max_waiting: 3,
        timeout: Duration::from_secs(30),
        fail_open: false,
        ..with_url(&c.url)
    };
    let (a, rx, stats) = pool(cfg);
    // Two threads take one each (as soon as they are scheduled: wait for
    // it, so the queue is empty again); then three wait: the sixth is
    // refused.
    for t in 0..2 {
        assert_eq!(a.ask(t, key(), ip("10.0.0.1"), Instant::now()), None);
    }
    assert!(
        ferry_testkit::wait::eventually(WAIT, || c.hits.load(Ordering::SeqCst) >= 2),
        "threads did not pick up questions"
    );
    for t in 2..5 {
        assert_eq!(a.ask(t, key(), ip("10.0.0.1"), Instant::now()), None);
    }
    // Refused without asking: a question that waited would wait for the
    // hung controller until the pool's timeout (30 s), and be refused as
    // unreachable, not busy.
    let started = Instant::now();
    let v = a.ask(5, key(), ip("10.0.0.1"), Instant::now());
    assert!(
        matches!(v, Some(Verdict::Reject(Rejection::Busy(_)))),
        "{v:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(stats.in_flight.load(Ordering::Relaxed), 5);
    drop(held);
    let mut got: Vec<u32> = (0..5).map(|_| rx.recv_timeout(WAIT).unwrap().0).collect();
    got.sort();
    assert_eq!(got, [0, 1, 2, 3, 4]);
    assert_eq!(stats.rejected[6].load(Ordering::Relaxed), 1, "busy");
}

/// One source that fills the waiting queue does not lock the others out:
/// a question from another source takes the place of the busiest
/// source's newest waiting question (which is refused as busy), while a
/// further question from the busiest source is refused itself. An IPv6
/// source is its /64.
#[test]
fn a_flooding_source_yields_its_place_to_others() {
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let c = controller(Behaviour::Hang(gate.clone()));
    let cfg = AdmissionConfig {
        concurrency: 1,
        max_waiting: 4,
        timeout: Duration::from_secs(30),
        fail_open: false,
        ..with_url(&c.url)
    };
    let (a, rx, stats) = pool(cfg);
    let ask = |t: u32, ip_: &str| a.ask(t, key(), ip(ip_), Instant::now());
    let busy = |v: &Option<Verdict>| matches!(v, Some(Verdict::Reject(Rejection::Busy(_))));
    assert_eq!(ask(0, "2001:db8::1"), None);
    assert!(
        ferry_testkit::wait::eventually(WAIT, || c.hits.load(Ordering::SeqCst) >= 1),
        "the thread did not pick up the question"
    );
    // The flood fills the queue from one /64, then is refused.
    for t in 1..=4 {
        assert_eq!(ask(t, &format!("2001:db8::{t:x}")), None, "{t}");
    }
    assert!(busy(&ask(5, "2001:db8::ff")), "the flooder's fifth");
    // Others get in, each in place of the flooder's newest.
    let evicted = |t: u32| {
        let (got, v) = rx.recv_timeout(WAIT).unwrap();
        assert_eq!(got, t);
        assert!(matches!(v, Verdict::Reject(Rejection::Busy(_))), "{v:?}");
    };
    assert_eq!(ask(6, "192.0.2.1"), None);
    evicted(4);
    assert_eq!(ask(7, "2001:db8:1::1"), None);
    evicted(3);
    // Shares are equal now (2, 1, 1): a second from 192.0.2.1 is refused.
    assert!(busy(&ask(8, "192.0.2.1")));
    drop(held);
    let mut got: Vec<u32> = (0..5).map(|_| rx.recv_timeout(WAIT).unwrap().0).collect();
    got.sort();
    assert_eq!(got, [0, 1, 2, 6, 7]);
    assert_eq!(stats.rejected[6].load(Ordering::Relaxed), 4, "busy");
    assert!(ferry_testkit::wait::eventually(WAIT, || {
        stats.in_flight.load(Ordering::Relaxed) == 0
    }));
}

#[test]
fn verdicts_are_cached_per_key_and_source_when_asked_to() {
    let (yes, no) = (key(), key());
    let c = controller(Behaviour::AllowList(Arc::new(HashSet::from([
        yes.to_string()
    ]))));
    let cfg = AdmissionConfig {
        cache_for: Some(Duration::from_secs(60)),
        ..with_url(&c.url)
    };
    let (a, rx, stats) = pool(cfg);
    assert_eq!(verdict(&a, &rx, yes, "10.0.0.1"), Verdict::Admit);
    assert_eq!(
        verdict(&a, &rx, no, "10.0.0.1"),
        Verdict::Reject(Rejection::Denied)
    );
    // The same questions again: answered at once, the controller not asked.
    let now = Instant::now();
    assert_eq!(a.ask(1, yes, ip("10.0.0.1"), now), Some(Verdict::Admit));
    assert_eq!(
        a.ask(1, no, ip("10.0.0.1"), now),
        Some(Verdict::Reject(Rejection::Denied))
    );
    assert_eq!(c.hits.load(Ordering::SeqCst), 2);
    assert_eq!(stats.cache_hits.load(Ordering::Relaxed), 2);
    // Another source is another question; an expired verdict is asked again.
    assert_eq!(verdict(&a, &rx, yes, "10.0.0.2"), Verdict::Admit);
    assert_eq!(
        a.ask(1, yes, ip("10.0.0.1"), now + Duration::from_secs(61)),
        None
    );
    rx.recv_timeout(WAIT).unwrap();
    assert_eq!(c.hits.load(Ordering::SeqCst), 4);
}

#[test]
fn failures_are_not_cached() {
    let c = controller(Behaviour::Fixed(500, ""));
    let cfg = AdmissionConfig {
        cache_for: Some(Duration::from_secs(60)),
        ..with_url(&c.url)
    };
    let (a, rx, _) = pool(cfg);
    let k = key();
    for _ in 0..2 {
        assert_eq!(
            verdict(&a, &rx, k, "10.0.0.1"),
            Verdict::Reject(Rejection::Status(500))
        );
    }
    assert_eq!(c.hits.load(Ordering::SeqCst), 2);
}

/// A fake tailscaled LocalAPI: 200 with a WhoIs body for known keys, 404
/// for others, or a fixed answer.
fn local_api(
    known: HashSet<String>,
    fixed: Option<&'static str>,
) -> (tempdir::Dir, Arc<Mutex<Vec<String>>>) {
    let dir = tempdir::Dir::new();
    let path = dir.path().join("tailscaled.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let r = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).into_owned();
            r.lock().unwrap().push(head.clone());
            let answer = match fixed {
                Some(a) => a.to_owned(),
                None => {
                    let target = head.split(' ').nth(1).unwrap_or_default();
                    let key = target
                        .split("addr=")
                        .nth(1)
                        .unwrap_or_default()
                        .replace("%3A", ":");
                    if known.contains(&key) {
                        let body = "{\"Node\":{\"ID\":1},\"UserProfile\":{}}";
                        format!("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}")
                    } else {
                        "HTTP/1.0 404 Not Found\r\n\r\nno match for IP:port\n".to_owned()
                    }
                }
            };
            let _ = s.write_all(answer.as_bytes());
        }
    });
    (dir, requests)
}

#[test]
fn local_tailscaled_admits_its_peers_first() {
    let (peer, stranger) = (key(), key());
    let (dir, requests) = local_api(HashSet::from([peer.to_string()]), None);
    let c = controller(Behaviour::AllowList(Arc::new(HashSet::from([
        peer.to_string(),
        stranger.to_string(),
    ]))));
    let cfg = AdmissionConfig {
        local_socket: Some(dir.path().join("tailscaled.sock")),
        ..with_url(&c.url)
    };
    let (a, rx, _) = pool(cfg);
    assert_eq!(verdict(&a, &rx, peer, "10.0.0.1"), Verdict::Admit);
    assert_eq!(
        verdict(&a, &rx, stranger, "10.0.0.1"),
        Verdict::Reject(Rejection::NotInTailnet)
    );
    // The controller was asked only about the key tailscaled knew.
    assert_eq!(c.hits.load(Ordering::SeqCst), 1);
    let first = requests.lock().unwrap()[0].clone();
    assert!(
        first.starts_with(&format!(
            "GET /localapi/v0/whois?addr=nodekey%3A{} HTTP/1.0\r\n",
            peer.to_hex()
        )),
        "{first}"
    );
    assert!(
        first.contains("\r\nHost: local-tailscaled.sock\r\n"),
        "{first}"
    );
}

#[test]
fn local_tailscaled_failures_refuse() {
    let (dir, _) = local_api(
        HashSet::new(),
        Some("HTTP/1.0 400 Bad Request\r\n\r\ninvalid 'addr' parameter\n"),
    );
    let cfg = AdmissionConfig {
        local_socket: Some(dir.path().join("tailscaled.sock")),
        ..AdmissionConfig::default()
    };
    let (a, rx, _) = pool(cfg);
    let v = verdict(&a, &rx, key(), "10.0.0.1");
    assert_eq!(
        v,
        Verdict::Reject(Rejection::LocalApi(
            "tailscaled is too old to look up node keys".into()
        ))
    );
    let cfg = AdmissionConfig {
        local_socket: Some(dir.path().join("missing.sock")),
        ..AdmissionConfig::default()
    };
    let (a, rx, _) = pool(cfg);
    let v = verdict(&a, &rx, key(), "10.0.0.1");
    assert!(
        matches!(&v, Verdict::Reject(Rejection::LocalApi(e)) if e.contains("missing.sock")),
        "{v:?}"
    );
}

/// A temporary directory removed on drop (no dependency for one use).
mod tempdir {
    use std::path::{Path, PathBuf};

    pub(crate) struct Dir(PathBuf);

    impl Dir {
        pub(crate) fn new() -> Dir {
            let p = std::env::temp_dir().join(format!(
                "ferry-admission-{}-{}",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
