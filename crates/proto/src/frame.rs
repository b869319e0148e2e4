//! DERP framing (`docs/derp-protocol.md` §5, §6): frame types, builders,
//! parsers, admission policy and the incremental [`Deframer`].
//!
//! Every frame is `type (1 B) ‖ length (u32 big-endian) ‖ payload`. Data flows
//! through this module in three steps:
//!
//! 1. **Admission.** When the [`Deframer`] has read a header it asks a
//!    [`FramePolicy`] what to do *before* reading the payload: buffer it, skip
//!    it (unknown or ignored types: the payload is discarded as it streams past
//!    and never stored), or reject the connection (oversized frames, mesh-only
//!    frames from ordinary clients). [`ServerFramePolicy`] encodes the Go
//!    server's rules (`docs/derp-protocol.md` §5, §6, §8.11);
//!    [`ClientFramePolicy`] the client's.
//! 2. **Delivery.** Admitted frames are handed to a callback as `(type,
//!    payload)`. When no partial frame is held, payloads are subslices of the
//!    caller's input: nothing is copied. Only a frame split across reads is
//!    copied into the deframer's own buffer, which never grows beyond the
//!    largest frame the policy admits.
//! 3. **Parsing.** [`parse_client_frame`] (server side) and
//!    [`parse_server_frame`] (client side) turn a payload into a typed,
//!    borrowing value.
//!
//! Outgoing frames are built by the `put_*` functions, which append a whole
//! frame to a caller-owned `Vec<u8>` so a connection's write buffer is reused
//! and no allocation happens per frame.
//!
//! Builders take packets the caller has already bounded (a server relays only
//! packets its policy admitted; a client must refuse packets larger than
//! [`MAX_PACKET_SIZE`] itself). They panic only if a payload exceeds
//! `u32::MAX` bytes, which no DERP frame can.

use crate::app_name::{AppName, MAX_APP_NAME_LEN};
use crate::key::NodePublic;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::ControlFlow;

mod deframe;
pub use deframe::{
    ClientFramePolicy, ClientInfoFramePolicy, Deframer, Disposition, Fed, FramePolicy,
    ServerFramePolicy, MAX_SKIPPED_FRAME,
};

/// Frame header length: type byte and big-endian u32 payload length.
pub const HEADER_LEN: usize = 5;
/// Length of a node public key inside frames.
pub const KEY_LEN: usize = 32;
/// Largest packet a client may send or receive in send/forward/recvPacket.
pub const MAX_PACKET_SIZE: usize = 64 << 10;
/// The `serverKey` magic, `DERP🔑`.
pub const MAGIC: [u8; 8] = *b"DERP\xF0\x9F\x94\x91";
/// Smallest `clientInfo` payload the server accepts (key + nonce).
pub const MIN_CLIENT_INFO_LEN: usize = KEY_LEN + crate::nacl::NONCE_LEN;
/// Largest `clientInfo` payload the server accepts (256 KiB).
pub const MAX_CLIENT_INFO_LEN: usize = 256 << 10;
/// Largest frame a Go client reads in steady state (1 MiB).
pub const MAX_CLIENT_READ_FRAME: usize = 1 << 20;
/// The disco packet magic, `TS💬`.
pub const DISCO_MAGIC: [u8; 6] = *b"TS\xF0\x9F\x92\xAC";
/// A disco packet is at least magic + sender disco key + nonce long.
pub const DISCO_MIN_LEN: usize = DISCO_MAGIC.len() + KEY_LEN + crate::nacl::NONCE_LEN;
/// Ping and pong carry 8 opaque bytes.
pub const PING_LEN: usize = 8;
/// Longest ping payload the server tolerates (extra bytes are ignored).
pub const MAX_PING_LEN: usize = 1000;
/// Length of the `peerPresent` payload current servers send before the
/// application name: key, IP, port, flags and the name's length byte.
pub const PEER_PRESENT_LEN: usize = KEY_LEN + 16 + 2 + 1 + 1;
/// The DERP protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 2;

