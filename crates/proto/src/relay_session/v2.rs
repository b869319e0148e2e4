//! Relay sessions, version 2 (`docs/relay-sessions.md` §9): the frames a
//! relay sends to clients that asked for `"ferryRelay": 2`, for sessions
//! that may live on another node of the region than the client's own.
//!
//! - relaySession2 (`0xf3`, S→C) is version 1's relaySession with the
//!   hosting node's key and flags before the endpoints; it replaces
//!   relaySession for a version-2 client.
//! - relaySessionEnd (`0xf4`, S→C): a session ends (its host drains, or
//!   it was freed), with the time it still forwards.
//!
//! relayAllocate and relayRefused are version 1's (reason 7 is new:
//! [`RefuseReason::Other`]`(7)`, [`REFUSED_NO_HOST`]).

use super::{
    bad_length, key_at, millis, parse_offer, put_offer, u32_at, RefuseReason, SessionOffer,
    ENDPOINT_LEN, MAX_ENDPOINTS, SESSION_FIXED_LEN,
};
use crate::frame::{self, FrameError, KEY_LEN};
use crate::key::NodePublic;
use std::time::Duration;

/// The version of relay sessions this module speaks.
pub const VERSION: u32 = 2;
/// relaySession2's type byte.
pub const RELAY_SESSION2: u8 = 0xf3;
/// relaySessionEnd's type byte.
pub const RELAY_SESSION_END: u8 = 0xf4;
/// Refusal reason 7: the peer is in the region, but no node can host the
/// session now.
pub const REFUSED_NO_HOST: RefuseReason = RefuseReason::Other(7);
/// relaySession2's bytes between version 1's fixed fields and the
/// endpoints: host key ‖ flags.
const TAIL_LEN: usize = KEY_LEN + 1;
/// Length of a relaySession2 body before its endpoints (114).
pub const SESSION2_FIXED_LEN: usize = SESSION_FIXED_LEN + TAIL_LEN;
/// Longest relaySession2 body.
pub const MAX_SESSION2_LEN: usize = SESSION2_FIXED_LEN + MAX_ENDPOINTS * ENDPOINT_LEN;
/// Length of a relaySessionEnd body: vni ‖ peer ‖ host ‖ reason ‖ grace.
pub const END_LEN: usize = 4 + KEY_LEN + KEY_LEN + 1 + 4;
/// relaySession2 flag: the session lives on another node than the one
/// the client is connected to (its endpoints are that node's; an
/// unspecified one is unusable).
pub const FLAG_CROSS_NODE: u8 = 0x01;

/// relaySession2 (server → client): a session, this client's slot in it,
/// and the node that hosts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOffer2 {
    /// Version 1's fields; its endpoints are the host's.
    pub offer: SessionOffer,
    /// The hosting node's server key.
    pub host: NodePublic,
    /// [`FLAG_CROSS_NODE`]; other bits are kept as they came (a later
    /// version's) and mean nothing here.
    pub flags: u8,
}

impl SessionOffer2 {
    /// Whether the session lives on another node than the client's own.
    pub fn cross_node(&self) -> bool {
        self.flags & FLAG_CROSS_NODE != 0
    }

    /// Whether a client can use the offer's endpoints: an unspecified
    /// endpoint means "the address you reached DERP at", which is right
    /// only for a session on the client's own node.
    pub fn endpoints_usable(&self) -> bool {
        !self.cross_node()
            || self
                .offer
                .endpoints
                .iter()
                .all(|e| !e.ip().is_unspecified())
    }
}

/// Why a session ended (relaySessionEnd's reason byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// 1: the host is draining; ask again now, the session forwards for
    /// the grace time.
    Draining,
    /// 2: the session was freed (its peer's node could not tell the peer,
    /// the mesh link to it went down).
    Freed,
    /// Any other byte (a later version's reason).
    Other(u8),
}

