//! WireGuard's four message kinds, their indices and MAC1, without I/O or
//! secrets.
//!
//! Ferry's UDP relay never decrypts WireGuard. It needs only what the
//! protocol leaves in the clear:
//!
//! - the message type in the first byte (followed by three zero bytes) and
//!   the exact size each type has ([`classify`]);
//! - the 32-bit session indices each side picks for itself: an initiation
//!   carries its sender's index, a response carries both its sender's index
//!   and the initiator's (as receiver), and cookie replies and transport
//!   messages carry the index of the side they are addressed to;
//! - MAC1, a keyed BLAKE2s-128 over the start of every initiation and
//!   response, whose key is derived from the *recipient's public key*
//!   ([`Mac1Key`]). Verifying it against the public keys a relay knows tells
//!   the relay whom a handshake message is for, and whoever can compute it
//!   needs no secret.
//!
//! Layouts (all integers little-endian):
//!
//! | Type | Size | Fields after `type ‖ 0 0 0` |
//! |---|---|---|
//! | 1 initiation | 148 | sender, ephemeral (32), static (48), timestamp (28), mac1, mac2 |
//! | 2 response | 92 | sender, receiver, ephemeral (32), empty (16), mac1, mac2 |
//! | 3 cookie reply | 64 | receiver, nonce (24), cookie (32) |
//! | 4 transport | ≥ 32 | receiver, counter (8), ciphertext and 16-byte tag |
//!
//! Transport messages are *not* always a multiple of 16 bytes: WireGuard
//! pads the plaintext to a multiple of 16 but never past the interface MTU,
//! so a full-size packet on the default MTU of 1420 is 1452 bytes (see the
//! `transport_big` fixtures). The only size rule a relay can enforce for
//! them is the 32-byte minimum (an empty keepalive).

use std::fmt;
use std::ops::Range;

use thiserror::Error;

/// A 32-bit session index, as WireGuard puts it on the wire.
pub type Index = u32;

/// Type byte of a handshake initiation.
pub const TYPE_INITIATION: u8 = 1;
/// Type byte of a handshake response.
pub const TYPE_RESPONSE: u8 = 2;
/// Type byte of a cookie reply.
pub const TYPE_COOKIE_REPLY: u8 = 3;
/// Type byte of a transport (data) message.
pub const TYPE_TRANSPORT: u8 = 4;

/// Size of a handshake initiation.
pub const INITIATION_LEN: usize = 148;
/// Size of a handshake response.
pub const RESPONSE_LEN: usize = 92;
/// Size of a cookie reply.
pub const COOKIE_REPLY_LEN: usize = 64;
/// Header of a transport message: type, receiver index, counter.
pub const TRANSPORT_HEADER_LEN: usize = 16;
/// Smallest transport message: a header and an empty payload's tag (a
/// keepalive).
pub const TRANSPORT_MIN_LEN: usize = 32;
/// Length of MAC1 (and MAC2).
pub const MAC_LEN: usize = 16;
/// Length of a Curve25519 public key.
pub const KEY_LEN: usize = 32;

/// Where MAC1 sits in an initiation; it covers every byte before it.
const INITIATION_MAC1: Range<usize> = 116..132;
/// Where MAC1 sits in a response; it covers every byte before it.
const RESPONSE_MAC1: Range<usize> = 60..76;

/// The label WireGuard hashes in front of a public key to make a MAC1 key.
const LABEL_MAC1: &[u8; 8] = b"mac1----";

/// The kind of a WireGuard message, for counting and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Handshake initiation (type 1).
    Initiation,
    /// Handshake response (type 2).
    Response,
    /// Cookie reply (type 3).
    CookieReply,
    /// Transport data (type 4).
    Transport,
}

