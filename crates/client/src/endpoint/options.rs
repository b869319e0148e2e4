//! How an [`super::Endpoint`] is set up: its DERP servers, its socket and
//! queues, its probing; and how each peer is reached.
//!
//! Every options type is `#[non_exhaustive]`: start from its constructor
//! (or `Default`) and change the fields or call the builder methods, so
//! that a field added later breaks no caller.

use super::paths::{PathKind, Timing};
use super::relay_sessions::SessionTiming;
#[cfg(doc)]
use super::Endpoint;
use crate::Options;
use ferry_proto::key::NodePrivate;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// One DERP server the endpoint connects to.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DerpServerOptions {
    /// A name for status and logs.
    pub name: String,
    /// `http://host:port/derp` or `https://host/derp`.
    pub url: String,
    /// The URLs of the region's other nodes (meshed with `url`'s), same
    /// form. The first connection tries `url`, then these in order; after
    /// a connection is lost, the next node in that list is tried first,
    /// so a node that dies is left at once for another one. Empty by
    /// default.
    pub fallback_urls: Vec<String>,
    /// How the DERP client connects; [`Options::relay_sessions`] (on by
    /// default) says whether the endpoint asks this server for relay
    /// sessions.
    pub options: Options,
    /// The STUN server that tells this endpoint its public address;
    /// `None`: the URL's host, port 3478.
    pub stun: Option<SocketAddr>,
}

impl DerpServerOptions {
    /// A DERP server at `url` with default options.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> DerpServerOptions {
        DerpServerOptions {
            name: name.into(),
            url: url.into(),
            fallback_urls: Vec::new(),
            options: Options::default(),
            stun: None,
        }
    }

    /// With these URLs of the region's other nodes
    /// ([`DerpServerOptions::fallback_urls`]).
    pub fn with_fallback_urls(mut self, urls: Vec<String>) -> DerpServerOptions {
        self.fallback_urls = urls;
        self
    }

    /// With these DERP client options.
    pub fn with_options(mut self, options: Options) -> DerpServerOptions {
        self.options = options;
        self
    }

    /// With this STUN server.
    pub fn with_stun(mut self, stun: SocketAddr) -> DerpServerOptions {
        self.stun = Some(stun);
        self
    }
}

/// How an [`Endpoint`] binds, connects and probes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointOptions {
    /// This endpoint's key (its DERP address, and the key probes are
    /// sealed with).
    pub key: NodePrivate,
    /// The DERP servers, connected to at [`Endpoint::bind`]; peers name
    /// theirs by index.
    pub relays: Vec<DerpServerOptions>,
    /// Index into [`EndpointOptions::relays`]: this endpoint's home, the
    /// DERP server its peers reach it through (their
    /// [`PeerOptions::relay`] for it). A pair's relay session lives on the
    /// home of the lower key (bytewise): this side asks its own home when
    /// its key is the lower, else the peer's server, so both sides ask
    /// one server and bind one session. Default 0, the first.
    pub home: usize,
    /// The UDP socket for direct paths, relay sessions and STUN.
    pub bind: SocketAddr,
    /// Received datagrams held for [`Endpoint::recv`] (before more are
    /// dropped and counted), and datagrams held per DERP server for
    /// sending (before [`Endpoint::send`] waits and
    /// [`Endpoint::try_send`] refuses).
    pub queue: usize,
    /// Bytes of received datagrams held for [`Endpoint::recv`] before more
    /// are dropped (with `queue`, whichever is reached first: a peer
    /// sending large datagrams to an application that lags holds this
    /// much, not `queue` times 64 KiB).
    pub queue_bytes: usize,
    /// Receive and send buffer asked of the kernel for the UDP socket
    /// (bytes; the kernel may grant less).
    pub socket_buffer: usize,
    /// Seed of the ping ids (tests); `None` draws one.
    pub seed: Option<u64>,
    /// The probing schedule.
    pub timing: Timing,
    /// Announce the local address and the STUN-learned one to peers. Off,
    /// only [`EndpointOptions::advertise`] is announced.
    pub discover: bool,
    /// Further addresses to announce (a port forward, a known public
    /// address).
    pub advertise: Vec<SocketAddr>,
    /// How often STUN is asked again.
    pub stun_interval: Duration,
    /// How persistently relay sessions are sought (from the DERP servers
    /// whose [`Options::relay_sessions`] is on and that offer them).
    pub session_timing: SessionTiming,
    /// Events each [`Endpoint::events`] subscription holds before the
    /// oldest are dropped for it (it is then told how many,
    /// [`super::EventKind::Lagged`]).
    pub event_queue: usize,
}

impl EndpointOptions {
    /// Defaults: every interface, an ephemeral port, queues of 1024
    /// datagrams, 8 MiB of them received, 256 events per subscription.
    pub fn new(key: NodePrivate, relays: Vec<DerpServerOptions>) -> EndpointOptions {
        EndpointOptions {
            key,
            relays,
            home: 0,
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            queue: 1024,
            queue_bytes: 8 << 20,
            socket_buffer: 4 << 20,
            seed: None,
            timing: Timing::default(),
            discover: true,
            advertise: Vec::new(),
            stun_interval: Duration::from_secs(20),
            session_timing: SessionTiming::default(),
            event_queue: 256,
        }
    }
}

/// How a peer is reached: [`PeerOptions::new`] (its DERP server is the
/// first, every kind of path, best first) and the builder methods.
///
/// ```
/// use ferry_client::{PathKind, PeerOptions};
///
/// let o = PeerOptions::new().relay(1).prefer(PathKind::RelaySession);
/// assert_eq!((o.relay, o.prefer, o.only), (1, Some(PathKind::RelaySession), None));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerOptions {
    /// Index into [`EndpointOptions::relays`]: the DERP server the peer is
    /// connected to. [`Endpoint::add_peer`] refuses one that names no
    /// server.
    pub relay: usize,
    /// This kind of path first when it works.
    pub prefer: Option<PathKind>,
    /// This kind of path alone; while none of it works, sends fail with
    /// [`super::SendError::NoPath`].
    pub only: Option<PathKind>,
}

impl PeerOptions {
    /// The defaults: DERP server 0, every kind of path, best first.
    pub fn new() -> PeerOptions {
        PeerOptions::default()
    }

    /// The peer's DERP server: index `relay` of
    /// [`EndpointOptions::relays`].
    pub fn relay(mut self, relay: usize) -> PeerOptions {
        self.relay = relay;
        self
    }

    /// This kind of path first when it works.
    pub fn prefer(mut self, kind: PathKind) -> PeerOptions {
        self.prefer = Some(kind);
        self
    }

    /// This kind of path alone.
    pub fn only(mut self, kind: PathKind) -> PeerOptions {
        self.only = Some(kind);
        self
    }
}
