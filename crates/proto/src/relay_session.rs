//! Relay sessions (`docs/relay-sessions.md`): the DERP frames that allocate
//! them (§2), the 78-byte bind messages between a client and the relay's
//! session port (§4) with their cookie and proof, and [`Binder`], the
//! client's sans-IO state machine that binds one slot of a session.
//!
//! Nothing here does I/O or reads a clock: times are passed in, and the
//! caller sends what [`Binder::poll_transmit`] returns to [`Binder::relay`]
//! and hands every datagram from the relay to [`Binder::handle`].

use crate::frame::{self, FrameError, KEY_LEN};
use crate::key::NodePublic;
use crate::udp_header::{self, Header, Protocol};
use sha2::{Digest, Sha256};
use std::net::{Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

/// Length of a relayAllocate body: peer key ‖ request id.
pub const ALLOCATE_LEN: usize = KEY_LEN + 4;
/// Length of a relayRefused body: request id ‖ peer key ‖ reason.
pub const REFUSED_LEN: usize = 4 + KEY_LEN + 1;
/// Length of one endpoint in a relaySession body: IPv6 address ‖ port.
pub const ENDPOINT_LEN: usize = 18;
/// Length of a relaySession body before its endpoints.
pub const SESSION_FIXED_LEN: usize = 4 + 4 + KEY_LEN + 1 + 32 + 4 + 4;
/// Most endpoints a relaySession carries (a bound on what a client parses).
pub const MAX_ENDPOINTS: usize = 16;
/// Longest relaySession body.
pub const MAX_SESSION_LEN: usize = SESSION_FIXED_LEN + MAX_ENDPOINTS * ENDPOINT_LEN;
/// Length of every bind message, header included.
pub const BIND_LEN: usize = udp_header::LEN + 70;
/// The version of relay sessions this module speaks (the `ferryRelay`
/// capability's value).
pub const VERSION: u32 = 1;

const COOKIE_LABEL: &[u8] = b"ferry-bind-cookie";
const PROOF_LABEL: &[u8] = b"ferry-bind-proof";

// ---------------------------------------------------------------------------
// DERP frames

/// relayAllocate (client → server): a session with `peer`, please.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocate {
    /// The other client.
    pub peer: NodePublic,
    /// The asker's id, echoed in the answer.
    pub request_id: u32,
}

/// relaySession (server → both clients): a session and this client's slot
/// in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOffer {
    /// The asker's request id (0 in the offer to the peer).
    pub request_id: u32,
    /// The session id (24 bits, never 0).
    pub vni: u32,
    /// The other client.
    pub peer: NodePublic,
    /// This client's slot (0 or 1).
    pub slot: u8,
    /// This slot's bind token; proves binds come from this client.
    pub token: [u8; 32],
    /// Where the relay's session socket is reachable (at least one).
    pub endpoints: Vec<SocketAddr>,
    /// How long the session waits for both slots to bind.
    pub bind_lifetime: Duration,
    /// How long a bound session lives without traffic.
    pub idle_lifetime: Duration,
}

/// Why the relay refused an allocation (`docs/relay-sessions.md` §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// 1: the peer is not connected to this relay node.
    PeerNotHere,
    /// 2: the peer did not ask for relay sessions.
    PeerNotCapable,
    /// 3: a per-key or per-source-IP session limit was reached.
    Limit,
    /// 4: sessions are off on this relay.
    Off,
    /// 5: the peer is the asker itself.
    SelfPeer,
    /// 6: the asker's connection asked more often than its relayAllocate
    /// rate allows; ask again later.
    RateLimited,
    /// Any other byte (a later version's reason).
    Other(u8),
}

impl RefuseReason {
    /// The wire byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            RefuseReason::PeerNotHere => 1,
            RefuseReason::PeerNotCapable => 2,
            RefuseReason::Limit => 3,
            RefuseReason::Off => 4,
            RefuseReason::SelfPeer => 5,
            RefuseReason::RateLimited => 6,
            RefuseReason::Other(b) => b,
        }
    }

    /// The reason for a wire byte.
    pub const fn from_u8(b: u8) -> Self {
        match b {
            1 => RefuseReason::PeerNotHere,
            2 => RefuseReason::PeerNotCapable,
            3 => RefuseReason::Limit,
            4 => RefuseReason::Off,
            5 => RefuseReason::SelfPeer,
            6 => RefuseReason::RateLimited,
            b => RefuseReason::Other(b),
        }
    }
}

