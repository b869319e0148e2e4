//! Relay sessions across the nodes of a region, on the simulated driver
//! with simulated time: what a shard does with the Ferry mesh extension's
//! meshSession frames (`docs/relay-sessions.md` §9.3) and the mesh links
//! the mesh thread reports.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_derp::shard::MeshNews;
use ferry_engine::Slot;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::mesh_session::{self as ms, MeshMsg, MeshSession};
use ferry_proto::relay_session as rs;
use ferry_proto::relay_session::v2;
use ferry_udp::session::{Limits, Sessions};
use support::region::*;
use support::sim::{allocate, meshed, Sim};

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

/// The anchor X on A asks for Y on B: A hosts, answers X at once, and
/// tells Y through B; B's table stays empty.
#[test]
fn the_anchors_node_hosts_when_the_anchor_asks() {
    let mut p = split(true);
    p.r.ask(true, p.xs, &p.y, 41);
    let (xo, yo) = p.offers();
    one_session_on_a(&p, (&xo, &yo));
    assert_eq!(xo[0].offer.request_id, 41, "the asker's request id");
}

/// Y on B asks for the anchor X on A: B asks A over the mesh (kind 1), A
/// hosts, tells X itself and answers Y through B (kind 2).
#[test]
fn the_anchors_node_hosts_when_the_other_key_asks() {
    let mut p = split(true);
    p.r.ask(false, p.ys, &p.x, 42);
    let (xo, yo) = p.offers();
    one_session_on_a(&p, (&xo, &yo));
    assert_eq!(yo[0].offer.request_id, 42, "the asker's request id");
}

/// Both peers ask in the same turn, each on its own node: the anchor rule
/// sends both asks to one table, so there is one session and every offer
/// either client reads names it.
#[test]
fn both_peers_asking_at_once_make_one_session() {
    let mut p = split(true);
    p.r.a.s.d.receive(p.xs, &allocate(&p.y.public(), 1));
    p.r.b.s.d.receive(p.ys, &allocate(&p.x.public(), 2));
    p.r.a.s.settle();
    p.r.b.s.settle();
    p.r.pump();
    let (xo, yo) = p.offers();
    one_session_on_a(&p, (&xo, &yo));
}

/// A version-1 asker keeps version 1's answer for a peer on another node
/// (peer not here) and nothing crosses the mesh; a version-2 asker whose
/// node's link to the peer's node does not speak the extension (derper,
/// or an older Ferry) is refused "no host" (7).
#[test]
fn version_1_askers_and_plain_links_get_no_cross_node_session() {
    let mut p = split(true);
    let v1 = relay_client(&mut p.r.b.s, &NodePrivate::generate(), 1);
    p.r.b.s.d.receive(v1, &allocate(&p.x.public(), 3));
    p.r.b.s.settle();
    assert!(
        take(&mut p.r.b.rx[0]).is_empty(),
        "nothing crossed the mesh"
    );
    let (offers, refused) = answers(&mut p.r.b.s, v1);
    assert_eq!(
        (offers, refused),
        (vec![], vec![rs::RefuseReason::PeerNotHere])
    );

    let mut p = split(false);
    p.r.ask(true, p.xs, &p.y, 4);
    let (xo, xr) = answers(&mut p.r.a.s, p.xs);
    assert_eq!((xo, xr), (vec![], vec![v2::REFUSED_NO_HOST]));
    assert_eq!(
        p.r.a
            .s
            .metric("ferry_relay_allocate_refused_total{reason=\"no_host\"}"),
        1.0
    );
    assert_eq!(p.r.hosted(), (0, 0));
}

/// The mesh link drops mid-allocation: A hosts and its offer for Y waits
/// in the link's ring when the link breaks (the mesh thread discards it).
/// The half-made session is freed at once (Y never bound) and X is told
/// (relaySessionEnd, freed); once the link is up again, X's next ask
/// makes a new session and Y is told of it through B.
#[test]
fn a_half_made_session_is_freed_when_its_link_drops() {
    let mut p = split(true);
    p.r.a.s.d.receive(p.xs, &allocate(&p.y.public(), 5));
    p.r.a.s.settle();
    let (first, _) = answers(&mut p.r.a.s, p.xs);
    assert_eq!(first.len(), 1);
    // The link breaks with the offer still in its ring.
    p.r.a.s.news(0, MeshNews::Down);
    assert!(
        !take(&mut p.r.a.rx[0]).is_empty(),
        "the offer for Y was queued"
    );
    assert_eq!(p.r.hosted(), (0, 0), "freed with its link");
    assert_eq!(
        ends(&mut p.r.a.s, p.xs),
        [(first[0].offer.vni, p.y.public(), p.r.a.key.public())],
        "X told"
    );
    p.r.a.s.shared.mesh.as_ref().unwrap().link_state[0].store(0, Ordering::Release);
    let b = p.r.b.key.public();
    p.r.a.s.news(
        0,
        MeshNews::Up {
            server_key: b,
            ferry_mesh: true,
        },
    );
    p.r.a.s.news(0, MeshNews::Present(p.y.public()));
    p.r.pump();
    assert_eq!(p.offers(), (vec![], vec![]), "Y heard nothing");

    // X asks again: a new session, and Y is told this time.
    p.r.ask(true, p.xs, &p.y, 6);
    let (xo, yo) = p.offers();
    one_session_on_a(&p, (&xo, &yo));
    assert_ne!(xo[0].offer.vni, first[0].offer.vni, "a new session");
    assert_eq!(p.r.a.sessions.lock().counters().freed_mesh, 1);
}

