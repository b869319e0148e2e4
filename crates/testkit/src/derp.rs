//! A small blocking DERP client for tests: `ferry_proto::client` (the
//! state machine the load generator and the SDK use) over a blocking
//! socket, plain or TLS, handing the test its events. Every read is bounded
//! in time. Also the traffic backpressure tests make: numbered packets
//! checked for order ([`send_numbered`], [`recv_numbered`]) and a
//! [`Flood`] to one destination.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_proto::client::{self as derp, Event};
use ferry_proto::frame;
use ferry_proto::handshake::{ClientInfo, ServerInfo};
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::nacl;

/// A byte stream to the relay whose reads can be bounded in time.
pub trait Transport: Read + Write {
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
pub struct Client<S: Transport = TcpStream> {
    /// The stream to the relay.
    pub stream: S,
    /// This client's key.
    pub public: NodePublic,
    /// The relay's key, from the handshake.
    pub server_key: NodePublic,
    /// The relay's serverInfo, from the handshake.
    pub server_info: ServerInfo,
    derp: derp::Client,
    events: VecDeque<Event>,
    out: Vec<u8>,
}

/// clientInfo as a Go client sends it, with `mesh_key` if given.
pub fn info(mesh_key: Option<MeshKey>) -> ClientInfo {
    ClientInfo {
        mesh_key,
        version: 2,
        can_ack_pings: true,
        is_prober: false,
        app_name: None,
        ferry_derp: 0,
        ferry_mesh: 0,
    }
}

/// A Go-like client configuration for `key` saying `info`.
pub fn config(key: NodePrivate, info: ClientInfo) -> derp::Config {
    let mut config = derp::Config::new(key, "localhost");
    config.user_agent = "Go-http-client/1.1".into();
    config.info = info;
    config
}

impl Client {
    /// A plain DERP client with a fresh key.
    pub fn connect(addr: SocketAddr) -> Client {
        Self::connect_as(addr, NodePrivate::generate(), info(None))
    }

    /// A plain DERP client with `key`, saying `info`.
    pub fn connect_as(addr: SocketAddr, key: NodePrivate, info: ClientInfo) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        Client::over(stream, config(key, info))
    }
}

impl<S: Transport> Client<S> {
    /// Runs the handshake over `stream`; the first event must be
    /// `Connected`.
    pub fn over(stream: S, config: derp::Config) -> Client<S> {
        let public = config.key.public();
        let derp = derp::Client::new(config, Instant::now(), nacl::random_nonce())
            .expect("valid client configuration");
        let mut c = Client {
            stream,
            public,
            server_key: NodePublic::from_bytes([0; 32]),
            server_info: ServerInfo::default(),
            derp,
            events: VecDeque::new(),
            out: Vec::new(),
        };
        c.flush().expect("upgrade request");
        match c.next_event(Duration::from_secs(5)) {
            Ok(Event::Connected { server_key, info }) => {
                c.server_key = server_key;
                c.server_info = info;
            }
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
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Sends `packet` to `dst`.
    pub fn send(&mut self, dst: &NodePublic, packet: &[u8]) {
        self.derp
            .send_packet(&mut self.out, dst, packet)
            .expect("sendPacket");
        self.flush().expect("send");
    }

    /// Sends a ping.
    pub fn ping(&mut self, data: [u8; 8]) {
        self.derp.ping(&mut self.out, data).expect("ping");
        self.flush().expect("ping");
    }

    /// Next event of any kind, or an error on timeout or a broken stream.
    /// A clean close by the server is `Event::ServerClosed`, once.
    pub fn next_event(&mut self, timeout: Duration) -> io::Result<Event> {
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
    pub fn next_meaningful(&mut self, timeout: Duration) -> io::Result<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let e = self.next_event(deadline.saturating_duration_since(Instant::now()))?;
            if e != Event::KeepAlive {
                return Ok(e);
            }
        }
    }

    /// Next received packet (skipping other events).
    pub fn recv_packet(&mut self, timeout: Duration) -> io::Result<(NodePublic, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        loop {
            let e = self.next_event(deadline.saturating_duration_since(Instant::now()))?;
            if let Event::Packet { src, packet } = e {
                return Ok((src, packet));
            }
        }
    }

    /// Waits until the server closes the connection; false on timeout.
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
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

/// DERP over TLS, as the tests speak it.
pub type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TCP connection to `addr`; `rcvbuf` shrinks its receive buffer before
/// the connect (so that a client that never reads fills up at once).
pub fn dial(addr: SocketAddr, rcvbuf: Option<usize>) -> TcpStream {
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
pub fn tls_over(tcp: TcpStream, derp: derp::Config) -> Client<Tls> {
    let config = crate::tls::accept_any_config();
    let conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
    Client::over(rustls::StreamOwned::new(conn, tcp), derp)
}

/// A fresh DERP client over TLS.
pub fn connect_tls(addr: SocketAddr) -> Client<Tls> {
    tls_over(
        dial(addr, None),
        config(NodePrivate::generate(), info(None)),
    )
}

/// Sends `count` packets of `len` bytes (at least 4) to `to` on a thread
/// of its own, each starting with its number (big-endian `u32`), as fast
/// as the relay takes them; the thread gives the client back.
/// [`recv_numbered`] is the other end.
pub fn send_numbered<S: Transport + Send + 'static>(
    mut from: Client<S>,
    to: NodePublic,
    count: u32,
    len: usize,
) -> JoinHandle<Client<S>> {
    std::thread::spawn(move || {
        let mut payload = vec![0u8; len.max(4)];
        for i in 0..count {
            payload[..4].copy_from_slice(&i.to_be_bytes());
            from.send(&to, &payload);
        }
        from
    })
}

/// Receives the `count` packets [`send_numbered`] sends, each within
/// `timeout`, and fails on the first one missing or out of order; `case`
/// names the run in the failure.
pub fn recv_numbered<S: Transport>(
    reader: &mut Client<S>,
    count: u32,
    timeout: Duration,
    case: &str,
) {
    for i in 0..count {
        let (_, p) = reader
            .recv_packet(timeout)
            .unwrap_or_else(|e| panic!("packet {i} of {count} did not arrive ({case}): {e}"));
        assert_eq!(
            u32::from_be_bytes(p[..4].try_into().expect("a numbered packet")),
            i,
            "in order ({case})"
        );
    }
}

/// A client writing 1300-byte packets to one destination as fast as the
/// relay takes them, on a thread of its own, for at most 30 s.
pub struct Flood<S: Transport> {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Client<S>>,
}

impl<S: Transport + Send + 'static> Flood<S> {
    /// Starts flooding `to` from `from`.
    pub fn start(mut from: Client<S>, to: NodePublic) -> Flood<S> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            from.stream
                .tcp()
                .set_write_timeout(Some(Duration::from_millis(200)))
                .expect("write timeout");
            let mut out = Vec::new();
            frame::put_send_packet(&mut out, &to, &[7u8; 1300]);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                // Blocks (and times out) while the relay does not read us;
                // over TLS, rustls keeps what it could not write for the
                // next call.
                let _ = from.write(&out);
            }
            from
        });
        Flood { stop, thread }
    }

    /// Stops the flood and gives the client back.
    pub fn stop(self) -> Client<S> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the flood thread")
    }
}
