//! The steps a Tailscale peer relay takes on a bind datagram, without a
//! table and without I/O.
//!
//! A client binds its slot of an endpoint from its UDP socket in three
//! sealed disco messages, each behind the 8-byte header of [`udp_header`]
//! with the control bit set and the endpoint's VNI: **bind** (04) → the
//! relay answers a **challenge** (05) → the client echoes it in an
//! **answer** (06) and its source address is bound. The relay's steps:
//!
//! 1. [`parse_control`]: the header, the length (exactly [`CONTROL_LEN`]
//!    for a bind, up to [`MAX_CONTROL_LEN`] tolerated), the disco magic:
//!    the VNI and the claimed sender, no crypto yet. The caller finds the
//!    endpoint by VNI and the sender's slot in its pair.
//! 2. [`open_bind`] with that slot's precomputed box key: opened in place,
//!    a bind or an answer whose sealed VNI equals the header's, whose
//!    remote key is the other client's and whose generation is not 0.
//! 3. A bind: [`challenge`] is the relay's stateless cookie (a MAC over the
//!    VNI, slot, generation and source address under a rotating secret,
//!    the same as relay sessions' binds), and [`write_challenge`] writes it
//!    sealed over the datagram: 160 bytes in, 160 out, so nothing is
//!    amplified. An answer: [`answer_is_valid`] under the current or the
//!    previous secret; the caller then binds the slot unless a newer
//!    generation is bound ([`generation_is_current`]).

use std::net::SocketAddr;

use crate::disco::{self, BindBody, DiscoError, Message, BIND_PLAIN_LEN, HEADER_LEN};
use crate::key::DiscoPublic;
use crate::nacl::{self, SharedKey, NONCE_LEN};
use crate::relay_session;
use crate::udp_header::{self, Header, Protocol};

/// Length of a bind, challenge or answer datagram (header included).
pub const CONTROL_LEN: usize = udp_header::LEN + disco::BIND_PACKET_LEN;
/// The longest control datagram read (longer ones are dropped before any
/// crypto).
pub const MAX_CONTROL_LEN: usize = 256;

/// Why a control datagram is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// No valid header, or not a control header of the disco protocol.
    #[error("not a peer-relay control header")]
    BadHeader,
    /// VNI 0 (never allocated).
    #[error("VNI 0")]
    ZeroVni,
    /// Shorter than a bind or longer than [`MAX_CONTROL_LEN`].
    #[error("control datagram of {0} bytes")]
    BadLength(usize),
    /// No disco magic after the header.
    #[error("not a disco packet")]
    NotDisco,
    /// The box did not open with the slot's key.
    #[error("disco box failed authentication")]
    BadBox,
    /// Opened, but not a bind or an answer (or malformed).
    #[error("not a bind or an answer")]
    WrongType,
    /// The sealed VNI is not the header's.
    #[error("sealed VNI differs from the header's")]
    VniMismatch,
    /// The remote key is not the endpoint's other client.
    #[error("remote key is not the other client")]
    WrongRemoteKey,
    /// Generation 0.
    #[error("generation 0")]
    ZeroGeneration,
}

/// What step 1 learns of a control datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// The header's VNI (not 0).
    pub vni: u32,
    /// Who claims to send it.
    pub sender: DiscoPublic,
}

/// A bind or an answer that opened and checked (step 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindStep {
    /// A bind: to be challenged.
    Bind(BindBody),
    /// An answer: its challenge to be checked.
    Answer(BindBody),
}

impl BindStep {
    /// The body.
    pub fn body(&self) -> &BindBody {
        match self {
            BindStep::Bind(b) | BindStep::Answer(b) => b,
        }
    }
}

/// Step 1: the VNI and claimed sender of a control datagram, without
/// crypto.
pub fn parse_control(datagram: &[u8]) -> Result<Control, BindError> {
    let h = Header::parse(datagram).map_err(|_| BindError::BadHeader)?;
    if !h.control || h.protocol != Protocol::Control {
        return Err(BindError::BadHeader);
    }
    if h.vni == 0 {
        return Err(BindError::ZeroVni);
    }
    if !(CONTROL_LEN..=MAX_CONTROL_LEN).contains(&datagram.len()) {
        return Err(BindError::BadLength(datagram.len()));
    }
    let sender = disco::sender(&datagram[udp_header::LEN..]).ok_or(BindError::NotDisco)?;
    Ok(Control { vni: h.vni, sender })
}