impl EndReason {
    /// The wire byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            EndReason::Draining => 1,
            EndReason::Freed => 2,
            EndReason::Other(b) => b,
        }
    }

    /// The reason for a wire byte.
    pub const fn from_u8(b: u8) -> Self {
        match b {
            1 => EndReason::Draining,
            2 => EndReason::Freed,
            b => EndReason::Other(b),
        }
    }
}

/// relaySessionEnd (server → client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionEnd {
    /// The session id.
    pub vni: u32,
    /// The other client of the session.
    pub peer: NodePublic,
    /// The node that hosted it.
    pub host: NodePublic,
    /// Why.
    pub reason: EndReason,
    /// How long the session still forwards (whole milliseconds, at most
    /// `u32::MAX` of them).
    pub grace: Duration,
}

/// A version-2 frame to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame2 {
    /// relaySession2.
    Session(SessionOffer2),
    /// relaySessionEnd.
    End(SessionEnd),
}

/// Appends a relaySession2 frame. Panics on an offer a relay must never
/// send (as [`super::put_session`]).
pub fn put_session2(out: &mut Vec<u8>, s: &SessionOffer2) {
    let len = SESSION2_FIXED_LEN + s.offer.endpoints.len() * ENDPOINT_LEN;
    out.reserve(frame::HEADER_LEN + len);
    out.extend_from_slice(&frame::encode_header(RELAY_SESSION2, len as u32));
    put_session2_body(out, s);
}

/// Appends a relaySession2 body (the frame's, and a mesh offer's).
pub fn put_session2_body(out: &mut Vec<u8>, s: &SessionOffer2) {
    let mut tail = [0u8; TAIL_LEN];
    tail[..KEY_LEN].copy_from_slice(s.host.as_bytes());
    tail[KEY_LEN] = s.flags;
    put_offer(out, &s.offer, &tail);
}

/// Parses a relaySession2 body: version 1's checks, then the host and
/// flags.
pub fn parse_session2(body: &[u8]) -> Result<SessionOffer2, FrameError> {
    let (offer, tail) = parse_offer::<TAIL_LEN>(RELAY_SESSION2, body)?;
    Ok(SessionOffer2 {
        offer,
        host: key_at(&tail, 0),
        flags: tail[KEY_LEN],
    })
}

/// Appends a relaySessionEnd frame.
pub fn put_end(out: &mut Vec<u8>, e: &SessionEnd) {
    out.extend_from_slice(&frame::encode_header(RELAY_SESSION_END, END_LEN as u32));
    put_end_body(out, e);
}

/// Appends a relaySessionEnd body (the frame's, and a mesh end's).
pub fn put_end_body(out: &mut Vec<u8>, e: &SessionEnd) {
    out.extend_from_slice(&e.vni.to_be_bytes());
    out.extend_from_slice(e.peer.as_bytes());
    out.extend_from_slice(e.host.as_bytes());
    out.push(e.reason.to_u8());
    out.extend_from_slice(&millis(e.grace).to_be_bytes());
}

/// Parses a relaySessionEnd body (exactly [`END_LEN`] bytes).
pub fn parse_end(body: &[u8]) -> Result<SessionEnd, FrameError> {
    if body.len() != END_LEN {
        return Err(bad_length(RELAY_SESSION_END, body.len(), END_LEN));
    }
    Ok(SessionEnd {
        vni: u32_at(body, 0),
        peer: key_at(body, 4),
        host: key_at(body, 4 + KEY_LEN),
        reason: EndReason::from_u8(body[4 + 2 * KEY_LEN]),
        grace: Duration::from_millis(u32_at(body, 5 + 2 * KEY_LEN).into()),
    })
}

