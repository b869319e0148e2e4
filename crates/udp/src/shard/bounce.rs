//! Bounce routes on a shard: each client address gets its own upstream
//! socket ([`BounceClient`]), connected to the route's target, so replies
//! find their client by socket. Clients open on the first datagram (within
//! the per-source rate and the route's limit, where the oldest client its
//! target never answered may give way), close when idle, and follow a
//! target that DNS moved.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::wireguard as wg;
use ferry_sys::train::Trains;
use mio::unix::SourceFd;
use mio::{Interest, Token};

use super::send::Out;
use super::{Shard, CLIENT_BASE, ROUNDS};
use crate::hub::DropReason;
use crate::metrics::Drop;
use crate::published::Published;
use crate::socket;

/// A bounce target's current address (none while it has never resolved),
/// updated by the resolver thread and read by shards when its generation
/// changes.
pub type TargetCell = Published<Option<SocketAddr>>;

/// A bounce route as every shard sees it.
#[derive(Debug)]
pub struct Route {
    /// Where clients are relayed to.
    pub target: Arc<TargetCell>,
    /// How long a client may stay silent before it is forgotten.
    pub idle_timeout: Duration,
    /// Forward only WireGuard-shaped datagrams.
    pub wireguard_only: bool,
    /// The route's clients on every shard, and their limit.
    pub clients: Arc<ClientCap>,
}

/// The limit on a bounce route's concurrent clients, over all shards
/// (`max_sessions`): one count that every shard serving the route shares.
/// A shard takes a place when it opens a client and the place is given
/// back when the client is dropped, whatever removes it (idle expiry, a
/// failed open, the shard stopping). Touched only when a client opens or
/// closes, never per packet.
#[derive(Debug)]
pub struct ClientCap {
    max: usize,
    open: AtomicUsize,
}

impl ClientCap {
    /// A count of none out of `max`.
    pub fn new(max: usize) -> Arc<ClientCap> {
        Arc::new(ClientCap {
            max,
            open: AtomicUsize::new(0),
        })
    }

    /// Clients open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A place for one more client, unless `max` are open.
    fn take(self: &Arc<Self>) -> Option<ClientPlace> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| ClientPlace(self.clone()))
    }
}

/// One client's place in its route's [`ClientCap`], given back on drop.
#[derive(Debug)]
struct ClientPlace(Arc<ClientCap>);

impl std::ops::Drop for ClientPlace {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One client of a bounce route: its own upstream socket, connected to
/// the route's target, and what it sends there waiting in `outbox`.
pub(super) struct BounceClient {
    pub(super) sock: UdpSocket,
    pub(super) route: usize,
    pub(super) listener: usize,
    pub(super) client: SocketAddr,
    pub(super) target: SocketAddr,
    pub(super) last_active: Instant,
    pub(super) outbox: Trains,
    pub(super) touched: bool,
    pub(super) drops_seen: u32,
    /// Tells this client from a later one in the same slab slot.
    pub(super) serial: u64,
    /// The target sent something back (see [`super::unanswered`]).
    pub(super) answered: bool,
    /// Its place in the route's client limit.
    _place: ClientPlace,
}

/// What [`screen_bounce`] decided for part of a received slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screened {
    /// Forward `len` bytes from offset `start` of the slot: whole
    /// datagrams of the slot's segment size (the last may be shorter).
    Pass {
        /// Offset in the slot.
        start: usize,
        /// Bytes.
        len: usize,
    },
    /// Drop one datagram.
    Drop(DropReason),
}

/// Screens one received slot of a bounce route: `slot` holds datagrams of
/// `seg` bytes each, glued by GRO, of which only the last may be shorter
/// (`seg == slot.len()` for a single datagram).
///
/// Every datagram that may be a WireGuard initiation (148 bytes) is
/// classified, and an initiation passes only if `allow_initiation` grants
/// it (the per-source handshake limit, so one client cannot use up the
/// server's handshake budget for everyone behind the relay). That includes
/// a 148-byte initiation at the end of a train of larger datagrams, where
/// the segment size is not 148. On a `wireguard_only` route every datagram
/// is classified and the ones that are not WireGuard are dropped.
///
/// `out` gets, in order, runs of datagrams to forward and one drop per
/// refused datagram; runs are as long as the refusals allow, so a slot with
/// nothing to refuse passes as one run (one GSO message).
pub fn screen_bounce(
    slot: &[u8],
    seg: usize,
    wireguard_only: bool,
    mut allow_initiation: impl FnMut() -> bool,
    mut out: impl FnMut(Screened),
) {
    let seg = seg.max(1);
    let mut run = 0;
    let mut at = 0;
    while at < slot.len() {
        let len = seg.min(slot.len() - at);
        if wireguard_only || len == wg::INITIATION_LEN {
            let refused = match wg::classify(&slot[at..at + len]) {
                Ok(wg::Message::Initiation { .. }) if !allow_initiation() => {
                    Some(DropReason::RateLimited)
                }
                Err(_) if wireguard_only => Some(DropReason::NotWireGuard),
                _ => None,
            };
            if let Some(why) = refused {
                if run < at {
                    out(Screened::Pass {
                        start: run,
                        len: at - run,
                    });
                }
                out(Screened::Drop(why));
                run = at + len;
            }
        }
        at += len;
    }
    if run < slot.len() {
        out(Screened::Pass {
            start: run,
            len: slot.len() - run,
        });
    }
}

