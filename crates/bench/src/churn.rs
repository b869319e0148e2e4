//! `churn`: connect, handshake, disconnect — over and over, at a target
//! rate or as fast as the server allows with a bounded number in flight.
//!
//! Keys come from a pool (default 4096) so the client does no X25519 per
//! connection once each key has met the server; each key is reused only
//! after the whole pool has gone round, by which time its previous
//! connection is long closed. Connections close (a plain TCP close) as soon
//! as `serverInfo` arrives, or after `--hold`.

use crate::clock::{self, now_ns};
use crate::conn::PeerKey;
use crate::histogram::Histogram;
use crate::idle::{ms, note_failure};
use crate::pacing::Pacer;
use crate::pool::{Pool, PoolEvent};
use crate::procstat;
use crate::report::Churn;
use anyhow::{bail, Result};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::target::Target;

/// What to run.
#[derive(Debug, Clone)]
pub struct ChurnPlan {
    /// Handshakes per second to start; `None`: as fast as possible.
    pub rate: Option<f64>,
    /// Handshakes in flight at once.
    pub concurrency: usize,
    /// How long to keep starting connections.
    pub duration: Duration,
    /// Keep each connection this long after its handshake.
    pub hold: Duration,
    /// Size of the key pool.
    pub keys: usize,
    /// Per-connection handshake deadline.
    pub timeout: Duration,
}

/// What the run saw.
#[derive(Debug)]
pub struct ChurnOutcome {
    /// The report section.
    pub result: Churn,
    /// Negotiated TLS parameters.
    pub tls: Option<(String, String)>,
    /// Client CPU seconds during the duration.
    pub client_cpu_s: f64,
    /// Server samples at the start and end of the duration (given its pid).
    pub server: Option<(procstat::Sample, procstat::Sample)>,
    /// Machine samples at the start and end of the duration.
    pub machine: Option<(procstat::MachineCpu, procstat::MachineCpu)>,
}

