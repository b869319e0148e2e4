//! The UDP relay benchmark's load generator, sink and latency probe
//! (bench/udp/pps.sh, bench/udp/soak_udp.py).
//!
//! ```text
//! udp_gen send --to 10.77.11.1:5000 [--flows 8] [--size 1400] [--gso 0]
//!              [--seconds 5] [--pps 0] [--shape raw|hub] [--first-flow 0]
//!              [--shape session --vni-file FILE]
//! udp_gen sink --listen 10.77.12.2:6000 [--ports 8] [--seconds 15] [--answer]
//!              [--quiet 1] [--report-every SECONDS]
//! udp_gen probe --to 10.77.11.1:5000 [--rate 10] [--seconds 5]
//!               [--report-every SECONDS] [--shape raw|hub|session] [--flow 0]
//! udp_gen hub-config --flows 8 --sink 10.77.12.2:6000
//! udp_gen flood --to 10.77.21.1:5002 [--from 10.77.24.0/24] [--sources 1]
//!               [--kind answer|bind] [--vni-file FILE] [--seconds 5] [--pps 0]
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
//! `session_pps` (this crate's other binary): line `i` of `--vni-file` is
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
//! The sink stops `--quiet` seconds after the last data datagram. With
//! `--report-every S` it also prints, from the first datagram on, one JSON
//! line per interval of S seconds (`interval`, `packets`, `bytes`, `pps`,
//! `mbits`, `probes_echoed`, the cumulative `sink_drops`); the summary
//! stays the last line. A probe datagram (64 bytes with the probe's magic
//! at byte 16) is not counted but sent back to where it came from, through
//! the hub (with `--answer`) as a transport message to `a<i>`'s index.
//!
//! `probe` is a low-rate flow through the relay for latency under load:
//! `--rate` datagrams per second, each with a sequence number and its send
//! time, shaped like flow `--flow` of `send` (its own bounce session, hub
//! handshake or relay session), which the sink echoes. It prints the
//! round-trip times (count, p50, p99, max in µs) with what it sent and got
//! back, per interval with `--report-every` and in all on the last line.
//!
//! `hub-config` prints the `[hub]` peers for `--flows` flows: `a<i>` and
//! `b<i>`, `b<i>` with the fixed endpoint `--sink` port `+ i`.
//!
//! `flood` sends a relay-session port bind messages that no session's
//! client made, as fast as the kernel takes them (or at `--pps`), to
//! measure what they cost the sessions beside them: answers whose cookies
//! the relay never made (`--kind answer`, the default: each costs the
//! relay a cookie check, a MAC or two) or binds (`--kind bind`: a MAC, a
//! session lookup, and a challenge back), for the sessions of
//! `--vni-file` (or session 1). They come from `--sources` sockets on
//! each local address of `--from` (addresses separated by commas, or an
//! IPv4 prefix such as `10.77.24.0/24`: the relay limits each source
//! address). It prints what it sent as JSON.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ferry_proto::relay_session::{BindKind, BindMsg, BIND_LEN};
use ferry_proto::udp_header::{Header, Protocol};
use ferry_proto::wireguard::{self as wg, Index, Mac1Key, Message, PublicKey};
use ferry_sys::mmsg::{OutMsg, RecvBatch, RecvMeta, SendBatch, Span, MAX_BATCH, MAX_SPANS};
use ferry_sys::train::Trains;

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
        Some("send") => send(&Load {
            to: addr(&args, "--to"),
            flows: num(&args, "--flows", "8"),
            first_flow: num(&args, "--first-flow", "0"),
            size: num(&args, "--size", "1400"),
            gso: num(&args, "--gso", "0"),
            pps: num(&args, "--pps", "0"),
            shape: shape(&args),
            duration: seconds,
        }),
        Some("sink") => sink(&Sink {
            at: addr(&args, "--listen"),
            ports: num(&args, "--ports", "1"),
            answer: args.iter().any(|a| a == "--answer"),
            duration: seconds,
            quiet: Duration::from_secs_f64(num(&args, "--quiet", "1")),
            report_every: every(&args),
        }),
        Some("probe") => probe(&Probe {
            to: addr(&args, "--to"),
            flow: num(&args, "--flow", "0"),
            rate: num(&args, "--rate", "10"),
            shape: shape(&args),
            duration: seconds,
            report_every: every(&args),
        }),
        Some("flood") => flood(&Flood {
            to: addr(&args, "--to"),
            from: arg(&args, "--from").map_or_else(Vec::new, addresses),
            sources: num(&args, "--sources", "1"),
            answers: match arg(&args, "--kind").unwrap_or("answer") {
                "answer" => true,
                "bind" => false,
                other => panic!("--kind: answer or bind, not {other}"),
            },
            vnis: arg(&args, "--vni-file").map_or_else(
                || vec![1],
                |f| sessions(f).into_iter().map(|(vni, _)| vni).collect(),
            ),
            pps: num(&args, "--pps", "0"),
            duration: seconds,
        }),
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
            eprintln!("usage: udp_gen send --to ADDR [--flows N] [--size B] [--gso N] [--seconds S] [--pps P] [--shape raw|hub|session] [--vni-file FILE] [--first-flow F]\n       udp_gen sink --listen ADDR [--ports N] [--seconds S] [--answer] [--quiet S] [--report-every S]\n       udp_gen probe --to ADDR [--rate R] [--seconds S] [--report-every S] [--shape raw|hub|session] [--vni-file FILE] [--flow F]\n       udp_gen hub-config --flows N --sink ADDR\n       udp_gen flood --to ADDR [--from IPS|PREFIX] [--sources N] [--kind answer|bind] [--vni-file FILE] [--seconds S] [--pps P]");
            std::process::exit(2);
        }
    }
}

