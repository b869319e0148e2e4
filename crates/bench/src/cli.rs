//! The command line.

use crate::units::{parse_duration, parse_rate, Rate};
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Load generator for DERP relays (Ferry, Tailscale's derper, anything that
/// speaks DERP): throughput, latency, idle connections and churn, with JSON
/// results. Rates are megabits of packet payload per second.
#[derive(Debug, Parser)]
#[command(name = "ferry-bench", version, propagate_version = true)]
pub struct Cli {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// The modes.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Peers in pairs send paced one-way traffic: delivered rate, loss,
    /// one-way latency, the longest gap a receiver saw; optionally with
    /// stuck receivers among them (--stuck).
    Throughput(ThroughputArgs),
    /// Ping/echo round trips between peer pairs, optionally under
    /// background load.
    Latency(LatencyArgs),
    /// Open many connections and hold them: connect rate, server memory per
    /// connection.
    Idle(IdleArgs),
    /// Connect, handshake, disconnect at a rate: handshakes/s and failures.
    Churn(ChurnArgs),
    /// Run the ceiling forwarder: plain DERP, one thread, nothing but
    /// copying sendPacket to recvPacket (see the crate docs).
    CeilingServer(CeilingArgs),
}

/// Options every client mode takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Server URL: http://HOST:PORT or https://HOST:PORT (path /derp implied).
    #[arg(short, long, default_value = "http://127.0.0.1:3340")]
    pub server: String,
    /// Dial this address instead of resolving the URL's host (SNI and Host
    /// still come from the URL).
    #[arg(long, value_name = "ADDR")]
    pub connect: Option<SocketAddr>,
    /// PEM file with the certificate or CA to trust for https.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// INSECURE: accept any server certificate (https only; recorded in the
    /// report).
    #[arg(long)]
    pub insecure: bool,
    /// Pid of the server process: report its CPU use and memory.
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,
    /// Scrape the server's /debug/varz before and after the window and
    /// report the changes (drops, shard busy time, …).
    #[arg(long)]
    pub metrics: bool,
    /// Write the JSON report to this file instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Free text stored in the report (e.g. which server this is).
    #[arg(long)]
    pub label: Option<String>,
    /// No progress line and no summary on standard error.
    #[arg(short, long)]
    pub quiet: bool,
    /// Deadline for each connection's handshake (and for connecting all
    /// peers of a traffic run).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Options of the traffic engine (throughput and latency).
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Warm-up before the measured window.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// The measured window.
    #[arg(short, long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Longest wait for packets still in flight after the window (it ends
    /// sooner, once nothing has arrived for 300 ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Event-loop threads (peers are spread over them).
    #[arg(short, long, default_value_t = 1)]
    pub threads: usize,
    /// Bytes a connection may have queued in ferry-bench before its flows
    /// wait (unpaced) or skip (paced).
    #[arg(long, default_value_t = 256 * 1024, value_name = "BYTES")]
    pub out_cap: usize,
    /// Let the event loops sleep in poll instead of spinning (spinning keeps
    /// the generator's reaction time free of CPU wake-up latency; its busy
    /// fraction is reported either way).
    #[arg(long)]
    pub no_spin: bool,
    /// Paced flows send what fell due at most this often (one write per
    /// connection per interval).
    #[arg(long, default_value = "200us", value_parser = parse_duration)]
    pub batch: Duration,
    /// Soak: every this often during the run, record the server's RSS,
    /// descriptors and CPU (with --server-pid), its memory gauges (with
    /// --metrics), and the rates and data latency of the interval, in the
    /// report's `samples`.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub sample_every: Option<Duration>,
}

