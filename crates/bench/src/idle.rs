//! `idle`: open many connections, hold them, and see what they cost the
//! server.
//!
//! Connections are opened with a bounded number of handshakes in flight;
//! the report gives the connect rate and handshake times. While they are
//! held the loop keeps reading (keepalives) and answering pings, like a
//! quiet real client. At the end of the hold the server's RSS is sampled
//! (given its pid) and compared with its RSS before the first connect.

use crate::clock::{self, now_ns};
use crate::conn::{LinkError, PeerKey};
use crate::histogram::Histogram;
use crate::pool::{Pool, PoolEvent};
use crate::procstat;
use crate::report::Idle;
use crate::target::Target;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// What to run.
#[derive(Debug, Clone)]
pub struct IdlePlan {
    /// Connections to open.
    pub conns: usize,
    /// Handshakes in flight at once.
    pub concurrency: usize,
    /// How long to hold them after the last one connected.
    pub hold: Duration,
    /// Per-connection handshake deadline.
    pub timeout: Duration,
}

/// What the run saw, with the server samples taken during the hold.
#[derive(Debug)]
pub struct IdleOutcome {
    /// The report section.
    pub result: Idle,
    /// Server RSS before connecting and at the end of the hold.
    pub server_rss: Option<(u64, u64)>,
    /// Server descriptors at the end of the hold.
    pub server_fds: Option<u64>,
    /// Negotiated TLS parameters.
    pub tls: Option<(String, String)>,
    /// Client CPU seconds over the whole run.
    pub client_cpu_s: f64,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
}

/// Runs `plan` against `target`; `progress` gets a status line now and then.
pub fn run(
    target: &Target,
    plan: &IdlePlan,
    server_pid: Option<u32>,
    progress: &mut dyn FnMut(String),
) -> Result<IdleOutcome> {
    let keys: Vec<_> = (0..plan.conns).map(|_| PeerKey::generate()).collect();
    let rss_before = server_pid.and_then(|p| procstat::rss_bytes(Some(p)));
    let cpu0 = procstat::cpu_seconds(None).unwrap_or(0.0);
    let mut pool = Pool::new(plan.timeout)?;
    let mut events = Vec::new();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_error: Option<String> = None;
    let mut hist = Histogram::new();
    let (mut next, mut established, mut failed) = (0usize, 0usize, 0usize);
    let t0 = now_ns();
    let mut last_ready = t0;
    let mut last_progress = 0;
    // Each connection ends (ready or failed) within the timeout, so this
    // phase is bounded by batches × timeout; the cap is a safety net.
    let batches = plan.conns.div_ceil(plan.concurrency.max(1)) as u64 + 1;
    let deadline = t0
        + clock::ns(plan.timeout)
            .saturating_mul(batches)
            .min(clock::ns(Duration::from_secs(3600)));
    while established + failed < plan.conns {
        let now = now_ns();
        if now > deadline {
            bail!("idle: connecting did not finish before the deadline ({established} established, {failed} failed)");
        }
        while next < plan.conns && pool.in_flight() < plan.concurrency {
            match pool.connect(target, keys[next].clone()) {
                Ok(_) => {}
                Err(e) => {
                    note_failure(&e, &mut failures, &mut first_error);
                    failed += 1;
                }
            }
            next += 1;
        }
        pool.turn(Duration::from_millis(2), &mut events)?;
        for ev in events.drain(..) {
            match ev {
                PoolEvent::Ready { handshake_ns, .. } => {
                    established += 1;
                    hist.record(handshake_ns);
                    last_ready = now_ns();
                }
                PoolEvent::Failed { error, .. } => {
                    note_failure(&error, &mut failures, &mut first_error);
                    failed += 1;
                }
            }
        }
        if established == 0 && failed >= plan.conns.min(16) {
            return Err(
                target.unreachable(first_error.as_deref().unwrap_or("every connection failed"))
            );
        }
        if now.saturating_sub(last_progress) > 200_000_000 {
            last_progress = now;
            progress(format!(
                "idle: connecting {established}/{} ({failed} failed)",
                plan.conns
            ));
        }
    }
    let connect_s = last_ready.saturating_sub(t0) as f64 / 1e9;

    // Hold: keep servicing the sockets so keepalives are read.
    let hold_end = now_ns() + clock::ns(plan.hold);
    let mut dropped = 0u64;
    while now_ns() < hold_end {
        pool.turn(Duration::from_millis(20), &mut events)?;
        for ev in events.drain(..) {
            if let PoolEvent::Failed { error, .. } = ev {
                dropped += 1;
                note_failure(&error, &mut failures, &mut first_error);
            }
        }
        let now = now_ns();
        if now.saturating_sub(last_progress) > 200_000_000 {
            last_progress = now;
            let left = hold_end.saturating_sub(now) as f64 / 1e9;
            progress(format!(
                "idle: holding {} connections ({left:.1} s left)",
                pool.ready()
            ));
        }
    }
    let rss_after = server_pid.and_then(|p| procstat::rss_bytes(Some(p)));
    let server_fds = server_pid.and_then(|p| procstat::open_fds(Some(p)));
    let tls = pool.tls_parameters();
    let held = pool.ready();
    pool.close_all();
    let server_rss = rss_before.zip(rss_after);
    let per_conn = server_rss
        .filter(|_| held > 0)
        .map(|(b, a)| (a as f64 - b as f64) / held as f64);
    Ok(IdleOutcome {
        result: Idle {
            requested: plan.conns,
            established,
            failed,
            failures,
            first_error,
            connect_s,
            connect_rate: if connect_s > 0.0 {
                established as f64 / connect_s
            } else {
                0.0
            },
            handshake_ms: ms(hist.percentiles()),
            hold_s: plan.hold.as_secs_f64(),
            dropped_while_held: dropped,
            server_bytes_per_conn: per_conn,
        },
        server_rss,
        server_fds,
        tls,
        client_cpu_s: procstat::cpu_seconds(None).unwrap_or(0.0) - cpu0,
        wall_s: now_ns().saturating_sub(t0) as f64 / 1e9,
    })
}

/// Counts a failure by kind and keeps the first in full.
pub fn note_failure(
    e: &LinkError,
    failures: &mut BTreeMap<String, u64>,
    first: &mut Option<String>,
) {
    *failures.entry(e.reason().to_owned()).or_default() += 1;
    if first.is_none() {
        *first = Some(e.to_string());
    }
}

/// Percentiles in microseconds, re-expressed in milliseconds.
pub fn ms(p: crate::histogram::Percentiles) -> crate::histogram::Percentiles {
    crate::histogram::Percentiles {
        count: p.count,
        min: p.min / 1e3,
        mean: p.mean / 1e3,
        p50: p.p50 / 1e3,
        p90: p.p90 / 1e3,
        p99: p.p99 / 1e3,
        p999: p.p999 / 1e3,
        max: p.max / 1e3,
    }
}
