//! README claims about the DERP server's flags and signals, through the
//! built binary: a SIGTERM delivers what was queued before `restarting`
//! and exits 0; the port-80 companion; `--home`; `--derp=false`; `--ktls
//! on` without the kernel's TLS; the `--dev` banner's DERP map; restarts
//! on a socket from the service manager, where a draining process leaves
//! new connections to the next one; `--stun=false`,
//! `--tcp-keepalive-time`, `--tcp-user-timeout`, `--pin`; manual
//! certificates picked up by the 30-second reload thread.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferry_proto::client::{Client, Config, Event};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_testkit::metrics::Scrape;
use support::{derp_server, ferry, free_tcp_port, get, run, serving, url_addr, Ferry, TempDir, T};

/// A blocking DERP client over plain TCP (or TLS: [`Derp::tls`]), driven
/// by `proto::client`.
struct Derp<S: Read + Write = TcpStream> {
    sock: S,
    client: Client,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl Derp {
    fn connect(addr: SocketAddr, key: NodePrivate, rcvbuf: Option<usize>) -> Derp {
        let sock = match rcvbuf {
            // A small receive buffer, set before the handshake, so that
            // what this client does not read stays queued in the relay.
            Some(n) => {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                s.set_recv_buffer_size(n).unwrap();
                s.connect_timeout(&addr.into(), T).unwrap();
                s.into()
            }
            None => TcpStream::connect_timeout(&addr, T).unwrap(),
        };
        Derp::handshake(sock, addr, key)
    }

    /// The DERP handshake over a connected socket.
    fn handshake(sock: TcpStream, addr: SocketAddr, key: NodePrivate) -> Derp {
        sock.set_read_timeout(Some(T)).unwrap();
        Derp::over(sock, &addr.to_string(), key)
    }

    /// A client over TLS to `addr` (named `host`) that trusts only the
    /// certificate in the PEM file `ca`.
    fn tls(
        addr: SocketAddr,
        host: &str,
        ca: &str,
        key: NodePrivate,
    ) -> Derp<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
        let pem = std::fs::read(ca).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(pem.contents))
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
        let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        let sock = TcpStream::connect_timeout(&addr, T).unwrap();
        sock.set_read_timeout(Some(T)).unwrap();
        Derp::over(rustls::StreamOwned::new(conn, sock), host, key)
    }
}

impl<S: Read + Write> Derp<S> {
    /// Runs the DERP handshake over `sock`, up to serverInfo.
    fn over(sock: S, host: &str, key: NodePrivate) -> Derp<S> {
        let nonce = ferry_proto::nacl::random_nonce();
        let client = Client::new(Config::new(key, host), Instant::now(), nonce).unwrap();
        let mut d = Derp {
            sock,
            client,
            out: Vec::new(),
            buf: vec![0; 64 * 1024],
        };
        let events = d.read_until(|e| matches!(e, Event::Connected { .. }));
        assert!(
            matches!(events.last(), Some(Event::Connected { .. })),
            "{events:?}"
        );
        d
    }

    /// Sends one packet to `dst`.
    fn send(&mut self, dst: &NodePublic, packet: &[u8]) {
        self.client.send_packet(&mut self.out, dst, packet).unwrap();
        self.flush();
    }

    /// The next packet: (source, bytes).
    fn recv_packet(&mut self) -> (NodePublic, Vec<u8>) {
        let events = self.read_until(|e| matches!(e, Event::Packet { .. }));
        match events.into_iter().last() {
            Some(Event::Packet { src, packet }) => (src, packet.to_vec()),
            other => panic!("no packet: the connection ended with {other:?}"),
        }
    }

    fn flush(&mut self) {
        self.client.poll_transmit(&mut self.out);
        self.sock.write_all(&self.out).unwrap();
        self.out.clear();
    }