/// `peerPresent` flag: an ordinary client (none of the other flags apply).
pub const PEER_PRESENT_IS_REGULAR: u8 = 1 << 0;
/// `peerPresent` flag: the connection authenticated with the mesh key.
pub const PEER_PRESENT_IS_MESH_PEER: u8 = 1 << 1;
/// `peerPresent` flag: the client said it is a prober.
pub const PEER_PRESENT_IS_PROBER: u8 = 1 << 2;
/// `peerPresent` flag: the upgrade request carried a non-empty `Ideal-Node`.
pub const PEER_PRESENT_NOT_IDEAL: u8 = 1 << 3;

/// Whether `packet` is a disco message (`docs/derp-protocol.md` §8.2): at least
/// [`DISCO_MIN_LEN`] bytes starting with [`DISCO_MAGIC`].
pub fn is_disco(packet: &[u8]) -> bool {
    packet.len() >= DISCO_MIN_LEN && packet.starts_with(&DISCO_MAGIC)
}

/// What a relayed packet is, for queue caps and counting: disco (NAT
/// traversal, see [`is_disco`]) or anything else (WireGuard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Starts with the disco magic.
    Disco,
    /// Everything else.
    Other,
}

impl PacketKind {
    /// Every value, in label order.
    pub const ALL: &'static [PacketKind] = &[PacketKind::Disco, PacketKind::Other];
    /// Number of values.
    pub const COUNT: usize = Self::ALL.len();

    /// The kind of `packet`.
    #[inline]
    pub fn of(packet: &[u8]) -> PacketKind {
        if is_disco(packet) {
            PacketKind::Disco
        } else {
            PacketKind::Other
        }
    }

    /// Its name as a metrics label (derper's `kind` label).
    pub fn label(self) -> &'static str {
        match self {
            PacketKind::Disco => "disco",
            PacketKind::Other => "other",
        }
    }
}

/// Ferry's relayAllocate frame (`docs/relay-sessions.md` §2), C→S, only
/// from clients that asked for relay sessions (see
/// [`ServerFramePolicy::relay_sessions`] and [`crate::relay_session`]).
pub const RELAY_ALLOCATE: u8 = 0xf0;
/// Ferry's relaySession frame, S→C.
pub const RELAY_SESSION: u8 = 0xf1;
/// Ferry's relayRefused frame, S→C.
pub const RELAY_REFUSED: u8 = 0xf2;

/// The frame types of protocol version 2 (`docs/derp-protocol.md` §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// S→C: magic ‖ server public key.
    ServerKey = 0x01,
    /// C→S: client public key ‖ sealed JSON.
    ClientInfo = 0x02,
    /// S→C: sealed JSON.
    ServerInfo = 0x03,
    /// C→S: destination key ‖ packet.
    SendPacket = 0x04,
    /// S→C: source key ‖ packet.
    RecvPacket = 0x05,
    /// S→C: empty no-op.
    KeepAlive = 0x06,
    /// C→S: one byte, whether this is the client's home server.
    NotePreferred = 0x07,
    /// S→C: peer key ‖ optional reason.
    PeerGone = 0x08,
    /// S→C (watchers): key ‖ IP ‖ port ‖ flags.
    PeerPresent = 0x09,
    /// C→S (mesh only): source key ‖ destination key ‖ packet.
    ForwardPacket = 0x0a,
    /// C→S (mesh only): empty subscription request.
    WatchConns = 0x10,
    /// C→S (mesh only): key of the peer to disconnect.
    ClosePeer = 0x11,
    /// Both: 8 opaque bytes.
    Ping = 0x12,
    /// Both: the 8 bytes of a ping.
    Pong = 0x13,
    /// S→C: problem text, empty when healthy again.
    Health = 0x14,
    /// S→C: reconnect-in ms ‖ try-for ms.
    Restarting = 0x15,
}

impl FrameType {
    /// Every frame type, in numeric order.
    pub const ALL: [FrameType; 16] = [
        FrameType::ServerKey,
        FrameType::ClientInfo,
        FrameType::ServerInfo,
        FrameType::SendPacket,
        FrameType::RecvPacket,
        FrameType::KeepAlive,
        FrameType::NotePreferred,
        FrameType::PeerGone,
        FrameType::PeerPresent,
        FrameType::ForwardPacket,
        FrameType::WatchConns,
        FrameType::ClosePeer,
        FrameType::Ping,
        FrameType::Pong,
        FrameType::Health,
        FrameType::Restarting,
    ];

