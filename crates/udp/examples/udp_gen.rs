//! The UDP relay benchmark's load generator and sink (bench/udp/pps.sh).
//!
//! ```text
//! udp_gen send --to 10.77.11.1:5000 [--flows 8] [--size 1400] [--gso 0]
//!              [--seconds 5] [--pps 0] [--shape raw|hub] [--first-flow 0]
//!              [--shape session --vni-file FILE]
//! udp_gen sink --listen 10.77.12.2:6000 [--ports 8] [--seconds 15] [--answer]
//! udp_gen hub-config --flows 8 --sink 10.77.12.2:6000
//! ```
//!
//! `send` opens one socket per flow, each with its own source port, so a
//! relay's shards and the kernel's receive steering can spread them, and
//! sends datagrams of one size round-robin over the flows as fast as the
//! kernel takes them (or at `--pps`): 64 separate datagrams per `sendmmsg`,
//! each a packet the relay handles on its own, or with `--gso N` trains of
//! N datagrams per message (UDP GSO), the way wireguard-go sends. It prints
//! one JSON line with what it offered. Several `send` processes may run
//! side by side (`--first-flow` keeps their flows apart).
//!
//! `--shape hub` makes the flows WireGuard-shaped for the receiver-index
//! hub: flow `i` is peer `a<i>` talking to peer `b<i>` (keys from
//! `hub-config`). It first sends an initiation sealed for `b<i>` and waits
//! for the response (the sink answers with `--answer`), which teaches the
//! hub both indices, then sends transport messages to the responder's
//! index.
//!
//! `--shape session` sends through relay sessions set up by
//! `crates/client/examples/session_pps.rs`: line `i` of `--vni-file` is
//! flow `i`'s `VNI SOURCE_PORT`; the flow's socket is bound to that port
//! (from which the session's slot 0 was bound) and every datagram starts
//! with the session's 8-byte data header.
//!
//! `sink` listens on `--ports` consecutive ports, counts what arrives (with
//! GRO on, so it stays cheap: one receive per train), from the first data
//! datagram until the senders have been quiet for a second (or `--seconds`
//! runs out), and prints one JSON line with packets, bytes, the rate over
//! the time it was receiving and the kernel's receive-buffer drops. With
//! `--answer`, an initiation arriving at port `P + i` is answered with a
//! response sealed for `a<i>`, as `b<i>` would.
//!
//! `hub-config` prints the `[hub]` peers for `--flows` flows: `a<i>` and
//! `b<i>`, `b<i>` with the fixed endpoint `--sink` port `+ i`.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ferry_proto::udp_header::{Header, Protocol};
use ferry_proto::wireguard::{self as wg, Index, Mac1Key, Message, PublicKey};
use ferry_sys::mmsg::{OutMsg, RecvBatch, RecvMeta, SendBatch, Span, MAX_BATCH, MAX_SPANS};

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn num<T: std::str::FromStr>(args: &[String], name: &str, default: &str) -> T {
    let text = arg(args, name).unwrap_or(default);
    text.parse()
        .unwrap_or_else(|_| panic!("{name}: not a number: {text}"))
}

