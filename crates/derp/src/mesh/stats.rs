//! The mesh links' counters and their `ferry_mesh_*` metrics.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use ferry_engine::stat::exposition::{Exposition, Family, Kind};

use crate::metrics::{write_counter, write_gauge};

/// Counters of one mesh peer and the connection to it, for the metrics
/// page.
#[derive(Default)]
pub struct MeshPeerStats {
    pub(super) up: AtomicBool,
    /// The peer answered the Ferry mesh extension on this connection.
    pub(super) ferry: AtomicBool,
    pub(super) keys: AtomicI64,
    pub(super) connects: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) discarded: AtomicU64,
    pub(super) refused_keys: AtomicU64,
}

/// The links' counters, rendered as `ferry_mesh_*` metrics.
pub struct MeshStats {
    pub(super) peers: Vec<(String, Arc<MeshPeerStats>)>,
}

impl MeshStats {
    /// Writes the per-link metrics.
    pub fn render(&self, w: &mut String) {
        let series = |w: &mut String,
                      name: &str,
                      help: &str,
                      kind: Kind,
                      f: &dyn Fn(&MeshPeerStats) -> i64| {
            let mut w = Exposition::new(w);
            let mut samples = w.family(&Family::new(name, help, kind).labels(&["peer"]));
            for (peer, s) in &self.peers {
                samples.sample(&[peer], f(s));
            }
        };
        series(
            w,
            "ferry_mesh_link_up",
            "Whether the mesh link to the peer is connected (1) or not (0).",
            Kind::Gauge,
            &|s| s.up.load(Ordering::Relaxed).into(),
        );
        series(
            w,
            "ferry_mesh_link_ferry",
            "Whether the mesh peer speaks the Ferry mesh extension on the connection now (1; 0 for derper, an older Ferry or no connection).",
            Kind::Gauge,
            &|s| s.ferry.load(Ordering::Relaxed).into(),
        );
        series(
            w,
            "ferry_mesh_link_keys",
            "Keys the mesh peer announced on the link now.",
            Kind::Gauge,
            &|s| s.keys.load(Ordering::Relaxed),
        );
        series(
            w,
            "ferry_mesh_link_connects_total",
            "Mesh link handshakes completed.",
            Kind::Counter,
            &|s| s.connects.load(Ordering::Relaxed) as i64,
        );
        series(
            w,
            "ferry_mesh_link_failures_total",
            "Mesh link dials that failed or links that broke.",
            Kind::Counter,
            &|s| s.failures.load(Ordering::Relaxed) as i64,
        );
        series(
            w,
            "ferry_mesh_link_discarded_packets_total",
            "forwardPacket frames discarded because the link was down.",
            Kind::Counter,
            &|s| s.discarded.load(Ordering::Relaxed) as i64,
        );
        series(
            w,
            "ferry_mesh_link_refused_keys_total",
            "peerPresent announcements dropped because the link's peer had announced the most keys a link may hold.",
            Kind::Counter,
            &|s| s.refused_keys.load(Ordering::Relaxed) as i64,
        );
        let up = self
            .peers
            .iter()
            .filter(|(_, s)| s.up.load(Ordering::Relaxed))
            .count();
        write_gauge(
            w,
            "ferry_mesh_links_up",
            "Mesh links connected now.",
            up as i64,
        );
        write_counter(
            w,
            "ferry_mesh_links_configured",
            "Mesh peers configured with --mesh-with.",
            self.peers.len() as u64,
        );
    }
}
