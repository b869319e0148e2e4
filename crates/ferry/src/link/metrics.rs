//! What `ferry link` counts, rendered as Prometheus text and served over
//! plain HTTP at `metrics_addr` (`ferry link status` reads it there).
//!
//! Counters are atomics written by the forwarding tasks and read by the
//! renderer; nothing here blocks the data path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::config::Config;

/// Why a datagram was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// Towards the peer: the relay's queue was full.
    QueueFull,
    /// Towards the peer: the relay connection was down (or went down
    /// before the datagram was written).
    RelayDown,
    /// Towards the peer: the datagram came from an address other than the
    /// local WireGuard's.
    NotWireguard,
    /// Towards the peer: larger than a DERP packet may be.
    TooLarge,
    /// From the peer: the local socket refused it.
    DeliverFailed,
}

impl DropReason {
    pub(crate) const ALL: [DropReason; 5] = [
        DropReason::QueueFull,
        DropReason::RelayDown,
        DropReason::NotWireguard,
        DropReason::TooLarge,
        DropReason::DeliverFailed,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::RelayDown => "relay_down",
            DropReason::NotWireguard => "not_wireguard",
            DropReason::TooLarge => "too_large",
            DropReason::DeliverFailed => "deliver_failed",
        }
    }
}

/// Packets and bytes one way.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    packets: AtomicU64,
    bytes: AtomicU64,
}

impl Flow {
    pub(crate) fn add(&self, bytes: usize) {
        self.packets.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes as u64, Relaxed);
    }
}

/// One peer's counters.
#[derive(Debug, Default)]
pub(crate) struct PeerStats {
    /// From the local WireGuard, handed to DERP.
    pub to_peer: Flow,
    /// From DERP, handed to the local WireGuard.
    pub from_peer: Flow,
    drops: [AtomicU64; DropReason::ALL.len()],
    /// Whether the peer is heard from since the relay last said it was
    /// gone: each change is logged once (the relay repeats `peerGone`
    /// about every second while the peer is away).
    pub heard: AtomicBool,
    /// Whether the relay's last word on the peer was `peerGone`.
    pub gone: AtomicBool,
    /// `peerGone` notices about the peer.
    pub gone_notices: AtomicU64,
}

impl PeerStats {
    pub(crate) fn count_drop(&self, why: DropReason) {
        self.drops[why as usize].fetch_add(1, Relaxed);
    }
}

/// One relay connection's state and counters.
#[derive(Debug, Default)]
pub(crate) struct RelayStats {
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    pub disconnects: AtomicU64,
    /// Packets from link keys that are not configured peers.
    pub unknown_sender: AtomicU64,
}

/// Everything counted, in the configuration's order.
#[derive(Debug)]
pub(crate) struct Metrics {
    peers: Vec<(String, String, Arc<PeerStats>)>,
    relays: Vec<(String, Arc<RelayStats>)>,
}

