//! What a [`Client`] reports: the [`Stage`] it is in, the [`ClientError`]
//! that ended it and the [`Event`]s it delivers.

use super::*;

/// Where a [`Client`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Classic mode: waiting for the `101 Switching Protocols` head.
    AwaitUpgrade,
    /// Classic mode: waiting for the `serverKey` frame.
    AwaitServerKey,
    /// `clientInfo` queued; waiting for `serverInfo`.
    AwaitServerInfo,
    /// Handshake done; frames flow.
    Connected,
    /// The server closed the connection at a frame boundary.
    Closed,
    /// An error ended the connection.
    Failed,
}

impl Stage {
    /// Whether the handshake is still running.
    pub fn is_handshake(self) -> bool {
        matches!(
            self,
            Stage::AwaitUpgrade | Stage::AwaitServerKey | Stage::AwaitServerInfo
        )
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::AwaitUpgrade => "waiting for the 101 response to the /derp upgrade",
            Stage::AwaitServerKey => "waiting for the serverKey frame",
            Stage::AwaitServerInfo => "waiting for the serverInfo frame",
            Stage::Connected => "connected",
            Stage::Closed => "closed by the server",
            Stage::Failed => "failed",
        })
    }
}

/// Why a client connection failed, or why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A configured header value holds CR or LF and would split the upgrade
    /// request.
    #[error("the {header} value for the /derp upgrade request contains CR or LF")]
    HeaderInjection {
        /// The header.
        header: &'static str,
    },
    /// The server answered the upgrade request with a status other than
    /// `101 Switching Protocols`.
    #[error(
        "server answered the /derp upgrade with {status} {reason:?}, expected 101 Switching Protocols"
    )]
    UpgradeRefused {
        /// HTTP status code.
        status: u16,
        /// Reason phrase as sent.
        reason: String,
    },
    /// The answer to the upgrade request is not an HTTP/1.x response head.
    #[error("malformed HTTP response to the /derp upgrade: {detail}")]
    MalformedResponse {
        /// What the HTTP parser reported.
        detail: String,
    },
    /// No end of the response head within [`MAX_RESPONSE_HEAD`] bytes.
    #[error("HTTP response head to the /derp upgrade exceeds {max} bytes")]
    ResponseTooLarge {
        /// The limit, [`MAX_RESPONSE_HEAD`].
        max: usize,
    },
    /// The 101 response's `Derp-Public-Key` header is not 64 hex digits.
    #[error("Derp-Public-Key header of the 101 response is not 64 hex digits: {value:?}")]
    BadPublicKeyHeader {
        /// The header value.
        value: String,
    },
    /// The `serverKey` frame names another key than the one already known
    /// (the `Derp-Public-Key` header, or the fast-start key).
    #[error("serverKey frame carries {got}, but the server was expected to be {expected}")]
    ServerKeyMismatch {
        /// The key known before the frame.
        expected: NodePublic,
        /// The key in the frame.
        got: NodePublic,
    },
    /// A fast-start request was answered with an HTTP response: the server
    /// does not support `Derp-Fast-Start` (`docs/derp-protocol.md` §4.4).
    #[error(
        "server answered a Derp-Fast-Start request with an HTTP response (no fast-start support)"
    )]
    FastStartRefused,
    /// A frame header broke the rule of the stage: a first frame other than
    /// serverKey, a frame other than serverInfo before the handshake ended,
    /// a serverKey over 1 KiB, or any frame over 1 MiB.
    #[error("{source} while {stage}")]
    Frame {
        /// Stage the client was in.
        stage: Stage,
        /// The framing rule that was broken.
        #[source]
        source: FrameError,
    },
    /// The serverKey frame is malformed (wrong magic, length) or the
    /// serverInfo box did not open or held invalid JSON.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The server closed the connection before the handshake completed.
    #[error("server closed the connection while {stage}")]
    ClosedDuringHandshake {
        /// Stage the client was in.
        stage: Stage,
    },
    /// The server closed the connection in the middle of a frame.
    #[error("server closed the connection in the middle of a frame ({held} bytes of it held)")]
    Truncated {
        /// Bytes of the partial frame received.
        held: usize,
    },
    /// The handshake did not finish within [`Config::handshake_timeout`].
    #[error("DERP handshake not finished within {limit:?} (still {stage})")]
    HandshakeTimeout {
        /// Stage the client was in.
        stage: Stage,
        /// The configured limit.
        limit: Duration,
    },
    /// Nothing arrived from the server for [`Config::keepalive_timeout`]
    /// (servers send keepAlive every ~60 s).
    #[error("no bytes from the server for {limit:?} (keepAlive comes every ~60 s): connection presumed dead")]
    KeepaliveTimeout {
        /// The configured limit.
        limit: Duration,
    },
    /// A packet is longer than DERP's 64 KiB limit; it was not sent.
    #[error("{frame} packet of {len} bytes exceeds the DERP limit of {max} bytes")]
    PacketTooLarge {
        /// The frame it was for.
        frame: &'static str,
        /// Packet length.
        len: usize,
        /// [`MAX_PACKET_SIZE`].
        max: usize,
    },
    /// A command came before `clientInfo` was queued (classic mode, before
    /// `serverKey`).
    #[error("cannot send a {frame} frame while {stage}")]
    NotReady {
        /// The frame the command would send.
        frame: &'static str,
        /// Stage the client was in.
        stage: Stage,
    },
    /// A mesh-only command (forwardPacket, watchConns, closePeer) on a
    /// client without a mesh key; the server would close the connection.
    #[error("{frame} is mesh-only and this client has no mesh key")]
    NotMesh {
        /// The frame the command would send.
        frame: &'static str,
    },
    /// The server already closed the connection.
    #[error("the server closed the connection")]
    Closed,
}

