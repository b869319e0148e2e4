//! The HTTP/1.1 surface of the DERP listener
//! (`docs/derp-protocol.md` §4.2, §4.4, §4.5, §11).
//!
//! The server must parse the upgrade request itself so that, in fast-start
//! mode, it can answer with *no* HTTP response at all, and so that bytes read
//! past the request head are kept as the start of the DERP stream.
//! [`parse_request`] reads a request head from untrusted bytes with `httparse`
//! (bounded to [`MAX_HEAD`] bytes and [`MAX_HEADERS`] headers), extracts the
//! few headers DERP cares about, and reports [`Request::head_len`]; everything
//! after that offset belongs to the DERP stream. A head that arrives over
//! several reads is followed by [`HeadScan`], which looks at each new byte
//! once and parses only when the answer can have changed, so a head sent a
//! byte at a time costs time linear in its size, not quadratic.
//!
//! The builders produce complete response heads: the byte-exact 101 of the
//! classic upgrade, generic `Connection: close` responses, and the captive
//! portal `generate_204` answer.

use crate::key::NodePublic;

/// Largest request head accepted, in bytes.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most headers accepted in one request.
pub const MAX_HEADERS: usize = 32;
/// Longest `X-Tailscale-Challenge` echoed by `generate_204`.
pub const MAX_CHALLENGE_LEN: usize = 64;
/// The `Cache-Control` value `generate_204` sends.
pub const NO_CACHE: &str = "no-cache, no-store, must-revalidate, no-transform, max-age=0";

/// Why a request head was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// No complete head within [`MAX_HEAD`] bytes.
    #[error("HTTP request head exceeds {max} bytes")]
    TooLarge {
        /// The limit, [`MAX_HEAD`].
        max: usize,
    },
    /// More than [`MAX_HEADERS`] header lines.
    #[error("HTTP request has more than {max} headers")]
    TooManyHeaders {
        /// The limit, [`MAX_HEADERS`].
        max: usize,
    },
    /// Not an HTTP/1.x request head.
    #[error("malformed HTTP request head: {0}")]
    Malformed(String),
}

/// What the `Upgrade` header asks for (`docs/derp-protocol.md` §4.2, §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// No `Upgrade` header, or an empty one.
    None,
    /// `Upgrade: DERP` (any case): classic DERP upgrade.
    Derp,
    /// `Upgrade: websocket` without a `derp` WebSocket subprotocol: a legacy
    /// client that speaks raw DERP framing anyway.
    WebSocketRaw,
    /// `Upgrade: websocket` and `Sec-WebSocket-Protocol` containing `derp`:
    /// DERP carried in WebSocket binary messages.
    WebSocketDerp,
    /// Any other value (answer 426 on `/derp`).
    Other,
}

/// The parts of a request head the DERP listener uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Request method as sent (Go does not check it for `/derp`).
    pub method: String,
    /// Path without the query string (not percent-decoded). An absolute-form
    /// target (`http://host/p`) is reduced to its path.
    pub path: String,
    /// The query string after `?`, if any.
    pub query: Option<String>,
    /// What the `Upgrade` header asks for.
    pub upgrade: Upgrade,
    /// `Derp-Fast-Start` is exactly `1`: answer with no HTTP response
    /// (`docs/derp-protocol.md` §4.4).
    pub fast_start: bool,
    /// Non-empty `Ideal-Node` value (the connection is "not ideal").
    pub ideal_node: Option<String>,
    /// `X-Tailscale-Challenge` as sent (validate with [`valid_challenge`]).
    pub challenge: Option<String>,
    /// `Host` header.
    pub host: Option<String>,
    /// Every `X-Forwarded-For` line, joined with `,` in the order received
    /// (believed only from a trusted proxy: [`crate::forwarded`]). From
    /// any other peer, its presence (or `Forwarded`'s) denies debug access.
    pub x_forwarded_for: Option<String>,
    /// Every `Forwarded` (RFC 7239) line, joined with `,`.
    pub forwarded: Option<String>,
    /// `Sec-WebSocket-Key`, needed to accept a WebSocket upgrade.
    pub websocket_key: Option<String>,
    /// Bytes consumed by the head; bytes after this belong to the DERP
    /// stream and must be kept.
    pub head_len: usize,
}

