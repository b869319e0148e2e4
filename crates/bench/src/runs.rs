//! Turning command lines into runs and runs into reports.
//!
//! Each mode builds its plan, runs it, and assembles a [`Report`] with the
//! client's and (given `--server-pid`) the server's CPU and memory over the
//! measured window, so every report says whether the generator or the
//! server was the busy one.

use crate::ceiling::CeilingServer;
use crate::churn::{self, ChurnPlan};
use crate::cli::{
    CeilingArgs, ChurnArgs, Command, CommonArgs, EngineArgs, IdleArgs, LatencyArgs, PeerServerArgs,
    StuckArgs, ThroughputArgs,
};
use crate::clock::{self, now_ns};
use crate::idle::{self, IdlePlan};
use crate::pairs::Topology;
use crate::procstat;
use crate::progress::Progress;
use crate::report::{
    self, ClientUsage, ModeResult, PeerServer, Report, ServerUsage, Stuck, TargetInfo, Throughput,
    TimeSample,
};
use crate::stamp::{Kind, STAMP_LEN};
use crate::target::Target;
use crate::traffic::{self, FlowPlan, FlowStats, Servers, StuckPeers, TrafficOutcome, TrafficPlan};
use crate::varz;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Runs one command.
pub fn run(command: Command) -> Result<()> {
    clock::now_ns(); // start the run clock
    match command {
        Command::Throughput(a) => finish(&a.common.clone(), throughput(a)),
        Command::Latency(a) => finish(&a.common.clone(), latency(a)),
        Command::Idle(a) => finish(&a.common.clone(), idle(a)),
        Command::Churn(a) => finish(&a.common.clone(), churn(a)),
        Command::CeilingServer(a) => ceiling(a),
    }
}

