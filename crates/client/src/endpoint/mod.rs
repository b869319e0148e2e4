//! [`Endpoint`]: datagrams to and from peers by key, each on the best path
//! that works now (direct UDP, a relay session, DERP as the floor).
//!
//! The decisions are [`paths::Paths`]'s (sans-IO); this module is its tokio
//! driver:
//!
//! ```text
//! send() ── Paths::on_send ──▶ UDP socket (direct)   ─┐
//!                          └─▶ DERP writer task       ─┼─▶ peer
//! recv() ◀── queue ◀── driver task ◀── UDP socket ◀───┤
//!                                  ◀── DERP reader tasks
//!                      driver task: timers → pings, pongs, call-me-maybe,
//!                                   STUN; path events → subscribe()
//! ```
//!
//! - One UDP socket carries direct datagrams, relay sessions and STUN. A
//!   datagram is STUN when it opens like a binding response, else a peer
//!   message (`docs/relay-sessions.md` §6) whose 8-byte header says direct
//!   (VNI 0) or which relay session.
//! - One DERP client per configured relay; a peer is reached over DERP
//!   through the relay its [`PeerOptions::relay`] names. Every DERP payload
//!   is a peer message too (header with VNI 0 ‖ bytes).
//! - When that relay offers sessions (`docs/relay-sessions.md` §1), the
//!   endpoint asks for one with the peer over DERP and binds its slot from
//!   the UDP socket ([`relay_sessions::RelaySessions`]); once bound, the session is the
//!   peer's relay path, confirmed and kept alive by the same probes.
//! - Probes are sealed with this endpoint's key and the peer's; a probe
//!   from a key that is not a peer, or that does not open, is dropped.
//!   Relay bind replies are taken only from their session's relay address
//!   (others are counted, [`EndpointStats::foreign_bind_replies`]).
//!   Payloads on UDP carry no key: they are accepted only from an address
//!   (or relay session) that belongs to a peer's path.
//! - This side's candidate addresses (the socket's local address, or the
//!   host's addresses of its family when bound to a wildcard, of both
//!   families when bound to `[::]` dual-stack; the public address STUN
//!   reports; the addresses peers' pongs say they saw, at most four;
//!   [`EndpointOptions::advertise`]) go to every peer in call-me-maybe over
//!   DERP. A dual-stack socket sends to IPv4 addresses as IPv4-mapped.
//! - [`Endpoint::send`] never waits: a full queue, a socket that would
//!   block or no allowed path drops the datagram and counts it.
//! - The driver reads the UDP socket with `recvmmsg` and UDP GRO (a train
//!   is cut back into its datagrams), runs timers and sends what they
//!   queued once per batch, and hands the payloads of a turn to the
//!   application as one [`Datagrams`] ([`Endpoint::recv_batch`] takes it
//!   whole; [`Endpoint::recv`] one by one). [`Endpoint::send_batch`]
//!   locks the path table once for a batch and sends with `sendmmsg`,
//!   equal-size runs to one address as GSO trains ([`batch`]).
//!
//! ```no_run
//! use ferry_client::{Endpoint, EndpointOptions, PeerOptions, DerpServerOptions};
//! use ferry_proto::key::{NodePrivate, NodePublic};
//!
//! # async fn run(peer: NodePublic) -> Result<(), Box<dyn std::error::Error>> {
//! let relays = vec![DerpServerOptions::new("home", "https://derp.example.com/derp")];
//! let ep = Endpoint::bind(EndpointOptions::new(NodePrivate::generate(), relays)).await?;
//! ep.add_peer(peer, PeerOptions::default());
//! let mut switches = ep.subscribe();
//! ep.send(&peer, b"hello")?;
//! let (from, data) = ep.recv().await?;
//! println!("{} bytes from {from}, path {:?}", data.len(), ep.peer_status(&peer).unwrap().active);
//! let switch = switches.recv().await?;
//! println!("{:?} → {:?} ({:?}, {} possibly lost)", switch.from, switch.to, switch.reason, switch.lost);
//! # Ok(())
//! # }
//! ```

pub mod batch;
mod driver;
mod local;
mod options;
pub mod paths;
pub mod relay_sessions;

