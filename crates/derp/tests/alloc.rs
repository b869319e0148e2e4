//! Steady-state forwarding does not allocate per packet.
//!
//! This file is its own test binary with a counting global allocator and a
//! single test, so nothing else runs in the process while it counts. The
//! clients are raw sockets with pre-built frames and fixed buffers, so every
//! allocation counted during the measured burst is the relay's. Two warm-up
//! bursts let queues, send buffers and per-source tables reach their working
//! size; during the third, identical burst of 12,000 packets the relay may
//! allocate at most four times per connection. What is allowed is a buffer
//! growing past its earlier high-water mark, which depends on scheduling
//! and not on the packet count: a queue getting deeper than before, or the
//! frame reader holding a longer unread tail (a read that ended mid-frame,
//! or input left for the next turn). Those are bounded by the connection
//! count; anything done per packet, or even once per 200 packets,
//! exceeds the bound. (Sizes are not a criterion: a growing reader buffer
//! starts at whatever tail a read left, tens of bytes.)
//! Runs on each back end in turn.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ferry_proto::frame;

#[global_allocator]
static GLOBAL: ferry_sys::alloc_count::Counting = ferry_sys::alloc_count::Counting;

const PAIRS: usize = 6;
const PACKETS: usize = 2000;
const SIZE: usize = 1400;

/// Reads until every receiver has all of one burst. Allocation-free.
fn drain(receivers: &mut [TcpStream], buf: &mut [u8]) {
    let want = PACKETS * (frame::HEADER_LEN + 32 + SIZE);
    let deadline = Instant::now() + Duration::from_secs(30);
    for r in receivers.iter_mut() {
        let mut got = 0;
        while got < want {
            assert!(Instant::now() < deadline, "burst did not arrive");
            let n = r.read(buf).expect("receive");
            assert!(n > 0, "relay closed a receiver");
            got += n;
        }
        assert_eq!(got, want, "only whole recvPacket frames arrive");
    }
}

#[test]
fn forwarding_allocates_nothing_per_packet() {
    // One back end after the other: the count is the whole process's.
    ferry_testkit::on_each_backend!(forward_and_count);
}

fn forward_and_count() {
    let (server, addr) = support::start(2, |cfg| {
        // Large enough that this burst never trips backpressure, whose
        // pause/resume bookkeeping is exercised elsewhere.
        cfg.send_queue_bytes = 64 << 20;
        cfg.keepalive = Duration::from_secs(3600);
    });
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..PAIRS {
        let s = support::Client::connect(addr);
        let r = support::Client::connect(addr);
        let mut f = Vec::new();
        frame::put_send_packet(&mut f, &r.public, &[0x5a; SIZE]);
        senders.push((s.stream, f));
        receivers.push(r.stream);
    }
    for r in &receivers {
        r.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let mut buf = vec![0u8; 256 * 1024];
    // Senders are spawned once and released per burst by a barrier (futex
    // based, allocation-free), so the harness allocates nothing while the
    // relay is being counted.
    let go = std::sync::Barrier::new(PAIRS + 1);
    let (allocs, sizes) = std::thread::scope(|scope| {
        for (stream, f) in senders.iter_mut() {
            let go = &go;
            scope.spawn(move || {
                for _ in 0..3 {
                    go.wait();
                    for _ in 0..PACKETS {
                        stream.write_all(f).expect("send");
                    }
                }
            });
        }
        for _ in 0..2 {
            go.wait();
            drain(&mut receivers, &mut buf); // warm-up
        }

        ferry_sys::alloc_count::start_recording();
        go.wait();
        drain(&mut receivers, &mut buf);
        ferry_sys::alloc_count::stop_recording()
    });

    let relayed = support::metric(addr, "derp_packets_sent");
    assert_eq!(
        relayed,
        (3 * PAIRS * PACKETS) as f64,
        "every packet was relayed"
    );
    // Each connection has three buffers that can grow (the frame reader's
    // held input, the data queue, the send buffer): four growth steps per
    // connection is one allocation per 250 packets at most.
    let bound = (4 * 2 * PAIRS) as u64;
    eprintln!(
        "{:?}: allocations during the measured burst: {allocs} {sizes:?}",
        support::io_mode()
    );
    assert!(
        allocs <= bound,
        "the relay allocated {allocs} times (more than {bound}) while forwarding {} packets \
         (sizes of the first: {sizes:?})",
        PAIRS * PACKETS
    );
    support::stop(server);
}