/// Writes the report and a one-line summary.
fn finish(common: &CommonArgs, report: Result<Report>) -> Result<()> {
    let report = report?;
    let text = serde_json::to_string_pretty(&report)? + "\n";
    match &common.output {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    if !common.quiet {
        eprintln!("{}", summary(&report));
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
    }
    Ok(())
}

/// One human line per report.
pub fn summary(r: &Report) -> String {
    let tp = |t: &Throughput| {
        let stuck = t.stuck.as_ref().map_or(String::new(), |s| {
            format!(
                "; {} stuck receivers: {} cut off, {} held, {} of {} packets to them delivered",
                s.peers, s.cut_off, s.held, s.packets_delivered, s.packets_sent
            )
        });
        format!(
            "delivered {:.0} Mbit/s ({:.0} kpps) of {} offered, sent {:.0}, loss {:.3}%, one-way p50 {:.0} µs p99 {:.0} µs, longest gap {:.1} ms{stuck}",
            t.delivered_mbps,
            t.delivered_pps / 1e3,
            t.offered_mbps.map_or("unpaced".to_owned(), |o| format!("{o:.0}")),
            t.sent_mbps,
            t.loss * 100.0,
            t.latency_us.p50,
            t.latency_us.p99,
            t.gap_us.max / 1e3,
        )
    };
    let mut server = r
        .server
        .as_ref()
        .map(|s| format!("; server CPU {:.0}%", s.cpu_util * 100.0))
        .unwrap_or_default();
    if let Some(s) = r.peer.as_ref().and_then(|p| p.server.as_ref()) {
        server += &format!("; peer server CPU {:.0}%", s.cpu_util * 100.0);
    }
    let body =
        match &r.result {
            ModeResult::Throughput(t) => tp(t),
            ModeResult::Latency(l) => format!(
            "rtt p50 {:.0} µs p90 {:.0} p99 {:.0} p99.9 {:.0} max {:.0} ({} pongs, loss {:.3}%){}",
            l.rtt_us.p50,
            l.rtt_us.p90,
            l.rtt_us.p99,
            l.rtt_us.p999,
            l.rtt_us.max,
            l.pongs_received,
            l.ping_loss * 100.0,
            l.background.as_ref().map(|b| format!("; background {}", tp(b))).unwrap_or_default()
        ),
            ModeResult::Idle(i) => format!(
                "{} of {} connections held, {:.0} connects/s{}",
                i.established,
                i.requested,
                i.connect_rate,
                i.server_bytes_per_conn
                    .map(|b| format!(", server {:.1} KiB per connection", b / 1024.0))
                    .unwrap_or_default()
            ),
            ModeResult::Churn(c) => format!(
                "{:.0} handshakes/s, {} failed, handshake p50 {:.2} ms p99 {:.2} ms",
                c.handshakes_per_s, c.failed, c.handshake_ms.p50, c.handshake_ms.p99
            ),
        };
    let client = match r.client.busy_fraction {
        Some(b) => format!("client busy {:.0}%", b * 100.0),
        None => format!("client CPU {:.0}%", r.client.cpu_util_per_thread * 100.0),
    };
    format!("{}: {body}; {client}{server}", r.result.mode())
}

fn target(common: &CommonArgs) -> Result<Arc<Target>> {
    check_pid(common.server_pid, "--server-pid")?;
    Ok(Arc::new(Target::new(
        &common.server,
        common.connect,
        common.ca.as_deref(),
        common.insecure,
    )?))
}

fn check_pid(pid: Option<u32>, flag: &str) -> Result<()> {
    match pid {
        Some(pid) if !procstat::exists(pid) => bail!("{flag} {pid}: no such process"),
        _ => Ok(()),
    }
}

/// The run's servers: `--server`, and `--peer-url` for the receivers (with
/// the same TLS settings).
fn servers(common: &CommonArgs, peer: &PeerServerArgs) -> Result<Servers> {
    let main = target(common)?;
    let Some(url) = &peer.peer_url else {
        return Ok(Servers::single(main));
    };
    check_pid(peer.peer_server_pid, "--peer-server-pid")?;
    let target = Target::new(
        url,
        peer.peer_connect,
        common.ca.as_deref(),
        common.insecure,
    )
    .context("--peer-url")?;
    Ok(Servers {
        main,
        peer: Some(Arc::new(target)),
    })
}

fn target_info(target: &Target) -> TargetInfo {
    TargetInfo {
        url: target.url.clone(),
        addr: target.addr.to_string(),
        tls: target.tls.is_some(),
        insecure: target.insecure,
        tls_version: None,
        cipher_suite: None,
    }
}

fn base_report(target: &Target, config: serde_json::Value, result: ModeResult) -> Report {
    let mut warnings = Vec::new();
    if target.insecure {
        warnings.push("TLS certificate verification was disabled (--insecure)".to_owned());
    }
    Report {
        tool: "ferry-bench".to_owned(),
        schema: report::SCHEMA,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        target: target_info(target),
        config,
        client: ClientUsage {
            threads: 1,
            cpu_seconds: 0.0,
            cpu_util_per_thread: 0.0,
            busy_fraction: None,
            rss_bytes: procstat::rss_bytes(None).unwrap_or(0),
        },
        server: None,
        machine: None,
        metrics_delta: BTreeMap::new(),
        warnings,
        peer: None,
        samples: Vec::new(),
        result,
    }
}

// ---------------------------------------------------------------------------
// Traffic modes

/// What was observed around a traffic run's window.
struct Observed {
    outcome: TrafficOutcome,
    client_cpu_s: f64,
    machine: Option<(procstat::MachineCpu, procstat::MachineCpu)>,
    server: Option<ServerUsage>,
    metrics: BTreeMap<String, f64>,
    /// The receivers' server, with `--peer-url`.
    peer: Option<PeerServer>,
    /// Over time, with `--sample-every`.
    samples: Vec<TimeSample>,
    warnings: Vec<String>,
}

/// Takes the `--sample-every` samples of a run: each call closes one
/// interval.
struct Sampler {
    pid: Option<u32>,
    metrics: Option<Arc<Target>>,
    start: u64,
    last_t: u64,
    last_cpu: Option<f64>,
    last_sent: u64,
    last_recv: u64,
}

impl Sampler {
    fn new(pid: Option<u32>, metrics: Option<Arc<Target>>, start: u64) -> Self {
        Sampler {
            pid,
            metrics,
            start,
            last_t: start,
            last_cpu: pid.and_then(|p| procstat::cpu_seconds(Some(p))),
            last_sent: 0,
            last_recv: 0,
        }
    }

    fn take(&mut self, live: &traffic::Live, warnings: &mut Vec<String>) -> TimeSample {
        let t = now_ns();
        let dt = t.saturating_sub(self.last_t).max(1) as f64 / 1e9;
        let sent = live.sent_bytes.load(Ordering::Relaxed);
        let recv = live.recv_bytes.load(Ordering::Relaxed);
        let latency = std::mem::take(&mut *live.latency.lock().unwrap_or_else(|p| p.into_inner()));
        let cpu = self.pid.and_then(|p| procstat::cpu_seconds(Some(p)));
        let gauges = match self.metrics.as_ref().map(|m| scrape(m)) {
            Some(Ok(all)) => varz::select(&all, varz::SAMPLED),
            Some(Err(e)) => {
                if warnings.len() < 20 {
                    warnings.push(format!(
                        "could not read the server's metrics for a sample: {e:#}"
                    ));
                }
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        };
        let sample = TimeSample {
            t_s: t.saturating_sub(self.start) as f64 / 1e9,
            rss: self.pid.and_then(|p| procstat::rss_bytes(Some(p))),
            open_fds: self.pid.and_then(|p| procstat::open_fds(Some(p))),
            cpu_util: cpu.zip(self.last_cpu).map(|(b, a)| (b - a) / dt),
            sent_mbps: sent.saturating_sub(self.last_sent) as f64 * 8.0 / dt / 1e6,
            received_mbps: recv.saturating_sub(self.last_recv) as f64 * 8.0 / dt / 1e6,
            latency_us: latency.percentiles(),
            gauges,
        };
        (self.last_t, self.last_cpu, self.last_sent, self.last_recv) = (t, cpu, sent, recv);
        sample
    }
}

fn engine_plan(
    engine: &EngineArgs,
    peers: usize,
    flows: Vec<FlowPlan>,
    timeout: Duration,
) -> Result<TrafficPlan> {
    if engine.threads == 0 {
        bail!("--threads must be at least 1");
    }
    if engine.duration.is_zero() {
        bail!("--duration must be positive");
    }
    Ok(TrafficPlan {
        peers,
        flows,
        threads: engine.threads,
        warmup: engine.warmup,
        duration: engine.duration,
        drain: engine.drain,
        connect_timeout: timeout,
        out_cap: engine.out_cap.max(64 * 1024),
        spin: !engine.no_spin,
        batch_ns: crate::clock::ns(engine.batch),
        stuck: StuckPeers::default(),
        sample_every: engine.sample_every,
    })
}

/// A server process sampled at the window's edges.
struct Watched {
    pid: u32,
    start: procstat::Sample,
}

impl Watched {
    fn start(pid: Option<u32>) -> Option<Self> {
        pid.map(|pid| Watched {
            pid,
            start: procstat::sample(Some(pid)),
        })
    }

    /// Its CPU and memory from the start to now, over a `window_s` window.
    fn finish(self, window_s: f64) -> ServerUsage {
        let end = procstat::sample(Some(self.pid));
        ServerUsage {
            pid: self.pid,
            cpu_seconds: end.cpu_s - self.start.cpu_s,
            cpu_util: (end.cpu_s - self.start.cpu_s) / window_s,
            rss_before: self.start.rss,
            rss_after: end.rss,
            open_fds: procstat::open_fds(Some(self.pid)),
        }
    }
}

/// One scrape of a server's metrics.
type Scrape = Result<BTreeMap<String, f64>>;

/// The metric changes between two scrapes (when taken), or a warning
/// about `whose` metrics.
fn metrics_delta(
    scrapes: Option<(Scrape, Scrape)>,
    whose: &str,
    warnings: &mut Vec<String>,
) -> BTreeMap<String, f64> {
    match scrapes {
        Some((Ok(a), Ok(b))) => varz::delta(&a, &b),
        Some((Err(e), _)) | Some((_, Err(e))) => {
            warnings.push(format!("could not read {whose} metrics: {e:#}"));
            BTreeMap::new()
        }
        None => BTreeMap::new(),
    }
}

fn run_engine(
    servers: &Servers,
    peer_pid: Option<u32>,
    plan: TrafficPlan,
    common: &CommonArgs,
    what: &str,
) -> Result<Observed> {
    let mut progress = Progress::new(!common.quiet);
    let peers = plan.peers;
    let target = servers.main.clone();
    let connect_started = now_ns();
    let running = traffic::spawn(servers.clone(), plan.clone());
    let shared = running.shared.clone();
    // Wait for every peer (bounded by the handshake timeout plus slack).
    let connect_deadline = connect_started + clock::ns(plan.connect_timeout) + 5_000_000_000;
    loop {
        if let Some(e) = running.error() {
            running.abort();
            let _ = running.join(connect_started);
            bail!("{e}");
        }
        let ready = shared.live.ready.load(Ordering::SeqCst);
        if ready >= peers {
            break;
        }
        if now_ns() > connect_deadline || running.finished() {
            running.abort();
            let _ = running.join(connect_started);
            bail!(
                "only {ready} of {peers} peers connected to {} in time",
                servers.describe()
            );
        }
        progress.show(&format!("{what}: connecting {ready}/{peers}"));
        std::thread::sleep(Duration::from_millis(5));
    }
    let tl = running.start_at(now_ns() + 20_000_000);
    let pid = common.server_pid;
    let mut warnings = Vec::new();
    let mut samples = Vec::new();
    let sample_every = plan.sample_every.map(clock::ns);
    let mut sampler = Sampler::new(pid, common.metrics.then(|| target.clone()), tl.start);
    let mut next_sample = sample_every.map(|d| tl.start + d);
    clock::sleep_until(tl.start);
    // Samples in the warm-up too: a soak's first minutes are its baseline.
    while let Some(at) = next_sample.filter(|&at| at < tl.ws) {
        clock::sleep_until(at);
        samples.push(sampler.take(&shared.live, &mut warnings));
        next_sample = sample_every.map(|d| at + d);
    }

    // Metrics are read just before the window and just after it, the CPU
    // samples exactly at its edges, so a slow scrape cannot shift them.
    let scrape_both = || {
        common
            .metrics
            .then(|| (scrape(&target), servers.peer.as_ref().map(|p| scrape(p))))
    };
    clock::sleep_until(tl.ws.saturating_sub(50_000_000));
    let metrics_before = scrape_both();
    clock::sleep_until(tl.ws);
    let machine0 = procstat::machine_cpu();
    let client0 = procstat::sample(None);
    let server0 = Watched::start(pid);
    let peer0 = Watched::start(peer_pid);

    // Progress during the window.
    let (mut last_t, mut last_sent, mut last_recv) = (now_ns(), 0u64, 0u64);
    while now_ns() < tl.we {
        if running.error().is_some() || running.finished() {
            break;
        }
        std::thread::sleep(
            Duration::from_millis(100).min(Duration::from_nanos(tl.we.saturating_sub(now_ns()))),
        );
        let (t, s, r) = (
            now_ns(),
            shared.live.sent_bytes.load(Ordering::Relaxed),
            shared.live.recv_bytes.load(Ordering::Relaxed),
        );
        let dt = t.saturating_sub(last_t).max(1) as f64 / 1e9;
        if dt > 0.25 {
            let el = t.saturating_sub(tl.ws) as f64 / 1e9;
            progress.show(&format!(
                "{what}: {el:.1}/{:.1} s  sent {:.0} Mbit/s  received {:.0} Mbit/s",
                plan.duration.as_secs_f64(),
                (s - last_sent) as f64 * 8.0 / dt / 1e6,
                (r - last_recv) as f64 * 8.0 / dt / 1e6,
            ));
            (last_t, last_sent, last_recv) = (t, s, r);
        }
        if let Some(at) = next_sample.filter(|&at| now_ns() >= at) {
            samples.push(sampler.take(&shared.live, &mut warnings));
            next_sample = sample_every.map(|d| at + d);
        }
    }
    clock::sleep_until(tl.we);
    let machine1 = procstat::machine_cpu();
    let client1 = procstat::sample(None);
    let window_s = plan.duration.as_secs_f64();
    let server = server0.map(|w| w.finish(window_s));
    let peer_server = peer0.map(|w| w.finish(window_s));
    let metrics_after = scrape_both();
    progress.show(&format!("{what}: draining"));
    // Workers end on their own after the drain; bounded by the timeline.
    let join_deadline = tl.end + 5_000_000_000;
    while !running.finished() && now_ns() < join_deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !running.finished() {
        running.abort();
    }
    progress.finish();
    let outcome = running.join(connect_started).map_err(anyhow::Error::msg)?;
    let (main_before, peer_before) = metrics_before.unzip();
    let (main_after, peer_after) = metrics_after.unzip();
    let metrics = metrics_delta(main_before.zip(main_after), "server", &mut warnings);
    let peer = servers.peer.as_ref().map(|p| PeerServer {
        target: target_info(p),
        server: peer_server,
        metrics_delta: metrics_delta(
            peer_before.flatten().zip(peer_after.flatten()),
            "peer server",
            &mut warnings,
        ),
    });
    if outcome.disconnects > 0 {
        warnings.push(format!(
            "{} connections were lost during the run (first: {})",
            outcome.disconnects,
            outcome.first_disconnect.as_deref().unwrap_or("?")
        ));
    }
    if outcome.foreign_packets > 0 {
        warnings.push(format!(
            "{} packets arrived that ferry-bench did not send",
            outcome.foreign_packets
        ));
    }
    Ok(Observed {
        outcome,
        client_cpu_s: client1.cpu_s - client0.cpu_s,
        machine: machine0.zip(machine1),
        server,
        metrics,
        peer,
        samples,
        warnings,
    })
}

fn scrape(target: &Target) -> Result<BTreeMap<String, f64>> {
    varz::scrape(target, "/debug/varz")
}

/// The throughput figures of one kind of flow.
#[allow(clippy::too_many_arguments)]
fn throughput_result(
    st: &FlowStats,
    per_flow: &[u64],
    peers: usize,
    size: usize,
    offered_mbps: Option<f64>,
    outcome: &TrafficOutcome,
) -> Throughput {
    let w = outcome.window_s.max(1e-9);
    let size = size.max(STAMP_LEN);
    let flow_mbps: Vec<f64> = per_flow
        .iter()
        .map(|&n| n as f64 * size as f64 * 8.0 / w / 1e6)
        .collect();
    let loss = if st.sent_window == 0 {
        0.0
    } else {
        (1.0 - st.delivered_of_window as f64 / st.sent_window as f64).clamp(0.0, 1.0)
    };
    Throughput {
        peers,
        flows: per_flow.len(),
        size,
        offered_mbps,
        sent_mbps: st.sent_bytes_window as f64 * 8.0 / w / 1e6,
        delivered_mbps: st.arrived_bytes_in_window as f64 * 8.0 / w / 1e6,
        delivered_pps: st.arrived_in_window as f64 / w,
        packets_sent: st.sent_window,
        packets_delivered: st.delivered_of_window,
        loss,
        packets_backpressured: st.skipped_window,
        latency_us: st.latency.percentiles(),
        flow_min_mbps: if flow_mbps.is_empty() {
            0.0
        } else {
            flow_mbps.iter().copied().fold(f64::INFINITY, f64::min)
        },
        flow_max_mbps: flow_mbps.iter().copied().fold(0.0, f64::max),
        fairness: report::jain(&flow_mbps),
        window_s: outcome.window_s,
        connect_s: outcome.connect_s,
        disconnects: outcome.disconnects,
        other_frames: outcome.other_frames,
        gap_us: outcome.gaps.percentiles(),
        stuck: None,
    }
}

/// The stuck receivers of `throughput --stuck`, after the `topo`'s peers,
/// and the flows to them from every sender; their ids follow the first
/// `first_id` (healthy) flows.
fn stuck_plan(
    a: &StuckArgs,
    topo: &Topology,
    first_id: usize,
) -> Result<(StuckPeers, Vec<FlowPlan>)> {
    if a.stuck == 0 {
        return Ok((StuckPeers::default(), Vec::new()));
    }
    check_size(a.stuck_size, "--stuck-size")?;
    let peers = topo.peers..topo.peers + a.stuck;
    let mut senders: Vec<usize> = topo.flows.iter().map(|f| f.src).collect();
    senders.sort_unstable();
    senders.dedup();
    let pps = a.stuck_rate.split(a.stuck).pps(a.stuck_size);
    let flows = senders
        .iter()
        .flat_map(|&src| peers.clone().map(move |dst| (src, dst)))
        .enumerate()
        .map(|(k, (src, dst))| FlowPlan {
            id: (first_id + k) as u32,
            src,
            dst,
            kind: Kind::Data,
            pps,
            size: a.stuck_size,
        })
        .collect();
    let stuck = StuckPeers {
        peers,
        rcvbuf: a.stuck_rcvbuf,
    };
    Ok((stuck, flows))
}

/// The figures of the stuck receivers, fed by `flows` flows.
fn stuck_result(a: &StuckArgs, flows: usize, outcome: &TrafficOutcome) -> Stuck {
    let st = &outcome.stuck;
    let w = outcome.window_s.max(1e-9);
    let peers = a.stuck as u64;
    Stuck {
        peers: a.stuck,
        flows,
        size: a.stuck_size,
        offered_mbps: a
            .stuck_rate
            .split(a.stuck)
            .mbps(a.stuck_size)
            .map(|m| m * flows as f64),
        sent_mbps: st.sent_bytes_window as f64 * 8.0 / w / 1e6,
        packets_sent: st.sent_window,
        packets_delivered: st.delivered_of_window,
        packets_backpressured: st.skipped_window,
        cut_off: outcome.stuck_cut_off,
        held: peers.saturating_sub(outcome.stuck_cut_off),
    }
}

fn assemble(
    target: &Target,
    config: serde_json::Value,
    threads: usize,
    obs: Observed,
    result: ModeResult,
) -> Report {
    let mut r = base_report(target, config, result);
    let window = obs.outcome.window_s.max(1e-9);
    r.client.threads = threads;
    r.client.cpu_seconds = obs.client_cpu_s;
    r.client.cpu_util_per_thread = obs.client_cpu_s / window / threads.max(1) as f64;
    let busy = obs.outcome.work_s / window / threads.max(1) as f64;
    r.client.busy_fraction = Some(busy);
    if busy > 0.9 {
        r.warnings.push(format!(
            "ferry-bench's {threads} thread(s) were busy {:.0}% of the window: the load generator may have limited this run",
            busy * 100.0
        ));
    }
    if let Some((v, s)) = &obs.outcome.tls {
        r.target.tls_version = Some(v.clone());
        r.target.cipher_suite = Some(s.clone());
    }
    let server_cpu = [
        obs.server.as_ref(),
        obs.peer.as_ref().and_then(|p| p.server.as_ref()),
    ]
    .into_iter()
    .flatten()
    .map(|s| s.cpu_seconds)
    .sum::<f64>();
    r.machine = obs
        .machine
        .map(|(a, b)| machine_usage(a, b, obs.client_cpu_s + server_cpu, window));
    r.server = obs.server;
    r.metrics_delta = obs.metrics;
    r.peer = obs.peer;
    r.samples = obs.samples;
    r.warnings.extend(obs.warnings);
    add_disturbance_warning(&mut r);
    r
}

/// The rest of the machine between two samples; `ours_s` is what the
/// server and ferry-bench used.
fn machine_usage(
    a: procstat::MachineCpu,
    b: procstat::MachineCpu,
    ours_s: f64,
    window_s: f64,
) -> report::MachineUsage {
    let w = window_s.max(1e-9);
    let other_cpu = ((b.busy_s - a.busy_s - ours_s) / w).max(0.0);
    let steal = ((b.steal_s - a.steal_s) / w).max(0.0);
    let accounted = (b.total_s - a.total_s) / b.cpus.max(1) as f64;
    let lost = (1.0 - accounted / w).clamp(0.0, 1.0);
    report::MachineUsage {
        other_cpu,
        steal,
        lost,
        // `lost` is reported but decides nothing: under heavy softirq load
        // this VM's /proc/stat falls behind the wall clock by 20 % or more
        // with nothing else running, so it cannot tell a paused machine.
        disturbed: other_cpu > 0.1 || steal > 0.05,
    }
}

fn add_disturbance_warning(r: &mut Report) {
    if let Some(m) = &r.machine {
        if m.disturbed {
            r.warnings.push(format!(
                "the machine was busy with other work during this run ({:.2} cores used by other processes, {:.2} stolen): treat the figures with caution",
                m.other_cpu,
                m.steal,
            ));
        }
    }
}

fn check_size(size: usize, what: &str) -> Result<()> {
    if !(STAMP_LEN..=ferry_proto::frame::MAX_PACKET_SIZE).contains(&size) {
        bail!(
            "{what} {size}: must be between {STAMP_LEN} and {} bytes",
            ferry_proto::frame::MAX_PACKET_SIZE
        );
    }
    Ok(())
}

fn throughput(a: ThroughputArgs) -> Result<Report> {
    check_size(a.size, "--size")?;
    let topo = match &a.pairs_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read pair file {}", path.display()))?;
            Topology::parse(&path.display().to_string(), &text)?
        }
        None => Topology::pairs(a.peers, a.bidirectional)?,
    };
    let per_flow = match a.total_rate {
        Some(total) => total.split(topo.flows.len()),
        None => a.rate,
    };
    let pps = per_flow.pps(a.size);
    let offered_mbps = per_flow.mbps(a.size).map(|m| m * topo.flows.len() as f64);
    let mut flows: Vec<FlowPlan> = topo
        .flows
        .iter()
        .enumerate()
        .map(|(i, f)| FlowPlan {
            id: i as u32,
            src: f.src,
            dst: f.dst,
            kind: Kind::Data,
            pps,
            size: a.size,
        })
        .collect();
    let healthy = flows.len();
    let (stuck, stuck_flows) = stuck_plan(&a.stuck, &topo, healthy)?;
    flows.extend(stuck_flows);
    let servers = servers(&a.common, &a.peer)?;
    let peers = topo.peers + a.stuck.stuck;
    let mut plan = engine_plan(&a.engine, peers, flows, a.common.timeout)?;
    plan.stuck = stuck;
    let obs = run_engine(
        &servers,
        a.peer.peer_server_pid,
        plan,
        &a.common,
        "throughput",
    )?;
    let mut t = throughput_result(
        &obs.outcome.data,
        &obs.outcome.per_flow_delivered[..healthy],
        topo.peers,
        a.size,
        offered_mbps,
        &obs.outcome,
    );
    if a.stuck.stuck > 0 {
        let flows = obs.outcome.per_flow_delivered.len() - healthy;
        t.stuck = Some(stuck_result(&a.stuck, flows, &obs.outcome));
    }
    let config = serde_json::json!({
        "label": a.common.label,
        "peers": topo.peers,
        "flows": topo.flows.len(),
        "pairs_file": a.pairs_file,
        "bidirectional": a.bidirectional,
        "size": a.size,
        "rate_per_flow": per_flow.to_string(),
        "stuck": a.stuck.stuck,
        "stuck_size": a.stuck.stuck_size,
        "stuck_rate_per_sender": a.stuck.stuck_rate.to_string(),
        "stuck_rcvbuf": a.stuck.stuck_rcvbuf,
        "warmup_s": a.engine.warmup.as_secs_f64(),
        "duration_s": a.engine.duration.as_secs_f64(),
        "threads": a.engine.threads,
        "out_cap": a.engine.out_cap,
    });
    Ok(assemble(
        &servers.main,
        config,
        a.engine.threads,
        obs,
        ModeResult::Throughput(t),
    ))
}

