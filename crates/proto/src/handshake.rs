//! The DERP handshake (`docs/derp-protocol.md` §7): `serverKey`, sealed
//! `clientInfo`, sealed `serverInfo`.
//!
//! Server side, in order:
//!
//! 1. write [`server_key_frame`] (right after the 101, or first thing in
//!    fast-start mode);
//! 2. read one frame with [`crate::frame::ClientInfoFramePolicy`] and pass its
//!    payload to [`open_client_info`], which checks the length, rejects the
//!    all-zero key, opens the box from the client's key and decodes the JSON;
//! 3. after admission, write [`seal_server_info`].
//!
//! The client side mirrors it with [`parse_server_key`], [`seal_client_info`]
//! and [`open_server_info`]. Every failure is a reason to close the connection:
//! DERP has no error frame.
//!
//! The JSON bodies follow Go's `encoding/json` exactly where peers can observe
//! it: keys are emitted in Go's order and spelling with Go's omission rules,
//! and decoding matches keys case-insensitively, ignores unknown keys and lets
//! a later duplicate win.

use crate::frame::{
    encode_header, FrameType, HEADER_LEN, KEY_LEN, MAGIC, MAX_CLIENT_INFO_LEN,
    MAX_CLIENT_READ_FRAME, MIN_CLIENT_INFO_LEN,
};
use crate::json::{decode_object, push_string, FieldSink};
use crate::key::{MeshKey, NodePrivate, NodePublic};
use crate::nacl::{BoxError, SharedKey, NONCE_LEN, OVERHEAD};
use serde::de::{Error as _, IgnoredAny, MapAccess};

/// Length of the whole `serverKey` frame the server sends.
pub const SERVER_KEY_FRAME_LEN: usize = HEADER_LEN + MAGIC.len() + KEY_LEN;
/// Smallest `serverKey` payload a client accepts (extra bytes are reserved).
pub const MIN_SERVER_KEY_LEN: usize = MAGIC.len() + KEY_LEN;
/// Largest `serverKey` payload a Go client reads.
pub const MAX_SERVER_KEY_LEN: usize = 1024;
/// Largest `serverInfo` payload a Go client reads (nonce + 1 MiB).
pub const MAX_SERVER_INFO_LEN: usize = NONCE_LEN + MAX_CLIENT_READ_FRAME;

/// Why JSON did not decode: the kind of problem, where, and the
/// decoder's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct JsonError {
    /// Syntax, a value of the wrong type, or input that ended early.
    pub kind: JsonErrorKind,
    /// 1-based line of the problem (0 when unknown).
    pub line: usize,
    /// 1-based column of the problem (0 when unknown).
    pub column: usize,
    /// serde_json's description, position included.
    pub message: String,
}

/// The kinds of [`JsonError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonErrorKind {
    /// Not JSON.
    Syntax,
    /// JSON, but a field has the wrong type or value.
    Data,
    /// The input ended inside a value.
    Eof,
}

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        use serde_json::error::Category;
        JsonError {
            kind: match e.classify() {
                Category::Data => JsonErrorKind::Data,
                Category::Eof => JsonErrorKind::Eof,
                Category::Syntax | Category::Io => JsonErrorKind::Syntax,
            },
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        }
    }
}

/// Why a handshake step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The frame payload is shorter than the handshake allows.
    #[error("{frame} frame too short: {len} bytes, minimum {min}")]
    TooShort {
        /// Name of the frame (`clientInfo`, `serverKey`, `serverInfo`).
        frame: &'static str,
        /// Payload length received.
        len: usize,
        /// Smallest allowed payload length.
        min: usize,
    },
    /// The frame payload is longer than the handshake allows.
    #[error("{frame} frame too long: {len} bytes, limit {max}")]
    TooLong {
        /// Name of the frame.
        frame: &'static str,
        /// Payload length received.
        len: usize,
        /// Largest allowed payload length.
        max: usize,
    },
    /// The client presented the all-zero public key
    /// (`docs/derp-protocol.md` §3).
    #[error("clientInfo frame carries the all-zero client key")]
    ZeroKey,
    /// The sealed box did not open: wrong keys, or altered bytes.
    #[error("{frame} box did not open: {source}")]
    BoxOpen {
        /// Name of the frame.
        frame: &'static str,
        /// What the box layer reported.
        #[source]
        source: BoxError,
    },
    /// The opened JSON is malformed or has a badly typed field (including a
    /// `meshKey` that is not 64 hex digits).
    #[error("invalid JSON in the {frame} frame: {source}")]
    Json {
        /// Name of the frame.
        frame: &'static str,
        /// The decoder's objection.
        #[source]
        source: JsonError,
    },
    /// The `serverKey` payload does not start with the `DERP🔑` magic.
    #[error("serverKey frame does not start with the DERP magic")]
    BadMagic,
    /// The clientInfo's `AppName` is not a valid application name
    /// ([`crate::app_name::valid_app_name`]).
    #[error("invalid AppName {shown}")]
    InvalidAppName {
        /// The name as the message shows it
        /// ([`crate::app_name::shown_app_name`]: quoted, cut at 40
        /// characters).
        shown: String,
    },
}

