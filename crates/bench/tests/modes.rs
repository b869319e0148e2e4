//! Every mode of the `ferry-bench` binary, briefly, against an in-process
//! ceiling server. The checks are of the "sane" kind only — something was
//! delivered, loss is a fraction, percentiles are ordered — never a speed.

use ferry_bench::ceiling::CeilingServer;
use ferry_bench::report::{ModeResult, Report};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

struct Ceiling {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ceiling {
    fn start() -> Self {
        let server = CeilingServer::bind("127.0.0.1:0".parse().unwrap(), 256 * 1024).expect("bind");
        let addr = server.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || server.run(&s).expect("ceiling server"));
        Ceiling {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Ceiling {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry-bench"))
        .args(args)
        .output()
        .expect("run ferry-bench")
}

fn report(args: &[&str]) -> Report {
    let out = bench(args);
    assert!(
        out.status.success(),
        "ferry-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bad JSON from {args:?}: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A file in a per-test scratch directory, removed when the guard drops.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("ferry-bench-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn throughput_paced_and_unpaced() {
    let c = Ceiling::start();
    let pid = std::process::id().to_string();
    for rate in ["50M", "max"] {
        let r = report(&[
            "throughput",
            "-q",
            "-s",
            &c.url(),
            "-n",
            "4",
            "--rate",
            rate,
            "--warmup",
            "200ms",
            "-d",
            "700ms",
            "--drain",
            "500ms",
            "--server-pid",
            &pid,
        ]);
        let ModeResult::Throughput(t) = &r.result else {
            panic!("not a throughput result")
        };
        assert_eq!((t.peers, t.flows, t.size), (4, 2, 1400));
        assert!(t.packets_sent > 0 && t.packets_delivered > 0, "{t:?}");
        assert!(t.packets_delivered <= t.packets_sent);
        assert!((0.0..=1.0).contains(&t.loss));
        assert!(t.delivered_mbps > 0.0);
        assert!(
            t.latency_us.count > 0 && t.latency_us.is_ordered(),
            "{:?}",
            t.latency_us
        );
        assert!(t.fairness > 0.0 && t.fairness <= 1.0 + 1e-9);
        assert_eq!(t.disconnects, 0);
        if rate == "50M" {
            let offered = t.offered_mbps.expect("paced runs have an offered rate");
            assert!(
                (offered - 100.0).abs() < 1e-6,
                "2 flows × 50 Mbit/s: {offered}"
            );
            // The ceiling never drops; only a stall longer than the drain
            // on a loaded machine could leave packets uncounted.
            assert!(t.loss < 0.5, "{t:?}");
        } else {
            assert_eq!(t.offered_mbps, None);
        }
        assert!(r.server.is_some() && r.machine.is_some());
        assert!(r.client.busy_fraction.is_some());
    }
}

#[test]
fn latency_with_background_load() {
    let c = Ceiling::start();
    let r = report(&[
        "latency",
        "-q",
        "-s",
        &c.url(),
        "--ping-rate",
        "500",
        "--load-peers",
        "4",
        "--load-total-rate",
        "40M",
        "--warmup",
        "200ms",
        "-d",
        "700ms",
        "--drain",
        "500ms",
    ]);
    let ModeResult::Latency(l) = &r.result else {
        panic!("not a latency result")
    };
    assert!(l.pings_sent > 0 && l.pongs_received > 0, "{l:?}");
    assert!(l.pongs_received <= l.pings_sent);
    assert!((0.0..=1.0).contains(&l.ping_loss));
    assert!(
        l.rtt_us.is_ordered() && l.rtt_us.p50 > 0.0,
        "{:?}",
        l.rtt_us
    );
    let bg = l.background.as_ref().expect("background load");
    assert_eq!(bg.flows, 2);
    assert!(bg.packets_delivered > 0);
}

#[test]
fn idle_and_churn() {
    let c = Ceiling::start();
    let pid = std::process::id().to_string();
    let r = report(&[
        "idle",
        "-q",
        "-s",
        &c.url(),
        "-n",
        "50",
        "--hold",
        "300ms",
        "--server-pid",
        &pid,
    ]);
    let ModeResult::Idle(i) = &r.result else {
        panic!("not an idle result")
    };
    assert_eq!((i.requested, i.established, i.failed), (50, 50, 0), "{i:?}");
    assert!(i.connect_rate > 0.0 && i.handshake_ms.is_ordered());
    assert!(i.server_bytes_per_conn.is_some());

    let r = report(&[
        "churn",
        "-q",
        "-s",
        &c.url(),
        "-d",
        "700ms",
        "--keys",
        "32",
        "--concurrency",
        "8",
    ]);
    let ModeResult::Churn(ch) = &r.result else {
        panic!("not a churn result")
    };
    assert!(ch.completed > 0 && ch.handshakes_per_s > 0.0, "{ch:?}");
    assert!(ch.completed + ch.failed <= ch.attempted);
    assert!(ch.handshake_ms.is_ordered());
}

#[test]
fn pair_file_and_output_file() {
    let c = Ceiling::start();
    let dir = Scratch::new("pairs");
    let pairs = dir.file("pairs.txt");
    std::fs::write(&pairs, "# fan-in\n0 2\n1 2\n").unwrap();
    let out = dir.file("out.json");
    let o = bench(&[
        "throughput",
        "-q",
        "-s",
        &c.url(),
        "--pairs-file",
        pairs.to_str().unwrap(),
        "--rate",
        "10M",
        "--warmup",
        "100ms",
        "-d",
        "500ms",
        "--drain",
        "300ms",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout.is_empty(), "the report went to the file");
    let r: Report = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let ModeResult::Throughput(t) = &r.result else {
        panic!()
    };
    assert_eq!((t.peers, t.flows), (3, 2));
    assert!(t.packets_delivered > 0);
}

#[test]
fn clear_errors() {
    // Nothing listens on this port (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let o = bench(&[
        "throughput",
        "-q",
        "-s",
        &url,
        "-d",
        "200ms",
        "--warmup",
        "0s",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot reach the server"), "{err}");

    let dir = Scratch::new("errors");
    let bad = dir.file("bad-pairs.txt");
    std::fs::write(&bad, "0 1\n1 one\n").unwrap();
    let o = bench(&["throughput", "-q", "--pairs-file", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad-pairs.txt:2"), "{err}");

    let o = bench(&["throughput", "-s", "https://localhost:1"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--ca"));
    let o = bench(&["idle", "-s", "ftp://x"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("http://"));
}