/// Trims the optional whitespace around a header value.
fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// Whether `value`, lowercased as Go's `strings.ToLower` would, equals the
/// lowercase ASCII `target`. Beyond ASCII only the Kelvin sign lowers to an
/// ASCII letter (`k`), so it is the one extra case handled.
fn go_lower_eq(value: &str, target: &str) -> bool {
    let mut t = target.bytes();
    for c in value.chars() {
        let lc = match c {
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        };
        if !lc.is_ascii() || t.next() != Some(lc as u8) {
            return false;
        }
    }
    t.next().is_none()
}

/// One name or value of a query string, decoded as Go's `url.ParseQuery`
/// decodes it (`+` is a space, `%XX` a byte); `None` when badly escaped or
/// not UTF-8.
pub fn unescape_query(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Splits an origin-form or absolute-form request target into path and query.
fn split_target(target: &str) -> (String, Option<String>) {
    let mut rest = target;
    for scheme in ["http://", "https://"] {
        // Compare bytes: the target may hold non-ASCII text, and slicing a
        // str inside a multi-byte character would panic.
        let matches = rest
            .as_bytes()
            .get(..scheme.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(scheme.as_bytes()));
        if matches {
            let after = &rest[scheme.len()..];
            rest = after.find(['/', '?']).map_or("/", |i| &after[i..]);
            if let Some(query) = rest.strip_prefix('?') {
                return ("/".to_owned(), Some(query.to_owned()));
            }
            break;
        }
    }
    match rest.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (rest.to_owned(), None),
    }
}

/// Parses a request head from the start of `buf`.
///
/// Returns `Ok(None)` while the head is incomplete, and
/// [`HttpError::TooLarge`] once [`MAX_HEAD`] bytes have arrived without the
/// blank line that ends it.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, HttpError> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(HttpError::TooLarge { max: MAX_HEAD })
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError::TooManyHeaders { max: MAX_HEADERS })
        }
        Err(e) => return Err(HttpError::Malformed(e.to_string())),
    };

    // Go's Header.Get returns the first value for a name.
    let get = |name: &str| -> Option<&[u8]> {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| trim_ows(h.value))
    };
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    // A header sent on several lines is one comma-separated list (RFC 9110).
    let joined = |name: &str| -> Option<String> {
        let mut lines = req
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(trim_ows(h.value)));
        let first = lines.next()?.into_owned();
        Some(lines.fold(first, |mut all, line| {
            all.push(',');
            all.push_str(&line);
            all
        }))
    };

    let upgrade = match get("Upgrade").map(|v| String::from_utf8_lossy(v)) {
        None => Upgrade::None,
        Some(v) if v.is_empty() => Upgrade::None,
        Some(v) if go_lower_eq(&v, "derp") => Upgrade::Derp,
        Some(v) if go_lower_eq(&v, "websocket") => {
            let proto = get("Sec-WebSocket-Protocol").unwrap_or_default();
            if proto.windows(4).any(|w| w == b"derp") {
                Upgrade::WebSocketDerp
            } else {
                Upgrade::WebSocketRaw
            }
        }
        Some(_) => Upgrade::Other,
    };

    let (path, query) = split_target(req.path.unwrap_or("/"));
    Ok(Some(Request {
        method: req.method.unwrap_or_default().to_owned(),
        path,
        query,
        upgrade,
        fast_start: get("Derp-Fast-Start") == Some(b"1"),
        ideal_node: get("Ideal-Node").filter(|v| !v.is_empty()).map(text),
        challenge: get("X-Tailscale-Challenge").map(text),
        host: get("Host").map(text),
        x_forwarded_for: joined("X-Forwarded-For"),
        forwarded: joined("Forwarded"),
        websocket_key: get("Sec-WebSocket-Key").map(text),
        head_len,
    }))
}

/// A request head read as it arrives: [`HeadScan::advance`] gets the whole
/// buffer each time (what came before plus the new bytes) and answers as
/// [`parse_request`] of that buffer would, but looks at each byte once to
/// find where lines end and parses only when the answer can have changed:
///
/// - when the first byte of the request line cannot start a method (a TLS
///   ClientHello on a plain port is refused at once);
/// - when the request line ends (a malformed one is refused then);
/// - when a blank line ends the head (the one full parse);
/// - when [`MAX_HEAD`] bytes are in without one.
///
/// In between it answers `Ok(None)`, including for a head that is already
/// malformed past its first line (that shows once the head ends). The work
/// done, in bytes looked at, is [`HeadScan::work`]: about twice the head's
/// size however it was cut.
#[derive(Debug, Default, Clone)]
pub struct HeadScan {
    /// Bytes of the buffer already scanned for line ends.
    scanned: usize,
    /// Where the request line starts (leading blank lines are skipped, as
    /// `httparse` does), once a byte of it has come.
    start: Option<usize>,
    /// The request line was parsed (it was whole and well formed).
    line_checked: bool,
    /// Bytes looked at so far, scanning and parsing.
    work: usize,
}

