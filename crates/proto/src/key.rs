//! Node keys and the mesh key, with their text encodings
//! (`docs/derp-protocol.md` §2).
//!
//! * [`NodePublic`] is a client's DERP address and the server's identity:
//!   32 bytes of Curve25519 public key, written `nodekey:<64 hex>`.
//! * [`NodePrivate`] is the matching private key (`privkey:<64 hex>`), clamped
//!   on creation; `derper` stores it in a small JSON key file.
//! * [`MeshKey`] is the region's pre-shared secret, bare 64 hex, compared in
//!   constant time.
//! * [`MachinePublic`] / [`MachinePrivate`] are a tailnet node's identity on
//!   the control channel (`mkey:<64 hex>`; the private text form is the
//!   same `privkey:` as a node key's).
//!
//! Parsing accepts upper- or lowercase hex and requires the exact prefix;
//! encoding always emits lowercase. Debug output of secrets never shows them.

use crate::hex;
use std::fmt;
use std::str::FromStr;

/// Length in bytes of every key in this module.
pub const KEY_LEN: usize = 32;

const NODE_PUBLIC_PREFIX: &str = "nodekey:";
const NODE_PRIVATE_PREFIX: &str = "privkey:";

/// Why a key could not be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The text form lacks its type prefix (`nodekey:` or `privkey:`).
    #[error("key text must start with {expected:?}")]
    MissingPrefix {
        /// The prefix that was required.
        expected: &'static str,
    },
    /// The hex part is not exactly 64 characters.
    #[error("key hex must be exactly 64 characters, got {len}")]
    BadHexLength {
        /// Length of the hex part in bytes.
        len: usize,
    },
    /// The hex part contains a non-hex character.
    #[error("key contains a non-hex character")]
    BadHexDigit,
    /// A raw key slice is not exactly 32 bytes.
    #[error("raw key must be exactly 32 bytes, got {len}")]
    BadLength {
        /// Length of the slice given.
        len: usize,
    },
    /// An all-zero mesh key was given; zero means "no mesh key"
    /// (`docs/derp-protocol.md` §9.1).
    #[error("mesh key must not be all zero")]
    ZeroMeshKey,
    /// The key file is not the JSON object `derper` writes.
    #[error("invalid key file: {0}")]
    KeyFile(String),
}

fn decode_hex32(s: &str) -> Result<[u8; 32], KeyError> {
    hex::decode32(s).map_err(|e| match e {
        hex::HexError::Length(len) => KeyError::BadHexLength { len },
        hex::HexError::Digit => KeyError::BadHexDigit,
    })
}

/// First five characters of the standard base64 encoding of `key`, in
/// brackets: the log-friendly short form Go prints for keys.
fn short_form(key: &[u8; 32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    // Five base64 characters cover 30 bits, all within the first four bytes.
    let bits = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    let mut s = String::with_capacity(7);
    s.push('[');
    for i in 0..5 {
        let idx = (bits >> (26 - 6 * i)) & 0x3f;
        s.push(char::from(ALPHABET[idx as usize]));
    }
    s.push(']');
    s
}

/// A node public key: a DERP client's address, or the server's identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodePublic(pub [u8; 32]);

impl NodePublic {
    /// Wraps 32 raw bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        NodePublic(bytes)
    }

    /// The raw 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether every byte is zero (never a valid peer;
    /// `docs/derp-protocol.md` §3).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }

    /// The untyped form: 64 lowercase hex digits, no prefix (used in the
    /// `Derp-Public-Key` header and the meta-certificate CN).
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    /// Parses the untyped form: exactly 64 hex digits of either case.
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        decode_hex32(s).map(NodePublic)
    }

    /// The log short form `[abcde]`, also what `Debug` prints.
    pub fn short(&self) -> String {
        short_form(&self.0)
    }
}

impl fmt::Debug for NodePublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

impl fmt::Display for NodePublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_prefixed(f, NODE_PUBLIC_PREFIX, &self.0)
    }
}

