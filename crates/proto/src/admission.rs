//! Client admission by webhook (derper's `--verify-client-url`): the
//! request body the relay posts and the rule that reads the answer.
//!
//! The relay asks an admission controller (Headscale's `/verify`, or any
//! service that speaks the same JSON) whether a node key may use it, after
//! the client's `clientInfo` is opened and before `serverInfo` is sent. The
//! request is `{"NodePublic":"nodekey:<hex>","Source":"<client IP>"}`; the
//! answer admits only as HTTP 200 with a JSON object whose `Allow` is
//! `true`. [`parse_response`] reads the body as derper does (Go's
//! `encoding/json` decoding into a struct): only the first JSON value
//! counts, field names match without regard to case, an exact-case `Allow`
//! wins over other spellings, a later duplicate wins over an earlier one,
//! `null` leaves the default (not allowed), and a value of any other type
//! is an error, which rejects.

use std::net::IpAddr;

use crate::key::NodePublic;

/// Most bytes of an answer's body that are read (derper's limit); a body
/// whose first JSON value does not end within them is an error.
pub const MAX_RESPONSE_BODY: usize = 4 << 10;

/// Why an answer's body does not say "allow" or "deny".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// The body does not start with a JSON value (or it is cut off).
    #[error("admission answer is not JSON: {0}")]
    NotJson(String),
    /// The first JSON value is not an object (nor `null`).
    #[error("admission answer is a JSON {0}, not an object")]
    NotObject(&'static str),
    /// `Allow` holds something other than `true`, `false` or `null`.
    #[error("admission answer's Allow is a JSON {0}, not a boolean")]
    AllowNotBool(&'static str),
}

/// The JSON body posted to the admission controller.
pub fn request_body(key: &NodePublic, source: IpAddr) -> Vec<u8> {
    let source = match source {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(source, IpAddr::V4),
        v4 => v4,
    };
    format!("{{\"NodePublic\":\"{key}\",\"Source\":\"{source}\"}}").into_bytes()
}

/// Whether an HTTP 200 answer's body admits the client (`Ok(false)`: the
/// controller said no or did not say yes). Only the first
/// [`MAX_RESPONSE_BODY`] bytes are looked at.
pub fn parse_response(body: &[u8]) -> Result<bool, ResponseError> {
    let body = &body[..body.len().min(MAX_RESPONSE_BODY)];
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Answer>();
    match values.next() {
        Some(Ok(Answer(result))) => result,
        Some(Err(e)) => Err(ResponseError::NotJson(e.to_string())),
        None => Err(ResponseError::NotJson("empty body".to_owned())),
    }
}

/// The first JSON value of an answer, read in document order.
struct Answer(Result<bool, ResponseError>);

impl<'de> serde::Deserialize<'de> for Answer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AnswerVisitor)
    }
}

struct AnswerVisitor;

impl AnswerVisitor {
    fn not_object<E>(what: &'static str) -> Result<Answer, E> {
        Ok(Answer(Err(ResponseError::NotObject(what))))
    }
}

impl<'de> serde::de::Visitor<'de> for AnswerVisitor {
    type Value = Answer;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_unit<E>(self) -> Result<Answer, E> {
        Ok(Answer(Ok(false)))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Answer, E> {
        Self::not_object("boolean")
    }

    fn visit_i64<E>(self, _: i64) -> Result<Answer, E> {
        Self::not_object("number")
    }

    fn visit_u64<E>(self, _: u64) -> Result<Answer, E> {
        Self::not_object("number")
    }

    fn visit_f64<E>(self, _: f64) -> Result<Answer, E> {
        Self::not_object("number")
    }

    fn visit_str<E>(self, _: &str) -> Result<Answer, E> {
        Self::not_object("string")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Answer, A::Error> {
        // Read to its end, so that a cut-off array is "not JSON" as in Go.
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Self::not_object("array")
    }

    /// Go assigns every key that folds to `Allow`, in document order; a
    /// `null` leaves the value as it was; a value of another type is an
    /// error once the whole object is read.
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Answer, A::Error> {
        let mut allow = false;
        let mut wrong = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !eq_fold_allow(&key) {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            }
            match map.next_value::<serde_json::Value>()? {
                serde_json::Value::Null => {}
                serde_json::Value::Bool(b) => allow = b,
                other => wrong = Some(kind(&other)),
            }
        }
        Ok(Answer(match wrong {
            Some(what) => Err(ResponseError::AllowNotBool(what)),
            None => Ok(allow),
        }))
    }
}

/// Go's case folding for the field name `Allow`: its letters fold only to
/// ASCII letters (no `k` or `s`, whose folds include non-ASCII signs), so
/// ASCII case-insensitivity is exact.
fn eq_fold_allow(k: &str) -> bool {
    k.eq_ignore_ascii_case("allow")
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_body_as_derper_sends_it() {
        let key = NodePublic::from_hex(
            "07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c",
        )
        .unwrap();
        let body = request_body(&key, "::ffff:198.51.100.7".parse().unwrap());
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "{\"NodePublic\":\"nodekey:07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c\",\"Source\":\"198.51.100.7\"}"
        );
        let body = request_body(&key, "2001:db8::1".parse().unwrap());
        assert!(String::from_utf8(body)
            .unwrap()
            .ends_with("\"Source\":\"2001:db8::1\"}"));
    }

    #[test]
    fn answers_read_as_go_reads_them() {
        let ok = |b: &str| parse_response(b.as_bytes());
        assert_eq!(ok(r#"{"Allow":true}"#), Ok(true));
        assert_eq!(ok(r#" {"allow": true} "#), Ok(true));
        assert_eq!(ok(r#"{"ALLOW":true,"Other":[1,2]}"#), Ok(true));
        assert_eq!(ok(r#"{"Allow":false}"#), Ok(false));
        assert_eq!(ok(r#"{}"#), Ok(false));
        assert_eq!(ok("null"), Ok(false));
        assert_eq!(ok(r#"{"Allow":null}"#), Ok(false));
        // Only the first value counts; what follows it is not read.
        assert_eq!(ok(r#"{"Allow":true} trailing garbage"#), Ok(true));
        // Every spelling counts, in document order; null changes nothing.
        assert_eq!(
            ok(r#"{"allow":false,"Allow":true,"aLLow":false}"#),
            Ok(false)
        );
        assert_eq!(ok(r#"{"aLLow":false,"Allow":true}"#), Ok(true));
        assert_eq!(ok(r#"{"Allow":true,"allow":null}"#), Ok(true));
        assert_eq!(ok(r#"{"Allow":true,"Allow":false}"#), Ok(false));
    }

    #[test]
    fn bad_answers_are_errors() {
        let err = |b: &str| parse_response(b.as_bytes()).unwrap_err();
        assert!(matches!(err(""), ResponseError::NotJson(_)));
        assert!(matches!(err("<html>"), ResponseError::NotJson(_)));
        assert!(matches!(err(r#"{"Allow":tru"#), ResponseError::NotJson(_)));
        assert_eq!(err("[true]"), ResponseError::NotObject("array"));
        assert_eq!(err("true"), ResponseError::NotObject("boolean"));
        assert_eq!(
            err(r#"{"Allow":"yes"}"#),
            ResponseError::AllowNotBool("string")
        );
        assert_eq!(err(r#"{"Allow":1}"#), ResponseError::AllowNotBool("number"));
        // A value cut off by the size limit is not JSON.
        let long = format!(
            r#"{{"pad":"{}","Allow":true}}"#,
            "x".repeat(MAX_RESPONSE_BODY)
        );
        assert!(matches!(err(&long), ResponseError::NotJson(_)));
    }
}
