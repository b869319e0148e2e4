//! One client connection to a DERP server, as a non-blocking state machine.
//!
//! A [`Link`] goes through the stages of §4 and §7 of the protocol:
//!
//! ```text
//! Connecting ─(TCP up)→ AwaitHead ─(HTTP 101)→ AwaitServerKey
//!     ─(serverKey; send clientInfo)→ AwaitServerInfo ─(serverInfo)→ Ready
//! ```
//!
//! With TLS the handshake runs inside rustls; the upgrade request is written
//! into rustls at once and leaves when the handshake allows. The event loop
//! that owns the link calls [`Link::on_writable`] and [`Link::on_readable`]
//! when mio reports readiness, appends outgoing frames to
//! [`Link::out_mut`], and calls [`Link::flush`] once per loop turn, so all
//! frames queued in a turn leave in one write. Frames that arrive after the
//! handshake are handed to a callback together with the link's output
//! buffer, so a receiver can answer (echo a ping) without any extra
//! bookkeeping.
//!
//! Keys: each [`PeerKey`] caches its sealed `clientInfo` and the box key for
//! the last server it met, so repeated handshakes (churn) cost no X25519 on
//! the client side.

use crate::target::Target;
use ferry_proto::frame::{ClientFramePolicy, Deframer, FrameError, FrameType};
use ferry_proto::handshake::{self, ClientInfo, HandshakeError, ServerInfo};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl::{self, SharedKey};
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustls::ClientConnection;
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// Bytes read per `read` call (and the plaintext staging size for TLS).
pub const READ_CHUNK: usize = 256 * 1024;
/// Limit on bytes rustls holds for sending.
const TLS_BUFFER_LIMIT: usize = 1 << 20;
/// Longest HTTP response head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// A peer's identity and its cached handshake material.
pub struct PeerKey {
    /// The node private key.
    pub private: NodePrivate,
    /// Its public half: the peer's DERP address.
    pub public: NodePublic,
    hello: Mutex<Option<Arc<Hello>>>,
}

/// Handshake material for one server key.
struct Hello {
    server: NodePublic,
    client_info: Vec<u8>,
    shared: SharedKey,
}

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerKey({})", self.public.short())
    }
}

impl PeerKey {
    /// A fresh random key.
    pub fn generate() -> Arc<Self> {
        let private = NodePrivate::generate();
        Arc::new(PeerKey {
            public: private.public(),
            private,
            hello: Mutex::new(None),
        })
    }

    fn hello(&self, server: &NodePublic) -> Arc<Hello> {
        let mut slot = self.hello.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = slot.as_ref().filter(|h| h.server == *server) {
            return h.clone();
        }
        let info = ClientInfo {
            version: 2,
            can_ack_pings: true,
            ..ClientInfo::default()
        };
        let h = Arc::new(Hello {
            server: *server,
            client_info: handshake::seal_client_info(
                &self.private,
                server,
                &info,
                &nacl::random_nonce(),
            ),
            shared: SharedKey::new(&self.private, server),
        });
        *slot = Some(h.clone());
        h
    }
}

/// Where a link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// TCP connect in progress.
    Connecting,
    /// Waiting for the `101 Switching Protocols` head.
    AwaitHead,
    /// Waiting for the serverKey frame.
    AwaitServerKey,
    /// clientInfo sent; waiting for serverInfo.
    AwaitServerInfo,
    /// Handshake done; frames flow.
    Ready,
}

impl Stage {
    /// Human description for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Stage::Connecting => "connecting",
            Stage::AwaitHead => "waiting for the HTTP upgrade response",
            Stage::AwaitServerKey => "waiting for the serverKey frame",
            Stage::AwaitServerInfo => "waiting for the serverInfo frame",
            Stage::Ready => "after the handshake",
        }
    }
}

