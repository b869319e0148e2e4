//! JSON object decoding with Go's key matching rules.
//!
//! Go's `encoding/json` matches object keys to struct fields
//! case-insensitively, processes keys in document order (so a later duplicate
//! overwrites an earlier one), treats `null` as "leave the field alone" and
//! ignores unknown keys. Peers rely on that leniency, so the handshake and key
//! file decoders follow it: [`decode_object`] walks the object in order and
//! hands every key, folded to lowercase, to a per-type field setter.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::fmt;

/// Folds a key the way Go's case-insensitive match does for the ASCII field
/// names used in DERP: ASCII letters lowercase, and the two non-ASCII runes
/// that Unicode simple folding maps onto ASCII letters (`ſ` → `s`, Kelvin sign
/// `K` → `k`). Other non-ASCII characters are kept and so never match.
pub(crate) fn fold_key(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{017f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// A struct that can be filled from a JSON object field by field.
pub(crate) trait FieldSink: Default {
    /// Consumes the value of the field whose folded key is `key`. Unknown
    /// keys must be consumed too (as `serde::de::IgnoredAny`).
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
}

struct ObjectVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: FieldSink> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    // Go's decoder leaves a struct untouched when the whole document is `null`.
    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut value = T::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            value.field(&fold_key(&key), &mut map)?;
        }
        Ok(value)
    }
}

/// Decodes `bytes` as one JSON object (or `null`) into `T`.
pub(crate) fn decode_object<T: FieldSink>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = (&mut de).deserialize_any(ObjectVisitor::<T>(std::marker::PhantomData))?;
    de.end()?;
    Ok(value)
}

/// Decodes the first JSON value of `bytes`, an object (or `null`), into
/// `T`, ignoring whatever follows it: what Go's `json.Decoder.Decode` does
/// with a response body.
pub(crate) fn decode_first_object<T: FieldSink>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    (&mut de).deserialize_any(ObjectVisitor::<T>(std::marker::PhantomData))
}

/// A value decoded from a nested JSON object (or `null`) with
/// [`decode_object`]'s rules, for objects inside objects and maps.
pub(crate) struct GoObject<T>(pub(crate) T);

impl<'de, T: FieldSink> de::Deserialize<'de> for GoObject<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjectVisitor::<T>(std::marker::PhantomData))
            .map(GoObject)
    }
}

/// Appends `s` to `out` as a JSON string literal (quoted and escaped).
pub(crate) fn push_string(out: &mut Vec<u8>, s: &str) {
    // Serialising a &str into a Vec cannot fail.
    serde_json::to_writer(&mut *out, s).unwrap_or_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug, PartialEq)]
    struct Probe {
        seen: Vec<String>,
    }

    impl FieldSink for Probe {
        fn field<'de, A: MapAccess<'de>>(
            &mut self,
            key: &str,
            map: &mut A,
        ) -> Result<(), A::Error> {
            self.seen.push(key.to_owned());
            map.next_value::<de::IgnoredAny>()?;
            Ok(())
        }
    }

    #[test]
    fn order_fold_null_and_trailing() {
        let p: Probe = decode_object(br#"{"B":1,"a":[{}],"\u017f":null}"#).unwrap();
        assert_eq!(p.seen, ["b", "a", "s"]);
        assert_eq!(decode_object::<Probe>(b" null ").unwrap(), Probe::default());
        assert!(decode_object::<Probe>(b"{} x").is_err());
        assert!(decode_object::<Probe>(b"[]").is_err());
        assert!(decode_object::<Probe>(b"").is_err());
        let p: Probe = decode_first_object(br#"{"B":1} x"#).unwrap();
        assert_eq!(p.seen, ["b"]);
        assert!(decode_first_object::<Probe>(b"[]").is_err());
    }

    #[test]
    fn escaped_string() {
        let mut out = Vec::new();
        push_string(&mut out, "a\"b\n");
        assert_eq!(out, br#""a\"b\n""#);
    }
}