impl Metrics {
    pub(crate) fn new(cfg: &Config) -> Metrics {
        Metrics {
            peers: cfg
                .peers
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        cfg.relays[p.relay].name.clone(),
                        Arc::default(),
                    )
                })
                .collect(),
            relays: cfg
                .relays
                .iter()
                .map(|r| (r.name.clone(), Arc::default()))
                .collect(),
        }
    }

    pub(crate) fn peer(&self, i: usize) -> Arc<PeerStats> {
        self.peers[i].2.clone()
    }

    pub(crate) fn relay(&self, i: usize) -> Arc<RelayStats> {
        self.relays[i].1.clone()
    }

    /// Prometheus text.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let o = &mut out;
        head(o, "ferry_link_peer_path", "gauge", "1 for the path each peer's datagrams take now (only derp in this version), with its relay.");
        for (peer, relay, _) in &self.peers {
            let _ = writeln!(
                o,
                "ferry_link_peer_path{{peer=\"{peer}\",path=\"derp\",relay=\"{relay}\"}} 1"
            );
        }
        for (name, help, packets) in [
            ("ferry_link_peer_packets_total", "Datagrams carried, by peer and direction (to_peer: from the local WireGuard; from_peer: to it).", true),
            ("ferry_link_peer_bytes_total", "Bytes of the datagrams carried, by peer and direction.", false),
        ] {
            head(o, name, "counter", help);
            for (peer, _, s) in &self.peers {
                for (dir, flow) in [("to_peer", &s.to_peer), ("from_peer", &s.from_peer)] {
                    let v = if packets { &flow.packets } else { &flow.bytes };
                    let _ = writeln!(o, "{name}{{peer=\"{peer}\",direction=\"{dir}\",path=\"derp\"}} {}", v.load(Relaxed));
                }
            }
        }
        head(
            o,
            "ferry_link_peer_drops_total",
            "counter",
            "Datagrams dropped, by peer and reason.",
        );
        for (peer, _, s) in &self.peers {
            for why in DropReason::ALL {
                let _ = writeln!(
                    o,
                    "ferry_link_peer_drops_total{{peer=\"{peer}\",reason=\"{}\"}} {}",
                    why.label(),
                    s.drops[why as usize].load(Relaxed)
                );
            }
        }
        head(
            o,
            "ferry_link_peer_gone_total",
            "counter",
            "peerGone notices from the relay: the peer was not connected to it when sent to.",
        );
        for (peer, _, s) in &self.peers {
            let _ = writeln!(
                o,
                "ferry_link_peer_gone_total{{peer=\"{peer}\"}} {}",
                s.gone_notices.load(Relaxed)
            );
        }
        type Read = fn(&RelayStats) -> u64;
        let relay_families: [(&str, &str, &str, Read); 4] = [
            (
                "ferry_link_relay_connected",
                "gauge",
                "1 while the DERP connection to the relay is up.",
                |s| u64::from(s.connected.load(Relaxed)),
            ),
            (
                "ferry_link_relay_connects_total",
                "counter",
                "DERP connections established to the relay.",
                |s| s.connects.load(Relaxed),
            ),
            (
                "ferry_link_relay_disconnects_total",
                "counter",
                "DERP connections lost, and connection attempts failed.",
                |s| s.disconnects.load(Relaxed),
            ),
            (
                "ferry_link_unknown_sender_drops_total",
                "counter",
                "Packets from link keys that are not configured peers, dropped.",
                |s| s.unknown_sender.load(Relaxed),
            ),
        ];
        for (name, kind, help, read) in relay_families {
            head(o, name, kind, help);
            for (relay, s) in &self.relays {
                let _ = writeln!(o, "{name}{{relay=\"{relay}\"}} {}", read(s));
            }
        }
        out
    }
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Serves `metrics` at `GET /metrics` on `listener` until the task is
/// dropped.
pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let mut conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                // Out of descriptors, usually: do not spin.
                tracing::debug!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut req = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                true
            })
            .await;
            if read != Ok(true) {
                return;
            }
            let line = String::from_utf8_lossy(&req);
            let (status, body) = match line.split_whitespace().take(2).collect::<Vec<_>>()[..] {
                ["GET", "/metrics"] => ("200 OK", metrics.render()),
                _ => ("404 Not Found", "GET /metrics\n".to_owned()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_follows_its_family_head_once() {
        let key = "nodekey:1111111111111111111111111111111111111111111111111111111111111111";
        let cfg = Config::from_toml(
            "f",
            &format!("key_file = \"k\"\nwireguard = \"127.0.0.1:2\"\n[[relay]]\nname = \"r\"\nurl = \"http://r/derp\"\n[[peer]]\nname = \"p\"\nlink_key = \"{key}\"\nendpoint = \"127.0.0.1:1\"\n"),
        )
        .unwrap();
        let m = Metrics::new(&cfg);
        m.peer(0).to_peer.add(100);
        m.peer(0).count_drop(DropReason::QueueFull);
        m.relay(0).connected.store(true, Relaxed);
        let text = m.render();
        let mut heads = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap().to_owned();
                assert!(heads.insert(current.clone()), "{current} twice");
            } else if !line.starts_with('#') {
                assert!(
                    line.starts_with(&format!("{current}{{")),
                    "{line} outside its family"
                );
            }
        }
        for sample in [
            "ferry_link_peer_packets_total{peer=\"p\",direction=\"to_peer\",path=\"derp\"} 1",
            "ferry_link_peer_bytes_total{peer=\"p\",direction=\"to_peer\",path=\"derp\"} 100",
            "ferry_link_peer_drops_total{peer=\"p\",reason=\"queue_full\"} 1",
            "ferry_link_peer_drops_total{peer=\"p\",reason=\"relay_down\"} 0",
            "ferry_link_relay_connected{relay=\"r\"} 1",
            "ferry_link_peer_path{peer=\"p\",path=\"derp\",relay=\"r\"} 1",
        ] {
            assert!(text.lines().any(|l| l == sample), "no {sample} in\n{text}");
        }
    }
}
