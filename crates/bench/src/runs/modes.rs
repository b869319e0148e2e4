//! The modes: each turns its arguments into a plan, runs it and builds
//! its result.

use super::observe::{add_disturbance_warning, assemble, engine_plan, machine_usage, run_engine};
use super::{base_report, check_size, servers, target};
use crate::ceiling::CeilingServer;
use crate::churn::{self, ChurnPlan};
use crate::cli::{CeilingArgs, ChurnArgs, IdleArgs, LatencyArgs, StuckArgs, ThroughputArgs};
use crate::conn::PeerKey;
use crate::idle::{self, IdlePlan};
use crate::pairs::Topology;
use crate::placement::{self, CrossShard};
use crate::procstat;
use crate::progress::Progress;
use crate::report::{self, ModeResult, Report, ServerUsage, Stuck, Throughput};
use crate::stamp::{Kind, STAMP_LEN};
use crate::traffic::{FlowPlan, FlowStats, StuckPeers, TrafficOutcome};
use anyhow::{bail, Context, Result};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The throughput figures of one kind of flow.
#[allow(clippy::too_many_arguments)]
pub(super) fn throughput_result(
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
        cross_shard: None,
    }
}

/// The stuck receivers of `throughput --stuck`, after the `topo`'s peers,
/// and the flows to them from every sender; their ids follow the first
/// `first_id` (healthy) flows.
pub(super) fn stuck_plan(
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
pub(super) fn stuck_result(a: &StuckArgs, flows: usize, outcome: &TrafficOutcome) -> Stuck {
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

pub(super) fn throughput(a: ThroughputArgs) -> Result<Report> {
    check_size(a.size, "--size")?;
    let mut keys = Vec::new();
    let mut layout = None;
    let topo = match (&a.pairs_file, a.cross_shard) {
        (None, Some(pct)) => {
            let l = cross_shard_layout(&a, pct)?;
            let (topo, k) = placement::topology(&l.flows, l.keys)?;
            keys = k;
            layout = Some(l.result);
            topo
        }
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read pair file {}", path.display()))?;
            Topology::parse(&path.display().to_string(), &text)?
        }
        (None, None) => Topology::pairs(a.peers, a.bidirectional)?,
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
    plan.keys = keys;
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
    if let Some(mut c) = layout {
        c.measured = placement::measured_share(&obs.metrics)?;
        t.cross_shard = Some(c);
    }
    let config = serde_json::json!({
        "label": a.common.label,
        "peers": topo.peers,
        "flows": topo.flows.len(),
        "pairs_file": a.pairs_file,
        "cross_shard_pct": a.cross_shard,
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

/// A `--cross-shard` run's flows, shards and keys, learned from the server.
struct CrossLayout {
    flows: Vec<(usize, usize)>,
    keys: Vec<Vec<Arc<PeerKey>>>,
    result: CrossShard,
}

fn cross_shard_layout(a: &ThroughputArgs, pct: f64) -> Result<CrossLayout> {
    if a.peers < 2 || !a.peers.is_multiple_of(2) {
        bail!(
            "--peers {}: pairs need an even number of peers, at least 2",
            a.peers
        );
    }
    let target = target(&a.common)?;
    let shards = placement::per_shard(
        &crate::varz::scrape(&target, "/debug/varz")?,
        "ferry_shard_connections{",
    )
    .context("--cross-shard: the server publishes no ferry_shard_connections (not Ferry?)")?
    .len();
    let share = pct / 100.0;
    let flows = placement::layout(a.peers / 2, shards, share)?;
    let need = placement::needed(&flows, shards);
    let (keys, probes) = placement::learn(&target, &need, a.common.timeout)?;
    Ok(CrossLayout {
        result: CrossShard {
            shards,
            requested: share,
            flows_across: flows.iter().filter(|(s, d)| s != d).count(),
            measured: f64::NAN,
            probes,
        },
        flows,
        keys,
    })
}

pub(super) fn latency(a: LatencyArgs) -> Result<Report> {
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

pub(super) fn idle(a: IdleArgs) -> Result<Report> {
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

pub(super) fn churn(a: ChurnArgs) -> Result<Report> {
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

pub(super) fn ceiling(a: CeilingArgs) -> Result<()> {
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