impl Kind {
    /// Lower-case name used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Initiation => "initiation",
            Kind::Response => "response",
            Kind::CookieReply => "cookie_reply",
            Kind::Transport => "transport",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a WireGuard-shaped datagram says in the clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Type 1: the initiator announces its index.
    Initiation {
        /// The initiator's index for the session being set up.
        sender: Index,
    },
    /// Type 2: the responder announces its index and names the initiator's.
    Response {
        /// The responder's index.
        sender: Index,
        /// The initiator's index, from its initiation.
        receiver: Index,
    },
    /// Type 3: a cookie for the side whose index is `receiver`.
    CookieReply {
        /// Index of the side the cookie is for (the sender index of the
        /// handshake message that provoked it).
        receiver: Index,
    },
    /// Type 4: encrypted data for the side whose index is `receiver`.
    Transport {
        /// Index the recipient chose for this session.
        receiver: Index,
        /// The sender's nonce counter (strictly increasing per session,
        /// modulo reordering on the path).
        counter: u64,
    },
}

impl Message {
    /// The message's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Initiation { .. } => Kind::Initiation,
            Message::Response { .. } => Kind::Response,
            Message::CookieReply { .. } => Kind::CookieReply,
            Message::Transport { .. } => Kind::Transport,
        }
    }

    /// The index of the side this message is addressed to, when the message
    /// names one (every kind but an initiation).
    pub fn receiver(&self) -> Option<Index> {
        match *self {
            Message::Initiation { .. } => None,
            Message::Response { receiver, .. }
            | Message::CookieReply { receiver }
            | Message::Transport { receiver, .. } => Some(receiver),
        }
    }

    /// The index the sending side chose for itself, when the message
    /// carries one (handshake messages).
    pub fn sender(&self) -> Option<Index> {
        match *self {
            Message::Initiation { sender } | Message::Response { sender, .. } => Some(sender),
            _ => None,
        }
    }
}

/// Why a datagram is not a WireGuard message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NotWireGuard {
    /// Shorter than the 4-byte type header.
    #[error("datagram of {len} bytes is shorter than a WireGuard header (4 bytes)")]
    TooShort {
        /// Datagram length.
        len: usize,
    },
    /// The type byte is not 1–4.
    #[error("type byte {0} is not a WireGuard message type (1–4)")]
    UnknownType(u8),
    /// One of the three bytes after the type is not zero.
    #[error("reserved header bytes of a {0} message are not zero")]
    Reserved(Kind),
    /// A handshake message or cookie reply of the wrong size.
    #[error("{kind} message of {len} bytes; WireGuard's is exactly {want}")]
    BadLength {
        /// Kind named by the type byte.
        kind: Kind,
        /// Datagram length.
        len: usize,
        /// The only valid length for that kind.
        want: usize,
    },
    /// A transport message shorter than a keepalive.
    #[error("transport message of {len} bytes is shorter than the minimum of {TRANSPORT_MIN_LEN}")]
    ShortTransport {
        /// Datagram length.
        len: usize,
    },
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Checks that `datagram` has the shape of a WireGuard message and reads its
/// clear-text fields. Nothing is verified cryptographically: MAC1 is checked
/// separately with [`verify_mac1`].
pub fn classify(datagram: &[u8]) -> Result<Message, NotWireGuard> {
    let len = datagram.len();
    if len < 4 {
        return Err(NotWireGuard::TooShort { len });
    }
    let (kind, want) = match datagram[0] {
        TYPE_INITIATION => (Kind::Initiation, INITIATION_LEN),
        TYPE_RESPONSE => (Kind::Response, RESPONSE_LEN),
        TYPE_COOKIE_REPLY => (Kind::CookieReply, COOKIE_REPLY_LEN),
        TYPE_TRANSPORT => (Kind::Transport, TRANSPORT_MIN_LEN),
        other => return Err(NotWireGuard::UnknownType(other)),
    };
    if datagram[1..4] != [0, 0, 0] {
        return Err(NotWireGuard::Reserved(kind));
    }
    match kind {
        Kind::Transport if len < TRANSPORT_MIN_LEN => Err(NotWireGuard::ShortTransport { len }),
        Kind::Transport => Ok(Message::Transport {
            receiver: le32(datagram, 4),
            counter: u64::from_le_bytes(
                datagram[8..16]
                    .try_into()
                    .expect("transport header is 16 bytes"),
            ),
        }),
        _ if len != want => Err(NotWireGuard::BadLength { kind, len, want }),
        Kind::Initiation => Ok(Message::Initiation {
            sender: le32(datagram, 4),
        }),
        Kind::Response => Ok(Message::Response {
            sender: le32(datagram, 4),
            receiver: le32(datagram, 8),
        }),
        Kind::CookieReply => Ok(Message::CookieReply {
            receiver: le32(datagram, 4),
        }),
    }
}

