//! The optional early payload a control server sends inside the Noise
//! channel before HTTP/2 starts.
//!
//! The first nine plaintext bytes from the server are either the header of
//! its HTTP/2 SETTINGS frame, or the magic `ff ff ff 54 53` followed by a
//! big-endian u32 length and that many bytes of JSON
//! (`{"nodeKeyChallenge":"chalpub:…"}`). Ferry does not use the challenge;
//! it only has to take those bytes out before HTTP/2 sees the stream.

/// The five bytes that start an early payload.
pub const MAGIC: [u8; 5] = [0xff, 0xff, 0xff, b'T', b'S'];
/// Bytes of the early payload header (magic ‖ u32 length).
pub const HEADER_LEN: usize = 9;
/// Longest early payload accepted (the one servers send is ~80 bytes).
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// What the start of the server's plaintext holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Early {
    /// Not enough bytes to tell yet.
    NeedMore,
    /// No early payload: every byte belongs to HTTP/2.
    Absent,
    /// An early payload of `len` bytes in total (header included): skip
    /// them, the rest belongs to HTTP/2.
    Present {
        /// Bytes to drop from the front of the stream.
        len: usize,
        /// The node key challenge, when the JSON names one.
        challenge: Option<String>,
    },
}

/// Why the early payload is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EarlyError {
    /// The length field exceeds [`MAX_PAYLOAD`].
    #[error("early payload of {0} bytes exceeds the limit")]
    TooLarge(u64),
    /// The payload is not a JSON object.
    #[error("early payload is not valid JSON: {0}")]
    BadJson(String),
}

#[derive(Default)]
struct Payload {
    challenge: Option<String>,
}

impl crate::json::FieldSink for Payload {
    fn field<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<(), A::Error> {
        if key == "nodekeychallenge" {
            if let Some(v) = map.next_value::<Option<String>>()? {
                self.challenge = Some(v);
            }
        } else {
            map.next_value::<serde::de::IgnoredAny>()?;
        }
        Ok(())
    }
}

/// Looks at the start of the server's plaintext stream.
pub fn parse(buf: &[u8]) -> Result<Early, EarlyError> {
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        return Ok(Early::Absent);
    }
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(Early::NeedMore);
    };
    let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
    if u64::from(len) > MAX_PAYLOAD as u64 {
        return Err(EarlyError::TooLarge(len.into()));
    }
    let end = HEADER_LEN + len as usize;
    let Some(body) = buf.get(HEADER_LEN..end) else {
        return Ok(Early::NeedMore);
    };
    let payload: Payload =
        crate::json::decode_object(body).map_err(|e| EarlyError::BadJson(e.to_string()))?;
    Ok(Early::Present {
        len: end,
        challenge: payload.challenge,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(json: &[u8]) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&(json.len() as u32).to_be_bytes());
        v.extend_from_slice(json);
        v
    }

    #[test]
    fn payload_then_http2() {
        let json = br#"{"NodeKeyChallenge":"chalpub:00","other":1}"#;
        let mut stream = framed(json);
        let total = stream.len();
        stream.extend_from_slice(&[0, 0, 18, 4, 0, 0, 0, 0, 0]);
        for n in 0..total {
            assert_eq!(parse(&stream[..n]), Ok(Early::NeedMore), "{n}");
        }
        assert_eq!(
            parse(&stream),
            Ok(Early::Present {
                len: total,
                challenge: Some("chalpub:00".into())
            })
        );
    }

    #[test]
    fn http2_settings_straight_away() {
        assert_eq!(parse(&[0, 0, 18, 4, 0, 0, 0, 0, 0]), Ok(Early::Absent));
        assert_eq!(parse(&[0]), Ok(Early::Absent));
        assert_eq!(parse(&[0xff, 0xff, 0xff, b'T', b'X']), Ok(Early::Absent));
    }

    #[test]
    fn bad_payloads() {
        let mut big = MAGIC.to_vec();
        big.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse(&big), Err(EarlyError::TooLarge(u32::MAX.into())));
        assert!(matches!(
            parse(&framed(b"[1]")),
            Err(EarlyError::BadJson(_))
        ));
        assert_eq!(
            parse(&framed(b"{}")),
            Ok(Early::Present {
                len: 11,
                challenge: None
            })
        );
    }
}