/// relayRefused (server → asker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The asker's request id.
    pub request_id: u32,
    /// The peer it asked for.
    pub peer: NodePublic,
    /// Why not.
    pub reason: RefuseReason,
}

/// One of the three frames, as a client or server parses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayFrame {
    /// relayAllocate.
    Allocate(Allocate),
    /// relaySession.
    Session(SessionOffer),
    /// relayRefused.
    Refused(Refused),
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn key_at(b: &[u8], at: usize) -> NodePublic {
    let mut k = [0u8; KEY_LEN];
    k.copy_from_slice(&b[at..at + KEY_LEN]);
    NodePublic(k)
}

pub(crate) fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Appends an endpoint (16-byte address, IPv4 as `::ffff:a.b.c.d`, ‖ port).
pub fn put_endpoint(out: &mut Vec<u8>, addr: SocketAddr) {
    out.extend_from_slice(&addr_bytes(addr));
}

/// Reads an endpoint from 18 bytes; IPv4-mapped addresses come back as
/// IPv4.
pub fn endpoint_at(b: &[u8]) -> SocketAddr {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[..16]);
    SocketAddr::new(
        Ipv6Addr::from(ip).to_canonical(),
        u16::from_be_bytes([b[16], b[17]]),
    )
}

pub(crate) fn bad_length(frame: u8, len: usize, expected: usize) -> FrameError {
    FrameError::BadLength {
        frame,
        len,
        expected,
    }
}

/// Appends a relayAllocate frame.
pub fn put_allocate(out: &mut Vec<u8>, a: &Allocate) {
    out.extend_from_slice(&frame::encode_header(
        frame::RELAY_ALLOCATE,
        ALLOCATE_LEN as u32,
    ));
    out.extend_from_slice(a.peer.as_bytes());
    out.extend_from_slice(&a.request_id.to_be_bytes());
}

/// Parses a relayAllocate body (exactly [`ALLOCATE_LEN`] bytes).
pub fn parse_allocate(body: &[u8]) -> Result<Allocate, FrameError> {
    if body.len() != ALLOCATE_LEN {
        return Err(bad_length(frame::RELAY_ALLOCATE, body.len(), ALLOCATE_LEN));
    }
    Ok(Allocate {
        peer: key_at(body, 0),
        request_id: u32_at(body, KEY_LEN),
    })
}

/// Appends a relaySession frame. Panics on an offer a relay must never
/// send (no endpoint, more than [`MAX_ENDPOINTS`], a VNI over 24 bits).
pub fn put_session(out: &mut Vec<u8>, s: &SessionOffer) {
    let len = SESSION_FIXED_LEN + s.endpoints.len() * ENDPOINT_LEN;
    out.reserve(frame::HEADER_LEN + len);
    out.extend_from_slice(&frame::encode_header(frame::RELAY_SESSION, len as u32));
    put_offer(out, s, &[]);
}

/// Appends an offer's body: its fixed fields, `tail` (version 2's host
/// and flags; empty in version 1), its endpoints. Panics on an offer a
/// relay must never send (no endpoint, more than [`MAX_ENDPOINTS`], a VNI
/// over 24 bits).
pub(crate) fn put_offer(out: &mut Vec<u8>, s: &SessionOffer, tail: &[u8]) {
    assert!(
        !s.endpoints.is_empty() && s.endpoints.len() <= MAX_ENDPOINTS,
        "a session offer carries 1..={MAX_ENDPOINTS} endpoints"
    );
    assert!(s.vni <= udp_header::MAX_VNI, "VNI over 24 bits");
    out.extend_from_slice(&s.request_id.to_be_bytes());
    out.extend_from_slice(&s.vni.to_be_bytes());
    out.extend_from_slice(s.peer.as_bytes());
    out.push(s.slot);
    out.extend_from_slice(&s.token);
    out.extend_from_slice(&millis(s.bind_lifetime).to_be_bytes());
    out.extend_from_slice(&millis(s.idle_lifetime).to_be_bytes());
    out.extend_from_slice(tail);
    for &e in &s.endpoints {
        put_endpoint(out, e);
    }
}