/// Parses either version-2 frame; `None` for another frame type.
pub fn parse_frame2(ty: u8, body: &[u8]) -> Option<Result<Frame2, FrameError>> {
    Some(match ty {
        RELAY_SESSION2 => parse_session2(body).map(Frame2::Session),
        RELAY_SESSION_END => parse_end(body).map(Frame2::End),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay_session::tests::{key, offer};
    use crate::testutil::relay_sessions_vector as doc_vector;

    fn offer2() -> SessionOffer2 {
        SessionOffer2 {
            offer: offer(),
            host: key(0xcc),
            flags: FLAG_CROSS_NODE,
        }
    }

    fn end() -> SessionEnd {
        SessionEnd {
            vni: 0x12_3456,
            peer: key(0xbb),
            host: key(0xcc),
            reason: EndReason::Draining,
            grace: Duration::from_secs(10),
        }
    }

    #[test]
    fn vectors_from_the_protocol_document() {
        let mut out = Vec::new();
        put_session2(&mut out, &offer2());
        assert_eq!(out, doc_vector("relaySession2"));
        assert_eq!(out.len(), frame::HEADER_LEN + 114 + 2 * 18);
        assert_eq!(parse_session2(&out[frame::HEADER_LEN..]), Ok(offer2()));
        out.clear();
        put_end(&mut out, &end());
        assert_eq!(out, doc_vector("relaySessionEnd"));
        assert_eq!(out.len(), frame::HEADER_LEN + 73);
        assert_eq!(parse_end(&out[frame::HEADER_LEN..]), Ok(end()));
    }

    #[test]
    fn session2_is_checked_as_version_1_and_keeps_unknown_flags() {
        let mut body = Vec::new();
        put_session2_body(&mut body, &offer2());
        // One endpoint short of whole, too short, too long.
        assert!(parse_session2(&body[..body.len() - 1]).is_err());
        assert!(parse_session2(&body[..SESSION2_FIXED_LEN]).is_err());
        let mut long = body.clone();
        for _ in 0..MAX_ENDPOINTS {
            long.extend_from_slice(&[0; ENDPOINT_LEN]);
        }
        assert!(matches!(
            parse_session2(&long),
            Err(FrameError::TooLong {
                max: MAX_SESSION2_LEN,
                ..
            })
        ));
        // VNI 0, slot 2.
        let mut bad = body.clone();
        bad[4..8].copy_from_slice(&[0; 4]);
        assert!(parse_session2(&bad).is_err());
        let mut bad = body.clone();
        bad[8 + KEY_LEN] = 2;
        assert!(parse_session2(&bad).is_err());
        // A later version's flag bit survives a round trip and is no
        // cross-node flag.
        let mut later = body.clone();
        later[SESSION2_FIXED_LEN - 1] = 0x80;
        let parsed = parse_session2(&later).unwrap();
        assert!(!parsed.cross_node());
        let mut again = Vec::new();
        put_session2_body(&mut again, &parsed);
        assert_eq!(again, later);
        assert_eq!(
            parse_end(&[0; END_LEN - 1]).unwrap_err(),
            bad_length(RELAY_SESSION_END, END_LEN - 1, END_LEN)
        );
    }

    #[test]
    fn a_cross_node_offer_with_an_unspecified_endpoint_is_unusable() {
        let mut o = offer2();
        assert!(o.endpoints_usable());
        o.offer.endpoints.push("0.0.0.0:3479".parse().unwrap());
        assert!(!o.endpoints_usable());
        o.flags = 0;
        assert!(
            o.endpoints_usable(),
            "on the client's own node it keeps version 1's meaning"
        );
    }

    #[test]
    fn reasons_round_trip_and_version_1_frames_are_not_version_2() {
        for b in 0..=255u8 {
            assert_eq!(EndReason::from_u8(b).to_u8(), b);
        }
        assert_eq!(REFUSED_NO_HOST.to_u8(), 7);
        assert!(parse_frame2(frame::RELAY_SESSION, &[]).is_none());
        assert!(super::super::parse_frame(RELAY_SESSION2, &[]).is_none());
    }
}