impl FromStr for NodePublic {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        parse_prefixed(s, NODE_PUBLIC_PREFIX).map(NodePublic)
    }
}

impl TryFrom<&[u8]> for NodePublic {
    type Error = KeyError;

    fn try_from(b: &[u8]) -> Result<Self, KeyError> {
        <[u8; 32]>::try_from(b)
            .map(NodePublic)
            .map_err(|_| KeyError::BadLength { len: b.len() })
    }
}

impl From<[u8; 32]> for NodePublic {
    fn from(b: [u8; 32]) -> Self {
        NodePublic(b)
    }
}

impl serde::Serialize for NodePublic {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for NodePublic {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Applies X25519 clamping: clear the low three bits, clear the top bit, set
/// the second-highest bit.
fn clamp(mut b: [u8; 32]) -> [u8; 32] {
    b[0] &= 248;
    b[31] = (b[31] & 127) | 64;
    b
}

/// A node private key. Always clamped; the public half is computed once.
#[derive(Clone)]
pub struct NodePrivate {
    bytes: [u8; 32],
    public: NodePublic,
}

impl NodePrivate {
    /// Generates a fresh key from the operating system's CSPRNG.
    pub fn generate() -> Self {
        Self::from_bytes(random32())
    }

    /// Builds a key from 32 raw bytes, clamping them.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let (bytes, public) = clamped_pair(bytes);
        NodePrivate {
            bytes,
            public: NodePublic(public),
        }
    }

    /// The public key (X25519 of this key with the base point).
    pub fn public(&self) -> NodePublic {
        self.public
    }

    /// The raw (clamped) 32 bytes. Secret material.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The key as a `crypto_box` secret key, for the NaCl box.
    pub(crate) fn secret_key(&self) -> crypto_box::SecretKey {
        crypto_box::SecretKey::from_bytes(self.bytes)
    }

    /// The JSON key file `derper` reads and writes:
    /// `{"PrivateKey":"privkey:<64 hex>"}`.
    pub fn to_key_file_json(&self) -> String {
        format!("{{\"PrivateKey\":\"{self}\"}}")
    }

    /// Parses a `derper` key file. Key names match case-insensitively and
    /// unknown keys are ignored, as with Go's decoder.
    pub fn from_key_file_json(json: &str) -> Result<Self, KeyError> {
        let file: KeyFile = crate::json::decode_object(json.as_bytes())
            .map_err(|e| KeyError::KeyFile(e.to_string()))?;
        let text = file
            .private_key
            .ok_or_else(|| KeyError::KeyFile("missing PrivateKey".to_owned()))?;
        text.parse()
    }
}

#[derive(Default)]
struct KeyFile {
    private_key: Option<String>,
}

impl crate::json::FieldSink for KeyFile {
    fn field<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        if key == "privatekey" {
            if let Some(v) = map.next_value::<Option<String>>()? {
                self.private_key = Some(v);
            }
        } else {
            map.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(())
    }
}

impl PartialEq for NodePrivate {
    fn eq(&self, other: &Self) -> bool {
        ct_eq32(&self.bytes, &other.bytes)
    }
}

impl Eq for NodePrivate {}

impl fmt::Debug for NodePrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodePrivate(public {:?})", self.public)
    }
}

impl fmt::Display for NodePrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_prefixed(f, NODE_PRIVATE_PREFIX, &self.bytes)
    }
}

impl FromStr for NodePrivate {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        parse_prefixed(s, NODE_PRIVATE_PREFIX).map(Self::from_bytes)
    }
}