    /// Reads events until `stop` says so or the server closes.
    fn read_until(&mut self, mut stop: impl FnMut(&Event) -> bool) -> Vec<Event> {
        let mut events = Vec::new();
        let deadline = Instant::now() + T;
        loop {
            self.flush();
            assert!(Instant::now() < deadline, "no end within {T:?}");
            let n = self.sock.read(&mut self.buf).unwrap();
            let mut done = false;
            if n == 0 {
                self.client
                    .handle_eof(|e| events.push(e.into_owned()))
                    .unwrap();
                return events;
            }
            self.client
                .handle_bytes(Instant::now(), &self.buf[..n], |e| {
                    let e = e.into_owned();
                    done |= stop(&e);
                    events.push(e);
                })
                .unwrap();
            if done {
                return events;
            }
        }
    }
}

/// The sum of a metric's series, whatever their labels; a metric that is
/// not there fails the test.
fn metric(addr: SocketAddr, name: &str) -> f64 {
    Scrape::fetch(addr, "/debug/varz").family(name)
}

/// Waits (bounded) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {T:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `a` sends `n` numbered packets of `size` bytes to `to` (from a thread:
/// the relay may pause it) until the relay on `addr` has read them all.
fn send_numbered(mut a: Derp, addr: SocketAddr, to: NodePublic, n: usize, size: usize) -> Derp {
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            let mut p = vec![0u8; size];
            p[..4].copy_from_slice(&(i as u32).to_be_bytes());
            a.client.send_packet(&mut a.out, &to, &p).unwrap();
            if a.out.len() > 64 * 1024 {
                a.flush();
            }
        }
        a.flush();
        a
    });
    eventually("the relay read all of A's packets", || {
        metric(addr, "derp_packets_received") >= n as f64
    });
    sender.join().unwrap()
}

/// "Ctrl-C (or SIGTERM) shuts down gracefully: every client gets a
/// `restarting` frame and queued packets drain first."
#[test]
fn sigterm_delivers_what_was_queued_then_restarting_then_exits_0() {
    const N: usize = 3000;
    const SIZE: usize = 1000;
    let dir = TempDir::new("drain");
    let (f, addr) = serving(&mut derp_server(&dir, &[]));
    let bk = NodePrivate::generate();
    let b_key: NodePublic = bk.public();
    let mut b = Derp::connect(addr, bk, Some(4096));
    let a = Derp::connect(addr, NodePrivate::generate(), None);
    let a_key = a.client.public_key();
    // A sends N numbered packets to B, which reads nothing: they pile up
    // in the relay (A is paused while B's queue is over its cap; past the
    // backpressure budget, B's queue drops new packets over the cap).
    let mut a = send_numbered(a, addr, b_key, N, SIZE);
    let dropped = metric(addr, "derp_packets_dropped");
    let queued = metric(addr, "ferry_queued_bytes");
    assert!(
        queued > 0.0,
        "nothing queued in the relay: the test would prove nothing"
    );
    let expect = N - dropped as usize;

    f.signal(libc::SIGTERM);
    // Everything up to the end of the connection: the queued packets,
    // then `restarting` (and then, as A leaves during the drain, peerGone
    // for A), then the close.
    let events = b.read_until(|_| false);
    let restarting = events
        .iter()
        .position(|e| matches!(e, Event::Restarting { .. }))
        .expect("a restarting frame");
    let packets: Vec<u32> = events[..restarting]
        .iter()
        .filter_map(|e| match e {
            Event::Packet { src, packet } => {
                assert_eq!(*src, a_key);
                Some(u32::from_be_bytes(packet[..4].try_into().unwrap()))
            }
            _ => None,
        })
        .collect();
    assert!(
        !events[restarting..]
            .iter()
            .any(|e| matches!(e, Event::Packet { .. })),
        "no packet after restarting"
    );
    assert!(
        matches!(events.last(), Some(Event::ServerClosed)),
        "then the close"
    );
    assert_eq!(
        packets.len(),
        expect,
        "every packet the relay kept ({queued} bytes queued at SIGTERM) arrives first"
    );
    assert!(packets.windows(2).all(|w| w[0] < w[1]), "in order");
    let a_events = a.read_until(|_| false);
    assert!(
        a_events
            .iter()
            .any(|e| matches!(e, Event::Restarting { .. })),
        "{a_events:?}"
    );
    // The process exits 0.
    let mut f = f;
    let status = f.wait_exit(T).expect("ferry exits after draining");
    assert!(status.success(), "{status}:\n{}", f.log());
}

