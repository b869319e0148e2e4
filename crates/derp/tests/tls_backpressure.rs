//! Backpressure over TLS (rustls in userspace), on each back end: the cases of
//! relay.rs's plain-TCP backpressure tests that matter, with every client
//! speaking TLS. A slow reader pauses its sender and resumes it with no
//! packet lost, on one shard and across two; a paused sender holds up no
//! one else; a receiver that reads nothing past the budget has its packets
//! dropped at the tail, before the ring when it is on another shard.
//! Placement is pinned (`Placement::FirstByte`), so "across shards" is
//! across shards every time. The listener speaks TLS only, so the counters
//! are read in-process.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ferry_derp::{DerpConfig, Placement, Server};
use support::{
    config, dial, eventually, info, metric_in, recv_numbered, send_numbered, start, stop, tls_over,
    Client, Flood, Tls,
};

const T: Duration = Duration::from_secs(10);

/// A TLS relay with `workers` shards, keys placed by their first byte.
fn start_tls(workers: usize, tweak: impl FnOnce(&mut DerpConfig)) -> (Server, SocketAddr) {
    start(workers, |cfg| {
        cfg.tls = Some(support::self_signed_tls(cfg).config);
        cfg.placement = Placement::FirstByte;
        tweak(cfg);
    })
}

/// A TLS client whose key is owned by `shard` of `shards`; `rcvbuf`
/// shrinks its socket's receive buffer.
fn client(addr: SocketAddr, shard: usize, shards: usize, rcvbuf: Option<usize>) -> Client<Tls> {
    tls_over(
        dial(addr, rcvbuf),
        config(Placement::key_for(shard, shards), info(None)),
    )
}

fn metric(server: &Server, name: &str) -> f64 {
    metric_in(&server.metrics().render(), name)
}

const DROPPED_TAIL: &str = "derp_packets_dropped{kind=\"other\",reason=\"queue_tail\"}";
const DROPPED_HEAD: &str = "derp_packets_dropped{kind=\"other\",reason=\"queue_head\"}";

/// A reader that falls behind slows its sender down instead of losing its
/// packets: the sender is paused and resumed, and every packet arrives, in
/// order. On one shard, and with sender and reader on different shards.
fn slow_tls_reader_gets_backpressure_not_loss() {
    for (workers, sender_shard, reader_shard) in [(1, 0, 0), (2, 0, 0), (2, 0, 1)] {
        let case = format!("workers={workers}, sender on {sender_shard}, reader on {reader_shard}");
        let (server, addr) = start_tls(workers, |cfg| {
            cfg.send_queue_bytes = 64 * 1024;
            cfg.write_timeout = Some(Duration::from_secs(20));
        });
        let sender = client(addr, sender_shard, workers, None);
        // A small receive buffer, fixed (no autotuning, which here may grow
        // to tcp_rmem's 32 MiB and take the whole stream): the relay's
        // queue fills, as relay.rs's plain-TCP case has it.
        let mut reader = client(addr, reader_shard, workers, Some(4096));
        let reader_key = reader.public;
        const N: u32 = 3000;
        let writer = send_numbered(sender, reader_key, N, 1200);
        // The queue fills while the reader reads nothing.
        assert!(
            eventually(T, || metric(&server, "ferry_backpressure_pauses_total")
                >= 1.0),
            "the sender was never paused ({case})"
        );
        recv_numbered(&mut reader, N, Duration::from_secs(20), &case);
        let _sender = writer.join().unwrap();
        let dropped = metric(&server, DROPPED_TAIL) + metric(&server, DROPPED_HEAD);
        assert_eq!(dropped, 0.0, "{case}");
        assert!(
            eventually(T, || metric(&server, "ferry_senders_paused") == 0.0),
            "the sender was resumed ({case})"
        );
        if sender_shard != reader_shard {
            assert!(
                metric(
                    &server,
                    &format!("ferry_shard_cross_packets_total{{shard=\"{sender_shard}\"}}")
                ) >= f64::from(N),
                "the packets crossed shards ({case})"
            );
        }
        stop(server);
    }
}

/// One heavy sender held back by a reader that does not keep up holds up
/// no one else: another pair, on the heavy sender's shard and the slow
/// reader's, relays packet after packet while it is paused.
fn tls_backpressure_is_per_sender() {
    let (server, addr) = start_tls(2, |cfg| {
        cfg.send_queue_bytes = 32 * 1024;
        cfg.write_timeout = Some(Duration::from_secs(30));
    });
    let heavy = client(addr, 0, 2, None);
    let slow = client(addr, 1, 2, None);
    let mut a = client(addr, 0, 2, None);
    let mut b = client(addr, 1, 2, None);
    let flood = Flood::start(heavy, slow.public);
    assert!(
        eventually(T, || metric(&server, "ferry_backpressure_pauses_total")
            >= 1.0),
        "heavy sender paused"
    );
    for i in 0..200u32 {
        a.send(&b.public, &i.to_be_bytes());
        let (_, p) = b.recv_packet(T).expect("the other pair is unaffected");
        assert_eq!(p, i.to_be_bytes());
    }
    flood.stop();
    drop(slow);
    stop(server);
}

/// A TLS sender flooding a TLS receiver on another shard that reads
/// nothing: past the backpressure budget the receiver's packets are
/// dropped at the tail, the sender's shard drops them itself instead of
/// carrying them through the ring, and the sender's traffic to a healthy
/// receiver on that shard goes on.
fn tls_packets_to_a_stuck_receiver_are_dropped_past_the_budget() {
    let (server, addr) = start_tls(2, |cfg| {
        cfg.send_queue_bytes = 64 * 1024;
        cfg.write_timeout = Some(Duration::from_secs(30));
    });
    let heavy = client(addr, 0, 2, None);
    let slow = client(addr, 1, 2, Some(4096));
    let mut b = client(addr, 1, 2, None);
    let b_key = b.public;
    let flood = Flood::start(heavy, slow.public);
    assert!(
        eventually(T, || metric(
            &server,
            "ferry_backpressure_budget_expired_total"
        ) >= 1.0),
        "the slow receiver was never found not draining"
    );
    let cross = "ferry_shard_cross_packets_total{shard=\"0\"}";
    let (cross0, dropped0) = (metric(&server, cross), metric(&server, DROPPED_TAIL));
    assert!(
        eventually(T, || metric(&server, DROPPED_TAIL) >= dropped0 + 5000.0),
        "the flood's packets are dropped at the tail"
    );
    let cross1 = metric(&server, cross);
    assert!(
        cross1 - cross0 < 1000.0,
        "{} packets crossed the ring to a receiver that reads nothing",
        cross1 - cross0
    );
    let mut heavy = flood.stop();
    heavy.send(&b_key, b"still flowing");
    let (src, got) = b.recv_packet(T).expect("packet to the healthy receiver");
    assert_eq!((src, got.as_slice()), (heavy.public, &b"still flowing"[..]));
    drop(slow);
    stop(server);
}

ferry_testkit::per_backend!(
    slow_tls_reader_gets_backpressure_not_loss,
    tls_backpressure_is_per_sender,
    tls_packets_to_a_stuck_receiver_are_dropped_past_the_budget,
);
