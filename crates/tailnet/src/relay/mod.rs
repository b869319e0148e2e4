//! The peer relay's control side: a DERP connection to a region of the
//! tailnet's DERP map, made with the node key and reported to the control
//! server as the node's home (`Hostinfo.NetInfo.PreferredDERP`, which
//! Headscale publishes as the node's `HomeDERP`: clients send their
//! allocation requests there), and the allocation requests that arrive on
//! it, answered by [`answer`] with endpoints of the shared table.
//!
//! Runs as a task on the control client's runtime. The DERP client
//! reconnects by itself; a DERP map that no longer has the region makes
//! the task pick another.

pub mod answer;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_client::{DerpClient, Event, Options};
use ferry_proto::derp_map::{DerpMap, Region};
use ferry_proto::key::{DiscoPrivate, NodePrivate};
use ferry_udp::peer_relay::{DropLog, PeerRelays, DROP_LOG_EVERY};
use tokio::sync::watch;

use crate::Shared;
use answer::Drop;

/// Wait before trying a region again after a failed first connection.
const RETRY: Duration = Duration::from_secs(5);
/// How often the peer-relay port asks the home region's STUN server for
/// its public address (when discovery is on).
const STUN_EVERY: Duration = Duration::from_secs(60);
/// The STUN port probed (the DERP map's default).
const STUN_PORT: u16 = 3478;

/// The STUN server of a region: its first node with a literal IPv4
/// address, at the default STUN port.
fn stun_server(region: &Region) -> Option<std::net::SocketAddr> {
    region.nodes.iter().find_map(|n| match n.ipv4 {
        ferry_proto::derp_map::AddrField::Literal(ip) => {
            Some(std::net::SocketAddr::from((ip, STUN_PORT)))
        }
        _ => None,
    })
}

/// The peer relay's counters.
#[derive(Debug, Default)]
pub struct Stats {
    allocated: AtomicU64,
    existing: AtomicU64,
    drops: [AtomicU64; Drop::ALL.len()],
    home_region: AtomicU32,
    derp_connects: AtomicU64,
}

impl Stats {
    /// Allocation requests answered with a new endpoint.
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Allocation requests answered with the pair's existing endpoint.
    pub fn existing(&self) -> u64 {
        self.existing.load(Ordering::Relaxed)
    }

    /// Packets dropped for `why`.
    pub fn dropped(&self, why: Drop) -> u64 {
        self.drops[why.index()].load(Ordering::Relaxed)
    }

    /// Counts a packet dropped for `why` at `now`; `Some(n)` if a line
    /// is to be logged about it (`n`: the drops of that reason not logged
    /// since the last line), at most once per reason per
    /// [`DROP_LOG_EVERY`] as `log` keeps track.
    pub fn count_drop(
        &self,
        why: Drop,
        log: &mut DropLog<{ Drop::ALL.len() }>,
        now: Instant,
    ) -> Option<u64> {
        self.drops[why.index()].fetch_add(1, Ordering::Relaxed);
        log.note(why.index(), 1, now)
    }

    /// The DERP region the node is connected to (0: none yet).
    pub fn home_region(&self) -> u32 {
        self.home_region.load(Ordering::Relaxed)
    }
}

/// The task's inputs.
pub(crate) struct Node {
    pub(crate) relays: Arc<PeerRelays>,
    pub(crate) derp_plain_http: bool,
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: NodePrivate,
    pub(crate) disco: DiscoPrivate,
    pub(crate) preferred_derp: Arc<watch::Sender<u32>>,
    pub(crate) stats: Arc<Stats>,
}

/// The region to use: the one already reported if the map still has it,
/// else the lowest region ID with a DERP node that may be a home.
fn pick_region(map: &DerpMap, current: u32) -> Option<&Region> {
    let usable = |r: &&Region| !r.no_measure_no_home && r.derp_nodes().next().is_some();
    map.regions
        .get(&u64::from(current))
        .filter(usable)
        .or_else(|| map.regions.values().find(usable))
}