    /// The frame type with this wire value, if it is assigned.
    pub fn from_u8(ty: u8) -> Option<FrameType> {
        Some(match ty {
            0x01 => FrameType::ServerKey,
            0x02 => FrameType::ClientInfo,
            0x03 => FrameType::ServerInfo,
            0x04 => FrameType::SendPacket,
            0x05 => FrameType::RecvPacket,
            0x06 => FrameType::KeepAlive,
            0x07 => FrameType::NotePreferred,
            0x08 => FrameType::PeerGone,
            0x09 => FrameType::PeerPresent,
            0x0a => FrameType::ForwardPacket,
            0x10 => FrameType::WatchConns,
            0x11 => FrameType::ClosePeer,
            0x12 => FrameType::Ping,
            0x13 => FrameType::Pong,
            0x14 => FrameType::Health,
            0x15 => FrameType::Restarting,
            _ => return None,
        })
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The Go name of the frame, as used in logs and errors.
    pub const fn name(self) -> &'static str {
        match self {
            FrameType::ServerKey => "serverKey",
            FrameType::ClientInfo => "clientInfo",
            FrameType::ServerInfo => "serverInfo",
            FrameType::SendPacket => "sendPacket",
            FrameType::RecvPacket => "recvPacket",
            FrameType::KeepAlive => "keepAlive",
            FrameType::NotePreferred => "notePreferred",
            FrameType::PeerGone => "peerGone",
            FrameType::PeerPresent => "peerPresent",
            FrameType::ForwardPacket => "forwardPacket",
            FrameType::WatchConns => "watchConns",
            FrameType::ClosePeer => "closePeer",
            FrameType::Ping => "ping",
            FrameType::Pong => "pong",
            FrameType::Health => "health",
            FrameType::Restarting => "restarting",
        }
    }
}

impl From<FrameType> for u8 {
    fn from(t: FrameType) -> u8 {
        t as u8
    }
}

/// Displays a raw frame type as `name (0xNN)` for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLabel(pub u8);

impl fmt::Display for FrameLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match FrameType::from_u8(self.0) {
            Some(t) => write!(f, "{} frame (0x{:02x})", t.name(), self.0),
            None => write!(f, "unknown frame (0x{:02x})", self.0),
        }
    }
}

/// A framing violation. On the server every one of these closes the
/// connection (Go sends no error frame).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A mesh-only frame (forwardPacket, watchConns, closePeer) arrived on a
    /// connection that did not authenticate with the mesh key.
    #[error("{} is mesh-only and this connection did not present the mesh key", FrameLabel(*.frame))]
    MeshOnly {
        /// Raw frame type.
        frame: u8,
    },
    /// The payload is longer than the frame type allows.
    #[error("{} too long: {len} bytes, limit {max}", FrameLabel(*.frame))]
    TooLong {
        /// Raw frame type.
        frame: u8,
        /// Payload length announced or seen.
        len: usize,
        /// Largest allowed payload length.
        max: usize,
    },
    /// The payload is shorter than the frame type requires.
    #[error("{} too short: {len} bytes, minimum {min}", FrameLabel(*.frame))]
    TooShort {
        /// Raw frame type.
        frame: u8,
        /// Payload length announced or seen.
        len: usize,
        /// Smallest allowed payload length.
        min: usize,
    },
    /// The frame type has a fixed payload length and this is not it.
    #[error("{} has length {len}, must be exactly {expected}", FrameLabel(*.frame))]
    BadLength {
        /// Raw frame type.
        frame: u8,
        /// Payload length announced or seen.
        len: usize,
        /// The only allowed payload length.
        expected: usize,
    },
    /// A specific frame type was required (e.g. clientInfo first) and a
    /// different one arrived.
    #[error("expected {} but got {}", FrameLabel(*.expected), FrameLabel(*.frame))]
    Unexpected {
        /// Raw type that arrived.
        frame: u8,
        /// Raw type that was required.
        expected: u8,
    },
}

// ---------------------------------------------------------------------------
// Headers

/// Encodes a frame header.
pub fn encode_header(ty: u8, len: u32) -> [u8; HEADER_LEN] {
    let l = len.to_be_bytes();
    [ty, l[0], l[1], l[2], l[3]]
}

/// Decodes a frame header from the first five bytes of `buf`, or `None` if
/// fewer than five bytes are available.
pub fn decode_header(buf: &[u8]) -> Option<(u8, u32)> {
    let h: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
    Some((h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]])))
}

