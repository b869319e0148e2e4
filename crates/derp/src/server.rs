//! Starting and stopping a relay: listeners, shard threads, STUN, metrics.
//!
//! [`Server::start`] binds every listener once per shard with
//! `SO_REUSEPORT` (so the kernel spreads new connections and no shard's
//! accept can hold up another's), builds the rings between every pair of
//! shards, and starts one pinned thread per shard. Each thread creates its
//! own driver (an io_uring ring must be created on the thread that drives
//! it) and reports its waker; once all have, the doorbells are published
//! and the shards start. STUN and the optional metrics listener get a
//! thread each: they are low-rate and must not share a loop with relaying.

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;

use ferry_engine::mailbox::{byte_ring, msg_ring, ByteRx, ByteTx, Doorbell};
use ferry_engine::{run_shard_polling, Backend, BusyPoll, Driver, EpollDriver, IoMode};
use ferry_sys::port::Transport;

use crate::admission::{Admission, AdmissionStats};
use crate::config::{DerpConfig, ListenerKind, ListenerSpec, TlsRecords};
use crate::mesh::{MeshError, MeshThread};
use crate::metrics::Metrics;
use crate::shard::{ConnRef, Control, Inbox, MeshShared, Rings, Shard, Shared, MSG_RING};

/// Everything needed to start a relay.
#[derive(Clone)]
pub struct ServerOptions {
    /// Relay settings.
    pub config: DerpConfig,
    /// Sockets to listen on.
    pub listeners: Vec<ListenerSpec>,
    /// Number of shard threads.
    pub workers: usize,
    /// Pin shard `i` to the `i`-th CPU this process may use.
    pub pin: bool,
    /// UDP address for STUN, if any.
    pub stun: Option<SocketAddr>,
    /// Extra address serving only `/metrics`, if any.
    pub metrics_addr: Option<SocketAddr>,
    /// Which I/O back end to use.
    pub io: IoMode,
    /// Listening sockets handed over by a service manager (socket
    /// activation). A listener spec whose address one of them has uses it
    /// (every shard accepts on it) instead of binding; the socket outlives
    /// this process, so a restart refuses no one.
    pub inherited: Vec<Arc<TcpListener>>,
}

/// One of the relay's sockets, named in errors by the derper flag that
/// sets its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketRole {
    /// The DERP listener (`-a`).
    Derp,
    /// The plain-HTTP companion of a TLS listener (`--http-port`).
    Port80,
    /// The STUN socket (`--stun-port`).
    Stun,
    /// The metrics listener (`--metrics-addr`).
    Metrics,
}

impl SocketRole {
    /// The flag that sets this socket's address.
    pub fn flag(self) -> &'static str {
        match self {
            SocketRole::Derp => "-a",
            SocketRole::Port80 => "--http-port",
            SocketRole::Stun => "--stun-port",
            SocketRole::Metrics => "--metrics-addr",
        }
    }
}

impl From<ListenerKind> for SocketRole {
    fn from(kind: ListenerKind) -> Self {
        match kind {
            ListenerKind::Derp => SocketRole::Derp,
            ListenerKind::Port80 => SocketRole::Port80,
        }
    }
}

