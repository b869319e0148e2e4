//! Counters and their Prometheus text form.
//!
//! Each shard owns one [`ShardMetrics`] and is its only writer: an
//! increment is a relaxed load and store on memory no other core writes, so
//! counting costs no locked instruction. A scrape, from any thread, sums the
//! shards and adds what only the kernel knows: the network namespace's UDP
//! error counters from `/proc/net/snmp` and `/proc/net/snmp6`
//! (`RcvbufErrors` is the receive-buffer overflow count the issue asks to
//! see) next to the relay's own per-socket drop counts from `SO_RXQ_OVFL`.
//!
//! Names are prefixed `ferry_udp_`; `mode` is `bounce`, `hub` or
//! `relay_session` (the session table's own counters are
//! `crate::session::Sessions::render`'s).

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use ferry_proto::health::Health;

use crate::hub::DropReason;

/// The I/O back end `/healthz` names: the UDP relay's shards wait on epoll
/// (through mio) and move datagrams with `recvmmsg`/`sendmmsg`.
const BACKEND: &str = "epoll";

use ferry_engine::stat::exposition::{Exposition, Family};
use ferry_engine::stat::scrape::{Pages, ScrapeServer};
pub use ferry_engine::stat::{Counter, Gauge};

/// Packets and bytes in one direction.
#[derive(Default, Debug)]
pub struct Flow {
    /// Datagrams.
    pub packets: Counter,
    /// Payload bytes.
    pub bytes: Counter,
}

impl Flow {
    /// Counts `packets` datagrams of `bytes` in total.
    #[inline]
    pub fn add(&self, packets: u64, bytes: u64) {
        self.packets.add(packets);
        self.bytes.add(bytes);
    }
}

/// Why the relay dropped a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// Decided by the hub (a bounce with `wireguard_only` counts its
    /// refusals as [`DropReason::NotWireGuard`] too).
    Hub(DropReason),
    /// The datagram was larger than the receive slot.
    Truncated,
    /// A bounce route's client limit (`max_sessions`) was reached.
    ClientLimit,
    /// A source opened bounce clients faster than its rate allows.
    ClientRate,
    /// The upstream socket for a new bounce client could not be made.
    ClientFailed,
    /// A bounce route's target has not resolved yet.
    TargetUnresolved,
    /// The send buffer was full.
    SendBufferFull,
    /// The kernel refused the send (unreachable, refused, too big).
    SendFailed,
}

const OTHER_DROPS: [(Drop, &str); 7] = [
    (Drop::Truncated, "truncated"),
    (Drop::ClientLimit, "session_limit"),
    (Drop::ClientRate, "session_rate_limited"),
    (Drop::ClientFailed, "session_failed"),
    (Drop::TargetUnresolved, "target_unresolved"),
    (Drop::SendBufferFull, "send_buffer_full"),
    (Drop::SendFailed, "send_failed"),
];
type FlowOf = fn(&ShardMetrics) -> &Flow;
type GaugeOf = fn(&ShardMetrics) -> i64;
type CounterOf = fn(&ShardMetrics) -> u64;

const N_DROPS: usize = DropReason::ALL.len() + OTHER_DROPS.len();

impl Drop {
    fn slot(self) -> usize {
        match self {
            Drop::Hub(r) => DropReason::ALL
                .iter()
                .position(|&x| x == r)
                .expect("every reason is listed"),
            other => {
                DropReason::ALL.len()
                    + OTHER_DROPS
                        .iter()
                        .position(|&(d, _)| d == other)
                        .expect("every drop is listed")
            }
        }
    }

    fn label(slot: usize) -> &'static str {
        match DropReason::ALL.get(slot) {
            Some(r) => r.as_str(),
            None => OTHER_DROPS[slot - DropReason::ALL.len()].1,
        }
    }
}

