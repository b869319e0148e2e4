//! Every mode of the `ferry-bench` binary, briefly, against an in-process
//! ceiling server (and, for stuck receivers, an in-process Ferry relay).
//! The checks are of the "sane" kind only — something was delivered, loss
//! is a fraction, percentiles are ordered — never a speed.

mod support;

use ferry_bench::ceiling::CeilingServer;
use ferry_bench::report::{ModeResult, Report, Throughput};
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use support::Scratch;

use ferry_proto::key::NodePrivate;

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

/// The throughput figures of a report.
fn throughput_of(r: &Report) -> &Throughput {
    let ModeResult::Throughput(t) = &r.result else {
        panic!("not a throughput result: {:?}", r.result)
    };
    t
}

/// Runs `throughput` with `stuck` stuck receivers among 4 healthy peers
/// (2 pairs) at 20 Mbit/s in all, with a 1.5 s window, and checks what any
/// server must give: healthy figures, gaps measured, stuck peers counted.
fn stuck_run(url: &str, stuck: usize) -> Throughput {
    let r = report(&[
        "throughput",
        "-q",
        "-s",
        url,
        "-n",
        "4",
        "--total-rate",
        "20M",
        "--stuck",
        &stuck.to_string(),
        "--stuck-size",
        "16384",
        "--stuck-rate",
        "200M",
        "--warmup",
        "200ms",
        "-d",
        "1500ms",
        "--drain",
        "2s",
    ]);
    let t = throughput_of(&r).clone();
    assert_eq!((t.peers, t.flows), (4, 2), "healthy figures only: {t:?}");
    assert!(t.packets_delivered > 0 && t.packets_delivered <= t.packets_sent);
    assert!((0.0..=1.0).contains(&t.loss));
    assert_eq!(t.disconnects, 0, "healthy peers stay connected: {t:?}");
    // Every receiver's window is covered by its stretches: at least one
    // per flow, none longer than the window.
    let g = t.gap_us;
    assert!(g.count >= 2 && g.is_ordered(), "{g:?}");
    assert!(g.max > 0.0 && g.max <= 1.5e6 + 1.0, "{g:?}");
    let s = t.stuck.clone().expect("stuck figures");
    assert_eq!((s.peers, s.flows, s.size), (stuck, 2 * stuck, 16384));
    assert_eq!(s.offered_mbps, Some(400.0), "2 senders × 200 Mbit/s");
    assert!(s.packets_sent > 0, "the senders sent to the stuck: {s:?}");
    assert!(s.packets_delivered <= s.packets_sent);
    assert_eq!(s.cut_off + s.held, stuck as u64, "{s:?}");
    t
}

#[test]
fn throughput_with_stuck_receivers_against_the_ceiling() {
    let c = Ceiling::start();
    let t = stuck_run(&c.url(), 2);
    let s = t.stuck.expect("stuck figures");
    // The ceiling never closes a connection: the stuck peers read what it
    // held for them once the window was over.
    assert_eq!((s.cut_off, s.held), (0, 2), "{s:?}");
    assert!(s.packets_delivered > 0, "{s:?}");
}

#[test]
fn stuck_receivers_cut_off_by_a_relay() {
    // A Ferry relay that closes a client after 300 ms without write
    // progress: both stuck receivers must be counted as cut off.
    let mut config = ferry_derp::DerpConfig::new(NodePrivate::generate());
    config.write_timeout = Some(Duration::from_millis(300));
    let server = support::relay(config, "127.0.0.1:0");
    let url = format!("http://{}", server.listen_addrs[0]);
    let t = stuck_run(&url, 2);
    server.shutdown();
    server.wait().expect("relay stops cleanly");
    let s = t.stuck.expect("stuck figures");
    assert_eq!((s.cut_off, s.held), (2, 0), "{s:?}");
}

#[test]
fn sampled_run_against_a_relay() {
    // A soak in miniature: 1.2 s of load sampled every 200 ms, against a
    // Ferry relay (this process) whose metrics carry the heap gauges.
    let server = support::relay(
        ferry_derp::DerpConfig::new(NodePrivate::generate()),
        "127.0.0.1:0",
    );
    let url = format!("http://{}", server.listen_addrs[0]);
    let pid = std::process::id().to_string();
    let r = report(&[
        "throughput",
        "-q",
        "-s",
        &url,
        "-n",
        "4",
        "--rate",
        "20M",
        "--warmup",
        "400ms",
        "-d",
        "800ms",
        "--drain",
        "500ms",
        "--server-pid",
        &pid,
        "--metrics",
        "--sample-every",
        "200ms",
    ]);
    server.shutdown();
    server.wait().expect("relay stops cleanly");
    // Sending starts 0.2 s before the first sample; the run lasts 1.2 s.
    let n = r.samples.len();
    assert!((4..=6).contains(&n), "{n} samples: {:?}", r.samples);
    let mut last_t = 0.0;
    for s in &r.samples {
        assert!(s.t_s > last_t, "samples in time order: {:?}", r.samples);
        last_t = s.t_s;
        assert!(
            s.rss.unwrap_or(0) > 0 && s.open_fds.unwrap_or(0) > 0,
            "{s:?}"
        );
        assert!(s.latency_us.is_ordered(), "{s:?}");
        let in_use = s.gauges.get("ferry_heap_in_use_bytes").copied();
        assert!(in_use.unwrap_or(0.0) > 0.0, "heap gauge in {:?}", s.gauges);
        assert!(
            s.gauges.contains_key("derp_current_connections"),
            "{:?}",
            s.gauges
        );
    }
    // 2 flows × 20 Mbit/s: once running, every interval carries traffic and
    // its latency.
    let later = &r.samples[2..];
    assert!(
        later
            .iter()
            .all(|s| s.received_mbps > 5.0 && s.latency_us.count > 0),
        "{later:?}"
    );
    // Samples are not part of an unsampled report.
    let c = Ceiling::start();
    let plain = report(&[
        "throughput",
        "-q",
        "-s",
        &c.url(),
        "-n",
        "2",
        "--rate",
        "10M",
        "--warmup",
        "100ms",
        "-d",
        "200ms",
        "--drain",
        "300ms",
    ]);
    assert!(plain.samples.is_empty());
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