/// `--shape` (and `--vni-file` for sessions).
fn shape(args: &[String]) -> Shape {
    match arg(args, "--shape").unwrap_or("raw") {
        "raw" => Shape::Raw,
        "hub" => Shape::Hub,
        "session" => {
            let file = arg(args, "--vni-file").expect("--shape session needs --vni-file");
            Shape::Session(sessions(file))
        }
        other => panic!("--shape: raw, hub or session, not {other}"),
    }
}

/// `--report-every SECONDS`: the period of per-interval reports, if any
/// (more than zero).
fn every(args: &[String]) -> Option<Duration> {
    arg(args, "--report-every").map(|_| {
        let e: f64 = num(args, "--report-every", "0");
        assert!(e > 0.0, "--report-every: more than 0 seconds");
        Duration::from_secs_f64(e)
    })
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

/// Opens flow `flow`'s socket for `shape` (for the hub, after its
/// handshake) and returns it with the header every datagram of the flow
/// starts with: nothing (raw), a transport message's type and receiver
/// index (hub), or the session's data header (session).
fn open_flow(shape: &Shape, to: SocketAddr, flow: u16) -> (UdpSocket, Vec<u8>) {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    match shape {
        Shape::Raw => (socket(any), Vec::new()),
        Shape::Hub => {
            let socket = socket(any);
            let responder = hub_handshake(&socket, to, flow);
            let mut header = vec![wg::TYPE_TRANSPORT, 0, 0, 0];
            header.extend_from_slice(&responder.to_le_bytes());
            (socket, header)
        }
        Shape::Session(s) => {
            let (vni, port) = *s
                .get(usize::from(flow))
                .unwrap_or_else(|| panic!("no session for flow {flow}"));
            let header = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
            (socket(SocketAddr::new(any.ip(), port)), header)
        }
    }
}

/// The spans of `n_msgs * per_msg` datagrams of `size` bytes laid end to
/// end in one buffer, and the messages that send them to `to`, `per_msg`
/// each (a GSO train when more than one).
fn layout(to: SocketAddr, n_msgs: usize, per_msg: usize, size: usize) -> (Vec<Span>, Vec<OutMsg>) {
    // Planned once by the relay's own train builder (trains of `per_msg`,
    // within the kernel's limits), then sent again and again.
    let mut plan = Trains::with_max_segments(per_msg);
    for i in 0..n_msgs * per_msg {
        plan.push(Some(to), i * size, size, size, per_msg > 1);
    }
    (plan.spans().to_vec(), plan.msgs().to_vec())
}

/// One flow: its socket and the datagrams it sends.
struct Flow {
    socket: UdpSocket,
    buf: Vec<u8>,
}

fn send(load: &Load) {
    let size = load.size.max(wg::TRANSPORT_MIN_LEN);
    // With GSO, each message is a train of `per_msg` datagrams; a datagram
    // larger than a frame's segment never travels in one.
    let per_msg = if size > ferry_sys::train::max_segment(Some(load.to)) {
        1
    } else {
        load.gso.clamp(
            1,
            ferry_sys::gso::MAX_SEGMENTS.min(ferry_sys::gso::MAX_GSO_BYTES / size),
        )
    };
    let n_msgs = if per_msg > 1 {
        (MAX_SPANS / per_msg).min(MAX_BATCH)
    } else {
        MAX_BATCH
    };
    let dgrams = n_msgs * per_msg;
    let (spans, msgs) = layout(load.to, n_msgs, per_msg, size);
    let flows: Vec<Flow> = (0..load.flows)
        .map(|i| {
            let flow = load.first_flow + i;
            let mut buf: Vec<u8> = (0..size * dgrams).map(|b| (b % 251) as u8).collect();
            let (socket, header) = open_flow(&load.shape, load.to, flow);
            for (n, d) in buf.chunks_exact_mut(size).enumerate() {
                d[..header.len()].copy_from_slice(&header);
                if matches!(load.shape, Shape::Hub) {
                    d[8..16].copy_from_slice(&(n as u64).to_le_bytes());
                }
            }
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

struct Flood {
    to: SocketAddr,
    /// Local addresses to send from (none: the system's choice).
    from: Vec<IpAddr>,
    /// Sockets per address.
    sources: usize,
    /// Answers (`true`) or binds.
    answers: bool,
    vnis: Vec<u32>,
    pps: u64,
    duration: Duration,
}

/// `--from`: addresses separated by commas, or an IPv4 prefix (every
/// address in it but the first).
fn addresses(text: &str) -> Vec<IpAddr> {
    if let Some((net, bits)) = text.split_once('/') {
        let net: Ipv4Addr = net.parse().unwrap_or_else(|_| panic!("--from: {text}"));
        let bits: u32 = bits.parse().unwrap_or_else(|_| panic!("--from: {text}"));
        assert!((16..=30).contains(&bits), "--from: a prefix of /16 to /30");
        let base = u32::from(net) & (u32::MAX << (32 - bits));
        return (1..(1u32 << (32 - bits)) - 1)
            .map(|i| IpAddr::V4(Ipv4Addr::from(base + i)))
            .collect();
    }
    text.split(',')
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("--from: not an address: {a}"))
        })
        .collect()
}

fn flood(f: &Flood) {
    let any: IpAddr = if f.to.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let from = if f.from.is_empty() {
        vec![any]
    } else {
        f.from.clone()
    };
    let sockets: Vec<UdpSocket> = from
        .iter()
        .flat_map(|&ip| (0..f.sources.max(1)).map(move |_| socket(SocketAddr::new(ip, 0))))
        .collect();
    // One batch of distinct messages, sent again and again: the relay
    // keeps no state for a bind or a failed answer, so repeats cost it
    // what new ones would.
    let kind = if f.answers {
        BindKind::Answer
    } else {
        BindKind::Bind
    };
    let mut buf = Vec::with_capacity(MAX_BATCH * BIND_LEN);
    for i in 0..MAX_BATCH {
        let vni = f.vnis[i % f.vnis.len()];
        let mut m = BindMsg::new(kind, vni, (i & 1) as u8, 1 + i as u32);
        if f.answers {
            m.cookie = [i as u8 ^ 0x5a; 32];
            m.proof = [i as u8 ^ 0xa5; 32];
        }
        buf.extend_from_slice(&m.to_bytes());
    }
    let (spans, msgs) = layout(f.to, MAX_BATCH, 1, BIND_LEN);
    let mut tx = SendBatch::new();
    let mut drain = [0u8; 2048];
    let start = Instant::now();
    let (mut sent, mut errors) = (0u64, 0u64);
    while start.elapsed() < f.duration {
        if f.pps > 0 && sent as f64 >= f.pps as f64 * start.elapsed().as_secs_f64() {
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let mut took = false;
        for s in &sockets {
            match tx.send(s.as_fd(), &buf, &spans, &msgs) {
                Ok(n) => {
                    sent += n as u64;
                    took |= n > 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => errors += 1,
            }
            // Challenges come back for binds: read them away.
            while s.recv_from(&mut drain).is_ok() {}
        }
        if !took {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"flood_sent\":{sent},\"seconds\":{secs:.3},\"pps\":{:.0},\"kind\":\"{}\",\"sockets\":{},\"errors\":{errors}}}",
        sent as f64 / secs,
        if f.answers { "answer" } else { "bind" },
        sockets.len()
    );
}

/// Probe datagrams: the flow's header (up to `PROBE_MAGIC_AT` bytes),
/// then the magic, the sequence number and the send time in nanoseconds
/// since the probe started.
const PROBE_LEN: usize = 64;
const PROBE_MAGIC_AT: usize = 16;
const PROBE_MAGIC: [u8; 8] = *b"FRYPROBE";

fn is_probe(d: &[u8]) -> bool {
    d.len() == PROBE_LEN && d[PROBE_MAGIC_AT..PROBE_MAGIC_AT + 8] == PROBE_MAGIC
}

/// Count, p50, p99 and maximum of round-trip times in microseconds, as JSON.
fn rtt_json(rtts: &mut [u32]) -> String {
    rtts.sort_unstable();
    let at = |q: f64| {
        if rtts.is_empty() {
            0
        } else {
            rtts[((rtts.len() - 1) as f64 * q).round() as usize]
        }
    };
    format!(
        "{{\"count\":{},\"p50\":{},\"p99\":{},\"max\":{}}}",
        rtts.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

struct Probe {
    to: SocketAddr,
    flow: u16,
    rate: f64,
    shape: Shape,
    duration: Duration,
    report_every: Option<Duration>,
}

/// A low-rate flow of timestamped datagrams through the relay, echoed by
/// the sink: round-trip times per interval (one JSON line each with
/// `--report-every`) and in all (the last line).
fn probe(p: &Probe) {
    let (socket, header) = open_flow(&p.shape, p.to, p.flow);
    assert!(
        header.len() <= PROBE_MAGIC_AT,
        "header too long for a probe"
    );
    socket.set_nonblocking(false).expect("blocking");
    let period = Duration::from_secs_f64(1.0 / p.rate.max(0.1));
    let start = Instant::now();
    let end = start + p.duration;
    let mut out = [0u8; PROBE_LEN];
    out[..header.len()].copy_from_slice(&header);
    out[PROBE_MAGIC_AT..PROBE_MAGIC_AT + 8].copy_from_slice(&PROBE_MAGIC);
    let (mut sent, mut received, mut sent_at_report) = (0u64, 0u64, 0u64);
    let mut received_at_report = 0u64;
    let (mut all, mut interval) = (Vec::new(), Vec::new());
    let mut next_send = start;
    let mut next_report = p.report_every.map(|e| (1u64, start + e));
    let mut buf = [0u8; 2048];
    // Echoes may come back for up to a second after the last send.
    while Instant::now() < end + Duration::from_secs(1) {
        let now = Instant::now();
        if now >= next_send && now < end {
            out[PROBE_MAGIC_AT + 8..PROBE_MAGIC_AT + 16].copy_from_slice(&sent.to_le_bytes());
            let t = now.duration_since(start).as_nanos() as u64;
            out[PROBE_MAGIC_AT + 16..PROBE_MAGIC_AT + 24].copy_from_slice(&t.to_le_bytes());
            if socket.send_to(&out, p.to).is_ok() {
                sent += 1;
            }
            next_send += period;
        }
        if let Some((k, at)) = next_report {
            if now >= at {
                println!(
                    "{{\"interval\":{k},\"t_s\":{:.3},\"sent\":{},\"received\":{},\"rtt_us\":{}}}",
                    at.duration_since(start).as_secs_f64(),
                    sent - sent_at_report,
                    received - received_at_report,
                    rtt_json(&mut interval)
                );
                interval.clear();
                (sent_at_report, received_at_report) = (sent, received);
                next_report = p.report_every.map(|e| (k + 1, at + e));
            }
        }
        let mut wake = if now < end {
            next_send
        } else {
            end + Duration::from_secs(1)
        };
        if let Some((_, at)) = next_report {
            wake = wake.min(at);
        }
        let wait = wake.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            continue;
        }
        socket.set_read_timeout(Some(wait)).expect("read timeout");
        if let Ok(n) = socket.recv(&mut buf) {
            let got = Instant::now().duration_since(start).as_nanos() as u64;
            if is_probe(&buf[..n]) {
                let mut t = [0u8; 8];
                t.copy_from_slice(&buf[PROBE_MAGIC_AT + 16..PROBE_MAGIC_AT + 24]);
                let rtt = (got.saturating_sub(u64::from_le_bytes(t)) / 1000) as u32;
                interval.push(rtt);
                all.push(rtt);
                received += 1;
            }
        }
    }
    println!(
        "{{\"sent\":{sent},\"received\":{received},\"lost\":{},\"rtt_us\":{}}}",
        sent.saturating_sub(received),
        rtt_json(&mut all)
    );
}

struct Sink {
    at: SocketAddr,
    ports: u16,
    answer: bool,
    duration: Duration,
    /// Stop this long after the last data datagram.
    quiet: Duration,
    report_every: Option<Duration>,
}

/// What the sink has counted so far.
#[derive(Default, Clone, Copy)]
struct Counts {
    packets: u64,
    bytes: u64,
    echoed: u64,
}

fn sink(k: &Sink) {
    let mut poll = mio::Poll::new().expect("poll");
    let mut sockets: Vec<mio::net::UdpSocket> = (0..k.ports.max(1))
        .map(|i| {
            let s = socket(SocketAddr::new(k.at.ip(), k.at.port() + i));
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
    let deadline = Instant::now() + k.duration;
    let mut c = Counts::default();
    let mut drops: HashMap<usize, u32> = HashMap::new();
    let total_drops = |d: &HashMap<usize, u32>| d.values().map(|&d| u64::from(d)).sum::<u64>();
    let mut answered = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    // Per-interval reports, from the first datagram (data or probe) on.
    let mut report: Option<(u64, Instant, Counts)> = None;
    loop {
        let now = Instant::now();
        if let (Some(e), Some((n, at, before))) = (k.report_every, report) {
            if now >= at {
                let secs = e.as_secs_f64();
                println!(
                    "{{\"interval\":{n},\"packets\":{},\"bytes\":{},\"pps\":{:.0},\"mbits\":{:.1},\"probes_echoed\":{},\"sink_drops\":{}}}",
                    c.packets - before.packets,
                    c.bytes - before.bytes,
                    (c.packets - before.packets) as f64 / secs,
                    (c.bytes - before.bytes) as f64 * 8.0 / 1e6 / secs,
                    c.echoed - before.echoed,
                    total_drops(&drops)
                );
                report = Some((n + 1, at + e, c));
            }
        }
        if now >= deadline || first.is_some_and(|_| now.duration_since(last) > k.quiet) {
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
                if report.is_none() {
                    report = k.report_every.map(|e| (1, now + e, c));
                }
                for (m, d) in meta[..n].iter().zip(buf.chunks_exact_mut(slot)) {
                    if let Some(d) = m.drops {
                        drops.insert(i, d);
                    }
                    let d = &mut d[..m.len];
                    if k.answer && m.len == wg::INITIATION_LEN {
                        if let (Ok(Message::Initiation { sender }), Some(src)) =
                            (wg::classify(d), m.src)
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
                    // Probes (GRO may have joined several of one flow).
                    let seg = if m.segment == 0 { m.len } else { m.segment };
                    if let (true, Some(src)) = (seg == PROBE_LEN && is_probe(&d[..seg]), m.src) {
                        for p in d.chunks_exact_mut(PROBE_LEN).filter(|p| is_probe(p)) {
                            // Back the way it came; through the hub, as a
                            // transport message to the initiator's index.
                            if k.answer {
                                p[4..8].copy_from_slice(&index(Side::A, i as u16).to_le_bytes());
                            }
                            let _ = s.send_to(p, src);
                            c.echoed += 1;
                        }
                        continue;
                    }
                    first.get_or_insert(now);
                    last = now;
                    c.packets += m.len.div_ceil(m.segment.max(1)) as u64;
                    c.bytes += m.len as u64;
                }
            }
        }
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let rate = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    println!(
        "{{\"packets\":{},\"bytes\":{},\"seconds\":{secs:.3},\"pps\":{:.0},\"mbits\":{:.1},\"sink_drops\":{},\"handshakes_answered\":{answered},\"probes_echoed\":{}}}",
        c.packets,
        c.bytes,
        rate(c.packets as f64),
        rate(c.bytes as f64 * 8.0 / 1e6),
        total_drops(&drops),
        c.echoed
    );
}
