//! The traffic engine behind `throughput` and `latency`.
//!
//! A run is a set of peers (one DERP connection each) and flows between
//! them. Peers are spread over worker threads; each worker runs its own mio
//! event loop over its connections and never shares a lock with the others.
//! The run goes through fixed phases on one clock:
//!
//! ```text
//! connect ─ all ready ─ start ─ warm-up ─ ws ─ measured window ─ we ─ drain ─ done
//! ```
//!
//! Senders stamp every packet with its flow, sequence number and send time
//! ([`crate::stamp`]). Statistics are keyed by the *send* time: a packet
//! counts as offered in the window if it was stamped inside it, and as
//! delivered if such a packet arrives at all (the drain phase waits for
//! stragglers), so loss is `1 − delivered / sent` over the same packets.
//! Delivered throughput counts the bytes that *arrived* inside the window,
//! which is what a receiver experiences. One-way latency is `arrival −
//! stamp`; ping flows are echoed by their receiver and give round trips.
//!
//! Each receiver also notes, per flow, how long it went without a packet
//! inside the window ([`Gaps`]): the worst of those stretches is the longest
//! stall any receiver saw, which a relay that pauses senders shows and an
//! average rate hides.
//!
//! Stuck receivers ([`StuckPeers`]) complete their handshake and
//! then stop reading until the window ends, as a frozen laptop or a hostile
//! client would. Flows to them start with the window, so the warm-up is
//! undisturbed and the window sees the onset; their packets are counted
//! apart from the healthy ones. After the window they read again, which
//! shows whether the server cut them off meanwhile (the close only reaches
//! a client behind the data queued before it).
//!
//! Per loop turn a worker: polls, reads every readable socket, appends all
//! due packets to their connections' output buffers from pre-built frames,
//! and flushes each connection once. Nothing on the packet path allocates.
//! Paced flows are served before unpaced ones, so an unpaced flow sharing a
//! connection with paced ones takes what room they leave.
//!
//! By default the poll never sleeps (`spin`): on a virtual machine an idle
//! vCPU can take milliseconds to wake, which would add the generator's own
//! wake-ups to every latency it measures and stall the pipelines it feeds.
//! The generator has a core of its own, so spinning costs the server
//! nothing. Because CPU use then says nothing, each worker counts the time
//! of the turns that did work; that busy fraction is what shows whether the
//! generator was the bottleneck. Without spinning the poll waits at most
//! 1 ms, or not at all while an unpaced flow can write more.
//!
//! Paced flows are served once per batch interval (200 µs by default):
//! everything that fell due meanwhile is written at once. Spinning alone
//! would write every packet separately, which at gigabits per second costs
//! the generator (and the server) a system call per packet; real clients
//! write in bursts too. Packets are stamped when written, so the interval
//! does not enter the measured latency.

use crate::clock;
use crate::conn::PeerKey;
use crate::histogram::Histogram;
use crate::stamp::Kind;
use crate::target::Target;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod stats;
mod worker;

pub use stats::{FlowStats, Gaps, TrafficOutcome};
use worker::{worker, WorkerCtx, WorkerResult};

/// One directed flow of the plan.
#[derive(Debug, Clone)]
pub struct FlowPlan {
    /// Index into the report's per-flow figures.
    pub id: u32,
    /// Sending peer.
    pub src: usize,
    /// Receiving peer.
    pub dst: usize,
    /// Data (one-way) or ping (echoed).
    pub kind: Kind,
    /// Packets per second; `None` for unpaced.
    pub pps: Option<f64>,
    /// Packet size in bytes.
    pub size: usize,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct TrafficPlan {
    /// Number of peers.
    pub peers: usize,
    /// Flows between them.
    pub flows: Vec<FlowPlan>,
    /// Worker threads.
    pub threads: usize,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Longest wait for in-flight packets after the window.
    pub drain: Duration,
    /// Longest time for all peers to connect.
    pub connect_timeout: Duration,
    /// Bytes a connection may hold queued before its flows wait.
    pub out_cap: usize,
    /// Poll without sleeping: the generator reacts at once instead of
    /// paying the wake-up latency of an idle CPU (see the crate docs).
    pub spin: bool,
    /// Paced flows send what fell due at most this often (nanoseconds), so
    /// packets leave in small bursts rather than one write each.
    pub batch_ns: u64,
    /// Peers that stop reading after their handshake (see the module docs).
    pub stuck: StuckPeers,
    /// Sample the server and the traffic this often (soak runs).
    pub sample_every: Option<Duration>,
    /// The peers' keys, one per peer; empty: fresh keys.
    pub keys: Vec<Arc<PeerKey>>,
}

/// The stuck receivers of a run (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct StuckPeers {
    /// Their peer indices; empty for none.
    pub peers: Range<usize>,
    /// `SO_RCVBUF` of their sockets, set before connecting.
    pub rcvbuf: usize,
}