/// A WireGuard (Curve25519) public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; KEY_LEN]);

/// Why a text is not a WireGuard key.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not 44 characters of standard base64 ending in one `=`.
    #[error(
        "a WireGuard key is 44 characters of base64 (as `wg pubkey` prints it), got {0} characters"
    )]
    Length(usize),
    /// A character outside the base64 alphabet, or bad padding.
    #[error("a WireGuard key is base64; character {0:?} is not")]
    Character(char),
}

impl PublicKey {
    /// Wraps raw key bytes.
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        PublicKey(bytes)
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// Parses the base64 form `wg` uses (44 characters, one `=`).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        let bytes = text.as_bytes();
        if bytes.len() != 44 {
            return Err(KeyError::Length(text.chars().count()));
        }
        if bytes[43] != b'=' {
            return Err(KeyError::Character(char::from(bytes[43])));
        }
        let mut acc: u32 = 0;
        let mut bits = 0;
        let mut out = [0u8; KEY_LEN];
        let mut n = 0;
        for &c in &bytes[..43] {
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return Err(KeyError::Character(char::from(c))),
            };
            acc = (acc << 6) | u32::from(v);
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out[n] = (acc >> bits) as u8;
                n += 1;
            }
        }
        // 43 characters carry 258 bits: the last two must be zero.
        if acc & ((1 << bits) - 1) != 0 {
            return Err(KeyError::Character(char::from(bytes[42])));
        }
        debug_assert_eq!(n, KEY_LEN);
        Ok(PublicKey(out))
    }

    /// The base64 form `wg` prints.
    pub fn to_base64(&self) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::with_capacity(44);
        for chunk in self.0.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..=chunk.len() {
                s.push(char::from(ALPHABET[(v >> (18 - 6 * i)) as usize & 63]));
            }
        }
        s.push('=');
        s
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

/// The key MAC1 is computed with for messages *to* one public key:
/// BLAKE2s-256(`"mac1----"` ‖ public key).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Mac1Key([u8; 32]);

impl Mac1Key {
    /// Derives the MAC1 key for messages addressed to `recipient`.
    pub fn new(recipient: &PublicKey) -> Self {
        let hash = blake2s_simd::Params::new()
            .hash_length(32)
            .to_state()
            .update(LABEL_MAC1)
            .update(recipient.as_bytes())
            .finalize();
        Mac1Key(hash.as_bytes().try_into().expect("BLAKE2s-256 is 32 bytes"))
    }

    /// MAC1 over `covered`: BLAKE2s with this key and a 16-byte output.
    pub fn mac(&self, covered: &[u8]) -> [u8; MAC_LEN] {
        let hash = blake2s_simd::Params::new()
            .hash_length(MAC_LEN)
            .key(&self.0)
            .hash(covered);
        hash.as_bytes()
            .try_into()
            .expect("hash length was set to 16")
    }
}

impl fmt::Debug for Mac1Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Mac1Key(..)")
    }
}

/// Where MAC1 sits in a message of this shape, if it has one.
fn mac1_range(msg: &[u8]) -> Option<Range<usize>> {
    if msg.get(1..4) != Some(&[0, 0, 0]) {
        return None;
    }
    match (msg.first(), msg.len()) {
        (Some(&TYPE_INITIATION), INITIATION_LEN) => Some(INITIATION_MAC1),
        (Some(&TYPE_RESPONSE), RESPONSE_LEN) => Some(RESPONSE_MAC1),
        _ => None,
    }
}