/// One shard's counters.
#[derive(Debug)]
pub struct ShardMetrics {
    /// Bounce: client to target.
    pub to_target: Flow,
    /// Bounce: target to client.
    pub to_client: Flow,
    /// Hub: datagrams received.
    pub hub_in: Flow,
    /// Hub: datagrams sent.
    pub hub_out: Flow,
    /// Relay sessions: datagrams received on the session port.
    pub relay_session_in: Flow,
    /// Relay sessions: datagrams sent (forwarded data and bind replies).
    pub relay_session_out: Flow,
    /// Hub: received messages by WireGuard type (1–4, index 0 unused).
    pub hub_kinds: [Counter; 5],
    drops: [Counter; N_DROPS],
    /// Bounce sessions open on this shard.
    pub sessions: Gauge,
    /// Bounce sessions opened.
    pub sessions_opened: Counter,
    /// Bounce sessions closed for idleness.
    pub sessions_expired: Counter,
    /// Bounce sessions whose target never answered, closed at the session
    /// limit to make room for a new client.
    pub sessions_evicted: Counter,
    /// Bounce sessions moved to a re-resolved target.
    pub sessions_retargeted: Counter,
    /// Index entries of WireGuard sessions in this shard's hub replica.
    pub hub_indices: Gauge,
    /// Hub initiations awaiting a response.
    pub hub_pending: Gauge,
    /// Hub peers with a known endpoint.
    pub hub_known_peers: Gauge,
    /// Hub entries evicted by index collisions.
    pub hub_collisions: Gauge,
    /// Datagrams the kernel dropped on this shard's sockets for lack of
    /// receive buffer (`SO_RXQ_OVFL`).
    pub socket_drops: Counter,
    /// `recvmmsg` calls that returned data.
    pub recv_calls: Counter,
    /// `sendmmsg` calls.
    pub send_calls: Counter,
    /// Datagrams received in GRO-coalesced slots.
    pub gro_datagrams: Counter,
    /// Messages sent with GSO (several datagrams in one).
    pub gso_messages: Counter,
    /// GSO trains the kernel refused, sent again one datagram at a time.
    pub gso_fallbacks: Counter,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            to_target: Flow::default(),
            to_client: Flow::default(),
            hub_in: Flow::default(),
            hub_out: Flow::default(),
            relay_session_in: Flow::default(),
            relay_session_out: Flow::default(),
            hub_kinds: Default::default(),
            drops: std::array::from_fn(|_| Counter::default()),
            sessions: Gauge::default(),
            sessions_opened: Counter::default(),
            sessions_expired: Counter::default(),
            sessions_evicted: Counter::default(),
            sessions_retargeted: Counter::default(),
            hub_indices: Gauge::default(),
            hub_pending: Gauge::default(),
            hub_known_peers: Gauge::default(),
            hub_collisions: Gauge::default(),
            socket_drops: Counter::default(),
            recv_calls: Counter::default(),
            send_calls: Counter::default(),
            gro_datagrams: Counter::default(),
            gso_messages: Counter::default(),
            gso_fallbacks: Counter::default(),
        }
    }
}

impl ShardMetrics {
    /// Counts `n` dropped datagrams.
    #[inline]
    pub fn count_drop(&self, why: Drop, n: u64) {
        self.drops[why.slot()].add(n);
    }

    /// Dropped datagrams so far for one reason.
    pub fn drops(&self, why: Drop) -> u64 {
        self.drops[why.slot()].get()
    }
}

/// Facts fixed at start-up, shown as gauges.
#[derive(Clone, Debug, Default)]
pub struct StartInfo {
    /// GRO in use.
    pub gro: bool,
    /// GSO in use (at start; a shard may turn it off if the device refuses).
    pub gso: bool,
    /// Receive buffer per socket as the kernel reports it.
    pub recv_buffer: usize,
    /// Send buffer per socket as the kernel reports it.
    pub send_buffer: usize,
    /// Whether the buffer sizes were forced past the system maximum.
    pub buffers_forced: bool,
}

/// Everything a scrape reads.
#[derive(Debug, Default)]
pub struct Metrics {
    /// One per shard.
    pub shards: Vec<Arc<ShardMetrics>>,
    /// Start-up facts.
    pub info: StartInfo,
    /// Target resolutions that succeeded.
    pub resolves_ok: AtomicU64,
    /// Target resolutions that failed (the old address is kept).
    pub resolves_failed: AtomicU64,
    /// Times a target's address changed.
    pub target_changes: AtomicU64,
    /// Peers the hub is configured with now.
    pub hub_peers: AtomicU64,
    /// Configuration reloads (SIGHUP) applied, or refused for an invalid
    /// file.
    pub reloads_applied: AtomicU64,
    /// Configuration reloads refused.
    pub reloads_failed: AtomicU64,
}

