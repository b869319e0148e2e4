//! The HTTP/1.1 upgrade that opens the control channel: `POST /ts2021`
//! carrying the Noise initiation in the `X-Tailscale-Handshake` header
//! (standard base64), answered by `101 Switching Protocols` with
//! `Upgrade: tailscale-control-protocol`. The server's Noise response and
//! then the records follow the head on the same stream.

use crate::http::{MAX_HEAD, MAX_HEADERS};
use base64::Engine as _;

/// The protocol named in the `Upgrade` header both ways.
pub const UPGRADE_PROTOCOL: &str = "tailscale-control-protocol";

/// Why the upgrade failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    /// The host would split the request head.
    #[error("host {0:?} contains a line break")]
    BadHost(String),
    /// The response is not HTTP/1.x.
    #[error("malformed upgrade response: {0}")]
    Malformed(String),
    /// The head is longer than the limit.
    #[error("upgrade response head exceeds {0} bytes")]
    TooLarge(usize),
    /// A status other than 101.
    #[error("control server answered {status} {reason:?} to the upgrade")]
    Refused {
        /// The status code.
        status: u16,
        /// The reason phrase.
        reason: String,
    },
    /// A 101 without `Upgrade: tailscale-control-protocol`.
    #[error("101 answer lacks the control protocol upgrade header")]
    WrongProtocol,
}

/// Appends the upgrade request for `host` (the login server's host, with
/// a port if it is not the default) carrying `initiation`.
pub fn put_request(host: &str, initiation: &[u8], out: &mut Vec<u8>) -> Result<(), UpgradeError> {
    if host.contains(['\r', '\n']) {
        return Err(UpgradeError::BadHost(host.to_owned()));
    }
    out.extend_from_slice(b"POST /ts2021 HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\nUser-Agent: ferry\r\nConnection: upgrade\r\nUpgrade: ");
    out.extend_from_slice(UPGRADE_PROTOCOL.as_bytes());
    out.extend_from_slice(b"\r\nX-Tailscale-Handshake: ");
    out.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(initiation)
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
    Ok(())
}

/// Parses the answer from the start of `buf`: `Ok(None)` while the head is
/// incomplete, else the length of the head (the Noise response follows).
pub fn parse_response(buf: &[u8]) -> Result<Option<usize>, UpgradeError> {
    let window = &buf[..buf.len().min(MAX_HEAD)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(UpgradeError::TooLarge(MAX_HEAD))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(UpgradeError::Malformed(e.to_string())),
    };
    let status = resp.code.unwrap_or_default();
    if status != 101 {
        return Err(UpgradeError::Refused {
            status,
            reason: resp.reason.unwrap_or_default().to_owned(),
        });
    }
    let upgraded = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("Upgrade")
            && std::str::from_utf8(h.value)
                .is_ok_and(|v| v.trim().eq_ignore_ascii_case(UPGRADE_PROTOCOL))
    });
    if !upgraded {
        return Err(UpgradeError::WrongProtocol);
    }
    Ok(Some(head_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_layout() {
        let mut out = Vec::new();
        put_request("127.0.0.1:8080", &[0xfb, 0xff], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("POST /ts2021 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"));
        assert!(text.contains("\r\nUpgrade: tailscale-control-protocol\r\n"));
        assert!(text.contains("\r\nConnection: upgrade\r\n"));
        assert!(text.contains("\r\nX-Tailscale-Handshake: +/8=\r\n"));
        assert!(text.ends_with("\r\n\r\n"));
        assert!(put_request("a\r\nb", &[], &mut Vec::new()).is_err());
    }

    #[test]
    fn responses() {
        let ok = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: Tailscale-Control-Protocol\r\nConnection: upgrade\r\n\r\n\x02\x00\x30";
        let head = ok.len() - 3;
        assert_eq!(parse_response(ok), Ok(Some(head)));
        for n in 0..head {
            assert_eq!(parse_response(&ok[..n]), Ok(None), "{n}");
        }
        assert_eq!(
            parse_response(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"),
            Err(UpgradeError::WrongProtocol)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
            Err(UpgradeError::Refused {
                status: 400,
                reason: "Bad Request".into()
            })
        );
        assert!(matches!(
            parse_response(b"SSH-2.0-x\r\n\r\n"),
            Err(UpgradeError::Malformed(_))
        ));
        let mut long = b"HTTP/1.1 101 OK\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse_response(&long), Err(UpgradeError::TooLarge(MAX_HEAD)));
    }
}