/// Whether `msg`, an initiation or a response, carries a MAC1 made for the
/// recipient `key` stands for. Any other message returns `false`.
pub fn verify_mac1(msg: &[u8], key: &Mac1Key) -> bool {
    let Some(at) = mac1_range(msg) else {
        return false;
    };
    let want = key.mac(&msg[..at.start]);
    // Not a secret, but comparing without an early exit costs nothing.
    want.iter()
        .zip(&msg[at])
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// Writes MAC1 for `key` into an initiation or response in place (for
/// tests, fuzzing and load generators). Returns `false`, leaving `msg`
/// alone, when it is neither.
pub fn seal_mac1(msg: &mut [u8], key: &Mac1Key) -> bool {
    let Some(at) = mac1_range(msg) else {
        return false;
    };
    let mac = key.mac(&msg[..at.start]);
    msg[at].copy_from_slice(&mac);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let text = match name {
            "initiation" => include_str!("wireguard/fixtures/a_to_b_initiation_0.hex"),
            "response" => include_str!("wireguard/fixtures/b_to_a_response_0.hex"),
            "cookie" => include_str!("wireguard/fixtures/b_to_flood_cookie_reply_0.hex"),
            "keepalive" => include_str!("wireguard/fixtures/a_to_b_keepalive_0.hex"),
            "ping" => include_str!("wireguard/fixtures/b_to_a_transport_0.hex"),
            "big" => include_str!("wireguard/fixtures/a_to_b_transport_big_0.hex"),
            _ => unreachable!("no fixture {name}"),
        };
        hex(text)
    }

    fn hex(text: &str) -> Vec<u8> {
        let t = text.trim().as_bytes();
        assert_eq!(t.len() % 2, 0, "odd hex length");
        t.chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).expect("hex digit"))
            .collect()
    }

    fn key(name: &str) -> PublicKey {
        let text = match name {
            "a" => include_str!("wireguard/fixtures/a.public"),
            "b" => include_str!("wireguard/fixtures/b.public"),
            _ => unreachable!(),
        };
        PublicKey::from_base64(text).expect("fixture key")
    }

    #[test]
    fn classifies_real_messages() {
        let init = classify(&fixture("initiation")).unwrap();
        let Message::Initiation { sender: a_index } = init else {
            panic!("{init:?}")
        };
        let resp = classify(&fixture("response")).unwrap();
        let Message::Response {
            sender: b_index,
            receiver,
        } = resp
        else {
            panic!("{resp:?}")
        };
        assert_eq!(receiver, a_index, "the response names the initiator");
        assert_eq!(
            classify(&fixture("cookie")).unwrap(),
            Message::CookieReply { receiver: a_index }
        );
        // A speaks first after the handshake, to B's index.
        match classify(&fixture("keepalive")).unwrap() {
            Message::Transport { receiver, .. } => assert_eq!(receiver, b_index),
            other => panic!("{other:?}"),
        }
        match classify(&fixture("ping")).unwrap() {
            Message::Transport { receiver, .. } => assert_eq!(receiver, a_index),
            other => panic!("{other:?}"),
        }
        let big = fixture("big");
        assert_eq!(big.len(), 1452);
        assert_ne!(big.len() % 16, 0, "padding stops at the MTU");
        assert!(matches!(
            classify(&big),
            Ok(Message::Transport { receiver, .. }) if receiver == b_index
        ));
    }

    #[test]
    fn mac1_matches_the_recipient_only() {
        let (a, b) = (Mac1Key::new(&key("a")), Mac1Key::new(&key("b")));
        let init = fixture("initiation");
        let resp = fixture("response");
        assert!(verify_mac1(&init, &b), "initiation is for B");
        assert!(!verify_mac1(&init, &a));
        assert!(verify_mac1(&resp, &a), "response is for A");
        assert!(!verify_mac1(&resp, &b));
        assert!(!verify_mac1(&fixture("cookie"), &a), "no MAC1 there");

        for at in [0, 4, 50, 115, 116, 131] {
            let mut bad = init.clone();
            bad[at] ^= 1;
            assert!(!verify_mac1(&bad, &b), "flipped byte {at}");
        }
        // MAC2 (after MAC1) is not covered.
        let mut other = init.clone();
        other[140] ^= 0xff;
        assert!(verify_mac1(&other, &b));

        let mut resealed = init.clone();
        resealed[116..132].fill(0);
        assert!(seal_mac1(&mut resealed, &b));
        assert_eq!(resealed, init);
        assert!(!seal_mac1(&mut fixture("keepalive"), &b));
    }

    #[test]
    fn rejects_misshapen_datagrams() {
        assert_eq!(classify(b""), Err(NotWireGuard::TooShort { len: 0 }));
        assert_eq!(classify(&[1, 0, 0]), Err(NotWireGuard::TooShort { len: 3 }));
        assert_eq!(classify(&[5, 0, 0, 0]), Err(NotWireGuard::UnknownType(5)));
        assert_eq!(classify(&[0; 148]), Err(NotWireGuard::UnknownType(0)));
        let mut init = fixture("initiation");
        init[2] = 1;
        assert_eq!(
            classify(&init),
            Err(NotWireGuard::Reserved(Kind::Initiation))
        );
        let init = fixture("initiation");
        assert_eq!(
            classify(&init[..147]),
            Err(NotWireGuard::BadLength {
                kind: Kind::Initiation,
                len: 147,
                want: 148
            })
        );
        let mut long = fixture("response");
        long.push(0);
        assert!(matches!(
            classify(&long),
            Err(NotWireGuard::BadLength { want: 92, .. })
        ));
        assert!(matches!(
            classify(&fixture("cookie")[..63]),
            Err(NotWireGuard::BadLength { want: 64, .. })
        ));
        assert_eq!(
            classify(&fixture("keepalive")[..31]),
            Err(NotWireGuard::ShortTransport { len: 31 })
        );
        let msg = NotWireGuard::BadLength {
            kind: Kind::Response,
            len: 93,
            want: 92,
        }
        .to_string();
        assert!(msg.contains("response") && msg.contains("93") && msg.contains("92"));
    }

    #[test]
    fn keys_round_trip_through_base64() {
        let text = include_str!("wireguard/fixtures/a.public").trim();
        let k = PublicKey::from_base64(text).unwrap();
        assert_eq!(k.to_base64(), text);
        let zero = PublicKey::from_bytes([0; 32]);
        assert_eq!(
            zero.to_base64(),
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
        );
        let all = PublicKey::from_bytes([0xff; 32]);
        assert_eq!(PublicKey::from_base64(&all.to_base64()), Ok(all));
        assert_eq!(PublicKey::from_base64("abc"), Err(KeyError::Length(3)));
        assert!(matches!(
            PublicKey::from_base64("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA*="),
            Err(KeyError::Character('*'))
        ));
        // Non-zero trailing bits are not a canonical key.
        assert!(PublicKey::from_base64("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=").is_err());
    }

    #[test]
    fn mac1_key_matches_the_specification() {
        // Independent derivation: BLAKE2s-256 of the label and key, then a
        // keyed BLAKE2s-128, computed with the plain hash API.
        let pk = key("b");
        let mut input = b"mac1----".to_vec();
        input.extend_from_slice(pk.as_bytes());
        let k = blake2s_simd::blake2s(&input);
        let init = fixture("initiation");
        let mac = blake2s_simd::Params::new()
            .hash_length(16)
            .key(k.as_bytes())
            .hash(&init[..116]);
        assert_eq!(mac.as_bytes(), &init[116..132]);
    }
}