/// The `--http-port` companion of a TLS listener answers captive-portal
/// checks and health, and sends everything else to HTTPS.
#[test]
fn port_80_companion_answers_checks_and_redirects() {
    let dir = TempDir::new("port80");
    let port80 = free_tcp_port();
    let (f, _) = serving(&mut derp_server(
        &dir,
        &[
            "--certmode",
            "selfsigned",
            "--certdir",
            &dir.path("certs"),
            "--http-port",
            &port80.to_string(),
        ],
    ));
    let p80: SocketAddr = format!("127.0.0.1:{port80}").parse().unwrap();
    assert!(get(p80, "/generate_204").starts_with("HTTP/1.1 204"));
    assert!(get(p80, "/healthz").starts_with("HTTP/1.1 200"));
    let r = get(p80, "/some/page");
    assert!(r.starts_with("HTTP/1.1 302"), "{r}");
    assert!(r.contains("Location: https://x/some/page\r\n"), "{r}");
    f.stop();
}

#[test]
fn home_page_blank_and_redirect() {
    let dir = TempDir::new("home");
    let (f, addr) = serving(&mut derp_server(&dir, &["--home", "blank"]));
    let r = get(addr, "/");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.ends_with("\r\n\r\n"), "a blank page: {r}");
    f.stop();
    let (f, addr) = serving(&mut derp_server(
        &dir,
        &["--home", "https://example.net/about"],
    ));
    let r = get(addr, "/");
    assert!(r.starts_with("HTTP/1.1 302"), "{r}");
    assert!(r.contains("Location: https://example.net/about\r\n"), "{r}");
    f.stop();
}

#[test]
fn derp_false_serves_everything_but_derp() {
    let dir = TempDir::new("noderp");
    let (f, addr) = serving(&mut derp_server(&dir, &["--derp=false"]));
    let r = get(addr, "/derp");
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    assert!(r.contains("derp server disabled"), "{r}");
    assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/generate_204").starts_with("HTTP/1.1 204"));
    f.stop();
}

/// `--ktls on` refuses to start where the kernel has no TLS ULP, and
/// starts where it has one.
#[test]
fn ktls_on_needs_the_kernels_tls() {
    let dir = TempDir::new("ktls");
    let mut c = derp_server(
        &dir,
        &[
            "--certmode",
            "selfsigned",
            "--certdir",
            &dir.path("certs"),
            "--ktls",
            "on",
        ],
    );
    if ferry_sys::ktls::tls_ulp_available().is_ok() {
        let (f, _) = serving(&mut c);
        f.stop();
        return;
    }
    let (status, log) = run(&mut c);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("--ktls on: "), "{log}");
    assert!(
        !std::path::Path::new(&dir.path("ferry.key")).exists(),
        "a refused start writes no key"
    );
}

/// `--dev` prints the relay's URL and a DERP map that points at it.
#[test]
fn dev_banner_holds_a_working_derp_map() {
    let mut child = ferry()
        .args([
            "--dev",
            "-a",
            "127.0.0.1:0",
            "--stun-port",
            "0",
            "--workers",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + T;
    while !lines.iter().any(|l: &String| l == "}") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => panic!("no complete banner within {T:?}: {lines:?}"),
        }
    }
    let _ = ferry_sys::signal::send(child.id(), libc::SIGTERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let banner = lines.join("\n");
    let derp = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("DERP:"))
        .expect("a DERP line")
        .trim()
        .to_string();
    let json = &banner[banner.find("DERP map (JSON):").unwrap() + "DERP map (JSON):".len()..];
    let map: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let node = &map["Regions"]["900"]["Nodes"][0];
    let addr = url_addr(&derp);
    assert_eq!(node["DERPPort"], addr.port(), "{banner}");
    assert_eq!(node["IPv4"], addr.ip().to_string(), "{banner}");
    assert!(
        derp.starts_with("http://") && derp.ends_with("/derp"),
        "{derp}"
    );
}