/// What a [`Client`] reports. `P` is the payload type: `&[u8]` borrowed from
/// the input during [`Client::handle_bytes`], `Vec<u8>` after
/// [`Event::into_owned`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<P = Vec<u8>> {
    /// `serverInfo` opened: the handshake is done. Always the first event.
    Connected {
        /// The server's public key.
        server_key: NodePublic,
        /// What the server said in `serverInfo`.
        info: ServerInfo,
    },
    /// A packet from `src` (`recvPacket`).
    Packet {
        /// Sender's key.
        src: NodePublic,
        /// The opaque packet.
        packet: P,
    },
    /// The peer is no longer reachable through this server (`peerGone`).
    PeerGone {
        /// The peer.
        key: NodePublic,
        /// Why; `Disconnected` when the server sent no reason byte.
        reason: PeerGoneReason,
    },
    /// A client connected to the server (`peerPresent`, watchers only).
    PeerPresent {
        /// The client's key.
        key: NodePublic,
        /// Its remote address, when the server sent one.
        addr: Option<SocketAddr>,
        /// `frame::PEER_PRESENT_*` flags; 0 when absent.
        flags: u8,
        /// The client's application name, when the server sent a valid one.
        app_name: Option<crate::app_name::AppName>,
    },
    /// The server pinged; with `can_ack_pings` the pong is already queued.
    Ping([u8; PING_LEN]),
    /// The answer to one of our pings.
    Pong([u8; PING_LEN]),
    /// The server's periodic no-op.
    KeepAlive,
    /// Connection health: a problem text, or empty when healthy again.
    Health(P),
    /// The server is about to restart (`restarting`).
    Restarting {
        /// Wait this long before reconnecting.
        reconnect_in: Duration,
        /// Keep trying for this long.
        try_for: Duration,
    },
    /// The server closed the connection at a frame boundary.
    ServerClosed,
    /// A relay session offer (relaySession; only to clients that asked).
    RelaySession(crate::relay_session::SessionOffer),
    /// A relay session refused (relayRefused; only to clients that asked).
    RelayRefused(crate::relay_session::Refused),
    /// A relay session offer naming its host (relaySession2; only to
    /// clients that asked for version 2).
    RelaySession2(crate::relay_session::v2::SessionOffer2),
    /// A relay session ended (relaySessionEnd; only to clients that asked
    /// for version 2).
    RelaySessionEnd(crate::relay_session::v2::SessionEnd),
}

impl Event<&[u8]> {
    /// Copies the borrowed payload out.
    pub fn into_owned(self) -> Event<Vec<u8>> {
        match self {
            Event::Connected { server_key, info } => Event::Connected { server_key, info },
            Event::Packet { src, packet } => Event::Packet {
                src,
                packet: packet.to_vec(),
            },
            Event::PeerGone { key, reason } => Event::PeerGone { key, reason },
            Event::PeerPresent {
                key,
                addr,
                flags,
                app_name,
            } => Event::PeerPresent {
                key,
                addr,
                flags,
                app_name,
            },
            Event::Ping(d) => Event::Ping(d),
            Event::Pong(d) => Event::Pong(d),
            Event::KeepAlive => Event::KeepAlive,
            Event::Health(text) => Event::Health(text.to_vec()),
            Event::Restarting {
                reconnect_in,
                try_for,
            } => Event::Restarting {
                reconnect_in,
                try_for,
            },
            Event::ServerClosed => Event::ServerClosed,
            Event::RelaySession(o) => Event::RelaySession(o),
            Event::RelayRefused(r) => Event::RelayRefused(r),
            Event::RelaySession2(o) => Event::RelaySession2(o),
            Event::RelaySessionEnd(e) => Event::RelaySessionEnd(e),
        }
    }
}
