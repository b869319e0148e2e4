//! Turning command lines into runs and runs into reports.
//!
//! Each mode builds its plan, runs it, and assembles a [`Report`] with the
//! client's and (given `--server-pid`) the server's CPU and memory over the
//! measured window, so every report says whether the generator or the
//! server was the busy one.
//!
//! - `modes`: each mode's plan and result;
//! - `observe`: the traffic engine's run and what is observed around
//!   its window (CPU, memory, metrics, samples), assembled into a report.

use crate::cli::{Command, CommonArgs, PeerServerArgs};
use crate::clock;
use crate::procstat;
use crate::report::{self, ClientUsage, ModeResult, Report, TargetInfo, Throughput};
use crate::stamp::STAMP_LEN;
use crate::target::Target;
use crate::traffic::Servers;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

mod modes;
mod observe;

use modes::{ceiling, churn, idle, latency, throughput};

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
    if let ModeResult::Throughput(Throughput {
        cross_shard: Some(c),
        ..
    }) = &report.result
    {
        c.check()?;
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

fn check_size(size: usize, what: &str) -> Result<()> {
    if !(STAMP_LEN..=ferry_proto::frame::MAX_PACKET_SIZE).contains(&size) {
        bail!(
            "{what} {size}: must be between {STAMP_LEN} and {} bytes",
            ferry_proto::frame::MAX_PACKET_SIZE
        );
    }
    Ok(())
}
