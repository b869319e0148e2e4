//! Hexadecimal encoding of fixed-size keys.
//!
//! Keys travel as 64 hex digits in several places (key text forms, the
//! `Derp-Public-Key` header, the mesh key, JSON). Encoding always emits
//! lowercase; decoding accepts either case, as Go does.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends the lowercase hex form of `bytes` to `out`.
pub(crate) fn encode_into(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// Appends the lowercase hex form of `bytes` to a byte buffer.
pub(crate) fn encode_bytes_into(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0x0f)]);
    }
}

/// Returns the lowercase hex form of `bytes`.
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    encode_into(&mut s, bytes);
    s
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Why a hex string did not decode to 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HexError {
    /// The string is not exactly 64 characters (bytes) long.
    Length(usize),
    /// A character is not a hex digit.
    Digit,
}

/// Decodes exactly 64 hex digits (either case) into 32 bytes.
pub(crate) fn decode32(s: &str) -> Result<[u8; 32], HexError> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return Err(HexError::Length(b.len()));
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let hi = nibble(pair[0]).ok_or(HexError::Digit)?;
        let lo = nibble(pair[1]).ok_or(HexError::Digit)?;
        out[i] = (hi << 4) | lo;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_case() {
        let bytes: [u8; 32] = core::array::from_fn(|i| (i * 7 + 3) as u8);
        let s = encode(&bytes);
        assert_eq!(s.len(), 64);
        assert_eq!(decode32(&s), Ok(bytes));
        assert_eq!(decode32(&s.to_uppercase()), Ok(bytes));
        assert_eq!(decode32(&s[..63]), Err(HexError::Length(63)));
        let mut bad = s.clone();
        bad.replace_range(10..11, "g");
        assert_eq!(decode32(&bad), Err(HexError::Digit));
        // Multi-byte characters count by bytes and never panic.
        assert!(decode32(&"é".repeat(32)).is_err());
    }
}