fn addr(args: &[String], name: &str) -> SocketAddr {
    let text = arg(args, name).unwrap_or_else(|| panic!("{name} is required"));
    text.parse()
        .unwrap_or_else(|_| panic!("{name}: not an address: {text}"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = Duration::from_secs_f64(num(&args, "--seconds", "5"));
    match args.get(1).map(String::as_str) {
        Some("send") => {
            let shape = match arg(&args, "--shape").unwrap_or("raw") {
                "raw" => Shape::Raw,
                "hub" => Shape::Hub,
                "session" => {
                    let file = arg(&args, "--vni-file").expect("--shape session needs --vni-file");
                    Shape::Session(sessions(file))
                }
                other => panic!("--shape: raw, hub or session, not {other}"),
            };
            send(&Load {
                to: addr(&args, "--to"),
                flows: num(&args, "--flows", "8"),
                first_flow: num(&args, "--first-flow", "0"),
                size: num(&args, "--size", "1400"),
                gso: num(&args, "--gso", "0"),
                pps: num(&args, "--pps", "0"),
                shape,
                duration: seconds,
            });
        }
        Some("sink") => sink(
            addr(&args, "--listen"),
            num(&args, "--ports", "1"),
            args.iter().any(|a| a == "--answer"),
            seconds,
        ),
        Some("hub-config") => {
            let sink = addr(&args, "--sink");
            for i in 0..num::<u16>(&args, "--flows", "8") {
                println!(
                    "[[hub.peer]]\nname = \"a{i}\"\npublic_key = \"{}\"\n",
                    key(Side::A, i).to_base64()
                );
                println!(
                    "[[hub.peer]]\nname = \"b{i}\"\npublic_key = \"{}\"\nendpoint = \"{}\"\n",
                    key(Side::B, i).to_base64(),
                    SocketAddr::new(sink.ip(), sink.port() + i)
                );
            }
        }
        _ => {
            eprintln!("usage: udp_gen send --to ADDR [--flows N] [--size B] [--gso N] [--seconds S] [--pps P] [--shape raw|hub|session] [--vni-file FILE] [--first-flow F]\n       udp_gen sink --listen ADDR [--ports N] [--seconds S] [--answer]\n       udp_gen hub-config --flows N --sink ADDR");
            std::process::exit(2);
        }
    }
}

enum Shape {
    /// Bytes with no meaning (bounce).
    Raw,
    /// WireGuard transport messages after a handshake (hub).
    Hub,
    /// Data datagrams of relay sessions: per flow, the VNI and the source
    /// port its slot 0 was bound from.
    Session(Vec<(u32, u16)>),
}

/// The `VNI SOURCE_PORT` lines of a session file.
fn sessions(file: &str) -> Vec<(u32, u16)> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.lines()
        .map(|l| {
            let mut w = l.split_whitespace().map(str::parse);
            match (w.next(), w.next()) {
                (Some(Ok(vni)), Some(Ok(port))) => (vni, port as u16),
                _ => panic!("{file}: not `VNI PORT`: {l}"),
            }
        })
        .collect()
}

struct Load {
    to: SocketAddr,
    flows: u16,
    first_flow: u16,
    size: usize,
    gso: usize,
    pps: u64,
    shape: Shape,
    duration: Duration,
}

#[derive(Clone, Copy)]
enum Side {
    A,
    B,
}

/// Flow `i`'s synthetic public keys: only their MAC1 keys matter to the
/// hub, which never does a Diffie-Hellman.
fn key(side: Side, flow: u16) -> PublicKey {
    let mut k = [0x42u8; wg::KEY_LEN];
    k[0] = match side {
        Side::A => 0xa1,
        Side::B => 0xb2,
    };
    k[1..3].copy_from_slice(&flow.to_le_bytes());
    PublicKey::from_bytes(k)
}

/// The sender index flow `i`'s initiator picks, and its responder's.
fn index(side: Side, flow: u16) -> Index {
    let base: Index = match side {
        Side::A => 0x1a00_0000,
        Side::B => 0x2b00_0000,
    };
    base | Index::from(flow)
}

/// A handshake message (initiation or response) with filler where the
/// encrypted fields go, and a real MAC1 for `to`.
fn handshake(kind: u8, sender: Index, receiver: Index, to: &PublicKey) -> Vec<u8> {
    let (len, fill) = if kind == wg::TYPE_INITIATION {
        (wg::INITIATION_LEN, 0x55)
    } else {
        (wg::RESPONSE_LEN, 0x66)
    };
    let mut m = vec![fill; len];
    m[..4].copy_from_slice(&[kind, 0, 0, 0]);
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    if kind == wg::TYPE_RESPONSE {
        m[8..12].copy_from_slice(&receiver.to_le_bytes());
    }
    assert!(wg::seal_mac1(&mut m, &Mac1Key::new(to)));
    m
}

fn socket(bind: SocketAddr) -> UdpSocket {
    let s = UdpSocket::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
    let _ = ferry_sys::sockopt::set_buffer(s.as_fd(), ferry_sys::sockopt::Buffer::Send, 4 << 20);
    let _ =
        ferry_sys::sockopt::set_buffer(s.as_fd(), ferry_sys::sockopt::Buffer::Receive, 32 << 20);
    s.set_nonblocking(true).expect("nonblocking");
    s
}

/// Runs flow `flow`'s handshake through the hub on `s`: the initiation,
/// resent every 200 ms for up to 5 s until the response arrives. Returns
/// the responder's index.
fn hub_handshake(s: &UdpSocket, to: SocketAddr, flow: u16) -> Index {
    let mine = index(Side::A, flow);
    let init = handshake(wg::TYPE_INITIATION, mine, 0, &key(Side::B, flow));
    let mut buf = [0u8; 2048];
    for _ in 0..25 {
        let _ = s.send_to(&init, to);
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            match s.recv_from(&mut buf) {
                Ok((n, _)) => {
                    if let Ok(Message::Response { sender, receiver }) = wg::classify(&buf[..n]) {
                        if receiver == mine {
                            return sender;
                        }
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
    panic!("flow {flow}: no handshake response through {to} within 5 s");
}

/// One flow: its socket and the datagrams it sends.
struct Flow {
    socket: UdpSocket,
    buf: Vec<u8>,
}

fn send(load: &Load) {
    let any: SocketAddr = if load.to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let size = load.size.max(wg::TRANSPORT_MIN_LEN);
    // With GSO, each message is a train of `per_msg` datagrams (spans).
    let per_msg = load.gso.clamp(
        1,
        ferry_sys::gso::MAX_SEGMENTS.min(ferry_sys::gso::MAX_GSO_BYTES / size),
    );
    let n_msgs = if per_msg > 1 {
        (MAX_SPANS / per_msg).min(MAX_BATCH)
    } else {
        MAX_BATCH
    };
    let dgrams = n_msgs * per_msg;
    let spans: Vec<Span> = (0..dgrams)
        .map(|i| Span {
            start: i * size,
            len: size,
        })
        .collect();
    let msgs: Vec<OutMsg> = (0..n_msgs)
        .map(|i| OutMsg {
            dst: Some(load.to),
            first: i * per_msg,
            count: per_msg,
            segment: if per_msg > 1 { size as u16 } else { 0 },
        })
        .collect();
    let flows: Vec<Flow> = (0..load.flows)
        .map(|i| {
            let flow = load.first_flow + i;
            let mut buf: Vec<u8> = (0..size * dgrams).map(|b| (b % 251) as u8).collect();
            let socket = match &load.shape {
                Shape::Raw => socket(any),
                Shape::Hub => {
                    let socket = socket(any);
                    let to = hub_handshake(&socket, load.to, flow);
                    for (n, d) in buf.chunks_exact_mut(size).enumerate() {
                        d[..4].copy_from_slice(&[wg::TYPE_TRANSPORT, 0, 0, 0]);
                        d[4..8].copy_from_slice(&to.to_le_bytes());
                        d[8..16].copy_from_slice(&(n as u64).to_le_bytes());
                    }
                    socket
                }
                Shape::Session(s) => {
                    let (vni, port) = *s
                        .get(usize::from(flow))
                        .unwrap_or_else(|| panic!("no session for flow {flow}"));
                    let header = Header::data(Protocol::Payload, vni).to_bytes();
                    for d in buf.chunks_exact_mut(size) {
                        d[..header.len()].copy_from_slice(&header);
                    }
                    socket(SocketAddr::new(any.ip(), port))
                }
            };
            Flow { socket, buf }
        })
        .collect();
    let mut tx = SendBatch::new();
    let start = Instant::now();
    let (mut sent, mut full, mut errors) = (0u64, 0u64, 0u64);
    let mut idle_rounds = 0u32;
    while start.elapsed() < load.duration {
        if load.pps > 0 && sent as f64 >= load.pps as f64 * start.elapsed().as_secs_f64() {
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let mut took = false;
        for f in &flows {
            match tx.send(f.socket.as_fd(), &f.buf, &spans, &msgs) {
                Ok(n) => {
                    sent += (n * per_msg) as u64;
                    took |= n > 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => full += 1,
                // ENOBUFS and ICMP-provoked errors: keep going.
                Err(_) => errors += 1,
            }
        }
        if took {
            idle_rounds = 0;
        } else {
            // Every socket's buffer is full: let the kernel drain them.
            idle_rounds += 1;
            std::thread::sleep(Duration::from_micros(20 * u64::from(idle_rounds.min(10))));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"sent_packets\":{sent},\"seconds\":{secs:.3},\"pps\":{:.0},\"flows\":{},\"datagrams_per_call\":{dgrams},\"buffer_full\":{full},\"errors\":{errors}}}",
        sent as f64 / secs,
        load.flows
    );
}

fn sink(at: SocketAddr, ports: u16, answer: bool, duration: Duration) {
    let mut poll = mio::Poll::new().expect("poll");
    let mut sockets: Vec<mio::net::UdpSocket> = (0..ports.max(1))
        .map(|i| {
            let s = socket(SocketAddr::new(at.ip(), at.port() + i));
            let _ = ferry_sys::gso::set_gro(s.as_fd(), true);
            let _ = ferry_sys::sockopt::enable_drop_counter(s.as_fd());
            mio::net::UdpSocket::from_std(s)
        })
        .collect();
    for (i, s) in sockets.iter_mut().enumerate() {
        poll.registry()
            .register(s, mio::Token(i), mio::Interest::READABLE)
            .expect("register");
    }
    let mut events = mio::Events::with_capacity(64);
    let slot = 65536;
    let mut buf = vec![0u8; slot * MAX_BATCH];
    let mut meta = vec![RecvMeta::default(); MAX_BATCH];
    let mut rx = RecvBatch::new();
    let deadline = Instant::now() + duration;
    let (mut packets, mut bytes) = (0u64, 0u64);
    let mut drops: HashMap<usize, u32> = HashMap::new();
    let mut answered = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline
            || first.is_some_and(|_| now.duration_since(last) > Duration::from_secs(1))
        {
            break;
        }
        let _ = poll.poll(&mut events, Some(Duration::from_millis(100)));
        for ev in &events {
            let i = ev.token().0;
            let s = &sockets[i];
            // Edge-triggered: drain until the kernel has nothing left.
            loop {
                let n = match rx.recv(s.as_fd(), &mut buf, slot, &mut meta) {
                    Ok(n) if n > 0 => n,
                    _ => break,
                };
                let now = Instant::now();
                for (m, d) in meta[..n].iter().zip(buf.chunks_exact(slot)) {
                    if let Some(d) = m.drops {
                        drops.insert(i, d);
                    }
                    if answer && m.len == wg::INITIATION_LEN {
                        if let (Ok(Message::Initiation { sender }), Some(src)) =
                            (wg::classify(&d[..m.len]), m.src)
                        {
                            let flow = i as u16;
                            let r = handshake(
                                wg::TYPE_RESPONSE,
                                index(Side::B, flow),
                                sender,
                                &key(Side::A, flow),
                            );
                            let _ = s.send_to(&r, src);
                            answered += 1;
                            continue;
                        }
                    }
                    first.get_or_insert(now);
                    last = now;
                    packets += m.len.div_ceil(m.segment.max(1)) as u64;
                    bytes += m.len as u64;
                }
            }
        }
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let rate = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    println!(
        "{{\"packets\":{packets},\"bytes\":{bytes},\"seconds\":{secs:.3},\"pps\":{:.0},\"mbits\":{:.1},\"sink_drops\":{},\"handshakes_answered\":{answered}}}",
        rate(packets as f64),
        rate(bytes as f64 * 8.0 / 1e6),
        drops.values().map(|&d| u64::from(d)).sum::<u64>()
    );
}
