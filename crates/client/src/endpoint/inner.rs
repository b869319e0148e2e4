//! The state an [`super::Endpoint`] shares with its tasks: the socket, the
//! path and session managers, the peers, the DERP servers, the receive
//! queue, the counters; and the sends that every caller of them makes
//! (one datagram on a path, a probe, the candidates to announce).

use super::batch::{Datagrams, UdpBatchSender};
use super::events::{EventKind, Publisher};
use super::local;
use super::paths::{NoPath, PathAddr, PathKind, Paths, Transmit};
use super::relay_sessions::RelaySessions;
use super::status::{Reject, RejectCounters};
use super::SendError;
use crate::DerpSender;
use ferry_proto::frame::PeerGoneReason;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl::{self, SharedKey};
use ferry_proto::peer_msg;
use ferry_proto::relay_session::{RefuseReason, SessionOffer};
use ferry_proto::udp_header::{Header, Protocol};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, Notify};

/// What a DERP server's writer task sends.
pub(super) enum ToRelay {
    Packet(NodePublic, Vec<u8>),
    Allocate(NodePublic),
}

/// What a DERP server's reader task hands the driver.
pub(super) enum FromRelay {
    Packet(NodePublic, Vec<u8>),
    Offer(SessionOffer),
    Refused(NodePublic, RefuseReason),
    /// Session `u32` with the peer ended (relaySessionEnd); whether its
    /// host is draining.
    End(NodePublic, u32, bool),
    /// Connected to the node of this index in [`DerpServer::urls`].
    Up(usize),
    Down {
        error: String,
        retry_in: Duration,
    },
    Gone(NodePublic, PeerGoneReason),
    Present(NodePublic),
}

pub(super) struct DerpServer {
    pub(super) name: String,
    /// Its URL, then the URLs of its region's other nodes.
    pub(super) urls: Vec<String>,
    pub(super) stun: Option<SocketAddr>,
    pub(super) sender: DerpSender,
    pub(super) out: mpsc::Sender<ToRelay>,
    pub(super) health: Mutex<RelayHealth>,
    pub(super) public_addr: Mutex<Option<SocketAddr>>,
}

/// A DERP connection's state, as the driver saw its events.
#[derive(Default)]
pub(super) struct RelayHealth {
    pub(super) connected: bool,
    /// While connected: the index in [`DerpServer::urls`] of the node.
    pub(super) node: Option<usize>,
    pub(super) connects: u64,
    pub(super) failures: u64,
    pub(super) last_error: Option<String>,
    pub(super) next_attempt: Option<std::time::Instant>,
}

pub(super) struct PeerEntry {
    pub(super) relay: usize,
    pub(super) key: Arc<SharedKey>,
    /// Whether the peer's policy allows a relay-session path.
    pub(super) sessions: bool,
}

/// Datagrams received for the application: whole batches, as the driver
/// filled them, handed over without copying.
#[derive(Default)]
pub(super) struct Inbox {
    pub(super) batches: VecDeque<Datagrams>,
    /// Emptied batches, for the driver to fill again.
    pub(super) spare: Vec<Datagrams>,
    /// The driver has ended.
    pub(super) closed: bool,
}

pub(super) struct Inner {
    pub(super) key: NodePrivate,
    pub(super) public: NodePublic,
    pub(super) socket: UdpSocket,
    /// `send_batch`'s sendmmsg/GSO state.
    pub(super) sender: Mutex<UdpBatchSender>,
    pub(super) local_addr: SocketAddr,
    /// An IPv6 socket that also carries IPv4 (`IPV6_V6ONLY` off).
    pub(super) dual_stack: bool,
    pub(super) paths: Mutex<Paths>,
    pub(super) sessions: Mutex<RelaySessions>,
    pub(super) peers: RwLock<HashMap<NodePublic, PeerEntry>>,
    pub(super) relays: Vec<DerpServer>,
    /// [`super::EndpointOptions::home`].
    pub(super) home: usize,
    pub(super) events: Publisher,
    pub(super) wake: Notify,
    pub(super) discover: bool,
    pub(super) advertise: Vec<SocketAddr>,
    /// [`super::Endpoint::close`] was called.
    pub(super) closed: AtomicBool,
    pub(super) send_dropped: Arc<AtomicU64>,
    pub(super) gso_fallbacks: AtomicU64,
    pub(super) recv_dropped: AtomicU64,
    pub(super) rejected: RejectCounters,
    pub(super) received: Mutex<Inbox>,
    /// Signalled when a batch is queued in `received` or it closes.
    pub(super) received_ready: Notify,
    /// Datagrams in `received`'s batches.
    pub(super) queued: AtomicUsize,
    /// Bytes of `received`'s batches (payloads and their header room).
    pub(super) queued_bytes: AtomicUsize,
    /// [`super::EndpointOptions::queue_bytes`].
    pub(super) queue_bytes_limit: usize,
    /// [`super::EndpointOptions::queue`].
    pub(super) queue_limit: usize,
}

