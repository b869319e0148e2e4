//! Relay sessions across the nodes of a region, on the simulated driver
//! with simulated time: what a shard does with the Ferry mesh extension's
//! meshSession frames (`docs/relay-sessions.md` §9.3) and the mesh links
//! the mesh thread reports.

mod support;

use ferry_derp::shard::MeshNews;
use ferry_engine::Slot;
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::mesh_session::{self as ms, MeshMsg, MeshSession};
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
    assert_eq!(dropped(&s, "unhandled"), 0.0);

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
        (dropped(&s, "no_connection"), dropped(&s, "unhandled")),
        (1.0, 1.0),
        "B's frame matched to link 1"
    );
    send(&mut s, c);
    assert_eq!(
        (dropped(&s, "no_connection"), dropped(&s, "unhandled")),
        (2.0, 1.0),
        "C's link does not speak the Ferry mesh extension"
    );

    // B's link breaks: its frames have no link again.
    s.news(1, MeshNews::Down);
    send(&mut s, b);
    assert_eq!(
        (dropped(&s, "no_connection"), dropped(&s, "unhandled")),
        (3.0, 1.0),
        "B's link is down"
    );
    assert!(s.d.is_open(b) && s.d.is_open(c));
}