/// A ferry on `socket`, passed as systemd's socket activation does, with
/// its key in `key_file`; returns once it serves.
fn activated(socket: &std::net::TcpListener, key_file: &str, extra: &[&str]) -> Ferry {
    use std::os::fd::AsFd;
    let addr = socket.local_addr().unwrap().to_string();
    let mut c = ferry();
    c.args(["-a", &addr, "--stun-port", "0", "-c", key_file])
        .args(extra);
    ferry_sys::activation::pass_listen_fds(&mut c, &[socket.as_fd()]);
    let mut f = Ferry::spawn(&mut c);
    f.wait_log("listening on a socket from the service manager");
    f.wait_log("ferry relay running");
    f
}

/// A restart under socket activation refuses no one: the listening socket
/// belongs to the service manager (played by the test, as systemd's
/// ferry.socket would), so while one ferry drains and exits and the next
/// starts, new connections wait in its backlog. Both clients are told
/// `restarting`, reconnect at once (before the new process is even
/// started), and the packet stream between them resumes with nothing lost
/// that was sent on a live connection.
#[test]
fn a_restart_on_a_socket_from_the_service_manager_refuses_no_one() {
    let dir = TempDir::new("activation");
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    let start = |dir: &TempDir| activated(&socket, &dir.path("ferry.key"), &["--workers", "2"]);
    let first = start(&dir);
    let (ak, bk) = (NodePrivate::generate(), NodePrivate::generate());
    let mut a = Derp::connect(addr, ak.clone(), None);
    let mut b = Derp::connect(addr, bk.clone(), None);
    let stream = |a: &mut Derp, b: &mut Derp, from: u32| {
        for i in from..from + 50 {
            a.client
                .send_packet(&mut a.out, &b.client.public_key(), &i.to_be_bytes())
                .unwrap();
        }
        a.flush();
        let mut got = Vec::new();
        b.read_until(|e| {
            if let Event::Packet { packet, .. } = e {
                got.push(u32::from_be_bytes(packet[..4].try_into().unwrap()));
            }
            got.len() == 50
        });
        assert_eq!(got, (from..from + 50).collect::<Vec<_>>());
    };
    stream(&mut a, &mut b, 0);

    // systemctl restart: SIGTERM, then the next process once it exited.
    first.signal(libc::SIGTERM);
    for c in [&mut a, &mut b] {
        let events = c.read_until(|_| false);
        assert!(
            events.iter().any(|e| matches!(e, Event::Restarting { .. })),
            "{events:?}"
        );
    }
    // The clients reconnect at once: the connections wait in the backlog.
    let reconnect = |key: NodePrivate| std::thread::spawn(move || Derp::connect(addr, key, None));
    let (ra, rb) = (reconnect(ak), reconnect(bk));
    let mut first = first;
    let status = first
        .wait_exit(T)
        .expect("the first ferry exits after draining");
    assert!(status.success(), "{status}");
    let second = start(&dir);
    let (mut a, mut b) = (ra.join().unwrap(), rb.join().unwrap());
    stream(&mut a, &mut b, 50);
    second.stop();
}

/// The back ends the binary runs on here: epoll, and io_uring where the
/// kernel allows it (under CI, where it does, a missing io_uring fails).
fn backends() -> Vec<&'static str> {
    match ferry_engine::uring::probe() {
        Ok(()) => vec!["epoll", "uring"],
        Err(why) => {
            ferry_testkit::skip!("the io_uring half: io_uring is not usable here: {why}");
            vec!["epoll"]
        }
    }
}

