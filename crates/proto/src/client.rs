//! A DERP client connection as a state machine without I/O
//! (`docs/derp-protocol.md` §4, §7, §10).
//!
//! [`Client`] is to DERP what quinn-proto's `Connection` is to QUIC: it owns
//! no socket, no TLS session, no clock and no random source. Its owner reads
//! plaintext bytes from the server (TLS, if any, is the owner's business),
//! hands them in with the time, and drains what the client wants written and
//! when it next needs to be woken. The load generator, the relay tests and
//! (next) mesh dialing and the SDK drive the same object.
//!
//! # Stages
//!
//! ```text
//! classic:     AwaitUpgrade ─(101)→ AwaitServerKey ─(serverKey; clientInfo queued)→
//! fast start:  (request + clientInfo queued at construction) ──────────────────────→
//!              AwaitServerInfo ─(serverInfo)→ Connected ─(EOF)→ Closed
//! ```
//!
//! Any error moves the client to `Failed`; every later input or command
//! returns that same error. Before `serverKey` only `serverKey` may arrive,
//! and before `serverInfo` only `serverInfo`, `keepAlive` and (fast start)
//! `serverKey`; these rules are checked on the frame header, before a
//! payload is read. In steady state frames are read with the Go client's
//! rule ([`ClientFramePolicy`]: anything up to 1 MiB), unknown types and
//! frames too short to act on are ignored, as Go does.
//!
//! # Driving it
//!
//! Inputs:
//!
//! - [`Client::handle_bytes`]`(now, bytes, on_event)`: bytes read from the
//!   server. Events are delivered to `on_event` in stream order, during the
//!   call; a received packet borrows the caller's bytes (no copy, no
//!   allocation) unless it straddled two reads.
//! - [`Client::handle_eof`]: the server closed its side.
//! - [`Client::handle_timeout`]`(now)`: the deadline from
//!   [`Client::poll_timeout`] passed.
//!
//! Commands ([`Client::send_packet`], [`Client::forward_packet`],
//! [`Client::watch_conns`], [`Client::close_peer`],
//! [`Client::note_preferred`], [`Client::ping`], [`Client::pong`]) append
//! their frame to a caller-owned `Vec<u8>`, after first moving into it any
//! bytes the client itself has queued, so the stream order is always the
//! order of the calls and a packet is copied once, into the caller's
//! buffer.
//!
//! Outputs, drained after every input in this order:
//!
//! 1. [`Client::poll_transmit`]: appends the bytes the client produced on its
//!    own (upgrade request, `clientInfo`, automatic pongs) to the caller's
//!    buffer; write them out.
//! 2. Events: already delivered through `on_event` during the input call.
//! 3. [`Client::poll_timeout`]: when to call [`Client::handle_timeout`]
//!    (the handshake limit, then the keepalive limit: the server sends
//!    `keepAlive` every ~60 s, so a silence of [`Config::keepalive_timeout`]
//!    means the connection is dead).
//!
//! Randomness comes in from the caller: the `clientInfo` nonce is an
//! argument of [`Client::new`].
//!
//! A blocking driver, in short (a real one also sleeps no longer than
//! [`Client::poll_timeout`] and then calls [`Client::handle_timeout`]):
//!
//! ```no_run
//! use ferry_proto::client::{Client, Config, Event};
//! use ferry_proto::key::NodePrivate;
//! use std::io::{Read, Write};
//! use std::net::TcpStream;
//! use std::time::Instant;
//!
//! let mut sock = TcpStream::connect("127.0.0.1:3340")?;
//! let config = Config::new(NodePrivate::generate(), "127.0.0.1:3340");
//! let nonce = ferry_proto::nacl::random_nonce();
//! let mut client = Client::new(config, Instant::now(), nonce)?;
//! let (mut out, mut buf) = (Vec::new(), vec![0; 64 * 1024]);
//! loop {
//!     client.poll_transmit(&mut out);
//!     sock.write_all(&out)?;
//!     out.clear();
//!     let n = sock.read(&mut buf)?;
//!     if n == 0 {
//!         client.handle_eof(|_| {})?;
//!         break;
//!     }
//!     client.handle_bytes(Instant::now(), &buf[..n], |event| match event {
//!         Event::Packet { src, packet } => println!("{} bytes from {src}", packet.len()),
//!         other => println!("{other:?}"),
//!     })?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod events;
mod upgrade;