impl Metrics {
    /// Sum of one counter over the shards.
    pub fn sum(&self, f: impl Fn(&ShardMetrics) -> u64) -> u64 {
        self.shards.iter().map(|s| f(s)).sum()
    }

    fn sum_gauge(&self, f: impl Fn(&ShardMetrics) -> i64) -> i64 {
        self.shards.iter().map(|s| f(s)).sum()
    }

    /// Drops for one reason, over the shards.
    pub fn drops(&self, why: Drop) -> u64 {
        self.sum(|s| s.drops(why))
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(4096);
        let mut w = Exposition::new(&mut o);
        let flows: [(&str, &str, FlowOf); 6] = [
            ("bounce", "to_target", |s| &s.to_target),
            ("bounce", "to_client", |s| &s.to_client),
            ("hub", "in", |s| &s.hub_in),
            ("hub", "out", |s| &s.hub_out),
            ("relay_session", "in", |s| &s.relay_session_in),
            ("relay_session", "out", |s| &s.relay_session_out),
        ];
        let mut f = w.family(&PACKETS);
        for (mode, dir, flow) in flows {
            f.sample(&[mode, dir], self.sum(|s| flow(s).packets.get()));
        }
        let mut f = w.family(&BYTES);
        for (mode, dir, flow) in flows {
            f.sample(&[mode, dir], self.sum(|s| flow(s).bytes.get()));
        }
        let mut f = w.family(&HUB_MESSAGES);
        for (i, kind) in ["initiation", "response", "cookie_reply", "transport"]
            .iter()
            .enumerate()
        {
            f.sample(&[*kind], self.sum(|s| s.hub_kinds[i + 1].get()));
        }
        let mut f = w.family(&DROPS);
        for slot in 0..N_DROPS {
            f.sample(&[Drop::label(slot)], self.sum(|s| s.drops[slot].get()));
        }
        w.single(&SESSIONS, self.sum_gauge(|s| s.sessions.get()));
        for (family, read) in &SINGLE {
            match *read {
                Single::Replica(read) => w.single(
                    family,
                    self.shards.iter().map(|s| read(s)).max().unwrap_or(0),
                ),
                Single::Summed(read) => w.single(family, self.sum(read)),
            }
        }
        let mut f = w.family(&KERNEL_UDP_ERRORS);
        for (name, v) in kernel_udp_errors() {
            f.sample(&[name], v);
        }
        w.family(&OFFLOAD)
            .sample(&["gro"], self.info.gro)
            .sample(&["gso"], self.info.gso);
        w.family(&SOCKET_BUFFER)
            .sample(&["receive"], self.info.recv_buffer)
            .sample(&["send"], self.info.send_buffer);
        w.single(&SOCKET_BUFFER_FORCED, self.info.buffers_forced);
        w.family(&RESOLUTIONS)
            .sample(&["ok"], self.resolves_ok.load(Relaxed))
            .sample(&["failed"], self.resolves_failed.load(Relaxed));
        w.single(&TARGET_CHANGES, self.target_changes.load(Relaxed));
        w.single(&HUB_PEERS, self.hub_peers.load(Relaxed));
        w.family(&RELOADS)
            .sample(&["applied"], self.reloads_applied.load(Relaxed))
            .sample(&["failed"], self.reloads_failed.load(Relaxed));
        w.single(&SHARDS, self.shards.len());
        o
    }
}

// The families, in the order a scrape shows them.

const PACKETS: Family = Family::counter(
    "ferry_udp_packets_total",
    "Datagrams relayed, by mode and direction.",
)
.labels(&["mode", "direction"]);
const BYTES: Family = Family::counter(
    "ferry_udp_bytes_total",
    "Payload bytes relayed, by mode and direction.",
)
.labels(&["mode", "direction"]);
const HUB_MESSAGES: Family = Family::counter(
    "ferry_udp_hub_messages_total",
    "WireGuard messages received by the hub, by type.",
)
.labels(&["kind"]);
const DROPS: Family = Family::counter(
    "ferry_udp_drops_total",
    "Datagrams dropped by the relay, by reason.",
)
.labels(&["reason"]);
const SESSIONS: Family = Family::gauge(
    "ferry_udp_sessions",
    "Bounce sessions (clients with their own upstream socket).",
);
/// How an unlabelled family reads the shards.
#[derive(Clone, Copy)]
enum Single {
    /// A table every shard holds a replica of (the hub's): the largest,
    /// since replicas differ only while events are in flight.
    Replica(GaugeOf),
    /// A per-shard counter: the sum over the shards.
    Summed(CounterOf),
}