/// A draining ferry stops accepting at once: a client that connects to the
/// shared socket while the old process still drains (a client that reads
/// nothing holds the drain open) waits in the socket's backlog and is
/// served by the next process — it meets the new server key — instead of
/// being accepted and closed by the old one. On each back end.
#[test]
fn a_draining_ferry_leaves_new_connections_to_the_next_process() {
    const N: usize = 3000;
    for io in backends() {
        let dir = TempDir::new("handover");
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let opts = ["--workers", "1", "--io", io];
        let mut old = activated(&socket, &dir.path("old.key"), &opts);
        let bk = NodePrivate::generate();
        let b_key = bk.public();
        let _b = Derp::connect(addr, bk, Some(4096));
        let a = Derp::connect(addr, NodePrivate::generate(), None);
        let _a = send_numbered(a, addr, b_key, N, 1000);
        assert!(
            metric(addr, "ferry_queued_bytes") > 0.0,
            "{io}: nothing queued for B: the drain would not wait for it"
        );

        old.signal(libc::SIGTERM);
        old.wait_log("draining: stopped accepting new connections");
        let late = TcpStream::connect_timeout(&addr, T).unwrap();
        let key = NodePrivate::generate();
        let client = std::thread::spawn(move || Derp::handshake(late, addr, key));
        assert!(
            old.wait_exit(Duration::ZERO).is_none(),
            "{io}: the old process still drains while the client connects"
        );
        let mut new = activated(&socket, &dir.path("new.key"), &opts);
        let new_key = new.field("ferry relay running", "key");
        let late = client.join().expect("the late client is served");
        assert_eq!(
            late.client.server_key().map(|k| k.to_string()),
            Some(new_key),
            "{io}: served by the new process"
        );
        let status = old
            .wait_exit(T)
            .expect("the old ferry exits after draining");
        assert!(status.success(), "{io}: {status}");
        new.stop();
    }
}

/// `ferry_tls_certificate_expiry_timestamp_seconds` is the served
/// certificate's end of validity (for alerts without an outside probe).
#[test]
fn the_served_certificate_expiry_is_a_metric() {
    let dir = TempDir::new("certexpiry");
    let certs = dir.path("certs");
    let (mut f, _) = serving(&mut derp_server(
        &dir,
        &[
            "--certmode",
            "selfsigned",
            "--certdir",
            &certs,
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    ));
    let metrics = url_addr(&f.field("ferry relay running", "metrics"));
    let pem = std::fs::read(format!("{certs}/localhost.selfsigned.crt")).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let want = pem.parse_x509().unwrap().validity().not_after.timestamp();
    let got =
        Scrape::fetch(metrics, "/metrics").value("ferry_tls_certificate_expiry_timestamp_seconds");
    assert_eq!(got, want as f64);
    f.stop();
}

/// A loopback UDP port that was free a moment ago.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `--stun=false` binds no STUN socket: the `--stun-port` it would use
/// stays free (and is taken without the flag).
#[test]
fn stun_false_leaves_the_stun_port_free() {
    let dir = TempDir::new("nostun");
    let port = free_udp_port().to_string();
    let (f, _) = serving(&mut derp_server(&dir, &["--stun-port", &port]));
    let taken = std::net::UdpSocket::bind(format!("127.0.0.1:{port}"));
    assert!(
        taken.is_err(),
        "STUN (on by default) holds 127.0.0.1:{port}"
    );
    f.stop();
    let (f, _) = serving(&mut derp_server(
        &dir,
        &["--stun-port", &port, "--stun=false"],
    ));
    std::net::UdpSocket::bind(format!("127.0.0.1:{port}"))
        .expect("--stun=false leaves the STUN port free");
    f.stop();
}

/// The relay's end of a TCP connection in /proc/net/tcp: (timer kind, when
/// it fires in clock ticks); kind 2 is the keepalive timer.
fn server_socket_timer(relay: SocketAddr, client: SocketAddr) -> Option<(u32, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if port(f[1]) != relay.port() || port(f[2]) != client.port() {
            return None;
        }
        let (kind, when) = f[5].split_once(':').unwrap();
        Some((
            u32::from_str_radix(kind, 16).unwrap(),
            u64::from_str_radix(when, 16).unwrap(),
        ))
    })
}