use crate::{DerpClient, DerpSender, Error};
pub use batch::{gro_segments, BatchSent, Datagrams, UdpBatchSender};
use driver::{derp_reader, derp_writer, Driver};
use ferry_proto::frame::PeerGoneReason;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl::{self, SharedKey};
use ferry_proto::peer_msg;
use ferry_proto::relay_session::SessionOffer;
use ferry_proto::udp_header::{Header, Protocol};
pub use options::{DerpServerOptions, EndpointOptions, PeerOptions};
use paths::{NoPath, Paths, Policy, Transmit};
pub use paths::{
    PathAddr, PathEvent, PathKind, PathState, PathStats, PathStatus, PeerStatus, SwitchReason,
    Timing,
};
use relay_sessions::RelaySessions;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{broadcast, mpsc, Notify};
use tokio::task::JoinHandle;

/// The largest application datagram [`Endpoint::send`] takes (what fits a
/// DERP packet after the 8-byte header).
pub const MAX_DATAGRAM: usize = ferry_proto::frame::MAX_PACKET_SIZE - ferry_proto::udp_header::LEN;

/// Why [`Endpoint::bind`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The UDP socket could not be bound.
    #[error("binding UDP {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A DERP server's URL or TLS setup is unusable (a server that cannot
    /// be reached is retried in the background instead).
    #[error("DERP server {name}: {source}")]
    Derp {
        /// The relay's name.
        name: String,
        /// Why.
        source: Error,
    },
    /// The endpoint's tasks have ended.
    #[error("endpoint closed")]
    Closed,
}

/// Why [`Endpoint::send`] dropped a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The key was never added with [`Endpoint::add_peer`].
    #[error("unknown peer")]
    UnknownPeer,
    /// The peer's `only` kind of path does not work now.
    #[error("no allowed path to the peer works now")]
    NoPath,
    /// Longer than [`MAX_DATAGRAM`].
    #[error("datagram of {len} bytes, at most {MAX_DATAGRAM}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// The socket or the DERP queue was full, or the send failed: dropped
    /// and counted.
    #[error("dropped: the path's queue is full or its send failed")]
    Dropped,
}

/// What [`Endpoint::send_batch`] did with a batch: every datagram is
/// counted once, as sent or under the reason [`Endpoint::send`] would
/// have given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Handed to the socket or queued for DERP.
    pub sent: usize,
    /// To keys never added ([`SendError::UnknownPeer`]).
    pub unknown_peer: usize,
    /// No allowed path works now ([`SendError::NoPath`]).
    pub no_path: usize,
    /// Longer than [`MAX_DATAGRAM`] ([`SendError::TooLarge`]).
    pub too_large: usize,
    /// The socket or the DERP queue did not take it ([`SendError::Dropped`]).
    pub dropped: usize,
}

impl SendReport {
    /// Datagrams not sent.
    pub fn failed(&self) -> usize {
        self.unknown_peer + self.no_path + self.too_large + self.dropped
    }
}

/// One DERP server as [`Endpoint::relay_status`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayStatus {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Whether the DERP connection is up.
    pub connected: bool,
    /// Connections established so far.
    pub connects: u64,
    /// Connections lost and attempts failed so far.
    pub failures: u64,
    /// Why the last attempt failed or the connection was lost, while it
    /// is down.
    pub last_error: Option<String>,
    /// When the next attempt is due, while it is down.
    pub next_attempt: Option<std::time::Instant>,
    /// The STUN server asked.
    pub stun: Option<SocketAddr>,
    /// This endpoint's address as that STUN server saw it.
    pub public_addr: Option<SocketAddr>,
    /// The relay's session port, when it offers relay sessions.
    pub relay_port: Option<u16>,
}

/// Counters of an endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams [`Endpoint::send`] dropped.
    pub send_dropped: u64,
    /// Datagrams received and dropped because [`Endpoint::recv`] lagged.
    pub recv_dropped: u64,
    /// Datagrams and DERP packets that were neither a peer message from a
    /// peer nor STUN (unparsable, unknown source, probes that did not open).
    pub rejected: u64,
    /// Of those, relay bind replies (challenge, bound) for one of this
    /// endpoint's sessions that came from an address other than that
    /// session's relay.
    pub foreign_bind_replies: u64,
    /// UDP GSO trains the kernel refused (a path MTU under 1,500 bytes),
    /// sent again one datagram at a time.
    pub gso_fallbacks: u64,
}

