//! One client connection to a DERP server, as a non-blocking state machine.
//!
//! A [`Link`] owns the socket (and rustls, over `https`) and drives a
//! [`ferry_proto::client::Client`], which does the DERP part: the upgrade
//! request, the 101, `serverKey` → `clientInfo`, `serverInfo`, and every
//! frame after that. The stages a link reports:
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
//! frames queued in a turn leave in one write. Server events after the
//! handshake are handed to a callback together with the link's output
//! buffer, so a receiver can answer (echo a packet) without any extra
//! bookkeeping; received packets borrow the read buffer (no copy, no
//! allocation), and server pings are answered by the client itself.
//!
//! Keys: each [`PeerKey`] caches the box key for the last server it met, so
//! repeated handshakes (churn) cost no X25519 on the client side.

use crate::target::Target;
use ferry_proto::client::{self as derp, BoxKey, ClientError, Event};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustls::ClientConnection;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use thiserror::Error;

/// Bytes read per `read` call (and the plaintext staging size for TLS).
pub const READ_CHUNK: usize = 256 * 1024;
/// Limit on bytes rustls holds for sending.
const TLS_BUFFER_LIMIT: usize = 1 << 20;
/// The `User-Agent` of the upgrade request.
const USER_AGENT: &str = "ferry-bench";

/// A peer's identity and its cached handshake material.
pub struct PeerKey {
    /// The node private key.
    pub private: NodePrivate,
    /// Its public half: the peer's DERP address.
    pub public: NodePublic,
    box_key: Mutex<Option<BoxKey>>,
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
            box_key: Mutex::new(None),
        })
    }

    fn cached_box_key(&self) -> Option<BoxKey> {
        self.box_key
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn remember_box_key(&self, key: Option<&BoxKey>) {
        if let Some(k) = key {
            let mut slot = self.box_key.lock().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().map(BoxKey::server) != Some(k.server()) {
                *slot = Some(k.clone());
            }
        }
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
    /// The server closed the connection or broke the protocol.
    Ended,
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
            Stage::Ended => "after the connection ended",
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
    /// The DERP client refused what the server sent (bad 101, handshake,
    /// framing).
    #[error(transparent)]
    Derp(#[from] ClientError),
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
            LinkError::Derp(e) => match e {
                ClientError::UpgradeRefused { .. }
                | ClientError::MalformedResponse { .. }
                | ClientError::ResponseTooLarge { .. }
                | ClientError::BadPublicKeyHeader { .. }
                | ClientError::FastStartRefused => "http",
                ClientError::Frame {
                    stage: derp::Stage::Connected,
                    ..
                } => "frame",
                ClientError::Truncated { .. } | ClientError::ClosedDuringHandshake { .. } => {
                    "closed"
                }
                ClientError::HandshakeTimeout { .. } | ClientError::KeepaliveTimeout { .. } => {
                    "timeout"
                }
                _ => "handshake",
            },
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
    /// The TCP connect has completed.
    tcp_up: bool,
    key: Arc<PeerKey>,
    client: derp::Client,
    out: Vec<u8>,
    out_pos: usize,
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
        let mut config = derp::Config::new(key.private.clone(), target.host.clone());
        config.user_agent = USER_AGENT.to_owned();
        config.box_key = key.cached_box_key();
        let mut client = derp::Client::new(config, Instant::now(), nacl::random_nonce())?;
        let mut out = Vec::new();
        client.poll_transmit(&mut out);
        Ok(Link {
            sock,
            tls,
            tcp_up: false,
            key,
            client,
            out,
            out_pos: 0,
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
        if !self.tcp_up {
            return Stage::Connecting;
        }
        match self.client.stage() {
            derp::Stage::AwaitUpgrade => Stage::AwaitHead,
            derp::Stage::AwaitServerKey => Stage::AwaitServerKey,
            derp::Stage::AwaitServerInfo => Stage::AwaitServerInfo,
            derp::Stage::Connected => Stage::Ready,
            derp::Stage::Closed | derp::Stage::Failed => Stage::Ended,
        }
    }

    /// Whether the handshake is done.
    pub fn is_ready(&self) -> bool {
        self.client.is_connected()
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
        self.tcp_up
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
        if !self.tcp_up && !self.check_connected()? {
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
                self.tcp_up = true;
                self.writable = true;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(LinkError::Connect(e)),
        }
    }

    fn io_err(&self, source: io::Error) -> LinkError {
        LinkError::Io {
            stage: self.stage(),
            source,
        }
    }

    /// Writes as much queued output as the socket takes.
    pub fn flush(&mut self) -> Result<(), LinkError> {
        if !self.tcp_up {
            return Ok(());
        }
        let stage = self.stage();
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
    /// handshake, and hands every server event after it to
    /// `on_event(out, event)`.
    pub fn on_readable<F>(
        &mut self,
        scratch: &mut Scratch,
        budget: usize,
        on_event: &mut F,
    ) -> Result<ReadOutcome, LinkError>
    where
        F: FnMut(&mut Vec<u8>, Event<&[u8]>),
    {
        let mut outcome = ReadOutcome::default();
        if !self.tcp_up && !self.check_connected()? {
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
                Ok(0) => return Err(LinkError::Closed(self.stage())),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err(e)),
            };
            outcome.bytes += n;
            if self.tls.is_some() {
                self.take_tls(&raw[..n], plain, on_event)?;
            } else {
                self.take_plain(&raw[..n], on_event)?;
            }
            // A short read drained the socket; new data raises a new edge.
            if n < raw.len() {
                break;
            }
        }
        outcome.became_ready = !was_ready && self.is_ready();
        if outcome.became_ready {
            self.key.remember_box_key(self.client.box_key());
        }
        Ok(outcome)
    }

    /// Feeds TLS records to rustls and the plaintext to the DERP layer.
    fn take_tls<F>(
        &mut self,
        mut records: &[u8],
        plain: &mut [u8],
        on_event: &mut F,
    ) -> Result<(), LinkError>
    where
        F: FnMut(&mut Vec<u8>, Event<&[u8]>),
    {
        let mut filled = 0;
        while !records.is_empty() {
            let stage = self.stage();
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
                    self.take_plain(&plain[..filled], on_event)?;
                    filled = 0;
                }
                let tls = self.tls.as_mut().expect("TLS link");
                match tls.reader().read(&mut plain[filled..]) {
                    Ok(0) => return Err(LinkError::Closed(self.stage())),
                    Ok(k) => filled += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(self.io_err(e)),
                }
            }
        }
        if filled > 0 {
            self.take_plain(&plain[..filled], on_event)?;
        }
        Ok(())
    }

    /// Hands plaintext stream bytes to the DERP client; queues what it
    /// answers (clientInfo, pongs) behind whatever the callback wrote.
    fn take_plain<F>(&mut self, bytes: &[u8], on_event: &mut F) -> Result<(), LinkError>
    where
        F: FnMut(&mut Vec<u8>, Event<&[u8]>),
    {
        let Link { client, out, .. } = self;
        client.handle_bytes(Instant::now(), bytes, |event| {
            // Readiness is reported by `ReadOutcome::became_ready`.
            if !matches!(event, Event::Connected { .. }) {
                on_event(out, event);
            }
        })?;
        client.poll_transmit(out);
        Ok(())
    }
}
