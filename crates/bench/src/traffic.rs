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

use crate::clock::{self, now_ns};
use crate::conn::{Link, LinkError, PeerKey, Scratch, Stage};
use crate::histogram::Histogram;
use crate::pacing::Pacer;
use crate::stamp::{self, Kind, Template};
use crate::target::Target;
use ferry_proto::client::Event;
use mio::{Events, Poll, Token};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Read budget per socket per turn, so one busy socket cannot starve the
/// others.
const READ_BUDGET: usize = 1 << 20;
/// Connects in flight per worker while setting up.
const CONNECT_CONCURRENCY: usize = 256;
/// A worker's drain ends after this long without receiving anything.
const QUIET_NS: u64 = 300_000_000;
/// Largest late burst after a stall, in packets (see [`Pacer`]).
const MAX_BURST: u32 = 64;

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

/// Counters for one kind of traffic, summed over workers.
#[derive(Debug, Default, Clone)]
pub struct FlowStats {
    /// Packets stamped inside the window.
    pub sent_window: u64,
    /// Payload bytes stamped inside the window.
    pub sent_bytes_window: u64,
    /// Packets the schedule skipped inside the window because the
    /// connection was blocked (paced flows only).
    pub skipped_window: u64,
    /// Packets sent over the whole run.
    pub sent_total: u64,
    /// Packets stamped inside the window that arrived (for pings: whose
    /// pong came back).
    pub delivered_of_window: u64,
    /// Packets that arrived inside the window (by arrival time).
    pub arrived_in_window: u64,
    /// Payload bytes that arrived inside the window.
    pub arrived_bytes_in_window: u64,
    /// Packets received over the whole run.
    pub received_total: u64,
    /// One-way latency (data) or round-trip time (pings) of the window's
    /// packets, nanoseconds.
    pub latency: Histogram,
}

impl FlowStats {
    fn merge(&mut self, o: &FlowStats) {
        self.sent_window += o.sent_window;
        self.sent_bytes_window += o.sent_bytes_window;
        self.skipped_window += o.skipped_window;
        self.sent_total += o.sent_total;
        self.delivered_of_window += o.delivered_of_window;
        self.arrived_in_window += o.arrived_in_window;
        self.arrived_bytes_in_window += o.arrived_bytes_in_window;
        self.received_total += o.received_total;
        self.latency.merge(&o.latency);
    }
}

/// Which counters a flow's packets go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Data between healthy peers.
    Data,
    /// Pings and their pongs.
    Ping,
    /// Data to a stuck receiver.
    Stuck,
}

/// The counters of each [`Class`].
#[derive(Debug, Default)]
struct Tally {
    data: FlowStats,
    ping: FlowStats,
    stuck: FlowStats,
}

impl Tally {
    fn of(&mut self, class: Class) -> &mut FlowStats {
        match class {
            Class::Data => &mut self.data,
            Class::Ping => &mut self.ping,
            Class::Stuck => &mut self.stuck,
        }
    }
}

/// The stretches without packets that a worker's receivers saw inside the
/// window, per flow: from the window's start (or the flow's last packet) to
/// its next packet, and from its last packet to the window's end.
#[derive(Debug)]
pub struct Gaps {
    /// When each flow's last packet arrived (run clock; 0 before the first).
    last: Vec<u64>,
    /// Every stretch, nanoseconds; packets read together count as 0.
    stretches: Histogram,
}

impl Gaps {
    /// Tracks flows `0..flows`.
    pub fn new(flows: usize) -> Self {
        Gaps {
            last: vec![0; flows],
            stretches: Histogram::new(),
        }
    }

    /// A packet of `flow` arrived at `t`: records the stretch since the
    /// flow's last packet, as far as it lies inside the window.
    #[inline]
    pub fn arrival(&mut self, flow: usize, t: u64, tl: &Timeline) {
        let Some(last) = self.last.get_mut(flow) else {
            return;
        };
        if *last < tl.we && t >= tl.ws {
            self.stretches.record(tl.overlap(*last, t));
        }
        *last = t;
    }

    /// Ends the window for `flows`: each one that had no packet since the
    /// window's end gets the stretch from its last packet to that end.
    pub fn close(&mut self, flows: impl IntoIterator<Item = usize>, tl: &Timeline) {
        for flow in flows {
            if self.last.get(flow).is_some_and(|&l| l < tl.we) {
                self.arrival(flow, tl.we, tl);
            }
        }
    }