impl Shard {
    /// Client datagrams arriving on a bounce listener.
    pub(super) fn bounce_in(&mut self, li: usize, route: usize) -> bool {
        for _ in 0..ROUNDS {
            let n = self.recv(Some(li), None);
            if n == 0 || n == usize::MAX {
                return false;
            }
            for i in 0..n {
                let m = self.meta[i];
                let Some(src) = m.src else { continue };
                if m.truncated {
                    self.metrics.count_drop(Drop::Truncated, 1);
                    continue;
                }
                let key = match self.by_client.get(&(route, src)) {
                    Some(&k) => k,
                    None => match self.open_client(route, li, src) {
                        Some(k) => k,
                        None => continue,
                    },
                };
                let start = i * self.slot;
                let seg = m.segment.max(1);
                let s = &mut self.clients[key];
                s.last_active = self.now;
                let wireguard_only = self.routes[route].wireguard_only;
                let limiter = &mut self.handshake_limiter;
                let now = self.now;
                let (metrics, gso) = (&self.metrics, self.gso);
                screen_bounce(
                    &self.buf[start..start + m.len],
                    seg,
                    wireguard_only,
                    || limiter.allow(src.ip(), now),
                    |screened| match screened {
                        Screened::Pass { start: at, len } => {
                            s.outbox.push(None, start + at, len, seg, gso)
                        }
                        Screened::Drop(why) => metrics.count_drop(Drop::Hub(why), 1),
                    },
                );
                if !s.touched {
                    s.touched = true;
                    self.touched.push(key);
                }
            }
            let mut touched = std::mem::take(&mut self.touched);
            for &key in &touched {
                let s = &mut self.clients[key];
                s.touched = false;
                let f = s.outbox.flush(s.sock.as_fd(), &self.buf, &mut self.tx);
                self.account(&f, Out::Target);
            }
            touched.clear();
            self.touched = touched;
            if n < self.asked {
                return false;
            }
        }
        true
    }

    pub(super) fn open_client(
        &mut self,
        route: usize,
        li: usize,
        client: SocketAddr,
    ) -> Option<usize> {
        if !self.client_limiter.allow(client.ip(), self.now) {
            self.metrics.count_drop(Drop::ClientRate, 1);
            return None;
        }
        // Dropped on any refusal below, which gives the place back. At the
        // limit, the oldest client nobody answered may give way.
        let Some(place) = self.routes[route].clients.take().or_else(|| {
            let clients = &self.clients;
            let live = |k: usize, serial| {
                clients
                    .get(k)
                    .is_some_and(|s| s.serial == serial && !s.answered)
            };
            let key = self.unanswered.take_oldest(route, self.now, live)?;
            self.close_client(key);
            self.metrics.sessions_evicted.add(1);
            self.routes[route].clients.take()
        }) else {
            self.metrics.count_drop(Drop::ClientLimit, 1);
            return None;
        };
        let Some(target) = self.route_targets[route] else {
            self.metrics.count_drop(Drop::TargetUnresolved, 1);
            return None;
        };
        let sock = match socket::upstream(target, 0, &self.socket_options) {
            Ok(s) => s,
            Err(e) => {
                self.metrics.count_drop(Drop::ClientFailed, 1);
                self.warn("cannot open an upstream socket for a new client", &e);
                return None;
            }
        };
        let entry = self.clients.vacant_entry();
        let key = entry.key();
        let serial = self.next_serial;
        if let Err(e) = self.poll.registry().register(
            &mut SourceFd(&sock.as_raw_fd()),
            Token(CLIENT_BASE + key),
            Interest::READABLE,
        ) {
            self.metrics.count_drop(Drop::ClientFailed, 1);
            self.warn("cannot register an upstream socket", &e);
            return None;
        }
        tracing::debug!(shard = self.id, %client, %target, upstream = ?sock.local_addr().ok(), "new bounce client");
        entry.insert(BounceClient {
            sock,
            route,
            listener: li,
            client,
            target,
            last_active: self.now,
            outbox: Trains::new(),
            touched: false,
            drops_seen: 0,
            serial,
            answered: false,
            _place: place,
        });
        self.next_serial += 1;
        self.unanswered.opened(route, key, serial, self.now);
        self.by_client.insert((route, client), key);
        self.metrics.sessions_opened.add(1);
        Some(key)
    }