/// Compares two 32-byte values without data-dependent branches.
fn ct_eq32(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // `black_box` keeps the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// The region's pre-shared mesh key (`docs/derp-protocol.md` §9.1).
///
/// A client that presents the server's mesh key gains mesh privileges.
/// Equality (`==` as well as [`MeshKey::ct_eq`]) runs in constant time.
#[derive(Clone)]
pub struct MeshKey(pub [u8; 32]);

impl MeshKey {
    /// Parses a mesh key file or value: surrounding whitespace is trimmed, the
    /// rest must be exactly 64 hex digits and not all zero.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let b = decode_hex32(s.trim())?;
        if b == [0; 32] {
            return Err(KeyError::ZeroMeshKey);
        }
        Ok(MeshKey(b))
    }

    /// Constant-time equality.
    pub fn ct_eq(&self, other: &MeshKey) -> bool {
        ct_eq32(&self.0, &other.0)
    }

    /// Whether every byte is zero (zero means "no mesh key").
    pub fn is_zero(&self) -> bool {
        ct_eq32(&self.0, &[0; 32])
    }

    /// The raw 32 bytes. Secret material.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex digits, the form used in `clientInfo` JSON.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }
}

impl PartialEq for MeshKey {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(other)
    }
}

impl Eq for MeshKey {}

impl fmt::Debug for MeshKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MeshKey(<redacted>)")
    }
}

const MACHINE_PUBLIC_PREFIX: &str = "mkey:";

/// A machine public key: a tailnet node's (or the control server's)
/// long-term Noise identity on the control channel, written
/// `mkey:<64 hex>`. A separate type from [`NodePublic`] so the two are never
/// mixed up.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MachinePublic(pub [u8; 32]);

impl MachinePublic {
    /// Wraps 32 raw bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        MachinePublic(bytes)
    }

    /// The raw 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether every byte is zero (never a valid key).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }
}

impl fmt::Debug for MachinePublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mkey{}", short_form(&self.0))
    }
}

impl fmt::Display for MachinePublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MACHINE_PUBLIC_PREFIX)?;
        f.write_str(&hex::encode(&self.0))
    }
}

impl FromStr for MachinePublic {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        let hex = s
            .strip_prefix(MACHINE_PUBLIC_PREFIX)
            .ok_or(KeyError::MissingPrefix {
                expected: MACHINE_PUBLIC_PREFIX,
            })?;
        decode_hex32(hex).map(MachinePublic)
    }
}

/// A machine private key (`privkey:<64 hex>`, the same text form as a node
/// private key). Clamped on creation; the public half is computed once.
#[derive(Clone, PartialEq, Eq)]
pub struct MachinePrivate(NodePrivate);

impl MachinePrivate {
    /// Generates a fresh key from the operating system's CSPRNG.
    pub fn generate() -> Self {
        MachinePrivate(NodePrivate::generate())
    }

    /// Builds a key from 32 raw bytes, clamping them.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        MachinePrivate(NodePrivate::from_bytes(bytes))
    }

    /// The public key.
    pub fn public(&self) -> MachinePublic {
        MachinePublic(self.0.public().0)
    }

    /// The raw (clamped) 32 bytes. Secret material.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for MachinePrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MachinePrivate(public {:?})", self.public())
    }
}

impl fmt::Display for MachinePrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for MachinePrivate {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        s.parse().map(MachinePrivate)
    }
}

#[cfg(test)]
mod machine_tests {
    use super::*;

