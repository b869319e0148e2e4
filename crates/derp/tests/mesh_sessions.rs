//! Relay sessions across the nodes of a region, on the simulated driver
//! with simulated time: what a shard does with the Ferry mesh extension's
//! meshSession frames (`docs/relay-sessions.md` §9.3) and the mesh links
//! the mesh thread reports.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_derp::shard::MeshNews;
use ferry_engine::mailbox::ByteRx;
use ferry_engine::Slot;
use ferry_proto::frame;
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::mesh_session::{self as ms, MeshMsg, MeshSession};
use ferry_udp::session::{Limits, Sessions};
use support::sim::{meshed, Sim};

const MESH_KEY: MeshKey = MeshKey([7; 32]);

/// A mesh peer with `key` that asked for the Ferry mesh extension.
fn ferry_mesh_peer(s: &mut Sim, key: &NodePrivate) -> Slot {
    let asked = ClientInfo {
        ferry_mesh: ms::VERSION,
        ..support::info(Some(MESH_KEY))
    };
    let slot = s.connect();
    s.greet_with(slot, key, &asked, &[]);
    let _ = s.frames(slot);
    slot
}

/// A well-formed meshSession (a node's state) addressed to the node.
fn state_frame() -> Vec<u8> {
    let mut out = Vec::new();
    ms::put_mesh_session(
        &mut out,
        &MeshSession {
            dst: NodePublic::from_bytes([0; 32]),
            msg: MeshMsg::State {
                flags: ms::STATE_SESSIONS_ON,
                hosted: 0,
            },
        },
    );
    out
}

fn dropped(s: &Sim, reason: &str) -> f64 {
    s.metric(&format!(
        "ferry_mesh_session_dropped_total{{reason=\"{reason}\"}}"
    ))
}

/// A meshSession belongs to this relay's own link to the node that sent
/// it (the sender's client key is that node's server key): it is taken
/// only while that link is up and speaks the Ferry mesh extension, and
/// from any other mesh peer it is dropped as `no_connection`.
#[test]
fn a_mesh_session_is_matched_to_this_nodes_link_to_its_sender() {
    let (mut s, _rx, _) = meshed(2, 64 * 1024, |cfg| cfg.mesh_key = Some(MESH_KEY));
    let (bk, ck) = (NodePrivate::generate(), NodePrivate::generate());
    let b = ferry_mesh_peer(&mut s, &bk);
    let c = ferry_mesh_peer(&mut s, &ck);
    let f = state_frame();
    let send = |s: &mut Sim, from: Slot| {
        s.d.receive(from, &f);
        s.settle();
    };

    // No link up yet: nowhere to match it.
    send(&mut s, b);
    assert_eq!(dropped(&s, "no_connection"), 1.0);

    // Link 1 comes up to B's node (Ferry), link 0 to C's (derper-like).
    s.news(
        1,
        MeshNews::Up {
            server_key: bk.public(),
            ferry_mesh: true,
        },
    );
    s.news(
        0,
        MeshNews::Up {
            server_key: ck.public(),
            ferry_mesh: false,
        },
    );
    send(&mut s, b);
    assert_eq!(
        dropped(&s, "no_connection"),
        1.0,
        "B's frame matched to link 1"
    );
    send(&mut s, c);
    assert_eq!(
        dropped(&s, "no_connection"),
        2.0,
        "C's link does not speak the Ferry mesh extension"
    );

    // B's link breaks: its frames have no link again.
    s.news(1, MeshNews::Down);
    send(&mut s, b);
    assert_eq!(dropped(&s, "no_connection"), 3.0, "B's link is down");
    let others: f64 = ["unhandled", "malformed", "oversize", "unknown_kind"]
        .iter()
        .map(|r| dropped(&s, r))
        .sum();
    assert_eq!(others, 0.0);
    assert!(s.d.is_open(b) && s.d.is_open(c));
}

/// The meshSession frames a shard put into one link's ring.
fn mesh_sessions(rx: &mut ByteRx) -> Vec<MeshSession> {
    let mut bytes = Vec::new();
    while rx
        .pop_with(|a, b| {
            bytes.extend_from_slice(a);
            bytes.extend_from_slice(b);
        })
        .is_some()
    {}
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        assert_eq!(bytes[at], ms::MESH_SESSION, "only meshSession frames");
        let body = &bytes[at + frame::HEADER_LEN..at + frame::HEADER_LEN + len];
        out.push(ms::parse_mesh_session(body).unwrap());
        at += frame::HEADER_LEN + len;
    }
    out
}

fn state_flags(msgs: &[MeshSession]) -> Vec<u8> {
    msgs.iter()
        .map(|m| match m.msg {
            MeshMsg::State { flags, .. } => flags,
            ref other => panic!("not a state: {other:?}"),
        })
        .collect()
}

/// When a link to a Ferry node comes up, this relay tells that node its
/// state on it (sessions on: it has a session table); a link to a node
/// that does not speak the extension gets nothing. The first state the
/// node sends back on a link since it came up is answered once with this
/// relay's own (so each learns of the other whichever link came up
/// first), never again however often the node repeats it, and again
/// after the link comes up anew.
#[test]
fn nodes_tell_each_other_their_state_once_per_link() {
    let sessions = Arc::new(Sessions::new(Limits::default()));
    sessions.set_bound("192.0.2.200:3479".parse().unwrap());
    let (mut s, mut rx, _) = meshed(2, 64 * 1024, move |cfg| {
        cfg.mesh_key = Some(MESH_KEY);
        cfg.relay_sessions = Some(sessions);
    });
    let (bk, ck) = (NodePrivate::generate(), NodePrivate::generate());
    s.news(
        0,
        MeshNews::Up {
            server_key: ck.public(),
            ferry_mesh: false,
        },
    );
    assert_eq!(mesh_sessions(&mut rx[0]), [], "derper-like link");
    s.news(
        1,
        MeshNews::Up {
            server_key: bk.public(),
            ferry_mesh: true,
        },
    );
    assert_eq!(
        state_flags(&mesh_sessions(&mut rx[1])),
        [ms::STATE_SESSIONS_ON]
    );

    let b = ferry_mesh_peer(&mut s, &bk);
    for round in 0..3 {
        s.d.receive(b, &state_frame());
        s.settle();
        let want: &[u8] = if round == 0 {
            &[ms::STATE_SESSIONS_ON]
        } else {
            &[]
        };
        assert_eq!(
            state_flags(&mesh_sessions(&mut rx[1])),
            want,
            "round {round}"
        );
    }
    assert_eq!(
        s.metric("ferry_mesh_session_dropped_total{reason=\"unhandled\"}"),
        0.0
    );

    // The link breaks and comes up again (the mesh thread clears what the
    // node said): told again, and the node's first state answered again.
    s.news(1, MeshNews::Down);
    s.shared.mesh.as_ref().unwrap().link_state[1].store(0, Ordering::Release);
    s.news(
        1,
        MeshNews::Up {
            server_key: bk.public(),
            ferry_mesh: true,
        },
    );
    s.d.receive(b, &state_frame());
    s.settle();
    assert_eq!(
        state_flags(&mesh_sessions(&mut rx[1])),
        [ms::STATE_SESSIONS_ON, ms::STATE_SESSIONS_ON]
    );
    assert_eq!(
        s.metric("ferry_mesh_session_sent_total{result=\"queued\"}"),
        4.0
    );
}
