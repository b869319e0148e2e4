//! Steady-state forwarding allocates nothing.
//!
//! This file is its own test binary with a counting global allocator and a
//! single test, so nothing else runs in the process while it counts. The
//! clients are raw sockets with pre-built frames and fixed buffers, so every
//! allocation counted during the measured burst is the relay's. Two warm-up
//! bursts let queues, send buffers and per-source tables reach their working
//! size; during the third, identical burst the relay must make no
//! allocation of per-packet size at all. The only thing allowed is a queue
//! growing past its earlier high-water mark (how deep a queue gets depends
//! on scheduling): a reallocation of a large buffer, at most a couple per
//! connection, never per packet.
//! Runs with whatever back end `FERRY_IO` selects (the suite runs it with
//! each).

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
    let small: Vec<u64> = sizes.iter().copied().filter(|&n| n < 64 * 1024).collect();
    assert!(
        small.is_empty() && allocs <= (2 * 2 * PAIRS) as u64,
        "the relay allocated {allocs} times while forwarding {} packets \
         (per-packet-sized: {small:?}; sizes of the first: {sizes:?})",
        PAIRS * PACKETS
    );
    support::stop(server);
}