/// Something that happened to the endpoint, from [`Endpoint::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointEvent {
    /// A peer's active path changed (as [`Endpoint::subscribe`] reports).
    Path(PathEvent),
    /// A DERP connection is up (the first one, or again).
    RelayUp {
        /// Index into [`EndpointOptions::relays`].
        relay: usize,
        /// The relay-session port it offers.
        relay_port: Option<u16>,
    },
    /// A DERP connection was lost, or an attempt failed; the next one is
    /// due in `retry_in`.
    RelayDown {
        /// Index into [`EndpointOptions::relays`].
        relay: usize,
        /// Why.
        error: String,
        /// Delay before the next attempt.
        retry_in: Duration,
        /// Whether the connection had been up (lost) or not (an attempt
        /// failed).
        was_up: bool,
    },
    /// A peer's DERP server says the peer is not connected to it. Relays
    /// (Ferry and derper alike) send this when a peer leaves only to the
    /// clients that received packets from it; a peer this endpoint only
    /// sent to can leave unannounced.
    PeerGone {
        /// The peer.
        peer: NodePublic,
        /// As the server said.
        reason: PeerGoneReason,
    },
    /// A peer reported gone is back: its server said so (`peerPresent`),
    /// or an authenticated message from it arrived.
    PeerPresent {
        /// The peer.
        peer: NodePublic,
    },
    /// This endpoint's address as a relay's STUN server sees it changed.
    PublicAddr {
        /// Index into [`EndpointOptions::relays`].
        relay: usize,
        /// The address.
        addr: SocketAddr,
    },
}

/// What a relay's writer task sends.
enum ToRelay {
    Packet(NodePublic, Vec<u8>),
    Allocate(NodePublic),
}

/// What a relay's reader task hands the driver.
enum FromRelay {
    Packet(NodePublic, Vec<u8>),
    Offer(SessionOffer),
    Refused(NodePublic),
    Up,
    Down { error: String, retry_in: Duration },
    Gone(NodePublic, PeerGoneReason),
    Present(NodePublic),
}

struct DerpServer {
    name: String,
    url: String,
    stun: Option<SocketAddr>,
    sender: DerpSender,
    out: mpsc::Sender<ToRelay>,
    health: Mutex<RelayHealth>,
    public_addr: Mutex<Option<SocketAddr>>,
}

/// A DERP connection's state, as the driver saw its events.
#[derive(Default)]
struct RelayHealth {
    connected: bool,
    connects: u64,
    failures: u64,
    last_error: Option<String>,
    next_attempt: Option<std::time::Instant>,
}

struct PeerEntry {
    relay: usize,
    key: Arc<SharedKey>,
    /// Whether the peer's policy allows a relay-session path.
    sessions: bool,
}

/// Datagrams received for the application: whole batches, as the driver
/// filled them, handed over without copying.
#[derive(Default)]
struct Received {
    batches: VecDeque<Datagrams>,
    /// Emptied batches, for the driver to fill again.
    spare: Vec<Datagrams>,
    /// The driver has ended.
    closed: bool,
}

/// Emptied batches kept for reuse.
const MAX_SPARE: usize = 8;

/// The batch [`Endpoint::recv`] takes its datagrams from one by one.
#[derive(Default)]
struct Reader {
    current: Datagrams,
    next: usize,
}