impl Node {
    pub(crate) async fn run(self) {
        let mut versions = self.shared.versions.subscribe();
        let mut log = DropLog::new(DROP_LOG_EVERY);
        let mut limiter = answer::limiter();
        let mut first_seen = answer::FirstSeen::default();
        loop {
            // A region of the current DERP map.
            let region = loop {
                let netmap = self.shared.netmap();
                let current = *self.preferred_derp.borrow();
                if let Some(r) = netmap
                    .derp_map
                    .as_ref()
                    .and_then(|m| pick_region(m, current))
                {
                    break r.clone();
                }
                if versions.changed().await.is_err() {
                    return;
                }
            };
            let mut options = Options::default();
            options.plain_http = self.derp_plain_http;
            options.relay_sessions = false;
            let mut client = match DerpClient::connect_region(&region, self.node.clone(), options)
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(region = region.region_id, error = %e, "peer relay: cannot connect to the DERP region; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if let Err(e) = client.note_preferred(true).await {
                tracing::debug!(error = %e, "peer relay: notePreferred");
            }
            let id = u32::try_from(region.region_id).unwrap_or(0);
            self.stats.derp_connects.fetch_add(1, Ordering::Relaxed);
            self.stats.home_region.store(id, Ordering::Relaxed);
            self.preferred_derp.send_replace(id);
            tracing::info!(
                region = id,
                code = %region.region_code,
                "peer relay: connected to the home DERP region"
            );
            let stun = stun_server(&region).filter(|_| self.relays.stun().enabled());
            let mut stun_timer = tokio::time::interval(STUN_EVERY);
            loop {
                tokio::select! {
                    _ = stun_timer.tick(), if stun.is_some() => {
                        if let Some(server) = stun {
                            let mut txid = [0u8; 12];
                            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut txid);
                            self.relays.stun().probe(server, txid, Instant::now());
                        }
                    }
                    ev = client.recv() => match ev {
                        Ok(Event::Packet { src, data }) => {
                            let netmap = self.shared.netmap();
                            let result = answer::answer(
                                &netmap,
                                &mut limiter,
                                &self.disco,
                                &self.relays,
                                &src,
                                &data,
                                Instant::now(),
                                &ferry_proto::nacl::random_nonce(),
                            );
                            match result {
                                Ok(a) => {
                                    let counter = if a.existing { &self.stats.existing } else { &self.stats.allocated };
                                    counter.fetch_add(1, Ordering::Relaxed);
                                    if !a.existing {
                                        for (node, disco) in first_seen.note(&netmap, &a) {
                                            tracing::info!(peer = %node, %disco, vni = a.vni, "peer relay: endpoint allocated for a disco key first seen");
                                        }
                                    }
                                    if let Err(e) = client.send(&src, a.packet).await {
                                        tracing::debug!(error = %e, "peer relay: answer not sent");
                                    }
                                }
                                Err(why) => {
                                    if let Some(suppressed) = self.stats.count_drop(why, &mut log, Instant::now()) {
                                        tracing::info!(peer = %src, reason = why.label(), suppressed, "peer relay: disco packet dropped");
                                    }
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    },
                    changed = versions.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let netmap = self.shared.netmap();
                        let freed = answer::revoke_ungranted(&netmap, &self.relays);
                        if freed > 0 {
                            tracing::info!(freed, "peer relay: endpoints of requesters without the grant freed");
                        }
                        let still = netmap
                            .derp_map
                            .as_ref()
                            .and_then(|m| pick_region(m, id))
                            .is_some_and(|r| r.region_id == region.region_id);
                        if !still {
                            tracing::info!(region = id, "peer relay: the DERP map changed the home region");
                            break;
                        }
                    }
                }
            }
            client.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of dropped packets is counted packet by packet but logged
    /// once per reason per interval, the next line naming how many were
    /// not logged.
    #[test]
    fn drops_are_counted_each_and_logged_once_per_interval() {
        let stats = Stats::default();
        let mut log = DropLog::new(DROP_LOG_EVERY);
        let t0 = Instant::now();
        let mut lines = Vec::new();
        for i in 0..1_000u64 {
            let now = t0 + Duration::from_millis(i * 15);
            for why in [Drop::BadBox, Drop::UnknownPeer] {
                if let Some(n) = stats.count_drop(why, &mut log, now) {
                    lines.push((why, now.duration_since(t0).as_millis(), n));
                }
            }
        }
        assert_eq!(stats.dropped(Drop::BadBox), 1_000);
        assert_eq!(stats.dropped(Drop::UnknownPeer), 1_000);
        assert_eq!(
            lines,
            [
                (Drop::BadBox, 0, 0),
                (Drop::UnknownPeer, 0, 0),
                (Drop::BadBox, 10_005, 666),
                (Drop::UnknownPeer, 10_005, 666),
            ]
        );
    }

    #[test]
    fn the_home_is_kept_while_the_map_has_it() {
        let map = DerpMap::from_json(
            br#"{"Regions":{
              "901":{"RegionID":901,"RegionCode":"b","Nodes":[{"Name":"1b","RegionID":901,"HostName":"b"}]},
              "900":{"RegionID":900,"RegionCode":"a","Nodes":[{"Name":"1a","RegionID":900,"HostName":"a"}]},
              "902":{"RegionID":902,"RegionCode":"c","NoMeasureNoHome":true,"Nodes":[{"Name":"1c","RegionID":902,"HostName":"c"}]}}}"#,
        )
        .unwrap();
        assert_eq!(pick_region(&map, 0).unwrap().region_id, 900);
        assert_eq!(pick_region(&map, 901).unwrap().region_id, 901);
        assert_eq!(pick_region(&map, 902).unwrap().region_id, 900);
        assert_eq!(pick_region(&map, 7).unwrap().region_id, 900);
        // No literal IPv4 address: no STUN server.
        assert_eq!(stun_server(pick_region(&map, 900).unwrap()), None);
        let map = DerpMap::from_json(
            br#"{"Regions":{"900":{"RegionID":900,"RegionCode":"a","Nodes":[{"Name":"1a","RegionID":900,"HostName":"a","IPv4":"192.0.2.1"}]}}}"#,
        )
        .unwrap();
        assert_eq!(
            stun_server(pick_region(&map, 900).unwrap()),
            Some("192.0.2.1:3478".parse().unwrap())
        );
    }
}
