//! Running the traffic engine and observing its window: the server's and
//! the client's CPU and memory at the window's edges, the server's metrics
//! just before and after it, samples over time, and the report they make.

use super::{base_report, target_info};
use crate::cli::{CommonArgs, EngineArgs};
use crate::clock::{self, now_ns};
use crate::procstat;
use crate::progress::Progress;
use crate::report::{self, ModeResult, PeerServer, Report, ServerUsage, TimeSample};
use crate::target::Target;
use crate::traffic::{self, FlowPlan, Servers, StuckPeers, TrafficOutcome, TrafficPlan};
use crate::varz;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What was observed around a traffic run's window.
pub(super) struct Observed {
    pub(super) outcome: TrafficOutcome,
    client_cpu_s: f64,
    machine: Option<(procstat::MachineCpu, procstat::MachineCpu)>,
    server: Option<ServerUsage>,
    pub(super) metrics: BTreeMap<String, f64>,
    /// The receivers' server, with `--peer-url`.
    peer: Option<PeerServer>,
    /// Over time, with `--sample-every`.
    samples: Vec<TimeSample>,
    warnings: Vec<String>,
}

/// Takes the `--sample-every` samples of a run: each call closes one
/// interval.
pub(super) struct Sampler {
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

pub(super) fn engine_plan(
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
        keys: Vec::new(),
    })
}

/// A server process sampled at the window's edges.
pub(super) struct Watched {
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
pub(super) type Scrape = Result<BTreeMap<String, f64>>;

/// The metric changes between two scrapes (when taken), or a warning
/// about `whose` metrics.
pub(super) fn metrics_delta(
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

pub(super) fn run_engine(
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

pub(super) fn scrape(target: &Target) -> Result<BTreeMap<String, f64>> {
    varz::scrape(target, "/debug/varz")
}

pub(super) fn assemble(
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
pub(super) fn machine_usage(
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

pub(super) fn add_disturbance_warning(r: &mut Report) {
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
