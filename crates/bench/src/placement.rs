//! Putting peers on shards: `throughput --cross-shard PCT` against a Ferry
//! server with several workers.
//!
//! Ferry gives every key one owner shard, chosen by a hash with a seed made
//! at start-up, so a client cannot pick its shard. It can learn it, though:
//! each shard publishes its registered connections
//! (`ferry_shard_connections{shard="k"}` on `/debug/varz`), and a key keeps
//! its owner for the life of the server process. So before the run,
//! [`learn`] connects fresh keys one at a time and reads which shard's gauge
//! rose, until every shard has the keys the [`layout`] asks of it; it then
//! closes them and the traffic engine connects the same keys again.
//!
//! The layout puts the requested share of the flows across shards and the
//! rest within one, spread so that every shard sends and receives the same
//! number of flows (flows `i` across go from shard `i % N` to `(i + 1) %
//! N`; flows `j` within stay on shard `j % N`). Each peer is in one flow, so
//! the packets' share equals the flows' when the flows carry equal rates.
//!
//! What a run got is proved by the server's own counters over the window:
//! `ferry_shard_cross_packets_total` (packets handed to another shard) over
//! `ferry_shard_packets_received_total` (packets read). A run whose measured
//! share is more than [`TOLERANCE`] from the request is an error (the report
//! is written, then ferry-bench fails); a missing counter is an error too,
//! never read as zero.

use crate::conn::PeerKey;
use crate::pairs::{Flow, Topology};
use crate::pool::{Pool, PoolEvent};
use crate::target::Target;
use crate::varz;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest allowed difference between the requested and the measured share
/// of cross-shard packets (a fraction: 0.05 is five points).
pub const TOLERANCE: f64 = 0.05;

/// The per-shard connection gauge the placement is read from.
const CONNECTIONS: &str = "ferry_shard_connections{";
/// Packets handed to another shard, per shard.
const CROSS: &str = "ferry_shard_cross_packets_total{";
/// Packets read, per shard.
const RECEIVED: &str = "ferry_shard_packets_received_total{";

/// The shards of each flow: `(sender's shard, receiver's shard)`.
pub fn layout(flows: usize, shards: usize, cross_share: f64) -> Result<Vec<(usize, usize)>> {
    if shards == 0 || flows == 0 {
        bail!("a layout needs at least one shard and one flow");
    }
    if !(0.0..=1.0).contains(&cross_share) {
        bail!("--cross-shard must be between 0 and 100 %");
    }
    let cross = (flows as f64 * cross_share).round() as usize;
    if cross > 0 && shards < 2 {
        bail!("--cross-shard above 0 needs a server with at least two shards (--workers 2)");
    }
    let mut out = Vec::with_capacity(flows);
    out.extend((0..cross).map(|i| (i % shards, (i + 1) % shards)));
    out.extend((0..flows - cross).map(|j| (j % shards, j % shards)));
    Ok(out)
}

/// Keys each shard must supply for `layout` (one per flow end).
pub fn needed(layout: &[(usize, usize)], shards: usize) -> Vec<usize> {
    let mut need = vec![0; shards];
    for &(s, d) in layout {
        need[s] += 1;
        need[d] += 1;
    }
    need
}

/// The run's peers and flows from `layout`, taking keys from each shard's
/// list in turn: peer `2i` sends flow `i` to peer `2i + 1`. Returns the
/// topology and the key of each peer.
pub fn topology(
    layout: &[(usize, usize)],
    mut by_shard: Vec<Vec<Arc<PeerKey>>>,
) -> Result<(Topology, Vec<Arc<PeerKey>>)> {
    let mut keys = Vec::with_capacity(layout.len() * 2);
    let mut flows = Vec::with_capacity(layout.len());
    for &(s, d) in layout {
        for shard in [s, d] {
            let key = by_shard
                .get_mut(shard)
                .and_then(Vec::pop)
                .with_context(|| format!("no key left on shard {shard}"))?;
            keys.push(key);
        }
        flows.push(Flow {
            src: keys.len() - 2,
            dst: keys.len() - 1,
        });
    }
    let topo = Topology {
        peers: keys.len(),
        flows,
    };
    Ok((topo, keys))
}

