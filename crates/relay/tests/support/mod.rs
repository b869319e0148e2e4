//! A small blocking DERP client and server harness for the relay's tests.
//! The client drives `ferry_proto::client` (the same state machine the load
//! generator and the SDK use) over a blocking socket, plain or TLS, and
//! hands the tests its events.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferry_proto::client::{self as derp, Event};
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::nacl;
use ferry_relay::{ListenerKind, ListenerSpec, RelayConfig, Server, ServerOptions};

/// A relay on 127.0.0.1 with `workers` shards and `tweak` applied.
pub(crate) fn start(workers: usize, tweak: impl FnOnce(&mut RelayConfig)) -> (Server, SocketAddr) {
    start_on("127.0.0.1:0".parse().unwrap(), workers, tweak)
}

/// A relay listening on `addr` (STUN on the same IP).
pub(crate) fn start_on(
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
        inherited: Vec::new(),
    })
    .expect("server starts");
    let addr = server.listen_addrs[0];
    (server, addr)
}

/// A fresh self-signed TLS set-up for "localhost" with `cfg`'s key in its
/// meta certificate (nothing written to disk).
pub(crate) fn self_signed_tls(cfg: &RelayConfig) -> ferry_relay::tls::TlsSetup {
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
pub(crate) fn io_mode() -> ferry_engine::IoMode {
    std::env::var("FERRY_IO")
        .ok()
        .map(|v| v.parse().expect("FERRY_IO: auto, uring or epoll"))
        .unwrap_or_default()
}

/// Stops a relay and waits for it.
pub(crate) fn stop(server: Server) {
    server.shutdown();
    server.wait().expect("clean stop");
}

/// A byte stream to the relay whose reads can be bounded in time.
pub(crate) trait Transport: Read + Write {
    /// The TCP socket underneath, for timeouts.
    fn tcp(&self) -> &TcpStream;
}

impl Transport for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Transport for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// A connected DERP client: `proto::client` over a blocking stream.
pub(crate) struct Client<S: Transport = TcpStream> {
    pub stream: S,
    pub public: NodePublic,
    pub server_key: NodePublic,
    derp: derp::Client,
    events: VecDeque<Event>,
    out: Vec<u8>,
}

pub(crate) fn info(mesh_key: Option<MeshKey>) -> ClientInfo {
    ClientInfo {
        mesh_key,
        version: 2,
        can_ack_pings: true,
        is_prober: false,
        app_name: None,
        ferry_relay: 0,
    }
}

/// A Go-like client configuration for `key` saying `info`.
pub(crate) fn config(key: NodePrivate, info: ClientInfo) -> derp::Config {
    let mut config = derp::Config::new(key, "localhost");
    config.user_agent = "Go-http-client/1.1".into();
    config.info = info;
    config
}

impl Client {
    pub(crate) fn connect(addr: SocketAddr) -> Client {
        Self::connect_as(addr, NodePrivate::generate(), info(None))
    }

    pub(crate) fn connect_as(addr: SocketAddr, key: NodePrivate, info: ClientInfo) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        Client::over(stream, config(key, info))
    }
}

impl<S: Transport> Client<S> {
    /// Runs the handshake over `stream`; the first event must be
    /// `Connected`.
    pub(crate) fn over(stream: S, config: derp::Config) -> Client<S> {
        let public = config.key.public();
        let derp = derp::Client::new(config, Instant::now(), nacl::random_nonce())
            .expect("valid client configuration");
        let mut c = Client {
            stream,
            public,
            server_key: NodePublic::from_bytes([0; 32]),
            derp,
            events: VecDeque::new(),
            out: Vec::new(),
        };
        c.flush().expect("upgrade request");
        match c.next_event(Duration::from_secs(5)) {
            Ok(Event::Connected { server_key, .. }) => c.server_key = server_key,
            other => panic!("expected serverInfo first, got {other:?}"),
        }
        c
    }

