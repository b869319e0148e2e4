//! A UDP load generator and sink for the relay benchmark (bench/udp).
//!
//! ```text
//! udp_load send --to 10.77.11.1:5000 --size 1400 --seconds 10 [--gso 64]
//! udp_load sink --listen 10.77.12.2:6000 --seconds 15
//! ```
//!
//! `send` blasts datagrams of one size as fast as the kernel takes them
//! and prints what it sent: by default 64 separate datagrams per
//! `sendmmsg`, each a packet the relay must handle on its own; with
//! `--gso N`, trains of N datagrams per message (UDP GSO), the way
//! wireguard-go sends. `sink` counts what arrives (with GRO on, so it stays
//! cheap), from the first datagram until the sender has been quiet for a
//! second (or `--seconds` runs out), and prints one JSON line with
//! packets, bytes and the rate over the time it was receiving.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ferry_sys::mmsg::{OutMsg, RecvBatch, RecvMeta, SendBatch, Span, MAX_BATCH, MAX_SPANS};

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = arg(&args, "--seconds")
        .unwrap_or("10")
        .parse()
        .expect("--seconds");
    match args.get(1).map(String::as_str) {
        Some("send") => {
            let to: SocketAddr = arg(&args, "--to").expect("--to").parse().expect("--to");
            let size: usize = arg(&args, "--size")
                .unwrap_or("1400")
                .parse()
                .expect("--size");
            let gso: usize = arg(&args, "--gso").unwrap_or("0").parse().expect("--gso");
            send(to, size, gso, Duration::from_secs_f64(seconds));
        }
        Some("sink") => {
            let at: SocketAddr = arg(&args, "--listen")
                .expect("--listen")
                .parse()
                .expect("--listen");
            sink(at, Duration::from_secs_f64(seconds));
        }
        _ => {
            eprintln!("usage: udp_load send --to ADDR [--size N] [--seconds S] | sink --listen ADDR [--seconds S]");
            std::process::exit(2);
        }
    }
}

fn socket(bind: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind(bind).expect("bind");
    let _ = ferry_sys::sockopt::set_buffer(s.as_fd(), ferry_sys::sockopt::Buffer::Send, 8 << 20);
    let _ =
        ferry_sys::sockopt::set_buffer(s.as_fd(), ferry_sys::sockopt::Buffer::Receive, 32 << 20);
    s
}

fn send(to: SocketAddr, size: usize, gso: usize, duration: Duration) {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let s = socket(any);
    // With GSO, each message is a train of `per_msg` datagrams (spans).
    let per_msg = gso.clamp(
        1,
        ferry_sys::gso::MAX_SEGMENTS.min(ferry_sys::gso::MAX_GSO_BYTES / size),
    );
    let n_msgs = if per_msg > 1 {
        (MAX_SPANS / per_msg).min(MAX_BATCH)
    } else {
        MAX_BATCH
    };
    let dgrams = n_msgs * per_msg;
    let buf: Vec<u8> = (0..size * dgrams).map(|i| (i % 251) as u8).collect();
    let spans: Vec<Span> = (0..dgrams)
        .map(|i| Span {
            start: i * size,
            len: size,
        })
        .collect();
    let msgs: Vec<OutMsg> = (0..n_msgs)
        .map(|i| OutMsg {
            dst: Some(to),
            first: i * per_msg,
            count: per_msg,
            segment: if per_msg > 1 { size as u16 } else { 0 },
        })
        .collect();
    let mut tx = SendBatch::new();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut full = 0u64;
    while start.elapsed() < duration {
        match tx.send(s.as_fd(), &buf, &spans, &msgs) {
            Ok(n) => sent += (n * per_msg) as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                full += 1;
                std::thread::sleep(Duration::from_micros(20));
            }
            // ENOBUFS and ICMP-provoked errors: keep going.
            Err(_) => full += 1,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"sent_packets\":{sent},\"seconds\":{secs:.3},\"pps\":{:.0},\"buffer_full\":{full}}}",
        sent as f64 / secs
    );
}

fn sink(at: SocketAddr, duration: Duration) {
    let s = socket(at);
    s.set_nonblocking(true).expect("nonblocking");
    let gro = ferry_sys::gso::set_gro(s.as_fd(), true).is_ok();
    let _ = ferry_sys::sockopt::enable_drop_counter(s.as_fd());
    let mut dropped = 0u32;
    let slot = if gro { 65536 } else { 2048 };
    let mut buf = vec![0u8; slot * MAX_BATCH];
    let mut meta = vec![RecvMeta::default(); MAX_BATCH];
    let mut rx = RecvBatch::new();
    let deadline = Instant::now() + duration;
    let (mut packets, mut bytes) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline
            || first.is_some_and(|_| now.duration_since(last) > Duration::from_secs(1))
        {
            break;
        }
        match rx.recv(s.as_fd(), &mut buf, slot, &mut meta) {
            Ok(n) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                for m in &meta[..n] {
                    dropped = dropped.max(m.drops.unwrap_or(0));
                    packets += m.len.div_ceil(m.segment.max(1)) as u64;
                    bytes += m.len as u64;
                }
            }
            Err(_) => std::thread::sleep(Duration::from_micros(50)),
        }
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let pps = if secs > 0.0 {
        packets as f64 / secs
    } else {
        0.0
    };
    println!(
        "{{\"packets\":{packets},\"bytes\":{bytes},\"seconds\":{secs:.3},\"pps\":{pps:.0},\"mbits\":{:.1},\"sink_drops\":{dropped}}}",
        if secs > 0.0 { bytes as f64 * 8.0 / secs / 1e6 } else { 0.0 }
    );
}