impl HeadScan {
    /// A scan at the start of a head.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes looked at so far (scanned, plus those given to the parser).
    pub fn work(&self) -> usize {
        self.work
    }

    /// What the head in `buf` says so far (see [`HeadScan`]). `buf` must
    /// start with the bytes given to the previous calls.
    pub fn advance(&mut self, buf: &[u8]) -> Result<Option<Request>, HttpError> {
        let window = &buf[..buf.len().min(MAX_HEAD)];
        let mut i = self.scanned.min(window.len());
        while i < window.len() {
            let b = window[i];
            i += 1;
            let Some(start) = self.start else {
                if b != b'\r' && b != b'\n' {
                    self.start = Some(i - 1);
                    if !is_token_byte(b) {
                        return self.parse(buf, i);
                    }
                }
                continue;
            };
            if b != b'\n' {
                continue;
            }
            // The line that ends here is blank if a line end comes right
            // before it (`\n\n` or `\n\r\n`), inside the head proper.
            let at = i - 1;
            let blank = (at > start && window[at - 1] == b'\n')
                || (at > start + 1 && window[at - 1] == b'\r' && window[at - 2] == b'\n');
            if blank {
                match self.parse(buf, i)? {
                    Some(req) => return Ok(Some(req)),
                    // Not the end after all for the parser: scan on.
                    None => continue,
                }
            }
            if !self.line_checked {
                self.line_checked = true;
                if let Some(req) = self.parse(&buf[..i], i)? {
                    return Ok(Some(req));
                }
            }
        }
        self.note_scanned(i);
        if buf.len() >= MAX_HEAD {
            return self.parse(buf, i);
        }
        Ok(None)
    }

    /// [`parse_request`] of `buf`, counted; the scan reached `scanned`.
    fn parse(&mut self, buf: &[u8], scanned: usize) -> Result<Option<Request>, HttpError> {
        self.note_scanned(scanned);
        self.work += buf.len().min(MAX_HEAD);
        parse_request(buf)
    }

    fn note_scanned(&mut self, upto: usize) {
        self.work += upto.saturating_sub(self.scanned);
        self.scanned = self.scanned.max(upto);
    }
}

/// Whether `b` may appear in a method (an HTTP token character).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The classic upgrade response (`docs/derp-protocol.md` §4.2), byte-exact.
pub fn switching_protocols(server: &NodePublic) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\n\
          Upgrade: DERP\r\n\
          Connection: Upgrade\r\n\
          Derp-Version: 2\r\n\
          Derp-Public-Key: ",
    );
    crate::hex::encode_bytes_into(&mut out, server.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    out
}