/// Why a link failed.
#[derive(Debug, Error)]
pub enum LinkError {
    /// TCP connect failed.
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    /// A read or write failed.
    #[error("I/O error {}: {source}", .stage.describe())]
    Io {
        /// Stage of the failure.
        stage: Stage,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The server closed the connection.
    #[error("server closed the connection {}", .0.describe())]
    Closed(Stage),
    /// TLS failed.
    #[error("TLS error {}: {source}", .stage.describe())]
    Tls {
        /// Stage of the failure.
        stage: Stage,
        /// The error.
        #[source]
        source: rustls::Error,
    },
    /// The server answered the upgrade with something other than 101.
    #[error("server answered the /derp upgrade with {0:?} (expected 101 Switching Protocols)")]
    Http(String),
    /// The response head was too long.
    #[error("HTTP response head longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    /// serverKey or serverInfo was malformed.
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    /// The frame stream was malformed.
    #[error("frame stream: {0}")]
    Frame(#[from] FrameError),
    /// A frame arrived that the handshake did not expect.
    #[error("unexpected frame type {ty:#04x} {}", .stage.describe())]
    Unexpected {
        /// Stage.
        stage: Stage,
        /// Frame type.
        ty: u8,
    },
    /// The handshake did not finish in time.
    #[error("timed out {}", .0.describe())]
    Timeout(Stage),
}

impl LinkError {
    /// A short label for counting failures by kind.
    pub fn reason(&self) -> &'static str {
        match self {
            LinkError::Connect(e) if e.kind() == io::ErrorKind::ConnectionRefused => "refused",
            LinkError::Connect(_) => "connect",
            LinkError::Io { source, .. }
                if matches!(
                    source.kind(),
                    io::ErrorKind::ConnectionReset
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                "reset"
            }
            LinkError::Io { .. } => "io",
            LinkError::Closed(_) => "closed",
            LinkError::Tls { .. } => "tls",
            LinkError::Http(_) | LinkError::HeadTooLong => "http",
            LinkError::Handshake(_) | LinkError::Unexpected { .. } => "handshake",
            LinkError::Frame(_) => "frame",
            LinkError::Timeout(_) => "timeout",
        }
    }
}

/// Per-thread buffers shared by every link of an event loop.
pub struct Scratch {
    raw: Vec<u8>,
    plain: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            raw: vec![0; READ_CHUNK],
            plain: vec![0; READ_CHUNK],
        }
    }
}

/// What a call to [`Link::on_readable`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadOutcome {
    /// The handshake completed during this call.
    pub became_ready: bool,
    /// The read budget ran out before the socket was drained: call again.
    pub more: bool,
    /// Bytes read from the socket.
    pub bytes: usize,
}

/// A client connection. See the module docs.
pub struct Link {
    sock: TcpStream,
    tls: Option<Box<ClientConnection>>,
    stage: Stage,
    key: Arc<PeerKey>,
    server_key: Option<NodePublic>,
    out: Vec<u8>,
    out_pos: usize,
    head: Vec<u8>,
    deframer: Deframer,
    writable: bool,
    /// When the connect started (run clock).
    pub started_ns: u64,
}

impl Link {
    /// Starts a non-blocking connect to `target` for `key`.
    pub fn connect(target: &Target, key: Arc<PeerKey>, now_ns: u64) -> Result<Self, LinkError> {
        let sock = TcpStream::connect(target.addr).map_err(LinkError::Connect)?;
        Self::connect_over(sock, target, key, now_ns)
    }

    /// Like [`Link::connect`], over a socket the caller set up (e.g. with
    /// a small receive buffer) and already started connecting to `target`.
    pub fn connect_over(
        sock: TcpStream,
        target: &Target,
        key: Arc<PeerKey>,
        now_ns: u64,
    ) -> Result<Self, LinkError> {
        let tls = match (&target.tls, &target.server_name) {
            (Some(config), Some(name)) => {
                let mut c =
                    ClientConnection::new(config.clone(), name.clone()).map_err(|source| {
                        LinkError::Tls {
                            stage: Stage::Connecting,
                            source,
                        }
                    })?;
                c.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
                Some(Box::new(c))
            }
            _ => None,
        };
        Ok(Link {
            sock,
            tls,
            stage: Stage::Connecting,
            key,
            server_key: None,
            out: target.upgrade_request(),
            out_pos: 0,
            head: Vec::new(),
            deframer: Deframer::new(),
            writable: false,
            started_ns: now_ns,
        })
    }

