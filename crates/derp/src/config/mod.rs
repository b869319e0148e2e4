//! What a relay needs to know to run, fixed at start-up.
//!
//! This module is a leaf: it names nothing else of the crate (checked by
//! `tests/layers.rs`), so every other module may read the settings
//! without an import cycle. Settings that stand for a running service
//! (the ACME client's challenge answers, the `/bootstrap-dns` names, relay
//! sessions) are held as the small traits the HTTP front and the shards
//! call, which the services implement where their behaviour lives.

mod mesh_peer;

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::forwarded::TrustedProxies;
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::rate_config::RateConfig;
use ferry_proto::relay_session::SessionService;

pub use mesh_peer::{MeshPeer, MeshPeerError};

/// What the root page shows (derper's `--home`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HomePage {
    /// A short page saying what this server is.
    Default,
    /// An empty page.
    Blank,
    /// A redirect to this URL.
    Redirect(String),
}

/// What a listening socket serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListenerKind {
    /// DERP and the HTTP endpoints around it; TLS when the relay has a TLS
    /// configuration.
    Derp,
    /// The port-80 companion of a TLS listener: captive-portal checks and
    /// redirects to HTTPS, never DERP.
    Port80,
}

/// How client keys are spread over shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// A hash seeded at random at start-up, so that clients cannot aim at
    /// one shard. Production always uses this.
    #[default]
    Random,
    /// The key's first byte modulo the shard count. For tests, which pick
    /// keys to put them on the shards a case needs (see
    /// [`Placement::key_for`]), so that "across shards" is every time.
    FirstByte,
}

impl Placement {
    /// A fresh key that [`Placement::FirstByte`] puts on `shard` of
    /// `shards`.
    pub fn key_for(shard: usize, shards: usize) -> NodePrivate {
        loop {
            let key = NodePrivate::generate();
            if usize::from(key.public().as_bytes()[0]) % shards == shard {
                return key;
            }
        }
    }
}

/// A socket to listen on.
#[derive(Clone, Debug)]
pub struct ListenerSpec {
    /// Address (port 0 picks a free port).
    pub addr: SocketAddr,
    /// What it serves.
    pub kind: ListenerKind,
}

