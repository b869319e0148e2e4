//! Counters of what the relay refuses or drops so that one client cannot
//! grow another's queues: control frames other clients caused, dropped
//! over a connection's cap, and relayAllocate refusals. (Connections
//! closed for their own control queue count in
//! `ferry_connections_closed_total{reason="control_queue_full"}`.)

use ferry_engine::stat::exposition::{Exposition, Family};
use ferry_proto::relay_session::RefuseReason;

use super::Metrics;

labelled!(
    /// A control frame that another client caused, dropped when the
    /// receiving connection's control queue was past its share for them.
    Notice {
        /// peerGone(Disconnected): a client this one received from left.
        PeerGone => "peer_gone",
        /// relaySession to the peer of a session someone else asked for.
        RelaySession => "relay_session",
    }
);

labelled!(
    /// Why a relayAllocate was refused (`docs/relay-sessions.md` §2).
    AllocateRefusal {
        /// The peer is not connected to this node.
        PeerNotHere => "peer_not_here",
        /// The peer did not ask for relay sessions.
        PeerNotCapable => "peer_not_capable",
        /// A per-key or per-source session limit.
        Limit => "limit",
        /// Sessions are off.
        Off => "off",
        /// The peer is the asker itself.
        SelfPeer => "self",
        /// The asker's connection asked faster than its rate.
        Rate => "rate",
        /// The peer is on another node of the region and no node of the
        /// two can host the session now.
        NoHost => "no_host",
        /// A reason this build does not name.
        Other => "other",
    }
);

labelled!(
    /// Why a meshSession frame from a mesh peer was dropped
    /// (`docs/relay-sessions.md` §9.3).
    MeshSessionDrop {
        /// Its body does not parse as its kind's.
        Malformed => "malformed",
        /// Longer than a meshSession may be.
        Oversize => "oversize",
        /// A kind this build does not know.
        UnknownKind => "unknown_kind",
        /// Well formed, but this build does not act on its kind yet.
        Unhandled => "unhandled",
        /// For a client with no active connection here.
        NotHere => "not_here",
        /// For a client here that does not speak relay sessions version 2.
        NotCapable => "not_capable",
        /// An offer whose host is not the node that sent it.
        WrongHost => "wrong_host",
        /// From a mesh peer to which this relay has no link up that
        /// speaks the Ferry mesh extension: nowhere to answer it, and no
        /// word from that node on which keys it holds.
        NoConnection => "no_connection",
        /// An allocate for an asker the sending node's link has not
        /// announced (the node may only ask for its own clients).
        NotAnnounced => "not_announced",
        /// Past the rate one node may send them at
        /// ([`crate::mesh::MESH_SESSION_RATE`]).
        Rate => "rate",
        /// An end or a decline naming no session hosted here with the
        /// sending node's key in it.
        NoSession => "no_session",
    }
);

labelled!(
    /// What became of a meshSession frame this relay meant to send to a
    /// node of its region.
    MeshSessionSent {
        /// Queued for the node's link.
        Queued => "queued",
        /// Dropped: the link's queue was past its cap.
        Full => "full",
        /// Dropped: queued, but the link went down before it was sent.
        LinkDown => "link_down",
        /// Not sent: no link to the node up that speaks the Ferry mesh
        /// extension.
        NoLink => "no_link",
    }
);

impl MeshSessionDrop {
    /// The counter for a frame that did not parse.
    pub fn of(e: &ferry_proto::mesh_session::MeshSessionError) -> Self {
        use ferry_proto::mesh_session::MeshSessionError as E;
        match e {
            E::Malformed(_) => MeshSessionDrop::Malformed,
            E::Oversize(_) => MeshSessionDrop::Oversize,
            E::UnknownKind(_) => MeshSessionDrop::UnknownKind,
        }
    }
}

impl AllocateRefusal {
    /// The counter for a refusal sent with `reason`.
    pub fn of(reason: RefuseReason) -> Self {
        match reason {
            RefuseReason::PeerNotHere => AllocateRefusal::PeerNotHere,
            RefuseReason::PeerNotCapable => AllocateRefusal::PeerNotCapable,
            RefuseReason::Limit => AllocateRefusal::Limit,
            RefuseReason::Off => AllocateRefusal::Off,
            RefuseReason::SelfPeer => AllocateRefusal::SelfPeer,
            RefuseReason::RateLimited => AllocateRefusal::Rate,
            ferry_proto::relay_session::v2::REFUSED_NO_HOST => AllocateRefusal::NoHost,
            RefuseReason::Other(_) => AllocateRefusal::Other,
        }
    }
}

const CONTROL_FRAMES_DROPPED: Family = Family::counter(
    "ferry_control_frames_dropped_total",
    "Control frames other clients caused (peerGone, a session's offer to its peer), dropped because the receiving connection's control queue was past their share of its cap.",
)
.labels(&["frame"]);

const ALLOCATE_REFUSED: Family = Family::counter(
    "ferry_relay_allocate_refused_total",
    "relayAllocate requests answered with relayRefused, by reason.",
)
.labels(&["reason"]);

const MESH_SESSION_DROPPED: Family = Family::counter(
    "ferry_mesh_session_dropped_total",
    "meshSession frames from mesh peers that asked for the Ferry mesh extension, dropped, by reason (the mesh connection stays open).",
)
.labels(&["reason"]);

const MESH_SESSION_SENT: Family = Family::counter(
    "ferry_mesh_session_sent_total",
    "meshSession frames this relay meant to send to the region's other Ferry nodes, by result (queued, or dropped and why).",
)
.labels(&["result"]);

impl Metrics {
    /// Writes the families of this module.
    pub(super) fn render_limits(&self, w: &mut Exposition<'_>) {
        let mut f = w.family(&CONTROL_FRAMES_DROPPED);
        for n in Notice::ALL {
            f.sample(
                &[n.label()],
                self.sum(|s| s.notices_dropped[*n as usize].get()),
            );
        }
        let mut f = w.family(&ALLOCATE_REFUSED);
        for r in AllocateRefusal::ALL {
            f.sample(
                &[r.label()],
                self.sum(|s| s.allocate_refused[*r as usize].get()),
            );
        }
        let mut f = w.family(&MESH_SESSION_DROPPED);
        for r in MeshSessionDrop::ALL {
            f.sample(
                &[r.label()],
                self.sum(|s| s.mesh_session_dropped[*r as usize].get()),
            );
        }
        let mut f = w.family(&MESH_SESSION_SENT);
        for r in MeshSessionSent::ALL {
            f.sample(
                &[r.label()],
                self.sum(|s| s.mesh_session_sent[*r as usize].get()),
            );
        }
    }
}