impl StuckPeers {
    /// Whether `peer` is a stuck receiver.
    pub fn contains(&self, peer: usize) -> bool {
        self.peers.contains(&peer)
    }
}

/// Where the peers connect: all to one server, or, with a second server
/// (`--peer-url`), the receivers there and the senders to the first, so
/// that with two nodes of a meshed region every packet crosses the mesh.
#[derive(Debug, Clone)]
pub struct Servers {
    /// The senders' server (everyone's, without `peer`).
    pub main: Arc<Target>,
    /// The receivers' server.
    pub peer: Option<Arc<Target>>,
}

impl Servers {
    /// Every peer on `main`.
    pub fn single(main: Arc<Target>) -> Self {
        Servers { main, peer: None }
    }

    /// The server `peer` connects to: with a second server, the receivers
    /// go there — the second peer of every pair (`2i` sends to `2i+1`, so
    /// the odd-numbered peers) and the stuck receivers.
    pub fn of(&self, peer: usize, stuck: &StuckPeers) -> &Arc<Target> {
        match &self.peer {
            Some(p) if peer % 2 == 1 || stuck.contains(peer) => p,
            _ => &self.main,
        }
    }

    /// The servers' URLs, for messages.
    pub fn describe(&self) -> String {
        match &self.peer {
            Some(p) => format!("{} (senders) and {} (receivers)", self.main.url, p.url),
            None => self.main.url.clone(),
        }
    }
}

/// Live counters for the progress line.
#[derive(Debug, Default)]
pub struct Live {
    /// Peers connected.
    pub ready: AtomicUsize,
    /// Payload bytes sent.
    pub sent_bytes: AtomicU64,
    /// Payload bytes received.
    pub recv_bytes: AtomicU64,
    /// Pongs received.
    pub pongs: AtomicU64,
    /// One-way latency of the data packets that arrived since the
    /// coordinator last took it (workers add theirs every 50 ms), for
    /// figures over time (`--sample-every`).
    pub latency: Mutex<Histogram>,
}

/// State shared by the coordinator and the workers.
#[derive(Debug, Default)]
pub struct Shared {
    /// When sending starts (run clock); 0 until every peer is ready.
    pub start_ns: AtomicU64,
    /// Stop now (an error elsewhere, or the coordinator gave up).
    pub abort: AtomicBool,
    /// First fatal error.
    pub error: Mutex<Option<String>>,
    /// Progress counters.
    pub live: Live,
}

impl Shared {
    fn fail(&self, msg: String) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            *e = Some(msg);
        }
        self.abort.store(true, Ordering::SeqCst);
    }
}

/// Phase boundaries on the run clock.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    /// Sending starts.
    pub start: u64,
    /// Window start.
    pub ws: u64,
    /// Window end.
    pub we: u64,
    /// Latest end of the drain.
    pub end: u64,
}

impl Timeline {
    /// The phases of `plan` from `start`.
    pub fn new(plan: &TrafficPlan, start: u64) -> Self {
        let ws = start + clock::ns(plan.warmup);
        let we = ws + clock::ns(plan.duration).max(1);
        Timeline {
            start,
            ws,
            we,
            end: we + clock::ns(plan.drain),
        }
    }

    #[inline]
    fn in_window(&self, t: u64) -> bool {
        t >= self.ws && t < self.we
    }

    /// How much of `[a, b)` lies inside the window.
    fn overlap(&self, a: u64, b: u64) -> u64 {
        b.min(self.we).saturating_sub(a.max(self.ws))
    }
}

/// A handle on a running traffic run.
pub struct Running {
    /// Shared state (progress, abort).
    pub shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<WorkerResult>>,
    plan: TrafficPlan,
}