/// Parses a relaySession body: the fixed part, then 1 ..= [`MAX_ENDPOINTS`]
/// whole endpoints; a VNI of 0 or over 24 bits and a slot other than 0 or 1
/// are refused.
pub fn parse_session(body: &[u8]) -> Result<SessionOffer, FrameError> {
    parse_offer::<0>(frame::RELAY_SESSION, body).map(|(offer, _)| offer)
}

/// Parses an offer's body of frame type `ty` as [`put_offer`] writes it,
/// with a `TAIL`-byte tail after the fixed fields (returned as is).
pub(crate) fn parse_offer<const TAIL: usize>(
    ty: u8,
    body: &[u8],
) -> Result<(SessionOffer, [u8; TAIL]), FrameError> {
    let len = body.len();
    let fixed = SESSION_FIXED_LEN + TAIL;
    let min = fixed + ENDPOINT_LEN;
    if len < min {
        return Err(FrameError::TooShort {
            frame: ty,
            len,
            min,
        });
    }
    let max = fixed + MAX_ENDPOINTS * ENDPOINT_LEN;
    if len > max {
        return Err(FrameError::TooLong {
            frame: ty,
            len,
            max,
        });
    }
    let extra = (len - fixed) % ENDPOINT_LEN;
    if extra != 0 {
        return Err(bad_length(ty, len, len - extra));
    }
    let vni = u32_at(body, 4);
    let slot = body[8 + KEY_LEN];
    if vni == 0 || vni > udp_header::MAX_VNI || slot > 1 {
        // Not a length problem, but the same verdict: a frame this client
        // cannot use.
        return Err(bad_length(ty, len, 0));
    }
    let mut token = [0u8; 32];
    let t = 9 + KEY_LEN;
    token.copy_from_slice(&body[t..t + 32]);
    let mut tail = [0u8; TAIL];
    tail.copy_from_slice(&body[SESSION_FIXED_LEN..fixed]);
    let offer = SessionOffer {
        request_id: u32_at(body, 0),
        vni,
        peer: key_at(body, 8),
        slot,
        token,
        bind_lifetime: Duration::from_millis(u32_at(body, t + 32).into()),
        idle_lifetime: Duration::from_millis(u32_at(body, t + 36).into()),
        endpoints: body[fixed..]
            .chunks_exact(ENDPOINT_LEN)
            .map(endpoint_at)
            .collect(),
    };
    Ok((offer, tail))
}

/// Appends a relayRefused frame.
pub fn put_refused(out: &mut Vec<u8>, r: &Refused) {
    out.extend_from_slice(&frame::encode_header(
        frame::RELAY_REFUSED,
        REFUSED_LEN as u32,
    ));
    put_refused_body(out, r);
}

/// Appends a relayRefused body (the frame's, and a mesh refusal's).
pub(crate) fn put_refused_body(out: &mut Vec<u8>, r: &Refused) {
    out.extend_from_slice(&r.request_id.to_be_bytes());
    out.extend_from_slice(r.peer.as_bytes());
    out.push(r.reason.to_u8());
}

/// Parses a relayRefused body (exactly [`REFUSED_LEN`] bytes).
pub fn parse_refused(body: &[u8]) -> Result<Refused, FrameError> {
    if body.len() != REFUSED_LEN {
        return Err(bad_length(frame::RELAY_REFUSED, body.len(), REFUSED_LEN));
    }
    Ok(Refused {
        request_id: u32_at(body, 0),
        peer: key_at(body, 4),
        reason: RefuseReason::from_u8(body[4 + KEY_LEN]),
    })
}