fn frame_len(payload_len: usize) -> u32 {
    u32::try_from(payload_len).expect("DERP frame payload exceeds u32::MAX bytes")
}

fn put_header(out: &mut Vec<u8>, ty: FrameType, payload_len: usize) {
    out.extend_from_slice(&encode_header(ty as u8, frame_len(payload_len)));
}

// ---------------------------------------------------------------------------
// Builders

/// Appends a frame of any type with the given payload.
pub fn put_frame(out: &mut Vec<u8>, ty: u8, payload: &[u8]) {
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&encode_header(ty, frame_len(payload.len())));
    out.extend_from_slice(payload);
}

/// The header and source key of a `recvPacket` frame carrying a
/// `packet_len`-byte packet, for writers that send the packet bytes from
/// their own buffer (vectored writes).
pub fn recv_packet_header(src: &NodePublic, packet_len: usize) -> [u8; HEADER_LEN + KEY_LEN] {
    let mut h = [0u8; HEADER_LEN + KEY_LEN];
    h[..HEADER_LEN].copy_from_slice(&encode_header(
        FrameType::RecvPacket as u8,
        frame_len(KEY_LEN + packet_len),
    ));
    h[HEADER_LEN..].copy_from_slice(src.as_bytes());
    h
}

/// Appends `recvPacket`: a packet from `src` delivered to this client.
pub fn put_recv_packet(out: &mut Vec<u8>, src: &NodePublic, packet: &[u8]) {
    out.reserve(HEADER_LEN + KEY_LEN + packet.len());
    out.extend_from_slice(&recv_packet_header(src, packet.len()));
    out.extend_from_slice(packet);
}

/// Appends `sendPacket`: ask the server to deliver `packet` to `dst`.
pub fn put_send_packet(out: &mut Vec<u8>, dst: &NodePublic, packet: &[u8]) {
    out.reserve(HEADER_LEN + KEY_LEN + packet.len());
    put_header(out, FrameType::SendPacket, KEY_LEN + packet.len());
    out.extend_from_slice(dst.as_bytes());
    out.extend_from_slice(packet);
}

/// Appends `forwardPacket`: a mesh peer hands over a packet from `src` for
/// `dst`.
pub fn put_forward_packet(out: &mut Vec<u8>, src: &NodePublic, dst: &NodePublic, packet: &[u8]) {
    out.reserve(HEADER_LEN + 2 * KEY_LEN + packet.len());
    put_header(out, FrameType::ForwardPacket, 2 * KEY_LEN + packet.len());
    out.extend_from_slice(src.as_bytes());
    out.extend_from_slice(dst.as_bytes());
    out.extend_from_slice(packet);
}

/// Appends `keepAlive`.
pub fn put_keepalive(out: &mut Vec<u8>) {
    put_header(out, FrameType::KeepAlive, 0);
}

/// Appends `ping` with the given 8 bytes.
pub fn put_ping(out: &mut Vec<u8>, data: &[u8; PING_LEN]) {
    put_header(out, FrameType::Ping, PING_LEN);
    out.extend_from_slice(data);
}

/// Appends `pong` echoing a ping's 8 bytes.
pub fn put_pong(out: &mut Vec<u8>, data: &[u8; PING_LEN]) {
    put_header(out, FrameType::Pong, PING_LEN);
    out.extend_from_slice(data);
}

/// Why a peer is gone (`docs/derp-protocol.md` §6.1, `peerGone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerGoneReason {
    /// `0x00`: the peer left the region (also assumed when the byte is absent).
    Disconnected,
    /// `0x01`: the server does not know the peer a disco packet was sent to.
    NotHere,
    /// Any other value; clients treat it as "gone". (`0xF0`,
    /// MeshConnBroke, is synthesised locally by Go and never sent.)
    Other(u8),
}

impl PeerGoneReason {
    /// The wire byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            PeerGoneReason::Disconnected => 0x00,
            PeerGoneReason::NotHere => 0x01,
            PeerGoneReason::Other(b) => b,
        }
    }

    /// The reason for a wire byte. `Other(0)` and `Other(1)` never result.
    pub const fn from_u8(b: u8) -> Self {
        match b {
            0x00 => PeerGoneReason::Disconnected,
            0x01 => PeerGoneReason::NotHere,
            b => PeerGoneReason::Other(b),
        }
    }
}