pub use events::{ClientError, Event, Stage};
pub use upgrade::MAX_RESPONSE_HEAD;

use crate::frame::{
    self, parse_server_frame, ClientFramePolicy, Deframer, Disposition, Fed, FrameError,
    FramePolicy, FrameType, PeerGoneReason, ServerFrame, KEY_LEN, MAX_PACKET_SIZE, PING_LEN,
};
use crate::handshake::{
    self, ClientInfo, HandshakeError, ServerInfo, MAX_SERVER_INFO_LEN, MAX_SERVER_KEY_LEN,
};
use crate::key::{NodePrivate, NodePublic};
use crate::nacl::{SharedKey, NONCE_LEN};
use std::fmt;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};
use upgrade::RequestHead;

/// How long the whole handshake may take by default (Go bounds its connect
/// to 10 s, `docs/derp-protocol.md` §4.7).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server may stay silent by default before the connection is
/// presumed dead (Go's per-receive read deadline,
/// `docs/derp-protocol.md` §8.7).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(120);
/// The `User-Agent` sent by default.
pub const DEFAULT_USER_AGENT: &str = concat!("ferry/", env!("CARGO_PKG_VERSION"));

/// The box key for one (client key, server key) pair: lets a client that
/// reconnects to the same server skip the X25519 of the handshake. Take it
/// from [`Client::box_key`] after one handshake and put it in
/// [`Config::box_key`] for the next (clones share one key); a key made for
/// another pair is ignored.
#[derive(Clone)]
pub struct BoxKey {
    client: NodePublic,
    server: NodePublic,
    shared: Arc<SharedKey>,
}

impl BoxKey {
    /// Performs the X25519 for `client` and `server` once.
    pub fn new(client: &NodePrivate, server: NodePublic) -> Self {
        BoxKey {
            client: client.public(),
            server,
            shared: Arc::new(SharedKey::new(client, &server)),
        }
    }

    /// The server key this box key is for.
    pub fn server(&self) -> NodePublic {
        self.server
    }

    /// The client key this box key is for.
    pub fn client(&self) -> NodePublic {
        self.client
    }
}

impl fmt::Debug for BoxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxKey")
            .field("client", &self.client)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// How a [`Client`] connects and what it tells the server.
#[derive(Debug, Clone)]
pub struct Config {
    /// The client's node key: its DERP address, and the key `clientInfo` is
    /// sealed with.
    pub key: NodePrivate,
    /// The `Host` header: the host, with `:port` when the port is not the
    /// scheme's default.
    pub host: String,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// `Ideal-Node` header (the name of the region's first node when this
    /// is another one); omitted when `None` or empty.
    pub ideal_node: Option<String>,
    /// Fast start (`docs/derp-protocol.md` §4.4): the server key, learned from
    /// the TLS meta-certificate. The request carries `Derp-Fast-Start: 1`,
    /// `clientInfo` follows it at once, and no HTTP response is expected.
    /// `None`: classic upgrade, waiting for `101` and `serverKey`.
    pub fast_start: Option<NodePublic>,
    /// What `clientInfo` says (`docs/derp-protocol.md` §7.3): version 2,
    /// `CanAckPings`, mesh key, prober flag. With `can_ack_pings` the client
    /// answers server pings on its own. With a mesh key the mesh-only commands
    /// are allowed.
    pub info: ClientInfo,
    /// Limit from construction to `serverInfo`.
    pub handshake_timeout: Duration,
    /// Longest silence from the server before the connection is dead.
    pub keepalive_timeout: Duration,
    /// A box key from an earlier handshake with the same server; used when
    /// the server's key matches, so the handshake costs no X25519.
    pub box_key: Option<BoxKey>,
}