/// The unlabelled families, each beside the field it shows.
const SINGLE: [(Family, Single); 14] = [
    (
        Family::gauge("ferry_udp_hub_indices", "Hub session indices known."),
        Single::Replica(|s| s.hub_indices.get()),
    ),
    (
        Family::gauge("ferry_udp_hub_pending", "Hub initiations awaiting a response."),
        Single::Replica(|s| s.hub_pending.get()),
    ),
    (
        Family::gauge("ferry_udp_hub_known_peers", "Hub peers with a known endpoint."),
        Single::Replica(|s| s.hub_known_peers.get()),
    ),
    (
        Family::gauge("ferry_udp_hub_index_collisions", "Hub entries evicted by index collisions."),
        Single::Replica(|s| s.hub_collisions.get()),
    ),
    (
        Family::counter("ferry_udp_sessions_opened_total", "Bounce sessions opened."),
        Single::Summed(|s| s.sessions_opened.get()),
    ),
    (
        Family::counter(
            "ferry_udp_sessions_expired_total",
            "Bounce sessions closed after the idle timeout.",
        ),
        Single::Summed(|s| s.sessions_expired.get()),
    ),
    (
        Family::counter(
            "ferry_udp_sessions_evicted_total",
            "Bounce sessions whose target never answered, closed at the session limit for a new client.",
        ),
        Single::Summed(|s| s.sessions_evicted.get()),
    ),
    (
        Family::counter(
            "ferry_udp_sessions_retargeted_total",
            "Bounce sessions switched to a re-resolved target address.",
        ),
        Single::Summed(|s| s.sessions_retargeted.get()),
    ),
    (
        Family::counter(
            "ferry_udp_socket_drops_total",
            "Datagrams the kernel dropped on the relay's sockets for lack of receive buffer (SO_RXQ_OVFL).",
        ),
        Single::Summed(|s| s.socket_drops.get()),
    ),
    (
        Family::counter(
            "ferry_udp_recvmmsg_calls_total",
            "recvmmsg calls that returned datagrams.",
        ),
        Single::Summed(|s| s.recv_calls.get()),
    ),
    (
        Family::counter("ferry_udp_sendmmsg_calls_total", "sendmmsg calls."),
        Single::Summed(|s| s.send_calls.get()),
    ),
    (
        Family::counter("ferry_udp_gso_messages_total", "Messages sent with UDP GSO."),
        Single::Summed(|s| s.gso_messages.get()),
    ),
    (
        Family::counter(
            "ferry_udp_gso_fallbacks_total",
            "UDP GSO trains the kernel refused (a path MTU under 1500, a device without checksum offload), sent again one datagram at a time.",
        ),
        Single::Summed(|s| s.gso_fallbacks.get()),
    ),
    (
        Family::counter(
            "ferry_udp_gro_datagrams_total",
            "Datagrams that arrived coalesced by UDP GRO.",
        ),
        Single::Summed(|s| s.gro_datagrams.get()),
    ),
];
const KERNEL_UDP_ERRORS: Family = Family::counter(
    "ferry_udp_kernel_udp_errors_total",
    "The network namespace's UDP error counters (/proc/net/snmp and snmp6, IPv4 + IPv6).",
)
.labels(&["counter"]);
const OFFLOAD: Family =
    Family::gauge("ferry_udp_offload", "UDP offloads in use (1) or not (0).").labels(&["feature"]);
