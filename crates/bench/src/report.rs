//! The JSON every run writes.
//!
//! One [`Report`] per run: what was asked (`config`), against what
//! (`target`), what the client and the server spent (`client`, `server`),
//! and the mode's figures (`result`, tagged by `mode`). Rates are decimal
//! megabits per second of packet payload (the DERP packet, not counting the
//! 37 bytes of frame header and key, nor TCP/TLS overhead); latencies are
//! microseconds; loss is a fraction in [0, 1]. `schema` changes when a field
//! changes meaning.

use crate::histogram::Percentiles;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of this schema.
pub const SCHEMA: u32 = 1;

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `"ferry-bench"`.
    pub tool: String,
    /// [`SCHEMA`].
    pub schema: u32,
    /// Tool version.
    pub version: String,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The server under test.
    pub target: TargetInfo,
    /// The mode's parameters as given (after defaults).
    pub config: serde_json::Value,
    /// What ferry-bench itself spent.
    pub client: ClientUsage,
    /// What the server spent, when its pid was given.
    pub server: Option<ServerUsage>,
    /// What everything else on the machine spent meanwhile.
    #[serde(default)]
    pub machine: Option<MachineUsage>,
    /// Changes of selected server metrics over the measured window (with
    /// `--metrics`).
    #[serde(default)]
    pub metrics_delta: BTreeMap<String, f64>,
    /// Things the reader should know (e.g. the client was saturated).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The receivers' server, when it was another one (`--peer-url`: two
    /// nodes of one region, the packets crossing the mesh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerServer>,
    /// The server and the traffic over time, one entry per interval of
    /// `--sample-every` (soak runs); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<TimeSample>,
    /// The figures.
    pub result: ModeResult,
}

/// One interval of a sampled run (`--sample-every`): the server's memory,
/// descriptors and selected gauges at its end, and the traffic within it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeSample {
    /// End of the interval, seconds since sending started (the warm-up
    /// included).
    pub t_s: f64,
    /// Server RSS at that moment, bytes (with `--server-pid`).
    pub rss: Option<u64>,
    /// Server open descriptors (with `--server-pid`).
    pub open_fds: Option<u64>,
    /// Server CPU over the interval, cores (with `--server-pid`).
    pub cpu_util: Option<f64>,
    /// Payload sent over the interval, Mbit/s.
    pub sent_mbps: f64,
    /// Payload received over the interval, Mbit/s.
    pub received_mbps: f64,
    /// One-way latency of the data packets that arrived in the interval.
    pub latency_us: Percentiles,
    /// The server's gauges named in `varz::SAMPLED` (with `--metrics`).
    #[serde(default)]
    pub gauges: BTreeMap<String, f64>,
}

/// The second server of a run (`--peer-url`), where the receivers were;
/// `target`, `server` and `metrics_delta` of the report are the senders'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerServer {
    /// The server.
    pub target: TargetInfo,
    /// What it spent, when its pid was given (`--peer-server-pid`).
    pub server: Option<ServerUsage>,
    /// Changes of its metrics over the window (with `--metrics`).
    #[serde(default)]
    pub metrics_delta: BTreeMap<String, f64>,
}

/// The server under test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetInfo {
    /// URL.
    pub url: String,
    /// Address dialled.
    pub addr: String,
    /// TLS in use.
    pub tls: bool,
    /// Certificate verification was off (`--insecure`).
    pub insecure: bool,
    /// Negotiated TLS version.
    pub tls_version: Option<String>,
    /// Negotiated cipher suite.
    pub cipher_suite: Option<String>,
}

/// ferry-bench's own cost over the measured window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientUsage {
    /// Event-loop threads.
    pub threads: usize,
    /// CPU seconds (user + system).
    pub cpu_seconds: f64,
    /// CPU seconds per second of window, per thread (1.0 = a thread was
    /// never idle: the generator may have been the bottleneck).
    pub cpu_util_per_thread: f64,
    /// Traffic modes: the fraction of the window the event loops spent
    /// working rather than polling an empty event set, per thread (near 1:
    /// the generator may have been the bottleneck). With spinning loops this
    /// is the meaningful figure, as CPU use is then always 100 %.
    #[serde(default)]
    pub busy_fraction: Option<f64>,
    /// Resident memory at the end, bytes.
    pub rss_bytes: u64,
}