impl Config {
    /// A classic-upgrade client for `key` talking to `host`, saying what
    /// tailscaled says: `{"version":2,"CanAckPings":true}`.
    pub fn new(key: NodePrivate, host: impl Into<String>) -> Self {
        Config {
            key,
            host: host.into(),
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            ideal_node: None,
            fast_start: None,
            info: ClientInfo {
                version: frame::PROTOCOL_VERSION,
                can_ack_pings: true,
                ..ClientInfo::default()
            },
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            box_key: None,
        }
    }
}

/// The handshake's frame rules, checked on each header (see the module
/// docs); steady state defers to [`ClientFramePolicy`].
struct StagePolicy {
    stage: Stage,
    fast_start: bool,
}

impl FramePolicy for StagePolicy {
    fn check(&self, ty: u8, len: u32) -> Disposition {
        let unexpected = |expected: FrameType| {
            Disposition::Reject(FrameError::Unexpected {
                frame: ty,
                expected: expected as u8,
            })
        };
        let at_most = |max: usize| {
            if len as usize > max {
                Disposition::Reject(FrameError::TooLong {
                    frame: ty,
                    len: len as usize,
                    max,
                })
            } else {
                Disposition::Buffer
            }
        };
        match (self.stage, FrameType::from_u8(ty)) {
            (Stage::AwaitServerKey, Some(FrameType::ServerKey)) => at_most(MAX_SERVER_KEY_LEN),
            (Stage::AwaitServerKey, _) => unexpected(FrameType::ServerKey),
            (Stage::AwaitServerInfo, Some(FrameType::ServerInfo)) => at_most(MAX_SERVER_INFO_LEN),
            (Stage::AwaitServerInfo, Some(FrameType::KeepAlive)) => {
                ClientFramePolicy.check(ty, len)
            }
            (Stage::AwaitServerInfo, Some(FrameType::ServerKey)) if self.fast_start => {
                at_most(MAX_SERVER_KEY_LEN)
            }
            (Stage::AwaitServerInfo, _) => unexpected(FrameType::ServerInfo),
            _ => ClientFramePolicy.check(ty, len),
        }
    }
}

/// A DERP client connection. See the module docs.
pub struct Client {
    deframer: Deframer,
    /// The response head collected so far (classic mode, before the 101).
    head: Vec<u8>,
    session: Session,
}

/// Where the connection stands, with the error that ended it ([`Stage`]
/// is its public, payload-free view).
#[derive(Debug)]
enum State {
    AwaitUpgrade,
    AwaitServerKey,
    AwaitServerInfo,
    Connected,
    Closed,
    Failed(ClientError),
}

/// Everything but the byte buffers, so frame handling can borrow it while
/// the deframer runs.
struct Session {
    state: State,
    key: NodePrivate,
    info: ClientInfo,
    nonce: [u8; NONCE_LEN],
    fast_start: bool,
    /// A key known before `serverKey` arrives (header or fast start).
    expected_server: Option<NodePublic>,
    server_key: Option<NodePublic>,
    server_info: Option<ServerInfo>,
    box_key: Option<BoxKey>,
    /// Bytes the client produced itself, waiting for `poll_transmit`.
    pending: Vec<u8>,
    started: Instant,
    last_rx: Instant,
    handshake_timeout: Duration,
    keepalive_timeout: Duration,
    ignored_frames: u64,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.session;
        f.debug_struct("Client")
            .field("state", &s.state)
            .field("key", &s.key.public())
            .field("server_key", &s.server_key)
            .field("fast_start", &s.fast_start)
            .field("pending", &s.pending.len())
            .field("deframer", &self.deframer)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client at the start of a connection that has just been opened
    /// (TCP, and TLS if any). The upgrade request (and in fast-start mode
    /// `clientInfo`) is queued for [`Client::poll_transmit`]. `nonce` seals
    /// `clientInfo`: give it fresh random bytes.
    pub fn new(
        config: Config,
        now: Instant,
        nonce: [u8; NONCE_LEN],
    ) -> Result<Client, ClientError> {
        let request = RequestHead {
            host: &config.host,
            user_agent: &config.user_agent,
            ideal_node: config.ideal_node.as_deref(),
            fast_start: config.fast_start.is_some(),
        };
        request.check()?;
        let mut pending = Vec::with_capacity(256);
        request.put(&mut pending);
        let mut session = Session {
            state: State::AwaitUpgrade,
            key: config.key,
            info: config.info,
            nonce,
            fast_start: config.fast_start.is_some(),
            expected_server: config.fast_start,
            server_key: None,
            server_info: None,
            box_key: config.box_key,
            pending,
            started: now,
            last_rx: now,
            handshake_timeout: config.handshake_timeout,
            keepalive_timeout: config.keepalive_timeout,
            ignored_frames: 0,
        };
        if let Some(server) = config.fast_start {
            session.send_client_info(server);
        }
        Ok(Client {
            deframer: Deframer::new(),
            head: Vec::new(),
            session,
        })
    }

