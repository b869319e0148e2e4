//! DERP over WebSocket (RFC 6455), both sides, without I/O.
//!
//! A client that cannot speak raw DERP (a browser, a network that only
//! lets WebSocket through) asks for `Upgrade: websocket` with the `derp`
//! subprotocol on `/derp`. After [`accept_response`] the DERP byte stream
//! travels in binary messages whose boundaries mean nothing: [`Decoder`]
//! unmasks the client's frames and hands the payload bytes on in order,
//! answering pings and closes; [`put_binary_header`] frames what the server
//! writes. Text messages, reserved bits, unmasked or oversized frames and
//! malformed control frames are protocol errors ([`WsError`]), after which
//! the connection closes.
//!
//! The client's side (the SDK): [`upgrade_request`] asks for the upgrade,
//! [`parse_upgrade_response`] checks the server's `101` (status, accept key,
//! subprotocol), [`Decoder::for_client`] reads the server's unmasked frames,
//! and [`put_client_frame`] writes masked ones.

use base64::Engine as _;
use sha1::{Digest, Sha1};

/// The GUID RFC 6455 mixes into `Sec-WebSocket-Accept`.
const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Largest payload of one client frame accepted. Clients write one frame
/// per write call (Tailscale's: at most one DERP frame, 64 KiB and a bit);
/// a longer frame is refused rather than streamed without bound.
pub const MAX_FRAME_PAYLOAD: u64 = 1 << 20;
/// Largest message the server writes. Tailscale's WebSocket library reads
/// messages of at most 32 KiB by default, so server output is cut into
/// messages no longer than this.
pub const MAX_SERVER_MESSAGE: usize = 16 * 1024;
/// Largest control frame payload (RFC 6455 §5.5).
const MAX_CONTROL: usize = 125;

/// Opcodes.
const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// Close codes the server sends.
pub mod close_code {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// Protocol error.
    pub const PROTOCOL_ERROR: u16 = 1002;
    /// Data the endpoint cannot accept (a text message).
    pub const UNSUPPORTED_DATA: u16 = 1003;
    /// A message too big to process.
    pub const TOO_BIG: u16 = 1009;
}

/// Why a client's frames broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    /// A text message: DERP travels in binary messages only.
    #[error("text WebSocket message (DERP uses binary messages)")]
    Text,
    /// Reserved bits set (no extension was negotiated).
    #[error("WebSocket frame with reserved bits {0:#x} set")]
    Reserved(u8),
    /// A client frame without a mask.
    #[error("unmasked WebSocket frame from the client")]
    Unmasked,
    /// A server frame with a mask (servers must not mask, RFC 6455 §5.1).
    #[error("masked WebSocket frame from the server")]
    Masked,
    /// The answer to the upgrade request is not a `101` that accepts this
    /// key with the `derp` subprotocol.
    #[error("WebSocket upgrade refused: {0}")]
    Upgrade(String),
    /// An opcode RFC 6455 does not define.
    #[error("unknown WebSocket opcode {0:#x}")]
    Opcode(u8),
    /// A control frame that is fragmented or longer than 125 bytes.
    #[error("malformed WebSocket control frame (opcode {0:#x})")]
    Control(u8),
    /// A continuation frame outside a message, or a new message before
    /// the last one ended.
    #[error("WebSocket fragments out of order")]
    Fragment,
    /// A frame longer than [`MAX_FRAME_PAYLOAD`] (or a 64-bit length with
    /// its top bit set).
    #[error("WebSocket frame of {len} bytes exceeds {max}")]
    TooLarge {
        /// The length the frame declares.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A close frame with a one-byte payload or a reason that is not UTF-8.
    #[error("malformed WebSocket close frame")]
    BadClose,
}

impl WsError {
    /// The close code to answer this error with.
    pub fn close_code(&self) -> u16 {
        match self {
            WsError::Text => close_code::UNSUPPORTED_DATA,
            WsError::TooLarge { .. } => close_code::TOO_BIG,
            _ => close_code::PROTOCOL_ERROR,
        }
    }
}