    /// Registers the socket with a poll.
    pub fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(
            &mut self.sock,
            token,
            Interest::READABLE | Interest::WRITABLE,
        )
    }

    /// Removes the socket from a poll.
    pub fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        registry.deregister(&mut self.sock)
    }

    /// The current stage.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Whether the handshake is done.
    pub fn is_ready(&self) -> bool {
        self.stage == Stage::Ready
    }

    /// The peer's key.
    pub fn key(&self) -> &Arc<PeerKey> {
        &self.key
    }

    /// The negotiated TLS version and cipher suite, once known.
    pub fn tls_parameters(&self) -> Option<(String, String)> {
        let t = self.tls.as_ref()?;
        Some((
            format!("{:?}", t.protocol_version()?),
            format!("{:?}", t.negotiated_cipher_suite()?.suite()),
        ))
    }

    /// Bytes queued by the caller and not yet written.
    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// The output buffer: append whole frames, then [`Link::flush`].
    pub fn out_mut(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Whether a flush would do anything: bytes are queued (or rustls holds
    /// records) and the socket has not reported itself full.
    pub fn wants_flush(&self) -> bool {
        self.stage != Stage::Connecting
            && self.writable
            && (self.out_pos < self.out.len() || self.tls.as_ref().is_some_and(|t| t.wants_write()))
    }

    /// Whether the last write found the socket able to take more.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Handles write readiness: completes the TCP connect, then flushes.
    pub fn on_writable(&mut self) -> Result<(), LinkError> {
        self.writable = true;
        if self.stage == Stage::Connecting && !self.check_connected()? {
            return Ok(());
        }
        self.flush()
    }

    /// Whether the TCP connect has finished (moving to `AwaitHead` if so).
    fn check_connected(&mut self) -> Result<bool, LinkError> {
        if let Some(e) = self.sock.take_error().map_err(LinkError::Connect)? {
            return Err(LinkError::Connect(e));
        }
        match self.sock.peer_addr() {
            Ok(_) => {
                let _ = self.sock.set_nodelay(true);
                self.stage = Stage::AwaitHead;
                self.writable = true;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(LinkError::Connect(e)),
        }
    }

    fn io_err(&self, source: io::Error) -> LinkError {
        LinkError::Io {
            stage: self.stage,
            source,
        }
    }

    /// Writes as much queued output as the socket takes.
    pub fn flush(&mut self) -> Result<(), LinkError> {
        if self.stage == Stage::Connecting {
            return Ok(());
        }
        let stage = self.stage;
        let io_err = |source| LinkError::Io { stage, source };
        match &mut self.tls {
            None => {
                while self.out_pos < self.out.len() {
                    match self.sock.write(&self.out[self.out_pos..]) {
                        Ok(0) => return Err(io_err(io::ErrorKind::WriteZero.into())),
                        Ok(n) => self.out_pos += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            self.writable = false;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(io_err(e)),
                    }
                }
            }
            Some(tls) => {
                // Each pass moves plaintext into rustls (which encrypts it)
                // and records out to the socket; bounded, and it stops as
                // soon as a pass makes no progress.
                for _ in 0..64 {
                    let mut progress = false;
                    if self.out_pos < self.out.len() {
                        let n = tls
                            .writer()
                            .write(&self.out[self.out_pos..])
                            .map_err(io_err)?;
                        self.out_pos += n;
                        progress |= n > 0;
                    }
                    if tls.wants_write() {
                        match tls.write_tls(&mut self.sock) {
                            Ok(n) => progress |= n > 0,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                self.writable = false;
                                break;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(io_err(e)),
                        }
                    }
                    if !progress {
                        break;
                    }
                }
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        } else if self.out_pos > 64 * 1024 && self.out_pos * 2 > self.out.len() {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        Ok(())
    }

    /// Handles read readiness: reads up to `budget` bytes, runs the
    /// handshake, and hands every frame after it to `on_frame(out, type,
    /// payload)`.
    pub fn on_readable<F>(
        &mut self,
        scratch: &mut Scratch,
        budget: usize,
        on_frame: &mut F,
    ) -> Result<ReadOutcome, LinkError>
    where
        F: FnMut(&mut Vec<u8>, u8, &[u8]),
    {
        let mut outcome = ReadOutcome::default();
        if self.stage == Stage::Connecting && !self.check_connected()? {
            return Ok(outcome);
        }
        let was_ready = self.is_ready();
        let Scratch { raw, plain } = scratch;
        loop {
            if outcome.bytes >= budget {
                outcome.more = true;
                break;
            }
            let n = match self.sock.read(raw) {
                Ok(0) => return Err(LinkError::Closed(self.stage)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err(e)),
            };
            outcome.bytes += n;
            if self.tls.is_some() {
                self.take_tls(&raw[..n], plain, on_frame)?;
            } else {
                self.take_plain(&raw[..n], on_frame)?;
            }
            // A short read drained the socket; new data raises a new edge.
            if n < raw.len() {
                break;
            }
        }
        outcome.became_ready = !was_ready && self.is_ready();
        Ok(outcome)
    }

    /// Feeds TLS records to rustls and the plaintext to the DERP layer.
    fn take_tls<F>(
        &mut self,
        mut records: &[u8],
        plain: &mut [u8],
        on_frame: &mut F,
    ) -> Result<(), LinkError>
    where
        F: FnMut(&mut Vec<u8>, u8, &[u8]),
    {
        let mut filled = 0;
        while !records.is_empty() {
            let stage = self.stage;
            let tls = self.tls.as_mut().expect("TLS link");
            let taken = tls
                .read_tls(&mut records)
                .map_err(|source| LinkError::Io { stage, source })?;
            if taken == 0 {
                // rustls took nothing from a non-empty slice: it cannot make
                // progress, and looping would spin.
                return Err(LinkError::Io {
                    stage,
                    source: io::Error::other("TLS layer refused input"),
                });
            }
            if let Err(source) = tls.process_new_packets() {
                // Let the alert go out; the connection is over anyway.
                let _ = tls.write_tls(&mut self.sock);
                return Err(LinkError::Tls { stage, source });
            }
            loop {
                if filled == plain.len() {
                    self.take_plain(&plain[..filled], on_frame)?;
                    filled = 0;
                }
                let tls = self.tls.as_mut().expect("TLS link");
                match tls.reader().read(&mut plain[filled..]) {
                    Ok(0) => return Err(LinkError::Closed(self.stage)),
                    Ok(k) => filled += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(self.io_err(e)),
                }
            }
        }
        if filled > 0 {
            self.take_plain(&plain[..filled], on_frame)?;
        }
        Ok(())
    }

    /// Handles plaintext stream bytes.
    fn take_plain<F>(&mut self, bytes: &[u8], on_frame: &mut F) -> Result<(), LinkError>
    where
        F: FnMut(&mut Vec<u8>, u8, &[u8]),
    {
        if self.stage != Stage::AwaitHead {
            return self.deframe(bytes, on_frame);
        }
        self.head.extend_from_slice(bytes);
        let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") else {
            if self.head.len() > MAX_HEAD {
                return Err(LinkError::HeadTooLong);
            }
            return Ok(());
        };
        let status = self.head[..end]
            .split(|&b| b == b'\n')
            .next()
            .unwrap_or_default();
        let status = String::from_utf8_lossy(status).trim().to_owned();
        let mut words = status.split_whitespace();
        let ok =
            words.next().is_some_and(|v| v.starts_with("HTTP/1.")) && words.next() == Some("101");
        if !ok {
            return Err(LinkError::Http(status));
        }
        let rest = self.head.split_off(end + 4);
        self.head = Vec::new();
        self.stage = Stage::AwaitServerKey;
        self.deframe(&rest, on_frame)
    }

    fn deframe<F>(&mut self, bytes: &[u8], on_frame: &mut F) -> Result<(), LinkError>
    where
        F: FnMut(&mut Vec<u8>, u8, &[u8]),
    {
        let Link {
            deframer,
            stage,
            out,
            key,
            server_key,
            ..
        } = self;
        let mut failure: Option<LinkError> = None;
        let fed = deframer.feed(bytes, &ClientFramePolicy, |ty, payload| {
            match *stage {
                Stage::Ready => on_frame(out, ty, payload),
                Stage::AwaitServerKey if ty == FrameType::ServerKey as u8 => {
                    match handshake::parse_server_key(payload) {
                        Ok(k) => {
                            *server_key = Some(k);
                            out.extend_from_slice(&key.hello(&k).client_info);
                            *stage = Stage::AwaitServerInfo;
                        }
                        Err(e) => failure = Some(e.into()),
                    }
                }
                Stage::AwaitServerInfo if ty == FrameType::ServerInfo as u8 => {
                    let server = server_key.expect("serverKey came first");
                    let hello = key.hello(&server);
                    let opened = hello
                        .shared
                        .open(payload)
                        .map_err(|source| HandshakeError::BoxOpen {
                            frame: "serverInfo",
                            source,
                        })
                        .and_then(|json| ServerInfo::from_json(&json));
                    match opened {
                        Ok(_) => *stage = Stage::Ready,
                        Err(e) => failure = Some(e.into()),
                    }
                }
                // Keepalives may come at any time; nothing else may come
                // before the handshake is done.
                _ if ty == FrameType::KeepAlive as u8 => {}
                s => failure = Some(LinkError::Unexpected { stage: s, ty }),
            }
            if failure.is_some() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        fed?;
        Ok(())
    }
}
