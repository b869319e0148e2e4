//! The HTTP/1.1 half of the client handshake
//! (`docs/derp-protocol.md` §4.2, §4.4): the `GET /derp` upgrade request the
//! client writes, and the `101 Switching Protocols` head it reads back in
//! classic mode.
//!
//! The request follows Go's byte layout (non-special headers in
//! alphabetical order). The response parser reads only what a client needs:
//! the status line and the optional `Derp-Public-Key` header; everything
//! after the blank line belongs to the DERP stream and is handed back by
//! offset.

use super::ClientError;
use crate::http::{MAX_HEAD, MAX_HEADERS};
use crate::key::NodePublic;

/// Longest response head accepted, in bytes (the server's request limit).
pub const MAX_RESPONSE_HEAD: usize = MAX_HEAD;

/// What the request carries besides the fixed parts.
pub(super) struct RequestHead<'a> {
    pub host: &'a str,
    pub user_agent: &'a str,
    pub ideal_node: Option<&'a str>,
    pub fast_start: bool,
}

impl RequestHead<'_> {
    /// Refuses header values that would split the request.
    pub(super) fn check(&self) -> Result<(), ClientError> {
        let fields = [
            ("Host", Some(self.host)),
            ("User-Agent", Some(self.user_agent)),
            ("Ideal-Node", self.ideal_node),
        ];
        for (header, value) in fields {
            if value.is_some_and(|v| v.contains(['\r', '\n'])) {
                return Err(ClientError::HeaderInjection { header });
            }
        }
        Ok(())
    }

    /// Appends the request head, as Go's `net/http` orders it.
    pub(super) fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"GET /derp HTTP/1.1\r\nHost: ");
        out.extend_from_slice(self.host.as_bytes());
        out.extend_from_slice(b"\r\nUser-Agent: ");
        out.extend_from_slice(self.user_agent.as_bytes());
        out.extend_from_slice(b"\r\nConnection: Upgrade\r\n");
        if self.fast_start {
            out.extend_from_slice(b"Derp-Fast-Start: 1\r\n");
        }
        if let Some(node) = self.ideal_node.filter(|n| !n.is_empty()) {
            out.extend_from_slice(b"Ideal-Node: ");
            out.extend_from_slice(node.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Upgrade: DERP\r\n\r\n");
    }
}

/// A complete `101` response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Upgraded {
    /// The `Derp-Public-Key` header, when the server sent one.
    pub public_key: Option<NodePublic>,
    /// Bytes taken by the head; the DERP stream starts right after.
    pub head_len: usize,
}

/// Parses the server's answer to the upgrade request from the start of
/// `buf`. `Ok(None)` while the head is incomplete.
pub(super) fn parse_response(buf: &[u8]) -> Result<Option<Upgraded>, ClientError> {
    let window = &buf[..buf.len().min(MAX_RESPONSE_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_RESPONSE_HEAD => {
            return Err(ClientError::ResponseTooLarge {
                max: MAX_RESPONSE_HEAD,
            })
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(ClientError::MalformedResponse {
                detail: e.to_string(),
            })
        }
    };
    let status = resp.code.unwrap_or_default();
    if status != 101 {
        return Err(ClientError::UpgradeRefused {
            status,
            reason: resp.reason.unwrap_or_default().to_owned(),
        });
    }
    let public_key = match resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("Derp-Public-Key"))
    {
        None => None,
        Some(h) => {
            let text = String::from_utf8_lossy(h.value);
            let text = text.trim_matches([' ', '\t']);
            Some(
                NodePublic::from_hex(text).map_err(|_| ClientError::BadPublicKeyHeader {
                    value: text.to_owned(),
                })?,
            )
        }
    };
    Ok(Some(Upgraded {
        public_key,
        head_len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::key_s;

    #[test]
    fn request_matches_go_layout() {
        let mut out = Vec::new();
        RequestHead {
            host: "derp.example.com:8443",
            user_agent: "Go-http-client/1.1",
            ideal_node: Some("900a"),
            fast_start: true,
        }
        .put(&mut out);
        // `docs/derp-protocol.md` §17.5, byte for byte.
        assert_eq!(out, crate::testutil::FAST_START_REQUEST);
        // The server's own parser reads it as a fast-start DERP upgrade.
        let req = crate::http::parse_request(&out).unwrap().unwrap();
        assert_eq!(req.upgrade, crate::http::Upgrade::Derp);
        assert!(req.fast_start);
        assert_eq!(req.ideal_node.as_deref(), Some("900a"));
        assert_eq!(req.head_len, out.len());
    }

    #[test]
    fn request_refuses_line_breaks() {
        let head = RequestHead {
            host: "h\r\nX-Evil: 1",
            user_agent: "ua",
            ideal_node: None,
            fast_start: false,
        };
        assert_eq!(
            head.check(),
            Err(ClientError::HeaderInjection { header: "Host" })
        );
        let head = RequestHead {
            host: "h",
            user_agent: "ua",
            ideal_node: Some("a\nb"),
            fast_start: false,
        };
        assert_eq!(
            head.check(),
            Err(ClientError::HeaderInjection {
                header: "Ideal-Node"
            })
        );
    }

    #[test]
    fn responses() {
        let ok = crate::http::switching_protocols(&key_s());
        let mut buf = ok.clone();
        buf.extend_from_slice(b"\x01rest");
        assert_eq!(
            parse_response(&buf),
            Ok(Some(Upgraded {
                public_key: Some(key_s()),
                head_len: ok.len()
            }))
        );
        for n in 0..ok.len() {
            assert_eq!(parse_response(&ok[..n]), Ok(None), "prefix {n}");
        }
        assert_eq!(
            parse_response(b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
            Ok(Some(Upgraded {
                public_key: None,
                head_len: 36
            }))
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 5\r\n\r\nnope!"),
            Err(ClientError::UpgradeRefused {
                status: 426,
                reason: "Upgrade Required".into()
            })
        );
        assert!(matches!(
            parse_response(b"\x01\x00\x00\x00\x28DERP"),
            Err(ClientError::MalformedResponse { .. })
        ));
        assert_eq!(
            parse_response(b"HTTP/1.1 101 OK\r\nDerp-Public-Key: 0123\r\n\r\n"),
            Err(ClientError::BadPublicKeyHeader {
                value: "0123".into()
            })
        );
        let mut huge = b"HTTP/1.1 101 Switching Protocols\r\nX-Pad: ".to_vec();
        huge.resize(MAX_RESPONSE_HEAD - 1, b'a');
        assert_eq!(parse_response(&huge), Ok(None));
        huge.push(b'a');
        assert_eq!(
            parse_response(&huge),
            Err(ClientError::ResponseTooLarge {
                max: MAX_RESPONSE_HEAD
            })
        );
    }
}
