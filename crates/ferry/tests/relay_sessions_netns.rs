//! Relay sessions across network namespaces (`docs/relay-sessions.md`):
//! the real `ferry` in namespace R, SDK peers A and B in their
//! own namespaces, an attacker in a fourth, M, on the relay's side.
//!
//! ```text
//!   A 10.79.1.2 ──┐
//!   B 10.79.2.2 ──┤ R 10.79.{1,2,3}.1: routes between all three;
//!   M 10.79.3.2 ──┘   ferry: DERP :3340, sessions :3478, metrics 127.0.0.1:9100
//! ```
//!
//! R routes, so only nftables in A and B keeps the peers apart: each lets
//! out TCP and UDP to the relay and nothing else, and counts the UDP it
//! drops towards the other peer. M has no firewall and reaches everyone.
//!
//! 1. A and B connect over DERP, get a session, bind it with the SDK's
//!    `Binder` and exchange datagrams both ways through it.
//! 2. M attacks it, first from its own address (a bind for A's session id
//!    draws a challenge no larger than the bind; an answer with a wrong
//!    proof; M's own cookie answered from another port; data with a wrong
//!    id; data with A's id), then with forged source addresses from a raw
//!    socket (`IPPROTO_RAW`): a bind in A's name (the challenge goes to A,
//!    M gets nothing), M's cookie answered in A's name, data from A's
//!    address on another port. Each one is dropped and counted by its
//!    reason and nothing else moves; the peers' exchange goes on. The one
//!    thing the relay cannot refuse is data forged with A's exact address
//!    and port and the session's id: it forwards it to B, as every relay
//!    that forwards by address does; the test shows that, so the limit is
//!    in sight (the peers authenticate their own traffic, e.g. WireGuard).
//! 3. With `--relay-idle-timeout 2s`, traffic every 400 ms keeps the
//!    session past the timeout; once traffic stops it is freed (not before
//!    the timeout) and a datagram on its old id is dropped as unknown.
//!
//! Needs root, `ip` and `nft`; without them it says why and passes, except
//! under CI=true, where it fails.

mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_client::DerpClient;
use ferry_proto::key::NodePrivate;
use ferry_proto::relay_session::{BindKind, BindMsg, Binder, BIND_LEN};
use support::sessions::{data, offer, options};
use support::{get, url_addr, Ferry, TempDir, T};

const DERP_PORT: u16 = 3340;
const RELAY_PORT: u16 = 3478;
const METRICS: &str = "127.0.0.1:9100";
const IDLE: Duration = Duration::from_secs(2);

fn ip4(net: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 79, net, host)
}

