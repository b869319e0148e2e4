//! A small blocking DERP client and server harness for the relay's tests.
//! It speaks the protocol through `ferry-proto` only, byte by byte as a Go
//! client would, so the tests check the server rather than shared code.
#![allow(dead_code)]

pub mod peer;

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use ferry_proto::frame::{self, ClientFramePolicy, Deframer, ServerFrame};
use ferry_proto::handshake::{self, ClientInfo};
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::nacl;
use ferry_relay::{ListenerKind, ListenerSpec, RelayConfig, Server, ServerOptions};

/// A relay on 127.0.0.1 with `workers` shards and `tweak` applied.
pub fn start(workers: usize, tweak: impl FnOnce(&mut RelayConfig)) -> (Server, SocketAddr) {
    start_on("127.0.0.1:0".parse().unwrap(), workers, tweak)
}

/// A relay listening on `addr` (STUN on the same IP).
pub fn start_on(
    addr: SocketAddr,
    workers: usize,
    tweak: impl FnOnce(&mut RelayConfig),
) -> (Server, SocketAddr) {
    let mut cfg = RelayConfig::new(NodePrivate::generate());
    tweak(&mut cfg);
    let server = Server::start(ServerOptions {
        config: cfg,
        listeners: vec![ListenerSpec {
            addr,
            kind: ListenerKind::Derp,
        }],
        workers,
        pin: false,
        stun: Some(SocketAddr::new(addr.ip(), 0)),
        metrics_addr: None,
        io: io_mode(),
    })
    .expect("server starts");
    let addr = server.listen_addrs[0];
    (server, addr)
}

/// A fresh self-signed TLS set-up for "localhost" with `cfg`'s key in its
/// meta certificate (nothing written to disk).
pub fn self_signed_tls(cfg: &RelayConfig) -> ferry_relay::tls::TlsSetup {
    ferry_relay::tls::server_config(
        &ferry_relay::tls::CertMode::SelfSigned {
            hostname: "localhost".into(),
            certdir: None,
        },
        *cfg.public_key.as_bytes(),
    )
    .expect("self-signed TLS")
}

/// The back end under test: `FERRY_IO` (auto, uring, epoll), default auto.
pub fn io_mode() -> ferry_engine::IoMode {
    std::env::var("FERRY_IO")
        .ok()
        .map(|v| v.parse().expect("FERRY_IO: auto, uring or epoll"))
        .unwrap_or_default()
}

/// Stops a relay and waits for it.
pub fn stop(server: Server) {
    server.shutdown();
    server.wait().expect("clean stop");
}

pub struct Client {
    pub stream: TcpStream,
    pub key: NodePrivate,
    pub public: NodePublic,
    pub server_key: NodePublic,
    deframer: Deframer,
    frames: VecDeque<(u8, Vec<u8>)>,
}

pub fn info(mesh_key: Option<MeshKey>) -> ClientInfo {
    ClientInfo {
        mesh_key,
        version: 2,
        can_ack_pings: true,
        is_prober: false,
        app_name: None,
    }
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        Self::connect_as(addr, NodePrivate::generate(), info(None))
    }

    pub fn connect_as(addr: SocketAddr, key: NodePrivate, info: ClientInfo) -> Client {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream
            .write_all(b"GET /derp HTTP/1.1\r\nHost: localhost\r\nUser-Agent: Go-http-client/1.1\r\nConnection: Upgrade\r\nUpgrade: DERP\r\n\r\n")
            .unwrap();
        let public = key.public();
        let mut c = Client {
            stream,
            key,
            public,
            server_key: NodePublic::from_bytes([0; 32]),
            deframer: Deframer::new(),
            frames: VecDeque::new(),
        };
        // The 101 response head, then DERP frames.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            c.stream.read_exact(&mut byte).expect("101 response");
            head.push(byte[0]);
            assert!(head.len() < 4096, "response head too long");
        }
        assert!(
            head.starts_with(b"HTTP/1.1 101 "),
            "{}",
            String::from_utf8_lossy(&head)
        );
        let (ty, payload) = c.next_frame(Duration::from_secs(5)).expect("serverKey");
        assert_eq!(ty, frame::FrameType::ServerKey as u8);
        c.server_key = handshake::parse_server_key(&payload).expect("valid serverKey");
        let hello =
            handshake::seal_client_info(&c.key, &c.server_key, &info, &nacl::random_nonce());
        c.stream.write_all(&hello).unwrap();
        let (ty, payload) = c.next_frame(Duration::from_secs(5)).expect("serverInfo");
        assert_eq!(
            ty,
            frame::FrameType::ServerInfo as u8,
            "serverInfo comes right after serverKey"
        );
        handshake::open_server_info(&c.key, &c.server_key, &payload).expect("serverInfo opens");
        c
    }

    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn send(&mut self, dst: &NodePublic, packet: &[u8]) {
        let mut out = Vec::new();
        frame::put_send_packet(&mut out, dst, packet);
        self.stream.write_all(&out).expect("send");
    }

    pub fn ping(&mut self, data: [u8; 8]) {
        let mut out = Vec::new();
        frame::put_ping(&mut out, &data);
        self.stream.write_all(&out).expect("ping");
    }

    /// Next frame of any type, or an error on timeout/EOF.
    pub fn next_frame(&mut self, timeout: Duration) -> io::Result<(u8, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(f) = self.frames.pop_front() {
                return Ok(f);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(io::ErrorKind::TimedOut.into())
                }
                Err(e) => return Err(e),
            };
            let frames = &mut self.frames;
            self.deframer
                .feed(&buf[..n], &ClientFramePolicy, |ty, p| {
                    frames.push_back((ty, p.to_vec()));
                    ControlFlow::Continue(())
                })
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }

    /// Next frame that is not a keepAlive.
    pub fn next_meaningful(&mut self, timeout: Duration) -> io::Result<(u8, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        loop {
            let (ty, p) = self.next_frame(deadline.saturating_duration_since(Instant::now()))?;
            if ty != frame::FrameType::KeepAlive as u8 {
                return Ok((ty, p));
            }
        }
    }

    /// Next received packet (skipping other frames).
    pub fn recv_packet(&mut self, timeout: Duration) -> io::Result<(NodePublic, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        loop {
            let (ty, p) = self.next_frame(deadline.saturating_duration_since(Instant::now()))?;
            if let Ok(ServerFrame::RecvPacket { src, packet }) = frame::parse_server_frame(ty, &p) {
                return Ok((src, packet.to_vec()));
            }
        }
    }

    /// Waits until the server closes the connection; false on timeout.
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_frame(deadline.saturating_duration_since(Instant::now())) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return false,
                Err(_) => return true,
            }
        }
    }
}

/// Scrapes one metric (sum of matching lines) from `/debug/varz`.
pub fn metric(addr: SocketAddr, name_and_labels: &str) -> f64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /debug/varz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    metric_in(&body, name_and_labels)
}

/// One metric (sum of matching lines) from a Prometheus text body.
pub fn metric_in(body: &str, name_and_labels: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(n, _)| *n == name_and_labels)
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// A plain HTTP request; returns the whole response.
pub fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}
