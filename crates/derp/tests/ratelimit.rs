//! What waits on the relay's side of a client that sends faster than its
//! receive limit (`--rate-config`) allows.
//!
//! A limited client's socket is not read while its bucket is in debt, so
//! its bytes wait in the relay's kernel receive buffer and in what the
//! relay read but has not handled yet. Left alone, the kernel grows that
//! buffer (up to `tcp_rmem`'s max) and it holds seconds of the client's
//! traffic; the relay caps it for limited clients.
//!
//! Measured from outside, without timing anything: the bytes of the
//! sender's stream the relay's kernel acknowledged (`TCP_INFO`), less the
//! bytes of the frames the receiver got, are what the relay holds for the
//! sender (plus the frames on their way to the receiver). The peak of that
//! over the run must stay within the bound; a client held by something
//! else than its limit (a receiver that reads slowly, no limit at all)
//! keeps a buffer the kernel grows past the bound.

mod support;

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_derp::shard::Control;
use ferry_proto::key::NodePrivate;
use ferry_proto::rate_config::RateConfig;
use support::sim::Sim;
use support::{config, dial, info, start, stop, Client};

const T: Duration = Duration::from_secs(10);
/// The limit: 500 kB/s and the smallest burst derper applies.
const RATE: u64 = 500_000;
const BURST: u64 = 65_568;
/// Packets of this size, as fast as the relay takes them.
const PACKET: usize = 60_000;
/// A frame on the wire: type, length, key, packet.
const FRAME: u64 = 5 + 32 + PACKET as u64;
/// How long the sender sends.
const RUN: Duration = Duration::from_secs(2);
/// The receive buffer a limited sender's socket gets, as the kernel counts
/// it: a tenth of a second of its rate, or twice its burst if more.
const CAP: u64 = if 2 * BURST > RATE / 10 {
    2 * BURST
} else {
    RATE / 10
};
/// What one turn of the relay reads from a socket before a pause lands:
/// epoll's read budget per turn; io_uring's multishot receive fills
/// provided buffers until the pause cancels it, at most the ring's
/// starting pool (64 buffers of 16 KiB) with two sockets.
fn read_ahead() -> u64 {
    match ferry_testkit::backend::requested() {
        Some(ferry_testkit::backend::Backend::Uring) => 64 * 16 * 1024,
        _ => (ferry_engine::epoll::READ_CHUNK * ferry_engine::epoll::READ_BUDGET) as u64,
    }
}
/// What may wait for a limited sender: its kernel buffer (data in large
/// segments fills about all of it), one turn's reads in the relay, two
/// frames on their way to the receiver, and some slack.
fn bound() -> u64 {
    CAP + read_ahead() + 2 * FRAME + 64 * 1024
}

/// Runs one sender → receiver pair against a relay started with `rate`;
/// `receiver_pause` paces the receiver's reads. Returns the peak of what
/// the relay held for the sender.
fn peak_held(rate: RateConfig, receiver_pause: Duration) -> u64 {
    let (server, addr) = start(1, |cfg| cfg.rate = rate);
    let (sender, probe) = connect(addr);
    let (receiver, _) = connect(addr);
    let receiver_key = receiver.public;
    let base = acked(&probe);

    let got = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (got, done) = (got.clone(), done.clone());
        let mut receiver = receiver;
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                match receiver.recv_packet(Duration::from_millis(200)) {
                    Ok((_, p)) => {
                        assert_eq!(p.len(), PACKET);
                        got.fetch_add(FRAME, Ordering::Relaxed);
                        std::thread::sleep(receiver_pause);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(e) => panic!("receiver lost its connection: {e}"),
                }
            }
        })
    };
    let writer = {
        let done = done.clone();
        let mut sender = sender;
        std::thread::spawn(move || {
            let packet = vec![0x5a; PACKET];
            while !done.load(Ordering::Relaxed) {
                sender.send(&receiver_key, &packet);
            }
            sender
        })
    };

    let mut peak = 0u64;
    let started = Instant::now();
    while started.elapsed() < RUN {
        let held = (acked(&probe) - base).saturating_sub(got.load(Ordering::Relaxed));
        peak = peak.max(held);
        std::thread::sleep(Duration::from_millis(10));
    }
    done.store(true, Ordering::Relaxed);
    // The sender's last write completes as the relay reads on (its limit
    // or the receiver's pace), well within the bound of its thread.
    let deadline = Instant::now() + T;
    while !writer.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(writer.is_finished(), "the sender's last write completed");
    drop(writer.join().unwrap());
    reader.join().unwrap();
    assert!(
        got.load(Ordering::Relaxed) > 4 * FRAME,
        "packets went through"
    );
    stop(server);
    eprintln!("peak held for the sender: {peak} bytes (bound {})", bound());
    peak
}

