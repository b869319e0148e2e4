//! The SDK's error type: one enum that says which step failed, against
//! which server, and why.

use ferry_proto::client::ClientError;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Why a connection, a command or a DERP map failed.
///
/// Cloneable (I/O errors are shared) so that one failure can be both
/// reported in an [`Event`](crate::Event) and kept as the last error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not `http://host[:port]/derp` or `https://…`.
    #[error("invalid DERP URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The server's host name did not resolve.
    #[error("resolving {host}: {source}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A DERP map node has nothing to dial (no host name, both address
    /// families disabled, or `STUNOnly`).
    #[error("DERP node {node:?} has no address to dial")]
    NoAddress {
        /// The node's name.
        node: String,
    },
    /// The TCP connection could not be opened.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The address dialled.
        addr: std::net::SocketAddr,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The TLS configuration could not be built (no usable root
    /// certificates, a bad pin).
    #[error("TLS set-up for {host}: {reason}")]
    TlsSetup {
        /// The server name.
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// The TLS handshake failed (certificate not trusted, protocol error).
    #[error("TLS handshake with {host}: {source}")]
    Tls {
        /// The server name.
        host: String,
        /// rustls' error, as tokio-rustls reports it.
        #[source]
        source: Arc<io::Error>,
    },
    /// Reading from or writing to an established connection failed.
    #[error("connection to {server}: {source}")]
    Io {
        /// The server (`host:port`).
        server: String,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The DERP protocol failed: upgrade refused, handshake, framing, a
    /// keepalive or handshake deadline missed.
    #[error("DERP with {server}: {source}")]
    Protocol {
        /// The server (`host:port`).
        server: String,
        /// What the protocol state machine reported.
        #[source]
        source: ClientError,
    },
    /// The WebSocket upgrade was refused, or the server broke WebSocket
    /// framing.
    #[error("WebSocket with {server}: {source}")]
    WebSocket {
        /// The server (`host:port`).
        server: String,
        /// What went wrong.
        #[source]
        source: ferry_proto::websocket::WsError,
    },
    /// The whole connect (TCP, TLS, upgrade and handshake) took longer
    /// than [`Options::connect_timeout`](crate::Options::connect_timeout).
    #[error("connecting to {server} took longer than {limit:?}")]
    ConnectTimeout {
        /// The server (`host:port`).
        server: String,
        /// The limit.
        limit: Duration,
    },
    /// The server closed the connection.
    #[error("{server} closed the connection")]
    ServerClosed {
        /// The server (`host:port`).
        server: String,
    },
    /// A packet is larger than DERP allows (64 KiB); it was not sent.
    #[error("packet of {len} bytes exceeds the DERP limit of {max} bytes")]
    PacketTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No connection is up right now (the client is reconnecting); the
    /// packet or ping was not sent.
    #[error("not connected (reconnecting)")]
    NotConnected,
    /// The server offers no relay sessions to this client (it did not ask
    /// with [`Options::relay_sessions`](crate::Options::relay_sessions), or
    /// the server is derper, an older Ferry, or has them off).
    #[error("the server offers no relay sessions")]
    NoRelaySessions,
    /// A ping got no pong within
    /// [`Options::ping_timeout`](crate::Options::ping_timeout).
    #[error("no pong within {limit:?}")]
    PingTimeout {
        /// The limit.
        limit: Duration,
    },
    /// The connection a ping was sent on ended before the pong came.
    #[error("the connection ended before the pong arrived")]
    PingLost,
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
    /// Nothing to dial: an empty target list, or a region without DERP
    /// nodes.
    #[error("no server to dial")]
    NoTarget,
    /// No region of the DERP map could be measured or connected to.
    #[error("no usable region in the DERP map ({tried} tried)")]
    NoUsableRegion {
        /// How many regions were tried.
        tried: usize,
    },
    /// A region ID is not in the DERP map.
    #[error("region {region_id} is not in the DERP map")]
    UnknownRegion {
        /// The region ID.
        region_id: u64,
    },
}

impl Error {
    pub(crate) fn io(server: &str, source: io::Error) -> Self {
        Error::Io {
            server: server.to_owned(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn protocol(server: &str, source: ClientError) -> Self {
        Error::Protocol {
            server: server.to_owned(),
            source,
        }
    }
}