const SOCKET_BUFFER: Family = Family::gauge(
    "ferry_udp_socket_buffer_bytes",
    "Socket buffer size the kernel granted, per socket.",
)
.labels(&["buffer"]);
const SOCKET_BUFFER_FORCED: Family = Family::gauge(
    "ferry_udp_socket_buffer_forced",
    "1 if buffer sizes were forced past net.core.rmem_max/wmem_max.",
);
const RESOLUTIONS: Family = Family::counter(
    "ferry_udp_target_resolutions_total",
    "DNS resolutions of bounce targets.",
)
.labels(&["result"]);
const TARGET_CHANGES: Family = Family::counter(
    "ferry_udp_target_changes_total",
    "Times a bounce target's address changed.",
);
const HUB_PEERS: Family = Family::gauge(
    "ferry_udp_hub_peers",
    "Peers the hub is configured with (changes on SIGHUP).",
);
const RELOADS: Family = Family::counter(
    "ferry_udp_config_reloads_total",
    "Configuration reloads on SIGHUP: applied (possibly with changes that need a restart), or failed (the file was not valid; the running configuration stays).",
)
.labels(&["result"]);
const SHARDS: Family = Family::gauge("ferry_udp_shards", "Shard threads.");

/// The UDP error counters of this network namespace: `RcvbufErrors`,
/// `SndbufErrors`, `InErrors`, `NoPorts`, IPv4 and IPv6 summed. Missing
/// files yield zeros.
pub fn kernel_udp_errors() -> [(&'static str, u64); 4] {
    const NAMES: [&str; 4] = ["RcvbufErrors", "SndbufErrors", "InErrors", "NoPorts"];
    let mut out = NAMES.map(|n| (n, 0u64));
    if let Ok(text) = std::fs::read_to_string("/proc/net/snmp") {
        let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
        if let (Some(head), Some(vals)) = (lines.next(), lines.next()) {
            for (k, v) in head.split_whitespace().zip(vals.split_whitespace()) {
                if let Some(slot) = out.iter_mut().find(|(n, _)| *n == k) {
                    slot.1 += v.parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string("/proc/net/snmp6") {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Some(name) = k.strip_prefix("Udp6") {
                    if let Some(slot) = out.iter_mut().find(|(n, _)| *n == name) {
                        slot.1 += v.parse::<u64>().unwrap_or(0);
                    }
                }
            }
        }
    }
    out
}

/// The relay's metrics listener: `GET /metrics` with the metrics text and
/// `GET /healthz` with the relay's health ([`ferry_proto::health`], as the
/// DERP server's), served by [`ScrapeServer`] (its limits keep a slow or
/// hostile scraper from holding it). It is for a scraper, not for the
/// public. Dropping it stops it.
#[derive(Debug)]
pub struct MetricsServer {
    /// Where it listens.
    pub addr: SocketAddr,
    _server: ScrapeServer,
}

impl MetricsServer {
    /// Binds `addr` and serves `metrics` from a thread.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        // Started with the relay: its uptime counts from here.
        let started = Instant::now();
        let mut pages = Pages::metrics(move || metrics.render());
        pages.other = Box::new(move |path| {
            // Serving while this thread runs: the relay stops it on
            // shutdown, so it never reports draining.
            (path == "/healthz").then(|| {
                Health {
                    draining: false,
                    backend: BACKEND,
                    uptime: started.elapsed(),
                }
                .response()
            })
        });
        let server = ScrapeServer::start(listener, "ferry-udp-metrics", pages)?;
        Ok(MetricsServer {
            addr: server.addr(),
            _server: server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type GaugeField = fn(&ShardMetrics) -> &Gauge;
    type CounterField = fn(&ShardMetrics) -> &Counter;

    #[test]
    fn render_sums_shards_and_names_every_reason() {
        let m = Metrics {
            shards: vec![Arc::default(), Arc::default()],
            ..Default::default()
        };
        m.shards[0].to_target.add(3, 300);
        m.shards[1].to_target.add(2, 200);
        m.shards[1].count_drop(Drop::Hub(DropReason::UnknownIndex), 4);
        m.shards[0].count_drop(Drop::SendFailed, 1);
        let text = m.render();
        assert!(text.contains("ferry_udp_packets_total{mode=\"bounce\",direction=\"to_target\"} 5"));
        assert!(text.contains("ferry_udp_bytes_total{mode=\"bounce\",direction=\"to_target\"} 500"));
        assert!(text.contains("ferry_udp_drops_total{reason=\"unknown_index\"} 4"));
        assert!(text.contains("ferry_udp_drops_total{reason=\"send_failed\"} 1"));
        assert!(text.contains("ferry_udp_kernel_udp_errors_total{counter=\"RcvbufErrors\"}"));
        for r in DropReason::ALL {
            assert!(text.contains(&format!("reason=\"{}\"", r.as_str())));
        }
        assert_eq!(m.drops(Drop::Hub(DropReason::UnknownIndex)), 4);
        let mut series: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ').map(|(k, _)| k))
            .collect();
        let n = series.len();
        series.sort_unstable();
        series.dedup();
        assert_eq!(series.len(), n, "every series appears once");
        assert_eq!(
            ferry_engine::stat::exposition::check(&text),
            Vec::<String>::new()
        );
    }
    /// Each unlabelled family shows the field it is declared beside: the
    /// hub's table sizes as the largest replica, the counters summed.
    #[test]
    fn each_single_family_shows_its_own_field() {
        let m = Metrics {
            shards: vec![Arc::default(), Arc::default()],
            ..Default::default()
        };
        let gauges: [(&str, GaugeField); 4] = [
            ("ferry_udp_hub_indices", |s| &s.hub_indices),
            ("ferry_udp_hub_pending", |s| &s.hub_pending),
            ("ferry_udp_hub_known_peers", |s| &s.hub_known_peers),
            ("ferry_udp_hub_index_collisions", |s| &s.hub_collisions),
        ];
        for (i, (_, field)) in gauges.iter().enumerate() {
            field(&m.shards[0]).set(10 + i as i64);
            field(&m.shards[1]).set(20 + i as i64);
        }
        let counters: [(&str, CounterField); 10] = [
            ("ferry_udp_sessions_opened_total", |s| &s.sessions_opened),
            ("ferry_udp_sessions_expired_total", |s| &s.sessions_expired),
            ("ferry_udp_sessions_evicted_total", |s| &s.sessions_evicted),
            ("ferry_udp_sessions_retargeted_total", |s| {
                &s.sessions_retargeted
            }),
            ("ferry_udp_socket_drops_total", |s| &s.socket_drops),
            ("ferry_udp_recvmmsg_calls_total", |s| &s.recv_calls),
            ("ferry_udp_sendmmsg_calls_total", |s| &s.send_calls),
            ("ferry_udp_gso_messages_total", |s| &s.gso_messages),
            ("ferry_udp_gso_fallbacks_total", |s| &s.gso_fallbacks),
            ("ferry_udp_gro_datagrams_total", |s| &s.gro_datagrams),
        ];
        for (i, (_, field)) in counters.iter().enumerate() {
            field(&m.shards[0]).add(100 + i as u64);
            field(&m.shards[1]).add(1000);
        }
        let text = m.render();
        for (i, (name, _)) in gauges.iter().enumerate() {
            assert!(text.contains(&format!("\n{name} {}\n", 20 + i)), "{name}");
        }
        for (i, (name, _)) in counters.iter().enumerate() {
            assert!(text.contains(&format!("\n{name} {}\n", 1100 + i)), "{name}");
        }
    }

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        c.write_all(request).unwrap();
        let mut text = String::new();
        let _ = c.read_to_string(&mut text);
        text
    }

    /// Scrapers that connect and send nothing do not keep the listener
    /// from answering the next one: each has a place of its own, for a
    /// bounded time.
    #[test]
    fn idle_scrapers_do_not_hold_up_a_scrape() {
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::default()).unwrap();
        let idle: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(server.addr).unwrap())
            .collect();
        let start = Instant::now();
        let text = get(server.addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(3),
            "answered after {:?}",
            start.elapsed()
        );
        drop(idle);
    }

    #[test]
    fn only_metrics_and_healthz_are_served() {
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Arc::default()).unwrap();
        let other = get(server.addr, b"GET /other HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
        let health = get(server.addr, b"GET /healthz HTTP/1.1\r\n\r\n");
        assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
        assert!(health.contains("\"backend\":\"epoll\""), "{health}");
        let page = get(server.addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        assert!(page.contains("\nferry_udp_shards 0\n"), "{page}");
    }
}