    /// A client on a transport that did its own upgrade (DERP over WebSocket,
    /// `docs/derp-protocol.md` §4.5): no HTTP request is queued, the server's
    /// first frame must be `serverKey`, and there is no fast start
    /// ([`Config::fast_start`] is ignored).
    pub fn new_upgraded(
        mut config: Config,
        now: Instant,
        nonce: [u8; NONCE_LEN],
    ) -> Result<Client, ClientError> {
        config.fast_start = None;
        let mut client = Client::new(config, now, nonce)?;
        client.session.pending.clear();
        client.session.state = State::AwaitServerKey;
        Ok(client)
    }

    // -----------------------------------------------------------------------
    // Inputs

    /// Takes plaintext bytes read from the server at `now`. Events are
    /// handed to `on_event` in stream order before this returns; answers
    /// the client owes (clientInfo, pongs) wait for [`Client::poll_transmit`].
    pub fn handle_bytes<F>(
        &mut self,
        now: Instant,
        input: &[u8],
        mut on_event: F,
    ) -> Result<(), ClientError>
    where
        F: FnMut(Event<&[u8]>),
    {
        self.session.usable()?;
        if input.is_empty() {
            return Ok(());
        }
        self.session.last_rx = self.session.last_rx.max(now);
        let result = self.consume(input, &mut on_event);
        if let Err(e) = &result {
            self.fail(e.clone());
        }
        result
    }

    /// The server closed its side of the connection. At a frame boundary
    /// after the handshake that is a clean end ([`Event::ServerClosed`]);
    /// during the handshake or inside a frame it is an error.
    pub fn handle_eof<F>(&mut self, mut on_event: F) -> Result<(), ClientError>
    where
        F: FnMut(Event<&[u8]>),
    {
        self.session.usable()?;
        let result = match self.session.stage() {
            Stage::Connected if self.deframer.is_empty() => {
                self.session.state = State::Closed;
                self.release_buffers();
                on_event(Event::ServerClosed);
                return Ok(());
            }
            Stage::Connected => Err(ClientError::Truncated {
                held: self.deframer.buffered_len(),
            }),
            stage => Err(ClientError::ClosedDuringHandshake { stage }),
        };
        if let Err(e) = &result {
            self.fail(e.clone());
        }
        result
    }

    /// Checks the deadlines at `now`: past the handshake limit before
    /// `serverInfo`, or past the keepalive limit since the last byte, the
    /// connection fails with [`ClientError::HandshakeTimeout`] or
    /// [`ClientError::KeepaliveTimeout`].
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ClientError> {
        self.session.usable()?;
        let s = &self.session;
        let expired = |deadline: Option<Instant>| deadline.is_some_and(|d| now >= d);
        let error = if s.stage().is_handshake() && expired(s.handshake_deadline()) {
            ClientError::HandshakeTimeout {
                stage: s.stage(),
                limit: s.handshake_timeout,
            }
        } else if expired(s.keepalive_deadline()) {
            ClientError::KeepaliveTimeout {
                limit: s.keepalive_timeout,
            }
        } else {
            return Ok(());
        };
        self.fail(error.clone());
        Err(error)
    }

    // -----------------------------------------------------------------------
    // Commands