/// A complete `HTTP/1.1` response with `Content-Length` and
/// `Connection: close` added after `headers`.
///
/// Statuses that cannot carry a body (1xx, 204, 304) get neither
/// `Content-Length` nor the body. Header lines containing CR or LF are
/// dropped rather than allowed to split the response.
pub fn response(status: u16, reason: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let bodiless = status < 200 || status == 204 || status == 304;
    let clean = |s: &str| !s.contains(['\r', '\n']);
    let mut out = Vec::with_capacity(128 + body.len());
    let reason = if clean(reason) { reason } else { "" };
    out.extend_from_slice(format!("HTTP/1.1 {status:03} {reason}\r\n").as_bytes());
    for (name, value) in headers {
        if clean(name) && clean(value) {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
    }
    if !bodiless {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    if !bodiless {
        out.extend_from_slice(body);
    }
    out
}

/// Whether a captive-portal challenge may be echoed: 1 to 64 characters from
/// `[A-Za-z0-9._:-]` (`docs/derp-protocol.md` §11).
pub fn valid_challenge(challenge: &str) -> bool {
    !challenge.is_empty()
        && challenge.len() <= MAX_CHALLENGE_LEN
        && challenge
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The `/generate_204` response (`docs/derp-protocol.md` §11): `204 No Content`
/// with the no-cache header, plus `X-Tailscale-Response: response <challenge>`
/// when the challenge is valid.
pub fn generate_204(challenge: Option<&str>) -> Vec<u8> {
    let echoed = challenge
        .filter(|c| valid_challenge(c))
        .map(|c| format!("response {c}"));
    let mut headers = vec![("Cache-Control", NO_CACHE)];
    if let Some(v) = &echoed {
        headers.push(("X-Tailscale-Response", v));
    }
    response(204, "No Content", &headers, b"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::key_s;

    const CLASSIC: &[u8] = b"GET /derp HTTP/1.1\r\n\
        Host: derp.example.com\r\n\
        User-Agent: Go-http-client/1.1\r\n\
        Connection: Upgrade\r\n\
        Ideal-Node: 900a\r\n\
        Upgrade: DERP\r\n\
        \r\n";

    const FAST_START: &[u8] = crate::testutil::FAST_START_REQUEST;

    #[test]
    fn classic_request() {
        let r = parse_request(CLASSIC).unwrap().unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/derp");
        assert_eq!(r.query, None);
        assert_eq!(r.upgrade, Upgrade::Derp);
        assert!(!r.fast_start);
        assert_eq!(r.ideal_node.as_deref(), Some("900a"));
        assert_eq!(r.host.as_deref(), Some("derp.example.com"));
        assert!(r.x_forwarded_for.is_none());
        assert_eq!(r.head_len, CLASSIC.len());
    }

    #[test]
    fn fast_start_request_keeps_trailing_bytes() {
        let mut buf = FAST_START.to_vec();
        buf.extend_from_slice(&[0x02, 0, 0, 0, 0x68, 0x58]);
        let r = parse_request(&buf).unwrap().unwrap();
        assert!(r.fast_start);
        assert_eq!(r.host.as_deref(), Some("derp.example.com:8443"));
        assert_eq!(&buf[r.head_len..], &[0x02, 0, 0, 0, 0x68, 0x58]);
    }

    #[test]
    fn incomplete_and_oversized_heads() {
        for n in 0..CLASSIC.len() {
            assert_eq!(parse_request(&CLASSIC[..n]), Ok(None), "prefix {n}");
        }
        let mut huge = b"GET /derp HTTP/1.1\r\nX-Pad: ".to_vec();
        huge.resize(MAX_HEAD - 1, b'a');
        assert_eq!(parse_request(&huge), Ok(None));
        huge.push(b'a');
        assert_eq!(
            parse_request(&huge),
            Err(HttpError::TooLarge { max: MAX_HEAD })
        );
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..33 {
            many.extend_from_slice(format!("H{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(
            parse_request(&many),
            Err(HttpError::TooManyHeaders { max: 32 })
        );
        assert!(matches!(
            parse_request(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
            Err(HttpError::Malformed(_))
        ));
        assert!(matches!(
            parse_request(b"GET / HTTP/2.0\r\n\r\n"),
            Err(HttpError::Malformed(_))
        ));
    }

    /// Feeds `data` to a scan in pieces of `step` bytes: the first answer
    /// that is not `Ok(None)`, and the scan.
    fn scan_in(data: &[u8], step: usize) -> (Result<Option<Request>, HttpError>, HeadScan) {
        let mut scan = HeadScan::new();
        let mut end = 0;
        while end < data.len() {
            end = (end + step).min(data.len());
            match scan.advance(&data[..end]) {
                Ok(None) => {}
                other => return (other, scan),
            }
        }
        (Ok(None), scan)
    }

    #[test]
    fn a_scan_answers_as_a_parse_of_the_whole_head() {
        let mut with_rest = FAST_START.to_vec();
        with_rest.extend_from_slice(b"\x02\0\0\0\x68");
        for head in [
            CLASSIC,
            &with_rest[..],
            b"\r\n\nGET / HTTP/1.1\n\n",
            b"GET / HTTP/1.0\r\nA: b\n\r\n",
        ] {
            let want = parse_request(head);
            assert!(matches!(want, Ok(Some(_))), "{want:?}");
            for step in [1, 2, 3, 7, 64, head.len()] {
                assert_eq!(scan_in(head, step).0, want, "step {step}: {head:?}");
            }
        }
        // Errors: in the request line (at its end, or at once when its first
        // byte cannot start a method), in a header (at the end of the head),
        // too many headers, no end within the limit.
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..33 {
            many.extend_from_slice(format!("H{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        let mut huge = b"GET /derp HTTP/1.1\r\nX-Pad: ".to_vec();
        huge.resize(MAX_HEAD, b'a');
        for (bad, at) in [
            (&b"GET / HTTP/2.0\r\nHost: x"[..], 16),
            (b"\x16\x03\x01\x02\x00\x01\x00", 1),
            (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 33),
            (&many, many.len()),
            (&huge, MAX_HEAD),
        ] {
            let want = parse_request(bad);
            assert!(want.is_err(), "{want:?}");
            let mut scan = HeadScan::new();
            for n in 1..=bad.len() {
                let got = scan.advance(&bad[..n]);
                if n < at {
                    assert_eq!(got, Ok(None), "{n} of {bad:?}");
                } else {
                    assert_eq!(got, want, "{bad:?}");
                    break;
                }
            }
        }
    }

    /// The point of the scan: a head sent a byte at a time costs about
    /// twice its size, where parsing the whole buffer after every read
    /// would cost about its size squared over two.
    #[test]
    fn a_byte_at_a_time_costs_linear_work() {
        let mut head = b"GET /derp HTTP/1.1\r\nUpgrade: DERP\r\nX-Pad: ".to_vec();
        head.resize(MAX_HEAD - 4, b'a');
        head.extend_from_slice(b"\r\n\r\n");
        let (got, scan) = scan_in(&head, 1);
        assert_eq!(got, parse_request(&head));
        assert!(matches!(got, Ok(Some(_))));
        assert!(
            scan.work() <= 3 * head.len(),
            "{} for {}",
            scan.work(),
            head.len()
        );
        // The same when the head never ends: refused at the limit.
        let mut open = head[..head.len() - 4].to_vec();
        open.resize(MAX_HEAD + 10, b'a');
        let (got, scan) = scan_in(&open, 1);
        assert_eq!(got, Err(HttpError::TooLarge { max: MAX_HEAD }));
        assert!(scan.work() <= 3 * MAX_HEAD, "{}", scan.work());
    }

    fn upgrade_of(extra: &str) -> Upgrade {
        let head = format!("GET /derp HTTP/1.1\r\nHost: h\r\n{extra}\r\n");
        parse_request(head.as_bytes()).unwrap().unwrap().upgrade
    }

    #[test]
    fn upgrade_classification() {
        assert_eq!(upgrade_of(""), Upgrade::None);
        assert_eq!(upgrade_of("Upgrade: \r\n"), Upgrade::None);
        assert_eq!(upgrade_of("Upgrade: derp\r\n"), Upgrade::Derp);
        assert_eq!(upgrade_of("upgrade:   DeRp  \r\n"), Upgrade::Derp);
        assert_eq!(upgrade_of("Upgrade: WebSocket\r\n"), Upgrade::WebSocketRaw);
        assert_eq!(
            upgrade_of("Upgrade: websocket\r\nSec-WebSocket-Protocol: derp\r\n"),
            Upgrade::WebSocketDerp
        );
        assert_eq!(
            upgrade_of("Upgrade: websocket\r\nsec-websocket-protocol: x, derp\r\n"),
            Upgrade::WebSocketDerp
        );
        // Go's substring test is case-sensitive.
        assert_eq!(
            upgrade_of("Upgrade: websocket\r\nSec-WebSocket-Protocol: DERP\r\n"),
            Upgrade::WebSocketRaw
        );
        assert_eq!(upgrade_of("Upgrade: h2c\r\n"), Upgrade::Other);
        assert_eq!(upgrade_of("Upgrade: derp2\r\n"), Upgrade::Other);
        // The first Upgrade header counts, as with Go's Header.Get.
        assert_eq!(
            upgrade_of("Upgrade: derp\r\nUpgrade: h2c\r\n"),
            Upgrade::Derp
        );
        // Go's ToLower maps the Kelvin sign to 'k'.
        assert_eq!(
            upgrade_of("Upgrade: WEBSOC\u{212a}ET\r\n"),
            Upgrade::WebSocketRaw
        );
    }

    #[test]
    fn other_headers() {
        let head = b"HEAD /generate_204?t=1 HTTP/1.1\r\n\
            X-Tailscale-Challenge: ts_203.0.113.10\r\n\
            X-Forwarded-For: 1.2.3.4\r\n\
            Derp-Fast-Start: 11\r\n\
            Ideal-Node:\r\n\
            Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
        let r = parse_request(head).unwrap().unwrap();
        assert_eq!(r.method, "HEAD");
        assert_eq!(r.path, "/generate_204");
        assert_eq!(r.query.as_deref(), Some("t=1"));
        assert_eq!(r.challenge.as_deref(), Some("ts_203.0.113.10"));
        assert_eq!(r.x_forwarded_for.as_deref(), Some("1.2.3.4"));
        assert!(!r.fast_start, "only exactly \"1\" counts");
        assert_eq!(r.ideal_node, None);
        assert_eq!(r.host, None);
        assert_eq!(r.websocket_key.as_deref(), Some("dGhlIHNhbXBsZSBub25jZQ=="));
    }

    #[test]
    fn forwarding_headers_on_several_lines_are_joined() {
        let head = b"GET /derp HTTP/1.1\r\n\
            X-Forwarded-For: 1.2.3.4\r\n\
            Forwarded: for=5.6.7.8\r\n\
            x-forwarded-for:  10.0.0.2 \r\n\r\n";
        let r = parse_request(head).unwrap().unwrap();
        assert_eq!(r.x_forwarded_for.as_deref(), Some("1.2.3.4,10.0.0.2"));
        assert_eq!(r.forwarded.as_deref(), Some("for=5.6.7.8"));
    }

    #[test]
    fn request_targets() {
        assert_eq!(
            split_target("/derp?x=1?y"),
            ("/derp".into(), Some("x=1?y".into()))
        );
        assert_eq!(
            split_target("http://h:1/derp?q"),
            ("/derp".into(), Some("q".into()))
        );
        assert_eq!(split_target("HTTPS://h"), ("/".into(), None));
        assert_eq!(split_target("http://h?q"), ("/".into(), Some("q".into())));
        assert_eq!(split_target("*"), ("*".into(), None));
        // Found by fuzzing: a multi-byte character straddling the scheme length.
        assert_eq!(
            split_target("3dery\u{fffd}p/p"),
            ("3dery\u{fffd}p/p".into(), None)
        );
        assert_eq!(split_target("http:\u{e9}"), ("http:\u{e9}".into(), None));
    }

    #[test]
    fn switching_protocols_vector() {
        let want = "HTTP/1.1 101 Switching Protocols\r\n\
            Upgrade: DERP\r\n\
            Connection: Upgrade\r\n\
            Derp-Version: 2\r\n\
            Derp-Public-Key: 07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c\r\n\r\n";
        assert_eq!(
            String::from_utf8(switching_protocols(&key_s())).unwrap(),
            want
        );
    }

    #[test]
    fn responses() {
        assert_eq!(
            response(
                426,
                "Upgrade Required",
                &[("Content-Type", "text/plain")],
                b"DERP requires connection upgrade"
            ),
            b"HTTP/1.1 426 Upgrade Required\r\nContent-Type: text/plain\r\n\
              Content-Length: 32\r\nConnection: close\r\n\r\nDERP requires connection upgrade"
        );
        assert_eq!(
            response(200, "OK", &[("X-Evil", "a\r\nSet-Cookie: x")], b""),
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn generate_204_and_challenges() {
        assert!(valid_challenge("ts_203.0.113.10"));
        assert!(valid_challenge("a-b:c.d_E9"));
        assert!(valid_challenge(&"x".repeat(64)));
        assert!(!valid_challenge(&"x".repeat(65)));
        assert!(!valid_challenge(""));
        assert!(!valid_challenge("a b"));
        assert!(!valid_challenge("a\r\nb"));
        assert!(!valid_challenge("é"));
        let with = generate_204(Some("ts_203.0.113.10"));
        assert_eq!(
            String::from_utf8(with).unwrap(),
            "HTTP/1.1 204 No Content\r\n\
             Cache-Control: no-cache, no-store, must-revalidate, no-transform, max-age=0\r\n\
             X-Tailscale-Response: response ts_203.0.113.10\r\n\
             Connection: close\r\n\r\n"
        );
        let without = String::from_utf8(generate_204(Some("bad value"))).unwrap();
        assert!(!without.contains("X-Tailscale-Response"));
        assert_eq!(generate_204(None), generate_204(Some("bad value")));
    }
}
