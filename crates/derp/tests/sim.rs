//! The shard's timers and policies, exactly, on a simulated driver with
//! simulated time (`ferry_engine::sim`): no sockets are read or written,
//! nothing sleeps, and every deadline is checked to the sweep that acts on
//! it. The real-socket tests in `relay.rs` and `stuck.rs` cover the same
//! behaviour end to end, with bounds loose enough for a busy machine.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_derp::admission::{Admission, AdmissionStats};
use ferry_derp::config::AdmissionConfig;
use ferry_derp::shard::{ConnRef, Control, MeshNews};
use ferry_engine::sim::{Reader, SimDriver};
use ferry_engine::Slot;
use ferry_proto::frame::{self, FrameType, ServerFrame};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::rate_config::RateConfig;
use ferry_proto::websocket;
use support::sim::{meshed, ws_client, ws_frames, Sim, MS, SWEEP};

#[test]
fn handshake_deadline_closes_at_the_first_sweep_after_it() {
    let mut s = Sim::new(|cfg| cfg.handshake_timeout = Duration::from_secs(10));
    let silent = s.connect();
    let half = s.connect();
    s.d.receive(half, b"GET /derp HTTP/1.1\r\nHost: x\r\nUpg");
    s.advance(Duration::from_secs(10) - MS);
    assert!(
        s.d.is_open(silent) && s.d.is_open(half),
        "open before the deadline"
    );
    s.advance(SWEEP + MS);
    assert!(
        !s.d.is_open(silent) && !s.d.is_open(half),
        "closed after it"
    );
    assert_eq!(
        s.metric("ferry_handshake_failures_total{reason=\"timeout\"}"),
        2.0
    );
}

#[test]
fn keepalive_comes_after_the_interval_plus_at_most_five_seconds() {
    let mut s = Sim::new(|cfg| cfg.keepalive = Duration::from_secs(60));
    let a = s.client(&NodePrivate::generate());
    s.advance(Duration::from_secs(60) - MS);
    assert!(s.frames(a).is_empty(), "nothing before the interval");
    let mut waited = Duration::from_secs(60) - MS;
    loop {
        s.advance(SWEEP);
        waited += SWEEP;
        let frames = s.frames(a);
        if !frames.is_empty() {
            assert_eq!(frames, [(FrameType::KeepAlive as u8, Vec::new())]);
            break;
        }
        assert!(
            waited <= Duration::from_secs(65) + SWEEP,
            "no keepAlive after {waited:?}"
        );
    }
}

#[test]
fn write_timeout_cuts_off_a_reader_that_takes_nothing() {
    let mut s = Sim::new(|cfg| cfg.write_timeout = Some(Duration::from_secs(2)));
    let a = s.client(&NodePrivate::generate());
    let bk = NodePrivate::generate();
    let b = s.client(&bk);
    s.d.set_reader(b, Reader::Stuck);
    s.send(a, &bk.public(), b"stuck?");
    s.settle();
    assert!(s.d.send_in_flight(b));
    s.advance(Duration::from_secs(2) - 2 * MS);
    assert!(s.d.is_open(b), "open before the write timeout");
    s.advance(SWEEP + MS);
    assert!(!s.d.is_open(b), "cut off after it");
    assert!(s.d.is_open(a), "the sender stays");
    assert_eq!(s.metric("derp_sclient_write_timeouts"), 1.0);
}

#[test]
fn duplicate_key_packets_go_to_the_most_recently_active_connection() {
    let mut s = Sim::new(|_| {});
    let a = s.client(&NodePrivate::generate());
    let dk = NodePrivate::generate();
    let first = s.client(&dk);
    let second = s.client(&dk);
    s.send(a, &dk.public(), b"one");
    s.settle();
    assert!(s.packets(first).is_empty());
    assert_eq!(s.packets(second).len(), 1, "the newest connection gets it");
    // The first connection says something: now it is the active one.
    let mut ping = Vec::new();
    frame::put_ping(&mut ping, b"i-am-up!");
    s.d.receive(first, &ping);
    s.settle();
    s.send(a, &dk.public(), b"two");
    s.settle();
    assert_eq!(s.packets(first).len(), 1);
    assert!(s.packets(second).is_empty());
    assert_eq!(s.metric("derp_current_dup_client_keys"), 1.0);
}