/// The `serverKey` frame: header, magic, the server's public key.
pub fn server_key_frame(server: &NodePublic) -> [u8; SERVER_KEY_FRAME_LEN] {
    let mut f = [0u8; SERVER_KEY_FRAME_LEN];
    f[..HEADER_LEN].copy_from_slice(&encode_header(
        FrameType::ServerKey as u8,
        MIN_SERVER_KEY_LEN as u32,
    ));
    f[HEADER_LEN..HEADER_LEN + MAGIC.len()].copy_from_slice(&MAGIC);
    f[HEADER_LEN + MAGIC.len()..].copy_from_slice(server.as_bytes());
    f
}

/// The JSON a client seals into `clientInfo` (`docs/derp-protocol.md` §7.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientInfo {
    /// Mesh pre-shared key; `None` for ordinary clients. An all-zero key in
    /// the JSON decodes as `None` (zero means "no key" in Go).
    pub mesh_key: Option<MeshKey>,
    /// The client's DERP protocol version (2 today); out-of-range JSON
    /// numbers saturate to the `u32` range.
    pub version: u32,
    /// The client answers server pings.
    pub can_ack_pings: bool,
    /// The client is a monitoring prober.
    pub is_prober: bool,
    /// Opaque application name; an empty string decodes as `None`. The
    /// server refuses an invalid one ([`crate::app_name`]).
    pub app_name: Option<String>,
    /// Ferry's relay-session capability (`"ferryRelay": 1`,
    /// `docs/relay-sessions.md` §1): the version the client speaks, 0 when
    /// it did not ask (omitted from the JSON).
    pub ferry_derp: u32,
    /// Ferry's mesh extension (`"ferryMesh": 1`, a mesh peer only,
    /// `docs/relay-sessions.md` §9.1): its version, 0 when not asked.
    pub ferry_mesh: u32,
}

impl ClientInfo {
    /// Encodes as Go does: `meshKey` (omitted when `None`), `version`
    /// (omitted when 0), `CanAckPings` (always), `IsProber` (omitted when
    /// false), `AppName` (omitted when empty).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(b'{');
        if let Some(k) = &self.mesh_key {
            out.extend_from_slice(b"\"meshKey\":\"");
            crate::hex::encode_bytes_into(&mut out, k.as_bytes());
            out.extend_from_slice(b"\",");
        }
        if self.version != 0 {
            out.extend_from_slice(format!("\"version\":{},", self.version).as_bytes());
        }
        out.extend_from_slice(if self.can_ack_pings {
            b"\"CanAckPings\":true"
        } else {
            b"\"CanAckPings\":false"
        });
        if self.is_prober {
            out.extend_from_slice(b",\"IsProber\":true");
        }
        if let Some(name) = self.app_name.as_deref().filter(|n| !n.is_empty()) {
            out.extend_from_slice(b",\"AppName\":");
            push_string(&mut out, name);
        }
        if self.ferry_derp != 0 {
            out.extend_from_slice(format!(",\"ferryRelay\":{}", self.ferry_derp).as_bytes());
        }
        if self.ferry_mesh != 0 {
            out.extend_from_slice(format!(",\"ferryMesh\":{}", self.ferry_mesh).as_bytes());
        }
        out.push(b'}');
        out
    }

    /// Decodes the JSON with Go's rules (case-insensitive keys, unknown keys
    /// ignored, `null` leaves a field at its default).
    pub fn from_json(json: &[u8]) -> Result<Self, HandshakeError> {
        decode_object(json).map_err(|e| HandshakeError::Json {
            frame: "clientInfo",
            source: e.into(),
        })
    }
}