    #[test]
    fn machine_text_forms() {
        let k = MachinePrivate::from_bytes([7; 32]);
        let text = k.to_string();
        assert!(text.starts_with("privkey:"));
        assert_eq!(text.parse::<MachinePrivate>(), Ok(k.clone()));
        let p = k.public();
        assert_eq!(p.0, NodePrivate::from_bytes([7; 32]).public().0);
        let pt = p.to_string();
        assert!(pt.starts_with("mkey:") && pt.len() == 5 + 64, "{pt}");
        assert_eq!(pt.parse::<MachinePublic>(), Ok(p));
        assert_eq!(
            pt.replace("mkey:", "nodekey:").parse::<MachinePublic>(),
            Err(KeyError::MissingPrefix { expected: "mkey:" })
        );
        assert!(!format!("{k:?}").contains(&text[8..]));
        assert!(!p.is_zero() && MachinePublic::default().is_zero());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SERVER_PRIV: &str =
        "0002030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f60";
    pub(crate) const SERVER_PUB: &str =
        "07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c";

    fn priv_from_hex(s: &str) -> NodePrivate {
        format!("privkey:{s}").parse().unwrap()
    }

    #[test]
    fn vector_public_keys() {
        // `docs/derp-protocol.md` §17.1
        let cases = [
            (SERVER_PRIV, SERVER_PUB),
            (
                "2022232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f40",
                "5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b",
            ),
            (
                "4042434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f60",
                "64b101b1d0be5a8704bd078f9895001fc03e8e9f9522f188dd128d9846d48466",
            ),
        ];
        for (private, public) in cases {
            let k = priv_from_hex(private);
            assert_eq!(k.public().to_hex(), public);
            assert_eq!(hex::encode(k.as_bytes()), private, "already clamped");
        }
    }

    #[test]
    fn text_forms() {
        let s = NodePublic::from_hex(SERVER_PUB).unwrap();
        assert_eq!(s.to_string(), format!("nodekey:{SERVER_PUB}"));
        assert_eq!(format!("nodekey:{SERVER_PUB}").parse::<NodePublic>(), Ok(s));
        assert_eq!(
            format!("nodekey:{}", SERVER_PUB.to_uppercase()).parse::<NodePublic>(),
            Ok(s)
        );
        assert_eq!(
            SERVER_PUB.parse::<NodePublic>(),
            Err(KeyError::MissingPrefix {
                expected: "nodekey:"
            })
        );
        assert_eq!(
            format!("mkey:{SERVER_PUB}").parse::<NodePublic>(),
            Err(KeyError::MissingPrefix {
                expected: "nodekey:"
            })
        );
        assert_eq!(
            "nodekey:abcd".parse::<NodePublic>(),
            Err(KeyError::BadHexLength { len: 4 })
        );
        assert_eq!(
            NodePublic::from_hex(&"z".repeat(64)),
            Err(KeyError::BadHexDigit)
        );
        assert_eq!(NodePublic::try_from(&s.0[..]), Ok(s));
        assert_eq!(
            NodePublic::try_from(&s.0[..31]),
            Err(KeyError::BadLength { len: 31 })
        );
        assert!(NodePublic::default().is_zero());
        assert!(!s.is_zero());
    }

    #[test]
    fn short_form_matches_base64() {
        // base64("\x07\xa3\x7c\xbc...") starts with "B6N8v".
        let s = NodePublic::from_hex(SERVER_PUB).unwrap();
        assert_eq!(s.short(), "[B6N8v]");
        assert_eq!(format!("{s:?}"), "[B6N8v]");
        assert_eq!(NodePublic([0xff; 32]).short(), "[/////]");
        assert_eq!(NodePublic([0; 32]).short(), "[AAAAA]");
    }

    #[test]
    fn private_key_text_and_secrecy() {
        let k = priv_from_hex(SERVER_PRIV);
        assert_eq!(k.to_string(), format!("privkey:{SERVER_PRIV}"));
        let dbg = format!("{k:?}");
        assert!(!dbg.contains(SERVER_PRIV), "{dbg}");
        assert!(!dbg.contains(&SERVER_PRIV[..10]), "{dbg}");
        assert!(format!("nodekey:{SERVER_PRIV}")
            .parse::<NodePrivate>()
            .is_err());
    }

    #[test]
    fn clamping() {
        let k = NodePrivate::from_bytes([0xff; 32]);
        assert_eq!(k.as_bytes()[0], 0xf8);
        assert_eq!(k.as_bytes()[31], 0x7f);
        let g = NodePrivate::generate();
        assert_eq!(g.as_bytes()[0] & 7, 0);
        assert_eq!(g.as_bytes()[31] & 0xc0, 0x40);
        assert_ne!(g, NodePrivate::generate());
    }

    #[test]
    fn key_file() {
        let k = priv_from_hex(SERVER_PRIV);
        let json = k.to_key_file_json();
        assert_eq!(
            json,
            format!("{{\"PrivateKey\":\"privkey:{SERVER_PRIV}\"}}")
        );
        assert_eq!(NodePrivate::from_key_file_json(&json).unwrap(), k);
        // derper's file is indented, and Go matches keys case-insensitively.
        let pretty =
            format!("{{\n\t\"privatekey\": \"privkey:{SERVER_PRIV}\",\n\t\"x\": [1]\n}}\n");
        assert_eq!(NodePrivate::from_key_file_json(&pretty).unwrap(), k);
        assert!(matches!(
            NodePrivate::from_key_file_json("{}"),
            Err(KeyError::KeyFile(_))
        ));
        assert!(matches!(
            NodePrivate::from_key_file_json("not json"),
            Err(KeyError::KeyFile(_))
        ));
        assert!(matches!(
            NodePrivate::from_key_file_json(&format!("{{\"PrivateKey\":\"{SERVER_PRIV}\"}}")),
            Err(KeyError::MissingPrefix { .. })
        ));
    }

    #[test]
    fn mesh_key() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let a = MeshKey::parse(&format!("  {hex}\n")).unwrap();
        let b = MeshKey::parse(&hex.to_uppercase()).unwrap();
        assert!(a.ct_eq(&b));
        assert_eq!(a.to_hex(), hex);
        let mut other = a.0;
        other[31] ^= 1;
        assert!(!a.ct_eq(&MeshKey(other)));
        assert_eq!(
            MeshKey::parse(&"0".repeat(64)).unwrap_err(),
            KeyError::ZeroMeshKey
        );
        assert!(MeshKey::parse("").is_err());
        assert!(MeshKey::parse(&format!("{hex}00")).is_err());
        assert!(!format!("{a:?}").contains("0011"));
        assert!(MeshKey([0; 32]).is_zero());
    }