    /// Target datagrams arriving on a client's upstream socket.
    pub(super) fn bounce_out(&mut self, key: usize) -> bool {
        if !self.clients.contains(key) {
            return false;
        }
        for _ in 0..ROUNDS {
            let n = self.recv(None, Some(key));
            if n == usize::MAX {
                continue;
            }
            if n == 0 {
                return false;
            }
            let s = &mut self.clients[key];
            s.last_active = self.now;
            s.answered = true;
            let (li, client) = (s.listener, s.client);
            let l = &mut self.listeners[li];
            for (i, m) in self.meta[..n].iter().enumerate() {
                if m.truncated {
                    self.metrics.count_drop(Drop::Truncated, 1);
                    continue;
                }
                l.outbox.push(
                    Some(client),
                    i * self.slot,
                    m.len,
                    m.segment.max(1),
                    self.gso,
                );
            }
            let f = l.outbox.flush(l.sock.as_fd(), &self.buf, &mut self.tx);
            self.account(&f, Out::Client);
            if n < self.asked {
                return false;
            }
        }
        true
    }

    pub(super) fn close_client(&mut self, key: usize) {
        let s = self.clients.remove(key);
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&s.sock.as_raw_fd()));
        self.by_client.remove(&(s.route, s.client));
        self.again.retain(|t| t.0 != CLIENT_BASE + key);
        tracing::debug!(shard = self.id, client = %s.client, "bounce client closed");
    }

    /// Points every client of route `r` at its new target. The upstream
    /// socket keeps its local port, so the server's view of the client
    /// does not change: it is re-connected in place when the kernel would
    /// send from the same local address, and replaced by a socket on the
    /// same port otherwise (a connected UDP socket keeps the source
    /// address it was first given, which the new route may not reach).
    pub(super) fn retarget(&mut self, r: usize) {
        let Some(target) = self.route_targets[r] else {
            return;
        };
        let source = socket::route_source(target).ok();
        let keys: Vec<usize> = self
            .clients
            .iter()
            .filter(|(_, s)| s.route == r && s.target != target)
            .map(|(k, _)| k)
            .collect();
        for key in keys {
            let s = &mut self.clients[key];
            let local = s.sock.local_addr().ok();
            let same_source = local.is_some_and(|l| Some(l.ip()) == source);
            if same_source
                && socket2::SockRef::from(&s.sock)
                    .connect(&target.into())
                    .is_ok()
            {
                s.target = target;
                self.metrics.sessions_retargeted.add(1);
                continue;
            }
            let port = local.map_or(0, |l| l.port());
            match self.replace_upstream(key, target, port) {
                Ok(()) => self.metrics.sessions_retargeted.add(1),
                Err(e) => self.warn("cannot move a client to the new target", &e),
            }
        }
        tracing::info!(shard = self.id, %target, "bounce clients now go to the re-resolved target");
    }

    /// Gives client `key` a new upstream socket connected to `target`, on
    /// local port `port` if it can be had, else on any port. The old
    /// socket is closed first, to free its port.
    pub(super) fn replace_upstream(
        &mut self,
        key: usize,
        target: SocketAddr,
        port: u16,
    ) -> io::Result<()> {
        let token = Token(CLIENT_BASE + key);
        let registry = self.poll.registry();
        let s = &mut self.clients[key];
        registry.deregister(&mut SourceFd(&s.sock.as_raw_fd()))?;
        // An unconnected stand-in takes the old socket's place meanwhile;
        // if everything below fails, the client idles out.
        let stand_in = UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
        drop(std::mem::replace(&mut s.sock, stand_in));
        let sock = socket::upstream(target, port, &self.socket_options)
            .or_else(|_| socket::upstream(target, 0, &self.socket_options))?;
        registry.register(&mut SourceFd(&sock.as_raw_fd()), token, Interest::READABLE)?;
        s.sock = sock;
        s.target = target;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initiation() -> Vec<u8> {
        let mut m = vec![0x11u8; wg::INITIATION_LEN];
        m[..4].copy_from_slice(&[1, 0, 0, 0]);
        m
    }

    fn transport(len: usize) -> Vec<u8> {
        let mut m = vec![0xd0u8; len];
        m[..4].copy_from_slice(&[4, 0, 0, 0]);
        m
    }

    /// Screens `slot` with a limiter that grants `tokens` initiations;
    /// returns what `out` got and how many initiations were asked about.
    fn screen(slot: &[u8], seg: usize, wg_only: bool, tokens: usize) -> (Vec<Screened>, usize) {
        let mut asked = 0;
        let mut got = Vec::new();
        screen_bounce(
            slot,
            seg,
            wg_only,
            || {
                asked += 1;
                asked <= tokens
            },
            |s| got.push(s),
        );
        (got, asked)
    }

    #[test]
    fn a_client_cap_is_shared_and_its_places_come_back() {
        let cap = ClientCap::new(3);
        // Two shards racing for places: three in all, never more.
        let held: Vec<Vec<ClientPlace>> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..2)
                .map(|_| scope.spawn(|| (0..100).filter_map(|_| cap.take()).collect()))
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(held.iter().map(Vec::len).sum::<usize>(), 3);
        assert_eq!(cap.open(), 3);
        assert!(cap.take().is_none(), "full");
        // A client dropped (closed, expired, or its shard stopped) gives
        // its place back, and only its own.
        let mut held: Vec<ClientPlace> = held.into_iter().flatten().collect();
        held.pop();
        assert_eq!(cap.open(), 2);
        held.push(cap.take().expect("a place came back"));
        assert!(cap.take().is_none());
        drop(held);
        assert_eq!(cap.open(), 0);
    }

    #[test]
    fn an_initiation_ending_a_train_of_larger_datagrams_is_counted() {
        // Three 200-byte transport datagrams, then an initiation,
        // glued by GRO with a segment size of 200.
        let slot = [transport(200), transport(200), transport(200), initiation()].concat();
        let (got, asked) = screen(&slot, 200, false, 0);
        assert_eq!(asked, 1, "the initiation was looked at");
        assert_eq!(
            got,
            [
                Screened::Pass { start: 0, len: 600 },
                Screened::Drop(DropReason::RateLimited)
            ]
        );
        // With a token left it passes, and the train stays one run.
        let (got, asked) = screen(&slot, 200, false, 1);
        assert_eq!(asked, 1);
        assert_eq!(got, [Screened::Pass { start: 0, len: 748 }]);
    }

    #[test]
    fn every_initiation_of_a_148_byte_train_is_counted() {
        let init = initiation();
        // A 148-byte transport datagram is not an initiation: never counted.
        let slot = [init.clone(), transport(148), init.clone(), init].concat();
        let (got, asked) = screen(&slot, 148, false, 1);
        assert_eq!(asked, 3);
        assert_eq!(
            got,
            [
                Screened::Pass { start: 0, len: 296 },
                Screened::Drop(DropReason::RateLimited),
                Screened::Drop(DropReason::RateLimited)
            ]
        );
    }

    #[test]
    fn other_trains_pass_whole_without_asking() {
        // Neither the segment size nor the last datagram is 148 bytes.
        let slot = [transport(200), transport(200), transport(150)].concat();
        assert_eq!(
            screen(&slot, 200, false, 0),
            (vec![Screened::Pass { start: 0, len: 550 }], 0)
        );
        // Not WireGuard at all, on a route that does not care.
        assert_eq!(
            screen(b"hello", 5, false, 0),
            (vec![Screened::Pass { start: 0, len: 5 }], 0)
        );
    }

    #[test]
    fn wireguard_only_routes_drop_the_rest_datagram_by_datagram() {
        let mut junk = transport(100);
        junk[0] = 9;
        let slot = [transport(100), junk, transport(100), transport(60)].concat();
        let (got, asked) = screen(&slot, 100, true, 0);
        assert_eq!(asked, 0);
        assert_eq!(
            got,
            [
                Screened::Pass { start: 0, len: 100 },
                Screened::Drop(DropReason::NotWireGuard),
                Screened::Pass {
                    start: 200,
                    len: 160
                }
            ]
        );
        // A short, unclassifiable tail of a train.
        let slot = [transport(100), vec![4, 0, 0]].concat();
        assert_eq!(
            screen(&slot, 100, true, 0).0,
            [
                Screened::Pass { start: 0, len: 100 },
                Screened::Drop(DropReason::NotWireGuard)
            ]
        );
    }
}