fn latency(a: LatencyArgs) -> Result<Report> {
    check_size(a.ping_size, "--ping-size")?;
    check_size(a.size, "--size")?;
    if a.ping_pairs == 0 {
        bail!("--ping-pairs must be at least 1");
    }
    if !(a.ping_rate.is_finite() && a.ping_rate > 0.0) {
        bail!("--ping-rate must be a positive number of pings per second");
    }
    let load = if a.load_peers > 0 {
        Some(Topology::pairs(a.load_peers, false)?)
    } else {
        None
    };
    let load_flows = load.as_ref().map_or(0, |t| t.flows.len());
    let per_flow = match a.load_total_rate {
        Some(total) => total.split(load_flows),
        None => a.load_rate,
    };
    let mut flows: Vec<FlowPlan> = Vec::new();
    if let Some(t) = &load {
        for (i, f) in t.flows.iter().enumerate() {
            flows.push(FlowPlan {
                id: i as u32,
                src: f.src,
                dst: f.dst,
                kind: Kind::Data,
                pps: per_flow.pps(a.size),
                size: a.size,
            });
        }
    }
    // Ping peers come after the load peers.
    let base = a.load_peers;
    for p in 0..a.ping_pairs {
        flows.push(FlowPlan {
            id: (load_flows + p) as u32,
            src: base + 2 * p,
            dst: base + 2 * p + 1,
            kind: Kind::Ping,
            pps: Some(a.ping_rate),
            size: a.ping_size,
        });
    }
    let peers = base + 2 * a.ping_pairs;
    let servers = servers(&a.common, &a.peer)?;
    let plan = engine_plan(&a.engine, peers, flows, a.common.timeout)?;
    let obs = run_engine(&servers, a.peer.peer_server_pid, plan, &a.common, "latency")?;
    let o = &obs.outcome;
    let background = load.as_ref().map(|t| {
        throughput_result(
            &o.data,
            &o.per_flow_delivered[..load_flows],
            t.peers,
            a.size,
            per_flow.mbps(a.size).map(|m| m * load_flows as f64),
            o,
        )
    });
    let pings = o.ping.sent_window;
    let l = report::Latency {
        ping_pairs: a.ping_pairs,
        ping_rate: a.ping_rate,
        ping_size: a.ping_size,
        pings_sent: pings,
        pongs_received: o.ping.delivered_of_window,
        ping_loss: if pings == 0 {
            0.0
        } else {
            (1.0 - o.ping.delivered_of_window as f64 / pings as f64).clamp(0.0, 1.0)
        },
        rtt_us: o.ping.latency.percentiles(),
        background,
    };
    let config = serde_json::json!({
        "label": a.common.label,
        "ping_pairs": a.ping_pairs,
        "ping_rate": a.ping_rate,
        "ping_size": a.ping_size,
        "load_peers": a.load_peers,
        "load_rate_per_flow": per_flow.to_string(),
        "size": a.size,
        "warmup_s": a.engine.warmup.as_secs_f64(),
        "duration_s": a.engine.duration.as_secs_f64(),
        "threads": a.engine.threads,
    });
    Ok(assemble(
        &servers.main,
        config,
        a.engine.threads,
        obs,
        ModeResult::Latency(l),
    ))
}