/// A node whose session socket is bound to an unspecified address offers
/// "where you reached DERP", which a client of another node cannot use:
/// it does not host for a split pair, and says so in its state, so the
/// other node of the pair hosts even when the anchor is here. With
/// advertised endpoints (`--relay-advertise`) it hosts, and its offers
/// name them.
#[test]
fn a_node_hosts_split_pairs_only_with_endpoints_other_nodes_clients_reach() {
    let mut p = split_in(Region::of(node("0.0.0.0"), node("192.0.2.2"), true));
    p.r.ask(true, p.xs, &p.y, 7);
    let (xo, yo) = p.offers();
    assert!(!xo.is_empty() && !yo.is_empty(), "offers {xo:?} {yo:?}");
    for o in xo.iter().chain(&yo) {
        assert_eq!(o.host, p.r.b.key.public(), "B hosts");
        assert_eq!(o.offer.endpoints, ["192.0.2.2:3479".parse().unwrap()]);
    }
    assert_eq!(p.r.hosted(), (0, 1));

    let a = node("0.0.0.0");
    a.sessions
        .set_advertised(vec!["198.51.100.1:3479".parse().unwrap()]);
    let mut p = split_in(Region::of(a, node("192.0.2.2"), true));
    p.r.ask(true, p.xs, &p.y, 8);
    let (xo, yo) = p.offers();
    assert!(!xo.is_empty() && !yo.is_empty(), "offers {xo:?} {yo:?}");
    for o in xo.iter().chain(&yo) {
        assert_eq!(o.host, p.r.a.key.public(), "A hosts");
        assert_eq!(o.offer.endpoints, ["198.51.100.1:3479".parse().unwrap()]);
    }
    assert_eq!(p.r.hosted(), (1, 0));
}

/// A node asked to host (kind 1) when it cannot (its endpoints are "where
/// you reached DERP", useless to the asker on the other node) refuses
/// "no host" over the mesh and makes no session, whatever the asking
/// node believed.
#[test]
fn a_node_that_cannot_host_refuses_an_allocate_from_the_mesh() {
    let mut p = split_in(Region::of(node("0.0.0.0"), node("192.0.2.2"), true));
    let mut ask = Vec::new();
    ms::put_mesh_session(
        &mut ask,
        &MeshSession {
            dst: p.x.public(),
            msg: MeshMsg::Allocate {
                asker: p.y.public(),
                request_id: 9,
                asker_ip: "192.0.2.77".parse().unwrap(),
                conn_id: 1,
            },
        },
    );
    p.r.a.s.d.receive(p.r.b_on_a, &ask);
    p.r.a.s.settle();
    let answer = mesh_sessions(&mut p.r.a.rx[0]);
    let [MeshSession {
        dst,
        msg: MeshMsg::Refused(r),
    }] = answer.as_slice()
    else {
        panic!("not one refusal: {answer:?}")
    };
    assert_eq!(
        (*dst, r.request_id, r.peer),
        (p.y.public(), 9, p.x.public())
    );
    assert_eq!(r.reason, v2::REFUSED_NO_HOST);
    assert_eq!(p.r.hosted(), (0, 0));
    assert_eq!(p.offers(), (vec![], vec![]), "X was told nothing");
}