/// Runs a command to completion; panics with its output if it fails.
fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `program` with `input` on its standard input inside namespace `ns`.
fn sh_in_with_input(ns: &str, program: &str, args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("ip netns exec starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} in {ns}: {}\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Why this test cannot run here, if it cannot.
fn why_not() -> Option<String> {
    if !ferry_sys::is_root() {
        return Some("not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("missing tool: {tool}"));
        }
    }
    let probe = format!("fsn-probe-{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        return Some("cannot create network namespaces".into());
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    None
}

/// The namespaces of one run, named `fsn-<pid>-<role>`, deleted on drop
/// (their veths go with them), also when the test fails.
struct Namespaces(Vec<String>);

impl Namespaces {
    fn add(&mut self, role: &str) -> String {
        let name = format!("fsn-{}-{role}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        sh("ip", &["netns", "add", &name]);
        self.0.push(name.clone());
        sh("ip", &["-n", &name, "link", "set", "lo", "up"]);
        name
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// A veth pair from R (`r_addr/24`) to `peer` (`p_addr/24`, default route
/// via R).
fn link(r: &str, peer: &str, net: u8) {
    let tag = peer.rsplit('-').next().unwrap();
    let (ri, pi) = (
        format!("s{}r{tag}", std::process::id()),
        format!("s{}{tag}r", std::process::id()),
    );
    sh(
        "ip",
        &[
            "link", "add", &ri, "netns", r, "type", "veth", "peer", "name", &pi, "netns", peer,
        ],
    );
    let (ra, pa) = (format!("{}/24", ip4(net, 1)), format!("{}/24", ip4(net, 2)));
    sh("ip", &["-n", r, "addr", "add", &ra, "dev", &ri]);
    sh("ip", &["-n", peer, "addr", "add", &pa, "dev", &pi]);
    sh("ip", &["-n", r, "link", "set", &ri, "up"]);
    sh("ip", &["-n", peer, "link", "set", &pi, "up"]);
    let gw = ip4(net, 1).to_string();
    sh("ip", &["-n", peer, "route", "add", "default", "via", &gw]);
}

/// A thread inside one namespace, running a current-thread tokio runtime
/// until dropped: futures given to [`Ns::run`] make their sockets there.
struct Ns {
    name: String,
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ns {
    fn new(name: &str) -> Ns {
        let path = ferry_sys::netns::named(name);
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            ferry_sys::netns::enter(&path).expect("entering the namespace");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            handle_tx.send(rt.handle().clone()).unwrap();
            rt.block_on(async {
                let _ = stopped.await;
            });
        });
        let handle = handle_rx.recv_timeout(T).expect("namespace thread up");
        Ns {
            name: name.to_owned(),
            handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Runs `f` on the namespace's thread and waits for it (bounded).
    fn run<R: Send + 'static>(&self, f: impl Future<Output = R> + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv_timeout(T)
            .unwrap_or_else(|_| panic!("a task in {} within {T:?}", self.name))
    }

    /// A UDP socket on any address and a port the system picks, with reads
    /// bounded by [`T`].
    fn udp(&self) -> UdpSocket {
        let s = self.run(async { UdpSocket::bind("0.0.0.0:0").unwrap() });
        s.set_read_timeout(Some(T)).unwrap();
        s
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// nftables in a peer's namespace: out only to the relay (TCP and UDP)
/// and loopback; UDP to the other peer's network is dropped and counted
/// (`peer_udp`).
fn firewall(ns: &str, relay: Ipv4Addr, other_peer_net: u8) {
    let rules = format!(
        "table inet fsn {{
  counter peer_udp {{}}
  chain output {{
    type filter hook output priority 0; policy drop;
    oifname \"lo\" accept
    ip daddr 10.79.{other_peer_net}.0/24 meta l4proto udp counter name peer_udp drop
    ip daddr {relay} meta l4proto {{ tcp, udp }} accept
  }}
}}
"
    );
    sh_in_with_input(ns, "nft", &["-f", "-"], &rules);
}

fn peer_udp_drops(ns: &str) -> u64 {
    let out = sh(
        "ip",
        &[
            "netns", "exec", ns, "nft", "list", "counter", "inet", "fsn", "peer_udp",
        ],
    );
    let mut words = out.split_whitespace();
    words.find(|w| *w == "packets");
    words
        .next()
        .and_then(|n| n.parse().ok())
        .expect("packets N")
}

/// The relay's `ferry_udp_relay_session*` series, by name with labels.
fn counters(r: &Ns, metrics: SocketAddr) -> BTreeMap<String, u64> {
    let page = r.run(async move { get(metrics, "/metrics") });
    let body = page.split_once("\r\n\r\n").map_or(&page[..], |(_, b)| b);
    ferry_testkit::metrics::Scrape::parse(body)
        .series_with_prefix("ferry_udp_relay_session")
        .into_iter()
        .map(|(k, v)| (k, v as u64))
        .collect()
}

fn drop_series(reason: &str) -> String {
    format!("ferry_udp_relay_session_drops_total{{reason=\"{reason}\"}}")
}

fn event_series(event: &str) -> String {
    format!("ferry_udp_relay_session_events_total{{event=\"{event}\"}}")
}

const FORWARDED: &str = "ferry_udp_relay_session_forwarded_total";
const FORWARDED_BYTES: &str = "ferry_udp_relay_session_forwarded_bytes_total";
const BOUND: &str = "ferry_udp_relay_sessions{state=\"bound\"}";

/// The relay's counters as last checked, and where to read them.
struct Watch<'a> {
    r: &'a Ns,
    metrics: SocketAddr,
    seen: BTreeMap<String, u64>,
}

impl<'a> Watch<'a> {
    fn new(r: &'a Ns, metrics: SocketAddr) -> Watch<'a> {
        let seen = counters(r, metrics);
        Watch { r, metrics, seen }
    }

    fn read(&self) -> BTreeMap<String, u64> {
        counters(self.r, self.metrics)
    }

    /// Waits (bounded) until each series in `changes` has moved by its
    /// amount since the last check, then checks that it moved by exactly
    /// that and that no other series moved.
    fn moved(&mut self, changes: &[(&str, i64)], what: &str) {
        let mut want = self.seen.clone();
        for (k, d) in changes {
            let v = want.get_mut(*k).unwrap_or_else(|| panic!("no series {k}"));
            *v = v.checked_add_signed(*d).unwrap();
        }
        let deadline = Instant::now() + T;
        loop {
            let now = self.read();
            let arrived = changes.iter().all(|(k, d)| match d.signum() {
                1 => now[*k] >= want[*k],
                _ => now[*k] <= want[*k],
            });
            if arrived {
                let moved: Vec<_> = now
                    .iter()
                    .filter(|(k, v)| want.get(*k) != Some(v))
                    .map(|(k, v)| {
                        format!(
                            "{k}: {:?} -> {v}, expected {:?}",
                            self.seen.get(k),
                            want.get(k)
                        )
                    })
                    .collect();
                assert!(moved.is_empty(), "{what}: unexpected counters:\n{moved:#?}");
                self.seen = now;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: counters stay at {now:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One datagram dropped for `reason`, nothing else moved.
    fn dropped(&mut self, reason: &str, what: &str) {
        self.moved(&[(&drop_series(reason), 1)], what);
    }
}

fn recv(sock: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    let mut buf = [0u8; 1500];
    let (n, from) = sock.recv_from(&mut buf).expect("a datagram within T");
    (buf[..n].to_vec(), from)
}

/// Nothing is queued on `sock` (checked after the relay counted what
/// would have caused it).
fn nothing_queued(sock: &UdpSocket, who: &str) {
    sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1500];
    let got = sock.recv_from(&mut buf);
    sock.set_nonblocking(false).unwrap();
    match got {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("{who} got {other:?}"),
    }
}

/// Binds with `b` over `sock`: bind, challenge, answer, bound. The veths
/// lose nothing, so no retransmission is needed; each reply is awaited for
/// at most [`T`].
fn bind(sock: &UdpSocket, b: &mut Binder) {
    for _ in 0..2 {
        let msg = b.poll_transmit(Instant::now()).expect("a bind message due");
        sock.send_to(&msg, b.relay()).unwrap();
        let (reply, _) = recv(sock);
        assert!(b.handle(Instant::now(), &reply), "a bind reply");
    }
    assert!(b.is_bound(), "bound after bind and answer");
}

/// An IPv4 datagram from `src` (any address, not M's) to `dst` carrying
/// `payload` over UDP, for a raw socket that writes its own IP header.
fn forged(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut p = Vec::with_capacity(total);
    // Version 4, 20-byte header; length; id 0 (the kernel picks one);
    // don't fragment; TTL 64; UDP; checksum 0 (the kernel fills it in).
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&src.ip().octets());
    p.extend_from_slice(&dst.ip().octets());
    let udp_start = p.len();
    p.extend_from_slice(&src.port().to_be_bytes());
    p.extend_from_slice(&dst.port().to_be_bytes());
    p.extend_from_slice(&(udp_len as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    // The UDP checksum over the pseudo-header and the datagram.
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.ip().octets());
    add(&dst.ip().octets());
    add(&[0, 17]);
    add(&(udp_len as u16).to_be_bytes());
    add(&p[udp_start..]);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let c = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    p[udp_start + 6..udp_start + 8].copy_from_slice(&c.to_be_bytes());
    p
}

/// A raw socket in M that sends IPv4 datagrams with headers it writes.
struct Forger(socket2::Socket);

impl Forger {
    fn new(m: &Ns) -> Forger {
        Forger(m.run(async {
            socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::RAW,
                Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
            )
            .expect("a raw socket (CAP_NET_RAW)")
        }))
    }

    fn send(&self, src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) {
        let p = forged(src, dst, payload);
        let n = self.0.send_to(&p, &SocketAddr::V4(dst).into()).unwrap();
        assert_eq!(n, p.len());
    }
}

#[test]
fn sessions_across_namespaces_shrug_off_a_third_namespace_and_expire_when_idle() {
    if let Some(why) = why_not() {
        return ferry_testkit::skip!("relay sessions in namespaces: {why}");
    }
    let mut names = Namespaces(Vec::new());
    let (r_name, a_name, b_name, m_name) = (
        names.add("r"),
        names.add("a"),
        names.add("b"),
        names.add("m"),
    );
    let (r, a, b, m) = (
        Ns::new(&r_name),
        Ns::new(&a_name),
        Ns::new(&b_name),
        Ns::new(&m_name),
    );
    // R routes between everyone and does not check sources (set before
    // its interfaces exist, which take the defaults): the relay's own
    // checks are what is tested, not the kernel's.
    r.run(async {
        for (knob, v) in [
            ("ip_forward", "1"),
            ("conf/all/rp_filter", "0"),
            ("conf/default/rp_filter", "0"),
        ] {
            // /proc/sys/net is the writing thread's namespace's.
            std::fs::write(format!("/proc/sys/net/ipv4/{knob}"), v).unwrap();
        }
    });
    for (peer, net) in [(&a_name, 1), (&b_name, 2), (&m_name, 3)] {
        link(&r_name, peer, net);
    }
    firewall(&a_name, ip4(1, 1), 2);
    firewall(&b_name, ip4(2, 1), 1);

    let dir = TempDir::new("relay-sessions-netns");
    let idle = format!("{}s", IDLE.as_secs());
    let mut server = Ferry::spawn(
        Command::new("ip")
            .args(["netns", "exec", &r_name, env!("CARGO_BIN_EXE_ferry")])
            .env_remove("FERRY_LOG")
            .stdin(Stdio::null())
            .args(["-a", &format!("0.0.0.0:{DERP_PORT}"), "--stun=false"])
            .args(["--workers", "2", "-c", &dir.path("ferry.key")])
            .args(["--metrics-addr", METRICS])
            .args(["--relay-port", &RELAY_PORT.to_string()])
            .args(["--relay-idle-timeout", &idle]),
    );
    server.wait_log("relay sessions on");
    let metrics = url_addr(&server.field("ferry relay running", "metrics"));
    let main = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // The peers' UDP sockets. M reaches B directly (R routes), A cannot:
    // its firewall refuses and counts it.
    let (ua, ub) = (a.udp(), b.udp());
    let a_addr = SocketAddrV4::new(ip4(1, 2), ua.local_addr().unwrap().port());
    let b_addr = SocketAddrV4::new(ip4(2, 2), ub.local_addr().unwrap().port());
    let um = m.udp();
    um.send_to(b"direct from M", b_addr).unwrap();
    assert_eq!(recv(&ub).0, b"direct from M");
    let refused = ua.send_to(b"direct from A", b_addr).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::PermissionDenied, "{refused}");
    assert_eq!(peer_udp_drops(&a_name), 1);

    // 1. A session over DERP, bound from both peers, both ways.
    let url = |net: u8| format!("http://{}:{DERP_PORT}/derp", ip4(net, 1));
    let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
    let (url_a, key_a) = (url(1), ka.clone());
    let mut ca = a
        .run(async move { DerpClient::connect(&url_a, key_a, options(true)).await })
        .expect("A connects over DERP");
    let (url_b, key_b) = (url(2), kb.clone());
    let mut cb = b
        .run(async move { DerpClient::connect(&url_b, key_b, options(true)).await })
        .expect("B connects over DERP");
    main.block_on(ca.allocate(&kb.public())).unwrap();
    let (oa, ob) = main.block_on(async { (offer(&mut ca).await, offer(&mut cb).await) });
    assert_eq!((oa.slot, ob.slot, oa.vni), (0, 1, ob.vni));
    let relay_a = ca.relay_endpoint(&oa).unwrap();
    let relay_b = cb.relay_endpoint(&ob).unwrap();
    assert_eq!(relay_a, SocketAddr::from((ip4(1, 1), RELAY_PORT)));
    assert_eq!(relay_b, SocketAddr::from((ip4(2, 1), RELAY_PORT)));
    bind(&ua, &mut Binder::new(&oa, relay_a, 1, Instant::now()));
    bind(&ub, &mut Binder::new(&ob, relay_b, 1, Instant::now()));
    let vni = oa.vni;
    let mut watch = Watch::new(&r, metrics);
    let exchange = |tag: u8| {
        let d = data(vni, &[tag; 100]);
        ua.send_to(&d, relay_a).unwrap();
        assert_eq!(recv(&ub), (d, relay_b));
        let back = data(vni, &[!tag; 1200]);
        ub.send_to(&back, relay_b).unwrap();
        assert_eq!(recv(&ua), (back, relay_a));
    };
    for i in 0..10 {
        exchange(i);
    }
    let bytes = 10 * (108 + 1208);
    watch.moved(&[(FORWARDED, 20), (FORWARDED_BYTES, bytes)], "the exchange");
    assert_eq!(watch.seen[BOUND], 1);

    // 2. M, from its own address. A bind for A's session id and slot: a
    //    challenge to M, no larger than the bind, and no state.
    let relay_m = SocketAddrV4::new(ip4(3, 1), RELAY_PORT);
    let mut bm = Binder::new(&oa, SocketAddr::V4(relay_m), 7, Instant::now());
    let bind_msg = bm.poll_transmit(Instant::now()).unwrap();
    um.send_to(&bind_msg, relay_m).unwrap();
    let (challenge, _) = recv(&um);
    assert_eq!(challenge.len(), BIND_LEN);
    assert!(challenge.len() <= bind_msg.len());
    let challenge_msg = BindMsg::parse(&challenge).unwrap();
    assert_eq!(challenge_msg.kind, BindKind::Challenge);
    watch.moved(&[(&event_series("challenged"), 1)], "M's bind");
    // Its answer: the cookie is good for M's address, the proof is not
    // (M does not have A's bind token).
    let mut answer = BindMsg {
        cookie: challenge_msg.cookie,
        proof: [0x5a; 32],
        ..BindMsg::new(BindKind::Answer, vni, 0, 7)
    };
    um.send_to(&answer.to_bytes(), relay_m).unwrap();
    watch.dropped("bad_proof", "a wrong proof");
    // The cookie M got, answered from another of M's ports.
    let um2 = m.udp();
    um2.send_to(&answer.to_bytes(), relay_m).unwrap();
    watch.dropped("bad_cookie", "a cookie from another address");
    // A bind for a session that does not exist: nothing back.
    let unknown = BindMsg::new(BindKind::Bind, vni ^ 0x40, 0, 1).to_bytes();
    um.send_to(&unknown, relay_m).unwrap();
    watch.dropped("unknown_vni", "a bind for an unknown id");
    // Data with a wrong id, then with A's id from M's address.
    um.send_to(&data(vni ^ 0x1, b"wrong id"), relay_m).unwrap();
    watch.dropped("unknown_vni", "data with a wrong id");
    um.send_to(&data(vni, b"from M"), relay_m).unwrap();
    watch.dropped("wrong_source", "data with A's id from M");
    um.send_to(b"not a session datagram", relay_m).unwrap();
    watch.dropped("bad_header", "garbage");

    // M with forged sources. A bind in A's name: the challenge goes to A
    // (the same size), M gets nothing.
    let forger = Forger::new(&m);
    forger.send(a_addr, relay_m, &bind_msg);
    // (From the relay's address on A's side: the session socket listens on
    // every address and the kernel picks the source by route.)
    let (to_a, from) = recv(&ua);
    assert_eq!(from, relay_a);
    assert_eq!(to_a.len(), bind_msg.len());
    let to_a = BindMsg::parse(&to_a).unwrap();
    assert_eq!(
        (to_a.kind, to_a.vni, to_a.generation),
        (BindKind::Challenge, vni, 7)
    );
    assert_ne!(
        to_a.cookie, challenge_msg.cookie,
        "the cookie names the address"
    );
    watch.moved(
        &[(&event_series("challenged"), 1)],
        "a bind forged in A's name",
    );
    // M's own cookie, answered in A's name (a replay from another source).
    forger.send(a_addr, relay_m, &answer.to_bytes());
    watch.dropped("bad_cookie", "M's cookie in A's name");
    // Even with the cookie the relay sent to A (which M never sees; the
    // test hands it over) the proof is M's guess.
    answer.cookie = to_a.cookie;
    forger.send(a_addr, relay_m, &answer.to_bytes());
    watch.dropped("bad_proof", "A's cookie with a forged proof");
    // Data from A's address, another port.
    let a_other = SocketAddrV4::new(*a_addr.ip(), a_addr.port() ^ 0x0101);
    forger.send(a_other, relay_m, &data(vni, b"A's address, not its port"));
    watch.dropped("wrong_source", "data from A's address on another port");
    // None of it reached the peers or came back to M, and the session is
    // as it was: A and B still talk, only to each other.
    exchange(0xa0);
    nothing_queued(&ua, "A");
    nothing_queued(&ub, "B");
    nothing_queued(&um, "M");
    nothing_queued(&um2, "M's second socket");
    watch.moved(
        &[(FORWARDED, 2), (FORWARDED_BYTES, 108 + 1208)],
        "the exchange after the attacks",
    );
    // The limit: A's exact address and port with the session's id is, to
    // the relay, A. It forwards it to B like any of A's datagrams.
    let spoofed = data(vni, b"forged with A's address and port");
    forger.send(a_addr, relay_m, &spoofed);
    assert_eq!(recv(&ub), (spoofed.clone(), relay_b));
    watch.moved(
        &[(FORWARDED, 1), (FORWARDED_BYTES, spoofed.len() as i64)],
        "data forged with A's exact address",
    );
    nothing_queued(&ua, "A");

    // 3. Idle expiry. Traffic every 400 ms keeps the session for longer
    //    than the idle timeout...
    let start = Instant::now();
    let mut rounds = 0;
    let mut last_sent;
    loop {
        assert!(rounds < 20, "keep-alive rounds");
        rounds += 1;
        let d = data(vni, b"keep-alive");
        last_sent = Instant::now();
        ua.send_to(&d, relay_a).unwrap();
        assert_eq!(recv(&ub).0, d);
        if start.elapsed() >= IDLE + IDLE / 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(400));
    }
    // (Read at once, well within the idle timeout of the last datagram:
    // still bound, nothing freed.)
    watch.moved(
        &[(FORWARDED, rounds), (FORWARDED_BYTES, rounds * (8 + 10))],
        "keep-alive",
    );
    // ...and once it stops, the session is freed, not before the timeout.
    watch.moved(
        &[(BOUND, -1), (&event_series("freed_idle"), 1)],
        "idle expiry",
    );
    let freed_after = last_sent.elapsed();
    assert!(
        freed_after >= IDLE,
        "freed {freed_after:?} after the last datagram"
    );
    for state in ["allocated", "half_bound", "bound"] {
        let series = format!("ferry_udp_relay_sessions{{state=\"{state}\"}}");
        assert_eq!(watch.seen[&series], 0, "{series}");
    }
    // A datagram on the old id is unknown now, and B gets nothing.
    ua.send_to(&data(vni, b"too late"), relay_a).unwrap();
    watch.dropped("unknown_vni", "data on an expired session");
    nothing_queued(&ub, "B");
    eprintln!("session freed {freed_after:?} after the last datagram (idle timeout {IDLE:?})");

    drop((ca, cb));
    server.stop();
}