// ---------------------------------------------------------------------------
// Connection modes

fn idle(a: IdleArgs) -> Result<Report> {
    if a.conns == 0 || a.concurrency == 0 {
        bail!("--conns and --concurrency must be at least 1");
    }
    let _ = ferry_sys::raise_nofile_limit();
    let target = target(&a.common)?;
    let mut progress = Progress::new(!a.common.quiet);
    let plan = IdlePlan {
        conns: a.conns,
        concurrency: a.concurrency,
        hold: a.hold,
        timeout: a.common.timeout,
    };
    let server0 = a.common.server_pid.map(|p| procstat::sample(Some(p)));
    let machine0 = procstat::machine_cpu();
    let out = idle::run(&target, &plan, a.common.server_pid, &mut |l| {
        progress.show(&l)
    })?;
    progress.finish();
    let config = serde_json::json!({
        "label": a.common.label,
        "conns": a.conns,
        "concurrency": a.concurrency,
        "hold_s": a.hold.as_secs_f64(),
    });
    let mut r = base_report(&target, config, ModeResult::Idle(out.result.clone()));
    r.client.cpu_seconds = out.client_cpu_s;
    r.client.cpu_util_per_thread = out.client_cpu_s / out.wall_s.max(1e-9);
    if let Some((v, s)) = out.tls {
        r.target.tls_version = Some(v);
        r.target.cipher_suite = Some(s);
    }
    if let (Some(pid), Some(s0)) = (a.common.server_pid, server0) {
        let s1 = procstat::sample(Some(pid));
        let (rss_before, rss_after) = out.server_rss.unwrap_or((s0.rss, s1.rss));
        r.server = Some(ServerUsage {
            pid,
            cpu_seconds: s1.cpu_s - s0.cpu_s,
            cpu_util: (s1.cpu_s - s0.cpu_s) / out.wall_s.max(1e-9),
            rss_before,
            rss_after,
            open_fds: out.server_fds,
        });
    }
    let server_cpu = r.server.as_ref().map_or(0.0, |s| s.cpu_seconds);
    r.machine = machine0
        .zip(procstat::machine_cpu())
        .map(|(m0, m1)| machine_usage(m0, m1, out.client_cpu_s + server_cpu, out.wall_s));
    add_disturbance_warning(&mut r);
    if out.result.established < out.result.requested {
        r.warnings.push(format!(
            "only {} of {} connections were established (first error: {})",
            out.result.established,
            out.result.requested,
            out.result.first_error.as_deref().unwrap_or("?")
        ));
    }
    Ok(r)
}