/// The rest of the machine over the measured window: on a shared machine a
/// run is only meaningful if nothing else competed for the cores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineUsage {
    /// CPU seconds per second used by processes other than the server and
    /// ferry-bench (cores); needs the server's pid to be exact, otherwise
    /// it includes the server.
    pub other_cpu: f64,
    /// CPU seconds per second stolen by the hypervisor (cores).
    pub steal: f64,
    /// Share of the window for which `/proc/stat` accounted no CPU time.
    /// Informational only: on this kind of VM it also grows under heavy
    /// softirq load with nothing else running.
    #[serde(default)]
    pub lost: f64,
    /// Whether the run looks disturbed: other work above 0.1 core or steal
    /// above 0.05 core.
    pub disturbed: bool,
}

/// The server's cost, observed through `/proc/<pid>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerUsage {
    /// Its pid.
    pub pid: u32,
    /// CPU seconds over the measured window.
    pub cpu_seconds: f64,
    /// CPU seconds per second of window (cores kept busy).
    pub cpu_util: f64,
    /// RSS before the run, bytes.
    pub rss_before: u64,
    /// RSS at the end of the measured window (idle: while all connections
    /// are held), bytes.
    pub rss_after: u64,
    /// Open descriptors at that moment.
    pub open_fds: Option<u64>,
}

/// The mode-specific figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ModeResult {
    /// `throughput`.
    Throughput(Throughput),
    /// `latency`.
    Latency(Latency),
    /// `idle`.
    Idle(Idle),
    /// `churn`.
    Churn(Churn),
}

impl ModeResult {
    /// The mode's name.
    pub fn mode(&self) -> &'static str {
        match self {
            ModeResult::Throughput(_) => "throughput",
            ModeResult::Latency(_) => "latency",
            ModeResult::Idle(_) => "idle",
            ModeResult::Churn(_) => "churn",
        }
    }
}

/// One-way load through the relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Connections (not counting stuck receivers, which `stuck` counts).
    pub peers: usize,
    /// Directed flows.
    pub flows: usize,
    /// Packet size, bytes.
    pub size: usize,
    /// Offered rate over all flows, Mbit/s; `None` when unpaced (`max`).
    pub offered_mbps: Option<f64>,
    /// Rate the generator actually handed to TCP, Mbit/s.
    pub sent_mbps: f64,
    /// Rate delivered to the receivers, Mbit/s.
    pub delivered_mbps: f64,
    /// Packets per second delivered.
    pub delivered_pps: f64,
    /// Packets stamped in the window.
    pub packets_sent: u64,
    /// Of those, packets that arrived.
    pub packets_delivered: u64,
    /// `1 - delivered / sent` over the window's packets.
    pub loss: f64,
    /// Packets the pacing schedule skipped because the server was not
    /// reading (TCP back-pressure); 0 when unpaced.
    pub packets_backpressured: u64,
    /// One-way latency of the window's delivered packets.
    pub latency_us: Percentiles,
    /// Delivered rate of the slowest and fastest flow, Mbit/s, and Jain's
    /// fairness index over all flows (1 = perfectly even).
    pub flow_min_mbps: f64,
    /// See `flow_min_mbps`.
    pub flow_max_mbps: f64,
    /// See `flow_min_mbps`.
    pub fairness: f64,
    /// Measured window, seconds.
    pub window_s: f64,
    /// Time to connect every peer, seconds.
    pub connect_s: f64,
    /// Connections lost after their handshake (not counting stuck
    /// receivers).
    pub disconnects: u64,
    /// Frames other than recvPacket received (keepalives, peerGone, …).
    pub other_frames: u64,
    /// Stretches without a packet at the receivers, per flow, inside the
    /// window: from its start or a flow's packet to that flow's next packet
    /// or the window's end (packets read together count 0). `max` is the
    /// longest any receiver went without traffic.
    #[serde(default)]
    pub gap_us: Percentiles,
    /// Stuck receivers among the pairs (`--stuck`); the figures above are
    /// then those of the healthy pairs alone.
    #[serde(default)]
    pub stuck: Option<Stuck>,
    /// `--cross-shard`: the share of packets across shards asked for and
    /// measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_shard: Option<crate::placement::CrossShard>,
}

