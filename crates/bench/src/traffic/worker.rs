//! One worker thread: its peers' connections, the flows they send, and
//! the receive side's accounting, on one mio event loop (see the module
//! docs of [`super`]).

use super::stats::{Class, Gaps, Tally};
use super::{FlowPlan, Servers, Shared, StuckPeers, Timeline, TrafficPlan};
use crate::clock::{self, now_ns};
use crate::conn::{Link, LinkError, PeerKey, Scratch, Stage};
use crate::histogram::Histogram;
use crate::pacing::Pacer;
use crate::stamp::{self, Kind, Template};
use crate::target::Target;
use ferry_proto::client::Event;
use mio::{Events, Poll, Token};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
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

/// What a worker measured, handed back when it ends.
pub(super) struct WorkerResult {
    pub(super) tally: Tally,
    pub(super) gaps: Histogram,
    pub(super) echoed: u64,
    pub(super) per_flow: Vec<u64>,
    pub(super) other_frames: u64,
    pub(super) foreign: u64,
    pub(super) disconnects: u64,
    pub(super) stuck_cut_off: u64,
    pub(super) first_disconnect: Option<String>,
    pub(super) tls: Option<(String, String)>,
    pub(super) ready_at: u64,
    pub(super) work_ns: u64,
}

/// What a worker is given: its peers and the flows they send.
pub(super) struct WorkerCtx {
    pub(super) servers: Servers,
    pub(super) keys: Arc<Vec<Arc<PeerKey>>>,
    pub(super) shared: Arc<Shared>,
    pub(super) my_peers: Vec<usize>,
    pub(super) flows: Vec<FlowPlan>,
    pub(super) total_flows: usize,
    pub(super) plan: TrafficPlan,
}

/// A flow as its sending worker holds it.
pub(super) struct LocalFlow {
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
pub(super) struct RecvStats {
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

pub(super) fn worker(ctx: WorkerCtx) -> WorkerResult {
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
pub(super) fn unreachable_message(target: &Target, peer: usize, e: &LinkError) -> String {
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
pub(super) fn lose(
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
pub(super) fn on_server_frame(
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