    #[test]
    fn serde_text_form() {
        let s = NodePublic::from_hex(SERVER_PUB).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, format!("\"nodekey:{SERVER_PUB}\""));
        assert_eq!(serde_json::from_str::<NodePublic>(&json).unwrap(), s);
    }
}

/// `prefix` and the 64 lowercase hex digits of `bytes`.
fn write_prefixed(f: &mut fmt::Formatter<'_>, prefix: &str, bytes: &[u8; 32]) -> fmt::Result {
    f.write_str(prefix)?;
    f.write_str(&hex::encode(bytes))
}

/// The 32 bytes of `prefix` followed by 64 hex digits.
fn parse_prefixed(s: &str, prefix: &'static str) -> Result<[u8; 32], KeyError> {
    let hex = s
        .strip_prefix(prefix)
        .ok_or(KeyError::MissingPrefix { expected: prefix })?;
    decode_hex32(hex)
}

/// 32 bytes from the operating system's CSPRNG.
fn random32() -> [u8; 32] {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b
}

/// The clamped private key from `bytes` and its X25519 public key.
fn clamped_pair(bytes: [u8; 32]) -> ([u8; 32], [u8; 32]) {
    let bytes = clamp(bytes);
    let public = crypto_box::SecretKey::from_bytes(bytes).public_key();
    (bytes, public.to_bytes())
}

const DISCO_PUBLIC_PREFIX: &str = "discokey:";
const DISCO_PRIVATE_PREFIX: &str = "discoprivkey:";

/// A disco public key: the identity under which a Tailscale node seals its
/// disco messages (path discovery, peer-relay allocation and binds), and
/// under which a peer relay seals its answers. 32 bytes of Curve25519
/// public key, written `discokey:<64 hex>`. Ordered bytewise, as the
/// sorted client pair of a peer-relay endpoint is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DiscoPublic(pub [u8; 32]);

impl DiscoPublic {
    /// The raw 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether every byte is zero (no key).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }

    /// The log short form `[abcde]`, also what `Debug` prints.
    pub fn short(&self) -> String {
        short_form(&self.0)
    }
}

