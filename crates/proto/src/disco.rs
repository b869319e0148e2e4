//! Tailscale's disco messages: the sealed packets nodes exchange to find
//! paths to each other, and through which they allocate and bind peer-relay
//! endpoints.
//!
//! A packet is `magic (6) ‖ sender's disco key (32) ‖ NaCl box`, the box
//! being `nonce (24) ‖ tag (16) ‖ ciphertext` exactly as [`nacl`] writes it,
//! keyed by the sender's and the recipient's disco keys
//! ([`DiscoPrivate::shared`](crate::key::DiscoPrivate::shared)). Inside is
//! `type (1) ‖ version (1) ‖ body`, integers big-endian, an endpoint 16
//! bytes of IPv6 address (IPv4 mapped) ‖ port. [`Message`] is every type
//! a node sends; receivers ignore bytes after a body of fixed size, as
//! Tailscale's do.
//!
//! Reading goes [`sender`] (who claims to send it, without crypto) →
//! [`open`] or [`open_in_place`] with that sender's box key →
//! [`Message::parse`]; writing is [`seal`]. Nothing here does I/O.

use std::net::SocketAddr;
use std::time::Duration;

use crate::key::{DiscoPublic, NodePublic, KEY_LEN};
use crate::nacl::{self, BoxError, SharedKey, NONCE_LEN};
use crate::relay_session::{endpoint_at, put_endpoint, ENDPOINT_LEN};

/// The six bytes every disco packet starts with ("TS💬").
pub const MAGIC: [u8; 6] = [0x54, 0x53, 0xf0, 0x9f, 0x92, 0xac];
/// Magic and sender key: what precedes the box.
pub const HEADER_LEN: usize = MAGIC.len() + KEY_LEN;
/// Bytes a packet adds to its plaintext (header, nonce, tag).
pub const OVERHEAD: usize = HEADER_LEN + nacl::OVERHEAD;
/// Length of a transaction id (ping and pong).
pub const TX_ID_LEN: usize = 12;
/// Length of a bind message's body (VNI, generation, remote key,
/// challenge).
pub const BIND_BODY_LEN: usize = 4 + 4 + KEY_LEN + CHALLENGE_LEN;
/// Length of a bind message's plaintext.
pub const BIND_PLAIN_LEN: usize = 2 + BIND_BODY_LEN;
/// Length of a sealed bind message (without the 8-byte UDP header).
pub const BIND_PACKET_LEN: usize = OVERHEAD + BIND_PLAIN_LEN;
/// Length of a bind challenge.
pub const CHALLENGE_LEN: usize = 32;
/// Length of an allocation request's body.
pub const ALLOCATE_REQUEST_BODY_LEN: usize = 2 * KEY_LEN + 4;
/// Length of a relay endpoint's description before its addresses.
pub const RELAY_ENDPOINT_FIXED_LEN: usize = 3 * KEY_LEN + 8 + 4 + 8 + 8;

const TYPE_PING: u8 = 0x01;
const TYPE_PONG: u8 = 0x02;
const TYPE_CALL_ME_MAYBE: u8 = 0x03;
const TYPE_BIND: u8 = 0x04;
const TYPE_BIND_CHALLENGE: u8 = 0x05;
const TYPE_BIND_ANSWER: u8 = 0x06;
const TYPE_CALL_ME_MAYBE_VIA: u8 = 0x07;
const TYPE_ALLOCATE_REQUEST: u8 = 0x08;
const TYPE_ALLOCATE_RESPONSE: u8 = 0x09;

/// Why bytes are not a disco message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoError {
    /// Too short for header and box, or not the disco magic.
    #[error("not a disco packet")]
    NotDisco,
    /// The box did not open with the sender's key.
    #[error("disco box failed authentication")]
    BadBox,
    /// The plaintext is shorter than its type needs.
    #[error("disco message type {ty:#04x} too short: {len} bytes")]
    Short {
        /// The message type.
        ty: u8,
        /// The plaintext's length.
        len: usize,
    },
    /// A type this module does not know.
    #[error("unknown disco message type {0:#04x}")]
    UnknownType(u8),
    /// A version other than 0 of a type whose version is checked.
    #[error("disco message type {ty:#04x} has version {version}")]
    Version {
        /// The message type.
        ty: u8,
        /// Its version byte.
        version: u8,
    },
    /// An endpoint list whose length is not a whole number of endpoints
    /// (or empty where one is required).
    #[error("disco message type {ty:#04x}: bad endpoint list length")]
    Endpoints {
        /// The message type.
        ty: u8,
    },
    /// A lifetime below zero.
    #[error("negative lifetime in a relay endpoint")]
    NegativeLifetime,
}

