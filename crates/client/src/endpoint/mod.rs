//! [`Endpoint`]: datagrams to and from peers by key, each on the best path
//! that works now (direct UDP, a relay session, DERP as the floor).
//!
//! The decisions are [`paths::Paths`]'s and
//! [`relay_sessions::RelaySessions`]'s (sans-IO); this module is their
//! tokio driver:
//!
//! ```text
//! send() ── Paths::on_send ──▶ UDP socket (direct, relay session) ─┐
//!                          └─▶ DERP writer task                  ─┼─▶ peer
//! recv() ◀── queue ◀── driver task ◀── UDP socket ◀──────────────┤
//!                                  ◀── DERP reader tasks
//!                      driver task: timers → pings, pongs, call-me-maybe,
//!                                   binds, STUN; path events → events()
//! ```
//!
//! - One UDP socket carries direct datagrams, relay sessions and STUN. A
//!   datagram is STUN when it opens like a binding response, else a peer
//!   message (`docs/relay-sessions.md` §6) whose 8-byte header says direct
//!   (VNI 0) or which relay session.
//! - One DERP client per configured DERP server; a peer is reached over
//!   DERP through the server its [`PeerOptions::relay`] names. Every DERP
//!   payload is a peer message too (header with VNI 0 ‖ bytes).
//! - When the pair's session server offers relay sessions
//!   (`docs/relay-sessions.md` §1; the home of the lower key,
//!   [`EndpointOptions::home`], so both sides ask one server), the
//!   endpoint asks for one with the peer over DERP and binds its slot
//!   from the UDP socket ([`relay_sessions::RelaySessions`]); once bound,
//!   the session is the peer's relay-session path, confirmed and kept
//!   alive by the same probes.
//! - Probes are sealed with this endpoint's key and the peer's; a probe
//!   from a key that is not a peer, or that does not open, is rejected.
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
//! - The driver reads the UDP socket with `recvmmsg` and UDP GRO (a train
//!   is cut back into its datagrams), runs timers and sends what they
//!   queued once per batch, and hands the payloads of a turn to the
//!   application as one [`Datagrams`] ([`Endpoint::recv_batch`] takes it
//!   whole; [`Endpoint::recv`] one by one). [`Endpoint::send_batch`]
//!   locks the path table once for a batch and sends with `sendmmsg`,
//!   equal-size runs to one address as GSO trains ([`batch`]).

pub mod batch;
mod driver;
mod error;
mod events;
mod inner;
mod local;
mod mtu;
mod options;
mod path_status;
pub mod paths;
pub mod relay_sessions;
mod send;
mod status;

use crate::{DerpClient, Target};
pub use batch::{gro_segments, BatchSent, Datagram, Datagrams, UdpBatchSender};
use driver::{derp_reader, derp_writer, Driver};
pub use error::{AddPeerError, EndpointError, SendError, SendReport};
use events::Publisher;
pub use events::{EndpointEvent, EventKind, Events};
use ferry_proto::key::NodePublic;
use ferry_proto::nacl::SharedKey;
use inner::{now, DerpServer, FromRelay, Inner, PeerEntry};
pub use mtu::{PathMtu, MAX_DATAGRAM, MAX_DERP_DATAGRAM};
pub use options::{DerpServerOptions, EndpointOptions, PeerOptions};
pub use paths::{
    PathAddr, PathEvent, PathKind, PathState, PathStats, PathStatus, PeerStatus, PeerTotals,
    SwitchReason, Timing,
};
use paths::{Paths, Policy};
use relay_sessions::RelaySessions;
pub use relay_sessions::SessionTiming;
pub use status::{EndpointStats, Rejected, RelayStatus};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// Emptied batches kept for reuse.
const MAX_SPARE: usize = 8;

/// The batch [`Endpoint::recv`] takes its datagrams from one by one.
#[derive(Default)]
struct Reader {
    current: Datagrams,
    next: usize,
}