/// Generates the peers' keys and starts the workers, which connect at once.
pub fn spawn(servers: Servers, plan: TrafficPlan) -> Running {
    let shared = Arc::new(Shared::default());
    let keys: Arc<Vec<Arc<PeerKey>>> = Arc::new(
        (0..plan.peers)
            .map(|p| plan.keys.get(p).cloned().unwrap_or_else(PeerKey::generate))
            .collect(),
    );
    let threads = plan.threads.clamp(1, plan.peers.max(1));
    let mut workers = Vec::with_capacity(threads);
    for w in 0..threads {
        let my_peers: Vec<usize> = (0..plan.peers).filter(|p| p % threads == w).collect();
        let flows: Vec<FlowPlan> = plan
            .flows
            .iter()
            .filter(|f| f.src % threads == w)
            .cloned()
            .collect();
        let ctx = WorkerCtx {
            servers: servers.clone(),
            keys: keys.clone(),
            shared: shared.clone(),
            my_peers,
            flows,
            total_flows: plan.flows.len(),
            plan: plan.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("bench-{w}"))
            .spawn(move || worker(ctx))
            .expect("spawn worker thread");
        workers.push(handle);
    }
    Running {
        shared,
        workers,
        plan,
    }
}

impl Running {
    /// The plan being run.
    pub fn plan(&self) -> &TrafficPlan {
        &self.plan
    }

    /// Whether every worker has finished.
    pub fn finished(&self) -> bool {
        self.workers.iter().all(|w| w.is_finished())
    }

    /// Starts sending at `start` (run clock) and returns the phases.
    pub fn start_at(&self, start: u64) -> Timeline {
        self.shared.start_ns.store(start, Ordering::SeqCst);
        Timeline::new(&self.plan, start)
    }

    /// Stops every worker.
    pub fn abort(&self) {
        self.shared.abort.store(true, Ordering::SeqCst);
    }

    /// The first fatal error, if any.
    pub fn error(&self) -> Option<String> {
        self.shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits for the workers and merges what they measured.
    pub fn join(self, connect_started: u64) -> Result<TrafficOutcome, String> {
        let mut out = TrafficOutcome {
            per_flow_delivered: vec![0; self.plan.flows.len()],
            window_s: self.plan.duration.as_secs_f64(),
            ..TrafficOutcome::default()
        };
        let mut ready_at = 0;
        for w in self.workers {
            let r = w
                .join()
                .map_err(|_| "a worker thread panicked".to_owned())?;
            out.data.merge(&r.tally.data);
            out.ping.merge(&r.tally.ping);
            out.stuck.merge(&r.tally.stuck);
            out.gaps.merge(&r.gaps);
            out.stuck_cut_off += r.stuck_cut_off;
            out.echoed += r.echoed;
            for (a, b) in out.per_flow_delivered.iter_mut().zip(&r.per_flow) {
                *a += b;
            }
            out.other_frames += r.other_frames;
            out.foreign_packets += r.foreign;
            out.disconnects += r.disconnects;
            if out.first_disconnect.is_none() {
                out.first_disconnect = r.first_disconnect;
            }
            if out.tls.is_none() {
                out.tls = r.tls;
            }
            ready_at = ready_at.max(r.ready_at);
            out.work_s += r.work_ns as f64 / 1e9;
        }
        if let Some(e) = self
            .shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(e);
        }
        out.connect_s = ready_at.saturating_sub(connect_started) as f64 / 1e9;
        Ok(out)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receivers_connect_to_the_peer_server() {
        let a = Arc::new(Target::new("http://127.0.0.1:1", None, None, false).unwrap());
        let b = Arc::new(Target::new("http://127.0.0.1:2", None, None, false).unwrap());
        let stuck = StuckPeers {
            peers: 4..6,
            rcvbuf: 4096,
        };
        let one = Servers::single(a.clone());
        assert!((0..6).all(|p| Arc::ptr_eq(one.of(p, &stuck), &a)));
        let two = Servers {
            main: a.clone(),
            peer: Some(b.clone()),
        };
        // Pairs 0→1 and 2→3: senders on the first server, receivers on the
        // second; both stuck receivers (4 and 5) on the second.
        let on_b: Vec<usize> = (0..6)
            .filter(|&p| Arc::ptr_eq(two.of(p, &stuck), &b))
            .collect();
        assert_eq!(on_b, [1, 3, 4, 5]);
        assert!(Arc::ptr_eq(two.of(2, &StuckPeers::default()), &a));
    }
}