/// Runs `plan` against `target`; `progress` gets a status line now and then.
pub fn run(
    target: &Target,
    plan: &ChurnPlan,
    server_pid: Option<u32>,
    progress: &mut dyn FnMut(String),
) -> Result<ChurnOutcome> {
    let keys: Vec<_> = (0..plan.keys.max(1)).map(|_| PeerKey::generate()).collect();
    let mut pool = Pool::new(plan.timeout)?;
    let mut events = Vec::new();
    let mut failures = BTreeMap::new();
    let mut first_error = None;
    let mut hist = Histogram::new();
    let (mut attempted, mut completed, mut completed_in, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let mut closing: VecDeque<(u64, usize)> = VecDeque::new();
    let hold_ns = clock::ns(plan.hold);

    // Meet the server once per key first, so the measured part has no
    // client-side X25519 in it.
    warm_keys(target, &keys, &mut pool, plan.concurrency)?;

    let cpu0 = procstat::cpu_seconds(None).unwrap_or(0.0);
    let server0 = server_pid.map(|p| procstat::sample(Some(p)));
    let machine0 = procstat::machine_cpu();
    let t0 = now_ns();
    let end = t0 + clock::ns(plan.duration);
    let mut pacer = Pacer::new(plan.rate, t0, 64);
    let mut skipped_at_end = None;
    let mut end_samples = None;
    let mut last_progress = 0;
    let drain_deadline = end + clock::ns(plan.timeout) + 1_000_000_000;
    loop {
        let now = now_ns();
        if now >= end {
            if skipped_at_end.is_none() {
                skipped_at_end = Some(pacer.skipped());
                end_samples = Some((
                    procstat::cpu_seconds(None).unwrap_or(0.0),
                    server_pid.map(|p| procstat::sample(Some(p))),
                    procstat::machine_cpu(),
                ));
            }
            if pool.in_flight() == 0 || now > drain_deadline {
                break;
            }
        } else {
            let room = plan.concurrency.saturating_sub(pool.in_flight()) as u64;
            let due = pacer.due(now);
            let n = due.min(room);
            for _ in 0..n {
                let key = keys[(attempted % keys.len() as u64) as usize].clone();
                attempted += 1;
                if let Err(e) = pool.connect(target, key) {
                    failed += 1;
                    note_failure(&e, &mut failures, &mut first_error);
                }
            }
            pacer.sent(n);
        }
        while closing.front().is_some_and(|&(t, _)| t <= now) {
            let (_, slot) = closing.pop_front().expect("checked");
            pool.close(slot);
        }
        let wait = if pacer.is_paced() || pool.in_flight() >= plan.concurrency {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        };
        pool.turn(wait, &mut events)?;
        for ev in events.drain(..) {
            match ev {
                PoolEvent::Ready { slot, handshake_ns } => {
                    completed += 1;
                    let t = now_ns();
                    if t < end {
                        completed_in += 1;
                    }
                    hist.record(handshake_ns);
                    if hold_ns == 0 {
                        pool.close(slot);
                    } else {
                        closing.push_back((t + hold_ns, slot));
                    }
                }
                PoolEvent::Failed {
                    error, was_ready, ..
                } => {
                    if !was_ready {
                        failed += 1;
                        note_failure(&error, &mut failures, &mut first_error);
                    }
                }
            }
        }
        if completed == 0 && failed >= 16 && failed == attempted {
            return Err(
                target.unreachable(first_error.as_deref().unwrap_or("every connection failed"))
            );
        }
        if now.saturating_sub(last_progress) > 200_000_000 {
            last_progress = now;
            let el = now.saturating_sub(t0) as f64 / 1e9;
            progress(format!(
                "churn: {el:.1}/{:.1} s  {:.0} handshakes/s  {failed} failed  {} in flight",
                plan.duration.as_secs_f64(),
                completed as f64 / el.max(1e-3),
                pool.in_flight()
            ));
        }
    }
    let (cpu1, server1, machine1) = end_samples.unwrap_or_else(|| {
        (
            procstat::cpu_seconds(None).unwrap_or(0.0),
            server_pid.map(|p| procstat::sample(Some(p))),
            procstat::machine_cpu(),
        )
    });
    let tls = pool.tls_parameters();
    pool.close_all();
    let duration_s = plan.duration.as_secs_f64();
    Ok(ChurnOutcome {
        result: Churn {
            target_rate: plan.rate,
            concurrency: plan.concurrency,
            duration_s,
            attempted,
            completed,
            failed,
            failures,
            first_error,
            handshakes_per_s: completed_in as f64 / duration_s.max(1e-9),
            handshake_ms: ms(hist.percentiles()),
            skipped: skipped_at_end.unwrap_or(0),
        },
        tls,
        client_cpu_s: cpu1 - cpu0,
        server: server0.zip(server1),
        machine: machine0.zip(machine1),
    })
}

/// Completes one handshake per key (bounded concurrency), so every key's
/// clientInfo is sealed and cached before measuring.
fn warm_keys(
    target: &Target,
    keys: &[std::sync::Arc<PeerKey>],
    pool: &mut Pool,
    concurrency: usize,
) -> Result<()> {
    let mut events = Vec::new();
    let (mut next, mut ok, mut failed) = (0, 0, 0);
    let mut first_error = None;
    let deadline = now_ns() + 120_000_000_000;
    while ok + failed < keys.len() {
        if now_ns() > deadline {
            bail!("churn: warming {} keys took longer than 120 s", keys.len());
        }
        while next < keys.len() && pool.in_flight() < concurrency.max(1) {
            if let Err(e) = pool.connect(target, keys[next].clone()) {
                return Err(target.unreachable(e));
            }
            next += 1;
        }
        pool.turn(Duration::from_millis(1), &mut events)?;
        for ev in events.drain(..) {
            match ev {
                PoolEvent::Ready { slot, .. } => {
                    pool.close(slot);
                    ok += 1;
                }
                PoolEvent::Failed { error, .. } => {
                    first_error.get_or_insert_with(|| error.to_string());
                    failed += 1;
                }
            }
        }
        if ok == 0 && failed >= keys.len().min(16) {
            return Err(target.unreachable(first_error.unwrap_or_default()));
        }
    }
    Ok(())
}