/// Datagrams to and from peers over the best working path.
///
/// Made by [`Endpoint::bind`]; shared between tasks by reference (every
/// method takes `&self`: put it in an `Arc`). [`Endpoint::close`] (or
/// dropping it) stops its tasks and closes its DERP connections.
pub struct Endpoint {
    inner: Arc<Inner>,
    reader: tokio::sync::Mutex<Reader>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("key", &self.inner.public)
            .field("local_addr", &self.inner.local_addr)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Binds the UDP socket, makes a first attempt to connect to every
    /// DERP server (all at once) and starts probing. A server that cannot
    /// be reached does not fail the bind: it is retried in the background
    /// with exponential backoff and jitter ([`crate::Options::backoff`]),
    /// each failure logged and reported ([`EventKind::RelayDown`],
    /// [`Endpoint::relay_status`]). Direct paths need no DERP server once
    /// confirmed, but the first exchange of addresses goes over DERP.
    pub async fn bind(opts: EndpointOptions) -> Result<Endpoint, EndpointError> {
        if opts.home > 0 && opts.home >= opts.relays.len() {
            return Err(EndpointError::UnknownHome {
                home: opts.home,
                relays: opts.relays.len(),
            });
        }
        let (socket, dual_stack) =
            bind_socket(opts.bind, opts.socket_buffer).map_err(|source| EndpointError::Bind {
                addr: opts.bind,
                source,
            })?;
        let local_addr = socket.local_addr().map_err(|source| EndpointError::Bind {
            addr: opts.bind,
            source,
        })?;
        // Asks whether the socket takes GSO trains: before GRO goes on,
        // so that the asking cannot turn it off.
        let sender = Mutex::new(UdpBatchSender::new(&socket));
        // Best effort: without GRO every datagram is its own slot, and
        // the kernel cuts each train a peer sends back into datagrams.
        let _ = ferry_sys::gso::set_gro(socket.as_fd(), true);
        let queue = opts.queue.max(1);
        let (derp_tx, derp_rx) = mpsc::channel::<(usize, FromRelay)>(queue);
        let mut tasks = Vec::new();
        let mut relays = Vec::new();
        let send_dropped = Arc::new(AtomicU64::new(0));
        // Each server's own options say whether to ask it for relay
        // sessions (on by default).
        let starts: Vec<_> = opts
            .relays
            .iter()
            .map(|r| {
                let urls: Vec<String> = std::iter::once(&r.url)
                    .chain(&r.fallback_urls)
                    .cloned()
                    .collect();
                let (key, options) = (opts.key.clone(), r.options.clone());
                tokio::spawn(async move {
                    let targets = urls
                        .iter()
                        .map(|u| Target::from_url(u))
                        .collect::<Result<Vec<_>, _>>()?;
                    DerpClient::start_to(targets, key, options).await
                })
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
                urls: std::iter::once(&r.url)
                    .chain(&r.fallback_urls)
                    .cloned()
                    .collect(),
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
            home: opts.home,
            events: Publisher::new(opts.event_queue),
            wake: Notify::new(),
            discover: opts.discover,
            advertise: opts.advertise,
            closed: AtomicBool::new(false),
            send_dropped,
            gso_fallbacks: AtomicU64::new(0),
            recv_dropped: AtomicU64::new(0),
            rejected: Default::default(),
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
            tasks: Mutex::new(tasks),
        })
    }

