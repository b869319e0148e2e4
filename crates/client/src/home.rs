//! Choosing a home region from a DERP map by measured latency.
//!
//! Each region that may be measured (not `NoMeasureNoHome`, with at least
//! one DERP node) gets a real DERP connection, made the way
//! [`DerpClient::connect_region`] makes it, and a few pings; its latency is
//! the fastest round trip. The home is the region with the lowest latency
//! times its `HomeParams.RegionScore`. A client that already has a home
//! keeps it unless another region is clearly faster
//! ([`SWITCH_RATIO`]), so small jitter does not move it back and forth.
//! The measurement connections are closed, except the winner's, which
//! [`connect_home`] hands back already connected.

use crate::{DerpClient, Error, Options};
use ferry_proto::derp_map::DerpMap;
use ferry_proto::key::NodePrivate;
use std::time::Duration;

/// A region replaces the current home only when its scored latency is
/// below this fraction of the current home's.
pub const SWITCH_RATIO: f64 = 0.7;

/// One region's measurement.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// The region.
    pub region_id: u64,
    /// The fastest ping round trip, or why the region could not be
    /// measured.
    pub latency: Result<Duration, Error>,
}

/// Measures every region of `map` that may be measured, concurrently:
/// connect, `samples` pings (at least one), disconnect.
pub async fn measure(
    map: &DerpMap,
    key: &NodePrivate,
    options: &Options,
    samples: usize,
) -> Vec<Measurement> {
    measure_keeping(map, key, options, samples)
        .await
        .into_iter()
        .map(|(m, _)| m)
        .collect()
}

/// The home region for these measurements: the lowest latency times the
/// region's score, unless `current` is measured and within
/// [`SWITCH_RATIO`] of it. `None` when no region was measured.
pub fn choose(map: &DerpMap, measurements: &[Measurement], current: Option<u64>) -> Option<u64> {
    let scored = |m: &Measurement| {
        let latency = m.latency.as_ref().ok()?;
        Some((
            m.region_id,
            latency.as_secs_f64() * map.region_score(m.region_id),
        ))
    };
    let best = measurements
        .iter()
        .filter_map(scored)
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let current = current.and_then(|id| {
        measurements
            .iter()
            .filter(|m| m.region_id == id)
            .find_map(scored)
    });
    match current {
        Some(cur) if best.1 >= cur.1 * SWITCH_RATIO => Some(cur.0),
        _ => Some(best.0),
    }
}

/// Measures `map`, picks the home with [`choose`] (no current home), and
/// returns a client connected to it that has told the server it is its
/// home (`notePreferred`), with the region ID and every measurement.
pub async fn connect_home(
    map: &DerpMap,
    key: &NodePrivate,
    options: &Options,
    samples: usize,
) -> Result<(DerpClient, u64, Vec<Measurement>), Error> {
    let mut measured = measure_keeping(map, key, options, samples).await;
    let tried = measured.len();
    let list: Vec<Measurement> = measured.iter().map(|(m, _)| m.clone()).collect();
    let home = choose(map, &list, None).ok_or(Error::NoUsableRegion { tried })?;
    let client = measured
        .iter_mut()
        .find(|(m, _)| m.region_id == home)
        .and_then(|(_, c)| c.take())
        .expect("a measured region has its client");
    client.note_preferred(true).await?;
    Ok((client, home, list))
}

async fn measure_keeping(
    map: &DerpMap,
    key: &NodePrivate,
    options: &Options,
    samples: usize,
) -> Vec<(Measurement, Option<DerpClient>)> {
    let mut tasks = tokio::task::JoinSet::new();
    for region in map.regions.values() {
        if region.no_measure_no_home || region.derp_nodes().next().is_none() {
            continue;
        }
        let (region, key, options) = (region.clone(), key.clone(), options.clone());
        tasks.spawn(async move {
            let region_id = region.region_id;
            match measure_region(&region, key, options, samples).await {
                Ok((latency, client)) => (
                    Measurement {
                        region_id,
                        latency: Ok(latency),
                    },
                    Some(client),
                ),
                Err(e) => (
                    Measurement {
                        region_id,
                        latency: Err(e),
                    },
                    None,
                ),
            }
        });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        // A measuring task only ends by returning (no panics, no aborts).
        out.push(done.expect("measurement task completes"));
    }
    out.sort_by_key(|(m, _)| m.region_id);
    out
}

async fn measure_region(
    region: &ferry_proto::derp_map::Region,
    key: NodePrivate,
    options: Options,
    samples: usize,
) -> Result<(Duration, DerpClient), Error> {
    let client = DerpClient::connect_region(region, key, options).await?;
    let mut best = Duration::MAX;
    for _ in 0..samples.max(1) {
        best = best.min(client.ping().await?);
    }
    Ok((best, client))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(region_id: u64, ms: Option<u64>) -> Measurement {
        Measurement {
            region_id,
            latency: ms.map(Duration::from_millis).ok_or(Error::NotConnected),
        }
    }

    #[test]
    fn lowest_scored_latency_wins_with_hysteresis() {
        let map = DerpMap::from_json(br#"{"HomeParams":{"RegionScore":{"2":0.25}}}"#).unwrap();
        let ms = [m(1, Some(30)), m(2, Some(100)), m(3, Some(20)), m(4, None)];
        // Region 2 scores 25 ms, region 3 20 ms.
        assert_eq!(choose(&map, &ms, None), Some(3));
        // Home 2 stays: 20 is not below 0.7 × 25.
        assert_eq!(choose(&map, &ms, Some(2)), Some(2));
        // Home 1 (30 ms) moves: 20 < 21.
        assert_eq!(choose(&map, &ms, Some(1)), Some(3));
        // A home that could not be measured is replaced.
        assert_eq!(choose(&map, &ms, Some(4)), Some(3));
        assert_eq!(choose(&map, &[m(4, None)], Some(4)), None);
        assert_eq!(choose(&map, &[], None), None);
    }
}