/// Receivers that completed their handshake and then stopped reading.
/// Every sender also sent to them, from the window's start;
/// they read again after the window, to learn whether the server had cut
/// them off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stuck {
    /// Stuck receivers.
    pub peers: usize,
    /// Flows to them (every sender to every stuck receiver).
    pub flows: usize,
    /// Their packet size, bytes.
    pub size: usize,
    /// Offered rate over all those flows, Mbit/s; `None` when unpaced.
    pub offered_mbps: Option<f64>,
    /// Rate handed to TCP towards them during the window, Mbit/s.
    pub sent_mbps: f64,
    /// Packets to them stamped in the window.
    pub packets_sent: u64,
    /// Of those, packets they read after the window (what the server kept
    /// for them rather than dropped).
    pub packets_delivered: u64,
    /// Packets to them the pacing schedule skipped because the senders'
    /// connections were blocked.
    pub packets_backpressured: u64,
    /// Stuck receivers whose connection the server had closed by the end of
    /// the run.
    pub cut_off: u64,
    /// Stuck receivers still connected at the end of the run.
    pub held: u64,
}

/// Round trips through the relay, optionally under load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Ping pairs.
    pub ping_pairs: usize,
    /// Pings per second per pair.
    pub ping_rate: f64,
    /// Ping size, bytes.
    pub ping_size: usize,
    /// Pings sent in the window.
    pub pings_sent: u64,
    /// Pongs received for them.
    pub pongs_received: u64,
    /// `1 - pongs / pings`.
    pub ping_loss: f64,
    /// Round-trip times.
    pub rtt_us: Percentiles,
    /// The background load, if any.
    pub background: Option<Throughput>,
}

/// Many connections held open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Idle {
    /// Connections asked for.
    pub requested: usize,
    /// Connections that finished the handshake.
    pub established: usize,
    /// Connections that failed.
    pub failed: usize,
    /// Failures by kind.
    pub failures: BTreeMap<String, u64>,
    /// First failure, in full.
    pub first_error: Option<String>,
    /// Time until the last handshake finished, seconds.
    pub connect_s: f64,
    /// Handshakes per second while connecting.
    pub connect_rate: f64,
    /// Connect-to-serverInfo time.
    pub handshake_ms: Percentiles,
    /// How long the connections were held, seconds.
    pub hold_s: f64,
    /// Connections that closed while held.
    pub dropped_while_held: u64,
    /// Server RSS growth per established connection, bytes (needs the pid).
    pub server_bytes_per_conn: Option<f64>,
}

/// Connect, handshake, disconnect, at a rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Churn {
    /// Target handshakes per second; `None` for as fast as possible.
    pub target_rate: Option<f64>,
    /// Most handshakes in flight at once.
    pub concurrency: usize,
    /// Seconds during which new connections were started.
    pub duration_s: f64,
    /// Connections started.
    pub attempted: u64,
    /// Handshakes completed.
    pub completed: u64,
    /// Connections that failed.
    pub failed: u64,
    /// Failures by kind.
    pub failures: BTreeMap<String, u64>,
    /// First failure, in full.
    pub first_error: Option<String>,
    /// Completed handshakes per second over the duration.
    pub handshakes_per_s: f64,
    /// Connect-to-serverInfo time.
    pub handshake_ms: Percentiles,
    /// Connections the schedule could not start because `concurrency` were
    /// already in flight (paced runs only).
    pub skipped: u64,
}