impl From<u8> for PeerGoneReason {
    fn from(b: u8) -> Self {
        Self::from_u8(b)
    }
}

impl From<PeerGoneReason> for u8 {
    fn from(r: PeerGoneReason) -> u8 {
        r.to_u8()
    }
}

/// Appends `peerGone` for `key` with a reason byte.
pub fn put_peer_gone(out: &mut Vec<u8>, key: &NodePublic, reason: PeerGoneReason) {
    put_header(out, FrameType::PeerGone, KEY_LEN + 1);
    out.extend_from_slice(key.as_bytes());
    out.push(reason.to_u8());
}

/// Appends `peerPresent`: key, IP as 16 bytes (IPv4 as IPv4-mapped IPv6,
/// all zero when `addr` is `None`), port, flags, then the application
/// name's length (always, 0 for none) and the name: 52 bytes plus the
/// name. `app_name` must be valid ([`crate::app_name::valid_app_name`]);
/// anything longer than [`MAX_APP_NAME_LEN`] bytes is cut there.
pub fn put_peer_present(
    out: &mut Vec<u8>,
    key: &NodePublic,
    addr: Option<SocketAddr>,
    flags: u8,
    app_name: &str,
) {
    debug_assert!(crate::app_name::valid_app_name(app_name.as_bytes()));
    let name = &app_name.as_bytes()[..app_name.len().min(MAX_APP_NAME_LEN)];
    put_header(out, FrameType::PeerPresent, PEER_PRESENT_LEN + name.len());
    out.extend_from_slice(key.as_bytes());
    let (ip, port) = match addr {
        None => ([0u8; 16], 0),
        Some(SocketAddr::V4(a)) => (a.ip().to_ipv6_mapped().octets(), a.port()),
        Some(SocketAddr::V6(a)) => (a.ip().octets(), a.port()),
    };
    out.extend_from_slice(&ip);
    out.extend_from_slice(&port.to_be_bytes());
    out.push(flags);
    out.push(name.len() as u8);
    out.extend_from_slice(name);
}

/// Appends `notePreferred`.
pub fn put_note_preferred(out: &mut Vec<u8>, preferred: bool) {
    put_header(out, FrameType::NotePreferred, 1);
    out.push(u8::from(preferred));
}

/// Appends `watchConns`.
pub fn put_watch_conns(out: &mut Vec<u8>) {
    put_header(out, FrameType::WatchConns, 0);
}

/// Appends `closePeer` for `key`.
pub fn put_close_peer(out: &mut Vec<u8>, key: &NodePublic) {
    put_header(out, FrameType::ClosePeer, KEY_LEN);
    out.extend_from_slice(key.as_bytes());
}

/// Appends `health` with a problem description (empty = healthy again).
pub fn put_health(out: &mut Vec<u8>, problem: &str) {
    put_header(out, FrameType::Health, problem.len());
    out.extend_from_slice(problem.as_bytes());
}

/// Appends `restarting`.
pub fn put_restarting(out: &mut Vec<u8>, reconnect_in_ms: u32, try_for_ms: u32) {
    put_header(out, FrameType::Restarting, 8);
    out.extend_from_slice(&reconnect_in_ms.to_be_bytes());
    out.extend_from_slice(&try_for_ms.to_be_bytes());
}

// ---------------------------------------------------------------------------
// Parsers

fn key_at(payload: &[u8], at: usize) -> NodePublic {
    let mut k = [0u8; KEY_LEN];
    k.copy_from_slice(&payload[at..at + KEY_LEN]);
    NodePublic(k)
}

fn eight(payload: &[u8]) -> [u8; 8] {
    let mut b = [0u8; 8];
    b.copy_from_slice(&payload[..8]);
    b
}

fn check_range(ty: FrameType, len: usize, min: usize, max: usize) -> Result<(), FrameError> {
    let frame = ty as u8;
    if len < min {
        Err(FrameError::TooShort { frame, len, min })
    } else if len > max {
        Err(FrameError::TooLong { frame, len, max })
    } else {
        Ok(())
    }
}

fn check_exact(ty: FrameType, len: usize, expected: usize) -> Result<(), FrameError> {
    if len == expected {
        Ok(())
    } else {
        Err(FrameError::BadLength {
            frame: ty as u8,
            len,
            expected,
        })
    }
}

