//! Relay sessions across the nodes of a region, on the simulated driver
//! with simulated time: what one node of the region, or one client, can
//! make another node do (`docs/abuse.md`, "Across the nodes of a
//! region"), and what it gets beyond.

mod support;

use ferry_derp::shard::MeshNews;
use ferry_engine::Slot;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::mesh_session::{MeshMsg, MeshSession};
use ferry_udp::session::Limits;
use support::region::*;

/// A node asks the host only for its own clients: an allocate for an
/// asker the sending node's link never announced makes no session, gets
/// no answer, and is counted as `not_announced`; the same allocate for a
/// key the link announced is honoured.
#[test]
fn a_mesh_allocate_for_a_key_its_link_never_announced_is_dropped() {
    let mut p = split(true);
    let stranger = NodePrivate::generate().public();
    let a = &mut p.r.a.s;
    a.d.receive(
        p.r.b_on_a,
        &mesh_allocate(p.x.public(), stranger, 1, "192.0.2.77"),
    );
    a.settle();
    assert_eq!(p.r.hosted(), (0, 0), "nothing hosted for the stranger");
    assert_eq!(mesh_sessions(&mut p.r.a.rx[0]), [], "no answer");
    assert_eq!(dropped(&p.r.a.s, "not_announced"), 1.0);
    assert_eq!(p.offers(), (vec![], vec![]), "X was told nothing");

    let a = &mut p.r.a.s;
    a.d.receive(
        p.r.b_on_a,
        &mesh_allocate(p.x.public(), p.y.public(), 2, "192.0.2.77"),
    );
    a.settle();
    assert_eq!(p.r.hosted(), (1, 0), "Y was announced by B's link");
    assert_eq!(dropped(&p.r.a.s, "not_announced"), 1.0);
}

/// A node of the region floods this one with 10,000 allocates for keys
/// it announced: past its link's burst they are dropped and counted
/// (`rate`: exactly the excess), the sessions its link holds here stay at
/// the cap per link (the rest refused `limit`, over the mesh), and
/// another node's link still gets its session.
#[test]
fn a_mesh_peer_flooding_allocates_is_held_to_its_rate_and_its_share() {
    const FLOOD: usize = 10_000;
    const CAP: usize = 100;
    let limits = Limits {
        per_link: CAP,
        ..Limits::default()
    };
    let mut a = node_with("192.0.2.1", 2, limits);
    let (bk, ck) = (NodePrivate::generate(), NodePrivate::generate());
    let b = ferry_mesh_peer(&mut a.s, &bk);
    let c = ferry_mesh_peer(&mut a.s, &ck);
    for (link, key) in [(0, &bk), (1, &ck)] {
        a.s.news(
            link,
            MeshNews::Up {
                server_key: key.public(),
                ferry_mesh: true,
            },
        );
    }
    // Eight clients here: room for 8 × 32 sessions by the per-key limit.
    let locals: Vec<NodePublic> = (0..8)
        .map(|_| {
            let k = NodePrivate::generate();
            relay_client(&mut a.s, &k, 2);
            k.public()
        })
        .collect();
    // B announced its askers (one per allocate the burst lets through).
    let askers: Vec<NodePublic> = (0..1100)
        .map(|_| NodePrivate::generate().public())
        .collect();
    for k in &askers {
        a.s.news(0, MeshNews::Present(*k));
    }
    let _ = mesh_sessions(&mut a.rx[0]);
    let _ = mesh_sessions(&mut a.rx[1]);

    for chunk in (0..FLOOD).collect::<Vec<_>>().chunks(100) {
        let mut bytes = Vec::new();
        for &i in chunk {
            let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 0xff, i & 0xff);
            bytes.extend(mesh_allocate(
                locals[i % locals.len()],
                askers[i % askers.len()],
                i as u32,
                &ip,
            ));
        }
        a.s.d.receive(b, &bytes);
        a.s.settle();
    }
    let burst = ferry_derp::mesh::MESH_SESSION_BURST as usize;
    assert_eq!(dropped(&a.s, "rate"), (FLOOD - burst) as f64, "the excess");
    assert_eq!(a.sessions.lock().len(), CAP, "held to the cap per link");
    assert_eq!(a.sessions.lock().via_link(0), CAP);
    assert_eq!(
        a.s.metric("ferry_relay_allocate_refused_total{reason=\"limit\"}"),
        (burst - CAP) as f64
    );
    assert!(a.s.d.is_open(b), "the mesh connection stays open");

    // C's link: its own rate and share.
    let z = NodePrivate::generate().public();
    a.s.news(1, MeshNews::Present(z));
    a.s.d
        .receive(c, &mesh_allocate(locals[0], z, 1, "192.0.2.9"));
    a.s.settle();
    let answers = mesh_sessions(&mut a.rx[1]);
    assert!(
        matches!(
            answers.as_slice(),
            [MeshSession {
                msg: MeshMsg::Offer(_),
                ..
            }]
        ),
        "C's asker got its offer: {answers:?}"
    );
    assert_eq!(a.sessions.lock().via_link(1), 1);
    assert_eq!(a.sessions.lock().len(), CAP + 1);
}

/// A client asks for sessions with many keys on another node to fill
/// this one: as an anchor it makes this node host them, and its own
/// per-key limit, then the cap on sessions with keys behind one mesh
/// link hold it (every refusal counted); the other node hosts nothing.
#[test]
fn a_client_asking_for_keys_on_another_node_is_held_to_its_limits() {
    const CAP: usize = 50;
    const PEERS: usize = 40;
    let limits = Limits {
        per_link: CAP,
        ..Limits::default()
    };
    let mut r = Region::of(node_with("192.0.2.1", 1, limits), node("192.0.2.2"), true);
    // The two lowest keys ask from A (anchors of every pair: A hosts).
    let mut keys: Vec<NodePrivate> = (0..2 + PEERS).map(|_| NodePrivate::generate()).collect();
    keys.sort_by_key(|k| k.public());
    let askers: Vec<Slot> = keys[..2]
        .iter()
        .map(|k| relay_client(&mut r.a.s, k, 2))
        .collect();
    let peers: Vec<Slot> = keys[2..]
        .iter()
        .map(|k| {
            r.a.s.news(0, MeshNews::Present(k.public()));
            relay_client(&mut r.b.s, k, 2)
        })
        .collect();
    for (n, &slot) in askers.iter().enumerate() {
        for (i, k) in keys[2..].iter().enumerate() {
            if i >= 32 {
                // Past the connection's burst: its rate does not hold it.
                r.a.s.advance(std::time::Duration::from_millis(250));
            }
            r.ask(true, slot, k, (n * 100 + i) as u32);
        }
    }
    let limit = "ferry_relay_allocate_refused_total{reason=\"limit\"}";
    let rate = "ferry_relay_allocate_refused_total{reason=\"rate\"}";
    assert_eq!(r.a.s.metric(rate), 0.0);
    assert_eq!(r.hosted(), (CAP, 0), "held to the cap per link");
    assert_eq!(r.a.sessions.lock().via_link(0), CAP);
    let refused = (2 * PEERS - CAP) as f64;
    assert_eq!(r.a.s.metric(limit), refused);
    let (per_key, per_link) = (PEERS - 32, PEERS + 32 - CAP);
    assert_eq!(r.a.sessions.lock().counters().refused_link, per_link as u64);
    assert_eq!(per_key + per_link, 2 * PEERS - CAP);
    let told: usize = peers.iter().map(|&p| answers(&mut r.b.s, p).0.len()).sum();
    assert_eq!(told, CAP, "B's clients told of each session once");
}