/// Jain's fairness index of `xs`: (Σx)² / (n·Σx²); 1 when all are equal.
pub fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if n == 0.0 || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (n * sq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_percentiles() -> Percentiles {
        Percentiles {
            count: 10,
            min: 1.0,
            mean: 3.5,
            p50: 3.0,
            p90: 6.0,
            p99: 8.0,
            p999: 9.0,
            max: 9.5,
        }
    }

    fn sample_throughput() -> Throughput {
        Throughput {
            peers: 20,
            flows: 10,
            size: 1400,
            offered_mbps: Some(1000.0),
            sent_mbps: 999.0,
            delivered_mbps: 998.0,
            delivered_pps: 89_000.0,
            packets_sent: 100,
            packets_delivered: 99,
            loss: 0.01,
            packets_backpressured: 0,
            latency_us: sample_percentiles(),
            flow_min_mbps: 99.0,
            flow_max_mbps: 101.0,
            fairness: 0.999,
            window_s: 5.0,
            connect_s: 0.01,
            disconnects: 0,
            other_frames: 0,
            gap_us: sample_percentiles(),
            stuck: Some(Stuck {
                peers: 3,
                flows: 30,
                size: 32768,
                offered_mbps: Some(100.0),
                sent_mbps: 90.0,
                packets_sent: 700,
                packets_delivered: 10,
                packets_backpressured: 70,
                cut_off: 3,
                held: 0,
            }),
            cross_shard: None,
        }
    }

    fn report(result: ModeResult) -> Report {
        Report {
            tool: "ferry-bench".into(),
            schema: SCHEMA,
            version: "0.1.0".into(),
            started_unix_ms: 1,
            target: TargetInfo {
                url: "http://127.0.0.1:3340/derp".into(),
                addr: "127.0.0.1:3340".into(),
                tls: false,
                insecure: false,
                tls_version: None,
                cipher_suite: None,
            },
            config: serde_json::json!({"peers": 20}),
            client: ClientUsage {
                threads: 1,
                cpu_seconds: 1.0,
                cpu_util_per_thread: 0.2,
                busy_fraction: Some(0.3),
                rss_bytes: 1 << 20,
            },
            server: Some(ServerUsage {
                pid: 42,
                cpu_seconds: 4.0,
                cpu_util: 0.8,
                rss_before: 1000,
                rss_after: 2000,
                open_fds: Some(30),
            }),
            machine: Some(MachineUsage {
                other_cpu: 0.02,
                steal: 0.0,
                lost: 0.0,
                disturbed: false,
            }),
            metrics_delta: BTreeMap::from([(
                "derp_packets_dropped{reason=\"queue_head\"}".to_owned(),
                3.0,
            )]),
            warnings: vec!["a warning".into()],
            peer: None,
            samples: vec![TimeSample {
                t_s: 5.0,
                rss: Some(3 << 20),
                open_fds: Some(30),
                cpu_util: Some(0.5),
                sent_mbps: 1000.0,
                received_mbps: 999.0,
                latency_us: sample_percentiles(),
                gauges: BTreeMap::from([("ferry_queued_bytes".to_owned(), 4096.0)]),
            }],
            result,
        }
    }

    #[test]
    fn round_trips_every_mode() {
        let modes = [
            ModeResult::Throughput(sample_throughput()),
            ModeResult::Latency(Latency {
                ping_pairs: 1,
                ping_rate: 1000.0,
                ping_size: 1400,
                pings_sent: 5000,
                pongs_received: 5000,
                ping_loss: 0.0,
                rtt_us: sample_percentiles(),
                background: Some(sample_throughput()),
            }),
            ModeResult::Idle(Idle {
                requested: 10,
                established: 9,
                failed: 1,
                failures: BTreeMap::from([("timeout".to_owned(), 1)]),
                first_error: Some("timed out".into()),
                connect_s: 0.5,
                connect_rate: 18.0,
                handshake_ms: sample_percentiles(),
                hold_s: 1.0,
                dropped_while_held: 0,
                server_bytes_per_conn: Some(12_000.0),
            }),
            ModeResult::Churn(Churn {
                target_rate: None,
                concurrency: 64,
                duration_s: 2.0,
                attempted: 100,
                completed: 99,
                failed: 1,
                failures: BTreeMap::new(),
                first_error: None,
                handshakes_per_s: 49.5,
                handshake_ms: sample_percentiles(),
                skipped: 0,
            }),
        ];
        for (i, m) in modes.into_iter().enumerate() {
            let mut r = report(m);
            if i == 0 {
                r.peer = Some(PeerServer {
                    target: TargetInfo {
                        url: "https://localhost:8443/derp".into(),
                        ..r.target.clone()
                    },
                    server: r.server.clone(),
                    metrics_delta: BTreeMap::from([("derp_packets_forwarded_in".to_owned(), 9.0)]),
                });
            }
            let text = serde_json::to_string_pretty(&r).unwrap();
            let back: Report = serde_json::from_str(&text).unwrap();
            assert_eq!(back, r);
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["result"]["mode"], r.result.mode());
        }
    }

    #[test]
    fn reads_reports_from_before_the_gap_figures() {
        let mut v =
            serde_json::to_value(report(ModeResult::Throughput(sample_throughput()))).unwrap();
        let result = v["result"].as_object_mut().unwrap();
        result.remove("gap_us");
        result.remove("stuck");
        let r: Report = serde_json::from_value(v).unwrap();
        let ModeResult::Throughput(t) = r.result else {
            panic!("not a throughput result")
        };
        assert_eq!((t.gap_us.count, t.stuck), (0, None));
    }

    #[test]
    fn fairness_index() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), 1.0);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }
}
