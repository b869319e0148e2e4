//! Ferry as a tailnet node: the control client.
//!
//! [`start`] spawns a thread with a current-thread tokio runtime that
//! keeps the node registered with its control server (Headscale or
//! Tailscale's) and holds a streaming map poll:
//!
//! 1. `GET /key?v=<capver>` names the server's machine key (over TLS for
//!    an `https://` login server, as every step below);
//! 2. `POST /ts2021` upgrades to the Noise channel
//!    ([`ferry_proto::tailnet`]), inside which HTTP/2 runs with prior
//!    knowledge;
//! 3. a node without a registered key registers with the pre-auth key
//!    (its tags come from the key); a node restarted with its saved keys
//!    polls straight away and registers again only if refused;
//! 4. `POST /machine/map` with `Stream: true`: every map response updates
//!    the [`Netmap`] the [`Handle`] publishes; a silent stream (no
//!    keep-alive for 120 s) or any error closes the channel, and the
//!    driver reconnects after a backoff with jitter.
//!
//! The keys live in the state file (see [`Config::state_path`]).
//!
//! With [`Config::peer_relay`] the node also serves the tailnet as a
//! Tailscale peer relay ([`relay`]): it connects to a DERP region of the
//! map with its node key, reports it as its home, and answers the
//! allocation requests of peers the packet filter grants
//! `tailscale.com/cap/relay` with endpoints of the peer-relay table.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod channel;
mod netmap;
pub mod relay;
mod session;
mod state;

pub use channel::LoginServer;
pub use netmap::Netmap;
pub use state::State;

use ferry_proto::key::{DiscoPrivate, NodePrivate, NodePublic};
use ferry_proto::tailnet::early::EarlyError;
use ferry_proto::tailnet::noise::NoiseError;
use ferry_proto::tailnet::upgrade::UpgradeError;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the control client needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The login server, `http://host[:port]` or `https://host[:port]`.
    pub login_server: String,
    /// The CA certificates an `https://` login server's certificate is
    /// checked against (default: the system's).
    pub tls_roots: ferry_client::TlsRoots,
    /// The pre-authentication key (used only when registering).
    pub auth_key: String,
    /// The state file (keys; created 0600 if missing).
    pub state_path: PathBuf,
    /// The host name reported to the control server.
    pub hostname: String,
    /// The home DERP region reported at first (0: none yet).
    pub preferred_derp: u32,
    /// Serve the tailnet as a peer relay with this table.
    pub peer_relay: Option<PeerRelay>,
}

/// The peer relay a node serves.
#[derive(Clone)]
pub struct PeerRelay {
    /// The endpoint table the UDP port serves.
    pub relays: Arc<ferry_udp::peer_relay::PeerRelays>,
    /// Dial the DERP map's nodes in plain HTTP (tailscaled's
    /// `TS_DEBUG_USE_DERP_HTTP`, for test beds).
    pub derp_plain_http: bool,
}

impl std::fmt::Debug for PeerRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerRelay")
            .field("server_disco", &self.relays.server_disco())
            .field("derp_plain_http", &self.derp_plain_http)
            .finish()
    }
}

/// Why the control client failed (each is logged, then retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is unusable.
    #[error("{0}")]
    Config(String),
    /// A socket or file error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A step took too long.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The server broke the protocol.
    #[error("control protocol: {0}")]
    Protocol(String),
    /// The Noise layer failed.
    #[error(transparent)]
    Noise(#[from] NoiseError),
    /// The upgrade was refused.
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
    /// The early payload was unacceptable.
    #[error(transparent)]
    Early(#[from] EarlyError),
    /// HTTP/2 failed.
    #[error("HTTP/2: {0}")]
    Http(#[from] hyper::Error),
    /// The server answered a request with an error status.
    #[error("{path} answered {status}: {body}")]
    Status {
        /// The request path.
        path: &'static str,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
}

/// What the driver is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Connecting or registering.
    Connecting,
    /// Holding the map poll.
    Polling,
    /// Waiting to retry after an error.
    Backoff {
        /// The error that ended the last attempt.
        error: String,
    },
    /// Stopped for good (the handle was dropped).
    Stopped,
}

struct Published {
    netmap: Arc<Netmap>,
    status: Status,
    registrations: u64,
}

pub(crate) struct Shared {
    published: Mutex<Published>,
    changed: Condvar,
    /// The netmap's version, for async waiters.
    versions: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut Published)) {
        let mut p = self.published.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut p);
        self.changed.notify_all();
    }

    pub(crate) fn set_status(&self, status: Status) {
        self.update(|p| p.status = status);
    }

    pub(crate) fn set_netmap(&self, n: Netmap) {
        let version = n.version;
        self.update(|p| p.netmap = Arc::new(n));
        self.versions.send_replace(version);
    }

    pub(crate) fn netmap(&self) -> Arc<Netmap> {
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .netmap
            .clone()
    }

    pub(crate) fn count_registration(&self) {
        self.update(|p| p.registrations += 1);
    }
}

