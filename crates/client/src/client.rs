//! [`DerpClient`]: a DERP connection that stays up.
//!
//! The client is a handle on one tokio task (the driver) that owns the
//! connection: it reads the server's bytes into the protocol state machine,
//! writes the frames the application's commands produce, watches the
//! keepalive deadline, and when the connection ends, reports why and dials
//! again after a backoff delay (or when a `restarting` frame said to).
//!
//! ```text
//! application ──Command (mpsc)──▶ driver task ──bytes──▶ server
//! application ◀──Event (mpsc)─── driver task ◀──bytes── server
//! ```
//!
//! The driver handles one thing at a time: a command, a read, or a
//! deadline. Events wait in a bounded queue; when the application stops
//! calling [`DerpClient::recv`], the driver stops reading and TCP flow
//! control slows the server down, so keep receiving.

use crate::backoff::{Backoff, BackoffOptions};
use crate::conn::{self, Conn, TlsParams};
use crate::target::Target;
use crate::tls::{self, TlsRoots};
use crate::Error;
use ferry_proto::app_name::AppName;
use ferry_proto::client::{self as derp, BoxKey};
use ferry_proto::derp_map::Region;
use ferry_proto::frame::{PeerGoneReason, MAX_PACKET_SIZE, PING_LEN};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::relay_session::{Allocate, RefuseReason, SessionOffer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// How a [`DerpClient`] connects, reconnects and times things out.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Which certificates `https://` servers are checked against.
    pub tls_roots: TlsRoots,
    /// Use fast start when a TLS 1.3 server presents the DERP
    /// meta-certificate (one round trip fewer).
    pub fast_start: bool,
    /// Carry DERP in WebSocket binary messages (the `derp` subprotocol on
    /// `/derp`), for networks that pass only WebSocket. No fast start.
    pub websocket: bool,
    /// Limit on one whole connect: resolve, TCP, TLS, upgrade, handshake.
    pub connect_timeout: Duration,
    /// Limit on opening the TCP connection to one address when there are
    /// others to try (several targets, or a name with several
    /// addresses): a node that does not answer (blackholed, or its
    /// listener's queue full) costs this, not the whole
    /// [`connect_timeout`](Self::connect_timeout), before the next one is
    /// tried.
    pub target_connect_timeout: Duration,
    /// Longest silence from the server before the connection is presumed
    /// dead and replaced (servers send `keepAlive` about every 60 s).
    pub keepalive_timeout: Duration,
    /// How long [`DerpClient::ping`] waits for the pong.
    pub ping_timeout: Duration,
    /// Reconnect delays.
    pub backoff: BackoffOptions,
    /// Events held for the application before the driver stops reading.
    pub event_queue: usize,
    /// Commands (packets to send) held before [`DerpSender::send`] waits.
    pub command_queue: usize,
    /// DERP map nodes: dial plain HTTP (port 3340 unless `DERPPort` is
    /// set) instead of TLS, as Go's `TS_DEBUG_USE_DERP_HTTP` does. For
    /// development servers only.
    pub plain_http: bool,
    /// Ask for relay sessions (`"ferryRelay": 2` in clientInfo,
    /// `docs/relay-sessions.md`); a Ferry relay that offers them says so in
    /// serverInfo ([`DerpClient::relay_port`]). On by default; an
    /// [`crate::Endpoint`] asks a DERP server for relay sessions exactly
    /// when its [`crate::DerpServerOptions::options`] have this on. Servers
    /// that do not know the field (derper, an older Ferry) ignore it.
    pub relay_sessions: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tls_roots: TlsRoots::System,
            fast_start: true,
            websocket: false,
            connect_timeout: derp::DEFAULT_HANDSHAKE_TIMEOUT,
            target_connect_timeout: Duration::from_secs(1),
            keepalive_timeout: derp::DEFAULT_KEEPALIVE_TIMEOUT,
            ping_timeout: Duration::from_secs(5),
            backoff: BackoffOptions::default(),
            event_queue: 1024,
            command_queue: 256,
            plain_http: false,
            relay_sessions: true,
        }
    }
}