/// Go's `int` fields accept any integer in range; read any JSON integer and
/// clamp it into the Rust field's range rather than fail.
fn saturate_u32(v: i128) -> u32 {
    v.clamp(0, i128::from(u32::MAX)) as u32
}

fn saturate_u64(v: i128) -> u64 {
    v.clamp(0, i128::from(u64::MAX)) as u64
}

impl FieldSink for ClientInfo {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "meshkey" => {
                if let Some(text) = map.next_value::<Option<String>>()? {
                    let bytes = crate::hex::decode32(&text)
                        .map_err(|_| A::Error::custom("meshKey must be exactly 64 hex digits"))?;
                    let key = MeshKey(bytes);
                    self.mesh_key = (!key.is_zero()).then_some(key);
                }
            }
            "version" => {
                if let Some(v) = map.next_value::<Option<i128>>()? {
                    self.version = saturate_u32(v);
                }
            }
            "canackpings" => {
                if let Some(v) = map.next_value::<Option<bool>>()? {
                    self.can_ack_pings = v;
                }
            }
            "isprober" => {
                if let Some(v) = map.next_value::<Option<bool>>()? {
                    self.is_prober = v;
                }
            }
            "appname" => {
                if let Some(v) = map.next_value::<Option<String>>()? {
                    self.app_name = (!v.is_empty()).then_some(v);
                }
            }
            "ferryrelay" => {
                // Anything but a number (a later version's object, say)
                // means this version cannot tell: no sessions.
                let v = map.next_value::<serde_json::Value>()?;
                self.ferry_derp = v.as_u64().map_or(0, |n| saturate_u32(n.into()));
            }
            "ferrymesh" => {
                let v = map.next_value::<serde_json::Value>()?;
                self.ferry_mesh = v.as_u64().map_or(0, |n| saturate_u32(n.into()));
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The JSON a server seals into `serverInfo` (`docs/derp-protocol.md` §7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerInfo {
    /// Server protocol version (2).
    pub version: u32,
    /// Advisory client send rate in bytes per second (0 = unspecified).
    pub token_bucket_bytes_per_second: u64,
    /// Burst for the above. If set it must exceed one maximum frame (65 573
    /// bytes) or Go clients can never send large packets
    /// (`docs/derp-protocol.md` §19.15).
    pub token_bucket_bytes_burst: u64,
    /// Ferry's relay sessions (`"ferryRelay": {"version": 1, "port": P}`),
    /// only for clients that asked; `None` when absent or malformed.
    pub ferry_derp: Option<RelayCapability>,
    /// Ferry's mesh extension (`"ferryMesh": {"version": 1}`), only for
    /// mesh peers that asked; `None` when absent or malformed.
    pub ferry_mesh: Option<MeshCapability>,
}

/// The mesh extension a Ferry node puts in serverInfo for a mesh peer
/// that asked (`docs/relay-sessions.md` §9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct MeshCapability {
    /// Version of the extension the node speaks (1).
    pub version: u32,
}

/// The relay-session capability a Ferry relay puts in serverInfo
/// (`docs/relay-sessions.md` §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct RelayCapability {
    /// Version of relay sessions the relay speaks (1).
    pub version: u32,
    /// The relay's session UDP port.
    pub port: u16,
}

impl ServerInfo {
    /// What the Go server sends: `{"version":2}`.
    pub const fn current() -> Self {
        ServerInfo {
            version: crate::frame::PROTOCOL_VERSION,
            token_bucket_bytes_per_second: 0,
            token_bucket_bytes_burst: 0,
            ferry_derp: None,
            ferry_mesh: None,
        }
    }

    /// Encodes as Go does, omitting zero fields.
    pub fn to_json(&self) -> Vec<u8> {
        let mut fields = Vec::with_capacity(3);
        if self.version != 0 {
            fields.push(format!("\"version\":{}", self.version));
        }
        if self.token_bucket_bytes_per_second != 0 {
            fields.push(format!(
                "\"TokenBucketBytesPerSecond\":{}",
                self.token_bucket_bytes_per_second
            ));
        }
        if self.token_bucket_bytes_burst != 0 {
            fields.push(format!(
                "\"TokenBucketBytesBurst\":{}",
                self.token_bucket_bytes_burst
            ));
        }
        if let Some(r) = self.ferry_derp {
            fields.push(format!(
                "\"ferryRelay\":{{\"version\":{},\"port\":{}}}",
                r.version, r.port
            ));
        }
        if let Some(m) = self.ferry_mesh {
            fields.push(format!("\"ferryMesh\":{{\"version\":{}}}", m.version));
        }
        format!("{{{}}}", fields.join(",")).into_bytes()
    }