    /// All stretches recorded, nanoseconds; the maximum is the longest a
    /// receiver went without a packet.
    pub fn stretches(&self) -> &Histogram {
        &self.stretches
    }
}

/// Everything a run measured.
#[derive(Debug, Default)]
pub struct TrafficOutcome {
    /// Data flows between healthy peers.
    pub data: FlowStats,
    /// Ping flows (round trips).
    pub ping: FlowStats,
    /// Data flows to stuck receivers (delivered: read after the window).
    pub stuck: FlowStats,
    /// Stretches without packets at the healthy data receivers, within the
    /// window, nanoseconds (see [`Gaps`]).
    pub gaps: Histogram,
    /// Stuck receivers the server had closed by the end of the run.
    pub stuck_cut_off: u64,
    /// Pings echoed by receivers.
    pub echoed: u64,
    /// Per data flow: packets of the window delivered.
    pub per_flow_delivered: Vec<u64>,
    /// Window length, seconds.
    pub window_s: f64,
    /// Frames other than recvPacket (keepalives, peerGone, …).
    pub other_frames: u64,
    /// recvPacket frames that were not ours.
    pub foreign_packets: u64,
    /// Healthy connections lost after the handshake.
    pub disconnects: u64,
    /// First disconnect error, if any.
    pub first_disconnect: Option<String>,
    /// Negotiated TLS version and suite.
    pub tls: Option<(String, String)>,
    /// Time for all peers to connect, seconds.
    pub connect_s: f64,
    /// Seconds the workers spent working (not waiting for, or spinning on,
    /// an empty poll) during the window, summed over threads.
    pub work_s: f64,
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

struct WorkerResult {
    tally: Tally,
    gaps: Histogram,
    echoed: u64,
    per_flow: Vec<u64>,
    other_frames: u64,
    foreign: u64,
    disconnects: u64,
    stuck_cut_off: u64,
    first_disconnect: Option<String>,
    tls: Option<(String, String)>,
    ready_at: u64,
    work_ns: u64,
}

/// Generates the peers' keys and starts the workers, which connect at once.
pub fn spawn(servers: Servers, plan: TrafficPlan) -> Running {
    let shared = Arc::new(Shared::default());
    let keys: Arc<Vec<Arc<PeerKey>>> =
        Arc::new((0..plan.peers).map(|_| PeerKey::generate()).collect());
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

struct WorkerCtx {
    servers: Servers,
    keys: Arc<Vec<Arc<PeerKey>>>,
    shared: Arc<Shared>,
    my_peers: Vec<usize>,
    flows: Vec<FlowPlan>,
    total_flows: usize,
    plan: TrafficPlan,
}

/// A flow as its sending worker holds it.
struct LocalFlow {
    link: usize,
    class: Class,
    template: Template,
    payload_len: u64,
    pacer: Option<Pacer>,
    pps: Option<f64>,
    /// When the flow starts sending (run clock): with the warm-up, or with
    /// the window for flows to stuck receivers.
    starts_at: u64,
    seq: u64,
    skipped_at_ws: Option<u64>,
    skipped_at_we: Option<u64>,
}

/// The receive side's statistics, borrowed by the frame callback.
struct RecvStats {
    tally: Tally,
    gaps: Gaps,
    echoed: u64,
    per_flow: Vec<u64>,
    other_frames: u64,
    foreign: u64,
    recv_bytes: u64,
    pongs: u64,
    last_arrival: u64,
    /// Data latency since the last hand-over to [`Live::latency`].
    recent: Histogram,
}

fn worker(ctx: WorkerCtx) -> WorkerResult {
    let WorkerCtx {
        servers,
        keys,
        shared,
        my_peers,
        flows,
        total_flows,
        plan,
    } = ctx;
    let mut stats = RecvStats {
        tally: Tally::default(),
        gaps: Gaps::new(total_flows),
        echoed: 0,
        per_flow: vec![0; total_flows],
        other_frames: 0,
        foreign: 0,
        recv_bytes: 0,
        pongs: 0,
        last_arrival: 0,
        recent: Histogram::new(),
    };
    let mut result = WorkerResult {
        tally: Tally::default(),
        gaps: Histogram::new(),
        echoed: 0,
        per_flow: Vec::new(),
        other_frames: 0,
        foreign: 0,
        disconnects: 0,
        stuck_cut_off: 0,
        first_disconnect: None,
        tls: None,
        ready_at: 0,
        work_ns: 0,
    };
    let mut poll = match Poll::new() {
        Ok(p) => p,
        Err(e) => {
            shared.fail(format!("cannot create an event loop: {e}"));
            return result;
        }
    };
    let mut events = Events::with_capacity(1024);
    let mut scratch = Scratch::default();
    let local_of: HashMap<usize, usize> =
        my_peers.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    let mut links: Vec<Option<Link>> = (0..my_peers.len()).map(|_| None).collect();
    let mut next_connect = 0usize;
    let mut connecting = 0usize;
    let mut ready = 0usize;
    let connect_deadline = now_ns() + clock::ns(plan.connect_timeout);
    let mut local_flows: Vec<LocalFlow> = flows
        .iter()
        .map(|f| LocalFlow {
            link: local_of[&f.src],
            class: match f.kind {
                Kind::Ping | Kind::Pong => Class::Ping,
                Kind::Data if plan.stuck.contains(f.dst) => Class::Stuck,
                Kind::Data => Class::Data,
            },
            template: Template::new(&keys[f.dst].public, f.kind, f.id, f.size),
            payload_len: f.size.max(stamp::STAMP_LEN) as u64,
            pacer: None,
            pps: f.pps,
            starts_at: u64::MAX,
            seq: 0,
            skipped_at_ws: None,
            skipped_at_we: None,
        })
        .collect();
    local_flows.sort_by_key(|f| f.pps.is_none());
    // The stuck receivers among this worker's links, and the healthy data
    // flows it receives (their gaps are closed at the window's end).
    let is_stuck: Vec<bool> = my_peers.iter().map(|&p| plan.stuck.contains(p)).collect();
    let healthy_received: Vec<usize> = plan
        .flows
        .iter()
        .filter(|f| f.kind == Kind::Data && local_of.contains_key(&f.dst))
        .filter(|f| !plan.stuck.contains(f.dst))
        .map(|f| f.id as usize)
        .collect();
    let mut timeline: Option<Timeline> = None;
    let mut again: Vec<usize> = Vec::new();
    let mut todo: Vec<(usize, bool, bool)> = Vec::with_capacity(1024);
    let mut last_live = 0u64;
    let (mut live_sent, mut live_recv, mut live_pongs) = (0u64, 0u64, 0u64);
    let mut sent_bytes = 0u64;
    let mut work_ns = 0u64;
    let mut last_batch = 0u64;
    let mut pending_work_since: Option<u64> = None;
    let max_turns: u64 = 1 << 40; // a bound no run reaches; the clock ends runs.

    for _turn in 0..max_turns {
        if shared.abort.load(Ordering::Relaxed) {
            break;
        }
        let now = now_ns();

        // Connect more peers, up to the concurrency limit.
        while connecting < CONNECT_CONCURRENCY && next_connect < links.len() {
            let i = next_connect;
            next_connect += 1;
            let key = keys[my_peers[i]].clone();
            let target = servers.of(my_peers[i], &plan.stuck);
            let link = if is_stuck[i] {
                target
                    .dial_with_rcvbuf(plan.stuck.rcvbuf, plan.connect_timeout)
                    .map_err(LinkError::Connect)
                    .and_then(|sock| Link::connect_over(sock, target, key, now))
            } else {
                Link::connect(target, key, now)
            };
            match link {
                Ok(mut l) => {
                    if let Err(e) = l.register(poll.registry(), Token(i)) {
                        shared.fail(format!("peer {}: cannot register socket: {e}", my_peers[i]));
                        break;
                    }
                    links[i] = Some(l);
                    connecting += 1;
                }
                Err(e) => {
                    shared.fail(unreachable_message(target, my_peers[i], &e));
                    break;
                }
            }
        }
        if ready < links.len() && now > connect_deadline {
            let stuck = links
                .iter()
                .flatten()
                .find(|l| !l.is_ready())
                .map(|l| l.stage());
            shared.fail(format!(
                "only {ready} of {} peers on this thread connected within {:?} (one is still {})",
                links.len(),
                plan.connect_timeout,
                stuck.unwrap_or(Stage::Connecting).describe()
            ));
            break;
        }

        // Phases.
        if timeline.is_none() {
            let s = shared.start_ns.load(Ordering::SeqCst);
            if s != 0 {
                let tl = Timeline::new(&plan, s);
                let n = local_flows.len().max(1) as f64;
                for (k, f) in local_flows.iter_mut().enumerate() {
                    // Spread the flows' first packets over one interval so
                    // they do not all fire in the same turn.
                    let offset = f.pps.map_or(0, |pps| (1e9 / pps * k as f64 / n) as u64);
                    f.starts_at = if f.class == Class::Stuck { tl.ws } else { s };
                    f.pacer = Some(Pacer::new(f.pps, f.starts_at + offset, MAX_BURST));
                }
                timeline = Some(tl);
            }
        }
        let sending = timeline.is_some_and(|tl| now >= tl.start && now < tl.we);
        if let Some(tl) = timeline {
            if now >= tl.end {
                break;
            }
            if now >= tl.we {
                let drained = links.iter().flatten().all(|l| l.pending_out() == 0);
                if drained && now.saturating_sub(stats.last_arrival.max(tl.we)) > QUIET_NS {
                    break;
                }
            }
        }

        // Generate due packets.
        let mut can_write_more = false;
        let mut generated = 0u64;
        // Paced flows are served once per batch interval, so what fell due
        // meanwhile leaves in one write; unpaced flows whenever there is room.
        let batch_due = now.saturating_sub(last_batch) >= plan.batch_ns;
        if batch_due {
            last_batch = now;
        }
        // After the window the stuck receivers read again: whatever the
        // server still holds for them, then its close if it cut them off.
        // A close that comes with the last data raises no event of its own,
        // so they are read once per batch interval until the run ends.
        let released = timeline.is_some_and(|tl| now >= tl.we);
        if released && batch_due {
            for i in 0..links.len() {
                if is_stuck[i] && links[i].is_some() && !again.contains(&i) {
                    again.push(i);
                }
            }
        }
        if sending {
            let tl = timeline.expect("sending implies a timeline");
            let in_window = tl.in_window(now);
            for f in local_flows.iter_mut() {
                if now < f.starts_at {
                    continue;
                }
                let Some(link) = links[f.link].as_mut().filter(|l| l.is_ready()) else {
                    continue;
                };
                let pacer = f.pacer.as_mut().expect("pacers exist once started");
                if pacer.is_paced() && !batch_due {
                    continue;
                }
                if now >= tl.ws && f.skipped_at_ws.is_none() {
                    f.skipped_at_ws = Some(pacer.skipped());
                }
                let frame_len = f.template.len();
                let room = plan.out_cap.saturating_sub(link.pending_out()) / frame_len;
                let due = pacer.due(now);
                let n = due.min(room as u64);
                if !pacer.is_paced() && room > 0 && link.is_writable() {
                    can_write_more = true;
                }
                if n == 0 {
                    continue;
                }
                let out = link.out_mut();
                out.reserve(n as usize * frame_len);
                for _ in 0..n {
                    f.template.append(out, f.seq, now);
                    f.seq += 1;
                }
                pacer.sent(n);
                generated += n;
                let st = stats.tally.of(f.class);
                st.sent_total += n;
                if in_window {
                    st.sent_window += n;
                    st.sent_bytes_window += n * f.payload_len;
                }
                sent_bytes += n * f.payload_len;
            }
        }
        if let Some(tl) = timeline {
            if now >= tl.we {
                for f in local_flows.iter_mut() {
                    if f.skipped_at_we.is_none() {
                        f.skipped_at_we = f.pacer.as_ref().map(|p| p.skipped());
                    }
                }
            }
        }

        // Flush everything queued this turn (and last turn's leftovers).
        for i in 0..links.len() {
            let Some(link) = links[i].as_mut() else {
                continue;
            };
            if link.wants_flush() {
                if let Err(e) = link.flush() {
                    lose(
                        &mut links,
                        i,
                        e,
                        &mut result,
                        &shared,
                        (&servers, &my_peers, &plan.stuck),
                        &poll,
                        ready < my_peers.len(),
                    );
                }
            }
        }

        // Progress counters, every 50 ms.
        if now.saturating_sub(last_live) > 50_000_000 {
            shared
                .live
                .sent_bytes
                .fetch_add(sent_bytes - live_sent, Ordering::Relaxed);
            shared
                .live
                .recv_bytes
                .fetch_add(stats.recv_bytes - live_recv, Ordering::Relaxed);
            shared
                .live
                .pongs
                .fetch_add(stats.pongs - live_pongs, Ordering::Relaxed);
            (live_sent, live_recv, live_pongs) = (sent_bytes, stats.recv_bytes, stats.pongs);
            if stats.recent.count() > 0 {
                let mut l = shared
                    .live
                    .latency
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                l.merge(&stats.recent);
                drop(l);
                stats.recent.clear();
            }
            last_live = now;
        }

        // Wait for readiness (or, spinning, just look).
        let timeout = if plan.spin || can_write_more || !again.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_millis(1)
        };
        let before_poll = now_ns();
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                shared.fail(format!("event loop: {e}"));
                break;
            }
        }
        let after_poll = now_ns();
        // Busy time: the work of turns that did something, within the window.
        if let Some(tl) = timeline {
            if generated > 0 || !events.is_empty() || !again.is_empty() {
                work_ns += tl.overlap(now, before_poll);
                pending_work_since = Some(after_poll);
            }
        }
        todo.clear();
        todo.extend(events.iter().map(|ev| {
            (
                ev.token().0,
                ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                ev.is_writable(),
            )
        }));
        todo.extend(again.drain(..).map(|i| (i, true, false)));
        for &(i, readable, writable) in &todo {
            let Some(link) = links.get_mut(i).and_then(|l| l.as_mut()) else {
                continue;
            };
            let was_ready = link.is_ready();
            let mut io = Ok(());
            if writable {
                io = link.on_writable();
            }
            // A stuck receiver reads for its handshake, then not until the
            // window is over.
            let holding = is_stuck[i] && !released && was_ready;
            if readable && io.is_ok() && !holding {
                let arrival = now_ns();
                let tl = timeline;
                let at_stuck = is_stuck[i];
                let mut on_frame = |out: &mut Vec<u8>, event: Event<&[u8]>| {
                    on_server_frame(&mut stats, tl, arrival, at_stuck, out, event);
                };
                io = link
                    .on_readable(&mut scratch, READ_BUDGET, &mut on_frame)
                    .map(|o| {
                        if o.more {
                            again.push(i);
                        }
                    });
            }
            if let Err(e) = io {
                lose(
                    &mut links,
                    i,
                    e,
                    &mut result,
                    &shared,
                    (&servers, &my_peers, &plan.stuck),
                    &poll,
                    ready < my_peers.len(),
                );
                continue;
            }
            let link = links[i].as_ref().expect("still present");
            if !was_ready && link.is_ready() {
                ready += 1;
                connecting -= 1;
                if result.tls.is_none() {
                    result.tls = link.tls_parameters();
                }
                shared.live.ready.fetch_add(1, Ordering::SeqCst);
                if ready == links.len() {
                    result.ready_at = now_ns();
                }
            }
        }
        if let (Some(since), Some(tl)) = (pending_work_since.take(), timeline) {
            work_ns += tl.overlap(since, now_ns());
        }
        if shared.abort.load(Ordering::Relaxed) {
            break;
        }
    }

    // Skipped packets attributed to the window.
    for f in &local_flows {
        if let (Some(a), Some(b)) = (f.skipped_at_ws, f.skipped_at_we) {
            stats.tally.of(f.class).skipped_window += b.saturating_sub(a);
        }
    }
    // Stretches still open when the window ended, if the run got that far.
    if let Some(tl) = timeline.filter(|tl| now_ns() >= tl.we) {
        stats.gaps.close(healthy_received.iter().copied(), &tl);
    }
    shared
        .live
        .sent_bytes
        .fetch_add(sent_bytes - live_sent, Ordering::Relaxed);
    shared
        .live
        .recv_bytes
        .fetch_add(stats.recv_bytes - live_recv, Ordering::Relaxed);
    result.work_ns = work_ns;
    result.tally = stats.tally;
    result.gaps = stats.gaps.stretches;
    result.echoed = stats.echoed;
    result.per_flow = stats.per_flow;
    result.other_frames = stats.other_frames;
    result.foreign = stats.foreign;
    result
}

