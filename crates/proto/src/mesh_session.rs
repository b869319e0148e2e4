//! meshSession (`0xf8`), the Ferry extension of the mesh protocol
//! between two Ferry nodes of a region (`docs/relay-sessions.md` §9.3):
//! how nodes agree on which one hosts a relay session whose two keys are
//! connected to different nodes, and tell each other's clients.
//!
//! A frame is addressed to a client key (`dst`) and routed like
//! forwardPacket (the mesh connection that announced `dst`); the
//! receiver acts only if `dst` is connected to it and never forwards it
//! again. It goes client → server only, on a mesh connection whose
//! server announced `"ferryMesh"` in serverInfo, from a mesh-key client
//! that asked for it in clientInfo. Any other server (derper, an older
//! Ferry) sees an unknown frame type and skips it.
//!
//! `dst ‖ kind u8 ‖ body`, the whole frame (header included) at most
//! [`MAX_FRAME_LEN`] bytes; the bodies reuse the client frames' layouts.

use crate::frame::{self, FrameError, KEY_LEN};
use crate::key::NodePublic;
use crate::relay_session::v2::{self, SessionEnd, SessionOffer2};
use crate::relay_session::{self as rs, key_at, u32_at, Refused};
use std::net::{IpAddr, Ipv6Addr};

/// meshSession's type byte.
pub const MESH_SESSION: u8 = 0xf8;
/// The version of this extension (the `ferryMesh` capability's value).
pub const VERSION: u32 = 1;
/// Longest meshSession frame, header included.
pub const MAX_FRAME_LEN: usize = 512;
/// Longest meshSession body.
pub const MAX_BODY_LEN: usize = MAX_FRAME_LEN - frame::HEADER_LEN;
/// Length of an allocate body: asker ‖ request id ‖ asker IP ‖ connection id.
pub const ALLOCATE_LEN: usize = KEY_LEN + 4 + 16 + 8;
/// Length of a declined body: vni ‖ key not told ‖ reason.
pub const DECLINED_LEN: usize = 4 + KEY_LEN + 1;
/// Length of a state body: flags ‖ hosted sessions.
pub const STATE_LEN: usize = 1 + 4;
/// State flag: this node hosts sessions.
pub const STATE_SESSIONS_ON: u8 = 0x01;
/// State flag: this node is draining.
pub const STATE_DRAINING: u8 = 0x02;

/// The kinds of meshSession.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshMsg {
    /// 1: host a session for `asker` (connected to the sender) and `dst`
    /// (connected to the receiver).
    Allocate {
        /// The client that asked, on the sender's node.
        asker: NodePublic,
        /// Its request id, echoed to it in the offer.
        request_id: u32,
        /// The asker's source address as its node saw it (per-source
        /// limits); IPv4 as itself.
        asker_ip: IpAddr,
        /// The asker's connection on its node.
        conn_id: u64,
    },
    /// 2: tell `dst` of a session the sender hosts (the offer's host must
    /// be the sender's key).
    Offer(SessionOffer2),
    /// 3: the sender refused `dst`'s allocation.
    Refused(Refused),
    /// 4: a session the sender hosts ended; tell `dst`.
    End(SessionEnd),
    /// 5: the receiver's session `vni` could not be told to `key`.
    Declined {
        /// The session.
        vni: u32,
        /// The client not told.
        key: NodePublic,
        /// Why (a [`rs::RefuseReason`] byte).
        reason: u8,
    },
    /// 6: the sender's state, addressed to the zero key.
    State {
        /// [`STATE_SESSIONS_ON`], [`STATE_DRAINING`]; other bits kept.
        flags: u8,
        /// Sessions the sender hosts.
        hosted: u32,
    },
}

impl MeshMsg {
    /// The kind byte.
    pub fn kind(&self) -> u8 {
        match self {
            MeshMsg::Allocate { .. } => 1,
            MeshMsg::Offer(_) => 2,
            MeshMsg::Refused(_) => 3,
            MeshMsg::End(_) => 4,
            MeshMsg::Declined { .. } => 5,
            MeshMsg::State { .. } => 6,
        }
    }

    /// The kind's name, as a metrics label.
    pub fn label(&self) -> &'static str {
        match self {
            MeshMsg::Allocate { .. } => "allocate",
            MeshMsg::Offer(_) => "offer",
            MeshMsg::Refused(_) => "refused",
            MeshMsg::End(_) => "end",
            MeshMsg::Declined { .. } => "declined",
            MeshMsg::State { .. } => "state",
        }
    }
}

/// One meshSession frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshSession {
    /// The client the frame is about (the zero key for `State`).
    pub dst: NodePublic,
    /// What it says.
    pub msg: MeshMsg,
}