/// A frame a client sends, as the server sees it. Borrows the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFrame<'a> {
    /// Deliver `packet` to `dst`.
    SendPacket {
        /// Destination key.
        dst: NodePublic,
        /// The opaque packet.
        packet: &'a [u8],
    },
    /// Mesh: deliver `packet` from `src` to the local client `dst`.
    ForwardPacket {
        /// Original sender's key.
        src: NodePublic,
        /// Destination key.
        dst: NodePublic,
        /// The opaque packet.
        packet: &'a [u8],
    },
    /// Whether this server is the client's home.
    NotePreferred(bool),
    /// Ping data to echo in a pong (the first 8 bytes of the payload).
    Ping([u8; PING_LEN]),
    /// A pong (servers ignore these; see [`ServerFramePolicy`]).
    Pong([u8; PING_LEN]),
    /// Mesh: subscribe to the connection list.
    WatchConns,
    /// Mesh: disconnect every local connection of this key.
    ClosePeer(NodePublic),
    /// Any other type; the server ignores it.
    Other {
        /// Raw frame type.
        ty: u8,
    },
}

/// Parses a frame a client sent. Length rules are those of
/// `docs/derp-protocol.md` §6; mesh permission is not checked here (that is
/// [`ServerFramePolicy`]'s job, before the payload is read). Every frame
/// [`ServerFramePolicy`] admits parses successfully.
pub fn parse_client_frame(ty: u8, payload: &[u8]) -> Result<ClientFrame<'_>, FrameError> {
    let len = payload.len();
    let Some(t) = FrameType::from_u8(ty) else {
        return Ok(ClientFrame::Other { ty });
    };
    Ok(match t {
        FrameType::SendPacket => {
            check_range(t, len, KEY_LEN, KEY_LEN + MAX_PACKET_SIZE)?;
            ClientFrame::SendPacket {
                dst: key_at(payload, 0),
                packet: &payload[KEY_LEN..],
            }
        }
        FrameType::ForwardPacket => {
            check_range(t, len, 2 * KEY_LEN, 2 * KEY_LEN + MAX_PACKET_SIZE)?;
            ClientFrame::ForwardPacket {
                src: key_at(payload, 0),
                dst: key_at(payload, KEY_LEN),
                packet: &payload[2 * KEY_LEN..],
            }
        }
        FrameType::NotePreferred => {
            check_exact(t, len, 1)?;
            ClientFrame::NotePreferred(payload[0] != 0)
        }
        FrameType::Ping => {
            check_range(t, len, PING_LEN, MAX_PING_LEN)?;
            ClientFrame::Ping(eight(payload))
        }
        FrameType::Pong => {
            check_range(t, len, PING_LEN, usize::MAX)?;
            ClientFrame::Pong(eight(payload))
        }
        FrameType::WatchConns => {
            check_exact(t, len, 0)?;
            ClientFrame::WatchConns
        }
        FrameType::ClosePeer => {
            check_exact(t, len, KEY_LEN)?;
            ClientFrame::ClosePeer(key_at(payload, 0))
        }
        _ => ClientFrame::Other { ty },
    })
}