/// The error message for a peer that could not connect at all.
fn unreachable_message(target: &Target, peer: usize, e: &LinkError) -> String {
    if matches!(e, LinkError::Connect(_)) {
        target
            .unreachable(format_args!("{e} (is it running?)"))
            .to_string()
    } else {
        format!("peer {peer}: {e} (server {})", target.url)
    }
}

/// Drops a failed link. Before every peer is connected that is fatal (the
/// run would not be the one asked for); afterwards it is counted: a stuck
/// receiver as cut off by the server, any other as a disconnect.
#[allow(clippy::too_many_arguments)]
fn lose(
    links: &mut [Option<Link>],
    i: usize,
    e: LinkError,
    result: &mut WorkerResult,
    shared: &Shared,
    (servers, my_peers, stuck): (&Servers, &[usize], &StuckPeers),
    poll: &Poll,
    setting_up: bool,
) {
    if let Some(mut l) = links[i].take() {
        let _ = l.deregister(poll.registry());
        let was_ready = l.is_ready();
        let peer = my_peers[i];
        if setting_up || !was_ready {
            shared.fail(unreachable_message(servers.of(peer, stuck), peer, &e));
        } else if stuck.contains(peer) {
            result.stuck_cut_off += 1;
        } else {
            result.disconnects += 1;
            if result.first_disconnect.is_none() {
                result.first_disconnect = Some(format!("peer {peer}: {e}"));
            }
        }
    }
}