/// `--tcp-keepalive-time`: the relay's client sockets get a keepalive
/// timer that fires after that much idleness (the kernel shows the timer
/// and its remaining time in /proc/net/tcp, in 1/100 s); the default is
/// 10 minutes.
#[test]
fn tcp_keepalive_time_is_set_on_client_sockets() {
    let dir = TempDir::new("keepalive");
    // (flags, the most and least the timer may show, in 1/100 s)
    for (flags, most, least) in [
        (&["--tcp-keepalive-time", "30s"][..], 30 * 100, 1),
        (&[][..], 600 * 100, 31 * 100),
    ] {
        let (f, addr) = serving(&mut derp_server(&dir, flags));
        let c = Derp::connect(addr, NodePrivate::generate(), None);
        let me = c.sock.local_addr().unwrap();
        let mut seen = None;
        eventually("the relay's socket to show its keepalive timer", || {
            seen = server_socket_timer(addr, me);
            matches!(seen, Some((2, _)))
        });
        let (_, when) = seen.unwrap();
        assert!(
            (least..=most).contains(&when),
            "{flags:?}: keepalive fires in {when}/100 s, want {least}..={most}"
        );
        drop(c);
        f.stop();
    }
}

/// `--tcp-user-timeout`: a client whose receive window stays closed (it
/// reads nothing) is cut off by the kernel once the relay's data has gone
/// unacknowledged that long. The relay's own write timeout is off here
/// (`--tcp-write-timeout 0`), so nothing but the socket option can close
/// the connection: without it, this test would wait in vain.
#[test]
fn tcp_user_timeout_cuts_off_a_client_that_takes_nothing() {
    let dir = TempDir::new("usertimeout");
    let (f, addr) = serving(&mut derp_server(
        &dir,
        &["--tcp-user-timeout", "1s", "--tcp-write-timeout", "0"],
    ));
    let bk = NodePrivate::generate();
    let b_key = bk.public();
    let b = Derp::connect(addr, bk, Some(4096));
    let mut a = Derp::connect(addr, NodePrivate::generate(), None);
    // More than the relay's queue and its socket's send buffer can hold,
    // so that its data to B waits on B's closed window.
    let big = vec![7u8; 60_000];
    for _ in 0..150 {
        a.client.send_packet(&mut a.out, &b_key, &big).unwrap();
        a.flush();
    }
    let closed = |addr| {
        Scrape::fetch(addr, "/debug/varz")
            .value("ferry_connections_closed_total{reason=\"io_error\"}")
    };
    eventually("the kernel to give up on B", || closed(addr) == 1.0);
    assert_eq!(metric(addr, "derp_current_connections"), 1.0, "A stays");
    drop(b);
    f.stop();
}

/// CPUs a thread may run on, from /proc/PID/task/TID/status.
fn cpus_allowed(status: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

/// The allowed-CPU lists of a process's shard threads, by thread name.
fn shard_affinity(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if name.starts_with("ferry-shard-") {
            let status = std::fs::read_to_string(task.join("status")).unwrap();
            out.push((name.trim().to_string(), cpus_allowed(&status)));
        }
    }
    out.sort();
    out
}

