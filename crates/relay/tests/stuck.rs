//! A receiver that stops reading must not stall its senders' other traffic
//! (the backpressure budget; see the shard's module doc).
//!
//! One sender streams small numbered packets to a healthy reader while
//! blasting 60 KB packets at three peers that never read. The relay must
//! keep the healthy stream flowing: no gap at the reader longer than a
//! bound far below the write timeout (today's budget is 50 ms; the bound
//! is 1 s so that a debug build on a busy machine cannot fail it by
//! scheduling alone, while the old behaviour, a gap as long as the 3 s
//! write timeout, fails it), every packet in order, the sender connected,
//! the stuck peers cut off at the write timeout, their packets dropped as
//! `queue_tail`, and the queues bounded. Plain and TLS, with whatever back
//! end `FERRY_IO` selects (the suite runs this file with each).

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use ferry_proto::frame::{self, ServerFrame};
use ferry_proto::key::NodePublic;
use support::peer::Peer;
use support::{eventually, metric_in, start, stop};

const T: Duration = Duration::from_secs(10);
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the sender runs: past the write timeout, so the stuck peers are
/// cut off while it sends.
const RUN: Duration = Duration::from_millis(4500);
/// The longest gap the healthy reader may see.
const MAX_GAP: Duration = Duration::from_secs(1);

fn stuck_receivers_do_not_stall_the_sender(tls: bool) {
    let (server, addr) = start(2, |cfg| {
        cfg.write_timeout = Some(WRITE_TIMEOUT);
        cfg.send_queue_bytes = 256 * 1024;
        if tls {
            cfg.tls = Some(support::self_signed_tls(cfg).config);
        }
    });
    let mut sender = Peer::connect(addr, tls, None);
    let mut healthy = Peer::connect(addr, tls, None);
    let stuck: Vec<Peer> = (0..3)
        .map(|_| Peer::connect(addr, tls, Some(4096)))
        .collect();
    let stuck_keys: Vec<NodePublic> = stuck.iter().map(|p| p.public).collect();
    let healthy_key = healthy.public;
    // Read in process: a TLS listener does not serve plain /debug/varz.
    let metrics = server.metrics();
    let metric = |name: &str| metric_in(&metrics.render(), name);

    // The healthy reader: arrival times of numbered packets, in order.
    let reader = std::thread::spawn(move || {
        let mut next = 0u32;
        let mut last = Instant::now();
        let mut worst = Duration::ZERO;
        loop {
            let (ty, p) = match healthy.next_frame() {
                Ok(f) => f,
                Err(e) => panic!("healthy reader lost its connection after {next} packets: {e}"),
            };
            let Ok(ServerFrame::RecvPacket { packet, .. }) = frame::parse_server_frame(ty, &p)
            else {
                continue;
            };
            let n = u32::from_be_bytes(packet[..4].try_into().unwrap());
            if n == u32::MAX {
                break; // the sender's last word
            }
            assert_eq!(n, next, "healthy packets arrive in order, none lost");
            next += 1;
            let now = Instant::now();
            worst = worst.max(now - last);
            last = now;
        }
        (next, worst)
    });

    // The sender: a numbered packet to the healthy reader every
    // millisecond, and a 60 KB packet to each stuck peer every tenth
    // (18 MB/s of bulk: enough to fill the stuck peers' queues at once,
    // little enough that even a debug build beside other tests reads the
    // sender's stream as fast as it comes, so that nothing but the stuck
    // peers could hold the healthy packets up).
    let big = vec![0x55u8; 60_000];
    let mut out = Vec::with_capacity(70_000);
    let mut peak_queued = 0f64;
    let started = Instant::now();
    let mut sent = 0u32;
    while started.elapsed() < RUN {
        sender.send(&healthy_key, &sent.to_be_bytes(), &mut out);
        sent += 1;
        if sent.is_multiple_of(10) {
            for k in &stuck_keys {
                sender.send(k, &big, &mut out);
            }
        }
        if sent.is_multiple_of(250) {
            peak_queued = peak_queued.max(metric("ferry_queued_bytes"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sender.send(&healthy_key, &u32::MAX.to_be_bytes(), &mut out);
    let (received, worst) = reader.join().unwrap();
    assert_eq!(received, sent, "every healthy packet arrived");
    assert!(
        worst < MAX_GAP,
        "the healthy reader waited {worst:?} between packets (tls={tls})"
    );

    // The stuck peers were cut off by the write timeout, their surplus
    // dropped at the tail, and their queues stayed bounded.
    assert!(
        eventually(T, || metric("derp_sclient_write_timeouts") >= 3.0),
        "stuck peers cut off: {}",
        metric("derp_sclient_write_timeouts")
    );
    assert!(metric("ferry_backpressure_budget_expired_total") >= 1.0);
    assert!(metric("derp_packets_dropped{kind=\"other\",reason=\"queue_tail\"}") >= 1.0);
    assert!(
        peak_queued < (8 << 20) as f64,
        "queued bytes peaked at {peak_queued}"
    );
    // The sender is still connected: it gets its pong.
    let mut ping = Vec::new();
    frame::put_ping(&mut ping, b"stillup!");
    sender.io.write_all(&ping).unwrap();
    loop {
        let (ty, p) = sender.next_frame().expect("sender connected");
        if ty == frame::FrameType::Pong as u8 {
            assert_eq!(p, b"stillup!");
            break;
        }
    }
    drop(stuck);
    stop(server);
}

#[test]
fn stuck_receivers_do_not_stall_the_sender_plain() {
    stuck_receivers_do_not_stall_the_sender(false);
}

#[test]
fn stuck_receivers_do_not_stall_the_sender_tls() {
    stuck_receivers_do_not_stall_the_sender(true);
}