/// A control frame the peer sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlFrame {
    /// Answer with a pong carrying the same bytes.
    Ping(Vec<u8>),
    /// A pong (ignored).
    Pong,
    /// The client closes; answer with a close and end the connection.
    Close(Option<u16>),
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(client_key: &str) -> String {
    let mut h = Sha1::new();
    h.update(client_key.trim().as_bytes());
    h.update(ACCEPT_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// The 101 response that switches to WebSocket with the `derp`
/// subprotocol.
pub fn accept_response(client_key: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\nSec-WebSocket-Protocol: derp\r\n\r\n",
        accept_key(client_key)
    )
    .into_bytes()
}

/// Appends the header of one unmasked, final binary frame of `len` bytes.
pub fn put_binary_header(out: &mut Vec<u8>, len: usize) {
    put_header(out, BINARY, len);
}

fn put_header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(0x80 | opcode);
    match len {
        0..=125 => out.push(len as u8),
        126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
}

/// Appends `data` as binary messages of at most [`MAX_SERVER_MESSAGE`]
/// bytes each.
pub fn put_binary(out: &mut Vec<u8>, data: &[u8]) {
    for chunk in data.chunks(MAX_SERVER_MESSAGE) {
        put_binary_header(out, chunk.len());
        out.extend_from_slice(chunk);
    }
}

/// Appends the concatenation of `parts` as binary messages of at most
/// [`MAX_SERVER_MESSAGE`] bytes each (a message may span parts).
pub fn put_binary_parts(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let mut left: usize = parts.iter().map(|p| p.len()).sum();
    let mut parts = parts.iter().copied().filter(|p| !p.is_empty());
    let mut current: &[u8] = &[];
    while left > 0 {
        let message = left.min(MAX_SERVER_MESSAGE);
        put_binary_header(out, message);
        let mut need = message;
        while need > 0 {
            if current.is_empty() {
                current = parts.next().expect("the parts hold `left` bytes");
            }
            let n = need.min(current.len());
            out.extend_from_slice(&current[..n]);
            current = &current[n..];
            need -= n;
        }
        left -= message;
    }
}

/// Appends a pong answering a ping with `payload`.
pub fn put_pong(out: &mut Vec<u8>, payload: &[u8]) {
    let payload = &payload[..payload.len().min(MAX_CONTROL)];
    put_header(out, PONG, payload.len());
    out.extend_from_slice(payload);
}

/// Appends a close frame with `code`.
pub fn put_close(out: &mut Vec<u8>, code: u16) {
    put_header(out, CLOSE, 2);
    out.extend_from_slice(&code.to_be_bytes());
}

/// Where the decoder is within the client's frames.
#[derive(Debug)]
enum State {
    /// Reading a header (up to 14 bytes).
    Header,
    /// Payload of a data frame still to come.
    Data { remaining: u64 },
    /// Payload of a control frame, collected whole.
    Control { opcode: u8, len: usize },
}

/// Reads the peer's frames: a server reads masked client frames
/// ([`Decoder::new`]), a client reads unmasked server frames
/// ([`Decoder::for_client`]).
#[derive(Debug)]
pub struct Decoder {
    /// Frames carry a mask (the server's side).
    masked: bool,
    state: State,
    header: [u8; 14],
    have: usize,
    mask: [u8; 4],
    mask_pos: usize,
    control: Vec<u8>,
    /// Inside a fragmented binary message.
    in_message: bool,
    poisoned: Option<WsError>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    /// A server's decoder of client frames, at the start of the stream.
    pub fn new() -> Self {
        Decoder {
            masked: true,
            state: State::Header,
            header: [0; 14],
            have: 0,
            mask: [0; 4],
            mask_pos: 0,
            control: Vec::new(),
            in_message: false,
            poisoned: None,
        }
    }

    /// A client's decoder of server frames (unmasked; a masked one is
    /// [`WsError::Masked`]), at the start of the stream.
    pub fn for_client() -> Self {
        Decoder {
            masked: false,
            ..Decoder::new()
        }
    }

    /// Feeds bytes read from the peer: unmasked payload bytes of binary
    /// messages are appended to `data`, control frames go to `on_control`
    /// as they complete. After an error every later call returns it.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        data: &mut Vec<u8>,
        mut on_control: impl FnMut(ControlFrame),
    ) -> Result<(), WsError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        while !input.is_empty() {
            let step = match self.state {
                State::Header => self.read_header(&mut input),
                State::Data { remaining } => {
                    let n = (remaining.min(input.len() as u64)) as usize;
                    let start = data.len();
                    data.extend_from_slice(&input[..n]);
                    self.unmask(&mut data[start..]);
                    input = &input[n..];
                    self.state = if remaining == n as u64 {
                        State::Header
                    } else {
                        State::Data {
                            remaining: remaining - n as u64,
                        }
                    };
                    Ok(())
                }
                State::Control { opcode, len } => {
                    let n = (len - self.control.len()).min(input.len());
                    let start = self.control.len();
                    self.control.extend_from_slice(&input[..n]);
                    let mut payload = std::mem::take(&mut self.control);
                    self.unmask(&mut payload[start..]);
                    self.control = payload;
                    input = &input[n..];
                    if self.control.len() == len {
                        self.state = State::Header;
                        let payload = std::mem::take(&mut self.control);
                        match control_frame(opcode, payload) {
                            Ok(c) => {
                                on_control(c);
                                Ok(())
                            }
                            Err(e) => Err(e),
                        }
                    } else {
                        Ok(())
                    }
                }
            };
            if let Err(e) = step {
                self.poisoned = Some(e.clone());
                return Err(e);
            }
        }
        // A zero-length frame whose header just ended.
        if let State::Control { opcode, len: 0 } = self.state {
            self.state = State::Header;
            match control_frame(opcode, Vec::new()) {
                Ok(c) => on_control(c),
                Err(e) => {
                    self.poisoned = Some(e.clone());
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn unmask(&mut self, bytes: &mut [u8]) {
        for b in bytes {
            *b ^= self.mask[self.mask_pos & 3];
            self.mask_pos += 1;
        }
    }

    fn read_header(&mut self, input: &mut &[u8]) -> Result<(), WsError> {
        // The header's length is known after two bytes.
        let mask_len = if self.masked { 4 } else { 0 };
        let need = |h: &[u8], have: usize| -> usize {
            if have < 2 {
                return 2;
            }
            2 + match h[1] & 0x7f {
                126 => 2,
                127 => 8,
                _ => 0,
            } + mask_len
        };
        while self.have < need(&self.header, self.have) && !input.is_empty() {
            self.header[self.have] = input[0];
            self.have += 1;
            *input = &input[1..];
            if self.have == 2 {
                self.check_first_two()?;
            }
        }
        let total = need(&self.header, self.have);
        if self.have < total {
            return Ok(());
        }
        let h = self.header;
        let opcode = h[0] & 0x0f;
        let len = match h[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            127 => u64::from_be_bytes(h[2..10].try_into().expect("8 bytes")),
            n => u64::from(n),
        };
        if self.masked {
            self.mask.copy_from_slice(&h[total - 4..total]);
        }
        self.mask_pos = 0;
        self.have = 0;
        if opcode >= 0x8 {
            // Checked in check_first_two: at most 125.
            self.state = State::Control {
                opcode,
                len: len as usize,
            };
            return Ok(());
        }
        if len > MAX_FRAME_PAYLOAD {
            return Err(WsError::TooLarge {
                len,
                max: MAX_FRAME_PAYLOAD,
            });
        }
        let fin = h[0] & 0x80 != 0;
        self.in_message = !fin;
        self.state = if len == 0 {
            State::Header
        } else {
            State::Data { remaining: len }
        };
        Ok(())
    }

    /// Checks what the first two header bytes say, before reading more.
    fn check_first_two(&mut self) -> Result<(), WsError> {
        let (b0, b1) = (self.header[0], self.header[1]);
        let reserved = b0 & 0x70;
        if reserved != 0 {
            return Err(WsError::Reserved(reserved >> 4));
        }
        match (b1 & 0x80 != 0, self.masked) {
            (false, true) => return Err(WsError::Unmasked),
            (true, false) => return Err(WsError::Masked),
            _ => {}
        }
        let fin = b0 & 0x80 != 0;
        match b0 & 0x0f {
            TEXT => return Err(WsError::Text),
            BINARY if self.in_message => return Err(WsError::Fragment),
            CONTINUATION if !self.in_message => return Err(WsError::Fragment),
            BINARY | CONTINUATION => {}
            op @ (CLOSE | PING | PONG) => {
                if !fin || (b1 & 0x7f) as usize > MAX_CONTROL {
                    return Err(WsError::Control(op));
                }
            }
            op => return Err(WsError::Opcode(op)),
        }
        Ok(())
    }
}

fn control_frame(opcode: u8, payload: Vec<u8>) -> Result<ControlFrame, WsError> {
    match opcode {
        PING => Ok(ControlFrame::Ping(payload)),
        PONG => Ok(ControlFrame::Pong),
        _ => match payload.len() {
            0 => Ok(ControlFrame::Close(None)),
            1 => Err(WsError::BadClose),
            _ => {
                if std::str::from_utf8(&payload[2..]).is_err() {
                    return Err(WsError::BadClose);
                }
                Ok(ControlFrame::Close(Some(u16::from_be_bytes([
                    payload[0], payload[1],
                ]))))
            }
        },
    }
}

/// A client frame, masked with `mask` (tests and the fuzz target build
/// client streams with it).
pub fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    put_client_frame(&mut out, fin, opcode, payload, mask);
    out
}

/// Appends one client frame (`opcode` 0x2 binary, 0xA pong, 0x8 close, …)
/// carrying `payload`, masked with `mask`, which must be fresh random
/// bytes for every frame (RFC 6455 §5.3).
pub fn put_client_frame(out: &mut Vec<u8>, fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        0..=125 => out.push(0x80 | payload.len() as u8),
        126..=0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
}

/// Opcode of a binary frame, for [`put_client_frame`].
pub const OPCODE_BINARY: u8 = BINARY;
/// Opcode of a pong, for [`put_client_frame`].
pub const OPCODE_PONG: u8 = PONG;

/// A `Sec-WebSocket-Key`: the base64 of 16 random bytes.
pub fn client_key(random: [u8; 16]) -> String {
    base64::engine::general_purpose::STANDARD.encode(random)
}

/// The client's request to upgrade `/derp` to WebSocket with the `derp`
/// subprotocol; `key` is the base64 of 16 random bytes. `None` when `host`
/// or `user_agent` holds CR or LF.
pub fn upgrade_request(host: &str, user_agent: &str, key: &str) -> Option<Vec<u8>> {
    if [host, user_agent, key]
        .iter()
        .any(|v| v.contains(['\r', '\n']))
    {
        return None;
    }
    Some(
        format!(
            "GET /derp HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {user_agent}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Protocol: derp\r\n\r\n"
        )
        .into_bytes(),
    )
}

/// Reads the server's answer to [`upgrade_request`] with `key` from the
/// start of `buf`: `Ok(None)` while the head is incomplete, the head's
/// length once it is a `101` with `Upgrade: websocket`, the right
/// `Sec-WebSocket-Accept` and the `derp` subprotocol. Whatever follows the
/// head is the start of the frame stream.
pub fn parse_upgrade_response(buf: &[u8], key: &str) -> Result<Option<usize>, WsError> {
    use crate::http::{MAX_HEAD, MAX_HEADERS};
    let refused = |why: String| Err(WsError::Upgrade(why));
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(&buf[..buf.len().min(MAX_HEAD)]) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return refused(format!("response head longer than {MAX_HEAD} bytes"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return refused(format!("malformed response: {e}")),
    };
    let status = resp.code.unwrap_or_default();
    if status != 101 {
        return refused(format!("status {status}, expected 101"));
    }
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_owned())
    };
    if !header("Upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")) {
        return refused("no Upgrade: websocket".into());
    }
    if header("Sec-WebSocket-Accept").as_deref() != Some(accept_key(key).as_str()) {
        return refused("wrong Sec-WebSocket-Accept".into());
    }
    if !header("Sec-WebSocket-Protocol").is_some_and(|v| v.eq_ignore_ascii_case("derp")) {
        return refused("the derp subprotocol was not chosen".into());
    }
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_matches_rfc_6455_example() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    fn decode_all(
        stream: &[u8],
        chunk: usize,
    ) -> (Result<(), WsError>, Vec<u8>, Vec<ControlFrame>) {
        let mut d = Decoder::new();
        let (mut data, mut ctrl) = (Vec::new(), Vec::new());
        for part in stream.chunks(chunk.max(1)) {
            if let Err(e) = d.feed(part, &mut data, |c| ctrl.push(c)) {
                return (Err(e), data, ctrl);
            }
        }
        (Ok(()), data, ctrl)
    }

    #[test]
    fn client_side_reads_server_frames_and_checks_the_upgrade() {
        let mut stream = Vec::new();
        put_binary(&mut stream, &[3u8; 40_000]);
        put_pong(&mut stream, b"x");
        put_binary_parts(&mut stream, &[b"ab", b"", b"c"]);
        for chunk in [1, 5, 1000, 1 << 20] {
            let mut d = Decoder::for_client();
            let (mut data, mut ctrl) = (Vec::new(), Vec::new());
            for part in stream.chunks(chunk) {
                d.feed(part, &mut data, |c| ctrl.push(c)).unwrap();
            }
            let mut want = vec![3u8; 40_000];
            want.extend(b"abc");
            assert_eq!(data, want, "chunk {chunk}");
            assert_eq!(ctrl, [ControlFrame::Pong]);
        }
        // A masked frame is the client's kind, not the server's.
        let masked = client_frame(true, BINARY, b"hi", [1, 2, 3, 4]);
        let r = Decoder::for_client().feed(&masked, &mut Vec::new(), |_| {});
        assert_eq!(r, Err(WsError::Masked));

        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let req = String::from_utf8(upgrade_request("h:1", "ua", key).unwrap()).unwrap();
        assert!(
            req.starts_with("GET /derp HTTP/1.1\r\nHost: h:1\r\n"),
            "{req}"
        );
        assert!(req.contains("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"));
        assert!(req.contains("Sec-WebSocket-Protocol: derp\r\n") && req.ends_with("\r\n\r\n"));
        assert_eq!(upgrade_request("h\r\nX: y", "ua", key), None);
        let mut resp = accept_response(key);
        let head = resp.len();
        resp.extend(b"frames");
        assert_eq!(parse_upgrade_response(&resp, key), Ok(Some(head)));
        assert_eq!(parse_upgrade_response(&resp[..head - 1], key), Ok(None));
        assert!(parse_upgrade_response(&resp, "b3RoZXIga2V5IDEyMzQ1Ng==").is_err());
        let no_proto = String::from_utf8(accept_response(key))
            .unwrap()
            .replace("Sec-WebSocket-Protocol: derp\r\n", "");
        assert!(parse_upgrade_response(no_proto.as_bytes(), key).is_err());
        assert!(parse_upgrade_response(b"HTTP/1.1 426 Upgrade Required\r\n\r\n", key).is_err());
    }

    #[test]
    fn binary_messages_in_any_chunking() {
        let m = [1, 2, 3, 4];
        let mut stream = client_frame(true, BINARY, b"hello ", m);
        stream.extend(client_frame(false, BINARY, &[7u8; 300], [9, 8, 7, 6]));
        stream.extend(client_frame(true, PING, b"p", m));
        stream.extend(client_frame(true, CONTINUATION, &[5u8; 70_000], m));
        stream.extend(client_frame(true, BINARY, b"", m));
        let mut want = b"hello ".to_vec();
        want.extend([7u8; 300]);
        want.extend([5u8; 70_000]);
        for chunk in [1, 2, 3, 7, 100, 65_536, 1 << 20] {
            let (r, data, ctrl) = decode_all(&stream, chunk);
            assert_eq!(r, Ok(()), "chunk {chunk}");
            assert_eq!(data, want, "chunk {chunk}");
            assert_eq!(ctrl, [ControlFrame::Ping(b"p".to_vec())], "chunk {chunk}");
        }
    }

    #[test]
    fn protocol_errors() {
        let m = [1, 2, 3, 4];
        let cases: Vec<(Vec<u8>, WsError)> = vec![
            (client_frame(true, TEXT, b"hi", m), WsError::Text),
            (vec![0x82, 0x02, b'h', b'i'], WsError::Unmasked),
            (vec![0xc2, 0x80, 0, 0, 0, 0], WsError::Reserved(4)),
            (client_frame(true, 0x3, b"", m), WsError::Opcode(3)),
            (client_frame(false, PING, b"", m), WsError::Control(PING)),
            (
                client_frame(true, PING, &[0; 126], m),
                WsError::Control(PING),
            ),
            (client_frame(true, CONTINUATION, b"x", m), WsError::Fragment),
            (
                [
                    client_frame(false, BINARY, b"a", m),
                    client_frame(true, BINARY, b"b", m),
                ]
                .concat(),
                WsError::Fragment,
            ),
            (client_frame(true, CLOSE, &[3], m), WsError::BadClose),
            (
                [
                    vec![0x82, 0xff],
                    (2u64 << 20).to_be_bytes().to_vec(),
                    m.to_vec(),
                ]
                .concat(),
                WsError::TooLarge {
                    len: 2 << 20,
                    max: MAX_FRAME_PAYLOAD,
                },
            ),
        ];
        for (stream, want) in cases {
            let (r, _, _) = decode_all(&stream, 1);
            assert_eq!(r, Err(want.clone()), "{stream:?}");
            let (r, _, _) = decode_all(&stream, stream.len());
            assert_eq!(r, Err(want), "{stream:?}");
        }
        assert_eq!(WsError::Text.close_code(), close_code::UNSUPPORTED_DATA);
    }

    #[test]
    fn close_and_pong_frames() {
        let m = [0xa, 0xb, 0xc, 0xd];
        let stream = [
            client_frame(true, PONG, b"", m),
            client_frame(true, CLOSE, &[0x03, 0xe8, b'b', b'y', b'e'], m),
            client_frame(true, CLOSE, b"", m),
        ]
        .concat();
        let (r, data, ctrl) = decode_all(&stream, 1);
        assert_eq!(r, Ok(()));
        assert!(data.is_empty());
        assert_eq!(
            ctrl,
            [
                ControlFrame::Pong,
                ControlFrame::Close(Some(1000)),
                ControlFrame::Close(None)
            ]
        );
    }

    #[test]
    fn parts_frame_like_their_concatenation() {
        let a = vec![1u8; 10_000];
        let b = vec![2u8; 9_000];
        let c: Vec<u8> = Vec::new();
        let d = vec![3u8; 20_000];
        let mut split = Vec::new();
        put_binary_parts(&mut split, &[&a, &b, &c, &d]);
        let mut whole = Vec::new();
        put_binary(&mut whole, &[a, b, c, d].concat());
        assert_eq!(split, whole);
        let mut none = Vec::new();
        put_binary_parts(&mut none, &[&[], &[]]);
        assert!(none.is_empty());
    }

    #[test]
    fn server_frames() {
        let mut out = Vec::new();
        put_binary(&mut out, &[1u8; 40_000]);
        // 16,384 + 16,384 + 7,232: three messages, 126-style lengths.
        assert_eq!(out.len(), 40_000 + 3 * 4);
        assert_eq!(&out[..4], &[0x82, 126, 0x40, 0x00]);
        let mut small = Vec::new();
        put_pong(&mut small, b"hi");
        put_close(&mut small, 1002);
        assert_eq!(small, [0x8a, 2, b'h', b'i', 0x88, 2, 0x03, 0xea]);
    }
}
