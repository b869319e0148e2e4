//! How an [`super::Endpoint`] is set up: its relays, its socket and
//! queues, its probing; and how each peer is reached.

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
pub struct DerpServerOptions {
    /// A name for status and logs.
    pub name: String,
    /// `http://host:port/derp` or `https://host/derp`.
    pub url: String,
    /// How the DERP client connects.
    pub options: Options,
    /// The STUN server that tells this endpoint its public address;
    /// `None`: the URL's host, port 3478.
    pub stun: Option<SocketAddr>,
}

impl DerpServerOptions {
    /// A relay at `url` with default options.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> DerpServerOptions {
        DerpServerOptions {
            name: name.into(),
            url: url.into(),
            options: Options::default(),
            stun: None,
        }
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
    /// The UDP socket for direct paths, relay sessions and STUN.
    pub bind: SocketAddr,
    /// Received datagrams held for [`Endpoint::recv`], and datagrams held
    /// per DERP server for sending, before more are dropped.
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
    /// Ask relays that offer them for relay sessions with peers.
    pub relay_sessions: bool,
    /// How persistently relay sessions are sought.
    pub session_timing: SessionTiming,
}

impl EndpointOptions {
    /// Defaults: every interface, an ephemeral port, queues of 1024
    /// datagrams, 8 MiB of them received.
    pub fn new(key: NodePrivate, relays: Vec<DerpServerOptions>) -> EndpointOptions {
        EndpointOptions {
            key,
            relays,
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            queue: 1024,
            queue_bytes: 8 << 20,
            socket_buffer: 4 << 20,
            seed: None,
            timing: Timing::default(),
            discover: true,
            advertise: Vec::new(),
            stun_interval: Duration::from_secs(20),
            relay_sessions: true,
            session_timing: SessionTiming::default(),
        }
    }
}

/// How a peer is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerOptions {
    /// Index into [`EndpointOptions::relays`]: the DERP server the peer is
    /// connected to.
    pub relay: usize,
    /// This kind of path first when it works.
    pub prefer: Option<PathKind>,
    /// This kind of path alone.
    pub only: Option<PathKind>,
}