/// The relay's settings.
#[derive(Clone)]
pub struct DerpConfig {
    /// The server's node key (its DERP identity).
    pub private_key: NodePrivate,
    /// Its public half.
    pub public_key: NodePublic,
    /// Clients presenting this key are mesh peers.
    pub mesh_key: Option<MeshKey>,
    /// Other nodes of the region to dial (`--mesh-with`); needs `mesh_key`.
    pub mesh_with: Vec<MeshPeer>,
    /// TLS for the DERP listener; plain HTTP when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Move TLS sessions into the kernel after the handshake (the TLS
    /// configuration must allow secret extraction:
    /// `transport::kernel::allow_kernel_tls`).
    pub ktls: bool,
    /// Who runs the record layer of TLS 1.3 sessions after the handshake
    /// where kernel TLS does not (`--tls-records`).
    pub tls_records: TlsRecords,
    /// Serve `/derp` (derper's `--derp`).
    pub derp_enabled: bool,
    /// Cut off a client whose send has not finished in this long
    /// (derper's `--tcp-write-timeout`); `None` disables.
    pub write_timeout: Option<Duration>,
    /// The same for mesh peers.
    pub mesh_write_timeout: Duration,
    /// Time allowed from accept to a registered DERP connection (TLS, HTTP
    /// and DERP handshakes), and for a plain HTTP request to arrive.
    pub handshake_timeout: Duration,
    /// Interval between keepAlive frames (plus up to 5 s of jitter).
    pub keepalive: Duration,
    /// Bytes of data frames queued per client; a client over it pauses the
    /// senders feeding it until it drains (backpressure), nothing is
    /// dropped.
    pub send_queue_bytes: usize,
    /// How long a client over its queue cap may hold its senders paused
    /// while taking nothing from its socket. Past it, its queue stops
    /// pausing senders and drops its own new packets (`queue_tail`) until
    /// a write to it completes, so one receiver that does not read cannot
    /// stall its senders' traffic to everyone else.
    pub backpressure_budget: Duration,
    /// After a turn with completions, poll for up to this long of quiet
    /// before parking (`--busy-poll`; zero: park at once). See
    /// [`ferry_engine::BusyPoll`].
    pub busy_poll: Duration,
    /// Disco packets queued per client before new ones are dropped.
    pub disco_queue_packets: usize,
    /// Bytes of control frames (pongs, peerGone, relay-session answers)
    /// queued per client. A client whose own requests' answers go past it
    /// unread is closed (`control_queue_full`); frames other clients cause
    /// (peerGone when a sender leaves, the offer of a session someone else
    /// asked for) stop at half of it and are dropped and counted, so that
    /// they never close anyone.
    pub control_queue_bytes: usize,
    /// The same for a mesh watcher, whose queue carries every presence
    /// change on the server: at least this, and at least twice a presence
    /// frame per connection on the server (so that the whole state it is
    /// sent when it subscribes always fits). A watcher over it is closed
    /// (it reconnects and is sent the whole state again) rather than left
    /// with a partial view.
    pub watcher_queue_bytes: usize,
    /// Bytes per cross-shard packet ring.
    pub ring_bytes: usize,
    /// TCP keepalive idle time for client sockets (`None`: system default).
    pub tcp_keepalive: Option<Duration>,
    /// `TCP_USER_TIMEOUT` for client sockets (`None`: system default).
    pub tcp_user_timeout: Option<Duration>,
    /// Root page behaviour.
    pub home: HomePage,
    /// `restarting` frame sent on graceful shutdown: reconnect after this.
    pub restart_reconnect_in: Duration,
    /// … and keep trying for this long.
    pub restart_try_for: Duration,
    /// How long a graceful shutdown waits for queued frames to drain.
    pub shutdown_grace: Duration,
    /// How keys are spread over shards ([`Placement::Random`] but in tests).
    pub placement: Placement,
    /// With `--certmode letsencrypt`: the ACME client's challenge answers
    /// (HTTP-01 is answered at `/.well-known/acme-challenge/`); the
    /// certificates' `AcmeState`.
    pub acme: Option<Arc<dyn AcmeChallenges>>,
    /// Names served at `/bootstrap-dns` (empty answers without); a
    /// `bootstrap_dns::BootstrapDns`.
    pub bootstrap_dns: Option<Arc<dyn BootstrapAnswers>>,
    /// Connections from [`DerpConfig::trusted_proxies`] start with a PROXY
    /// header naming the client (`--proxy-protocol`); a connection from
    /// anyone else that starts with one is refused.
    pub proxy_protocol: bool,
    /// Whose PROXY headers and `X-Forwarded-For`/`Forwarded` headers are
    /// believed (`--trusted-proxies`).
    pub trusted_proxies: TrustedProxies,
    /// Who may register ([`AdmissionConfig::enabled`]: anyone when off).
    pub admission: AdmissionConfig,
    /// Per-client receive limits at start (`--rate-config`; changed later
    /// with the shards' `Control::RateConfig`).
    pub rate: RateConfig,
    /// Accepted connections per second and burst
    /// (`--accept-connection-limit`, `--accept-connection-burst`); `None`
    /// accepts everything.
    pub accept_limit: Option<(f64, f64)>,
    /// Relay sessions (`ferry --relay-port`), offered to clients that ask;
    /// `None`: off, and clients see nothing of them.
    pub relay_sessions: Option<Arc<dyn SessionService>>,
    /// Application names (clientInfo `AppName`) refused at the handshake
    /// (`--disallow-app-names`); mesh peers are exempt. The empty string
    /// in the set refuses clients that send no name, as derper does.
    pub disallowed_app_names: HashSet<String>,
}