/// peerGone(NotHere) for disco packets to keys nobody holds, per
/// connection at most 3 at once and then 1 a second; never for other
/// packets.
#[test]
fn not_here_is_only_for_disco_and_limited_to_three_then_one_a_second() {
    let mut s = Sim::new(|_| {});
    let a = s.client(&NodePrivate::generate());
    let disco = |tag: u8| {
        let mut p = frame::DISCO_MAGIC.to_vec();
        p.resize(80, tag);
        p
    };
    // Disco packets to `n` keys nobody holds; the NotHere answers for them.
    let unknown = |s: &mut Sim, n: u8| {
        let mut asked = Vec::new();
        for tag in 0..n {
            let dst = NodePrivate::generate().public();
            s.send(a, &dst, &disco(tag));
            asked.push(dst);
        }
        s.settle();
        let gone: Vec<NodePublic> = s
            .frames(a)
            .into_iter()
            .map(|(ty, p)| match frame::parse_server_frame(ty, &p) {
                Ok(ServerFrame::PeerGone {
                    key,
                    reason: frame::PeerGoneReason::NotHere,
                }) => key,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert!(gone.iter().all(|k| asked.contains(k)), "for keys asked");
        gone.len()
    };
    s.send(a, &NodePrivate::generate().public(), b"wireguard bytes");
    s.settle();
    assert!(s.frames(a).is_empty(), "nothing for a non-disco packet");
    assert_eq!(unknown(&mut s, 10), 3, "a burst of 3");
    s.advance(Duration::from_secs(1) - MS);
    assert_eq!(unknown(&mut s, 1), 0, "no token within the second");
    s.advance(2 * MS);
    assert_eq!(unknown(&mut s, 5), 1, "one a second after it");
    s.advance(Duration::from_secs(10));
    assert_eq!(unknown(&mut s, 10), 3, "the bucket holds 3 at most");
    assert_eq!(s.metric("derp_peer_gone_not_here_frames"), 7.0);
    assert_eq!(
        s.metric("derp_packets_dropped{kind=\"disco\",reason=\"unknown_dest\"}"),
        26.0
    );
}

/// Fills `b`'s queue from `a` until `a` is paused; returns how many
/// packets of `size` bytes were sent.
fn fill_until_paused(s: &mut Sim, a: Slot, b: &NodePublic, size: usize) -> usize {
    let mut sent = 0;
    while s.d.receiving(a) {
        assert!(sent < 1000, "never paused");
        s.send(a, b, &vec![sent as u8; size]);
        sent += 1;
        s.settle();
    }
    sent
}

/// A relay with 8 KiB queues and `budget`, a sender `a`, and a client `b`
/// (key `bk`) that reads nothing.
fn sender_and_stuck_reader(budget: Duration) -> (Sim, Slot, NodePrivate, Slot) {
    let mut s = Sim::new(|cfg| {
        cfg.send_queue_bytes = 8 * 1024;
        cfg.backpressure_budget = budget;
    });
    let a = s.client(&NodePrivate::generate());
    let bk = NodePrivate::generate();
    let b = s.client(&bk);
    s.d.set_reader(b, Reader::Stuck);
    (s, a, bk, b)
}

#[test]
fn backpressure_pauses_the_sender_and_resumes_it_when_the_queue_moves() {
    let (mut s, a, bk, b) = sender_and_stuck_reader(Duration::from_secs(10));
    let sent = fill_until_paused(&mut s, a, &bk.public(), 1000);
    assert!(!s.d.receiving(a), "paused");
    assert_eq!(s.metric("ferry_senders_paused"), 1.0);
    // Still paused a while later (budget far away, nothing moves).
    s.advance(Duration::from_millis(500));
    assert!(!s.d.receiving(a));
    // The reader takes the send in flight: the queue moves into the next
    // send and the sender goes on.
    s.d.complete_send(b, Ok(()));
    s.settle();
    assert!(s.d.receiving(a), "resumed");
    assert_eq!(s.metric("ferry_senders_paused"), 0.0);
    s.d.set_reader(b, Reader::Reads);
    s.settle();
    assert_eq!(s.packets(b).len(), sent, "nothing lost");
    assert_eq!(
        s.metric("derp_packets_dropped{kind=\"other\",reason=\"queue_tail\"}"),
        0.0
    );
}

#[test]
fn budget_releases_senders_of_a_reader_that_takes_nothing() {
    let budget = Duration::from_millis(50);
    let (mut s, a, bk, b) = sender_and_stuck_reader(budget);
    let ck = NodePrivate::generate();
    let c = s.client(&ck);
    fill_until_paused(&mut s, a, &bk.public(), 1000);
    // The hold starts now; a sender blocked behind b for the whole budget,
    // not a millisecond longer.
    s.advance(budget - MS);
    assert!(!s.d.receiving(a), "held within the budget");
    s.advance(MS);
    assert!(s.d.receiving(a), "released at the budget");
    assert_eq!(s.metric("ferry_backpressure_budget_expired_total"), 1.0);
    // b is over its cap and does not drain: its packets are dropped, the
    // sender's traffic to c flows.
    let dropped = "derp_packets_dropped{kind=\"other\",reason=\"queue_tail\"}";
    let before = s.metric(dropped);
    s.send(a, &bk.public(), &[1; 1000]);
    s.send(a, &ck.public(), b"to c");
    s.settle();
    assert_eq!(s.metric(dropped), before + 1.0);
    assert!(s.d.receiving(a), "no new pause");
    assert_eq!(s.packets(c).len(), 1);
    // Once a write to b completes, b may hold senders again.
    s.d.complete_send(b, Ok(()));
    s.settle();
    fill_until_paused(&mut s, a, &bk.public(), 1000);
    assert!(!s.d.receiving(a));
}

/// Two receivers that read nothing, one after the other: the sender is
/// held one budget in all, not one per receiver. While the first holds it,
/// the shard reads the second's socket too (its send has been pending for
/// half a budget), so when the sender, released, fills the second's queue,
/// that one is recognised at once.
#[test]
fn budget_is_not_spent_twice_on_two_stuck_receivers() {
    let budget = Duration::from_millis(50);
    let (mut s, a, bk, _b) = sender_and_stuck_reader(budget);
    let ck = NodePrivate::generate();
    let c = s.client(&ck);
    s.d.set_reader(c, Reader::Stuck);
    // c gets a packet first, which stays in flight: c reads nothing.
    s.send(a, &ck.public(), &[1; 1000]);
    s.settle();
    assert!(s.d.send_in_flight(c));
    fill_until_paused(&mut s, a, &bk.public(), 1000);
    s.advance(budget);
    assert!(s.d.receiving(a), "released from b at the budget");
    assert_eq!(s.metric("ferry_backpressure_budget_expired_total"), 1.0);
    // The sender fills c's queue past its cap in one go: c is found not
    // draining in the same turn, and the sender is never held by it.
    for _ in 0..12 {
        s.send(a, &ck.public(), &[2; 1000]);
    }
    s.settle();
    assert!(s.d.receiving(a), "not held by c");
    assert_eq!(s.metric("ferry_backpressure_budget_expired_total"), 2.0);
}

#[test]
fn budget_keeps_holding_for_a_reader_that_takes_something() {
    let budget = Duration::from_millis(50);
    let (mut s, a, bk, b) = sender_and_stuck_reader(budget);
    // A first packet goes out as b's send in flight; it is large enough
    // that b can keep reading from it for a while.
    s.send(a, &bk.public(), &[0; 60_000]);
    s.settle();
    assert!(s.d.send_in_flight(b));
    fill_until_paused(&mut s, a, &bk.public(), 1000);
    // b takes a little every 20 ms: slow, but reading. The sender stays
    // paused (no loss), far past the budget.
    for _ in 0..10 {
        s.advance(Duration::from_millis(20));
        assert_eq!(s.d.take_part(b, 1000), 1000);
        assert!(!s.d.receiving(a), "still held: the reader reads");
    }
    assert_eq!(s.metric("ferry_backpressure_budget_expired_total"), 0.0);
    // It stops reading: released within one budget.
    s.advance(budget + MS);
    assert!(s.d.receiving(a));
    assert_eq!(s.metric("ferry_backpressure_budget_expired_total"), 1.0);
}

#[test]
fn graceful_drain_sends_restarting_and_finishes() {
    let mut s = Sim::new(|cfg| {
        cfg.restart_reconnect_in = Duration::from_secs(1);
        cfg.restart_try_for = Duration::from_secs(30);
    });
    let a = s.client(&NodePrivate::generate());
    let b = s.client(&NodePrivate::generate());
    s.shared.shutdown.store(true, Ordering::Relaxed);
    s.settle();
    for slot in [a, b] {
        let frames = s.frames(slot);
        let restarting: Vec<_> = frames
            .iter()
            .filter(|(ty, _)| *ty == FrameType::Restarting as u8)
            .collect();
        assert_eq!(restarting.len(), 1, "one restarting frame");
        let p = &restarting[0].1;
        assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), 1000);
        assert_eq!(u32::from_be_bytes(p[4..8].try_into().unwrap()), 30_000);
    }
    s.advance(Duration::from_millis(20));
    assert!(!s.d.is_open(a) && !s.d.is_open(b), "closed once written");
    use ferry_engine::Handler;
    assert!(Handler::<SimDriver>::finished(&s.shard));
}