/// The value of each `{shard="k"}` series of `prefix`, indexed by `k`;
/// `None` when the server publishes no such series.
pub fn per_shard(samples: &BTreeMap<String, f64>, prefix: &str) -> Option<Vec<f64>> {
    let mut out: Vec<f64> = Vec::new();
    for (name, value) in samples.range(prefix.to_owned()..) {
        if !name.starts_with(prefix) {
            break;
        }
        let shard: usize = name
            .split("shard=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|n| n.parse().ok())?;
        if out.len() <= shard {
            out.resize(shard + 1, 0.0);
        }
        out[shard] = *value;
    }
    (!out.is_empty()).then_some(out)
}

/// Connects fresh keys one at a time, each held until the server shows
/// which shard registered it, until shard `k` has `need[k]` keys; then
/// closes them all and waits until the server has let them go. It starts
/// once the counts have settled (an earlier run's connections may still be
/// leaving); others that leave later are mostly tolerated too: a probe is
/// the one rise of a shard's count above the lowest it showed since the
/// probe started, which a departure from the same shard at the same moment
/// can hide (the probe then times out). Fails if the server's shard count is not
/// `need.len()`, its metrics lack the gauge, other connections arrive, or a
/// deadline passes.
pub fn learn(
    target: &Target,
    need: &[usize],
    timeout: Duration,
) -> Result<(Vec<Vec<Arc<PeerKey>>>, usize)> {
    if per_shard(&varz::scrape(target, "/debug/varz")?, CROSS).is_none() {
        bail!("--cross-shard: the server publishes no ferry_shard_cross_packets_total");
    }
    let read = || -> Result<Vec<f64>> {
        let samples = varz::scrape(target, "/debug/varz")?;
        per_shard(&samples, CONNECTIONS).with_context(|| {
            "--cross-shard: the server publishes no ferry_shard_connections (not Ferry?)"
        })
    };
    let base = settled(&read, timeout)?;
    if base.len() != need.len() {
        bail!(
            "--cross-shard: the server has {} shard(s), the layout was made for {}",
            base.len(),
            need.len()
        );
    }
    let mut pool = Pool::new(timeout)?;
    let mut by_shard: Vec<Vec<Arc<PeerKey>>> = vec![Vec::new(); need.len()];
    // The lowest count each shard has shown since the current probe was
    // started: connections of others that leave only lower it, so the
    // probe's registration is the one rise above it.
    let mut floor = base;
    let mut events = Vec::new();
    let max_probes = 64 + 8 * need.iter().sum::<usize>();
    let mut probes = 0;
    while by_shard.iter().zip(need).any(|(have, n)| have.len() < *n) {
        probes += 1;
        if probes > max_probes {
            bail!("--cross-shard: {max_probes} keys did not fill the shards {need:?}");
        }
        let key = PeerKey::generate();
        pool.connect(target, key.clone())
            .map_err(|e| anyhow::anyhow!("--cross-shard: connect: {e}"))?;
        let deadline = Instant::now() + timeout;
        let shard = loop {
            if Instant::now() > deadline {
                bail!("--cross-shard: no shard registered probe key {probes} within {timeout:?}");
            }
            pool.turn(Duration::from_millis(1), &mut events)?;
            if let Some(PoolEvent::Failed { error, .. }) = events
                .drain(..)
                .find(|e| matches!(e, PoolEvent::Failed { .. }))
            {
                bail!("--cross-shard: a probe connection failed: {error}");
            }
            if pool.ready() < pool.open() {
                continue;
            }
            let now = read()?;
            let rises: Vec<usize> = (0..now.len()).filter(|&k| now[k] > floor[k]).collect();
            for (f, n) in floor.iter_mut().zip(&now) {
                *f = f.min(*n);
            }
            match rises.as_slice() {
                [] => continue,
                [k] if now[*k] == floor[*k] + 1.0 => {
                    let k = *k;
                    floor = now;
                    break k;
                }
                _ => bail!(
                    "--cross-shard: connections other than the probe's arrived \
                     (per shard: {floor:?} → {now:?})"
                ),
            }
        };
        if by_shard[shard].len() < need[shard] {
            by_shard[shard].push(key);
        }
    }
    let before_close: f64 = read()?.iter().sum();
    let probes_open = pool.open() as f64;
    pool.close_all();
    let deadline = Instant::now() + timeout;
    while read()?.iter().sum::<f64>() > before_close - probes_open {
        if Instant::now() > deadline {
            bail!("--cross-shard: the probe connections were not released within {timeout:?}");
        }
        pool.turn(Duration::from_millis(5), &mut events)?;
    }
    Ok((by_shard, probes))
}

/// The per-shard connection counts once they have stopped moving: the
/// same in two readings [`SETTLE`] apart (connections of an earlier run
/// may still be leaving). Fails if they keep moving for `timeout`.
fn settled(read: &impl Fn() -> Result<Vec<f64>>, timeout: Duration) -> Result<Vec<f64>> {
    let deadline = Instant::now() + timeout;
    let mut last = read()?;
    loop {
        std::thread::sleep(SETTLE);
        let now = read()?;
        if now == last {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("--cross-shard: the server's connection counts kept changing for {timeout:?}");
        }
        last = now;
    }
}

/// How long the connection counts must stay the same before probing.
const SETTLE: Duration = Duration::from_millis(200);

/// What a `--cross-shard` run asked for and got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossShard {
    /// The server's shards.
    pub shards: usize,
    /// Requested share of packets across shards (0–1).
    pub requested: f64,
    /// Of the flows, those laid across shards.
    pub flows_across: usize,
    /// Measured share over the window: cross-shard packets over packets
    /// read, from the server's counters.
    pub measured: f64,
    /// Keys connected to learn the placement.
    pub probes: usize,
}