    /// Adds a peer (or changes how it is reached). It is reachable over
    /// DERP at once; better paths follow as probes confirm them. Refused
    /// when [`PeerOptions::relay`] names no DERP server of this endpoint.
    pub fn add_peer(&self, key: NodePublic, opts: PeerOptions) -> Result<(), AddPeerError> {
        let relays = self.inner.relays.len();
        if opts.relay >= relays {
            return Err(AddPeerError::UnknownRelay {
                relay: opts.relay,
                relays,
            });
        }
        self.inner.peers.write().expect("not poisoned").insert(
            key,
            PeerEntry {
                relay: opts.relay,
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
        Ok(())
    }

    /// Removes a peer: its datagrams are no longer accepted.
    pub fn remove_peer(&self, key: &NodePublic) {
        self.inner.peers.write().expect("not poisoned").remove(key);
        self.inner.lock_sessions().remove(key);
        self.inner.lock_paths().remove_peer(key);
    }

    /// The next datagram from a peer, with the peer and the path it came
    /// on. [`EndpointError::Closed`] once the endpoint is closed and every
    /// datagram received before was taken. Cancel-safe.
    pub async fn recv(&self) -> Result<Datagram, EndpointError> {
        let mut reader = self.reader.lock().await;
        if reader.next >= reader.current.len() {
            self.next_batch(&mut reader).await?;
        }
        let out = reader
            .current
            .datagram(reader.next)
            .expect("a received datagram within the batch");
        reader.next += 1;
        Ok(out)
    }

    /// Waits for datagrams from peers and replaces `batch`'s contents with
    /// them (one or more, in the order they arrived, each with its peer and
    /// [`Datagrams::path`]); returns how many. Handing back the same
    /// `batch` each time allocates nothing per datagram: received batches
    /// are moved, not copied, and the emptied buffers go back to the
    /// receiving side.
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

    /// A subscription to everything that happens from now on: path
    /// switches, DERP servers up and down, peers gone and back, public
    /// address changes; each stamped with the wall-clock time. See
    /// [`Events`] for what a subscriber that falls behind is told.
    pub fn events(&self) -> Events {
        self.inner.events.subscribe()
    }

    /// A peer's active path, every path's state, round trip, limits and
    /// counters, its totals by kind of path, and the last switch.
    pub fn peer_status(&self, key: &NodePublic) -> Option<PeerStatus> {
        self.inner.lock_paths().status(key)
    }

    /// How large a datagram to `peer` its active path carries now (`None`:
    /// not a peer, or no path works under its `only`).
    pub fn path_mtu(&self, peer: &NodePublic) -> Option<PathMtu> {
        Some(self.peer_status(peer)?.active?.mtu())
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
                    url: r.urls[0].clone(),
                    node: h.node.map(|i| r.urls[i].clone()),
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
            rejected: self.inner.rejected.snapshot(),
            foreign_bind_replies: self.inner.lock_sessions().foreign_replies(),
            gso_fallbacks: self.inner.gso_fallbacks.load(Ordering::Relaxed),
        }
    }

    /// Closes the endpoint: stops its tasks (no more probes, no more
    /// datagrams read), closes its DERP connections, and returns once they
    /// have stopped. Afterwards every send fails with
    /// [`SendError::Closed`], [`Endpoint::recv`] returns what was received
    /// before and then [`EndpointError::Closed`], and event subscriptions
    /// end once they have taken the events before. The UDP socket is
    /// released when the endpoint is dropped. Calling it again does
    /// nothing.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("not poisoned"));
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        self.inner.events.close();
        // The driver's end marked the receive queue closed; in case it had
        // ended before, mark it here too.
        self.inner.received.lock().expect("not poisoned").closed = true;
        self.inner.received_ready.notify_waiters();
    }

    /// Whether [`Endpoint::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            for t in tasks.iter() {
                t.abort();
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::key::NodePrivate;

    /// The endpoint's socket has UDP GRO on once bound (where the kernel
    /// has it and can say so): a peer's GSO trains arrive whole.
    #[tokio::test]
    async fn the_socket_keeps_gro_on() {
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        if !ferry_sys::gso::probe(probe.as_fd()).gro {
            return ferry_testkit::skip!("no UDP GRO on this kernel");
        }
        let gro = ferry_sys::gso::gro;
        if gro(probe.as_fd()).is_err() {
            return ferry_testkit::skip!("this kernel cannot say whether GRO is on (before 5.12)");
        }
        // Nothing listens there; the bind does not wait for the relay.
        let relay = DerpServerOptions::new("none", "http://127.0.0.1:9");
        let mut opts = EndpointOptions::new(NodePrivate::generate(), vec![relay]);
        opts.bind = "127.0.0.1:0".parse().unwrap();
        let ep = Endpoint::bind(opts).await.unwrap();
        assert!(gro(ep.inner.socket.as_fd()).unwrap(), "GRO on");
    }
}