/// A draining shard stops accepting at once: a connection that arrives
/// during the drain stays in the listener's backlog (for the next process
/// on the same socket) instead of being accepted and closed.
#[test]
fn a_draining_shard_accepts_nothing_more() {
    let (mut s, a, bk, b) = sender_and_stuck_reader(Duration::from_secs(10));
    s.send(a, &bk.public(), &[1; 500]);
    s.settle();
    use ferry_engine::{Driver, Handler};
    assert!(s.d.send_in_flight(b), "b holds the drain open");
    assert!(s.d.accepting(0));
    let accepted = s.metric("ferry_tcp_accepts_total");
    s.shared.shutdown.store(true, Ordering::Relaxed);
    s.settle();
    assert!(!s.d.accepting(0), "no accept armed once draining");
    s.d.connect(0, SocketAddr::from(([192, 0, 2, 9], 9)))
        .unwrap();
    s.advance(Duration::from_millis(50));
    assert!(!Handler::<SimDriver>::finished(&s.shard), "still draining");
    assert_eq!(s.d.backlog(0), 1, "the new connection waits in the backlog");
    assert_eq!(s.metric("ferry_tcp_accepts_total"), accepted);
}

#[test]
fn graceful_drain_puts_restarting_after_what_was_queued() {
    let (mut s, a, bk, b) = sender_and_stuck_reader(Duration::from_secs(10));
    // One send in flight that B does not take, and more queued behind it
    // (under the 8 KiB cap: the sender is never paused).
    for i in 0..10u8 {
        s.send(a, &bk.public(), &[i; 500]);
        s.settle();
    }
    assert!(s.d.send_in_flight(b));
    assert!(s.d.receiving(a));
    s.shared.shutdown.store(true, Ordering::Relaxed);
    s.settle();
    assert!(!s.d.receiving(a), "input stops at the drain");
    s.d.complete_send(b, Ok(()));
    s.settle();
    s.d.set_reader(b, Reader::Reads);
    s.settle();
    let frames = s.frames(b);
    let types: Vec<u8> = frames.iter().map(|f| f.0).collect();
    let packets = types
        .iter()
        .filter(|&&t| t == FrameType::RecvPacket as u8)
        .count();
    assert_eq!(packets, 10, "every queued packet");
    assert_eq!(
        types.last(),
        Some(&(FrameType::Restarting as u8)),
        "restarting last: {types:?}"
    );
}