/// What a [`DerpClient`] reports, in the order it happened.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// A connection is up (the first one, and every reconnect).
    Connected {
        /// The server's DERP key.
        server_key: NodePublic,
        /// The server (`host:port`).
        server: String,
        /// Whether the handshake used fast start.
        fast_start: bool,
        /// Which target the connection is up to: an index into the ones
        /// the client was given, in their order (0 with one target).
        target: usize,
    },
    /// The connection was lost, or a reconnect attempt failed; the next
    /// attempt comes after `retry_in`.
    Disconnected {
        /// Why.
        error: Error,
        /// Delay before the next attempt.
        retry_in: Duration,
    },
    /// A packet from another client.
    Packet {
        /// The sender's key.
        src: NodePublic,
        /// The packet.
        data: Vec<u8>,
    },
    /// A peer this client sent to is no longer connected to the server.
    PeerGone {
        /// The peer.
        peer: NodePublic,
        /// Why, as the server said.
        reason: PeerGoneReason,
    },
    /// A client connected to the server (sent to watchers only).
    PeerPresent {
        /// The client's key.
        peer: NodePublic,
        /// Its address, when the server sent one.
        addr: Option<SocketAddr>,
        /// `PEER_PRESENT_*` flags.
        flags: u8,
        /// The client's application name, when the server sent a valid
        /// one (servers older than the name send none).
        app_name: Option<AppName>,
    },
    /// The server's view of this connection's health: a problem, or `None`
    /// when it is healthy again.
    Health {
        /// The problem text.
        problem: Option<String>,
    },
    /// The server is about to restart. The client reconnects by itself
    /// `reconnect_in` after this frame (instead of after its backoff delay).
    Restarting {
        /// When to reconnect, counted from the frame.
        reconnect_in: Duration,
        /// How long the server suggests to keep trying.
        try_for: Duration,
    },
    /// A pong answered one of this client's pings.
    Pong {
        /// Round-trip time.
        rtt: Duration,
    },
    /// A relay session with a peer: the answer to
    /// [`DerpSender::allocate`] (with its request id), or the peer's own
    /// allocation (request id 0). Bind it with
    /// [`ferry_proto::relay_session::Binder`] at
    /// [`DerpSender::relay_endpoint`].
    RelaySession(SessionOffer),
    /// A relay session ends (relaySessionEnd): its host is draining, or
    /// freed it. Ask again for the peer's session now.
    RelaySessionEnd {
        /// The session.
        vni: u32,
        /// The other client of the session.
        peer: NodePublic,
        /// Whether its host is draining (it still forwards for a while).
        draining: bool,
    },
    /// The relay refused an allocation.
    RelayRefused {
        /// The id [`DerpSender::allocate`] returned.
        request_id: u32,
        /// The peer asked for.
        peer: NodePublic,
        /// Why.
        reason: RefuseReason,
    },
}

/// Counters of one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Connections established (the first one included).
    pub connects: u64,
    /// Packets accepted by [`DerpSender::send`] and dropped because the
    /// connection ended before they were written.
    pub packets_dropped: u64,
}

#[derive(Debug, Default)]
struct Shared {
    connected: AtomicBool,
    server_key: Mutex<Option<NodePublic>>,
    /// The current connection's server address and relay-session port.
    relay: Mutex<(Option<SocketAddr>, Option<u16>)>,
    next_request: AtomicU32,
    connects: AtomicU64,
    dropped: AtomicU64,
}

enum Command {
    Send { dst: NodePublic, data: Vec<u8> },
    Ping { reply: oneshot::Sender<Duration> },
    NotePreferred(bool),
    Allocate(Allocate),
}

/// A DERP client: one connection to one server (or to the first working
/// node of a region), kept up by reconnecting.
///
/// Dropping it (or calling [`DerpClient::close`]) ends the connection.
#[derive(Debug)]
pub struct DerpClient {
    sender: DerpSender,
    events: mpsc::Receiver<Event>,
    task: tokio::task::JoinHandle<()>,
}

