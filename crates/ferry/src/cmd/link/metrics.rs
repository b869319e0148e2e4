//! What `ferry link` counts, rendered as Prometheus text and served over
//! plain HTTP at `metrics_addr` (`ferry link status` reads it there).
//!
//! Counters are atomics written by the forwarding tasks and read by the
//! renderer; nothing here blocks the data path.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::UNIX_EPOCH;

use ferry_engine::stat::exposition::{Exposition, Family, Fixed};
use ferry_engine::stat::scrape::{Pages, ScrapeServer};

use ferry_client::{
    endpoint::PathStats, Endpoint, PathEvent, PathKind, PathState, PathStatus, PeerStatus,
    SwitchReason,
};
use ferry_proto::key::NodePublic;

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
    /// The relay's URLs from the configuration: `url`, or `urls` in order.
    pub nodes: Vec<String>,
    pub connected: AtomicBool,
    /// Which of `nodes` the connection is up to: its index plus one; 0
    /// while down.
    pub node: AtomicU64,
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
                .map(|r| {
                    let nodes = r.urls().cloned().collect();
                    (
                        r.name.clone(),
                        Arc::new(RelayStats {
                            nodes,
                            ..RelayStats::default()
                        }),
                    )
                })
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
        let mut w = Exposition::new(&mut out);
        let status: Vec<Option<PeerStatus>> = self
            .peers
            .iter()
            .map(|(_, _, key, _)| self.endpoint.get().and_then(|ep| ep.peer_status(key)))
            .collect();
        let mut f = w.family(&PEER_PATH);
        for ((peer, relay, _, _), st) in self.peers.iter().zip(&status) {
            if let Some(kind) = st.as_ref().and_then(|s| s.active).map(|a| a.kind()) {
                f.sample(&[peer, kind_label(kind), relay], 1u8);
            }
        }
        type Read = fn(&PathStats) -> u64;
        let traffic: [(&Family, [(&str, Read); 2]); 2] = [
            (
                &PEER_PACKETS,
                [
                    ("to_peer", |s| s.tx_packets),
                    ("from_peer", |s| s.rx_packets),
                ],
            ),
            (
                &PEER_BYTES,
                [("to_peer", |s| s.tx_bytes), ("from_peer", |s| s.rx_bytes)],
            ),
        ];
        for (family, directions) in traffic {
            let mut f = w.family(family);
            for (dir, read) in directions {
                for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
                    for kind in present(st) {
                        let n: u64 = of_kind(st, kind).map(|p| read(&p.stats)).sum();
                        f.sample(&[peer, dir, kind_label(kind)], n);
                    }
                }
            }
        }
        let mut f = w.family(&PATH_WORKING);
        for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
            for kind in present(st) {
                let up = of_kind(st, kind).any(|p| p.state == PathState::Working);
                f.sample(&[peer, kind_label(kind)], up);
            }
        }
        let mut f = w.family(&RTT);
        for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
            let active = st.as_ref().and_then(|s| s.active);
            for kind in present(st) {
                let rtt = of_kind(st, kind)
                    .find(|p| Some(p.addr) == active)
                    .and_then(|p| p.rtt)
                    .or_else(|| of_kind(st, kind).filter_map(|p| p.rtt).min());
                if let Some(rtt) = rtt {
                    f.sample(&[peer, kind_label(kind)], rtt.as_secs_f64());
                }
            }
        }
        let mut f = w.family(&SWITCHES);
        for (peer, _, _, s) in &self.peers {
            for reason in REASONS {
                let n = s.switches[reason as usize].load(Relaxed);
                f.sample(&[peer, reason_label(reason)], n);
            }
        }
        let mut f = w.family(&SWITCH_LOST);
        for (peer, _, _, s) in &self.peers {
            f.sample(&[peer], s.lost.load(Relaxed));
        }
        let mut f = w.family(&LAST_SWITCH);
        for ((peer, _, _, _), st) in self.peers.iter().zip(&status) {
            if let Some(ev) = st.as_ref().and_then(|s| s.last_switch.as_ref()) {
                let at = ev
                    .at
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                let kind =
                    |p: Option<ferry_client::PathAddr>| p.map_or("none", |p| kind_label(p.kind()));
                let labels = [peer, kind(ev.from), kind(ev.to), reason_label(ev.reason)];
                f.sample(&labels, Fixed(at, 3));
            }
        }
        let mut f = w.family(&PEER_DROPS);
        for (peer, _, _, s) in &self.peers {
            for why in DropReason::ALL {
                f.sample(&[peer, why.label()], s.dropped(why));
            }
        }
        let stats = self.endpoint.get().map(|ep| ep.stats()).unwrap_or_default();
        w.single(&REJECTED, stats.rejected.total());
        let delivered: u64 = self
            .peers
            .iter()
            .map(|(_, _, _, s)| s.deliver_gso_fallbacks.load(Relaxed))
            .sum();
        w.family(&GSO_FALLBACKS)
            .sample(&["to_peer"], stats.gso_fallbacks)
            .sample(&["from_peer"], delivered);
        type RelayRead = fn(&RelayStats) -> u64;
        let relay_families: [(&Family, RelayRead); 4] = [
            (&RELAY_CONNECTED, |s| u64::from(s.connected.load(Relaxed))),
            (&RELAY_NODE, |s| s.node.load(Relaxed)),
            (&RELAY_CONNECTS, |s| s.connects.load(Relaxed)),
            (&RELAY_DISCONNECTS, |s| s.disconnects.load(Relaxed)),
        ];
        for (family, read) in relay_families {
            let mut f = w.family(family);
            for (relay, s) in &self.relays {
                f.sample(&[relay], read(s));
            }
        }
        out
    }
}