impl From<BoxError> for DiscoError {
    fn from(e: BoxError) -> Self {
        match e {
            BoxError::TooShort { .. } => DiscoError::NotDisco,
            BoxError::AuthFailed => DiscoError::BadBox,
        }
    }
}

/// Path probe (01).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ping {
    /// The sender's transaction id.
    pub tx_id: [u8; TX_ID_LEN],
    /// The sender's node key, if it sent one.
    pub node_key: Option<NodePublic>,
    /// Zero bytes after (a path-MTU probe).
    pub padding: usize,
}

/// Answer to a ping (02).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pong {
    /// The ping's transaction id.
    pub tx_id: [u8; TX_ID_LEN],
    /// Where the ping came from, as its receiver saw it.
    pub src: SocketAddr,
}

/// The body shared by the three bind messages (04, 05, 06).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindBody {
    /// The endpoint's VNI (equal to the UDP header's).
    pub vni: u32,
    /// The client's handshake generation (never 0).
    pub generation: u32,
    /// The disco key of the other client of the endpoint.
    pub remote_key: DiscoPublic,
    /// The relay's challenge (zero in a bind; echoed in an answer).
    pub challenge: [u8; CHALLENGE_LEN],
}

/// A peer-relay endpoint as the relay describes it (in an allocation
/// response, and between clients in call-me-maybe-via).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayEndpoint {
    /// The relay's disco key for binds.
    pub server_disco: DiscoPublic,
    /// The two clients, sorted bytewise; a client's slot is its index.
    pub client_disco: [DiscoPublic; 2],
    /// Orders two descriptions of one pair's endpoint by the same relay.
    pub lamport_id: u64,
    /// The VNI (1 ..= 2²⁴ − 1).
    pub vni: u32,
    /// How long the endpoint waits for both clients to bind.
    pub bind_lifetime: Duration,
    /// How long a bound endpoint lives while either side is silent.
    pub steady_state_lifetime: Duration,
    /// Where the relay is reachable (at least one).
    pub endpoints: Vec<SocketAddr>,
}

/// Request for an endpoint (08), sent to the relay over DERP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocateRequest {
    /// The two clients' disco keys (in any order).
    pub client_disco: [DiscoPublic; 2],
    /// The request's generation, echoed in the response.
    pub generation: u32,
}

/// The relay's answer (09).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateResponse {
    /// The request's generation.
    pub generation: u32,
    /// The endpoint.
    pub endpoint: RelayEndpoint,
}

/// A disco message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// 01.
    Ping(Ping),
    /// 02.
    Pong(Pong),
    /// 03: the sender's endpoints (possibly none).
    CallMeMaybe(Vec<SocketAddr>),
    /// 04: client → relay.
    Bind(BindBody),
    /// 05: relay → client.
    BindChallenge(BindBody),
    /// 06: client → relay.
    BindAnswer(BindBody),
    /// 07: client → client, over DERP.
    CallMeMaybeVia(RelayEndpoint),
    /// 08: client → relay, over DERP.
    AllocateRequest(AllocateRequest),
    /// 09: relay → client, over DERP.
    AllocateResponse(AllocateResponse),
}

fn key_at(b: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 32];
    k.copy_from_slice(&b[..KEY_LEN]);
    k
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn u64_at(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).map_or(i64::MAX as u64, |n| n.min(i64::MAX as u64))
}

/// Reads endpoints filling all of `b` (a whole number of them).
fn endpoints(ty: u8, b: &[u8], at_least_one: bool) -> Result<Vec<SocketAddr>, DiscoError> {
    if !b.len().is_multiple_of(ENDPOINT_LEN) || (at_least_one && b.is_empty()) {
        return Err(DiscoError::Endpoints { ty });
    }
    Ok(b.chunks_exact(ENDPOINT_LEN).map(endpoint_at).collect())
}

impl BindBody {
    fn parse(ty: u8, plain: &[u8]) -> Result<BindBody, DiscoError> {
        let b = plain.get(2..2 + BIND_BODY_LEN).ok_or(DiscoError::Short {
            ty,
            len: plain.len(),
        })?;
        let mut challenge = [0u8; CHALLENGE_LEN];
        challenge.copy_from_slice(&b[40..72]);
        Ok(BindBody {
            vni: u32_at(b),
            generation: u32_at(&b[4..]),
            remote_key: DiscoPublic(key_at(&b[8..])),
            challenge,
        })
    }

    /// Writes the 72-byte body into `out` (exactly that long).
    pub fn write(&self, out: &mut [u8; BIND_BODY_LEN]) {
        out[..4].copy_from_slice(&self.vni.to_be_bytes());
        out[4..8].copy_from_slice(&self.generation.to_be_bytes());
        out[8..40].copy_from_slice(self.remote_key.as_bytes());
        out[40..].copy_from_slice(&self.challenge);
    }
}