/// The sending half of a [`DerpClient`], cloneable, for tasks other than
/// the one receiving.
#[derive(Debug, Clone)]
pub struct DerpSender {
    cmds: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    public_key: NodePublic,
    ping_timeout: Duration,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Send { dst, data } => write!(f, "Send({dst:?}, {} bytes)", data.len()),
            Command::Ping { .. } => f.write_str("Ping"),
            Command::NotePreferred(p) => write!(f, "NotePreferred({p})"),
            Command::Allocate(a) => write!(f, "Allocate({}, {})", a.peer, a.request_id),
        }
    }
}

impl DerpClient {
    /// Connects to `url` (`http://host:port/derp` or `https://host/derp`)
    /// as `key`. Returns once the first handshake is done (or failed: the
    /// first attempt's error is returned, nothing is retried); from then on
    /// the client reconnects by itself. The first event is
    /// [`Event::Connected`].
    pub async fn connect(url: &str, key: NodePrivate, options: Options) -> Result<Self, Error> {
        DerpClient::connect_to(vec![Target::from_url(url)?], key, options).await
    }

    /// Connects to a DERP map region: its nodes in priority order (skipping
    /// `STUNOnly` ones), the first that completes a handshake wins; each
    /// reconnect tries them in the same order.
    pub async fn connect_region(
        region: &Region,
        key: NodePrivate,
        options: Options,
    ) -> Result<Self, Error> {
        let nodes: Vec<_> = region.derp_nodes().collect();
        let mut targets = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let mut t = Target::from_node(node, options.plain_http)?;
            // Tell a fallback node which one the client meant (§4.2).
            t.ideal_node = (i > 0).then(|| nodes[0].name.clone());
            targets.push(t);
        }
        DerpClient::connect_to(targets, key, options).await
    }

    /// Connects to the first of `targets` that completes a handshake
    /// (tried in order, on every reconnect too).
    pub async fn connect_to(
        targets: Vec<Target>,
        key: NodePrivate,
        options: Options,
    ) -> Result<Self, Error> {
        let (sender, events, mut driver) = DerpClient::prepare(targets, key, options)?;
        let conn = driver.dial_any(0).await?;
        driver.connected(&conn).await;
        Ok(DerpClient {
            sender,
            events,
            task: tokio::spawn(driver.run(conn)),
        })
    }

    /// Like [`DerpClient::connect`], but a first attempt that fails is not
    /// an error: it is reported as [`Event::Disconnected`] (the first
    /// event then) and retried after the backoff delay, like a lost
    /// connection. Returns once the first attempt has succeeded or failed.
    /// `Err` only for what no retry can mend: the URL, the TLS setup.
    pub async fn start(url: &str, key: NodePrivate, options: Options) -> Result<Self, Error> {
        DerpClient::start_to(vec![Target::from_url(url)?], key, options).await
    }

    /// Like [`DerpClient::start`], with several targets: the nodes of one
    /// region. The first attempt tries them in order; after a connection
    /// is lost, each round of attempts starts with the target after the
    /// one that was lost (its node may be gone), wrapping around.
    pub async fn start_to(
        targets: Vec<Target>,
        key: NodePrivate,
        options: Options,
    ) -> Result<Self, Error> {
        let (sender, events, mut driver) = DerpClient::prepare(targets, key, options)?;
        driver.rotate = true;
        let first = match driver.dial_any(0).await {
            Ok(conn) => {
                driver.connected(&conn).await;
                Ok(conn)
            }
            Err(e) => Err(e),
        };
        let task = tokio::spawn(async move {
            let conn = match first {
                Ok(conn) => conn,
                Err(e) => match driver.reconnect(e).await {
                    Some(conn) => conn,
                    None => return,
                },
            };
            driver.run(conn).await;
        });
        Ok(DerpClient {
            sender,
            events,
            task,
        })
    }

    /// The handles and the driver of a client that has not dialled yet.
    fn prepare(
        targets: Vec<Target>,
        key: NodePrivate,
        options: Options,
    ) -> Result<(DerpSender, mpsc::Receiver<Event>, Driver), Error> {
        if targets.is_empty() {
            return Err(Error::NoTarget);
        }
        let mut dial = Vec::with_capacity(targets.len());
        for t in targets {
            let tls = match &t.tls {
                Some(verify) => Some(tls::client_config(&options.tls_roots, verify, &t.host)?),
                None => None,
            };
            dial.push((t, tls));
        }
        let (cmd_tx, cmd_rx) = mpsc::channel(options.command_queue.max(1));
        let (ev_tx, ev_rx) = mpsc::channel(options.event_queue.max(1));
        let shared = Arc::new(Shared::default());
        let sender = DerpSender {
            cmds: cmd_tx,
            shared: shared.clone(),
            public_key: key.public(),
            ping_timeout: options.ping_timeout,
        };
        let driver = Driver {
            backoff: Backoff::new(&options.backoff),
            targets: dial,
            last: 0,
            rotate: false,
            key,
            options,
            cmds: cmd_rx,
            events: ev_tx,
            shared,
            restart: None,
            box_key: None,
            pings: HashMap::new(),
            next_ping: 0,
            scratch: Vec::new(),
        };
        Ok((sender, ev_rx, driver))
    }

    /// The next event. [`Error::Closed`] once the client has stopped.
    pub async fn recv(&mut self) -> Result<Event, Error> {
        self.events.recv().await.ok_or(Error::Closed)
    }

    /// A sending handle for other tasks.
    pub fn sender(&self) -> DerpSender {
        self.sender.clone()
    }

    /// See [`DerpSender::send`].
    pub async fn send(&self, dst: &NodePublic, data: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.sender.send(dst, data).await
    }

    /// See [`DerpSender::ping`].
    pub async fn ping(&self) -> Result<Duration, Error> {
        self.sender.ping().await
    }

    /// See [`DerpSender::note_preferred`].
    pub async fn note_preferred(&self, preferred: bool) -> Result<(), Error> {
        self.sender.note_preferred(preferred).await
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.sender.is_connected()
    }

    /// See [`DerpSender::relay_port`].
    pub fn relay_port(&self) -> Option<u16> {
        self.sender.relay_port()
    }

    /// See [`DerpSender::allocate`].
    pub async fn allocate(&self, peer: &NodePublic) -> Result<u32, Error> {
        self.sender.allocate(peer).await
    }

    /// See [`DerpSender::relay_endpoint`].
    pub fn relay_endpoint(&self, offer: &SessionOffer) -> Option<SocketAddr> {
        self.sender.relay_endpoint(offer)
    }

    /// The key of the server of the current (or last) connection.
    pub fn server_key(&self) -> Option<NodePublic> {
        *self.sender.shared.server_key.lock().expect("not poisoned")
    }

    /// This client's public key: its DERP address.
    pub fn public_key(&self) -> NodePublic {
        self.sender.public_key
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let s = &self.sender.shared;
        Stats {
            connects: s.connects.load(Ordering::Relaxed),
            packets_dropped: s.dropped.load(Ordering::Relaxed),
        }
    }

    /// Closes the connection and waits for the driver task to end.
    pub async fn close(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for DerpClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DerpSender {
    /// Sends `data` to the client with key `dst`. Waits while the command
    /// queue is full. [`Error::NotConnected`] while the client is
    /// reconnecting: DERP is best effort and packets are not held for a
    /// connection that does not exist yet.
    pub async fn send(&self, dst: &NodePublic, data: impl Into<Vec<u8>>) -> Result<(), Error> {
        let data = data.into();
        if data.len() > MAX_PACKET_SIZE {
            return Err(Error::PacketTooLarge {
                len: data.len(),
                max: MAX_PACKET_SIZE,
            });
        }
        self.command(Command::Send { dst: *dst, data }).await
    }

    /// Pings the server and returns the round-trip time (also reported as
    /// [`Event::Pong`]).
    pub async fn ping(&self) -> Result<Duration, Error> {
        let (reply, rtt) = oneshot::channel();
        self.command(Command::Ping { reply }).await?;
        match tokio::time::timeout(self.ping_timeout, rtt).await {
            Ok(Ok(rtt)) => Ok(rtt),
            Ok(Err(_)) => Err(Error::PingLost),
            Err(_) => Err(Error::PingTimeout {
                limit: self.ping_timeout,
            }),
        }
    }

    /// Tells the server whether it is this client's home (`notePreferred`).
    pub async fn note_preferred(&self, preferred: bool) -> Result<(), Error> {
        self.command(Command::NotePreferred(preferred)).await
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// The relay-session UDP port the current connection's server offered
    /// (serverInfo's `ferryRelay`); `None` when the client did not ask
    /// ([`Options::relay_sessions`]) or the server offers none (derper, an
    /// older Ferry, sessions off).
    pub fn relay_port(&self) -> Option<u16> {
        self.shared.relay.lock().expect("not poisoned").1
    }

    /// Asks the server for a relay session with `peer`; returns the request
    /// id that the answer ([`Event::RelaySession`] or
    /// [`Event::RelayRefused`]) carries. The peer gets its own offer.
    /// [`Error::NoRelaySessions`] when the server offers none.
    pub async fn allocate(&self, peer: &NodePublic) -> Result<u32, Error> {
        if self.relay_port().is_none() {
            return Err(if self.is_connected() {
                Error::NoRelaySessions
            } else {
                Error::NotConnected
            });
        }
        let request_id = self.shared.next_request.fetch_add(1, Ordering::Relaxed) + 1;
        self.command(Command::Allocate(Allocate {
            peer: *peer,
            request_id,
        }))
        .await?;
        Ok(request_id)
    }

    /// Where to bind `offer` from a UDP socket: its first endpoint, with an
    /// unspecified address (`0.0.0.0`, `::`: "where you reached the DERP
    /// server") replaced by the current connection's server address.
    /// `None` when that is needed and unknown.
    pub fn relay_endpoint(&self, offer: &SessionOffer) -> Option<SocketAddr> {
        let e = *offer.endpoints.first()?;
        if !e.ip().is_unspecified() {
            return Some(e);
        }
        let server = self.shared.relay.lock().expect("not poisoned").0?;
        Some(SocketAddr::new(server.ip().to_canonical(), e.port()))
    }

    async fn command(&self, cmd: Command) -> Result<(), Error> {
        if !self.is_connected() {
            return Err(if self.cmds.is_closed() {
                Error::Closed
            } else {
                Error::NotConnected
            });
        }
        self.cmds.send(cmd).await.map_err(|_| Error::Closed)
    }
}

/// A `restarting` frame's advice, kept until the connection ends.
#[derive(Debug, Clone, Copy)]
struct Restart {
    /// When to dial again.
    at: Instant,
    /// After this the advice is stale.
    until: Instant,
}

/// How a connection ended.
enum Ended {
    /// The application is gone.
    Shutdown,
    /// The connection failed or was closed; reconnect.
    Lost(Error),
}

struct Driver {
    targets: Vec<(Target, Option<TlsParams>)>,
    /// Index into `targets` of the connection up now, or of the last one.
    last: usize,
    /// Reconnects start after `last` (the nodes of one region: the one
    /// lost may be gone), not from the first target.
    rotate: bool,
    key: NodePrivate,
    options: Options,
    cmds: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    shared: Arc<Shared>,
    backoff: Backoff,
    restart: Option<Restart>,
    box_key: Option<BoxKey>,
    pings: HashMap<[u8; PING_LEN], (Instant, oneshot::Sender<Duration>)>,
    next_ping: u64,
    scratch: Vec<derp::Event>,
}

impl Driver {
    async fn run(mut self, mut conn: Conn) {
        loop {
            let error = match self.serve(&mut conn).await {
                Ended::Shutdown => return,
                Ended::Lost(error) => error,
            };
            self.shared.connected.store(false, Ordering::Release);
            // Pending pings fail with PingLost as their senders drop.
            self.pings.clear();
            tracing::debug!(%error, "DERP connection lost");
            match self.reconnect(error).await {
                Some(c) => conn = c,
                None => return,
            }
        }
    }

    /// Tries every target in order, from `targets[first]` on, wrapping
    /// around; the last error if none connects.
    async fn dial_any(&mut self, first: usize) -> Result<Conn, Error> {
        let mut last = None;
        let n = self.targets.len();
        for i in (0..n).map(|k| (first + k) % n) {
            let (target, tls) = &self.targets[i];
            match conn::dial(
                target,
                tls.as_ref(),
                &self.key,
                &self.options,
                self.box_key.clone(),
                n > 1,
            )
            .await
            {
                Ok(c) => {
                    self.box_key = c.derp.box_key().cloned();
                    self.last = i;
                    return Ok(c);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one target"))
    }

    async fn connected(&mut self, conn: &Conn) -> bool {
        self.backoff.reset();
        self.restart = None;
        *self.shared.server_key.lock().expect("not poisoned") = Some(conn.server_key);
        *self.shared.relay.lock().expect("not poisoned") = (conn.server_addr, conn.relay_port);
        self.shared.connects.fetch_add(1, Ordering::Relaxed);
        self.shared.connected.store(true, Ordering::Release);
        self.emit(Event::Connected {
            server_key: conn.server_key,
            server: conn.label.clone(),
            fast_start: conn.fast_start,
            target: self.last,
        })
        .await
    }

    async fn emit(&self, event: Event) -> bool {
        self.events.send(event).await.is_ok()
    }

    /// The delay before the next attempt: what a fresh `restarting` frame
    /// said (none when there is another node to go to: the restarting one
    /// is not waited for), or the backoff schedule.
    fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        match self.restart.take() {
            Some(_) if self.rotate && self.targets.len() > 1 => {
                self.backoff.reset();
                Duration::ZERO
            }
            Some(r) if now < r.until => {
                self.backoff.reset();
                r.at.saturating_duration_since(now)
            }
            _ => self.backoff.next_delay(),
        }
    }

    /// Waits and dials until a connection is up. `None` when the
    /// application is gone.
    async fn reconnect(&mut self, mut error: Error) -> Option<Conn> {
        loop {
            let retry_in = self.next_delay();
            if !self.emit(Event::Disconnected { error, retry_in }).await {
                return None;
            }
            let wake = Instant::now() + retry_in;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(wake) => break,
                    cmd = self.cmds.recv() => match cmd {
                        None => return None,
                        // Sent just before the connection ended: dropped.
                        Some(Command::Send { .. }) => {
                            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(_) => {}
                    },
                }
            }
            let first = if self.rotate { self.last + 1 } else { 0 };
            match self.dial_any(first).await {
                Ok(conn) => {
                    if !self.connected(&conn).await {
                        return None;
                    }
                    return Some(conn);
                }
                Err(e) => error = e,
            }
        }
    }

    /// Runs one connection until it ends.
    async fn serve(&mut self, conn: &mut Conn) -> Ended {
        let early = std::mem::take(&mut conn.early);
        for e in early {
            if !self.on_event(e).await {
                return Ended::Shutdown;
            }
        }
        loop {
            if let Err(e) = conn.flush().await {
                return Ended::Lost(e);
            }
            let deadline = conn.derp.poll_timeout().map(Instant::from_std);
            let Conn {
                io,
                rbuf,
                derp,
                ws,
                label,
                ..
            } = &mut *conn;
            // Unbiased: a flood of sends must not starve reading (the
            // keepalive deadline counts from the last byte read).
            tokio::select! {
                cmd = self.cmds.recv() => {
                    let Some(cmd) = cmd else { return Ended::Shutdown };
                    if let Err(e) = self.command(conn, cmd) {
                        return Ended::Lost(e);
                    }
                    // Take what else is queued, so it leaves in one write.
                    for _ in 0..64 {
                        let Ok(cmd) = self.cmds.try_recv() else { break };
                        if let Err(e) = self.command(conn, cmd) {
                            return Ended::Lost(e);
                        }
                    }
                }
                read = io.read(rbuf) => {
                    let n = match read {
                        Ok(n) => n,
                        Err(e) => return Ended::Lost(Error::io(label, e)),
                    };
                    let input = match conn::decode(ws, &rbuf[..n], label) {
                        Ok(input) => input,
                        Err(e) => return Ended::Lost(e),
                    };
                    let mut events = std::mem::take(&mut self.scratch);
                    let mut result =
                        derp.handle_bytes(conn::now(), input.bytes, |e| events.push(e.into_owned()));
                    if input.eof && result.is_ok() {
                        result = derp.handle_eof(|e| events.push(e.into_owned()));
                    }
                    for e in events.drain(..) {
                        if !self.on_event(e).await {
                            return Ended::Shutdown;
                        }
                    }
                    self.scratch = events;
                    if let Err(e) = result {
                        return Ended::Lost(Error::protocol(label, e));
                    }
                    if input.eof {
                        return Ended::Lost(Error::ServerClosed { server: label.clone() });
                    }
                }
                _ = sleep_until(deadline) => {
                    if let Err(e) = derp.handle_timeout(conn::now()) {
                        return Ended::Lost(Error::protocol(label, e));
                    }
                }
            }
        }
    }

    fn command(&mut self, conn: &mut Conn, cmd: Command) -> Result<(), Error> {
        let out = &mut conn.out;
        let result = match cmd {
            Command::Send { dst, data } => conn.derp.send_packet(out, &dst, &data),
            Command::NotePreferred(p) => conn.derp.note_preferred(out, p),
            Command::Allocate(a) => conn.derp.relay_allocate(out, &a),
            Command::Ping { reply } => {
                self.next_ping += 1;
                let data = self.next_ping.to_be_bytes();
                // Forget pings whose caller gave up.
                self.pings.retain(|_, (_, r)| !r.is_closed());
                self.pings.insert(data, (Instant::now(), reply));
                conn.derp.ping(out, data)
            }
        };
        result.map_err(|e| Error::protocol(&conn.label, e))
    }

    /// Hands one protocol event to the application; `false` when it is
    /// gone.
    async fn on_event(&mut self, event: derp::Event) -> bool {
        let event = match event {
            derp::Event::Packet { src, packet } => Event::Packet { src, data: packet },
            derp::Event::PeerGone { key, reason } => Event::PeerGone { peer: key, reason },
            derp::Event::PeerPresent {
                key,
                addr,
                flags,
                app_name,
            } => Event::PeerPresent {
                peer: key,
                addr,
                flags,
                app_name,
            },
            derp::Event::Health(text) => Event::Health {
                problem: (!text.is_empty()).then(|| String::from_utf8_lossy(&text).into_owned()),
            },
            derp::Event::Restarting {
                reconnect_in,
                try_for,
            } => {
                let now = Instant::now();
                self.restart = Some(Restart {
                    at: now + reconnect_in,
                    until: now + reconnect_in + try_for,
                });
                Event::Restarting {
                    reconnect_in,
                    try_for,
                }
            }
            derp::Event::RelaySession(offer) => Event::RelaySession(offer),
            // The host is not used yet; an offer of a session on another
            // node whose address this client cannot know is dropped.
            derp::Event::RelaySession2(offer) if offer.endpoints_usable() => {
                Event::RelaySession(offer.offer)
            }
            derp::Event::RelaySession2(offer) => {
                tracing::debug!(vni = offer.offer.vni, host = %offer.host, "cross-node session offer without a usable endpoint: dropped");
                return true;
            }
            derp::Event::RelaySessionEnd(end) => Event::RelaySessionEnd {
                vni: end.vni,
                peer: end.peer,
                draining: end.reason == ferry_proto::relay_session::v2::EndReason::Draining,
            },
            derp::Event::RelayRefused(r) => Event::RelayRefused {
                request_id: r.request_id,
                peer: r.peer,
                reason: r.reason,
            },
            derp::Event::Pong(data) => match self.pings.remove(&data) {
                Some((sent, reply)) => {
                    let rtt = sent.elapsed();
                    let _ = reply.send(rtt);
                    Event::Pong { rtt }
                }
                None => return true,
            },
            // Answered by the state machine (pings), tracked by it
            // (keepalives), or reported by the driver (the rest).
            derp::Event::Ping(_)
            | derp::Event::KeepAlive
            | derp::Event::Connected { .. }
            | derp::Event::ServerClosed => return true,
        };
        self.emit(event).await
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
