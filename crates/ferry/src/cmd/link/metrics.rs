//! What `ferry link` counts, rendered as Prometheus text and served over
//! plain HTTP at `metrics_addr` (`ferry link status` reads it there).
//!
//! Counters are atomics written by the forwarding tasks and read by the
//! renderer; nothing here blocks the data path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use ferry_client::{
    endpoint::PathStats, Endpoint, PathEvent, PathKind, PathState, PathStatus, PeerStatus,
    SwitchReason,
};
use ferry_proto::key::NodePublic;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::config::Config;

/// Why a datagram was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// Towards the peer: the path's queue was full or its send failed.
    QueueFull,
    /// Towards the peer: on DERP with the relay connection down (or no
    /// relay reached yet).
    RelayDown,
    /// Towards the peer: the datagram came from an address other than the
    /// local WireGuard's.
    NotWireguard,
    /// Towards the peer: larger than a path may carry.
    TooLarge,
    /// Towards the peer: under `only`, no path of that kind works now.
    NoPath,
    /// From the peer: the local socket refused it.
    DeliverFailed,
    /// From the peer: the local socket's send buffer was full (the way to
    /// the local WireGuard still held earlier datagrams).
    LocalSocketFull,
}

impl DropReason {
    pub(crate) const ALL: [DropReason; 7] = [
        DropReason::QueueFull,
        DropReason::RelayDown,
        DropReason::NotWireguard,
        DropReason::TooLarge,
        DropReason::NoPath,
        DropReason::DeliverFailed,
        DropReason::LocalSocketFull,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::RelayDown => "relay_down",
            DropReason::NotWireguard => "not_wireguard",
            DropReason::TooLarge => "too_large",
            DropReason::NoPath => "no_path",
            DropReason::DeliverFailed => "deliver_failed",
            DropReason::LocalSocketFull => "local_socket_full",
        }
    }
}

/// The kinds of path, best first, as metrics, logs and `status --json`
/// name them.
pub(crate) const KINDS: [PathKind; 3] = [PathKind::Direct, PathKind::RelaySession, PathKind::Derp];

pub(crate) fn kind_label(kind: PathKind) -> &'static str {
    match kind {
        PathKind::Direct => "direct",
        PathKind::RelaySession => "relay",
        PathKind::Derp => "derp",
    }
}

/// Why a switch happened, as a label.
pub(crate) const REASONS: [SwitchReason; 4] = [
    SwitchReason::Better,
    SwitchReason::Silent,
    SwitchReason::Removed,
    SwitchReason::Policy,
];

pub(crate) fn reason_label(reason: SwitchReason) -> &'static str {
    match reason {
        SwitchReason::Better => "better",
        SwitchReason::Silent => "silent",
        SwitchReason::Removed => "removed",
        SwitchReason::Policy => "policy",
        _ => "other",
    }
}

/// Why a switch happened, for a log line.
pub(crate) fn reason_text(reason: SwitchReason) -> &'static str {
    match reason {
        SwitchReason::Better => "a better path answered",
        SwitchReason::Silent => "the path went silent",
        SwitchReason::Removed => "the path was removed",
        SwitchReason::Policy => "the peer's prefer/only",
        _ => "another reason",
    }
}

/// One peer's counters kept here (the per-path traffic is the endpoint's).
#[derive(Debug, Default)]
pub(crate) struct PeerStats {
    drops: [AtomicU64; DropReason::ALL.len()],
    /// Whether a datagram from the peer has arrived (logged once).
    pub heard: AtomicBool,
    /// The current path's kind: 0 none, else 1 + `PathKind as u8`. Starts
    /// on DERP, as the endpoint does.
    current: AtomicU8,
    switches: [AtomicU64; REASONS.len()],
    lost: AtomicU64,
    /// GSO trains to the local WireGuard the kernel refused, sent again
    /// one datagram at a time.
    pub deliver_gso_fallbacks: AtomicU64,
}

impl PeerStats {
    /// Counts `n` datagrams dropped for `why`.
    pub(crate) fn count_drops(&self, why: DropReason, n: usize) {
        if n > 0 {
            self.drops[why as usize].fetch_add(n as u64, Relaxed);
        }
    }

    /// The datagrams dropped for `why` so far.
    pub(crate) fn dropped(&self, why: DropReason) -> u64 {
        self.drops[why as usize].load(Relaxed)
    }

    /// The current path's kind, as the last switch said.
    pub(crate) fn current(&self) -> Option<PathKind> {
        match self.current.load(Relaxed) {
            0 => Some(PathKind::Derp),
            NO_PATH => None,
            k => KINDS.into_iter().find(|&kind| 1 + kind as u8 == k),
        }
    }