/// Shards are pinned one per core by default; `--pin=false` leaves them
/// on every CPU the process may use.
#[test]
fn shards_are_pinned_unless_pin_false() {
    let cpus = ferry_sys::available_cpus();
    if cpus.len() < 2 {
        return ferry_testkit::skip!("one usable CPU, where pinned and unpinned look the same");
    }
    let dir = TempDir::new("pin");
    let mine = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    for pin in [true, false] {
        let (f, _) = serving(&mut derp_server(
            &dir,
            &["--workers", "2", &format!("--pin={pin}")],
        ));
        let shards = shard_affinity(f.pid());
        assert_eq!(shards.len(), 2, "{shards:?}");
        if pin {
            let want: Vec<String> = cpus[..2].iter().map(|c| c.to_string()).collect();
            let got: Vec<String> = shards.iter().map(|(_, c)| c.clone()).collect();
            assert_eq!(got, want, "one shard per core, in order");
        } else {
            for (name, list) in &shards {
                assert_eq!(list, &mine, "{name} with --pin=false");
            }
        }
        f.stop();
    }
}

/// Manual certificates renewed on disk are picked up by the relay's
/// reload thread (every 30 s), without a signal and without a restart,
/// while a client stays connected: a new client that trusts only the new
/// certificate gets in (so it is what the relay serves now), and the two
/// relay to each other.
#[test]
fn the_reload_thread_swaps_in_new_certificate_files_under_a_connected_client() {
    let dir = TempDir::new("reloadthread");
    let certs = dir.path("certs");
    // An IP hostname without files: a certificate is generated and saved.
    let (mut f, addr) = serving(&mut derp_server(
        &dir,
        &[
            "--certmode",
            "manual",
            "--hostname",
            "127.0.0.1",
            "--certdir",
            &certs,
            "--http-port",
            "-1",
        ],
    ));
    f.wait_log("generated a self-signed certificate");
    let mut old = Derp::tls(
        addr,
        "127.0.0.1",
        &format!("{certs}/127.0.0.1.crt"),
        NodePrivate::generate(),
    );
    // Another certificate for the same name replaces the files, the key
    // first: a check between the two renames sees a mismatched pair
    // (refused, the old one kept) and the next one the new pair.
    let next = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    for (ext, pem) in [
        ("key", next.key_pair.serialize_pem()),
        ("crt", next.cert.pem()),
    ] {
        let tmp = format!("{certs}/.new.{ext}");
        std::fs::write(&tmp, pem).unwrap();
        std::fs::rename(&tmp, format!("{certs}/127.0.0.1.{ext}")).unwrap();
    }
    // The thread checks every 30 s: within two checks.
    let deadline = Instant::now() + Duration::from_secs(75);
    loop {
        let log = f.log();
        if log.contains("reloaded TLS certificate") {
            break;
        }
        assert!(Instant::now() < deadline, "no reload within 75 s:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut new = Derp::tls(
        addr,
        "127.0.0.1",
        &format!("{certs}/127.0.0.1.crt"),
        NodePrivate::generate(),
    );
    let (old_key, new_key) = (old.client.public_key(), new.client.public_key());
    old.send(&new_key, b"from before the reload");
    assert_eq!(
        new.recv_packet(),
        (old_key, b"from before the reload".to_vec())
    );
    new.send(&old_key, b"from after it");
    assert_eq!(old.recv_packet(), (new_key, b"from after it".to_vec()));
    f.stop();
}

/// `ferry udp-relay`'s bounce flags through the binary: `--wireguard-only`
/// drops what is not WireGuard, `--max-sessions 1` refuses a second
/// client, `--gro=false --gso=false` switch the offloads off (the
/// `ferry_udp_offload` series say so). What each does to datagrams in
/// detail is tested in process (crates/udp/tests/bounce_flags.rs).
#[test]
fn udp_relay_bounce_flags_take_effect() {
    let target = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    target.set_read_timeout(Some(T)).unwrap();
    let mut f = Ferry::spawn(ferry().arg("udp-relay").args([
        "--workers",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--target",
        &target.local_addr().unwrap().to_string(),
        "--wireguard-only",
        "--max-sessions",
        "1",
        "--gro=false",
        "--gso=false",
        "--metrics-addr",
        "127.0.0.1:0",
    ]));
    let metrics = url_addr(&f.field("metrics", "url"));
    let log = f.wait_log("UDP relay running");
    let relay: SocketAddr = log
        .lines()
        .find(|l| l.contains("listening"))
        .and_then(|l| support::field_in(l, "addr"))
        .unwrap()
        .parse()
        .unwrap();
    let series = |name: &str| -> f64 { Scrape::fetch(metrics, "/metrics").value(name) };
    assert_eq!(series("ferry_udp_offload{feature=\"gro\"}"), 0.0);
    assert_eq!(series("ferry_udp_offload{feature=\"gso\"}"), 0.0);
    let mut data = [0xd0u8; 64];
    data[..4].copy_from_slice(&[4, 0, 0, 0]);
    let first = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    first.send_to(b"not wireguard", relay).unwrap();
    first.send_to(&data, relay).unwrap();
    let mut buf = [0u8; 128];
    let n = target.recv(&mut buf).expect("the WireGuard datagram");
    assert_eq!(&buf[..n], &data[..]);
    eventually("the junk to be counted", || {
        series("ferry_udp_drops_total{reason=\"not_wireguard\"}") == 1.0
    });
    let second = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    second.send_to(&data, relay).unwrap();
    eventually("the second client to be refused", || {
        series("ferry_udp_drops_total{reason=\"session_limit\"}") == 1.0
    });
    f.stop();
}

/// Credentials in `--verify-client-url` (a user and password, a token in
/// the query) are shown nowhere an operator or a log reader looks: not in
/// the log (at debug level, through a question that fails), not on
/// `/debug/varz` or the metrics listener, not in `ferry status` or
/// `ferry check-config`. The log still says which controller, redacted.
#[test]
fn admission_url_credentials_are_never_shown() {
    let dir = TempDir::new("redact");
    let dead = free_tcp_port();
    let url = format!("http://ferry:s3cret@127.0.0.1:{dead}/verify?token=t0ken");
    let (mut f, addr) = serving(&mut derp_server(
        &dir,
        &[
            "--stun=false",
            "--log",
            "debug",
            "--metrics-addr",
            "127.0.0.1:0",
            "--verify-client-url",
            &url,
        ],
    ));
    let metrics = url_addr(&f.field("ferry relay running", "metrics"));
    // Admitted (fail-open) after a question that could not be asked.
    let _client = Derp::connect(addr, NodePrivate::generate(), None);
    f.wait_log("admission controller unreachable");
    let mut shown = vec![get(addr, "/debug/varz"), get(metrics, "/metrics")];
    for args in [
        vec!["status", &metrics.to_string()],
        vec!["status", "--json", &metrics.to_string()],
    ] {
        let out = ferry().args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        shown.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let file = dir.path("ferry.toml");
    std::fs::write(
        &file,
        format!(
            "addr = \"127.0.0.1:0\"\nstun = false\nverify_client_url = \"{url}\"\nkey_file = \"{}\"\n",
            dir.path("check.key")
        ),
    )
    .unwrap();
    let out = ferry().args(["check-config", &file]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    shown.push(String::from_utf8_lossy(&out.stdout).into_owned());
    shown.push(String::from_utf8_lossy(&out.stderr).into_owned());
    let log = f.stop();
    let redacted = format!("http://[redacted]@127.0.0.1:{dead}/verify?token=[redacted]");
    assert!(log.contains(&redacted), "{log}");
    assert!(
        shown[shown.len() - 2].contains(&redacted),
        "{}",
        shown[shown.len() - 2]
    );
    shown.push(log);
    for text in shown {
        assert!(
            !text.contains("s3cret") && !text.contains("t0ken"),
            "a credential is shown:\n{text}"
        );
    }
}
