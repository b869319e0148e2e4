//! Application names (`docs/derp-protocol.md` §7.3): the opaque label a
//! client may put in clientInfo's `AppName` and that a server repeats to
//! watchers in peerPresent.
//!
//! A valid name is at most [`MAX_APP_NAME_LEN`] bytes, each a printable
//! ASCII byte (`0x20 ..= 0x7e`); the empty name is valid and means "none".
//! A server refuses a clientInfo whose name is invalid; a client reading
//! peerPresent treats an invalid or cut-short name as absent.

use std::fmt;

/// Longest valid application name, in bytes.
pub const MAX_APP_NAME_LEN: usize = 32;

/// How many characters of a refused name the error message shows.
const SHOWN_CHARS: usize = 40;

/// Whether `name` is a valid application name (empty included).
pub fn valid_app_name(name: &[u8]) -> bool {
    name.len() <= MAX_APP_NAME_LEN && name.iter().all(|b| (0x20..=0x7e).contains(b))
}

/// A valid, non-empty application name, stored inline (no allocation).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AppName {
    len: u8,
    bytes: [u8; MAX_APP_NAME_LEN],
}

impl AppName {
    /// The name, or `None` when `name` is empty or invalid.
    pub fn new(name: &[u8]) -> Option<Self> {
        if name.is_empty() || !valid_app_name(name) {
            return None;
        }
        let mut bytes = [0u8; MAX_APP_NAME_LEN];
        bytes[..name.len()].copy_from_slice(name);
        Some(AppName {
            len: name.len() as u8,
            bytes,
        })
    }

    /// The name as text (printable ASCII).
    pub fn as_str(&self) -> &str {
        // Only printable ASCII gets in (see `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for AppName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for AppName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused name as the refusal shows it: its first 40 characters,
/// [`quote`]d (Go's `%.40q`).
pub fn shown_app_name(name: &str) -> String {
    match name.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => quote(&name[..cut]),
        None => quote(name),
    }
}

/// `s` in double quotes, with quotes, backslashes and unprintable
/// characters escaped the way Go's `%q` escapes them (`\n`, `\x1f`,
/// `\u200b`, ...). Which non-ASCII characters count as printable follows
/// Rust's `char::escape_debug`, the nearest table the standard library
/// has.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_ascii() || c.escape_debug().count() == 1 => out.push(c),
            c if (c as u32) < 0x1_0000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_edges_length_and_byte_range() {
        assert!(valid_app_name(b""));
        assert!(valid_app_name(&[b'a'; 31]));
        assert!(valid_app_name(&[b'a'; 32]));
        assert!(!valid_app_name(&[b'a'; 33]));
        assert!(valid_app_name(b" ~"));
        assert!(!valid_app_name(b"a\x1f"));
        assert!(!valid_app_name(b"a\x7f"));
        assert!(!valid_app_name("caf\u{e9}".as_bytes()));
    }

    #[test]
    fn app_name_is_none_for_empty_or_invalid() {
        assert_eq!(AppName::new(b""), None);
        assert_eq!(AppName::new(&[b'x'; 33]), None);
        assert_eq!(AppName::new(b"\x1f"), None);
        let n = AppName::new(&[b'x'; 32]).unwrap();
        assert_eq!(n.as_str(), "x".repeat(32));
        assert_eq!(format!("{n:?}"), format!("{:?}", "x".repeat(32)));
    }

    #[test]
    fn shown_name_is_cut_at_40_chars_and_escaped_like_go() {
        assert_eq!(shown_app_name("ferry"), "\"ferry\"");
        assert_eq!(shown_app_name("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(shown_app_name("\x1f\x7f\n\t"), r#""\x1f\x7f\n\t""#);
        assert_eq!(shown_app_name("\u{200b}é"), "\"\\u200bé\"");
        let long = "y".repeat(50);
        assert_eq!(shown_app_name(&long), format!("\"{}\"", "y".repeat(40)));
        let wide = "é".repeat(41);
        assert_eq!(shown_app_name(&wide), format!("\"{}\"", "é".repeat(40)));
    }
}