/// Parses any of the three frames; `None` for another frame type.
pub fn parse_frame(ty: u8, body: &[u8]) -> Option<Result<RelayFrame, FrameError>> {
    Some(match ty {
        frame::RELAY_ALLOCATE => parse_allocate(body).map(RelayFrame::Allocate),
        frame::RELAY_SESSION => parse_session(body).map(RelayFrame::Session),
        frame::RELAY_REFUSED => parse_refused(body).map(RelayFrame::Refused),
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Bind messages

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts` under `key` (at most
/// one SHA-256 block long, as every key here is 32 bytes).
fn hmac_sha256(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// An endpoint's 18 bytes (as [`put_endpoint`] writes them), without
/// allocating: a cookie is computed for every bind message.
fn addr_bytes(addr: SocketAddr) -> [u8; ENDPOINT_LEN] {
    let ip = match addr {
        SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
        SocketAddr::V6(a) => *a.ip(),
    };
    let mut b = [0u8; ENDPOINT_LEN];
    b[..16].copy_from_slice(&ip.octets());
    b[16..].copy_from_slice(&addr.port().to_be_bytes());
    b
}

/// The relay's cookie for a bind of `slot` of session `vni` at
/// `generation` from `source`, under `secret` (`docs/relay-sessions.md` §4).
pub fn cookie(
    secret: &[u8; 32],
    vni: u32,
    slot: u8,
    generation: u32,
    source: SocketAddr,
) -> [u8; 32] {
    hmac_sha256(
        secret,
        &[
            COOKIE_LABEL,
            &vni.to_be_bytes(),
            &[slot],
            &generation.to_be_bytes(),
            &addr_bytes(source),
        ],
    )
}

/// The client's proof over a cookie, keyed by its slot's bind token
/// (`docs/relay-sessions.md` §4).
pub fn proof(token: &[u8; 32], vni: u32, slot: u8, generation: u32, cookie: &[u8; 32]) -> [u8; 32] {
    hmac_sha256(
        token,
        &[
            PROOF_LABEL,
            &vni.to_be_bytes(),
            &[slot],
            &generation.to_be_bytes(),
            cookie,
        ],
    )
}

/// Compares two MACs in time independent of where they differ.
pub fn mac_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The four bind messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindKind {
    /// 1, client → relay.
    Bind,
    /// 2, relay → client.
    Challenge,
    /// 3, client → relay.
    Answer,
    /// 4, relay → client.
    Bound,
}

impl BindKind {
    /// The wire byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            BindKind::Bind => 1,
            BindKind::Challenge => 2,
            BindKind::Answer => 3,
            BindKind::Bound => 4,
        }
    }

    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => BindKind::Bind,
            2 => BindKind::Challenge,
            3 => BindKind::Answer,
            4 => BindKind::Bound,
            _ => return None,
        })
    }
}

/// A bind message (`docs/relay-sessions.md` §4): always [`BIND_LEN`] bytes on
/// the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindMsg {
    /// Which message.
    pub kind: BindKind,
    /// The session id of the header.
    pub vni: u32,
    /// The slot being bound.
    pub slot: u8,
    /// The bind's generation (non-zero).
    pub generation: u32,
    /// The relay's cookie (zero in a bind).
    pub cookie: [u8; 32],
    /// The client's proof (zero except in an answer).
    pub proof: [u8; 32],
}

/// Why a datagram is not a bind message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// The header did not parse.
    #[error("bad header: {0}")]
    Header(#[from] udp_header::HeaderError),
    /// Control bit clear or protocol not control: a data datagram.
    #[error("not a control datagram")]
    NotControl,
    /// Not exactly [`BIND_LEN`] bytes.
    #[error("bind message of {0} bytes, must be 78")]
    Length(usize),
    /// Type byte not 1–4.
    #[error("unknown bind message type {0}")]
    Kind(u8),
    /// VNI 0, slot over 1, generation 0, or a field that must be zero is not.
    #[error("bind message field out of range")]
    Field,
}

impl BindMsg {
    /// A message with the cookie and proof zero.
    pub fn new(kind: BindKind, vni: u32, slot: u8, generation: u32) -> Self {
        BindMsg {
            kind,
            vni,
            slot,
            generation,
            cookie: [0; 32],
            proof: [0; 32],
        }
    }

    /// The 78 bytes.
    pub fn to_bytes(&self) -> [u8; BIND_LEN] {
        let mut b = [0u8; BIND_LEN];
        b[..udp_header::LEN].copy_from_slice(&Header::bind(self.vni).to_bytes());
        let body = &mut b[udp_header::LEN..];
        body[0] = self.kind.to_u8();
        body[1] = self.slot;
        body[2..6].copy_from_slice(&self.generation.to_be_bytes());
        body[6..38].copy_from_slice(&self.cookie);
        body[38..70].copy_from_slice(&self.proof);
        b
    }

    /// Reads a bind message. Checks the shape only (length, type, ranges,
    /// the fields each type leaves zero); MACs are the relay's and the
    /// binder's business.
    pub fn parse(datagram: &[u8]) -> Result<BindMsg, BindError> {
        let h = Header::parse(datagram)?;
        if !h.control || h.protocol != Protocol::Control {
            return Err(BindError::NotControl);
        }
        if datagram.len() != BIND_LEN {
            return Err(BindError::Length(datagram.len()));
        }
        let body = &datagram[udp_header::LEN..];
        let kind = BindKind::from_u8(body[0]).ok_or(BindError::Kind(body[0]))?;
        let mut m = BindMsg::new(kind, h.vni, body[1], u32_at(body, 2));
        m.cookie.copy_from_slice(&body[6..38]);
        m.proof.copy_from_slice(&body[38..70]);
        let zero_cookie = matches!(kind, BindKind::Bind | BindKind::Bound);
        let zero_proof = kind != BindKind::Answer;
        if h.vni == 0
            || m.slot > 1
            || m.generation == 0
            || (zero_cookie && m.cookie != [0; 32])
            || (zero_proof && m.proof != [0; 32])
        {
            return Err(BindError::Field);
        }
        Ok(m)
    }
}

// ---------------------------------------------------------------------------
// Binder

/// First retransmission interval of a bind or an answer.
pub const RETRANSMIT_FIRST: Duration = Duration::from_millis(250);
/// Longest retransmission interval.
pub const RETRANSMIT_MAX: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BindState {
    /// Sending binds, waiting for a challenge.
    Binding,
    /// Sending answers with this cookie, waiting for bound.
    Answering([u8; 32]),
    /// The relay said bound.
    Bound,
    /// Gave up: the bind lifetime passed without a bound.
    Failed,
}

/// A relayAllocate as the DERP server hands it to the session side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocateRequest {
    /// The client that asked.
    pub asker: NodePublic,
    /// The client it asked a session with.
    pub peer: NodePublic,
    /// The asker's DERP connection's source address (for the per-IP
    /// limit).
    pub ip: std::net::IpAddr,
    /// The asker's request id, echoed in its answer.
    pub request_id: u32,
    /// The asker's DERP connection and the peer's, as numbers no other
    /// connection to this relay has had (a reconnection gets a new one).
    pub conns: [u64; 2],
}

/// A key of a session that is behind one of the DERP server's mesh links
/// (connected to another node of the region, `docs/relay-sessions.md`
/// §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Via {
    /// The mesh link (this relay's numbering).
    pub link: u16,
    /// The key behind it.
    pub key: NodePublic,
}

/// A session with a key behind a mesh link, freed for what happened on
/// that link: its local key is to hear of it (relaySessionEnd).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The session.
    pub vni: u32,
    /// Its key connected here.
    pub local: NodePublic,
    /// Its key behind the link.
    pub remote: NodePublic,
}

/// A session this relay hosts, as a graceful stop tells its keys
/// ([`SessionService::hosted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hosted {
    /// The session.
    pub vni: u32,
    /// Its two keys.
    pub keys: [NodePublic; 2],
    /// For a pair split across the region's nodes: the mesh link one key
    /// is behind, and that key's index in `keys`.
    pub via: Option<(u16, usize)>,
}

/// Who hears of a session after a relayAllocate (`docs/relay-sessions.md` §2):
/// the asker at most once per answer interval, the peer once per connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offers {
    /// The asker's answer (with its request id), unless this connection
    /// had one for the session within the interval.
    pub asker: Option<SessionOffer>,
    /// The peer's offer (request id 0), unless the peer's connection has
    /// heard of the session already.
    pub peer: Option<SessionOffer>,
}

/// The session side of a relay, as the DERP server asks it: implemented by
/// `ferry-udp`'s session table, used by `ferry-derp`'s shards, so neither
/// crate needs the other.
pub trait SessionService: Send + Sync {
    /// The UDP port of the session socket (serverInfo's `ferryRelay`).
    fn port(&self) -> u16;

    /// Finds or makes the session of the request's asker and peer at
    /// `now` and returns the offers to send, or why not.
    fn allocate(&self, request: &AllocateRequest, now: Instant) -> Result<Offers, RefuseReason>;

    /// [`allocate`](Self::allocate) for a pair split across the nodes of
    /// a region, one of whose keys is behind this relay's mesh link
    /// (`docs/relay-sessions.md` §9): a service that keeps a cap per link
    /// counts the session against that link's, and remembers where the
    /// key is for [`link_down`](Self::link_down) and
    /// [`end_remote`](Self::end_remote) (the default does neither).
    fn allocate_via(
        &self,
        request: &AllocateRequest,
        via: Via,
        now: Instant,
    ) -> Result<Offers, RefuseReason> {
        let _ = via;
        self.allocate(request, now)
    }

    /// Mesh link `link` went down: frees the sessions with a key behind
    /// it whose slot that key has not bound (bound ones live on their
    /// UDP traffic) and returns them.
    fn link_down(&self, link: u16) -> Vec<Ended> {
        let _ = link;
        Vec::new()
    }

    /// The node behind `via.link` says session `vni` ended for its key
    /// `via.key`: declined (it could not tell the key; `bound_too`
    /// false: freed only while that slot is unbound) or ended
    /// (`bound_too`). The session, if it was one with that key behind
    /// that link and was freed.
    fn end_remote(&self, vni: u32, via: Via, bound_too: bool) -> Option<Ended> {
        let _ = (vni, via, bound_too);
        None
    }

    /// Every session hosted now (a draining relay tells both keys of each
    /// that it ends; the sessions keep forwarding meanwhile).
    fn hosted(&self) -> Vec<Hosted> {
        Vec::new()
    }

    /// Whether every endpoint an offer names is a specific address, so
    /// that a client on another node of the region can reach it
    /// (`docs/relay-sessions.md` §9): an unspecified one means "the
    /// address you reached DERP at", right only for a client of this node.
    /// A service whose offers are not usable across nodes (the default)
    /// never hosts a session for a pair split across nodes.
    fn hosts_cross_node(&self) -> bool {
        false
    }
}

/// Binds one slot of a relay session from a client's UDP socket
/// (`docs/relay-sessions.md` §4), without I/O.
///
/// Drive it with [`poll_transmit`](Self::poll_transmit) (send what it
/// returns to [`relay`](Self::relay)), [`handle`](Self::handle) (every
/// datagram from the relay) and [`poll_timeout`](Self::poll_timeout) (when
/// to call `poll_transmit` again). It sends a bind, answers the relay's
/// challenge, and retransmits on its own schedule (250 ms doubling to 2 s)
/// until the relay says bound or the session's bind lifetime passes. After
/// a NAT rebinding or a move, [`rebind`](Self::rebind) with a higher
/// generation starts over from the new address.
#[derive(Clone, Debug)]
pub struct Binder {
    vni: u32,
    slot: u8,
    token: [u8; 32],
    relay: SocketAddr,
    generation: u32,
    lifetime: Duration,
    state: BindState,
    started: Instant,
    next_tx: Instant,
    interval: Duration,
}

impl Binder {
    /// A binder for `offer`'s slot through `relay` (one of the offer's
    /// endpoints, or the relay's address with the offered port) at
    /// `generation` (non-zero; 0 is taken as 1). The first bind is due at
    /// `now`.
    pub fn new(offer: &SessionOffer, relay: SocketAddr, generation: u32, now: Instant) -> Binder {
        Binder {
            vni: offer.vni,
            slot: offer.slot,
            token: offer.token,
            relay,
            generation: generation.max(1),
            lifetime: offer.bind_lifetime,
            state: BindState::Binding,
            started: now,
            next_tx: now,
            interval: RETRANSMIT_FIRST,
        }
    }

    /// The session id.
    pub fn vni(&self) -> u32 {
        self.vni
    }

    /// This client's slot.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// The relay's session address the binder sends to.
    pub fn relay(&self) -> SocketAddr {
        self.relay
    }

    /// The current generation.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether the relay confirmed the binding of this generation.
    pub fn is_bound(&self) -> bool {
        self.state == BindState::Bound
    }

    /// Whether the binder gave up (no bound within the bind lifetime of its
    /// start or last rebind).
    pub fn is_failed(&self) -> bool {
        self.state == BindState::Failed
    }

    fn expire(&mut self, now: Instant) {
        if matches!(self.state, BindState::Binding | BindState::Answering(_))
            && now.duration_since(self.started) >= self.lifetime
        {
            self.state = BindState::Failed;
        }
    }

    /// Notes that `now` came: past the bind lifetime of its start or last
    /// rebind, a binder still waiting for bound fails. Sends nothing and
    /// leaves the retransmission schedule alone (a due bind message stays
    /// due for [`poll_transmit`](Self::poll_transmit)).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire(now);
    }

    /// The next bind message to send to [`relay`](Self::relay), if one is
    /// due at `now`.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<[u8; BIND_LEN]> {
        self.expire(now);
        if now < self.next_tx {
            return None;
        }
        let msg = match self.state {
            BindState::Binding => {
                BindMsg::new(BindKind::Bind, self.vni, self.slot, self.generation)
            }
            BindState::Answering(cookie) => BindMsg {
                cookie,
                proof: proof(&self.token, self.vni, self.slot, self.generation, &cookie),
                ..BindMsg::new(BindKind::Answer, self.vni, self.slot, self.generation)
            },
            BindState::Bound | BindState::Failed => return None,
        };
        self.next_tx = now + self.interval;
        self.interval = (self.interval * 2).min(RETRANSMIT_MAX);
        Some(msg.to_bytes())
    }

    /// Takes a datagram from the relay. Returns `true` if it was a
    /// challenge or bound of this session and slot (whatever its
    /// generation), which the caller need not look at further.
    pub fn handle(&mut self, now: Instant, datagram: &[u8]) -> bool {
        let Ok(m) = BindMsg::parse(datagram) else {
            return false;
        };
        if m.vni != self.vni
            || m.slot != self.slot
            || !matches!(m.kind, BindKind::Challenge | BindKind::Bound)
        {
            return false;
        }
        if m.generation != self.generation {
            return true;
        }
        match (m.kind, self.state) {
            (BindKind::Challenge, BindState::Binding) => {
                self.state = BindState::Answering(m.cookie);
                self.next_tx = now;
                self.interval = RETRANSMIT_FIRST;
            }
            (BindKind::Challenge, BindState::Answering(_)) => {
                // A later challenge (the secret rotated): answer that one.
                self.state = BindState::Answering(m.cookie);
            }
            (BindKind::Bound, BindState::Answering(_)) => self.state = BindState::Bound,
            _ => {}
        }
        true
    }

    /// When [`poll_transmit`](Self::poll_transmit) has something to send
    /// next; `None` once bound or failed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            BindState::Binding | BindState::Answering(_) => {
                Some(self.next_tx.min(self.started + self.lifetime))
            }
            BindState::Bound | BindState::Failed => None,
        }
    }

    /// Starts binding again at `generation` (which must be higher than the
    /// current one; a lower or equal one is raised to current + 1), to
    /// `relay` (the same or another endpoint of the session).
    pub fn rebind(&mut self, now: Instant, relay: SocketAddr, generation: u32) {
        self.generation = generation.max(self.generation.wrapping_add(1)).max(1);
        self.relay = relay;
        self.state = BindState::Binding;
        self.started = now;
        self.next_tx = now;
        self.interval = RETRANSMIT_FIRST;
    }
}

pub mod v2;

#[cfg(test)]
mod tests;
