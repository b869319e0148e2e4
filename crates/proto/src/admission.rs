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

use serde::de::{IgnoredAny, MapAccess};

use crate::json::{self, FieldSink};
use crate::key::NodePublic;

/// Most bytes of an answer's body that are read (derper's limit); a body
/// whose first JSON value does not end within them is an error.
pub const MAX_RESPONSE_BODY: usize = 4 << 10;

/// Why an answer's body does not say "allow" or "deny": not JSON, cut off
/// by [`MAX_RESPONSE_BODY`], not an object, or an `Allow` that is not a
/// boolean. Carries the decoder's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("admission answer is not a JSON object with a boolean Allow: {0}")]
pub struct ResponseError(pub String);

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
    json::decode_first_object::<Answer>(body)
        .map(|a| a.allow)
        .map_err(|e| ResponseError(e.to_string()))
}

/// The verdict in the first bytes of an answer's body, once its first
/// JSON value is whole in them: derper's decoder stops there and reads no
/// further, so what follows (more bytes, a break, a stall) changes
/// nothing. `None` while that value is not whole, or is not a verdict: the
/// end of the body (or [`MAX_RESPONSE_BODY`] bytes) decides then, through
/// [`parse_response`]. (Errors are left to that: a cut JSON text can look
/// like a syntax error, e.g. a body cut right after a minus sign.)
pub fn verdict_so_far(received: &[u8]) -> Option<bool> {
    let received = &received[..received.len().min(MAX_RESPONSE_BODY)];
    json::decode_first_object::<Answer>(received)
        .ok()
        .map(|a| a.allow)
}

/// The answer's one field derper reads.
#[derive(Default)]
struct Answer {
    allow: bool,
}

impl FieldSink for Answer {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        if key == "allow" {
            if let Some(allow) = map.next_value::<Option<bool>>()? {
                self.allow = allow;
            }
        } else {
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
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
    fn a_verdict_is_known_once_its_value_is_whole() {
        let whole = r#"{"Allow": true, "Note": [-1]} trailing"#;
        let done = whole.find('}').unwrap() + 1;
        for n in 0..=whole.len() {
            let got = verdict_so_far(&whole.as_bytes()[..n]);
            assert_eq!(got, (n >= done).then_some(true), "prefix {n}");
        }
        assert_eq!(verdict_so_far(br#"{"allow":false}"#), Some(false));
        assert_eq!(verdict_so_far(b"null"), Some(false));
        // Errors are the whole body's to decide.
        assert_eq!(verdict_so_far(b"<html"), None);
        assert_eq!(verdict_so_far(br#"{"Allow":1}"#), None);
    }

    #[test]
    fn bad_answers_are_errors() {
        let long = format!(
            r#"{{"pad":"{}","Allow":true}}"#,
            "x".repeat(MAX_RESPONSE_BODY)
        );
        for bad in [
            "",
            "<html>",
            r#"{"Allow":tru"#,
            "[true]",
            "true",
            r#"{"Allow":"yes"}"#,
            r#"{"Allow":1}"#,
            r#"{"Allow":"yes","Allow":true}"#,
            // A value cut off by the size limit.
            &long,
        ] {
            assert!(parse_response(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