    /// Counts a switch.
    pub(crate) fn switched(&self, ev: &PathEvent) {
        self.current
            .store(ev.to.map_or(NO_PATH, |p| 1 + p.kind() as u8), Relaxed);
        self.switches[ev.reason as usize].fetch_add(1, Relaxed);
        self.lost.fetch_add(ev.lost, Relaxed);
    }
}

/// [`PeerStats::current`]'s value for "no path".
const NO_PATH: u8 = u8::MAX;

/// One relay connection's state and counters, as the endpoint's last
/// event about it left them.
#[derive(Debug, Default)]
pub(crate) struct RelayStats {
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    pub disconnects: AtomicU64,
}

/// Everything counted, in the configuration's order.
#[derive(Debug)]
pub(crate) struct Metrics {
    peers: Vec<(String, String, NodePublic, Arc<PeerStats>)>,
    relays: Vec<(String, Arc<RelayStats>)>,
    endpoint: OnceLock<Arc<Endpoint>>,
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
                        p.link_key,
                        Arc::default(),
                    )
                })
                .collect(),
            relays: cfg
                .relays
                .iter()
                .map(|r| (r.name.clone(), Arc::default()))
                .collect(),
            endpoint: OnceLock::new(),
        }
    }

    pub(crate) fn peer(&self, i: usize) -> Arc<PeerStats> {
        self.peers[i].3.clone()
    }

    pub(crate) fn relay(&self, i: usize) -> Arc<RelayStats> {
        self.relays[i].1.clone()
    }

    /// The endpoint whose paths are shown, once it is up.
    pub(crate) fn set_endpoint(&self, ep: Arc<Endpoint>) {
        let _ = self.endpoint.set(ep);
    }

    /// Prometheus text.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let o = &mut out;
        let status: Vec<Option<PeerStatus>> = self
            .peers
            .iter()
            .map(|(_, _, key, _)| self.endpoint.get().and_then(|ep| ep.peer_status(key)))
            .collect();
        head(o, "ferry_link_peer_path", "gauge", "1 for the kind of path each peer's datagrams take now (direct, relay, derp), with the peer's relay; none while no allowed path works.");
        for ((peer, relay, _, _), st) in self.peers.iter().zip(&status) {
            if let Some(kind) = st.as_ref().and_then(|s| s.active).map(|a| a.kind()) {
                let path = kind_label(kind);
                let _ = writeln!(
                    o,
                    "ferry_link_peer_path{{peer=\"{peer}\",path=\"{path}\",relay=\"{relay}\"}} 1"
                );
            }
        }
        type Read = fn(&PathStats) -> u64;
        let traffic: [(&str, &str, &str, Read); 4] = [
            ("ferry_link_peer_packets_total", "to_peer", "Datagrams carried, by peer, direction (to_peer: from the local WireGuard; from_peer: to it) and path, as the endpoint counts them.", |s| s.tx_packets),
            ("ferry_link_peer_packets_total", "from_peer", "", |s| s.rx_packets),
            ("ferry_link_peer_bytes_total", "to_peer", "Bytes of the datagrams carried, by peer, direction and path.", |s| s.tx_bytes),
            ("ferry_link_peer_bytes_total", "from_peer", "", |s| s.rx_bytes),
        ];
        for (name, dir, help, read) in traffic {
            if !help.is_empty() {
                head(o, name, "counter", help);
            }
            for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
                for kind in present(st) {
                    let n: u64 = of_kind(st, kind).map(|p| read(&p.stats)).sum();
                    let _ = writeln!(
                        o,
                        "{name}{{peer=\"{peer}\",direction=\"{dir}\",path=\"{}\"}} {n}",
                        kind_label(kind)
                    );
                }
            }
        }
        head(
            o,
            "ferry_link_peer_path_working",
            "gauge",
            "1 when a path of this kind to the peer answers its probes.",
        );
        for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
            for kind in present(st) {
                let up = of_kind(st, kind).any(|p| p.state == PathState::Working);
                let _ = writeln!(
                    o,
                    "ferry_link_peer_path_working{{peer=\"{peer}\",path=\"{}\"}} {}",
                    kind_label(kind),
                    u8::from(up)
                );
            }
        }
        head(o, "ferry_link_peer_rtt_seconds", "gauge", "The last round trip a probe measured on the peer's path of this kind (the active one, else the fastest).");
        for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
            let active = st.as_ref().and_then(|s| s.active);
            for kind in present(st) {
                let rtt = of_kind(st, kind)
                    .find(|p| Some(p.addr) == active)
                    .and_then(|p| p.rtt)
                    .or_else(|| of_kind(st, kind).filter_map(|p| p.rtt).min());
                if let Some(rtt) = rtt {
                    let _ = writeln!(
                        o,
                        "ferry_link_peer_rtt_seconds{{peer=\"{peer}\",path=\"{}\"}} {}",
                        kind_label(kind),
                        rtt.as_secs_f64()
                    );
                }
            }
        }
        head(o, "ferry_link_peer_switches_total", "counter", "Path switches, by peer and reason (better: a better path answered; silent: the path stopped answering; removed; policy).");
        for (peer, _, _, s) in &self.peers {
            for reason in REASONS {
                let _ = writeln!(
                    o,
                    "ferry_link_peer_switches_total{{peer=\"{peer}\",reason=\"{}\"}} {}",
                    reason_label(reason),
                    s.switches[reason as usize].load(Relaxed)
                );
            }
        }
        head(o, "ferry_link_peer_switch_lost_total", "counter", "Datagrams sent on a path after its last answer, when it went silent or was removed: possibly lost at a switch.");
        for (peer, _, _, s) in &self.peers {
            let _ = writeln!(
                o,
                "ferry_link_peer_switch_lost_total{{peer=\"{peer}\"}} {}",
                s.lost.load(Relaxed)
            );
        }
        head(
            o,
            "ferry_link_peer_last_switch_timestamp_seconds",
            "gauge",
            "When the peer's path last changed (Unix time), from and to which kind, and why.",
        );
        for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
            if let Some(ev) = st.as_ref().and_then(|s| s.last_switch.as_ref()) {
                let at = ev
                    .at
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                let kind =
                    |p: Option<ferry_client::PathAddr>| p.map_or("none", |p| kind_label(p.kind()));
                let _ = writeln!(
                    o,
                    "ferry_link_peer_last_switch_timestamp_seconds{{peer=\"{peer}\",from=\"{}\",to=\"{}\",reason=\"{}\"}} {at:.3}",
                    kind(ev.from),
                    kind(ev.to),
                    reason_label(ev.reason)
                );
            }
        }
        head(
            o,
            "ferry_link_peer_drops_total",
            "counter",
            "Datagrams dropped, by peer and reason.",
        );
        for (peer, _, _, s) in &self.peers {
            for why in DropReason::ALL {
                let _ = writeln!(
                    o,
                    "ferry_link_peer_drops_total{{peer=\"{peer}\",reason=\"{}\"}} {}",
                    why.label(),
                    s.dropped(why)
                );
            }
        }
        head(o, "ferry_link_rejected_total", "counter", "Datagrams and DERP packets dropped because they were not from a configured peer (unknown link key, or not a peer message).");
        let stats = self.endpoint.get().map(|ep| ep.stats()).unwrap_or_default();
        let _ = writeln!(o, "ferry_link_rejected_total {}", stats.rejected.total());
        head(o, "ferry_link_gso_fallbacks_total", "counter", "UDP GSO trains the kernel refused (a path MTU under 1500 bytes), sent again one datagram at a time: to_peer on the paths to the peers, from_peer to the local WireGuard.");
        let delivered: u64 = self
            .peers
            .iter()
            .map(|(_, _, _, s)| s.deliver_gso_fallbacks.load(Relaxed))
            .sum();
        let _ = writeln!(
            o,
            "ferry_link_gso_fallbacks_total{{direction=\"to_peer\"}} {}",
            stats.gso_fallbacks
        );
        let _ = writeln!(
            o,
            "ferry_link_gso_fallbacks_total{{direction=\"from_peer\"}} {delivered}"
        );
        type RelayRead = fn(&RelayStats) -> u64;
        let relay_families: [(&str, &str, &str, RelayRead); 3] = [
            (
                "ferry_link_relay_connected",
                "gauge",
                "1 while the DERP connection to the relay is up.",
                |s| u64::from(s.connected.load(Relaxed)),
            ),
            (
                "ferry_link_relay_connects_total",
                "counter",
                "DERP connections to the relay established.",
                |s| s.connects.load(Relaxed),
            ),
            (
                "ferry_link_relay_disconnects_total",
                "counter",
                "DERP connections lost and connection attempts failed.",
                |s| s.disconnects.load(Relaxed),
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

/// The kinds of path the peer has now, best first (DERP always).
fn present(st: &Option<PeerStatus>) -> impl Iterator<Item = PathKind> + '_ {
    KINDS
        .into_iter()
        .filter(move |&k| k == PathKind::Derp || of_kind(st, k).next().is_some())
}

fn of_kind(st: &Option<PeerStatus>, kind: PathKind) -> impl Iterator<Item = &PathStatus> {
    st.iter()
        .flat_map(|s| s.paths.iter())
        .filter(move |p| p.addr.kind() == kind)
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Scrapes served at once. A connection beyond them is closed at once:
/// each holds a descriptor until its request comes or times out, and a
/// link out of descriptors cannot reconnect to its relays.
const MAX_SCRAPES: usize = 16;

/// How often a refused scrape is logged, at most.
const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Serves `metrics` at `GET /metrics` on `listener` until the task is
/// dropped, [`MAX_SCRAPES`] connections at a time.
pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    let mut refused = 0u64;
    let mut logged: Option<tokio::time::Instant> = None;
    loop {
        let (mut conn, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, usually: do not spin.
                tracing::debug!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            refused += 1;
            let now = tokio::time::Instant::now();
            if logged.is_none_or(|t| now.duration_since(t) >= REFUSED_LOG_INTERVAL) {
                logged = Some(now);
                tracing::warn!(%peer, refused, "metrics: {MAX_SCRAPES} scrapes already open; connection closed");
            }
            drop(conn);
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _place = place;
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

    fn config() -> Config {
        let key = "nodekey:1111111111111111111111111111111111111111111111111111111111111111";
        Config::from_toml(
            "f",
            &format!("key_file = \"k\"\nwireguard = \"127.0.0.1:2\"\n[[relay]]\nname = \"r\"\nurl = \"http://r/derp\"\n[[peer]]\nname = \"p\"\nlink_key = \"{key}\"\nendpoint = \"127.0.0.1:1\"\n"),
        )
        .unwrap()
    }

    /// Connections that send nothing hold a place each until the request
    /// timeout: beyond [`MAX_SCRAPES`] of them a new connection is closed
    /// at once instead of holding a descriptor (which the link needs for
    /// reconnecting to its relays); once they are gone, a scrape works.
    #[tokio::test]
    async fn idle_metrics_connections_are_capped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::new(Metrics::new(&config()))));
        let mut idle = Vec::new();
        for _ in 0..MAX_SCRAPES {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // Each is taken in turn: the last one holds the last place once a
        // connection after it is refused.
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut byte)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a connection beyond the cap was kept: {closed:?}"
        );
        drop(idle);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await.unwrap();
            let mut body = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), c.read_to_string(&mut body)).await;
            if body.starts_with("HTTP/1.1 200 OK") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no scrape after the idle ones left: {body:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.abort();
    }

    #[test]
    fn every_sample_follows_its_family_head_once() {
        let key = "nodekey:1111111111111111111111111111111111111111111111111111111111111111";
        let cfg = Config::from_toml(
            "f",
            &format!("key_file = \"k\"\nwireguard = \"127.0.0.1:2\"\n[[relay]]\nname = \"r\"\nurl = \"http://r/derp\"\n[[peer]]\nname = \"p\"\nlink_key = \"{key}\"\nendpoint = \"127.0.0.1:1\"\n"),
        )
        .unwrap();
        let m = Metrics::new(&cfg);
        m.peer(0).count_drops(DropReason::QueueFull, 1);
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
                    line.starts_with(&format!("{current}{{"))
                        || line.starts_with(&format!("{current} ")),
                    "{line} outside its family"
                );
            }
        }
        for sample in [
            "ferry_link_peer_packets_total{peer=\"p\",direction=\"to_peer\",path=\"derp\"} 0",
            "ferry_link_peer_bytes_total{peer=\"p\",direction=\"from_peer\",path=\"derp\"} 0",
            "ferry_link_peer_switches_total{peer=\"p\",reason=\"silent\"} 0",
            "ferry_link_rejected_total 0",
            "ferry_link_gso_fallbacks_total{direction=\"to_peer\"} 0",
            "ferry_link_gso_fallbacks_total{direction=\"from_peer\"} 0",
            "ferry_link_peer_drops_total{peer=\"p\",reason=\"queue_full\"} 1",
            "ferry_link_peer_drops_total{peer=\"p\",reason=\"relay_down\"} 0",
            "ferry_link_relay_connected{relay=\"r\"} 1",
        ] {
            assert!(text.lines().any(|l| l == sample), "no {sample} in\n{text}");
        }
    }
}