impl std::fmt::Display for SocketRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.flag())
    }
}

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another socket (another program, or another relay whose shards
    /// share the port) already holds the address.
    #[error("{role} {addr}: address already in use: another program (or another ferry) holds it; stop it or choose another address")]
    InUse {
        /// Which socket.
        role: SocketRole,
        /// The address.
        addr: SocketAddr,
    },
    /// A socket could not be set up for another reason.
    #[error("{role} {addr}: cannot listen: {source}{}", ferry_sys::port::hint_suffix(*addr, source))]
    Listen {
        /// Which socket.
        role: SocketRole,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The requested I/O back end cannot run here.
    #[error(transparent)]
    Backend(#[from] ferry_engine::backend::BackendError),
    /// Admission could not start (a bad `--verify-client-url`, no CA
    /// certificates, no threads).
    #[error(transparent)]
    Admission(#[from] crate::admission::AdmissionError),
    /// The mesh links could not be set up (no mesh key, no CA roots).
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// A shard or helper thread could not start.
    #[error("cannot start {what}: {source}")]
    Thread {
        /// Which thread.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// A shard could not set up its I/O.
    #[error("cannot start shard {shard}: {source}")]
    Shard {
        /// Which shard.
        shard: usize,
        /// The cause.
        source: io::Error,
    },
}

impl StartError {
    /// The error for a failed bind or listen of `role` on `addr`.
    fn socket(role: SocketRole, addr: SocketAddr, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::AddrInUse {
            StartError::InUse { role, addr }
        } else {
            StartError::Listen { role, addr, source }
        }
    }
}

/// A running relay.
pub struct Server {
    shared: Arc<Shared>,
    shards: Vec<JoinHandle<io::Result<()>>>,
    aux: Vec<JoinHandle<()>>,
    aux_stop: Arc<AtomicBool>,
    /// Wakes the mesh thread (to see the stop flag).
    mesh_wake: Option<WakerFn>,
    /// Bound address of each listener, in the order given.
    pub listen_addrs: Vec<SocketAddr>,
    /// Bound STUN address.
    pub stun_addr: Option<SocketAddr>,
    /// Bound metrics address.
    pub metrics_addr: Option<SocketAddr>,
}

/// The settings as the shards use them: with Ferry's own TLS record
/// layer chosen, a TLS configuration that does not yet let rustls give up
/// its keys gets a copy that does (same certificate resolver).
fn shard_config(mut config: DerpConfig) -> DerpConfig {
    if config.tls_records == TlsRecords::Ferry && !config.ktls {
        if let Some(tls) = config.tls.as_mut().filter(|t| !t.enable_secret_extraction) {
            let mut own = (**tls).clone();
            crate::transport::records::allow_own_records(&mut own);
            *tls = Arc::new(own);
        }
    }
    config
}

/// One shard's listener on `addr`, in the `SO_REUSEPORT` group that all
/// shards share (see [`ferry_sys::port`] for why the port is claimed
/// first).
fn bind_reuseport(addr: SocketAddr) -> io::Result<TcpListener> {
    use ferry_sys::port::{new_socket, Transport};
    let sock = new_socket(addr, Transport::Tcp)?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    Ok(sock.into())
}

/// The inherited listener bound to `addr`: the same port, and the same
/// address or `addr` unspecified (`:443` takes a socket on `0.0.0.0:443`
/// or `[::]:443`).
fn inherited_for(inherited: &[Arc<TcpListener>], addr: SocketAddr) -> Option<usize> {
    inherited.iter().position(|l| {
        l.local_addr().is_ok_and(|have| {
            have.port() == addr.port() && (have.ip() == addr.ip() || addr.ip().is_unspecified())
        })
    })
}

/// Binds `addr` with `bind` if there is one, naming `role` on failure.
fn bind_optional<S>(
    role: SocketRole,
    addr: Option<SocketAddr>,
    bind: fn(SocketAddr) -> io::Result<S>,
) -> Result<Option<S>, StartError> {
    addr.map(|addr| bind(addr).map_err(|source| StartError::socket(role, addr, source)))
        .transpose()
}

impl Server {
    /// Binds, spawns and starts the relay.
    pub fn start(opts: ServerOptions) -> Result<Server, StartError> {
        let n = opts.workers.max(1);
        let cpus = ferry_sys::available_cpus();

        // One listener per shard per spec, all on the same port.
        let mut per_shard: Vec<Vec<TcpListener>> = (0..n).map(|_| Vec::new()).collect();
        let mut listen_addrs = Vec::new();
        let mut used = vec![false; opts.inherited.len()];
        for spec in &opts.listeners {
            let failed = |source| StartError::socket(spec.kind.into(), spec.addr, source);
            if let Some(i) = inherited_for(&opts.inherited, spec.addr) {
                used[i] = true;
                let l = &opts.inherited[i];
                for shard_listeners in per_shard.iter_mut() {
                    shard_listeners.push(l.try_clone().map_err(failed)?);
                }
                let addr = l.local_addr().map_err(failed)?;
                tracing::info!(%addr, "listening on a socket from the service manager");
                listen_addrs.push(addr);
                continue;
            }
            // Shards of this process share the port; no other process may.
            let mut addr =
                ferry_sys::port::ensure_unclaimed(spec.addr, Transport::Tcp).map_err(failed)?;
            for shard_listeners in per_shard.iter_mut() {
                let l = bind_reuseport(addr).map_err(failed)?;
                addr = l.local_addr().map_err(failed)?;
                shard_listeners.push(l);
            }
            listen_addrs.push(addr);
        }

        for (l, used) in opts.inherited.iter().zip(&used) {
            if !used {
                tracing::warn!(addr = ?l.local_addr().ok(), "a socket from the service manager matches no listener; not used");
            }
        }

        // The helpers' sockets too are bound before any thread starts, so a
        // taken address fails the start with nothing running.
        let stun_sock = bind_optional(SocketRole::Stun, opts.stun, UdpSocket::bind)?;
        let metrics_listener = bind_optional(SocketRole::Metrics, opts.metrics_addr, |a| {
            TcpListener::bind(a)
        })?;

        let (backend, backend_reason) =
            ferry_engine::backend::select(opts.io).map_err(StartError::Backend)?;
        tracing::info!(backend = backend.name(), reason = %backend_reason, "I/O back end");
        let metrics = Metrics::new(n, backend.name(), backend_reason);

        // Mesh links: their rings and the waker exist before the shards.
        let mesh_peers = opts.config.mesh_with.len();
        let mut mesh_rx: Vec<Vec<ByteRx>> = (0..mesh_peers).map(|_| Vec::new()).collect();
        let mut mesh_tx: Vec<Vec<ByteTx>> = (0..n).map(|_| Vec::new()).collect();
        for rx in mesh_rx.iter_mut() {
            for tx in mesh_tx.iter_mut() {
                let (t, r) = byte_ring(opts.config.ring_bytes);
                tx.push(t);
                rx.push(r);
            }
        }
        let aux_stop = Arc::new(AtomicBool::new(false));
        let mut mesh_thread = None;
        let mut mesh_shared = None;
        let mut mesh_wake = None;
        if mesh_peers > 0 {
            let (thread, stats) = MeshThread::new(
                &opts.config.mesh_with,
                opts.config.private_key.clone(),
                opts.config.mesh_key.clone(),
                mesh_rx,
                aux_stop.clone(),
                rand::random(),
            )?;
            let waker = thread
                .waker()
                .map_err(|e| StartError::Mesh(MeshError::Poll(e)))?;
            let wake: WakerFn = Arc::new(move || {
                let _ = waker.wake();
            });
            mesh_wake = Some(wake.clone());
            mesh_shared = Some(MeshShared::new(mesh_peers, n, wake));
            metrics.add_source(Box::new(move |w| stats.render(w)));
            mesh_thread = Some(thread);
        }

        let shared = Arc::new(Shared {
            config: Arc::new(shard_config(opts.config.clone())),
            metrics: metrics.clone(),
            doorbells: OnceLock::new(),
            hasher: std::hash::RandomState::new(),
            shutdown: AtomicBool::new(false),
            listener_kinds: opts.listeners.iter().map(|l| l.kind).collect(),
            inboxes: (0..n).map(|_| Inbox::default()).collect(),
            admission: OnceLock::new(),
            accept_limit: opts.config.accept_limit.map(|(rate, burst)| {
                std::sync::Mutex::new(ferry_engine::limit::Bucket::new(rate, burst))
            }),
            mesh: mesh_shared,
            conn_nums: std::sync::atomic::AtomicI64::new(0),
            epoch: (std::time::Instant::now(), std::time::SystemTime::now()),
        });
        if opts.config.admission.enabled() {
            let stats = Arc::new(AdmissionStats::default());
            let weak = Arc::downgrade(&shared);
            let pool = Admission::start(
                opts.config.admission.clone(),
                stats.clone(),
                move |r: ConnRef, v| {
                    if let Some(shared) = weak.upgrade() {
                        shared.post(r.shard, Control::Admitted(r, v));
                    }
                },
            )
            .map_err(StartError::Admission)?;
            let _ = shared.admission.set(pool);
            metrics.add_source(Box::new(move |w| stats.render_metrics(w)));
        }

        let mut rings: Vec<Rings> = mesh_tx
            .into_iter()
            .map(|mesh_tx| Rings {
                bytes_tx: (0..n).map(|_| None).collect(),
                bytes_rx: (0..n).map(|_| None).collect(),
                msg_tx: (0..n).map(|_| None).collect(),
                msg_rx: (0..n).map(|_| None).collect(),
                mesh_tx,
            })
            .collect();
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let (btx, brx) = byte_ring(opts.config.ring_bytes);
                let (mtx, mrx) = msg_ring(MSG_RING);
                rings[a].bytes_tx[b] = Some(btx);
                rings[a].msg_tx[b] = Some(mtx);
                rings[b].bytes_rx[a] = Some(brx);
                rings[b].msg_rx[a] = Some(mrx);
            }
        }

        let (ready_tx, ready_rx) = mpsc::channel::<(usize, io::Result<WakerFn>)>();
        let mut go = Vec::new();
        let mut shards = Vec::new();
        for (id, (listeners, rings)) in per_shard.into_iter().zip(rings).enumerate() {
            let (go_tx, go_rx) = mpsc::channel::<bool>();
            go.push(go_tx);
            let shared = shared.clone();
            let ready_tx = ready_tx.clone();
            let cpu = if opts.pin {
                cpus.get(id % cpus.len().max(1)).copied()
            } else {
                None
            };
            let handle =
                ferry_engine::runtime::spawn_pinned(format!("ferry-shard-{id}"), cpu, move || {
                    let start = ShardStart {
                        id,
                        shards: n,
                        listeners,
                        shared,
                        rings,
                        ready_tx,
                        go_rx,
                    };
                    match backend {
                        Backend::Epoll => start.run(EpollDriver::new()),
                        Backend::Uring => start.run(ferry_engine::uring::UringDriver::new()),
                    }
                })
                .map_err(|source| StartError::Thread {
                    what: format!("shard thread {id}"),
                    source,
                })?;
            shards.push(handle);
        }
        drop(ready_tx);

        let mut wakers: Vec<Option<WakerFn>> = (0..n).map(|_| None).collect();
        let mut failure = None;
        for _ in 0..n {
            match ready_rx.recv() {
                Ok((id, Ok(w))) => wakers[id] = Some(w),
                Ok((id, Err(source))) => failure = Some(StartError::Shard { shard: id, source }),
                Err(_) => {
                    failure.get_or_insert(StartError::Shard {
                        shard: 0,
                        source: io::Error::other("a shard thread exited during start-up"),
                    });
                    break;
                }
            }
        }
        if let Some(err) = failure {
            for g in &go {
                let _ = g.send(false);
            }
            for h in shards {
                let _ = h.join();
            }
            return Err(err);
        }
        let bells: Vec<Arc<Doorbell>> = wakers
            .into_iter()
            .map(|w| Doorbell::new(w.expect("every shard reported")))
            .collect();
        let _ = shared.doorbells.set(bells);
        for g in &go {
            let _ = g.send(true);
        }

        let mut aux = Vec::new();
        if let Some(thread) = mesh_thread {
            let shared = shared.clone();
            aux.push(
                std::thread::Builder::new()
                    .name("ferry-mesh".into())
                    .spawn(move || thread.run(shared))
                    .map_err(|source| StartError::Thread {
                        what: "the mesh thread".into(),
                        source,
                    })?,
            );
        }
        let mut stun_addr = None;
        if let Some(sock) = stun_sock {
            stun_addr = sock.local_addr().ok();
            let (metrics, stop) = (metrics.clone(), aux_stop.clone());
            aux.push(
                std::thread::Builder::new()
                    .name("ferry-stun".into())
                    .spawn(move || crate::stun::serve(sock, &metrics.stun, &stop))
                    .map_err(|source| StartError::Thread {
                        what: "the STUN thread".into(),
                        source,
                    })?,
            );
        }
        let mut metrics_addr = None;
        if let Some(l) = metrics_listener {
            metrics_addr = l.local_addr().ok();
            let (metrics, stop) = (metrics.clone(), aux_stop.clone());
            aux.push(
                std::thread::Builder::new()
                    .name("ferry-metrics".into())
                    .spawn(move || crate::metrics::serve(l, metrics, &stop))
                    .map_err(|source| StartError::Thread {
                        what: "the metrics thread".into(),
                        source,
                    })?,
            );
        }

        Ok(Server {
            shared,
            shards,
            aux,
            aux_stop,
            mesh_wake,
            listen_addrs,
            stun_addr,
            metrics_addr,
        })
    }

    /// The relay's counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Applies new per-client receive limits on every shard (a reloaded
    /// `--rate-config`); every registered client gets a full bucket of
    /// the new size.
    pub fn set_rate_config(&self, rate: ferry_proto::rate_config::RateConfig) {
        for shard in 0..self.shared.inboxes.len() {
            self.shared.post(shard, Control::RateConfig(rate));
        }
    }

    /// Starts a graceful shutdown: every client gets a `restarting` frame,
    /// queued frames drain (up to the grace period), sockets close.
    pub fn shutdown(&self) {
        self.shared.metrics.set_draining();
        self.shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(bells) = self.shared.doorbells.get() {
            for b in bells {
                b.ring();
            }
        }
    }

    /// Waits for the shards to finish (after [`Server::shutdown`]) and stops
    /// the helper threads.
    pub fn wait(self) -> io::Result<()> {
        let mut result = Ok(());
        for h in self.shards {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(io::Error::other("a shard thread panicked")),
            }
        }
        self.aux_stop.store(true, Ordering::SeqCst);
        if let Some(wake) = &self.mesh_wake {
            wake();
        }
        for h in self.aux {
            let _ = h.join();
        }
        result
    }
}

type WakerFn = Arc<dyn Fn() + Send + Sync>;

/// What a shard thread needs to start, whatever its back end.
struct ShardStart {
    id: usize,
    shards: usize,
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
    rings: Rings,
    ready_tx: mpsc::Sender<(usize, io::Result<WakerFn>)>,
    go_rx: mpsc::Receiver<bool>,
}

impl ShardStart {
    /// Takes the driver created on this thread (io_uring requires that),
    /// reports its waker, waits for the go, then runs the shard loop.
    fn run<D: Driver>(self, driver: io::Result<D>) -> io::Result<()> {
        let ShardStart {
            id,
            shards,
            listeners,
            shared,
            rings,
            ready_tx,
            go_rx,
        } = self;
        let mut driver = match driver {
            Ok(d) => d,
            Err(e) => {
                let _ = ready_tx.send((id, Err(e)));
                return Ok(());
            }
        };
        for l in listeners {
            if let Err(e) = driver.add_listener(l) {
                let _ = ready_tx.send((id, Err(e)));
                return Ok(());
            }
        }
        let _ = ready_tx.send((id, Ok(driver.waker())));
        if !go_rx.recv().unwrap_or(false) {
            return Ok(());
        }
        let bell = shared.doorbells.get().expect("doorbells published")[id].clone();
        let poll = BusyPoll::new(shared.config.busy_poll);
        let mut shard = Shard::new(
            id,
            shards,
            shared,
            rings,
            std::time::Instant::now(),
            rand::random(),
            driver.max_turn_bytes(),
        );
        let result = run_shard_polling(&mut driver, &bell, &mut shard, poll);
        if let Err(e) = &result {
            tracing::error!(shard = id, error = %e, "shard stopped on an I/O error");
        }
        result
    }
}