/// The running control client. Dropping it stops the thread.
pub struct Handle {
    shared: Arc<Shared>,
    node_key: NodePublic,
    node_private: NodePrivate,
    disco_private: DiscoPrivate,
    derp: Arc<tokio::sync::watch::Sender<u32>>,
    relay_stats: Option<Arc<relay::Stats>>,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts the control client: reads (or creates) the state file, then
/// runs the driver on a thread of its own.
pub fn start(config: Config) -> Result<Handle, Error> {
    let server = LoginServer::parse(&config.login_server)?;
    let state =
        match State::load(&config.state_path, &config.login_server).map_err(Error::Config)? {
            Some(s) => s,
            None => {
                let s = State::fresh(&config.login_server);
                s.save(&config.state_path)?;
                s
            }
        };
    let node_key = state.node.public();
    let node_private = state.node.clone();
    let disco_private = state.disco.clone();
    let shared = Arc::new(Shared {
        published: Mutex::new(Published {
            netmap: Arc::new(Netmap::default()),
            status: Status::Connecting,
            registrations: 0,
        }),
        changed: Condvar::new(),
        versions: tokio::sync::watch::channel(0).0,
    });
    let (derp, derp_rx) = tokio::sync::watch::channel(config.preferred_derp);
    let derp = Arc::new(derp);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let relay = config.peer_relay.clone().map(|p| relay::Node {
        relays: p.relays,
        derp_plain_http: p.derp_plain_http,
        shared: shared.clone(),
        node: node_private.clone(),
        disco: disco_private.clone(),
        preferred_derp: derp.clone(),
        stats: Arc::new(relay::Stats::default()),
    });
    let relay_stats = relay.as_ref().map(|r| r.stats.clone());
    let driver = session::Driver {
        relay,
        config,
        server,
        state,
        shared: shared.clone(),
        derp: derp_rx,
        version: 0,
    };
    let thread = std::thread::Builder::new()
        .name("ferry-tailnet".into())
        .spawn(move || driver.run(stop_rx))?;
    Ok(Handle {
        shared,
        node_key,
        node_private,
        disco_private,
        derp,
        relay_stats,
        stop,
        thread: Some(thread),
    })
}

impl Handle {
    /// The node key this node registered (or will register).
    pub fn node_key(&self) -> NodePublic {
        self.node_key
    }

    /// The node private key (the DERP identity to connect with).
    pub fn node_private(&self) -> &NodePrivate {
        &self.node_private
    }

    /// The node's disco private key (its public half is what the map
    /// request announces).
    pub fn disco_private(&self) -> &DiscoPrivate {
        &self.disco_private
    }

    /// The current netmap snapshot.
    pub fn netmap(&self) -> Arc<Netmap> {
        self.lock().netmap.clone()
    }

    /// What the driver is doing.
    pub fn status(&self) -> Status {
        self.lock().status.clone()
    }

    /// How many times this process registered the node with the server.
    pub fn registrations(&self) -> u64 {
        self.lock().registrations
    }

    /// Waits until the netmap satisfies `pred` or `timeout` passes; the
    /// snapshot that satisfied it.
    pub fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Netmap) -> bool,
    ) -> Option<Arc<Netmap>> {
        let deadline = Instant::now() + timeout;
        let mut p = self.lock();
        loop {
            if pred(&p.netmap) {
                return Some(p.netmap.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            p = self
                .shared
                .changed
                .wait_timeout(p, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits for a netmap newer than `version` (at most `timeout`).
    pub fn wait_changed(&self, version: u64, timeout: Duration) -> Option<Arc<Netmap>> {
        self.wait_for(timeout, |n| n.version > version)
    }

    /// Sets the home DERP region reported in `Hostinfo.NetInfo`; sent to
    /// the server at once while the poll runs, and on every new poll.
    pub fn set_preferred_derp(&self, region: u32) {
        self.derp.send_replace(region);
    }

    /// A view of the driver's status and netmap that outlives no one and
    /// stops nothing: for a metrics page.
    pub fn observer(&self) -> Observer {
        Observer {
            shared: self.shared.clone(),
        }
    }

    /// The peer relay's counters (with [`Config::peer_relay`]).
    pub fn relay_stats(&self) -> Option<Arc<relay::Stats>> {
        self.relay_stats.clone()
    }

    /// The home DERP region reported now (0: none yet).
    pub fn preferred_derp(&self) -> u32 {
        *self.derp.borrow()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.shared
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// What the driver is doing and the netmap it holds, readable from
/// anywhere ([`Handle::observer`]); dropping it does not stop the node.
#[derive(Clone)]
pub struct Observer {
    shared: Arc<Shared>,
}

impl Observer {
    /// What the driver is doing.
    pub fn status(&self) -> Status {
        self.shared
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .status
            .clone()
    }

    /// The current netmap snapshot.
    pub fn netmap(&self) -> Arc<Netmap> {
        self.shared.netmap()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