impl RelayEndpoint {
    fn parse(ty: u8, b: &[u8]) -> Result<RelayEndpoint, DiscoError> {
        if b.len() < RELAY_ENDPOINT_FIXED_LEN {
            return Err(DiscoError::Short { ty, len: b.len() });
        }
        let (fixed, rest) = b.split_at(RELAY_ENDPOINT_FIXED_LEN);
        let lifetime = |at: usize| {
            let n = u64_at(&fixed[at..]);
            if n > i64::MAX as u64 {
                Err(DiscoError::NegativeLifetime)
            } else {
                Ok(Duration::from_nanos(n))
            }
        };
        Ok(RelayEndpoint {
            server_disco: DiscoPublic(key_at(fixed)),
            client_disco: [
                DiscoPublic(key_at(&fixed[32..])),
                DiscoPublic(key_at(&fixed[64..])),
            ],
            lamport_id: u64_at(&fixed[96..]),
            vni: u32_at(&fixed[104..]),
            bind_lifetime: lifetime(108)?,
            steady_state_lifetime: lifetime(116)?,
            endpoints: endpoints(ty, rest, true)?,
        })
    }

    fn append_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.server_disco.as_bytes());
        for k in &self.client_disco {
            out.extend_from_slice(k.as_bytes());
        }
        out.extend_from_slice(&self.lamport_id.to_be_bytes());
        out.extend_from_slice(&self.vni.to_be_bytes());
        out.extend_from_slice(&nanos(self.bind_lifetime).to_be_bytes());
        out.extend_from_slice(&nanos(self.steady_state_lifetime).to_be_bytes());
        for &e in &self.endpoints {
            put_endpoint(out, e);
        }
    }
}

impl Message {
    /// The type byte.
    pub fn type_byte(&self) -> u8 {
        match self {
            Message::Ping(_) => TYPE_PING,
            Message::Pong(_) => TYPE_PONG,
            Message::CallMeMaybe(_) => TYPE_CALL_ME_MAYBE,
            Message::Bind(_) => TYPE_BIND,
            Message::BindChallenge(_) => TYPE_BIND_CHALLENGE,
            Message::BindAnswer(_) => TYPE_BIND_ANSWER,
            Message::CallMeMaybeVia(_) => TYPE_CALL_ME_MAYBE_VIA,
            Message::AllocateRequest(_) => TYPE_ALLOCATE_REQUEST,
            Message::AllocateResponse(_) => TYPE_ALLOCATE_RESPONSE,
        }
    }

    /// Reads a plaintext (`type ‖ version ‖ body`). As Tailscale does,
    /// bytes after a fixed-size body are ignored and the version is
    /// checked only for 03, 07, 08 and 09 (where it must be 0; Tailscale
    /// reads a message of another version as empty, this refuses it).
    pub fn parse(plain: &[u8]) -> Result<Message, DiscoError> {
        let (&ty, &version) = match plain {
            [ty, version, ..] => (ty, version),
            _ => {
                return Err(DiscoError::Short {
                    ty: plain.first().copied().unwrap_or(0),
                    len: plain.len(),
                })
            }
        };
        let short = DiscoError::Short {
            ty,
            len: plain.len(),
        };
        if version != 0
            && matches!(
                ty,
                TYPE_CALL_ME_MAYBE
                    | TYPE_CALL_ME_MAYBE_VIA
                    | TYPE_ALLOCATE_REQUEST
                    | TYPE_ALLOCATE_RESPONSE
            )
        {
            return Err(DiscoError::Version { ty, version });
        }
        let body = &plain[2..];
        Ok(match ty {
            TYPE_PING => {
                let tx = body.get(..TX_ID_LEN).ok_or(short)?;
                let rest = &body[TX_ID_LEN..];
                let node_key = rest.get(..KEY_LEN).map(|k| NodePublic(key_at(k)));
                Ping {
                    tx_id: tx.try_into().expect("12 bytes"),
                    padding: rest.len() - node_key.map_or(0, |_| KEY_LEN),
                    node_key,
                }
                .into()
            }
            TYPE_PONG => {
                let b = body.get(..TX_ID_LEN + ENDPOINT_LEN).ok_or(short)?;
                Message::Pong(Pong {
                    tx_id: b[..TX_ID_LEN].try_into().expect("12 bytes"),
                    src: endpoint_at(&b[TX_ID_LEN..]),
                })
            }
            TYPE_CALL_ME_MAYBE => Message::CallMeMaybe(endpoints(ty, body, false)?),
            TYPE_BIND => Message::Bind(BindBody::parse(ty, plain)?),
            TYPE_BIND_CHALLENGE => Message::BindChallenge(BindBody::parse(ty, plain)?),
            TYPE_BIND_ANSWER => Message::BindAnswer(BindBody::parse(ty, plain)?),
            TYPE_CALL_ME_MAYBE_VIA => Message::CallMeMaybeVia(RelayEndpoint::parse(ty, body)?),
            TYPE_ALLOCATE_REQUEST => {
                let b = body.get(..ALLOCATE_REQUEST_BODY_LEN).ok_or(short)?;
                Message::AllocateRequest(AllocateRequest {
                    client_disco: [DiscoPublic(key_at(b)), DiscoPublic(key_at(&b[32..]))],
                    generation: u32_at(&b[64..]),
                })
            }
            TYPE_ALLOCATE_RESPONSE => {
                let g = body.get(..4).ok_or(short)?;
                Message::AllocateResponse(AllocateResponse {
                    generation: u32_at(g),
                    endpoint: RelayEndpoint::parse(ty, &body[4..])?,
                })
            }
            other => return Err(DiscoError::UnknownType(other)),
        })
    }