    /// Decodes with Go's rules, like [`ClientInfo::from_json`].
    pub fn from_json(json: &[u8]) -> Result<Self, HandshakeError> {
        decode_object(json).map_err(|e| HandshakeError::Json {
            frame: "serverInfo",
            source: e.into(),
        })
    }
}

impl FieldSink for ServerInfo {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let slot = match key {
            "version" => {
                if let Some(v) = map.next_value::<Option<i128>>()? {
                    self.version = saturate_u32(v);
                }
                return Ok(());
            }
            "tokenbucketbytespersecond" => &mut self.token_bucket_bytes_per_second,
            "tokenbucketbytesburst" => &mut self.token_bucket_bytes_burst,
            "ferryrelay" => {
                let v = map.next_value::<serde_json::Value>()?;
                self.ferry_derp = serde_json::from_value(v).ok();
                return Ok(());
            }
            "ferrymesh" => {
                let v = map.next_value::<serde_json::Value>()?;
                self.ferry_mesh = serde_json::from_value(v).ok();
                return Ok(());
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
                return Ok(());
            }
        };
        if let Some(v) = map.next_value::<Option<i128>>()? {
            *slot = saturate_u64(v);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Server side

/// Opens a `clientInfo` payload (the frame after its 5-byte header):
/// checks 56 ..= 262 144 bytes, rejects the all-zero key, opens the box
/// sealed from the client's key to `server`, decodes the JSON, and refuses
/// an invalid `AppName` (mesh peers included).
pub fn open_client_info(
    server: &NodePrivate,
    payload: &[u8],
) -> Result<(NodePublic, ClientInfo), HandshakeError> {
    open_client_info_keyed(server, payload).map(|(k, info, _)| (k, info))
}

/// Like [`open_client_info`], also returning the precomputed box key so
/// [`seal_server_info_keyed`] need not repeat the X25519.
pub fn open_client_info_keyed(
    server: &NodePrivate,
    payload: &[u8],
) -> Result<(NodePublic, ClientInfo, SharedKey), HandshakeError> {
    const FRAME: &str = "clientInfo";
    let len = payload.len();
    if len < MIN_CLIENT_INFO_LEN {
        return Err(HandshakeError::TooShort {
            frame: FRAME,
            len,
            min: MIN_CLIENT_INFO_LEN,
        });
    }
    if len > MAX_CLIENT_INFO_LEN {
        return Err(HandshakeError::TooLong {
            frame: FRAME,
            len,
            max: MAX_CLIENT_INFO_LEN,
        });
    }
    let (key, sealed) = payload.split_at(KEY_LEN);
    let client = NodePublic::try_from(key).expect("split at KEY_LEN");
    if client.is_zero() {
        return Err(HandshakeError::ZeroKey);
    }
    let shared = SharedKey::new(server, &client);
    let json = shared
        .open(sealed)
        .map_err(|source| HandshakeError::BoxOpen {
            frame: FRAME,
            source,
        })?;
    let info = ClientInfo::from_json(&json)?;
    if let Some(name) = info.app_name.as_deref() {
        if !crate::app_name::valid_app_name(name.as_bytes()) {
            return Err(HandshakeError::InvalidAppName {
                shown: crate::app_name::shown_app_name(name),
            });
        }
    }
    Ok((client, info, shared))
}

/// The whole `serverInfo` frame (header included), sealed from `server` to
/// `client` with `nonce` (use [`crate::nacl::random_nonce`]).
pub fn seal_server_info(
    server: &NodePrivate,
    client: &NodePublic,
    info: &ServerInfo,
    nonce: &[u8; NONCE_LEN],
) -> Vec<u8> {
    seal_server_info_keyed(&SharedKey::new(server, client), info, nonce)
}

/// [`seal_server_info`] with the key from [`open_client_info_keyed`].
pub fn seal_server_info_keyed(
    shared: &SharedKey,
    info: &ServerInfo,
    nonce: &[u8; NONCE_LEN],
) -> Vec<u8> {
    let json = info.to_json();
    let payload_len = OVERHEAD + json.len();
    let mut out = Vec::with_capacity(HEADER_LEN + payload_len);
    out.extend_from_slice(&encode_header(
        FrameType::ServerInfo as u8,
        payload_len as u32,
    ));
    shared.seal_into(&mut out, nonce, &json);
    out
}

// ---------------------------------------------------------------------------
// Client side

/// Reads the server key from a `serverKey` payload: at least 40 bytes (at
/// most 1 024, as Go clients read), starting with the magic.
pub fn parse_server_key(payload: &[u8]) -> Result<NodePublic, HandshakeError> {
    const FRAME: &str = "serverKey";
    let len = payload.len();
    if len < MIN_SERVER_KEY_LEN {
        return Err(HandshakeError::TooShort {
            frame: FRAME,
            len,
            min: MIN_SERVER_KEY_LEN,
        });
    }
    if len > MAX_SERVER_KEY_LEN {
        return Err(HandshakeError::TooLong {
            frame: FRAME,
            len,
            max: MAX_SERVER_KEY_LEN,
        });
    }
    if !payload.starts_with(&MAGIC) {
        return Err(HandshakeError::BadMagic);
    }
    Ok(NodePublic::try_from(&payload[MAGIC.len()..MIN_SERVER_KEY_LEN]).expect("length checked"))
}

/// The whole `clientInfo` frame (header included): the client's public key
/// and `info` sealed from `client` to `server` with `nonce`.
pub fn seal_client_info(
    client: &NodePrivate,
    server: &NodePublic,
    info: &ClientInfo,
    nonce: &[u8; NONCE_LEN],
) -> Vec<u8> {
    let mut out = Vec::new();
    put_client_info(
        &mut out,
        &client.public(),
        &SharedKey::new(client, server),
        info,
        nonce,
    );
    out
}

/// Appends the whole `clientInfo` frame to `out`: `client` (the public key)
/// and `info` sealed with the precomputed box key `shared` (client private,
/// server public) and `nonce`. [`seal_client_info`] without the X25519.
pub fn put_client_info(
    out: &mut Vec<u8>,
    client: &NodePublic,
    shared: &SharedKey,
    info: &ClientInfo,
    nonce: &[u8; NONCE_LEN],
) {
    let json = info.to_json();
    let payload_len = KEY_LEN + OVERHEAD + json.len();
    out.reserve(HEADER_LEN + payload_len);
    out.extend_from_slice(&encode_header(
        FrameType::ClientInfo as u8,
        payload_len as u32,
    ));
    out.extend_from_slice(client.as_bytes());
    shared.seal_into(out, nonce, &json);
}

/// Opens a `serverInfo` payload sealed from `server` to `client` and decodes
/// its JSON.
pub fn open_server_info(
    client: &NodePrivate,
    server: &NodePublic,
    payload: &[u8],
) -> Result<ServerInfo, HandshakeError> {
    open_server_info_keyed(&SharedKey::new(client, server), payload)
}

/// [`open_server_info`] with the precomputed box key (client private, server
/// public): checks 24 ..= 24 + 1 MiB bytes, opens the box, decodes the JSON.
pub fn open_server_info_keyed(
    shared: &SharedKey,
    payload: &[u8],
) -> Result<ServerInfo, HandshakeError> {
    const FRAME: &str = "serverInfo";
    let len = payload.len();
    if len < NONCE_LEN {
        return Err(HandshakeError::TooShort {
            frame: FRAME,
            len,
            min: NONCE_LEN,
        });
    }
    if len > MAX_SERVER_INFO_LEN {
        return Err(HandshakeError::TooLong {
            frame: FRAME,
            len,
            max: MAX_SERVER_INFO_LEN,
        });
    }
    let json = shared
        .open(payload)
        .map_err(|source| HandshakeError::BoxOpen {
            frame: FRAME,
            source,
        })?;
    ServerInfo::from_json(&json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{
        client_private, key_c, key_s, server_private, unhex, CLIENT_INFO_FRAME, SERVER_INFO_FRAME,
    };

    fn tailscaled_info() -> ClientInfo {
        ClientInfo {
            version: 2,
            can_ack_pings: true,
            ..ClientInfo::default()
        }
    }

    #[test]
    fn server_key_vector() {
        let want = unhex(
            "0100000028 | 44455250f09f9491
             07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c",
        );
        assert_eq!(server_key_frame(&key_s())[..], want[..]);
        assert_eq!(parse_server_key(&want[HEADER_LEN..]), Ok(key_s()));
        assert_eq!(server_private().public(), key_s());
    }

    #[test]
    fn client_info_vector() {
        let nonce: [u8; 24] = core::array::from_fn(|i| i as u8);
        let want = unhex(CLIENT_INFO_FRAME);
        assert_eq!(want.len(), 109);
        assert_eq!(
            tailscaled_info().to_json(),
            br#"{"version":2,"CanAckPings":true}"#
        );
        let frame = seal_client_info(&client_private(), &key_s(), &tailscaled_info(), &nonce);
        assert_eq!(frame, want);
        let (client, info) = open_client_info(&server_private(), &want[HEADER_LEN..]).unwrap();
        assert_eq!(client, key_c());
        assert_eq!(info, tailscaled_info());
    }

    #[test]
    fn server_info_vector() {
        let nonce: [u8; 24] = core::array::from_fn(|i| 0xa0 + i as u8);
        let want = unhex(SERVER_INFO_FRAME);
        assert_eq!(want.len(), 58);
        let frame = seal_server_info(&server_private(), &key_c(), &ServerInfo::current(), &nonce);
        assert_eq!(frame, want);
        let info = open_server_info(&client_private(), &key_s(), &want[HEADER_LEN..]).unwrap();
        assert_eq!(info, ServerInfo::current());
        // The keyed variants produce the same bytes.
        let (_, _, shared) =
            open_client_info_keyed(&server_private(), &unhex(CLIENT_INFO_FRAME)[HEADER_LEN..])
                .unwrap();
        assert_eq!(
            seal_server_info_keyed(&shared, &ServerInfo::current(), &nonce),
            want
        );
    }

    #[test]
    fn client_info_rejections() {
        let server = server_private();
        let good = unhex(CLIENT_INFO_FRAME)[HEADER_LEN..].to_vec();
        assert_eq!(
            open_client_info(&server, &good[..55]),
            Err(HandshakeError::TooShort {
                frame: "clientInfo",
                len: 55,
                min: 56
            })
        );
        assert!(matches!(
            open_client_info(&server, &vec![1u8; 262_145]),
            Err(HandshakeError::TooLong { max: 262_144, .. })
        ));
        let mut zero = good.clone();
        zero[..32].fill(0);
        assert_eq!(
            open_client_info(&server, &zero),
            Err(HandshakeError::ZeroKey)
        );
        // 56 bytes: a key and a nonce, but no room for a tag.
        assert!(matches!(
            open_client_info(&server, &good[..56]),
            Err(HandshakeError::BoxOpen {
                source: BoxError::TooShort { .. },
                ..
            })
        ));
        let mut tampered = good.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(
            open_client_info(&server, &tampered),
            Err(HandshakeError::BoxOpen {
                source: BoxError::AuthFailed,
                ..
            })
        ));
        // Sealed to a different server key.
        assert!(matches!(
            open_client_info(&NodePrivate::generate(), &good),
            Err(HandshakeError::BoxOpen { .. })
        ));
        // A valid box holding invalid JSON.
        let frame = {
            let mut f = key_c().as_bytes().to_vec();
            SharedKey::new(&client_private(), &key_s()).seal_into(
                &mut f,
                &[0; 24],
                b"{\"meshKey\":\"\"}",
            );
            f
        };
        assert!(matches!(
            open_client_info(&server, &frame),
            Err(HandshakeError::Json {
                frame: "clientInfo",
                source: JsonError {
                    kind: JsonErrorKind::Data,
                    line: 1,
                    ..
                }
            })
        ));
    }

    #[test]
    fn client_info_app_name_edges() {
        let server = server_private();
        let open = |name: &str| {
            let info = ClientInfo {
                app_name: Some(name.into()),
                ..tailscaled_info()
            };
            let mut f = key_c().as_bytes().to_vec();
            SharedKey::new(&client_private(), &key_s()).seal_into(
                &mut f,
                &[0; 24],
                &info.to_json(),
            );
            open_client_info(&server, &f).map(|(_, i)| i.app_name)
        };
        assert_eq!(open(""), Ok(None));
        for n in [31, 32] {
            assert_eq!(open(&"a".repeat(n)), Ok(Some("a".repeat(n))));
        }
        assert_eq!(open(" ~"), Ok(Some(" ~".into())));
        let refused = |name: &str| HandshakeError::InvalidAppName {
            shown: crate::app_name::shown_app_name(name),
        };
        assert_eq!(open(&"a".repeat(33)), Err(refused(&"a".repeat(33))));
        assert_eq!(open("a\x1f"), Err(refused("a\x1f")));
        assert_eq!(open("a\x7f"), Err(refused("a\x7f")));
        let long = "z".repeat(50);
        assert_eq!(
            open(&long).unwrap_err().to_string(),
            format!("invalid AppName \"{}\"", "z".repeat(40))
        );
        assert_eq!(
            open("bad\nname").unwrap_err().to_string(),
            r#"invalid AppName "bad\nname""#
        );
    }

    #[test]
    fn client_info_json_go_examples() {
        let mesh = MeshKey([0xab; 32]);
        let mesh_client = ClientInfo {
            mesh_key: Some(mesh.clone()),
            version: 2,
            ..ClientInfo::default()
        };
        let want = format!(
            "{{\"meshKey\":\"{}\",\"version\":2,\"CanAckPings\":false}}",
            "ab".repeat(32)
        );
        assert_eq!(String::from_utf8(mesh_client.to_json()).unwrap(), want);
        assert_eq!(ClientInfo::from_json(want.as_bytes()).unwrap(), mesh_client);

        let prober = ClientInfo {
            version: 2,
            is_prober: true,
            ..ClientInfo::default()
        };
        assert_eq!(
            prober.to_json(),
            br#"{"version":2,"CanAckPings":false,"IsProber":true}"#
        );
        let app = ClientInfo {
            app_name: Some("fe\"rry".into()),
            ..ClientInfo::default()
        };
        assert_eq!(
            app.to_json(),
            br#"{"CanAckPings":false,"AppName":"fe\"rry"}"#
        );
        assert_eq!(ClientInfo::from_json(&app.to_json()).unwrap(), app);
        let empty_app = ClientInfo {
            app_name: Some(String::new()),
            ..ClientInfo::default()
        };
        assert_eq!(empty_app.to_json(), br#"{"CanAckPings":false}"#);
    }

    #[test]
    fn client_info_json_decoding_rules() {
        let d = |s: &str| ClientInfo::from_json(s.as_bytes());
        // Case-insensitive keys, unknown keys ignored.
        assert_eq!(
            d(r#"{"VERSION":2,"canackpings":true,"isPROBER":true,"appname":"x","Future":{"a":[1]}}"#)
                .unwrap(),
            ClientInfo {
                version: 2,
                can_ack_pings: true,
                is_prober: true,
                app_name: Some("x".into()),
                mesh_key: None,
                ferry_derp: 0,
                ferry_mesh: 0,
            }
        );
        // Later duplicates win; null leaves a field alone.
        assert_eq!(d(r#"{"version":1,"Version":3}"#).unwrap().version, 3);
        assert_eq!(d(r#"{"version":1,"version":null}"#).unwrap().version, 1);
        assert_eq!(d("null").unwrap(), ClientInfo::default());
        assert_eq!(d("{}").unwrap(), ClientInfo::default());
        // meshKey: 64 hex or error; empty string is an error; zero is none.
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(
            d(&format!(r#"{{"meshkey":"{}"}}"#, hex.to_uppercase()))
                .unwrap()
                .mesh_key,
            Some(MeshKey::parse(&hex).unwrap())
        );
        assert!(d(r#"{"meshKey":""}"#).is_err());
        assert!(d(&format!(r#"{{"meshKey":"{}"}}"#, &hex[1..])).is_err());
        assert!(d(r#"{"meshKey":5}"#).is_err());
        assert_eq!(
            d(&format!(r#"{{"meshKey":"{}"}}"#, "0".repeat(64)))
                .unwrap()
                .mesh_key,
            None
        );
        // Type errors and malformed documents.
        assert!(d(r#"{"version":"2"}"#).is_err());
        assert!(d(r#"{"version":2.5}"#).is_err());
        assert!(d(r#"{"CanAckPings":1}"#).is_err());
        assert!(d(r#"{"version":2} {}"#).is_err());
        assert!(d("[]").is_err());
        assert!(d("").is_err());
        // Out-of-range versions saturate rather than fail, as Go's int would
        // accept them.
        assert_eq!(d(r#"{"version":-1}"#).unwrap().version, 0);
        assert_eq!(d(r#"{"version":99999999999}"#).unwrap().version, u32::MAX);
    }

    #[test]
    fn server_info_json() {
        assert_eq!(ServerInfo::current().to_json(), br#"{"version":2}"#);
        assert_eq!(ServerInfo::default().to_json(), b"{}");
        let limited = ServerInfo {
            version: 2,
            token_bucket_bytes_per_second: 1000,
            token_bucket_bytes_burst: 70000,
            ferry_derp: None,
            ferry_mesh: None,
        };
        assert_eq!(
            limited.to_json(),
            br#"{"version":2,"TokenBucketBytesPerSecond":1000,"TokenBucketBytesBurst":70000}"#
        );
        assert_eq!(ServerInfo::from_json(&limited.to_json()).unwrap(), limited);
        assert_eq!(
            ServerInfo::from_json(br#"{"tokenbucketbytesburst":5,"x":1}"#).unwrap(),
            ServerInfo {
                token_bucket_bytes_burst: 5,
                ..ServerInfo::default()
            }
        );
    }

    #[test]
    fn relay_session_capability_json() {
        // docs/relay-sessions.md §1.
        let ask = ClientInfo {
            version: 2,
            can_ack_pings: true,
            ferry_derp: 1,
            ..ClientInfo::default()
        };
        assert_eq!(
            ask.to_json(),
            br#"{"version":2,"CanAckPings":true,"ferryRelay":1}"#
        );
        assert_eq!(ClientInfo::from_json(&ask.to_json()).unwrap(), ask);
        let odd = ClientInfo::from_json(br#"{"ferryRelay":{"v":2}}"#).unwrap();
        assert_eq!(odd.ferry_derp, 0);
        let offer = ServerInfo {
            ferry_derp: Some(RelayCapability {
                version: 1,
                port: 3479,
            }),
            ..ServerInfo::current()
        };
        assert_eq!(
            offer.to_json(),
            br#"{"version":2,"ferryRelay":{"version":1,"port":3479}}"#
        );
        assert_eq!(ServerInfo::from_json(&offer.to_json()).unwrap(), offer);
        let bad = ServerInfo::from_json(br#"{"version":2,"ferryRelay":1}"#).unwrap();
        assert_eq!(bad, ServerInfo::current());
    }

    #[test]
    fn server_key_rejections() {
        let mut p = MAGIC.to_vec();
        p.extend_from_slice(key_s().as_bytes());
        assert!(matches!(
            parse_server_key(&p[..39]),
            Err(HandshakeError::TooShort { min: 40, .. })
        ));
        p.extend_from_slice(&[0; 100]);
        assert_eq!(parse_server_key(&p), Ok(key_s()), "future bytes ignored");
        p.resize(1025, 0);
        assert!(matches!(
            parse_server_key(&p),
            Err(HandshakeError::TooLong { max: 1024, .. })
        ));
        p.truncate(40);
        p[7] = 0;
        assert_eq!(parse_server_key(&p), Err(HandshakeError::BadMagic));
    }

    #[test]
    fn server_info_rejections() {
        let c = client_private();
        assert!(matches!(
            open_server_info(&c, &key_s(), &[0; 23]),
            Err(HandshakeError::TooShort { min: 24, .. })
        ));
        assert!(matches!(
            open_server_info(&c, &key_s(), &[0; 30]),
            Err(HandshakeError::BoxOpen { .. })
        ));
        let frame = seal_server_info(
            &server_private(),
            &key_c(),
            &ServerInfo::current(),
            &[9; 24],
        );
        // Wrong server key.
        assert!(matches!(
            open_server_info(&c, &key_c(), &frame[HEADER_LEN..]),
            Err(HandshakeError::BoxOpen { .. })
        ));
    }

    #[test]
    fn full_handshake_with_random_keys() {
        let server = NodePrivate::generate();
        let client = NodePrivate::generate();
        let info = ClientInfo {
            mesh_key: Some(MeshKey([7; 32])),
            version: 2,
            can_ack_pings: false,
            is_prober: true,
            app_name: Some("ferry-test".into()),
            ferry_derp: 1,
            ferry_mesh: 0,
        };
        let sk = server_key_frame(&server.public());
        let learned = parse_server_key(&sk[HEADER_LEN..]).unwrap();
        let ci = seal_client_info(&client, &learned, &info, &crate::nacl::random_nonce());
        let (ty, len) = crate::frame::decode_header(&ci).unwrap();
        assert_eq!((ty, len as usize), (2, ci.len() - HEADER_LEN));
        let (who, got) = open_client_info(&server, &ci[HEADER_LEN..]).unwrap();
        assert_eq!((who, &got), (client.public(), &info));
        let si = seal_server_info(
            &server,
            &who,
            &ServerInfo::current(),
            &crate::nacl::random_nonce(),
        );
        assert_eq!(
            open_server_info(&client, &learned, &si[HEADER_LEN..]).unwrap(),
            ServerInfo::current()
        );
    }
}