    /// Writes what the client has queued (clientInfo, pongs).
    fn flush(&mut self) -> io::Result<()> {
        self.derp.poll_transmit(&mut self.out);
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Writes raw bytes, bypassing the client (malformed frames, floods).
    pub(crate) fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub(crate) fn send(&mut self, dst: &NodePublic, packet: &[u8]) {
        self.derp
            .send_packet(&mut self.out, dst, packet)
            .expect("sendPacket");
        self.flush().expect("send");
    }

    pub(crate) fn ping(&mut self, data: [u8; 8]) {
        self.derp.ping(&mut self.out, data).expect("ping");
        self.flush().expect("ping");
    }

    /// Next event of any kind, or an error on timeout or a broken stream.
    /// A clean close by the server is `Event::ServerClosed`, once.
    pub(crate) fn next_event(&mut self, timeout: Duration) -> io::Result<Event> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream.tcp().set_read_timeout(Some(left))?;
            let invalid = |e: derp::ClientError| io::Error::new(io::ErrorKind::InvalidData, e);
            let events = &mut self.events;
            match self.stream.read(&mut buf) {
                Ok(0) => self
                    .derp
                    .handle_eof(|e| events.push_back(e.into_owned()))
                    .map_err(invalid)?,
                Ok(n) => {
                    self.derp
                        .handle_bytes(Instant::now(), &buf[..n], |e| {
                            events.push_back(e.into_owned())
                        })
                        .map_err(invalid)?;
                    self.flush()?;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(io::ErrorKind::TimedOut.into())
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Next event that is not a keepAlive.
    pub(crate) fn next_meaningful(&mut self, timeout: Duration) -> io::Result<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let e = self.next_event(deadline.saturating_duration_since(Instant::now()))?;
            if e != Event::KeepAlive {
                return Ok(e);
            }
        }
    }

    /// Next received packet (skipping other events).
    pub(crate) fn recv_packet(&mut self, timeout: Duration) -> io::Result<(NodePublic, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        loop {
            let e = self.next_event(deadline.saturating_duration_since(Instant::now()))?;
            if let Event::Packet { src, packet } = e {
                return Ok((src, packet));
            }
        }
    }

    /// Waits until the server closes the connection; false on timeout.
    pub(crate) fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_event(deadline.saturating_duration_since(Instant::now())) {
                Ok(Event::ServerClosed) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return false,
                Err(_) => return true,
            }
        }
    }
}

/// DERP over TLS, as the relay tests speak it.
pub(crate) type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TCP connection to `addr`; `rcvbuf` shrinks its receive buffer before
/// the connect (so that a client that never reads fills up at once).
pub(crate) fn dial(addr: SocketAddr, rcvbuf: Option<usize>) -> TcpStream {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .expect("socket");
    if let Some(n) = rcvbuf {
        sock.set_recv_buffer_size(n).expect("SO_RCVBUF");
    }
    sock.connect(&addr.into()).expect("connect");
    let tcp: TcpStream = sock.into();
    tcp.set_nodelay(true).unwrap();
    tcp
}

/// A DERP client over TLS on `tcp` that accepts the relay's self-signed
/// certificate.
pub(crate) fn tls_over(tcp: TcpStream, derp: derp::Config) -> Client<Tls> {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(ferry_bench::target::NoVerification(
            provider,
        )))
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
    Client::over(rustls::StreamOwned::new(conn, tcp), derp)
}

/// A fresh DERP client over TLS.
pub(crate) fn connect_tls(addr: SocketAddr) -> Client<Tls> {
    tls_over(
        dial(addr, None),
        config(NodePrivate::generate(), info(None)),
    )
}

/// Scrapes one metric (sum of matching lines) from `/debug/varz`.
pub(crate) fn metric(addr: SocketAddr, name_and_labels: &str) -> f64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /debug/varz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    metric_in(&body, name_and_labels)
}

/// One metric (sum of matching lines) from a Prometheus text body.
pub(crate) fn metric_in(body: &str, name_and_labels: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(n, _)| *n == name_and_labels)
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// Polls `f` until it returns true or `timeout` passes.
pub(crate) fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
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
pub(crate) fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}