impl fmt::Debug for DiscoPublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d:{}", self.short())
    }
}

impl fmt::Display for DiscoPublic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_prefixed(f, DISCO_PUBLIC_PREFIX, &self.0)
    }
}

impl FromStr for DiscoPublic {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        parse_prefixed(s, DISCO_PUBLIC_PREFIX).map(DiscoPublic)
    }
}

impl serde::Serialize for DiscoPublic {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DiscoPublic {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A disco private key. Always clamped; the public half is computed once.
/// Its text form, `discoprivkey:<64 hex>`, is Ferry's own (for a state
/// file): Tailscale never writes one.
#[derive(Clone)]
pub struct DiscoPrivate {
    bytes: [u8; 32],
    public: DiscoPublic,
}

impl DiscoPrivate {
    /// Generates a fresh key from the operating system's CSPRNG.
    pub fn generate() -> Self {
        Self::from_bytes(random32())
    }

    /// Builds a key from 32 raw bytes, clamping them.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let (bytes, public) = clamped_pair(bytes);
        DiscoPrivate {
            bytes,
            public: DiscoPublic(public),
        }
    }

    /// The public key.
    pub fn public(&self) -> DiscoPublic {
        self.public
    }

    /// The raw (clamped) 32 bytes. Secret material.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The NaCl box key between this key and `their` (X25519 and HSalsa20
    /// done once here): disco messages both ways are sealed and opened
    /// with it.
    pub fn shared(&self, their: &DiscoPublic) -> crate::nacl::SharedKey {
        crate::nacl::SharedKey::from_raw(&self.bytes, &their.0)
    }
}

impl PartialEq for DiscoPrivate {
    fn eq(&self, other: &Self) -> bool {
        ct_eq32(&self.bytes, &other.bytes)
    }
}

impl Eq for DiscoPrivate {}

impl fmt::Debug for DiscoPrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DiscoPrivate(public {:?})", self.public)
    }
}

impl fmt::Display for DiscoPrivate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_prefixed(f, DISCO_PRIVATE_PREFIX, &self.bytes)
    }
}

impl FromStr for DiscoPrivate {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        parse_prefixed(s, DISCO_PRIVATE_PREFIX).map(Self::from_bytes)
    }
}

#[cfg(test)]
mod disco_tests {
    use super::*;

    #[test]
    fn disco_keys_text_forms_and_box() {
        let a = DiscoPrivate::from_bytes([0xff; 32]);
        assert_eq!(a.as_bytes()[0], 0xf8);
        let text = a.public().to_string();
        assert!(
            text.starts_with("discokey:") && text.len() == 9 + 64,
            "{text}"
        );
        assert_eq!(text.parse::<DiscoPublic>(), Ok(a.public()));
        assert_eq!(
            text[9..].parse::<DiscoPublic>(),
            Err(KeyError::MissingPrefix {
                expected: "discokey:"
            })
        );
        assert!(format!("nodekey:{}", &text[9..])
            .parse::<DiscoPublic>()
            .is_err());
        let private = a.to_string();
        assert!(private.starts_with("discoprivkey:"));
        assert_eq!(private.parse::<DiscoPrivate>().unwrap(), a);
        assert!(!format!("{a:?}").contains(&private[13..20]));
        let json = serde_json::to_string(&a.public()).unwrap();
        assert_eq!(
            serde_json::from_str::<DiscoPublic>(&json).unwrap(),
            a.public()
        );
        // The same public key as a node key from the same bytes: one curve.
        assert_eq!(a.public().0, NodePrivate::from_bytes([0xff; 32]).public().0);
        // Both sides derive one box key.
        let b = DiscoPrivate::generate();
        let sealed = a.shared(&b.public()).seal(&[3; 24], b"disco");
        assert_eq!(b.shared(&a.public()).open(&sealed).unwrap(), b"disco");
        assert!(DiscoPublic::default().is_zero());
    }
}