/// A client over `addr` and a second handle on its socket for `TCP_INFO`.
fn connect(addr: SocketAddr) -> (Client, std::net::TcpStream) {
    let tcp = dial(addr, None);
    let probe = tcp.try_clone().expect("clone the socket");
    (
        Client::over(tcp, config(NodePrivate::generate(), info(None))),
        probe,
    )
}

/// Bytes of `sock`'s stream the relay's kernel acknowledged.
fn acked(sock: &std::net::TcpStream) -> u64 {
    ferry_sys::sockopt::tcp_bytes_acked(sock.as_fd()).expect("TCP_INFO bytes_acked")
}

fn a_limited_sender_keeps_little_waiting_on_the_relay() {
    let limit = RateConfig {
        bytes_per_sec: RATE,
        burst_bytes: BURST,
    }
    .applied();
    let peak = peak_held(limit, Duration::ZERO);
    let bound = bound();
    assert!(
        peak <= bound,
        "{peak} bytes of a limited sender waited on the relay's side (bound {bound})"
    );
}

#[test]
fn only_limited_clients_get_a_bounded_receive_buffer() {
    let mesh = ferry_proto::key::MeshKey::parse(&"ab".repeat(32)).unwrap();
    let limit = RateConfig {
        bytes_per_sec: RATE,
        burst_bytes: BURST,
    };
    let mut s = Sim::new(|cfg| {
        cfg.rate = limit;
        cfg.mesh_key = Some(mesh.clone());
    });
    let limited = s.client(&NodePrivate::generate());
    let peer = s.mesh_client(&NodePrivate::generate(), &mesh);
    // The simulated driver has no round trip.
    assert_eq!(s.d.recv_limit(limited), Some(CAP as usize));
    assert_eq!(s.d.recv_limit(peer), None, "mesh peers are exempt");

    // A distant client gets two of its round trips of its rate more: a
    // buffer of a tenth of a second alone would advertise a window that
    // holds it under its rate (a window per round trip).
    let mut s = Sim::new(|cfg| cfg.rate = limit);
    s.d.set_rtt(Duration::from_millis(200));
    let distant = s.client(&NodePrivate::generate());
    let want = RATE as usize / 10 + 2 * RATE as usize * 200 / 1000;
    assert!(want > 2 * BURST as usize);
    assert_eq!(s.d.recv_limit(distant), Some(want));

    // A client that delays its acknowledgements to look 30 s away is
    // sized as if half a second away, no more.
    let mut s = Sim::new(|cfg| cfg.rate = limit);
    s.d.set_rtt(Duration::from_secs(30));
    let slow_acks = s.client(&NodePrivate::generate());
    let most = RATE as usize / 10 + 2 * RATE as usize * 500 / 1000;
    assert_eq!(s.d.recv_limit(slow_acks), Some(most));

    let mut s = Sim::new(|_| {});
    let free = s.client(&NodePrivate::generate());
    assert_eq!(s.d.recv_limit(free), None, "no limits, no cap");
    // Limits that arrive later (SIGHUP) cap it then.
    s.shared.post(0, Control::RateConfig(limit));
    s.settle();
    assert_eq!(s.d.recv_limit(free), Some(CAP as usize));
}

ferry_testkit::per_backend!(a_limited_sender_keeps_little_waiting_on_the_relay,);