// The families, in the order a scrape shows them.

const PEER_PATH: Family = Family::gauge(
    "ferry_link_peer_path",
    "1 for the kind of path each peer's datagrams take now (direct, relay, derp), with the peer's relay; none while no allowed path works.",
)
.labels(&["peer", "path", "relay"]);
const PEER_PACKETS: Family = Family::counter(
    "ferry_link_peer_packets_total",
    "Datagrams carried, by peer, direction (to_peer: from the local WireGuard; from_peer: to it) and path, as the endpoint counts them.",
)
.labels(&["peer", "direction", "path"]);
const PEER_BYTES: Family = Family::counter(
    "ferry_link_peer_bytes_total",
    "Bytes of the datagrams carried, by peer, direction and path.",
)
.labels(&["peer", "direction", "path"]);
const PATH_WORKING: Family = Family::gauge(
    "ferry_link_peer_path_working",
    "1 when a path of this kind to the peer answers its probes.",
)
.labels(&["peer", "path"]);
const RTT: Family = Family::gauge(
    "ferry_link_peer_rtt_seconds",
    "The last round trip a probe measured on the peer's path of this kind (the active one, else the fastest).",
)
.labels(&["peer", "path"]);
const SWITCHES: Family = Family::counter(
    "ferry_link_peer_switches_total",
    "Path switches, by peer and reason (better: a better path answered; silent: the path stopped answering; removed; policy).",
)
.labels(&["peer", "reason"]);
const SWITCH_LOST: Family = Family::counter(
    "ferry_link_peer_switch_lost_total",
    "Datagrams sent on a path after its last answer, when it went silent or was removed: possibly lost at a switch.",
)
.labels(&["peer"]);
const LAST_SWITCH: Family = Family::gauge(
    "ferry_link_peer_last_switch_timestamp_seconds",
    "When the peer's path last changed (Unix time), from and to which kind, and why.",
)
.labels(&["peer", "from", "to", "reason"]);
const PEER_DROPS: Family = Family::counter(
    "ferry_link_peer_drops_total",
    "Datagrams dropped, by peer and reason.",
)
.labels(&["peer", "reason"]);
const REJECTED: Family = Family::counter(
    "ferry_link_rejected_total",
    "Datagrams and DERP packets dropped because they were not from a configured peer (unknown link key, or not a peer message).",
);
const GSO_FALLBACKS: Family = Family::counter(
    "ferry_link_gso_fallbacks_total",
    "UDP GSO trains the kernel refused (a path MTU under 1500 bytes), sent again one datagram at a time: to_peer on the paths to the peers, from_peer to the local WireGuard.",
)
.labels(&["direction"]);
const RELAY_CONNECTED: Family = Family::gauge(
    "ferry_link_relay_connected",
    "1 while the DERP connection to the relay is up.",
)
.labels(&["relay"]);
const RELAY_NODE: Family = Family::gauge(
    "ferry_link_relay_node",
    "Which of the relay's URLs the DERP connection is up to: 1 for url (or the first of urls), 2 for the second of urls, and so on; 0 while it is down.",
)
.labels(&["relay"]);
const RELAY_CONNECTS: Family = Family::counter(
    "ferry_link_relay_connects_total",
    "DERP connections to the relay established.",
)
.labels(&["relay"]);
const RELAY_DISCONNECTS: Family = Family::counter(
    "ferry_link_relay_disconnects_total",
    "DERP connections lost and connection attempts failed.",
)
.labels(&["relay"]);

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

/// Scrapes served at once. A connection beyond them is closed at once:
/// each holds a descriptor until its request comes or times out, and a
/// link out of descriptors cannot reconnect to its relays.
const MAX_SCRAPES: usize = 16;

/// Serves `metrics` at `GET /metrics` on `listener` until the returned
/// server is dropped, [`MAX_SCRAPES`] connections at a time.
pub(crate) fn serve(listener: TcpListener, metrics: Arc<Metrics>) -> std::io::Result<ScrapeServer> {
    let mut pages = Pages::metrics(move || metrics.render());
    pages.limits.max_connections = MAX_SCRAPES;
    ScrapeServer::start(listener, "ferry-link-metrics", pages)
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
    #[test]
    fn idle_metrics_connections_are_capped() {
        use std::io::{Read, Write};
        use std::net::TcpStream;
        use std::time::{Duration, Instant};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = serve(listener, Arc::new(Metrics::new(&config()))).unwrap();
        let idle: Vec<TcpStream> = (0..MAX_SCRAPES)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Each is taken in turn: the last one holds the last place once a
        // connection after it is refused.
        let mut extra = TcpStream::connect(addr).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut byte = [0u8; 1];
        let closed = extra.read(&mut byte);
        assert!(
            matches!(closed, Ok(0))
                || matches!(&closed, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "a connection beyond the cap was kept: {closed:?}"
        );
        drop(idle);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut body = String::new();
            let _ = c.read_to_string(&mut body);
            if body.starts_with("HTTP/1.1 200 OK") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no scrape after the idle ones left: {body:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
        m.relay(0).node.store(1, Relaxed);
        let text = m.render();
        assert_eq!(
            ferry_engine::stat::exposition::check(&text),
            Vec::<String>::new()
        );
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
            "ferry_link_relay_node{relay=\"r\"} 1",
        ] {
            assert!(text.lines().any(|l| l == sample), "no {sample} in\n{text}");
        }
    }
}