struct Inner {
    key: NodePrivate,
    public: NodePublic,
    socket: UdpSocket,
    /// `send_batch`'s sendmmsg/GSO state.
    sender: Mutex<UdpBatchSender>,
    local_addr: SocketAddr,
    /// An IPv6 socket that also carries IPv4 (`IPV6_V6ONLY` off).
    dual_stack: bool,
    paths: Mutex<Paths>,
    sessions: Mutex<RelaySessions>,
    peers: RwLock<HashMap<NodePublic, PeerEntry>>,
    relays: Vec<DerpServer>,
    events: broadcast::Sender<PathEvent>,
    all_events: broadcast::Sender<EndpointEvent>,
    wake: Notify,
    discover: bool,
    advertise: Vec<SocketAddr>,
    send_dropped: Arc<AtomicU64>,
    gso_fallbacks: AtomicU64,
    recv_dropped: AtomicU64,
    rejected: AtomicU64,
    received: Mutex<Received>,
    /// Signalled when a batch is queued in `received` or it closes.
    received_ready: Notify,
    /// Datagrams in `received`'s batches.
    queued: AtomicUsize,
    /// Bytes of `received`'s batches (payloads and their header room).
    queued_bytes: AtomicUsize,
    /// [`EndpointOptions::queue_bytes`].
    queue_bytes_limit: usize,
    /// [`EndpointOptions::queue`].
    queue_limit: usize,
}