    /// Sends `packet` to `dst` (`sendPacket`). Packets over 64 KiB are
    /// refused, as Go's client does.
    pub fn send_packet(
        &mut self,
        out: &mut Vec<u8>,
        dst: &NodePublic,
        packet: &[u8],
    ) -> Result<(), ClientError> {
        self.ready_for(FrameType::SendPacket.name(), false)?;
        check_packet(FrameType::SendPacket, packet)?;
        self.poll_transmit(out);
        frame::put_send_packet(out, dst, packet);
        Ok(())
    }

    /// Mesh: hands the server a packet from `src` (a client of ours) for
    /// its local client `dst` (`forwardPacket`).
    pub fn forward_packet(
        &mut self,
        out: &mut Vec<u8>,
        src: &NodePublic,
        dst: &NodePublic,
        packet: &[u8],
    ) -> Result<(), ClientError> {
        self.ready_for(FrameType::ForwardPacket.name(), true)?;
        check_packet(FrameType::ForwardPacket, packet)?;
        self.poll_transmit(out);
        frame::put_forward_packet(out, src, dst, packet);
        Ok(())
    }

    /// Mesh: subscribes to the server's connection list (`watchConns`);
    /// `peerPresent` and `peerGone` events follow.
    pub fn watch_conns(&mut self, out: &mut Vec<u8>) -> Result<(), ClientError> {
        self.ready_for(FrameType::WatchConns.name(), true)?;
        self.poll_transmit(out);
        frame::put_watch_conns(out);
        Ok(())
    }

    /// Mesh: asks the server to close every connection of `key`
    /// (`closePeer`).
    pub fn close_peer(&mut self, out: &mut Vec<u8>, key: &NodePublic) -> Result<(), ClientError> {
        self.ready_for(FrameType::ClosePeer.name(), true)?;
        self.poll_transmit(out);
        frame::put_close_peer(out, key);
        Ok(())
    }

    /// Tells the server whether it is this client's home (`notePreferred`).
    pub fn note_preferred(
        &mut self,
        out: &mut Vec<u8>,
        preferred: bool,
    ) -> Result<(), ClientError> {
        self.ready_for(FrameType::NotePreferred.name(), false)?;
        self.poll_transmit(out);
        frame::put_note_preferred(out, preferred);
        Ok(())
    }

    /// Pings the server with caller-chosen bytes; [`Event::Pong`] carries
    /// them back.
    pub fn ping(&mut self, out: &mut Vec<u8>, data: [u8; PING_LEN]) -> Result<(), ClientError> {
        self.ready_for(FrameType::Ping.name(), false)?;
        self.poll_transmit(out);
        frame::put_ping(out, &data);
        Ok(())
    }

    /// Asks the server for a relay session with `a.peer`
    /// (`docs/relay-sessions.md` §2). Only useful when the client asked for
    /// sessions (`ClientInfo::ferry_derp`) and the server's serverInfo
    /// offered them; any other server ignores the frame.
    pub fn relay_allocate(
        &mut self,
        out: &mut Vec<u8>,
        a: &crate::relay_session::Allocate,
    ) -> Result<(), ClientError> {
        self.ready_for("relayAllocate", false)?;
        self.poll_transmit(out);
        crate::relay_session::put_allocate(out, a);
        Ok(())
    }

    /// Answers a server ping by hand (for clients configured without
    /// `can_ack_pings`, which do not answer on their own).
    pub fn pong(&mut self, out: &mut Vec<u8>, data: [u8; PING_LEN]) -> Result<(), ClientError> {
        self.ready_for(FrameType::Pong.name(), false)?;
        self.poll_transmit(out);
        frame::put_pong(out, &data);
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Outputs

    /// Appends the bytes the client queued on its own (upgrade request,
    /// `clientInfo`, automatic pongs) to `out`; returns how many. The
    /// internal queue keeps its capacity, so steady state does not allocate.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> usize {
        let pending = &mut self.session.pending;
        let n = pending.len();
        if n > 0 {
            out.extend_from_slice(pending);
            pending.clear();
        }
        n
    }