/// Y's node cannot tell Y of the session A hosts (Y did not ask for
/// version 2): it declines (kind 5), and A frees the half-made session
/// and tells X (relaySessionEnd, freed).
#[test]
fn a_declined_offer_frees_the_half_made_session() {
    let (x, y) = (NodePrivate::generate(), NodePrivate::generate());
    let keys = if x.public() < y.public() {
        (x, y)
    } else {
        (y, x)
    };
    let mut p = split_of(Region::new(true), keys, 1);
    p.r.ask(true, p.xs, &p.y, 1);
    assert_eq!(
        p.r.b
            .s
            .metric("ferry_mesh_session_dropped_total{reason=\"not_capable\"}"),
        1.0
    );
    let frames = p.r.a.s.frames(p.xs);
    let (xo, _) = answers_in(frames.clone());
    assert_eq!(xo.len(), 1, "X was answered first");
    assert_eq!(
        ends_in(frames),
        [(xo[0].offer.vni, p.y.public(), p.r.a.key.public())]
    );
    assert_eq!(p.r.hosted(), (0, 0), "freed");
    assert_eq!(p.r.a.sessions.lock().counters().freed_mesh, 1);
}

/// An end (kind 4) both ways: from the node of a session's other key,
/// for a session this node hosts, it frees the session and tells the
/// local key (only for the key behind the sender's link: any other is
/// `no_session`); from the host, it reaches its client as
/// relaySessionEnd; naming a third node as host, it is `wrong_host`.
#[test]
fn an_end_from_the_peers_node_frees_the_session_and_one_from_the_host_is_passed_on() {
    let mut p = split(true);
    p.r.ask(true, p.xs, &p.y, 1);
    let (xo, _) = p.offers();
    let vni = xo[0].offer.vni;
    let (a, b) = (p.r.a.key.public(), p.r.b.key.public());
    let stranger = NodePrivate::generate().public();
    let (x, y) = (p.x.public(), p.y.public());
    let send = |p: &mut Split, frame: Vec<u8>| {
        p.r.a.s.d.receive(p.r.b_on_a, &frame);
        p.r.a.s.settle();
    };

    send(&mut p, mesh_end(x, vni, stranger, a));
    assert_eq!(dropped(&p.r.a.s, "no_session"), 1.0);
    assert_eq!(p.r.hosted(), (1, 0), "not B's key: kept");
    send(&mut p, mesh_end(x, vni, y, a));
    assert_eq!(p.r.hosted(), (0, 0), "B ended it");
    assert_eq!(ends(&mut p.r.a.s, p.xs), [(vni, y, a)]);

    send(&mut p, mesh_end(x, 77, y, b));
    assert_eq!(ends(&mut p.r.a.s, p.xs), [(77, y, b)], "passed on");
    send(&mut p, mesh_end(x, 78, y, stranger));
    assert_eq!(dropped(&p.r.a.s, "wrong_host"), 1.0);
    assert_eq!(ends(&mut p.r.a.s, p.xs), []);
    assert_eq!(dropped(&p.r.a.s, "unhandled"), 0.0);
}

/// Y's node restarts while A's offer for Y is on its way: A's link to it
/// drops (the offer with it) and A frees the half-made session, telling
/// X. The restarted node links up anew (a new state exchange), Y
/// reconnects to it, and X's next ask makes one new session that both
/// are told of; no stale session is left on either node.
#[test]
fn one_node_restarting_mid_allocation_leaves_no_stale_session() {
    let p = split(true);
    let Split { r, x, y, xs, .. } = p;
    let Region { mut a, .. } = r;
    a.s.d.receive(xs, &allocate(&y.public(), 1));
    a.s.settle();
    let (first, _) = answers(&mut a.s, xs);
    assert_eq!(first.len(), 1);
    // B is gone: A's link breaks with the offer for Y in its ring.
    a.s.news(0, MeshNews::Down);
    let _ = take(&mut a.rx[0]);
    assert_eq!(a.sessions.lock().len(), 0, "freed with the link");
    assert_eq!(
        ends(&mut a.s, xs),
        [(first[0].offer.vni, y.public(), a.key.public())]
    );

    // B again (a new process), linked anew; Y reconnects to it.
    a.s.shared.mesh.as_ref().unwrap().link_state[0].store(0, Ordering::Release);
    let mut r = Region::of(a, node("192.0.2.2"), true);
    assert!(
        r.a.s.d.is_open(xs),
        "X stayed connected to A through B's restart"
    );
    let ys = relay_client(&mut r.b.s, &y, 2);
    r.a.s.news(0, MeshNews::Present(y.public()));
    r.b.s.news(0, MeshNews::Present(x.public()));
    let mut p = Split { r, x, y, xs, ys };
    p.r.ask(true, p.xs, &p.y, 2);
    let (xo, yo) = p.offers();
    one_session_on_a(&p, (&xo, &yo));
    assert_ne!(xo[0].offer.vni, first[0].offer.vni, "a new session");
}