/// A controller for admission tests: allows the keys in its list; answers
/// only while its gate is not held.
struct Controller {
    url: String,
    gate: Arc<std::sync::Mutex<()>>,
}

fn controller(allow: Vec<NodePublic>) -> Controller {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/verify", listener.local_addr().unwrap());
    let gate = Arc::new(std::sync::Mutex::new(()));
    let g = gate.clone();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming() {
            let Ok(mut c) = stream else { return };
            let (allow, g) = (allow.clone(), g.clone());
            std::thread::spawn(move || {
                // Read the head and the JSON body (it ends with `}`).
                let mut text = String::new();
                let mut buf = [0u8; 4096];
                while !text.ends_with('}') {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
                    }
                }
                let allowed = allow.iter().any(|k| text.contains(&k.to_string()));
                drop(g.lock().unwrap());
                let body = format!("{{\"Allow\":{allowed}}}");
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    Controller { url, gate }
}

/// A shard whose admission pool asks `c`, and the pool's counters.
fn admitting(c: &Controller) -> (Sim, Arc<AdmissionStats>) {
    let s = Sim::new(|cfg| cfg.handshake_timeout = Duration::from_secs(10));
    let weak = Arc::downgrade(&s.shared);
    let cfg = AdmissionConfig {
        url: Some(c.url.clone()),
        timeout: Duration::from_secs(30),
        ..AdmissionConfig::default()
    };
    let stats = Arc::new(AdmissionStats::default());
    let pool = Admission::start(cfg, stats.clone(), move |r: ConnRef, v| {
        if let Some(shared) = weak.upgrade() {
            shared.post(r.shard, Control::Admitted(r, v));
        }
    })
    .unwrap();
    assert!(s.shared.admission.set(pool).is_ok());
    (s, stats)
}

impl Sim {
    /// Frame types `slot` reads until serverInfo arrives or it is closed,
    /// waiting in real time (the verdict comes from a thread) for at most
    /// 10 s; simulated time stands still.
    fn await_verdict(&mut self, slot: Slot) -> Vec<u8> {
        let mut types = Vec::new();
        let done = self.settle_until(|s| {
            types.extend(s.frames(slot).iter().map(|f| f.0));
            types.contains(&(FrameType::ServerInfo as u8)) || !s.d.is_open(slot)
        });
        assert!(done, "no verdict within 10 s: {types:?}");
        types
    }

    /// Settles the shard until `done` holds, waiting in real time (for
    /// another thread) for at most 10 s; simulated time stands still.
    fn settle_until(&mut self, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.settle();
            if done(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(MS);
        }
    }
}

#[test]
fn admission_holds_a_client_until_admitted_then_reads_what_followed() {
    let (ak, rk) = (NodePrivate::generate(), NodePrivate::generate());
    let c = controller(vec![ak.public(), rk.public()]);
    let (mut s, _) = admitting(&c);
    let r = s.hello(&rk, &[]);
    assert_eq!(
        s.await_verdict(r),
        [FrameType::ServerKey as u8, FrameType::ServerInfo as u8]
    );

    let held = c.gate.lock().unwrap();
    let mut early = Vec::new();
    frame::put_send_packet(&mut early, &rk.public(), b"early");
    let a = s.hello(&ak, &early);
    assert_eq!(
        s.frames(a).iter().map(|f| f.0).collect::<Vec<_>>(),
        [FrameType::ServerKey as u8],
        "no serverInfo before the verdict"
    );
    s.advance(Duration::from_secs(2));
    assert!(
        s.packets(r).is_empty(),
        "nothing relayed before the verdict"
    );
    drop(held);
    assert_eq!(s.await_verdict(a), [FrameType::ServerInfo as u8]);
    s.settle();
    assert_eq!(s.packets(r), [(ak.public(), b"early".to_vec())]);
}

const REFUSED: &str = "ferry_handshake_failures_total{reason=\"admission\"}";

/// The refusal comes after the 101 and serverKey were written (the
/// controller's answer is held until then): the connection closes without
/// serverInfo.
#[test]
fn admission_refusal_after_the_server_key_closes_without_server_info() {
    let c = controller(vec![]);
    let (mut s, _) = admitting(&c);
    let held = c.gate.lock().unwrap();
    let x = s.hello(&NodePrivate::generate(), &[]);
    assert_eq!(
        s.frames(x).iter().map(|f| f.0).collect::<Vec<_>>(),
        [FrameType::ServerKey as u8],
        "the 101 and serverKey before the verdict"
    );
    assert!(s.d.is_open(x), "waiting for the verdict");
    drop(held);
    assert_eq!(
        s.await_verdict(x),
        Vec::<u8>::new(),
        "nothing after serverKey"
    );
    assert!(!s.d.is_open(x));
    assert_eq!(s.metric(REFUSED), 1.0);
}

/// The refusal comes while the 101 and serverKey are still unwritten (the
/// client takes nothing until the verdict is in): the client still reads
/// them, then the close, as when the refusal comes later.
#[test]
fn admission_refusal_before_the_server_key_is_written_still_sends_it() {
    let c = controller(vec![]);
    let (mut s, _) = admitting(&c);
    let x = s.connect();
    s.d.set_reader(x, Reader::Stuck);
    s.greet(x, &NodePrivate::generate(), None, &[]);
    assert!(s.d.send_in_flight(x), "the 101 and serverKey are in flight");
    assert!(
        s.settle_until(|s| s.metric(REFUSED) == 1.0),
        "no verdict within 10 s"
    );
    assert!(s.d.is_open(x), "open until what was queued is written");
    s.d.set_reader(x, Reader::Reads);
    s.settle();
    assert_eq!(
        s.frames(x).iter().map(|f| f.0).collect::<Vec<_>>(),
        [FrameType::ServerKey as u8]
    );
    assert!(!s.d.is_open(x), "closed once they are written");
}

#[test]
fn admission_wait_ends_at_the_handshake_deadline() {
    let ak = NodePrivate::generate();
    let c = controller(vec![ak.public()]);
    let (mut s, stats) = admitting(&c);
    let held = c.gate.lock().unwrap();
    let a = s.hello(&ak, &[]);
    s.advance(Duration::from_secs(10) - MS);
    assert!(s.d.is_open(a), "waiting before the deadline");
    s.advance(SWEEP + MS);
    assert!(!s.d.is_open(a), "closed after it");
    assert_eq!(
        s.metric("ferry_handshake_failures_total{reason=\"timeout\"}"),
        1.0
    );
    // The verdict that comes later finds no one.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.asked.load(std::sync::atomic::Ordering::Relaxed) < 1 && Instant::now() < deadline {
        std::thread::sleep(MS);
    }
    s.settle();
    assert_eq!(s.metric("derp_current_connections"), 0.0);
}

/// 20 packets of 10,000 bytes (10,037-byte frames) at 100,000 bytes/s with
/// a burst of 65,568: 7 frames fit the burst, the 7th leaves a debt of
/// 4,691 bytes (47 ms); from then on each frame costs 100.37 ms. Nothing is
/// dropped, the sender is only read more slowly.
#[test]
fn rate_limit_holds_input_for_exactly_what_the_frames_cost() {
    let mut s = Sim::new(|cfg| {
        cfg.rate = RateConfig {
            bytes_per_sec: 100_000,
            burst_bytes: 65_568,
        }
    });
    let a = s.client(&NodePrivate::generate());
    let bk = NodePrivate::generate();
    let b = s.client(&bk);
    let mut burst = Vec::new();
    for _ in 0..20 {
        frame::put_send_packet(&mut burst, &bk.public(), &[7u8; 10_000]);
    }
    s.d.receive(a, &burst);
    s.settle();
    assert_eq!(s.packets(b).len(), 7, "the burst");
    s.advance(Duration::from_millis(46));
    assert!(s.packets(b).is_empty(), "held while in debt");
    s.advance(Duration::from_millis(2));
    assert_eq!(
        s.packets(b).len(),
        1,
        "the next frame once the debt is paid"
    );
    // Every 100.37 ms one more: 12 more need 1204.4 ms.
    s.advance(Duration::from_millis(1203));
    assert_eq!(s.packets(b).len(), 11);
    s.advance(Duration::from_millis(2));
    assert_eq!(s.packets(b).len(), 1);
    assert_eq!(s.family_total("derp_packets_dropped"), 0.0);
    assert!(s.metric("derp_rate_limit_per_client_waited") >= 13.0);
}

#[test]
fn new_rate_limits_apply_at_once_and_let_held_clients_go() {
    let mut s = Sim::new(|cfg| {
        cfg.rate = RateConfig {
            bytes_per_sec: 1_000,
            burst_bytes: 65_568,
        }
    });
    let a = s.client(&NodePrivate::generate());
    let bk = NodePrivate::generate();
    let b = s.client(&bk);
    let mut burst = Vec::new();
    for _ in 0..10 {
        frame::put_send_packet(&mut burst, &bk.public(), &[7u8; 10_000]);
    }
    s.d.receive(a, &burst);
    s.settle();
    assert_eq!(s.packets(b).len(), 7);
    s.shared.post(0, Control::RateConfig(RateConfig::default()));
    s.settle();
    assert_eq!(s.packets(b).len(), 3, "limits off: the rest at once");
}

#[test]
fn mesh_peers_are_not_rate_limited() {
    let mesh = ferry_proto::key::MeshKey::parse(&"ab".repeat(32)).unwrap();
    let mut s = Sim::new(|cfg| {
        cfg.rate = RateConfig {
            bytes_per_sec: 1_000,
            burst_bytes: 65_568,
        };
        cfg.mesh_key = Some(mesh.clone());
    });
    let m = s.mesh_client(&NodePrivate::generate(), &mesh);
    let bk = NodePrivate::generate();
    let b = s.client(&bk);
    let mut burst = Vec::new();
    for _ in 0..20 {
        frame::put_send_packet(&mut burst, &bk.public(), &[7u8; 10_000]);
    }
    s.d.receive(m, &burst);
    s.settle();
    assert_eq!(s.packets(b).len(), 20);
}

#[test]
fn accept_limit_closes_excess_connections_at_once() {
    let mut s = Sim::new(|cfg| cfg.accept_limit = Some((1.0, 2.0)));
    let first = s.connect();
    let second = s.connect();
    assert!(s.d.is_open(first) && s.d.is_open(second));
    let before = s.d.slots();
    s.d.connect(0, SocketAddr::from(([192, 0, 2, 9], 999)))
        .unwrap();
    s.settle();
    assert_eq!(s.d.slots(), before, "the third is not kept");
    assert_eq!(s.metric("tls_listener_rejected_connections"), 1.0);
    s.advance(Duration::from_secs(1));
    let fourth = s.connect();
    assert!(s.d.is_open(fourth), "one more a second later");
}

#[test]
fn websocket_clients_relay_with_raw_ones_and_answer_control_frames() {
    let mut s = Sim::new(|_| {});
    let wk = NodePrivate::generate();
    let w = ws_client(&mut s, &wk);
    let rk = NodePrivate::generate();
    let r = s.client(&rk);
    // A DERP frame split over three WebSocket frames, a ping in between.
    let mut send = Vec::new();
    frame::put_send_packet(&mut send, &rk.public(), &[5u8; 40_000]);
    let m = [9, 8, 7, 6];
    let mut stream = websocket::client_frame(false, 0x2, &send[..10], m);
    stream.extend(websocket::client_frame(true, 0x9, b"are you there", m));
    stream.extend(websocket::client_frame(false, 0x0, &send[10..30_000], m));
    stream.extend(websocket::client_frame(true, 0x0, &send[30_000..], m));
    s.d.receive(w, &stream);
    s.settle();
    assert_eq!(s.packets(r), [(wk.public(), vec![5u8; 40_000])]);
    assert_eq!(
        ws_frames(&s.d.take_output(w)),
        [(0xA, b"are you there".to_vec())],
        "a pong with the ping's bytes"
    );
    // The other way: the packet arrives in binary messages of at most 16 KiB.
    s.send(r, &wk.public(), &[6u8; 40_000]);
    s.settle();
    let frames = ws_frames(&s.d.take_output(w));
    assert!(frames
        .iter()
        .all(|(op, p)| *op == 0x2 && p.len() <= 16 * 1024));
    let stream: Vec<u8> = frames.into_iter().flat_map(|(_, p)| p).collect();
    assert_eq!(stream.len(), 5 + 32 + 40_000);
    assert_eq!(s.metric("derp_websocket_accepts"), 1.0);
}

#[test]
fn websocket_text_messages_and_closes_end_the_connection() {
    let mut s = Sim::new(|_| {});
    let t = ws_client(&mut s, &NodePrivate::generate());
    s.d.receive(
        t,
        &websocket::client_frame(true, 0x1, b"hello", [1, 1, 1, 1]),
    );
    s.settle();
    assert_eq!(
        ws_frames(&s.d.take_output(t)),
        [(0x8, 1003u16.to_be_bytes().to_vec())]
    );
    assert!(!s.d.is_open(t));
    let c = ws_client(&mut s, &NodePrivate::generate());
    s.d.receive(
        c,
        &websocket::client_frame(true, 0x8, &1000u16.to_be_bytes(), [2, 2, 2, 2]),
    );
    s.settle();
    assert_eq!(
        ws_frames(&s.d.take_output(c)),
        [(0x8, 1000u16.to_be_bytes().to_vec())]
    );
    assert!(!s.d.is_open(c));
}

/// The forwardPacket frames in a link's ring: (src, dst, packet).
fn forwarded(rx: &mut ferry_engine::mailbox::ByteRx) -> Vec<(NodePublic, NodePublic, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(rec) = rx.pop_with(|a, b| [a, b].concat()) {
        assert_eq!(rec[0], FrameType::ForwardPacket as u8);
        let len = u32::from_be_bytes(rec[1..5].try_into().unwrap()) as usize;
        assert_eq!(len + 5, rec.len(), "one whole frame per record");
        let key = |b: &[u8]| NodePublic::from_bytes(b.try_into().unwrap());
        out.push((key(&rec[5..37]), key(&rec[37..69]), rec[69..].to_vec()));
    }
    out
}

#[test]
fn mesh_forwarding_uses_the_earliest_link_and_local_clients_first() {
    let (mut s, mut rx, wakes) = meshed(2, 64 * 1024, |_| {});
    let ak = NodePrivate::generate();
    let a = s.client(&ak);
    let k = NodePrivate::generate();
    // Unknown: dropped as derper does.
    s.send(a, &k.public(), b"nowhere");
    s.settle();
    assert!(forwarded(&mut rx[0]).is_empty());
    assert_eq!(
        s.metric("derp_packets_dropped{kind=\"other\",reason=\"unknown_dest\"}"),
        1.0
    );

    s.news(1, MeshNews::Present(k.public()));
    s.news(0, MeshNews::Present(k.public()));
    assert_eq!(s.metric("derp_clients_remote"), 1.0);
    let before = wakes.load(Ordering::Relaxed);
    s.send(a, &k.public(), b"one");
    s.settle();
    assert_eq!(
        forwarded(&mut rx[1]),
        vec![(ak.public(), k.public(), b"one".to_vec())]
    );
    assert!(forwarded(&mut rx[0]).is_empty());
    assert!(
        wakes.load(Ordering::Relaxed) > before,
        "the mesh thread is woken"
    );
    assert_eq!(s.metric("derp_packets_forwarded_out"), 1.0);

    // The earliest link withdraws the key: the next one carries it.
    assert_eq!(s.metric("derp_multiforwarder_created"), 1.0);
    s.news(1, MeshNews::Gone(k.public()));
    assert_eq!(s.metric("derp_multiforwarder_deleted"), 1.0);
    // A withdrawal by a link that no longer has the key changes nothing.
    s.news(1, MeshNews::Gone(k.public()));
    assert_eq!(s.metric("derp_packet_forwarder_delete_other_value"), 1.0);
    s.send(a, &k.public(), b"two");
    s.settle();
    assert_eq!(
        forwarded(&mut rx[0]),
        vec![(ak.public(), k.public(), b"two".to_vec())]
    );

    // The key connects here too: local delivery wins.
    let kc = s.client(&k);
    assert_eq!(s.metric("derp_clients_remote"), 0.0);
    s.send(a, &k.public(), b"three");
    s.settle();
    assert_eq!(s.packets(kc), vec![(ak.public(), b"three".to_vec())]);
    assert!(forwarded(&mut rx[0]).is_empty());
    // It leaves; the region still has it, so no peerGone, and packets go
    // to the link again.
    s.send(kc, &ak.public(), b"hi");
    s.settle();
    s.packets(a);
    s.d.peer_closes(kc);
    s.settle();
    assert!(
        !s.frames(a)
            .iter()
            .any(|(ty, _)| *ty == FrameType::PeerGone as u8),
        "no peerGone while the region has the key"
    );
    assert_eq!(s.metric("derp_clients_remote"), 1.0);
    s.send(a, &k.public(), b"four");
    s.settle();
    assert_eq!(
        forwarded(&mut rx[0]),
        vec![(ak.public(), k.public(), b"four".to_vec())]
    );
}

#[test]
fn a_slow_mesh_link_pauses_its_senders_and_loses_nothing() {
    let (mut s, mut rx, _) = meshed(1, 4 * 1024, |cfg| cfg.send_queue_bytes = 8 * 1024);
    let ak = NodePrivate::generate();
    let a = s.client(&ak);
    let k = NodePrivate::generate().public();
    s.news(0, MeshNews::Present(k));
    let sent = fill_until_paused(&mut s, a, &k, 1000);
    assert!(sent > 10, "the ring and the cap took {sent} packets first");
    assert_eq!(s.metric("ferry_senders_paused"), 1.0);
    // Still paused while the link takes nothing.
    s.advance(Duration::from_millis(50));
    assert!(!s.d.receiving(a));
    // The link drains: the shard moves its overflow and lets a go.
    let mut got = Vec::new();
    for _ in 0..200 {
        got.extend(forwarded(&mut rx[0]));
        if got.len() == sent {
            break;
        }
        s.advance(Duration::from_millis(2));
    }
    assert!(s.d.receiving(a), "resumed once the link drained");
    assert_eq!(s.metric("ferry_senders_paused"), 0.0);
    assert_eq!(got.len(), sent, "every packet reached the link");
    for (i, (src, dst, p)) in got.iter().enumerate() {
        assert_eq!((*src, *dst), (ak.public(), k));
        assert_eq!(p, &vec![i as u8; 1000], "in order");
    }
    assert_eq!(
        s.metric("derp_packets_dropped{kind=\"other\",reason=\"queue_tail\"}"),
        0.0
    );
}

#[test]
fn every_sender_a_slow_mesh_link_paused_goes_on_when_it_drains() {
    // Several senders, each with more queued in its socket: a sender that
    // is resumed is read at once and may wait again while the others are
    // being resumed; none may be forgotten on the way.
    let (mut s, mut rx, _) = meshed(1, 4 * 1024, |cfg| cfg.send_queue_bytes = 8 * 1024);
    let k = NodePrivate::generate().public();
    s.news(0, MeshNews::Present(k));
    let senders: Vec<Slot> = (0..3).map(|_| s.client(&NodePrivate::generate())).collect();
    for (n, &a) in senders.iter().enumerate() {
        for i in 0..40u8 {
            s.send(a, &k, &[n as u8 * 64 + i; 700]);
        }
    }
    s.settle();
    let mut got = 0;
    for _ in 0..500 {
        got += forwarded(&mut rx[0]).len();
        if got == 120 {
            break;
        }
        s.advance(Duration::from_millis(1));
    }
    assert_eq!(got, 120, "every packet reached the link");
    for &a in &senders {
        assert!(s.d.receiving(a), "a sender was left paused");
    }
    assert_eq!(s.metric("ferry_senders_paused"), 0.0);
}

#[test]
fn a_mesh_link_going_down_forgets_its_keys_and_their_receivers_hear_of_it() {
    let mesh_key = ferry_proto::key::MeshKey([7; 32]);
    let (mut s, mut rx, _) = meshed(1, 4 * 1024, |cfg| {
        cfg.mesh_key = Some(mesh_key.clone());
        cfg.send_queue_bytes = 8 * 1024;
    });
    let ak = NodePrivate::generate();
    let a = s.client(&ak);
    let peer = s.mesh_client(&NodePrivate::generate(), &mesh_key);
    let k = NodePrivate::generate().public();
    s.news(0, MeshNews::Present(k));
    // k (on the other node) sends to a through that node's link to us.
    let mut fwd = Vec::new();
    frame::put_forward_packet(&mut fwd, &k, &ak.public(), b"from k");
    s.d.receive(peer, &fwd);
    s.settle();
    assert_eq!(s.packets(a), vec![(k, b"from k".to_vec())]);
    // A packet that came in from the mesh is never forwarded again.
    let x = NodePrivate::generate().public();
    s.news(0, MeshNews::Present(x));
    let mut fwd = Vec::new();
    frame::put_forward_packet(&mut fwd, &k, &x, b"second hop");
    s.d.receive(peer, &fwd);
    s.settle();
    assert!(forwarded(&mut rx[0]).is_empty());
    assert_eq!(
        s.metric("derp_packets_dropped{kind=\"other\",reason=\"unknown_dest_on_fwd\"}"),
        1.0
    );
    // a fills the link until paused; then the link goes down.
    let sent = fill_until_paused(&mut s, a, &k, 1000);
    let in_ring = forwarded(&mut rx[0]).len();
    s.news(0, MeshNews::Down);
    assert!(s.d.receiving(a), "senders waiting on a dead link resume");
    assert_eq!(
        s.metric("derp_packets_dropped{kind=\"other\",reason=\"gone_disconnected\"}"),
        (sent - in_ring) as f64,
        "what waited for the link is dropped and counted"
    );
    let gone: Vec<NodePublic> = s
        .frames(a)
        .into_iter()
        .filter_map(|(ty, p)| match frame::parse_server_frame(ty, &p) {
            Ok(ServerFrame::PeerGone { key, .. }) => Some(key),
            _ => None,
        })
        .collect();
    assert_eq!(
        gone,
        vec![k],
        "a received from k, so hears it left the region"
    );
    assert_eq!(s.metric("derp_clients_remote"), 0.0);
    // Nothing is forwarded any more.
    s.send(a, &k, b"after");
    s.settle();
    assert!(forwarded(&mut rx[0]).is_empty());
}
