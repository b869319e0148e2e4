//! A receiver that stops reading must not stall its senders' other traffic
//! (the backpressure budget; see the shard's module doc).
//!
//! One sender streams small numbered packets to a healthy reader while
//! blasting 60 KB packets at three peers that never read. The relay must
//! keep the healthy stream flowing: no gap at the reader longer than a
//! bound far below the write timeout (today's budget is 50 ms; the bound
//! is 1 s so that a debug build on a busy machine cannot fail it by
//! scheduling alone, plus the longest the sender itself was off between
//! two sends, while the old behaviour, a gap as long as the 3 s write
//! timeout, fails it), every packet in order, the sender connected,
//! the stuck peers cut off at the write timeout, their packets dropped as
//! `queue_tail`, and the queues bounded. Plain and TLS, on each back end.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferry_proto::client::Event;
use ferry_proto::key::{NodePrivate, NodePublic};
use support::{
    config, dial, eventually, info, metric_in, start, stop, tls_over, Client, Transport,
};

const T: Duration = Duration::from_secs(10);
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the sender runs: past the write timeout, so the stuck peers are
/// cut off while it sends.
const RUN: Duration = Duration::from_millis(4500);
/// The longest gap the healthy reader may see.
const MAX_GAP: Duration = Duration::from_secs(1);

fn stuck_receivers_do_not_stall_the_sender<S: Transport + Send + 'static>(
    tls: bool,
    connect: impl Fn(SocketAddr, Option<usize>) -> Client<S>,
) {
    let (server, addr) = start(2, |cfg| {
        cfg.write_timeout = Some(WRITE_TIMEOUT);
        cfg.send_queue_bytes = 256 * 1024;
        if tls {
            cfg.tls = Some(support::self_signed_tls(cfg).config);
        }
    });
    let mut sender = connect(addr, None);
    let mut healthy = connect(addr, None);
    let stuck: Vec<Client<S>> = (0..3).map(|_| connect(addr, Some(4096))).collect();
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
            let (_, packet) = match healthy.recv_packet(T) {
                Ok(p) => p,
                Err(e) => panic!("healthy reader lost its connection after {next} packets: {e}"),
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
    let mut peak_queued = 0f64;
    let started = Instant::now();
    let mut sent = 0u32;
    // The longest the sender itself was off between two sends (sleeping,
    // descheduled, reading the metrics; not sending, where the relay could
    // hold it): a gap the reader sees that the relay did not make.
    let mut idle_worst = Duration::ZERO;
    let mut sent_at: Option<Instant> = None;
    while started.elapsed() < RUN {
        if let Some(at) = sent_at {
            idle_worst = idle_worst.max(at.elapsed());
        }
        sender.send(&healthy_key, &sent.to_be_bytes());
        sent += 1;
        if sent.is_multiple_of(10) {
            for k in &stuck_keys {
                sender.send(k, &big);
            }
        }
        sent_at = Some(Instant::now());
        if sent.is_multiple_of(250) {
            peak_queued = peak_queued.max(metric("ferry_queued_bytes"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sender.send(&healthy_key, &u32::MAX.to_be_bytes());
    let (received, worst) = reader.join().unwrap();
    assert_eq!(received, sent, "every healthy packet arrived");
    assert!(
        worst < MAX_GAP + idle_worst,
        "the healthy reader waited {worst:?} between packets, the sender \
         was off for at most {idle_worst:?} (tls={tls})"
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
    sender.ping(*b"stillup!");
    loop {
        match sender.next_meaningful(T).expect("sender connected") {
            Event::Pong(data) => {
                assert_eq!(&data, b"stillup!");
                break;
            }
            _ => continue,
        }
    }
    drop(stuck);
    stop(server);
}

fn stuck_receivers_do_not_stall_the_sender_plain() {
    stuck_receivers_do_not_stall_the_sender(false, |addr, rcvbuf| {
        Client::over(
            dial(addr, rcvbuf),
            config(NodePrivate::generate(), info(None)),
        )
    });
}

fn stuck_receivers_do_not_stall_the_sender_tls() {
    stuck_receivers_do_not_stall_the_sender(true, |addr, rcvbuf| {
        tls_over(
            dial(addr, rcvbuf),
            config(NodePrivate::generate(), info(None)),
        )
    });
}

ferry_testkit::per_backend!(
    stuck_receivers_do_not_stall_the_sender_plain,
    stuck_receivers_do_not_stall_the_sender_tls,
);