/// Accounts one event from the server (which reached a stuck receiver if
/// `at_stuck`); echoes ping packets. (Server pings are answered by the DERP
/// client itself.)
#[inline]
fn on_server_frame(
    stats: &mut RecvStats,
    tl: Option<Timeline>,
    arrival: u64,
    at_stuck: bool,
    out: &mut Vec<u8>,
    event: Event<&[u8]>,
) {
    let Event::Packet { src, packet } = event else {
        stats.other_frames += 1;
        return;
    };
    let Some(s) = stamp::read(packet) else {
        stats.foreign += 1;
        return;
    };
    stats.last_arrival = arrival;
    match s.kind {
        Kind::Ping => {
            stamp::append_echo(out, src.as_bytes(), packet);
            stats.echoed += 1;
        }
        Kind::Data | Kind::Pong => {
            let class = match s.kind {
                Kind::Pong => Class::Ping,
                _ if at_stuck => Class::Stuck,
                _ => Class::Data,
            };
            let st = stats.tally.of(class);
            st.received_total += 1;
            stats.recv_bytes += packet.len() as u64;
            if class == Class::Ping {
                stats.pongs += 1;
            }
            let Some(tl) = tl else { return };
            if class == Class::Data {
                stats.recent.record(arrival.saturating_sub(s.sent_ns));
            }
            if tl.in_window(arrival) {
                st.arrived_in_window += 1;
                st.arrived_bytes_in_window += packet.len() as u64;
            }
            if tl.in_window(s.sent_ns) {
                st.delivered_of_window += 1;
                st.latency.record(arrival.saturating_sub(s.sent_ns));
                if class == Class::Data {
                    if let Some(c) = stats.per_flow.get_mut(s.flow as usize) {
                        *c += 1;
                    }
                }
            }
            if class == Class::Data {
                stats.gaps.arrival(s.flow as usize, arrival, &tl);
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// A window from 1000 to 2000 ns.
    fn timeline() -> Timeline {
        Timeline {
            start: 0,
            ws: 1000,
            we: 2000,
            end: 3000,
        }
    }

    fn recorded(g: &Gaps) -> (u64, u64, u64) {
        let h = g.stretches();
        (
            h.count(),
            h.quantile(0.0).unwrap_or(0),
            h.quantile(1.0).unwrap_or(0),
        )
    }

    #[test]
    fn gaps_are_the_stretches_without_packets_inside_the_window() {
        let tl = timeline();
        let mut g = Gaps::new(3);
        // Flow 0: a packet in the warm-up counts nothing; inside the window
        // the stretches run from the window's start, then packet to packet,
        // then to the window's end.
        g.arrival(0, 500, &tl);
        assert_eq!(recorded(&g).0, 0);
        g.arrival(0, 1100, &tl); // 100, from the window's start
        g.arrival(0, 1100, &tl); // 0, read together
        g.arrival(0, 1900, &tl); // 800
                                 // Flow 2: its stall runs past the window's end; the packet after
                                 // the window closes it at the end.
        g.arrival(2, 1500, &tl); // 500
        g.arrival(2, 2500, &tl); // 500, cut at the end
        g.arrival(2, 2600, &tl); // nothing: wholly after the window
        assert_eq!(recorded(&g), (5, 0, 800));
        // Closing adds flow 0's last stretch and flow 1's whole window;
        // flow 2 is already closed.
        g.close([0, 1, 2], &tl);
        assert_eq!(recorded(&g), (7, 0, 1000));
        let h = g.stretches();
        let mean = h.percentiles().mean * 1e3;
        // 100 + 0 + 800 + 500 + 500, then 100 and 1000.
        assert!((mean - 3000.0 / 7.0).abs() < 1e-6, "{mean}");
    }

    #[test]
    fn gaps_ignore_flows_they_do_not_track() {
        let tl = timeline();
        let mut g = Gaps::new(1);
        g.arrival(7, 1500, &tl);
        g.close([7], &tl);
        assert_eq!(recorded(&g).0, 0);
    }

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
