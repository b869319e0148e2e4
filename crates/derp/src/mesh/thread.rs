//! The mesh thread: one `mio` poll over every link's socket, dialing
//! with backoff, pinging, handing what the links learn to the owner
//! shards, and moving the shards' forwardPacket rings into the links.

use std::io;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_engine::mailbox::ByteRx;
use ferry_proto::client::{Client, Config, Event};
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{MeshKey, NodePrivate};
use ferry_proto::nacl;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use super::conn::{describe, MeshConn};
use super::peer::{Announced, MeshPeerState, Presence};
use super::stats::{MeshPeerStats, MeshStats};
use super::MESH_LINK_MAX_KEYS;
use crate::config::MeshPeer;
use crate::shard::{Control, MeshNews, Shared};

/// First wait before dialing a failed link again.
const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest wait between dials.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A link up this long starts its next backoff from the beginning.
const STABLE: Duration = Duration::from_secs(30);
/// How often a link pings its peer. A peer answers within a round trip,
/// so three missed answers in a row ([`SILENCE`]) mean the path is gone:
/// a link cut by a firewall is found in seconds, not after the two
/// minutes a DERP client otherwise waits for a keepalive.
const PING_EVERY: Duration = Duration::from_secs(5);
/// Silence from the peer after which a link is dead.
const SILENCE: Duration = Duration::from_secs(15);
/// Plaintext bytes a link takes from its rings before its socket must
/// take them.
const OUT_HIGH: usize = 256 * 1024;
/// TLS bytes buffered per link beyond the plaintext above.
const TLS_BUFFER: usize = 256 * 1024;
/// Bytes one link may move in one go before the others get a turn.
const PUMP_BUDGET: usize = 4 * 1024 * 1024;
/// The poll's longest sleep (the stop flag is also checked then).
const MAX_SLEEP: Duration = Duration::from_secs(1);
const WAKER: Token = Token(usize::MAX);

/// Everything the mesh thread needs, made before it starts.
pub struct MeshThread {
    poll: Poll,
    peers: Vec<MeshPeerState>,
    /// `[link][shard]`: the rings from the shards.
    rx: Vec<Vec<ByteRx>>,
    /// Set by [`MeshThread::run`] (the shards' state is made after this).
    shared: Option<Arc<Shared>>,
    key: NodePrivate,
    mesh_key: MeshKey,
    tls: Arc<ClientConfig>,
    rng: StdRng,
    stop: Arc<AtomicBool>,
    buf: Vec<u8>,
    /// A link stopped at its budget with more to move: poll without
    /// sleeping.
    again: bool,
}

/// What [`MeshThread::new`] could not set up.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// `--mesh-with` without a mesh key.
    #[error("--mesh-with requires --mesh-psk-file")]
    NoMeshKey,
    /// No CA certificates to verify the peers with.
    #[error("--mesh-with: no CA certificates to verify mesh peers with ({0}); set SSL_CERT_FILE")]
    Roots(String),
    /// The poll could not be created.
    #[error("mesh poll: {0}")]
    Poll(#[source] io::Error),
}