/// Step 2: opens the datagram (already through [`parse_control`]) in place
/// with `key` (the relay's disco key with the sender's) and checks it
/// against the endpoint: `vni` and `remote` (the other client's key).
/// On a failed open the bytes are left as they were.
pub fn open_bind(
    key: &SharedKey,
    datagram: &mut [u8],
    vni: u32,
    remote: &DiscoPublic,
) -> Result<BindStep, BindError> {
    let packet = datagram
        .get_mut(udp_header::LEN..)
        .ok_or(BindError::BadHeader)?;
    let plain = disco::open_in_place(key, packet).map_err(|e| match e {
        DiscoError::BadBox => BindError::BadBox,
        _ => BindError::NotDisco,
    })?;
    // Only binds and answers are read further (no other type allocates or
    // costs anything more).
    if !matches!(plain.first(), Some(0x04 | 0x06)) {
        return Err(BindError::WrongType);
    }
    let step = match Message::parse(plain) {
        Ok(Message::Bind(b)) => BindStep::Bind(b),
        Ok(Message::BindAnswer(b)) => BindStep::Answer(b),
        _ => return Err(BindError::WrongType),
    };
    let b = step.body();
    if b.vni != vni {
        return Err(BindError::VniMismatch);
    }
    if b.remote_key != *remote {
        return Err(BindError::WrongRemoteKey);
    }
    if b.generation == 0 {
        return Err(BindError::ZeroGeneration);
    }
    Ok(step)
}

/// The relay's challenge for a bind of `slot` of endpoint `vni` at
/// `generation` from `source`, under `secret`: relay sessions' cookie
/// ([`relay_session::cookie`]); clients echo it without reading it.
pub fn challenge(
    secret: &[u8; 32],
    vni: u32,
    slot: u8,
    generation: u32,
    source: SocketAddr,
) -> [u8; 32] {
    relay_session::cookie(
        secret,
        vni,
        slot,
        generation,
        crate::frame::canonical_addr(source),
    )
}

/// Whether an answer's challenge is the one [`challenge`] gives for it
/// under `current` or `previous` (the secret before the last rotation).
pub fn answer_is_valid(
    current: &[u8; 32],
    previous: Option<&[u8; 32]>,
    slot: u8,
    body: &BindBody,
    source: SocketAddr,
) -> bool {
    let ok = |secret: &[u8; 32]| {
        relay_session::mac_eq(
            &body.challenge,
            &challenge(secret, body.vni, slot, body.generation, source),
        )
    };
    ok(current) || previous.is_some_and(ok)
}

/// Whether an answer at `generation` may bind a slot bound at `bound`:
/// the same or a newer one (in serial-number order, so a client's counter
/// may wrap). A late answer of an older handshake never moves a binding
/// back.
pub fn generation_is_current(generation: u32, bound: u32) -> bool {
    (generation.wrapping_sub(bound) as i32) >= 0
}

/// Step 3 for a bind: writes the challenge over `datagram` (which held the
/// bind, at least [`CONTROL_LEN`] bytes) and returns its length,
/// [`CONTROL_LEN`]: the header with `vni`, the packet from `server` (the
/// relay's disco key) sealed with `key` and `nonce`, carrying `body` with
/// `challenge` (the remote key and generation as the bind had them).
/// Panics if `datagram` is shorter than [`CONTROL_LEN`] (a caller's bug:
/// [`parse_control`] refuses those).
pub fn write_challenge(
    datagram: &mut [u8],
    key: &SharedKey,
    server: &DiscoPublic,
    nonce: &[u8; NONCE_LEN],
    body: &BindBody,
    challenge: [u8; 32],
) -> usize {
    let out = &mut datagram[..CONTROL_LEN];
    let (head, boxed) = out.split_at_mut(udp_header::LEN + HEADER_LEN);
    head[..udp_header::LEN].copy_from_slice(&Header::bind(body.vni).to_bytes());
    head[udp_header::LEN..udp_header::LEN + disco::MAGIC.len()].copy_from_slice(&disco::MAGIC);
    head[udp_header::LEN + disco::MAGIC.len()..].copy_from_slice(server.as_bytes());
    let plain = &mut boxed[nacl::OVERHEAD..];
    debug_assert_eq!(plain.len(), BIND_PLAIN_LEN);
    plain[..2].copy_from_slice(&[0x05, 0]);
    let body = BindBody { challenge, ..*body };
    body.write((&mut plain[2..]).try_into().expect("72 bytes"));
    key.seal_in_place(nonce, boxed);
    CONTROL_LEN
}

/// Appends a whole control datagram: the header with `vni` and `msg` from
/// `sender` sealed with `key` and `nonce` (what a client sends; tests and
/// the client side use it).
pub fn put_control(
    out: &mut Vec<u8>,
    vni: u32,
    key: &SharedKey,
    sender: &DiscoPublic,
    nonce: &[u8; NONCE_LEN],
    msg: &Message,
) {
    out.extend_from_slice(&Header::bind(vni).to_bytes());
    disco::seal(out, key, sender, nonce, msg);
}

#[cfg(test)]
mod tests;