fn churn(a: ChurnArgs) -> Result<Report> {
    if a.concurrency == 0 || a.keys == 0 || a.duration.is_zero() {
        bail!("--concurrency, --keys and --duration must be positive");
    }
    let _ = ferry_sys::raise_nofile_limit();
    let target = target(&a.common)?;
    let mut progress = Progress::new(!a.common.quiet);
    let plan = ChurnPlan {
        rate: a.rate.0,
        concurrency: a.concurrency,
        duration: a.duration,
        hold: a.hold,
        keys: a.keys,
        timeout: a.common.timeout,
    };
    let out = churn::run(&target, &plan, a.common.server_pid, &mut |l| {
        progress.show(&l)
    })?;
    progress.finish();
    let config = serde_json::json!({
        "label": a.common.label,
        "rate": a.rate.0,
        "concurrency": a.concurrency,
        "duration_s": a.duration.as_secs_f64(),
        "hold_s": a.hold.as_secs_f64(),
        "keys": a.keys,
    });
    let mut r = base_report(&target, config, ModeResult::Churn(out.result.clone()));
    let window = a.duration.as_secs_f64();
    r.client.cpu_seconds = out.client_cpu_s;
    r.client.cpu_util_per_thread = out.client_cpu_s / window;
    if r.client.cpu_util_per_thread > 0.9 {
        r.warnings.push(format!(
            "ferry-bench kept its thread {:.0}% busy: the load generator may have limited this run",
            r.client.cpu_util_per_thread * 100.0
        ));
    }
    if let Some((v, s)) = out.tls {
        r.target.tls_version = Some(v);
        r.target.cipher_suite = Some(s);
    }
    if let (Some(pid), Some((s0, s1))) = (a.common.server_pid, out.server) {
        r.server = Some(ServerUsage {
            pid,
            cpu_seconds: s1.cpu_s - s0.cpu_s,
            cpu_util: (s1.cpu_s - s0.cpu_s) / window,
            rss_before: s0.rss,
            rss_after: s1.rss,
            open_fds: procstat::open_fds(Some(pid)),
        });
    }
    let server_cpu = r.server.as_ref().map_or(0.0, |s| s.cpu_seconds);
    r.machine = out
        .machine
        .map(|(m0, m1)| machine_usage(m0, m1, out.client_cpu_s + server_cpu, window));
    add_disturbance_warning(&mut r);
    Ok(r)
}

fn ceiling(a: CeilingArgs) -> Result<()> {
    let _ = ferry_sys::raise_nofile_limit();
    let server = CeilingServer::bind(a.addr, a.out_cap)
        .with_context(|| format!("ceiling-server: cannot listen on {}", a.addr))?;
    eprintln!(
        "ceiling-server: plain DERP forwarder on http://{}/derp (one thread; SIGTERM stops it)",
        server.local_addr()?
    );
    let stop = AtomicBool::new(false);
    server.run(&stop)?;
    Ok(())
}