    /// When [`Client::handle_timeout`] must next be called: the handshake
    /// limit while the handshake runs, then the keepalive limit counted
    /// from the last byte received. `None` once the connection has ended.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let s = &self.session;
        let keepalive = s.keepalive_deadline();
        match s.stage() {
            stage if stage.is_handshake() => match (s.handshake_deadline(), keepalive) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            Stage::Connected => keepalive,
            _ => None,
        }
    }

    // -----------------------------------------------------------------------
    // State

    /// Where the connection stands.
    pub fn stage(&self) -> Stage {
        self.session.stage()
    }

    /// Whether `serverInfo` has arrived and the connection is usable.
    pub fn is_connected(&self) -> bool {
        self.session.stage() == Stage::Connected
    }

    /// The error that ended the connection, if one did.
    pub fn failure(&self) -> Option<&ClientError> {
        match &self.session.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The client's own public key (its DERP address).
    pub fn public_key(&self) -> NodePublic {
        self.session.key.public()
    }

    /// The server's key: from `serverKey`, or the fast-start key.
    pub fn server_key(&self) -> Option<NodePublic> {
        self.session.server_key
    }

    /// What the server said in `serverInfo` (token bucket hints included;
    /// the client does not enforce them).
    pub fn server_info(&self) -> Option<&ServerInfo> {
        self.session.server_info.as_ref()
    }

    /// The box key used for this server, to reuse in [`Config::box_key`].
    pub fn box_key(&self) -> Option<&BoxKey> {
        self.session.box_key.as_ref()
    }

    /// Bytes queued by the client and not yet taken by
    /// [`Client::poll_transmit`].
    pub fn pending_len(&self) -> usize {
        self.session.pending.len()
    }

    /// Stream bytes held for a frame split across reads.
    pub fn buffered_len(&self) -> usize {
        self.deframer.buffered_len() + self.head.len()
    }

    /// Frames read and ignored (unknown types, frames too short to act on,
    /// handshake frames repeated after the handshake).
    pub fn ignored_frames(&self) -> u64 {
        self.session.ignored_frames
    }

    // -----------------------------------------------------------------------
    // Internals

    /// Ends the connection with `error`. Bytes queued before it (a pong
    /// for a ping that preceded the bad frame) stay available to
    /// [`Client::poll_transmit`], so what the client emits does not depend
    /// on how the stream was split into reads.
    fn fail(&mut self, error: ClientError) {
        self.session.state = State::Failed(error);
        self.release_buffers();
    }

    fn release_buffers(&mut self) {
        self.deframer = Deframer::new();
        self.head = Vec::new();
    }

    fn ready_for(&self, frame: &'static str, mesh_only: bool) -> Result<(), ClientError> {
        let s = &self.session;
        match s.stage() {
            Stage::AwaitServerInfo | Stage::Connected => {}
            Stage::Failed | Stage::Closed => s.usable()?,
            stage => return Err(ClientError::NotReady { frame, stage }),
        }
        if mesh_only && s.info.mesh_key.is_none() {
            return Err(ClientError::NotMesh { frame });
        }
        Ok(())
    }

    fn consume(
        &mut self,
        input: &[u8],
        on_event: &mut impl FnMut(Event<&[u8]>),
    ) -> Result<(), ClientError> {
        if self.session.stage() != Stage::AwaitUpgrade {
            return self.feed_frames(input, on_event);
        }
        // Classic mode: collect the response head. Whatever follows it is
        // the start of the DERP stream.
        self.head.extend_from_slice(input);
        let Some(upgraded) = upgrade::parse_response(&self.head)? else {
            return Ok(());
        };
        self.session.expected_server = upgraded.public_key;
        self.session.state = State::AwaitServerKey;
        let head = std::mem::take(&mut self.head);
        self.feed_frames(&head[upgraded.head_len..], on_event)
    }

    /// Runs the deframer under the current stage's policy; a frame that
    /// changes the stage pauses it so the rest is checked under the new one.
    fn feed_frames(
        &mut self,
        input: &[u8],
        on_event: &mut impl FnMut(Event<&[u8]>),
    ) -> Result<(), ClientError> {
        let Client {
            deframer, session, ..
        } = self;
        if session.stage() == Stage::Connected {
            // Steady state: one policy, no pauses, frames straight out of
            // `input` (the hot path).
            return deframer
                .feed(input, &ClientFramePolicy, |ty, payload| {
                    session.on_steady_frame(ty, payload, on_event);
                    ControlFlow::Continue(())
                })
                .map(|_| ())
                .map_err(|source| session.frame_error(Stage::Connected, source));
        }
        let mut first = true;
        loop {
            let stage = session.stage();
            let policy = StagePolicy {
                stage,
                fast_start: session.fast_start,
            };
            let mut failure = None;
            let mut on_frame =
                |ty: u8, payload: &[u8]| match session.on_frame(ty, payload, on_event) {
                    Ok(flow) => flow,
                    Err(e) => {
                        failure = Some(e);
                        ControlFlow::Break(())
                    }
                };
            let fed = if first {
                deframer.feed(input, &policy, &mut on_frame)
            } else {
                deframer.resume(&policy, &mut on_frame)
            };
            first = false;
            if let Some(e) = failure {
                return Err(e);
            }
            match fed {
                Ok(Fed::Drained) => return Ok(()),
                Ok(Fed::Paused) => continue,
                Err(source) => return Err(session.frame_error(stage, source)),
            }
        }
    }
}