/// `throughput`.
#[derive(Debug, Clone, Args)]
pub struct ThroughputArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub engine: EngineArgs,
    /// Peers (connections), in pairs 0→1, 2→3, …
    #[arg(short = 'n', long, default_value_t = 20)]
    pub peers: usize,
    /// File of `src dst` lines (peer indices) instead of --peers pairs.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["peers", "bidirectional"])]
    pub pairs_file: Option<PathBuf>,
    /// Each pair sends both ways (the rate applies to each direction).
    #[arg(long)]
    pub bidirectional: bool,
    /// Packet size in bytes (at least 32).
    #[arg(long, default_value_t = 1400)]
    pub size: usize,
    /// Offered rate per flow: 200M, 1.5G (bit/s), 50kpps, or max (unpaced).
    #[arg(short, long, default_value = "max", value_parser = parse_rate)]
    pub rate: Rate,
    /// Offered rate over all flows, split evenly (overrides --rate).
    #[arg(long, value_parser = parse_rate)]
    pub total_rate: Option<Rate>,
    /// Ferry with several workers: put this percentage of the --peers/2
    /// one-way flows across shards and the rest within one, every shard
    /// sending and receiving alike. Learns each key's shard from the
    /// server's ferry_shard_connections first; fails when the measured
    /// share (ferry_shard_cross_packets_total over packets read) is more
    /// than 5 points off.
    #[arg(long, value_name = "PCT", requires = "metrics",
          conflicts_with_all = ["pairs_file", "bidirectional", "peer_url", "stuck"])]
    pub cross_shard: Option<f64>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub stuck: StuckArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub peer: PeerServerArgs,
}

/// A second server for the receivers of `throughput` and `latency`: with
/// two nodes of one meshed region, every packet crosses the mesh.
#[derive(Debug, Clone, Default, Args)]
pub struct PeerServerArgs {
    /// Receivers connect to this server instead of --server: the second
    /// peer of every pair (the odd-numbered peers, with --pairs-file too;
    /// in latency runs the echoing side) and stuck receivers. Senders stay
    /// on --server. TLS as for --server (--ca or --insecure).
    #[arg(long, value_name = "URL")]
    pub peer_url: Option<String>,
    /// Dial this address for --peer-url instead of resolving its host.
    #[arg(long, value_name = "ADDR", requires = "peer_url")]
    pub peer_connect: Option<SocketAddr>,
    /// Pid of the --peer-url server: report its CPU use and memory too
    /// (and count it as part of the run, not as other work on the machine).
    #[arg(long, value_name = "PID", requires = "peer_url")]
    pub peer_server_pid: Option<u32>,
}

/// Stuck receivers among the pairs of `throughput`: extra peers
/// that complete the handshake and then never read their socket again, as a
/// frozen laptop or a hostile client would. Every sender also sends them
/// large packets from the start of the measured window.
#[derive(Debug, Clone, Args)]
pub struct StuckArgs {
    /// Stuck receivers (extra peers after the pairs; 0: none).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub stuck: usize,
    /// Packet size towards the stuck receivers, bytes.
    #[arg(long, default_value_t = 32 * 1024, value_name = "BYTES")]
    pub stuck_size: usize,
    /// Rate of each sender towards the stuck receivers, over all of them
    /// (200M, 100pps, max); paced traffic to the stuck receivers goes out
    /// before unpaced traffic to the healthy partner.
    #[arg(long, default_value = "10M", value_parser = parse_rate)]
    pub stuck_rate: Rate,
    /// SO_RCVBUF of the stuck receivers' sockets, set before connecting so
    /// they fill fast (the kernel doubles it and enforces a minimum).
    #[arg(long, default_value_t = 4096, value_name = "BYTES")]
    pub stuck_rcvbuf: usize,
}

/// `latency`.
#[derive(Debug, Clone, Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub engine: EngineArgs,
    /// Pairs exchanging pings (each ping is echoed by the other peer).
    #[arg(long, default_value_t = 1)]
    pub ping_pairs: usize,
    /// Pings per second per pair.
    #[arg(long, default_value_t = 1000.0)]
    pub ping_rate: f64,
    /// Ping size in bytes (at least 32).
    #[arg(long, default_value_t = 1400)]
    pub ping_size: usize,
    /// Background peers (in pairs) sending one-way load.
    #[arg(long, default_value_t = 0)]
    pub load_peers: usize,
    /// Background packet size in bytes.
    #[arg(long, default_value_t = 1400)]
    pub size: usize,
    /// Background rate per flow (200M, 50kpps, max).
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    pub load_rate: Rate,
    /// Background rate over all flows, split evenly (overrides --load-rate).
    #[arg(long, value_parser = parse_rate)]
    pub load_total_rate: Option<Rate>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub peer: PeerServerArgs,
}