/// Why a meshSession body was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MeshSessionError {
    /// Longer than [`MAX_BODY_LEN`].
    #[error("meshSession of {0} bytes, limit {MAX_BODY_LEN}")]
    Oversize(usize),
    /// A kind this version does not know.
    #[error("meshSession of unknown kind {0}")]
    UnknownKind(u8),
    /// Too short for `dst ‖ kind`, or a body that does not parse as its
    /// kind's.
    #[error("malformed meshSession: {0}")]
    Malformed(#[from] FrameError),
}

impl MeshSessionError {
    /// A metrics label: `oversize`, `unknown_kind`, `malformed`.
    pub fn label(&self) -> &'static str {
        match self {
            MeshSessionError::Oversize(_) => "oversize",
            MeshSessionError::UnknownKind(_) => "unknown_kind",
            MeshSessionError::Malformed(_) => "malformed",
        }
    }
}

/// Appends a meshSession frame. Panics on an offer a relay must never
/// send (as [`rs::put_session`]).
pub fn put_mesh_session(out: &mut Vec<u8>, m: &MeshSession) {
    let start = out.len();
    out.extend_from_slice(&frame::encode_header(MESH_SESSION, 0));
    out.extend_from_slice(m.dst.as_bytes());
    out.push(m.msg.kind());
    match &m.msg {
        MeshMsg::Allocate {
            asker,
            request_id,
            asker_ip,
            conn_id,
        } => {
            out.extend_from_slice(asker.as_bytes());
            out.extend_from_slice(&request_id.to_be_bytes());
            let ip = match asker_ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => *v6,
            };
            out.extend_from_slice(&ip.octets());
            out.extend_from_slice(&conn_id.to_be_bytes());
        }
        MeshMsg::Offer(o) => v2::put_session2_body(out, o),
        MeshMsg::Refused(r) => rs::put_refused_body(out, r),
        MeshMsg::End(e) => v2::put_end_body(out, e),
        MeshMsg::Declined { vni, key, reason } => {
            out.extend_from_slice(&vni.to_be_bytes());
            out.extend_from_slice(key.as_bytes());
            out.push(*reason);
        }
        MeshMsg::State { flags, hosted } => {
            out.push(*flags);
            out.extend_from_slice(&hosted.to_be_bytes());
        }
    }
    let len = out.len() - start - frame::HEADER_LEN;
    assert!(
        len <= MAX_BODY_LEN,
        "a meshSession fits {MAX_FRAME_LEN} bytes"
    );
    out[start..start + frame::HEADER_LEN]
        .copy_from_slice(&frame::encode_header(MESH_SESSION, len as u32));
}

fn exact(body: &[u8], len: usize) -> Result<(), FrameError> {
    if body.len() == len {
        Ok(())
    } else {
        Err(rs::bad_length(MESH_SESSION, body.len(), len))
    }
}

/// Parses a meshSession body. What parses re-encodes to the same bytes.
pub fn parse_mesh_session(body: &[u8]) -> Result<MeshSession, MeshSessionError> {
    if body.len() > MAX_BODY_LEN {
        return Err(MeshSessionError::Oversize(body.len()));
    }
    if body.len() < KEY_LEN + 1 {
        return Err(FrameError::TooShort {
            frame: MESH_SESSION,
            len: body.len(),
            min: KEY_LEN + 1,
        }
        .into());
    }
    let dst = key_at(body, 0);
    let kind = body[KEY_LEN];
    let b = &body[KEY_LEN + 1..];
    let msg = match kind {
        1 => {
            exact(b, ALLOCATE_LEN)?;
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[KEY_LEN + 4..KEY_LEN + 20]);
            let mut id = [0u8; 8];
            id.copy_from_slice(&b[KEY_LEN + 20..]);
            MeshMsg::Allocate {
                asker: key_at(b, 0),
                request_id: u32_at(b, KEY_LEN),
                asker_ip: Ipv6Addr::from(ip).to_canonical(),
                conn_id: u64::from_be_bytes(id),
            }
        }
        2 => MeshMsg::Offer(v2::parse_session2(b)?),
        3 => MeshMsg::Refused(rs::parse_refused(b)?),
        4 => MeshMsg::End(v2::parse_end(b)?),
        5 => {
            exact(b, DECLINED_LEN)?;
            MeshMsg::Declined {
                vni: u32_at(b, 0),
                key: key_at(b, 4),
                reason: b[4 + KEY_LEN],
            }
        }
        6 => {
            exact(b, STATE_LEN)?;
            MeshMsg::State {
                flags: b[0],
                hosted: u32_at(b, 1),
            }
        }
        k => return Err(MeshSessionError::UnknownKind(k)),
    };
    Ok(MeshSession { dst, msg })
}

#[cfg(test)]
mod tests;