fn check_packet(frame: FrameType, packet: &[u8]) -> Result<(), ClientError> {
    if packet.len() > MAX_PACKET_SIZE {
        return Err(ClientError::PacketTooLarge {
            frame: frame.name(),
            len: packet.len(),
            max: MAX_PACKET_SIZE,
        });
    }
    Ok(())
}

impl Session {
    fn stage(&self) -> Stage {
        match self.state {
            State::AwaitUpgrade => Stage::AwaitUpgrade,
            State::AwaitServerKey => Stage::AwaitServerKey,
            State::AwaitServerInfo => Stage::AwaitServerInfo,
            State::Connected => Stage::Connected,
            State::Closed => Stage::Closed,
            State::Failed(_) => Stage::Failed,
        }
    }

    fn usable(&self) -> Result<(), ClientError> {
        match &self.state {
            State::Failed(e) => Err(e.clone()),
            State::Closed => Err(ClientError::Closed),
            _ => Ok(()),
        }
    }

    fn handshake_deadline(&self) -> Option<Instant> {
        self.started.checked_add(self.handshake_timeout)
    }

    fn keepalive_deadline(&self) -> Option<Instant> {
        self.last_rx.checked_add(self.keepalive_timeout)
    }

    /// Queues `clientInfo` for `server` and waits for `serverInfo`.
    fn send_client_info(&mut self, server: NodePublic) {
        let me = self.key.public();
        let cached = self
            .box_key
            .take()
            .filter(|b| b.server == server && b.client == me);
        let box_key = cached.unwrap_or_else(|| BoxKey::new(&self.key, server));
        handshake::put_client_info(
            &mut self.pending,
            &me,
            &box_key.shared,
            &self.info,
            &self.nonce,
        );
        self.box_key = Some(box_key);
        self.server_key = Some(server);
        self.state = State::AwaitServerInfo;
    }

    /// A framing error, named for what it most likely means.
    fn frame_error(&self, stage: Stage, source: FrameError) -> ClientError {
        // A server without fast-start support answers with "HTTP/1.1 101",
        // whose first five bytes read as a frame of type 'H'.
        let http_answer = matches!(
            source,
            FrameError::Unexpected { frame: b'H', .. } | FrameError::TooLong { frame: b'H', .. }
        );
        if self.fast_start && stage == Stage::AwaitServerInfo && http_answer {
            ClientError::FastStartRefused
        } else {
            ClientError::Frame { stage, source }
        }
    }

    fn check_server_key(&self, got: NodePublic) -> Result<(), ClientError> {
        match self.expected_server {
            Some(expected) if expected != got => {
                Err(ClientError::ServerKeyMismatch { expected, got })
            }
            _ => Ok(()),
        }
    }