/// `idle`.
#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Connections to open and hold.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub conns: usize,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// How long to hold them once all are connected.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub hold: Duration,
}

/// `churn`.
#[derive(Debug, Clone, Args)]
pub struct ChurnArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Handshakes per second to start (e.g. 2000, 5k), or max.
    #[arg(short, long, default_value = "max", value_parser = parse_rate_count)]
    pub rate: PerSecond,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// How long to keep starting connections.
    #[arg(short, long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Keep each connection open this long after its handshake.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub hold: Duration,
    /// Distinct client keys, reused in turn.
    #[arg(long, default_value_t = 4096)]
    pub keys: usize,
}

/// `ceiling-server`.
#[derive(Debug, Clone, Args)]
pub struct CeilingArgs {
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:3340")]
    pub addr: SocketAddr,
    /// Output bytes held per connection before its senders stop being read.
    #[arg(long, default_value_t = 256 * 1024, value_name = "BYTES")]
    pub out_cap: usize,
}

/// Events per second; `None` for as fast as possible.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerSecond(pub Option<f64>);

/// A count per second (`2000`, `5k`) or `max`.
fn parse_rate_count(text: &str) -> Result<PerSecond, String> {
    match parse_rate(text)? {
        Rate::Max => Ok(PerSecond(None)),
        Rate::Bits(v) | Rate::Packets(v) => Ok(PerSecond(Some(v))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["ferry-bench", "throughput"]).unwrap();
        let Command::Throughput(t) = cli.command else {
            panic!()
        };
        assert_eq!(t.peers, 20);
        assert_eq!(t.size, 1400);
        assert_eq!(t.rate, Rate::Max);
        assert_eq!(t.common.server, "http://127.0.0.1:3340");
        assert_eq!(t.engine.duration, Duration::from_secs(5));
        assert_eq!(t.stuck.stuck, 0);
        assert_eq!(t.stuck.stuck_size, 32 * 1024);
        assert_eq!(t.stuck.stuck_rate, Rate::Bits(10e6));
        assert_eq!(t.peer.peer_url, None);
        let cli = Cli::try_parse_from([
            "ferry-bench",
            "latency",
            "--peer-url",
            "https://localhost:8443",
            "--peer-server-pid",
            "7",
        ])
        .unwrap();
        let Command::Latency(l) = cli.command else {
            panic!()
        };
        assert_eq!(l.peer.peer_url.as_deref(), Some("https://localhost:8443"));
        assert_eq!(l.peer.peer_server_pid, Some(7));
        assert!(
            Cli::try_parse_from(["ferry-bench", "throughput", "--peer-server-pid", "7"]).is_err(),
            "a peer pid without a peer server"
        );
        let cli = Cli::try_parse_from(["ferry-bench", "churn", "-r", "5k"]).unwrap();
        let Command::Churn(c) = cli.command else {
            panic!()
        };
        assert_eq!(c.rate, PerSecond(Some(5000.0)));
        assert!(Cli::try_parse_from(["ferry-bench", "throughput", "--rate", "fast"]).is_err());
        assert!(
            Cli::try_parse_from(["ferry-bench", "throughput", "--pairs-file", "f", "-n", "4"])
                .is_err()
        );
        let cli = Cli::try_parse_from([
            "ferry-bench",
            "throughput",
            "--cross-shard",
            "25",
            "--metrics",
        ])
        .unwrap();
        let Command::Throughput(t) = cli.command else {
            panic!()
        };
        assert_eq!(t.cross_shard, Some(25.0));
        assert!(
            Cli::try_parse_from(["ferry-bench", "throughput", "--cross-shard", "25"]).is_err(),
            "the share is proved by the server's metrics"
        );
    }
}