/// Datagrams to and from peers over the best working path. Dropping it
/// stops its tasks and closes its connections.
pub struct Endpoint {
    inner: Arc<Inner>,
    reader: tokio::sync::Mutex<Reader>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("key", &self.inner.public)
            .field("local_addr", &self.inner.local_addr)
            .finish_non_exhaustive()
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl Endpoint {
    /// Binds the UDP socket, makes a first attempt to connect to every DERP
    /// server (all at once) and starts probing. A server that cannot be
    /// reached does not fail the bind: it is retried in the background with
    /// exponential backoff and jitter ([`crate::Options::backoff`]), each failure
    /// logged and reported ([`EndpointEvent::RelayDown`],
    /// [`Endpoint::relay_status`]). Direct paths need no relay once
    /// confirmed, but the first exchange of addresses goes over DERP.
    pub async fn bind(opts: EndpointOptions) -> Result<Endpoint, EndpointError> {
        let (socket, dual_stack) =
            bind_socket(opts.bind, opts.socket_buffer).map_err(|source| EndpointError::Bind {
                addr: opts.bind,
                source,
            })?;
        let local_addr = socket.local_addr().map_err(|source| EndpointError::Bind {
            addr: opts.bind,
            source,
        })?;
        // Best effort: without GRO every datagram is its own slot.
        let _ = ferry_sys::gso::set_gro(socket.as_fd(), true);
        let sender = Mutex::new(UdpBatchSender::new(&socket));
        let queue = opts.queue.max(1);
        let (derp_tx, derp_rx) = mpsc::channel::<(usize, FromRelay)>(queue);
        let mut tasks = Vec::new();
        let mut relays = Vec::new();
        let send_dropped = Arc::new(AtomicU64::new(0));
        let starts: Vec<_> = opts
            .relays
            .iter()
            .map(|r| {
                let mut options = r.options.clone();
                options.relay_sessions = opts.relay_sessions;
                let (url, key) = (r.url.clone(), opts.key.clone());
                tokio::spawn(async move { DerpClient::start(&url, key, options).await })
            })
            .collect();
        for (i, (r, start)) in opts.relays.iter().zip(starts).enumerate() {
            let client = start
                .await
                .map_err(|_| EndpointError::Closed)?
                .map_err(|source| EndpointError::Derp {
                    name: r.name.clone(),
                    source,
                })?;
            let stun = match r.stun {
                Some(a) => Some(a),
                None => default_stun(&r.url).await,
            };
            let (out_tx, out_rx) = mpsc::channel(queue);
            let client_sender = client.sender();
            tasks.push(tokio::spawn(derp_writer(
                client.sender(),
                out_rx,
                send_dropped.clone(),
            )));
            tasks.push(tokio::spawn(derp_reader(i, client, derp_tx.clone())));
            relays.push(DerpServer {
                name: r.name.clone(),
                url: r.url.clone(),
                stun,
                sender: client_sender,
                out: out_tx,
                health: Mutex::default(),
                public_addr: Mutex::new(None),
            });
        }
        let inner = Arc::new(Inner {
            public: opts.key.public(),
            key: opts.key,
            socket,
            sender,
            local_addr,
            dual_stack,
            paths: Mutex::new(Paths::new(opts.timing, opts.seed)),
            sessions: Mutex::new(RelaySessions::new(opts.session_timing)),
            peers: RwLock::new(HashMap::new()),
            relays,
            events: broadcast::channel(256).0,
            all_events: broadcast::channel(256).0,
            wake: Notify::new(),
            discover: opts.discover,
            advertise: opts.advertise,
            send_dropped,
            gso_fallbacks: AtomicU64::new(0),
            recv_dropped: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            received: Mutex::default(),
            received_ready: Notify::new(),
            queued: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            queue_bytes_limit: opts.queue_bytes,
            queue_limit: queue,
        });
        inner.update_candidates();
        let driver = Driver::new(inner.clone(), derp_rx, opts.stun_interval);
        tasks.push(tokio::spawn(driver.run()));
        Ok(Endpoint {
            inner,
            reader: tokio::sync::Mutex::default(),
            tasks,
        })
    }

    /// Adds a peer (or changes how it is reached). It is reachable over
    /// DERP at once; better paths follow as probes confirm them.
    pub fn add_peer(&self, key: NodePublic, opts: PeerOptions) {
        let relay = opts.relay.min(self.inner.relays.len().saturating_sub(1));
        self.inner.peers.write().expect("not poisoned").insert(
            key,
            PeerEntry {
                relay,
                key: Arc::new(SharedKey::new(&self.inner.key, &key)),
                sessions: matches!(opts.only, None | Some(PathKind::RelaySession)),
            },
        );
        let policy = Policy {
            prefer: opts.prefer,
            only: opts.only,
        };
        self.inner.lock_paths().add_peer(now(), key, policy);
        self.inner.update_sessions(&key);
        self.inner.wake.notify_one();
    }

    /// Removes a peer: its datagrams are no longer accepted.
    pub fn remove_peer(&self, key: &NodePublic) {
        self.inner.peers.write().expect("not poisoned").remove(key);
        self.inner.lock_sessions().remove(key);
        self.inner.lock_paths().remove_peer(key);
    }

    /// Sends `data` to `peer` on its active path. Never waits: what cannot
    /// go out now is dropped and counted.
    pub fn send(&self, peer: &NodePublic, data: &[u8]) -> Result<(), SendError> {
        if data.len() > MAX_DATAGRAM {
            return Err(SendError::TooLarge { len: data.len() });
        }
        let path = self
            .inner
            .lock_paths()
            .on_send(peer, data.len())
            .map_err(|e| match e {
                NoPath::UnknownPeer => SendError::UnknownPeer,
                NoPath::NoneAllowed => SendError::NoPath,
            });
        let result = path.and_then(|path| match path {
            PathAddr::Direct(addr) | PathAddr::RelaySession { addr, .. } => {
                self.inner.send_payload_udp(vni_of(&path), data, addr)
            }
            PathAddr::Derp => {
                let mut buf = Vec::with_capacity(ferry_proto::udp_header::LEN + data.len());
                peer_msg::put_payload(&mut buf, 0, data);
                self.inner.transmit(peer, &path, buf)
            }
        });
        if result.is_err() {
            self.inner.send_dropped.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Sends every datagram of `batch` to its peer on the peer's active
    /// path, as [`Endpoint::send`] would one by one, but with one lock of
    /// the path table and few system calls: the datagrams bound for the
    /// UDP socket leave in `sendmmsg` batches, runs of equal size to one
    /// address as UDP GSO trains. Never waits; the datagrams that cannot go
    /// out now are dropped and counted. `batch` is left as it was (its
    /// header room now written), to be cleared and refilled.
    pub fn send_batch(&self, batch: &mut Datagrams) -> SendReport {
        let mut report = SendReport::default();
        let mut udp = std::mem::take(&mut batch.udp);
        let mut derp = std::mem::take(&mut batch.derp);
        udp.clear();
        derp.clear();
        {
            let mut paths = self.inner.lock_paths();
            for i in 0..batch.len() {
                let (peer, len) = batch.item(i);
                if len > MAX_DATAGRAM {
                    report.too_large += 1;
                    continue;
                }
                match paths.on_send(&peer, len) {
                    Err(NoPath::UnknownPeer) => report.unknown_peer += 1,
                    Err(NoPath::NoneAllowed) => report.no_path += 1,
                    Ok(PathAddr::Derp) => derp.push(i),
                    Ok(path @ (PathAddr::Direct(addr) | PathAddr::RelaySession { addr, .. })) => {
                        udp.push((self.inner.wire_addr(addr), batch.seal(i, vni_of(&path))));
                    }
                }
            }
        }
        if !udp.is_empty() {
            // What the socket does not take now is dropped.
            let r = self
                .inner
                .lock_sender()
                .send(&self.inner.socket, batch.bytes(), &udp);
            report.sent += r.sent;
            report.dropped += udp.len() - r.sent;
            self.inner
                .gso_fallbacks
                .fetch_add(r.fallbacks as u64, Ordering::Relaxed);
        }
        for &i in &derp {
            let msg = batch.seal(i, 0);
            let (peer, _) = batch.item(i);
            match self
                .inner
                .transmit(&peer, &PathAddr::Derp, batch.bytes()[msg].to_vec())
            {
                Ok(()) => report.sent += 1,
                Err(SendError::NoPath) => report.no_path += 1,
                Err(_) => report.dropped += 1,
            }
        }
        batch.udp = udp;
        batch.derp = derp;
        self.inner
            .send_dropped
            .fetch_add(report.failed() as u64, Ordering::Relaxed);
        report
    }

    /// The next datagram from a peer.
    pub async fn recv(&self) -> Result<(NodePublic, Vec<u8>), EndpointError> {
        let mut reader = self.reader.lock().await;
        if reader.next >= reader.current.len() {
            self.next_batch(&mut reader).await?;
        }
        let (peer, data) = reader.current.get(reader.next).expect("within the batch");
        let out = (*peer, data.to_vec());
        reader.next += 1;
        Ok(out)
    }

    /// Waits for datagrams from peers and replaces `batch`'s contents with
    /// them (one or more, in the order they arrived); returns how many.
    /// Handing back the same `batch` each time allocates nothing per
    /// datagram: received batches are moved, not copied, and the emptied
    /// buffers go back to the receiving side.
    pub async fn recv_batch(&self, batch: &mut Datagrams) -> Result<usize, EndpointError> {
        let mut reader = self.reader.lock().await;
        batch.clear();
        if reader.next < reader.current.len() {
            // What `recv` left of the batch it was taking from.
            batch.append_from(&reader.current, reader.next);
            reader.next = reader.current.len();
            return Ok(batch.len());
        }
        self.next_batch(&mut reader).await?;
        std::mem::swap(batch, &mut reader.current);
        reader.current.clear();
        reader.next = 0;
        Ok(batch.len())
    }

    /// Waits for the next received batch and makes it the reader's
    /// current one (its previous one goes back to the driver). Cancel-safe:
    /// nothing is taken before the last await.
    async fn next_batch(&self, reader: &mut Reader) -> Result<(), EndpointError> {
        loop {
            {
                let mut r = self.inner.received.lock().expect("not poisoned");
                if let Some(b) = r.batches.pop_front() {
                    self.inner.queued.fetch_sub(b.len(), Ordering::Relaxed);
                    self.inner
                        .queued_bytes
                        .fetch_sub(b.bytes().len(), Ordering::Relaxed);
                    let mut old = std::mem::replace(&mut reader.current, b);
                    reader.next = 0;
                    old.clear();
                    if r.spare.len() < MAX_SPARE {
                        r.spare.push(old);
                    }
                    return Ok(());
                }
                if r.closed {
                    return Err(EndpointError::Closed);
                }
            }
            self.inner.received_ready.notified().await;
        }
    }

    /// Path switches from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<PathEvent> {
        self.inner.events.subscribe()
    }

    /// Everything from now on: path switches, relays up and down, peers
    /// gone and back, public address changes.
    pub fn events(&self) -> broadcast::Receiver<EndpointEvent> {
        self.inner.all_events.subscribe()
    }

    /// A peer's active path, every path's state, round trip and counters,
    /// and the last switch.
    pub fn peer_status(&self, key: &NodePublic) -> Option<PeerStatus> {
        self.inner.lock_paths().status(key)
    }

    /// The DERP servers.
    pub fn relay_status(&self) -> Vec<RelayStatus> {
        self.inner
            .relays
            .iter()
            .map(|r| {
                let h = r.health.lock().expect("not poisoned");
                RelayStatus {
                    name: r.name.clone(),
                    url: r.url.clone(),
                    connected: h.connected,
                    connects: h.connects,
                    failures: h.failures,
                    last_error: h.last_error.clone(),
                    next_attempt: h.next_attempt,
                    stun: r.stun,
                    public_addr: *r.public_addr.lock().expect("not poisoned"),
                    relay_port: r.sender.relay_port(),
                }
            })
            .collect()
    }

    /// The UDP socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// This endpoint's key.
    pub fn public_key(&self) -> NodePublic {
        self.inner.public
    }

    /// The addresses announced to peers now.
    pub fn local_candidates(&self) -> Vec<SocketAddr> {
        self.inner.lock_paths().local_candidates().to_vec()
    }

    /// Counters.
    pub fn stats(&self) -> EndpointStats {
        EndpointStats {
            send_dropped: self.inner.send_dropped.load(Ordering::Relaxed),
            recv_dropped: self.inner.recv_dropped.load(Ordering::Relaxed),
            rejected: self.inner.rejected.load(Ordering::Relaxed),
            foreign_bind_replies: self.inner.lock_sessions().foreign_replies(),
            gso_fallbacks: self.inner.gso_fallbacks.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn vni_of(path: &PathAddr) -> u32 {
    match path {
        PathAddr::RelaySession { vni, .. } => *vni,
        PathAddr::Direct(_) | PathAddr::Derp => 0,
    }
}

/// A non-blocking UDP socket on `addr` with (up to) `buffer` bytes of
/// kernel buffer each way, so bursts are not dropped before the driver
/// reads them; bound to `[::]`, dual-stack where the system allows it.
/// `true` when it is dual-stack.
fn bind_socket(addr: SocketAddr, buffer: usize) -> std::io::Result<(UdpSocket, bool)> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    // Best effort: the kernel caps both at its configured maximum.
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Not the system's default (net.ipv6.bindv6only) but what a
        // wildcard endpoint means: both families. A system without IPv4
        // refuses; the socket is then IPv6 alone.
        let _ = socket.set_only_v6(false);
    }
    let dual_stack = addr.is_ipv6() && socket.only_v6().is_ok_and(|only| !only);
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok((UdpSocket::from_std(socket.into())?, dual_stack))
}

/// The URL's host, port 3478, resolved.
async fn default_stun(url: &str) -> Option<SocketAddr> {
    let target = crate::Target::from_url(url).ok()?;
    let mut addrs = tokio::net::lookup_host((target.host.as_str(), 3478))
        .await
        .ok()?;
    addrs.next()
}

impl Inner {
    fn lock_paths(&self) -> std::sync::MutexGuard<'_, Paths> {
        self.paths.lock().expect("not poisoned")
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, RelaySessions> {
        self.sessions.lock().expect("not poisoned")
    }

    /// The relay a peer is reached through over DERP.
    fn relay_of(&self, peer: &NodePublic) -> Option<&DerpServer> {
        self.relays.get(self.relay_index_of(peer)?)
    }

    fn relay_index_of(&self, peer: &NodePublic) -> Option<usize> {
        Some(self.peers.read().expect("not poisoned").get(peer)?.relay)
    }

    /// Sends one datagram from the UDP socket without waiting; to an IPv4
    /// address as IPv4-mapped when the socket is IPv6.
    fn send_udp(&self, buf: &[u8], to: SocketAddr) -> std::io::Result<usize> {
        self.socket.try_send_to(buf, self.wire_addr(to))
    }

    /// `to` as the socket takes it: IPv4 as IPv4-mapped on an IPv6 socket.
    fn wire_addr(&self, to: SocketAddr) -> SocketAddr {
        match to {
            SocketAddr::V4(v4) if self.local_addr.is_ipv6() => {
                SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
            }
            other => other,
        }
    }

    /// Sends one payload to `to` as a peer message of session `vni` (0:
    /// direct), header and data gathered by the kernel: no copy, no
    /// allocation.
    fn send_payload_udp(&self, vni: u32, data: &[u8], to: SocketAddr) -> Result<(), SendError> {
        let header = Header::data(Protocol::Payload, vni).to_bytes();
        let to = socket2::SockAddr::from(self.wire_addr(to));
        let parts = [std::io::IoSlice::new(&header), std::io::IoSlice::new(data)];
        self.socket
            .try_io(Interest::WRITABLE, || {
                socket2::SockRef::from(&self.socket).send_to_vectored(&parts, &to)
            })
            .map(|_| ())
            .map_err(|e| {
                tracing::trace!(addr = %to.as_socket().map_or_else(String::new, |a| a.to_string()), error = %e, "UDP send failed");
                SendError::Dropped
            })
    }

    fn lock_sender(&self) -> std::sync::MutexGuard<'_, UdpBatchSender> {
        self.sender.lock().expect("not poisoned")
    }

    /// Sends a finished peer message on `path`.
    fn transmit(&self, peer: &NodePublic, path: &PathAddr, buf: Vec<u8>) -> Result<(), SendError> {
        match path {
            PathAddr::Direct(addr) | PathAddr::RelaySession { addr, .. } => {
                match self.send_udp(&buf, *addr) {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        tracing::trace!(%addr, error = %e, "UDP send failed");
                        Err(SendError::Dropped)
                    }
                }
            }
            PathAddr::Derp => self
                .relay_of(peer)
                .ok_or(SendError::NoPath)?
                .out
                .try_send(ToRelay::Packet(*peer, buf))
                .map_err(|_| SendError::Dropped),
        }
    }

    /// Seals and sends a probe.
    fn send_probe(&self, t: &Transmit) {
        let Some(key) = self
            .peers
            .read()
            .expect("not poisoned")
            .get(&t.peer)
            .map(|p| p.key.clone())
        else {
            return;
        };
        let mut buf = Vec::with_capacity(128);
        peer_msg::put_probe(
            &mut buf,
            vni_of(&t.path),
            &self.public,
            &key,
            &nacl::random_nonce(),
            &t.probe,
        );
        // A probe that cannot go out is a lost probe; the schedule covers it.
        let _ = self.transmit(&t.peer, &t.path, buf);
    }

    /// Recomputes the addresses announced to peers.
    fn update_candidates(&self) {
        let mut addrs = self.advertise.clone();
        if self.discover {
            let port = self.local_addr.port();
            if self.local_addr.ip().is_unspecified() {
                let mut ips = local::addresses(self.local_addr.is_ipv6());
                if self.dual_stack {
                    ips.extend(local::addresses(false));
                }
                addrs.extend(ips.into_iter().map(|ip| SocketAddr::new(ip, port)));
            } else {
                addrs.push(self.local_addr);
            }
            for r in &self.relays {
                if let Some(a) = *r.public_addr.lock().expect("not poisoned") {
                    addrs.push(a);
                }
            }
        }
        self.lock_paths().set_local_candidates(now(), addrs);
    }

    fn reject(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Seeks a relay session with `peer` while its policy allows one and
    /// its relay offers them; stops when the relay (connected) offers none
    /// or the policy rules it out. While the relay is down, nothing
    /// changes: its next connection decides.
    fn update_sessions(&self, peer: &NodePublic) {
        let Some((relay, allowed)) = self
            .peers
            .read()
            .expect("not poisoned")
            .get(peer)
            .map(|p| (p.relay, p.sessions))
        else {
            return;
        };
        let sender = self.relays.get(relay).map(|r| &r.sender);
        let offered = sender.and_then(|s| s.relay_port()).is_some();
        let connected = sender.is_some_and(|s| s.is_connected());
        let mut sessions = self.lock_sessions();
        if allowed && offered {
            sessions.want(now(), *peer);
        } else if !allowed || connected {
            sessions.remove(peer);
        }
    }

    /// Publishes an event to [`Endpoint::events`] (no subscriber is fine).
    fn publish(&self, event: EndpointEvent) {
        let _ = self.all_events.send(event);
    }
}