    /// Handles one admitted frame. `Break` when the stage changed, so the
    /// deframer pauses and the rest is checked under the new policy.
    fn on_frame(
        &mut self,
        ty: u8,
        payload: &[u8],
        on_event: &mut impl FnMut(Event<&[u8]>),
    ) -> Result<ControlFlow<()>, ClientError> {
        match self.stage() {
            Stage::AwaitServerKey => {
                let server = handshake::parse_server_key(payload)?;
                self.check_server_key(server)?;
                self.send_client_info(server);
                Ok(ControlFlow::Break(()))
            }
            Stage::AwaitServerInfo if ty == FrameType::ServerInfo as u8 => {
                let box_key = self.box_key.as_ref().expect("clientInfo was sealed");
                let info = handshake::open_server_info_keyed(&box_key.shared, payload)?;
                self.server_info = Some(info);
                self.state = State::Connected;
                on_event(Event::Connected {
                    server_key: box_key.server,
                    info,
                });
                Ok(ControlFlow::Break(()))
            }
            Stage::AwaitServerInfo if ty == FrameType::ServerKey as u8 => {
                // Fast start: Go skips it; a different key cannot open
                // serverInfo either, so say so now.
                self.check_server_key(handshake::parse_server_key(payload)?)?;
                Ok(ControlFlow::Continue(()))
            }
            // keepAlive before serverInfo (the policy admits nothing else).
            Stage::AwaitServerInfo => Ok(ControlFlow::Continue(())),
            _ => {
                self.on_steady_frame(ty, payload, on_event);
                Ok(ControlFlow::Continue(()))
            }
        }
    }

    #[inline]
    fn on_steady_frame(&mut self, ty: u8, payload: &[u8], on_event: &mut impl FnMut(Event<&[u8]>)) {
        // Packets first: they are nearly every frame.
        if ty == FrameType::RecvPacket as u8 && payload.len() >= KEY_LEN {
            let (src, packet) = payload.split_at(KEY_LEN);
            let src = NodePublic::try_from(src).expect("split at the key length");
            on_event(Event::Packet { src, packet });
            return;
        }
        if self.info.ferry_derp != 0 {
            use crate::relay_session::{parse_frame, RelayFrame};
            match parse_frame(ty, payload) {
                Some(Ok(RelayFrame::Session(offer))) => {
                    return on_event(Event::RelaySession(offer))
                }
                Some(Ok(RelayFrame::Refused(r))) => return on_event(Event::RelayRefused(r)),
                Some(_) => {
                    self.ignored_frames += 1;
                    return;
                }
                None => {}
            }
        }
        if self.info.ferry_derp >= crate::relay_session::v2::VERSION {
            use crate::relay_session::v2::{parse_frame2, Frame2};
            match parse_frame2(ty, payload) {
                Some(Ok(Frame2::Session(offer))) => return on_event(Event::RelaySession2(offer)),
                Some(Ok(Frame2::End(end))) => return on_event(Event::RelaySessionEnd(end)),
                Some(Err(_)) => {
                    self.ignored_frames += 1;
                    return;
                }
                None => {}
            }
        }
        let Ok(parsed) = parse_server_frame(ty, payload) else {
            self.ignored_frames += 1;
            return;
        };
        let event = match parsed {
            ServerFrame::RecvPacket { src, packet } => Event::Packet { src, packet },
            ServerFrame::KeepAlive => Event::KeepAlive,
            ServerFrame::PeerGone { key, reason } => Event::PeerGone { key, reason },
            ServerFrame::PeerPresent {
                key,
                addr,
                flags,
                app_name,
            } => Event::PeerPresent {
                key,
                addr,
                flags,
                app_name,
            },
            ServerFrame::Ping(data) => {
                if self.info.can_ack_pings {
                    frame::put_pong(&mut self.pending, &data);
                }
                Event::Ping(data)
            }
            ServerFrame::Pong(data) => Event::Pong(data),
            ServerFrame::Health(text) => Event::Health(text),
            ServerFrame::Restarting {
                reconnect_in_ms,
                try_for_ms,
            } => Event::Restarting {
                reconnect_in: Duration::from_millis(u64::from(reconnect_in_ms)),
                try_for: Duration::from_millis(u64::from(try_for_ms)),
            },
            ServerFrame::ServerKey(_) | ServerFrame::ServerInfo(_) | ServerFrame::Other { .. } => {
                self.ignored_frames += 1;
                return;
            }
        };
        on_event(event);
    }
}

#[cfg(test)]
mod tests;