impl DerpConfig {
    /// Settings for a server with this key: derper's defaults where derper
    /// has the setting (timeouts, keepalives, the restarting frame), Ferry's
    /// own otherwise (queue and ring sizes, handshake deadline).
    pub fn new(private_key: NodePrivate) -> Self {
        let public_key = private_key.public();
        DerpConfig {
            private_key,
            public_key,
            mesh_key: None,
            mesh_with: Vec::new(),
            tls: None,
            ktls: false,
            tls_records: TlsRecords::Ferry,
            derp_enabled: true,
            write_timeout: Some(Duration::from_secs(2)),
            mesh_write_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(60),
            send_queue_bytes: 1 << 20,
            backpressure_budget: Duration::from_millis(50),
            busy_poll: Duration::ZERO,
            disco_queue_packets: 32,
            control_queue_bytes: 64 * 1024,
            watcher_queue_bytes: 4 << 20,
            ring_bytes: 1 << 20,
            tcp_keepalive: Some(Duration::from_secs(600)),
            tcp_user_timeout: Some(Duration::from_secs(15)),
            home: HomePage::Default,
            restart_reconnect_in: Duration::from_secs(1),
            restart_try_for: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(2),
            placement: Placement::Random,
            bootstrap_dns: None,
            acme: None,
            proxy_protocol: false,
            trusted_proxies: TrustedProxies::default(),
            admission: AdmissionConfig::default(),
            rate: RateConfig::default(),
            accept_limit: None,
            relay_sessions: None,
            disallowed_app_names: HashSet::new(),
        }
    }
}

/// `--tls-records`: who runs the TLS record layer after a TLS 1.3
/// handshake when kernel TLS does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsRecords {
    /// Ferry's own record layer (`transport::records::RecordLayer`).
    #[default]
    Ferry,
    /// rustls for the whole connection.
    Rustls,
}

impl FromStr for TlsRecords {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ferry" => Ok(TlsRecords::Ferry),
            "rustls" => Ok(TlsRecords::Rustls),
            other => Err(format!(
                "invalid TLS record layer {other:?}: expected ferry or rustls"
            )),
        }
    }
}

impl fmt::Display for TlsRecords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsRecords::Ferry => "ferry",
            TlsRecords::Rustls => "rustls",
        })
    }
}

/// How clients are admitted (the checks themselves are in `admission`,
/// as is this type's `Debug`, which hides the URL's credentials).
#[derive(Clone)]
pub struct AdmissionConfig {
    /// Ask the tailscaled whose LocalAPI listens on this socket
    /// (`--verify-clients` with `--socket`).
    pub local_socket: Option<PathBuf>,
    /// Ask this admission controller (`--verify-client-url`).
    pub url: Option<String>,
    /// Admit when the controller cannot be reached
    /// (`--verify-client-url-fail-open`, default true as derper).
    pub fail_open: bool,
    /// Time allowed for one question (derper: 5 s).
    pub timeout: Duration,
    /// Questions asked at once (threads).
    pub concurrency: usize,
    /// Questions waiting beyond those; more are refused at once.
    pub max_waiting: usize,
    /// Keep answers this long (`--verify-client-cache`); `None` asks every
    /// time, as derper does.
    pub cache_for: Option<Duration>,
}

impl AdmissionConfig {
    /// Whether any check is configured.
    pub fn enabled(&self) -> bool {
        self.local_socket.is_some() || self.url.is_some()
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            local_socket: None,
            url: None,
            fail_open: true,
            timeout: Duration::from_secs(5),
            concurrency: 16,
            max_waiting: 4096,
            cache_for: None,
        }
    }
}

/// The ACME client's HTTP-01 answers, as the HTTP front asks for them
/// (implemented by the certificates' `AcmeState`).
pub trait AcmeChallenges: Send + Sync {
    /// The key authorization to serve for `token`, if one is set.
    fn http_challenge(&self, token: &str) -> Option<String>;
}

/// The body of `/bootstrap-dns`, as the HTTP front asks for it
/// (implemented by `bootstrap_dns::BootstrapDns`).
pub trait BootstrapAnswers: Send + Sync {
    /// The JSON body for a request with this query string.
    fn answer(&self, query: Option<&str>) -> Vec<u8>;
}