impl CrossShard {
    /// An error when the measured share is more than [`TOLERANCE`] off.
    pub fn check(&self) -> Result<()> {
        if !self.measured.is_finite() || (self.measured - self.requested).abs() > TOLERANCE {
            bail!(
                "--cross-shard: measured share {:.1} % is more than {:.0} points from the requested {:.1} %",
                self.measured * 100.0,
                TOLERANCE * 100.0,
                self.requested * 100.0
            );
        }
        Ok(())
    }
}

/// The share of packets handed across shards over a window's metric
/// changes; an error when either counter is missing or nothing was read.
pub fn measured_share(delta: &BTreeMap<String, f64>) -> Result<f64> {
    let sum = |prefix: &str| -> Option<f64> {
        let v: Vec<f64> = delta
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    let received = sum(RECEIVED)
        .context("--cross-shard: no ferry_shard_packets_received_total in the window's metrics")?;
    if received <= 0.0 {
        bail!("--cross-shard: the server read no packets in the window");
    }
    // A shard that handed nothing across has no change, so the delta (which
    // keeps changes only) lacks it; the series' existence is checked before
    // the run by `learn`, through the same scrape.
    let cross = sum(CROSS).unwrap_or(0.0);
    Ok(cross / received)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_balance_the_shards() {
        for pct in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let l = layout(8, 2, pct).unwrap();
            let across = l.iter().filter(|(s, d)| s != d).count();
            assert_eq!(across, (8.0 * pct) as usize, "{pct}");
            // Every shard sends 4 flows and receives 4.
            for shard in 0..2 {
                assert_eq!(l.iter().filter(|(s, _)| *s == shard).count(), 4, "{pct}");
                assert_eq!(l.iter().filter(|(_, d)| *d == shard).count(), 4, "{pct}");
            }
            assert_eq!(needed(&l, 2), vec![8, 8]);
        }
        assert_eq!(layout(4, 1, 0.0).unwrap(), vec![(0, 0); 4]);
        assert!(layout(4, 1, 0.5).is_err());
        assert!(layout(4, 2, 1.5).is_err());
    }

    #[test]
    fn topology_takes_keys_from_the_right_shard() {
        let l = layout(4, 2, 0.5).unwrap();
        let keys: Vec<Vec<Arc<PeerKey>>> = needed(&l, 2)
            .iter()
            .map(|n| (0..*n).map(|_| PeerKey::generate()).collect())
            .collect();
        let shard_of = |k: &Arc<PeerKey>| {
            keys.iter()
                .position(|v| v.iter().any(|x| Arc::ptr_eq(x, k)))
        };
        let (topo, peer_keys) = topology(&l, keys.clone()).unwrap();
        assert_eq!(topo.peers, 8);
        for (f, &(s, d)) in topo.flows.iter().zip(&l) {
            assert_eq!(shard_of(&peer_keys[f.src]), Some(s));
            assert_eq!(shard_of(&peer_keys[f.dst]), Some(d));
        }
        assert!(topology(&l, vec![Vec::new(), Vec::new()]).is_err());
    }

    #[test]
    fn shares_come_from_the_counters() {
        let d = varz::parse_prometheus(
            "ferry_shard_packets_received_total{shard=\"0\"} 100\nferry_shard_packets_received_total{shard=\"1\"} 100\nferry_shard_cross_packets_total{shard=\"0\"} 50\n",
        );
        assert_eq!(measured_share(&d).unwrap(), 0.25);
        assert!(
            measured_share(&BTreeMap::new()).is_err(),
            "a missing counter is an error"
        );
        let off = CrossShard {
            shards: 2,
            requested: 0.5,
            flows_across: 4,
            measured: 0.44,
            probes: 16,
        };
        assert!(off.check().is_err());
        assert!(CrossShard {
            measured: 0.46,
            ..off
        }
        .check()
        .is_ok());
    }

    #[test]
    fn reads_per_shard_series() {
        let s = varz::parse_prometheus(
            "ferry_shard_connections{shard=\"1\"} 3\nferry_shard_connections{shard=\"0\"} 2\nferry_shard_connectionsx 9\n",
        );
        assert_eq!(per_shard(&s, CONNECTIONS), Some(vec![2.0, 3.0]));
        assert_eq!(per_shard(&BTreeMap::new(), CONNECTIONS), None);
    }
}