impl MeshThread {
    /// Prepares the links; returns the thread state, a function that wakes
    /// it, and its counters. `rx` is `[link][shard]`.
    pub fn new(
        peers: &[MeshPeer],
        key: NodePrivate,
        mesh_key: Option<MeshKey>,
        rx: Vec<Vec<ByteRx>>,
        stop: Arc<AtomicBool>,
        seed: u64,
    ) -> Result<(MeshThread, MeshStats), MeshError> {
        let mesh_key = mesh_key.ok_or(MeshError::NoMeshKey)?;
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            let why = found
                .errors
                .first()
                .map_or_else(|| "none found".to_owned(), |e| e.to_string());
            return Err(MeshError::Roots(why));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| MeshError::Roots(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let poll = Poll::new().map_err(MeshError::Poll)?;
        let states: Vec<MeshPeerState> = peers
            .iter()
            .map(|p| MeshPeerState {
                peer: p.clone(),
                stats: Arc::new(MeshPeerStats::default()),
                conn: None,
                retry_at: None,
                backoff: BACKOFF_START,
                is_self: false,
                announced: Announced::new(MESH_LINK_MAX_KEYS),
                attempts: 0,
            })
            .collect();
        let stats = MeshStats {
            peers: states
                .iter()
                .map(|l| (l.peer.host_header(), l.stats.clone()))
                .collect(),
        };
        Ok((
            MeshThread {
                poll,
                peers: states,
                rx,
                shared: None,
                key,
                mesh_key,
                tls: Arc::new(tls),
                rng: StdRng::seed_from_u64(seed),
                stop,
                buf: vec![0; 64 * 1024],
                again: false,
            },
            stats,
        ))
    }

    /// A waker the shards call after pushing into a ring.
    pub fn waker(&self) -> io::Result<Arc<Waker>> {
        Ok(Arc::new(Waker::new(self.poll.registry(), WAKER)?))
    }

    fn shared(&self) -> &Shared {
        self.shared.as_ref().expect("set by run")
    }

    /// Runs until the stop flag is set, talking to the shards of `shared`.
    pub fn run(mut self, shared: Arc<Shared>) {
        self.shared = Some(shared);
        for (i, l) in self.peers.iter().enumerate() {
            tracing::info!(link = i, peer = %l.peer, "mesh: will dial peer");
        }
        let mut events = Events::with_capacity(64);
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            for i in 0..self.peers.len() {
                self.check_timers(i, now);
                self.pump(i, now);
            }
            let mut sleep = self
                .next_deadline()
                .map_or(MAX_SLEEP, |at| at.saturating_duration_since(now))
                .min(MAX_SLEEP);
            if std::mem::take(&mut self.again) {
                sleep = Duration::ZERO;
            }
            if let Err(e) = self.poll.poll(&mut events, Some(sleep)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "mesh: poll failed; mesh links stop");
                    return;
                }
            }
            let now = Instant::now();
            for ev in events.iter() {
                let i = ev.token().0;
                if i >= self.peers.len() {
                    continue;
                }
                let mut failed = None;
                if let Some(c) = self.peers[i].conn.as_mut() {
                    if c.connecting && (ev.is_writable() || ev.is_error()) {
                        c.connecting = false;
                        let err = c.sock.take_error().ok().flatten();
                        if let Some(e) = err.or_else(|| c.sock.peer_addr().err()) {
                            failed = Some(format!("connect to {}: {e}", c.addr));
                        }
                    }
                }
                if let Some(why) = failed {
                    self.down(i, now, &why);
                    continue;
                }
                self.pump(i, now);
            }
        }
        for i in 0..self.peers.len() {
            if let Some(mut c) = self.peers[i].conn.take() {
                let _ = self.poll.registry().deregister(&mut c.sock);
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.peers
            .iter()
            .filter_map(|l| match &l.conn {
                Some(c) => [c.client.poll_timeout(), c.next_ping]
                    .into_iter()
                    .flatten()
                    .min(),
                None if l.is_self => None,
                None => l.retry_at,
            })
            .min()
    }

    fn check_timers(&mut self, i: usize, now: Instant) {
        let state = &mut self.peers[i];
        if state.is_self {
            return;
        }
        match &mut state.conn {
            None => {
                if state.retry_at.is_none_or(|at| now >= at) {
                    self.dial(i, now);
                }
            }
            Some(c) => {
                if c.client.poll_timeout().is_some_and(|at| now >= at) {
                    if let Err(e) = c.client.handle_timeout(now) {
                        return self.down(i, now, &describe(&e));
                    }
                }
                if c.next_ping.is_some_and(|at| now >= at) {
                    c.next_ping = Some(now + PING_EVERY);
                    let data: [u8; 8] = self.rng.gen();
                    if let Err(e) = c.client.ping(&mut c.out, data) {
                        self.down(i, now, &describe(&e));
                    }
                }
            }
        }
    }

    fn dial(&mut self, i: usize, now: Instant) {
        let state = &mut self.peers[i];
        state.attempts += 1;
        let peer = state.peer.clone();
        let addr = match (peer.dial.as_str(), peer.port).to_socket_addrs() {
            Ok(mut addrs) => match addrs.next() {
                Some(a) => a,
                None => return self.down(i, now, &format!("{} has no address", peer.dial)),
            },
            Err(e) => return self.down(i, now, &format!("resolving {}: {e}", peer.dial)),
        };
        let server_name = match ServerName::try_from(peer.name.clone()) {
            Ok(n) => n,
            Err(e) => return self.down(i, now, &format!("TLS name {:?}: {e}", peer.name)),
        };
        let mut tls = match ClientConnection::new(self.tls.clone(), server_name) {
            Ok(t) => t,
            Err(e) => return self.down(i, now, &format!("TLS: {e}")),
        };
        tls.set_buffer_limit(Some(TLS_BUFFER));
        let mut config = Config::new(self.key.clone(), peer.host_header());
        config.info = ClientInfo {
            mesh_key: Some(self.mesh_key.clone()),
            ferry_mesh: ferry_proto::mesh_session::VERSION,
            ..config.info
        };
        config.keepalive_timeout = SILENCE;
        let client = match Client::new(config, now, nacl::random_nonce()) {
            Ok(c) => c,
            Err(e) => return self.down(i, now, &describe(&e)),
        };
        let mut sock = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => return self.down(i, now, &format!("connect to {addr}: {e}")),
        };
        if let Err(e) = self.poll.registry().register(
            &mut sock,
            Token(i),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return self.down(i, now, &format!("registering the socket: {e}"));
        }
        let _ = sock.set_nodelay(true);
        self.peers[i].conn = Some(MeshConn {
            sock,
            addr,
            tls,
            client,
            connecting: true,
            up: false,
            accepted: None,
            next_ping: None,
            out: Vec::with_capacity(OUT_HIGH),
            sent: 0,
        });
    }

    /// Reads, handles events, takes from the rings and writes, for link `i`.
    fn pump(&mut self, i: usize, now: Instant) {
        if self.peers[i].conn.is_none() {
            self.discard(i);
            return;
        }
        if self.peers[i].conn.as_ref().is_some_and(|c| c.connecting) {
            return;
        }
        let mut events = Vec::new();
        let result = {
            let c = self.peers[i].conn.as_mut().expect("a connection");
            c.read(now, &mut self.buf, &mut events)
        };
        for ev in events {
            self.on_event(i, now, ev);
            if self.peers[i].conn.is_none() {
                return;
            }
        }
        if let Err(why) = result {
            return self.down(i, now, &why);
        }
        let shared = self.shared.clone().expect("set by run");
        let shards = self.rx[i].len();
        let mut notify = Vec::new();
        let c = self.peers[i].conn.as_mut().expect("a connection");
        // Take from the rings and write until the socket pushes back (its
        // next writable edge brings the thread back) or there is nothing
        // left; past PUMP_BUDGET bytes in one go, the other links get a turn
        // and the poll does not sleep.
        let mut moved = 0;
        loop {
            let mut took_any = false;
            if c.up {
                for (s, rx) in self.rx[i].iter_mut().enumerate() {
                    let mut took = false;
                    while c.pending() < OUT_HIGH {
                        let out = &mut c.out;
                        let popped = rx.pop_with(|a, b| {
                            out.extend_from_slice(a);
                            out.extend_from_slice(b);
                            a.len() + b.len()
                        });
                        match popped {
                            Some(n) => moved += n,
                            None => break,
                        }
                        took = true;
                    }
                    if took {
                        took_any = true;
                        if let Some(mesh) = shared.mesh.as_ref() {
                            if mesh.waiting[i * shards + s].swap(false, Ordering::AcqRel) {
                                notify.push(s);
                            }
                        }
                    }
                }
            }
            match c.write() {
                Ok(true) => break, // blocked: wait for the writable edge
                Ok(false) if !took_any => break,
                Ok(false) if moved >= PUMP_BUDGET => {
                    self.again = true;
                    break;
                }
                Ok(false) => {}
                Err(e) => return self.down(i, now, &format!("write: {e}")),
            }
        }
        if let Some(bells) = shared.doorbells.get() {
            notify.sort_unstable();
            notify.dedup();
            for s in notify {
                bells[s].notify();
            }
        }
    }

    fn on_event(&mut self, i: usize, now: Instant, ev: Event) {
        let own = self.key.public();
        let shards = self.rx[i].len();
        let state = &mut self.peers[i];
        match ev {
            Event::Connected { server_key, info } => {
                if server_key == own {
                    tracing::info!(peer = %state.peer, "mesh: the peer is this relay (same server key); not meshing with it");
                    state.is_self = true;
                    if let Some(mut c) = state.conn.take() {
                        let _ = self.poll.registry().deregister(&mut c.sock);
                    }
                    return;
                }
                // A Ferry peer answers the mesh extension it was asked
                // for; derper (or an older Ferry) says nothing of it.
                let ferry = info
                    .ferry_mesh
                    .is_some_and(|m| m.version >= ferry_proto::mesh_session::VERSION);
                state.stats.ferry.store(ferry, Ordering::Relaxed);
                if let Some(mesh) = self.shared().mesh.as_ref() {
                    mesh.link_state[i].store(0, Ordering::Release);
                }
                for shard in 0..shards {
                    self.shared().post(
                        shard,
                        Control::Mesh {
                            peer: i,
                            news: MeshNews::Up {
                                server_key,
                                ferry_mesh: ferry,
                            },
                        },
                    );
                }
                let state = &mut self.peers[i];
                let c = state.conn.as_mut().expect("a connection");
                if let Err(e) = c.client.watch_conns(&mut c.out) {
                    let why = describe(&e);
                    return self.down(i, now, &why);
                }
                c.up = true;
                c.next_ping = Some(now + PING_EVERY);
            }
            Event::PeerPresent { key, .. } => {
                // The flood that follows watchConns always names at least
                // this relay's own connection: the peer took the mesh key.
                let c = state.conn.as_mut().expect("a connection");
                if c.accepted.is_none() {
                    c.accepted = Some(now);
                    state.attempts = 0;
                    state.stats.up.store(true, Ordering::Relaxed);
                    state.stats.connects.fetch_add(1, Ordering::Relaxed);
                    let server = c
                        .client
                        .server_key()
                        .map(|k| k.to_string())
                        .unwrap_or_default();
                    tracing::info!(peer = %state.peer, addr = %c.addr, server, "mesh: link up");
                }
                match state.announced.present(key) {
                    Presence::New => state.stats.keys.fetch_add(1, Ordering::Relaxed),
                    Presence::Known => return,
                    Presence::OverCap { first } => {
                        state.stats.refused_keys.fetch_add(1, Ordering::Relaxed);
                        if first {
                            tracing::warn!(peer = %state.peer, max = state.announced.cap,
                                "mesh: the peer announced more keys than a link may hold; dropping its further new keys (counted in ferry_mesh_link_refused_keys_total)");
                        }
                        return;
                    }
                };
                let owner = self.shared().owner_of(&key, shards);
                self.shared().post(
                    owner,
                    Control::Mesh {
                        peer: i,
                        news: MeshNews::Present(key),
                    },
                );
            }
            Event::PeerGone { key, .. } => {
                if state.announced.keys.remove(&key) {
                    state.stats.keys.fetch_sub(1, Ordering::Relaxed);
                }
                let owner = self.shared().owner_of(&key, shards);
                self.shared().post(
                    owner,
                    Control::Mesh {
                        peer: i,
                        news: MeshNews::Gone(key),
                    },
                );
            }
            Event::Restarting { reconnect_in, .. } => {
                tracing::info!(peer = %state.peer, reconnect_in = ?reconnect_in, "mesh: the peer is restarting");
                state.backoff = reconnect_in.clamp(Duration::from_millis(100), BACKOFF_MAX);
            }
            Event::ServerClosed => self.down(i, now, "the peer closed the connection"),
            Event::Health(problem) if !problem.is_empty() => {
                tracing::warn!(peer = %state.peer, problem = %String::from_utf8_lossy(&problem), "mesh: the peer reports a problem");
            }
            _ => {}
        }
    }

    /// Ends link `i`'s connection (if any) for `why`, withdraws what it
    /// announced, and schedules the next dial.
    fn down(&mut self, i: usize, now: Instant, why: &str) {
        let shards = self.rx[i].len();
        let jitter = self.rng.gen_range(0.8..1.2);
        let state = &mut self.peers[i];
        let accepted = state.conn.as_ref().and_then(|c| c.accepted);
        let refused = state
            .conn
            .as_ref()
            .is_some_and(|c| c.up && c.accepted.is_none());
        if let Some(mut c) = state.conn.take() {
            let _ = self.poll.registry().deregister(&mut c.sock);
        }
        // A link that held for a while starts its backoff afresh; one that
        // keeps failing (or is refused right after its handshake) backs
        // off further.
        if accepted.is_some_and(|at| now.duration_since(at) >= STABLE) {
            state.backoff = BACKOFF_START;
        }
        let wait = state.backoff.mul_f64(jitter);
        state.retry_at = Some(now + wait);
        state.backoff = (state.backoff * 2).min(BACKOFF_MAX);
        state.stats.failures.fetch_add(1, Ordering::Relaxed);
        state.stats.up.store(false, Ordering::Relaxed);
        state.stats.ferry.store(false, Ordering::Relaxed);
        state.stats.keys.store(0, Ordering::Relaxed);
        let forgot = state.announced.keys.len();
        state.announced.keys.clear();
        if accepted.is_some() {
            tracing::warn!(peer = %state.peer, reason = why, forgot, retry_in = ?wait, "mesh: link down");
        } else if refused {
            tracing::warn!(peer = %state.peer, reason = why, attempt = state.attempts, retry_in = ?wait,
                "mesh: could not connect: the peer ended the link after its handshake, before accepting watchConns (is the mesh key the same on both nodes?)");
        } else {
            tracing::warn!(peer = %state.peer, reason = why, attempt = state.attempts, retry_in = ?wait, "mesh: could not connect");
        }
        for shard in 0..shards {
            self.shared().post(
                shard,
                Control::Mesh {
                    peer: i,
                    news: MeshNews::Down,
                },
            );
        }
        self.discard(i);
    }

    /// Empties link `i`'s rings while it is down.
    fn discard(&mut self, i: usize) {
        let mut n = 0;
        for rx in &mut self.rx[i] {
            while rx.pop_with(|_, _| ()).is_some() {
                n += 1;
            }
        }
        if n > 0 {
            self.peers[i]
                .stats
                .discarded
                .fetch_add(n, Ordering::Relaxed);
        }
    }
}