    /// Appends the plaintext (`type ‖ 0 ‖ body`).
    pub fn append_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.type_byte(), 0]);
        match self {
            Message::Ping(p) => {
                out.extend_from_slice(&p.tx_id);
                if let Some(k) = &p.node_key {
                    out.extend_from_slice(k.as_bytes());
                }
                out.resize(out.len() + p.padding, 0);
            }
            Message::Pong(p) => {
                out.extend_from_slice(&p.tx_id);
                put_endpoint(out, p.src);
            }
            Message::CallMeMaybe(eps) => {
                for &e in eps {
                    put_endpoint(out, e);
                }
            }
            Message::Bind(b) | Message::BindChallenge(b) | Message::BindAnswer(b) => {
                let mut body = [0u8; BIND_BODY_LEN];
                b.write(&mut body);
                out.extend_from_slice(&body);
            }
            Message::CallMeMaybeVia(e) => e.append_to(out),
            Message::AllocateRequest(r) => {
                for k in &r.client_disco {
                    out.extend_from_slice(k.as_bytes());
                }
                out.extend_from_slice(&r.generation.to_be_bytes());
            }
            Message::AllocateResponse(r) => {
                out.extend_from_slice(&r.generation.to_be_bytes());
                r.endpoint.append_to(out);
            }
        }
    }

    /// The plaintext as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.append_to(&mut v);
        v
    }
}

impl From<Ping> for Message {
    fn from(p: Ping) -> Self {
        Message::Ping(p)
    }
}

/// The sender's disco key of what looks like a disco packet (the magic,
/// and long enough for a box), without any crypto.
pub fn sender(packet: &[u8]) -> Option<DiscoPublic> {
    if packet.len() < OVERHEAD || packet[..MAGIC.len()] != MAGIC {
        return None;
    }
    Some(DiscoPublic(key_at(&packet[MAGIC.len()..])))
}

/// Appends the packet carrying `msg` from `sender`, sealed with `key`
/// (the sender's private key with the recipient's public key) and
/// `nonce` (random for every packet: [`nacl::random_nonce`]).
pub fn seal(
    out: &mut Vec<u8>,
    key: &SharedKey,
    sender: &DiscoPublic,
    nonce: &[u8; NONCE_LEN],
    msg: &Message,
) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(sender.as_bytes());
    let boxed = out.len();
    out.resize(boxed + nacl::OVERHEAD, 0);
    msg.append_to(out);
    key.seal_in_place(nonce, &mut out[boxed..]);
}

/// Opens the packet with `key` (the recipient's private key with the
/// [`sender`]'s public key) and reads its message.
pub fn open(key: &SharedKey, packet: &[u8]) -> Result<Message, DiscoError> {
    if sender(packet).is_none() {
        return Err(DiscoError::NotDisco);
    }
    Message::parse(&key.open(&packet[HEADER_LEN..])?)
}

/// Opens the packet in place (no copy, no allocation) and returns its
/// plaintext, for [`Message::parse`] or a caller reading a fixed-size
/// message itself. On failure the packet is left as it was.
pub fn open_in_place<'a>(key: &SharedKey, packet: &'a mut [u8]) -> Result<&'a [u8], DiscoError> {
    if sender(packet).is_none() {
        return Err(DiscoError::NotDisco);
    }
    Ok(key.open_in_place(&mut packet[HEADER_LEN..])?)
}

#[cfg(test)]
mod tests;