/// The time on tokio's clock (paused in tests), as the managers take it.
pub(super) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// The session id a path's header carries (0: direct and DERP).
pub(super) fn vni_of(path: &PathAddr) -> u32 {
    match path {
        PathAddr::RelaySession { vni, .. } => *vni,
        PathAddr::Direct(_) | PathAddr::Derp => 0,
    }
}

/// What a failed UDP send means: a full buffer, or the system's refusal.
fn udp_error(path: PathKind, e: &std::io::Error) -> SendError {
    if e.kind() == std::io::ErrorKind::WouldBlock {
        SendError::QueueFull { path }
    } else {
        SendError::Io {
            path,
            kind: e.kind(),
        }
    }
}

impl Inner {
    pub(super) fn lock_paths(&self) -> std::sync::MutexGuard<'_, Paths> {
        self.paths.lock().expect("not poisoned")
    }

    pub(super) fn lock_sessions(&self) -> std::sync::MutexGuard<'_, RelaySessions> {
        self.sessions.lock().expect("not poisoned")
    }

    pub(super) fn lock_sender(&self) -> std::sync::MutexGuard<'_, UdpBatchSender> {
        self.sender.lock().expect("not poisoned")
    }

    /// The DERP server a peer is reached through.
    pub(super) fn relay_of(&self, peer: &NodePublic) -> Option<&DerpServer> {
        self.relays.get(self.relay_index_of(peer)?)
    }

    pub(super) fn relay_index_of(&self, peer: &NodePublic) -> Option<usize> {
        Some(self.peers.read().expect("not poisoned").get(peer)?.relay)
    }

    /// The DERP server asked for a session with `peer`, reached through
    /// server `relay`: the home of the lower key of the pair
    /// ([`super::EndpointOptions::home`]), so both sides ask the same one.
    pub(super) fn session_relay(&self, peer: &NodePublic, relay: usize) -> usize {
        if self.public < *peer {
            self.home
        } else {
            relay
        }
    }

    /// The DERP server asked for a session with `peer`.
    pub(super) fn session_relay_of(&self, peer: &NodePublic) -> Option<&DerpServer> {
        let relay = self.relay_index_of(peer)?;
        self.relays.get(self.session_relay(peer, relay))
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The active path for a datagram of `len` bytes to `peer`, counted
    /// on it ([`Paths::on_send`]).
    pub(super) fn route(&self, peer: &NodePublic, len: usize) -> Result<PathAddr, SendError> {
        if self.is_closed() {
            return Err(SendError::Closed);
        }
        self.lock_paths().on_send(peer, len).map_err(send_error)
    }

    /// Takes back the count of a datagram that did not go.
    pub(super) fn unroute(&self, peer: &NodePublic, path: &PathAddr, len: usize) {
        self.lock_paths().unsend(peer, path, len);
    }

    /// Sends one datagram from the UDP socket without waiting; to an IPv4
    /// address as IPv4-mapped when the socket is IPv6.
    pub(super) fn send_udp(&self, buf: &[u8], to: SocketAddr) -> std::io::Result<usize> {
        self.socket.try_send_to(buf, self.wire_addr(to))
    }

    /// `to` as the socket takes it: IPv4 as IPv4-mapped on an IPv6 socket.
    pub(super) fn wire_addr(&self, to: SocketAddr) -> SocketAddr {
        match to {
            SocketAddr::V4(v4) if self.local_addr.is_ipv6() => {
                SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port())
            }
            other => other,
        }
    }

    /// Sends one payload on `path` without waiting: on UDP, header and
    /// data gathered by the kernel (no copy); on DERP, queued for the
    /// server's writer (refused while its connection is down).
    pub(super) fn try_send_payload(
        &self,
        peer: &NodePublic,
        path: &PathAddr,
        data: &[u8],
    ) -> Result<(), SendError> {
        match path {
            PathAddr::Direct(addr) | PathAddr::RelaySession { addr, .. } => {
                let header = Header::data(Protocol::Payload, vni_of(path)).to_bytes();
                let to = socket2::SockAddr::from(self.wire_addr(*addr));
                let parts = [std::io::IoSlice::new(&header), std::io::IoSlice::new(data)];
                self.socket
                    .try_io(Interest::WRITABLE, || {
                        socket2::SockRef::from(&self.socket).send_to_vectored(&parts, &to)
                    })
                    .map(|_| ())
                    .map_err(|e| {
                        tracing::trace!(%addr, error = %e, "UDP send failed");
                        udp_error(path.kind(), &e)
                    })
            }
            PathAddr::Derp => {
                let relay = self.derp_for(peer)?;
                relay
                    .out
                    .try_send(ToRelay::Packet(*peer, derp_payload(data)))
                    .map_err(|e| match e {
                        mpsc::error::TrySendError::Full(_) => SendError::QueueFull {
                            path: PathKind::Derp,
                        },
                        mpsc::error::TrySendError::Closed(_) => SendError::Closed,
                    })
            }
        }
    }

    /// The peer's DERP server, if its connection is up.
    pub(super) fn derp_for(&self, peer: &NodePublic) -> Result<&DerpServer, SendError> {
        match self.relay_of(peer) {
            Some(r) if r.sender.is_connected() => Ok(r),
            Some(_) => Err(SendError::NoPath),
            None => Err(SendError::UnknownPeer),
        }
    }

    /// Sends a finished peer message (a probe) on `path`; what cannot go
    /// now is lost, as probes may be.
    fn transmit(&self, peer: &NodePublic, path: &PathAddr, buf: Vec<u8>) {
        match path {
            PathAddr::Direct(addr) | PathAddr::RelaySession { addr, .. } => {
                if let Err(e) = self.send_udp(&buf, *addr) {
                    tracing::trace!(%addr, error = %e, "UDP send failed");
                }
            }
            PathAddr::Derp => {
                if let Some(r) = self.relay_of(peer) {
                    let _ = r.out.try_send(ToRelay::Packet(*peer, buf));
                }
            }
        }
    }

    /// Seals and sends a probe.
    pub(super) fn send_probe(&self, t: &Transmit) {
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
        self.transmit(&t.peer, &t.path, buf);
    }

    /// Recomputes the addresses announced to peers.
    pub(super) fn update_candidates(&self) {
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

    pub(super) fn reject(&self, why: Reject) {
        self.rejected.count(why);
    }

    /// Seeks a relay session with `peer` while its policy allows one and
    /// the pair's session server ([`Inner::session_relay`]) offers them;
    /// stops when that server (connected) offers none or the policy rules
    /// it out. While the server is down, nothing changes: its next
    /// connection decides.
    pub(super) fn update_sessions(&self, peer: &NodePublic) {
        let Some((relay, allowed)) = self
            .peers
            .read()
            .expect("not poisoned")
            .get(peer)
            .map(|p| (p.relay, p.sessions))
        else {
            return;
        };
        let sender = self
            .relays
            .get(self.session_relay(peer, relay))
            .map(|r| &r.sender);
        let offered = sender.and_then(|s| s.relay_port()).is_some();
        let connected = sender.is_some_and(|s| s.is_connected());
        let mut sessions = self.lock_sessions();
        if allowed && offered {
            sessions.want(now(), *peer);
        } else if !allowed || connected {
            sessions.remove(peer);
        }
    }

    /// Publishes an event to [`super::Endpoint::events`], stamped now.
    pub(super) fn publish(&self, kind: EventKind) {
        self.events.publish(kind);
    }
}

/// A payload as a DERP packet: the header (no session) and the bytes.
pub(super) fn derp_payload(data: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(ferry_proto::udp_header::LEN + data.len());
    peer_msg::put_payload(&mut buf, 0, data);
    buf
}

/// The path manager's refusal as the caller's error.
pub(super) fn send_error(e: NoPath) -> SendError {
    match e {
        NoPath::UnknownPeer => SendError::UnknownPeer,
        NoPath::TooLarge { len, max, path } => SendError::TooLarge { len, max, path },
        NoPath::NoneAllowed => SendError::NoPath,
    }
}