/// A frame a server sends, as the client sees it. Borrows the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerFrame<'a> {
    /// The server's public key (first frame of a connection).
    ServerKey(NodePublic),
    /// The sealed serverInfo box (`nonce ‖ tag ‖ ciphertext`); open it with
    /// [`crate::handshake::open_server_info`].
    ServerInfo(&'a [u8]),
    /// A packet from `src`.
    RecvPacket {
        /// Sender's key.
        src: NodePublic,
        /// The opaque packet.
        packet: &'a [u8],
    },
    /// No-op.
    KeepAlive,
    /// The peer is no longer reachable through this server.
    PeerGone {
        /// The peer.
        key: NodePublic,
        /// Why; `Disconnected` when the byte is absent.
        reason: PeerGoneReason,
    },
    /// A client connected to the server (watchers only).
    PeerPresent {
        /// The client's key.
        key: NodePublic,
        /// Its remote address, `None` when the server sent none or zeros.
        /// IPv4-mapped addresses are returned as IPv4.
        addr: Option<SocketAddr>,
        /// `PEER_PRESENT_*` flags; 0 when absent.
        flags: u8,
        /// The client's application name; `None` when the server sent
        /// none, an empty one, an invalid one, or fewer bytes than the
        /// length byte promised.
        app_name: Option<AppName>,
    },
    /// The server pings; answer with a pong.
    Ping([u8; PING_LEN]),
    /// Answer to our ping.
    Pong([u8; PING_LEN]),
    /// Connection health text; empty means healthy.
    Health(&'a [u8]),
    /// The server is about to restart.
    Restarting {
        /// Wait this long before reconnecting.
        reconnect_in_ms: u32,
        /// Keep trying for this long.
        try_for_ms: u32,
    },
    /// A frame to ignore: unknown type, or a known type too short to act on
    /// (Go clients drop those rather than fail, `docs/derp-protocol.md` §6.1).
    Other {
        /// Raw frame type.
        ty: u8,
    },
}

/// Parses a frame a server sent, tolerantly as Go clients do
/// (`docs/derp-protocol.md` §6.1): `peerPresent` of 32, 50, 51 or 52+
/// bytes (a name longer than the rest, or invalid, is no name),
/// `peerGone` without a reason byte, and short
/// `recvPacket`/`peerGone`/`ping`/`pong`/`restarting` or a `serverKey` with a
/// bad magic come back as [`ServerFrame::Other`]. This parser never fails; the
/// `Result` leaves room for stricter rules.
pub fn parse_server_frame(ty: u8, payload: &[u8]) -> Result<ServerFrame<'_>, FrameError> {
    let len = payload.len();
    let other = ServerFrame::Other { ty };
    let Some(t) = FrameType::from_u8(ty) else {
        return Ok(other);
    };
    Ok(match t {
        FrameType::ServerKey => {
            if len >= MAGIC.len() + KEY_LEN && payload.starts_with(&MAGIC) {
                ServerFrame::ServerKey(key_at(payload, MAGIC.len()))
            } else {
                other
            }
        }
        FrameType::ServerInfo => ServerFrame::ServerInfo(payload),
        FrameType::RecvPacket if len >= KEY_LEN => ServerFrame::RecvPacket {
            src: key_at(payload, 0),
            packet: &payload[KEY_LEN..],
        },
        FrameType::KeepAlive => ServerFrame::KeepAlive,
        FrameType::PeerGone if len >= KEY_LEN => ServerFrame::PeerGone {
            key: key_at(payload, 0),
            reason: payload
                .get(KEY_LEN)
                .map_or(PeerGoneReason::Disconnected, |&b| {
                    PeerGoneReason::from_u8(b)
                }),
        },
        FrameType::PeerPresent if len >= KEY_LEN => {
            let addr = if len >= KEY_LEN + 18 {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&payload[KEY_LEN..KEY_LEN + 16]);
                let port = u16::from_be_bytes([payload[KEY_LEN + 16], payload[KEY_LEN + 17]]);
                if ip == [0; 16] && port == 0 {
                    None
                } else {
                    let ip = Ipv6Addr::from(ip).to_canonical();
                    Some(SocketAddr::new(ip, port))
                }
            } else {
                None
            };
            let app_name = payload.get(KEY_LEN + 19).and_then(|&n| {
                let name = payload.get(KEY_LEN + 20..KEY_LEN + 20 + usize::from(n))?;
                AppName::new(name)
            });
            ServerFrame::PeerPresent {
                key: key_at(payload, 0),
                addr,
                flags: payload.get(KEY_LEN + 18).copied().unwrap_or(0),
                app_name,
            }
        }
        FrameType::Ping if len >= PING_LEN => ServerFrame::Ping(eight(payload)),
        FrameType::Pong if len >= PING_LEN => ServerFrame::Pong(eight(payload)),
        FrameType::Health => ServerFrame::Health(payload),
        FrameType::Restarting if len >= 8 => ServerFrame::Restarting {
            reconnect_in_ms: u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]),
            try_for_ms: u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]),
        },
        _ => other,
    })
}

/// Canonical form of a socket address as carried in `peerPresent`:
/// IPv4-mapped IPv6 addresses become IPv4.
pub fn canonical_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => SocketAddr::new(v6.to_canonical(), addr.port()),
        IpAddr::V4(_) => addr,
    }
}

#[cfg(test)]
mod tests;
