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
use ferry_proto::relay_session as rs;
use ferry_proto::relay_session::v2::{self, SessionOffer2};
use ferry_udp::session::{Limits, Sessions};
use support::sim::{allocate, meshed, Sim};

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

/// One node of a simulated two-node region: a shard with one mesh link
/// (to the other node) and a real session table bound at `ip`.
struct Node {
    s: Sim,
    rx: Vec<ByteRx>,
    sessions: Arc<Sessions>,
    key: NodePrivate,
}

fn node(ip: &str) -> Node {
    node_with(ip, 1, Limits::default())
}

/// A node with `links` mesh links and a session table with `limits`.
fn node_with(ip: &str, links: usize, limits: Limits) -> Node {
    let sessions = Arc::new(Sessions::new(limits));
    sessions.set_bound(format!("{ip}:3479").parse().unwrap());
    let service = sessions.clone();
    let (s, rx, _) = meshed(links, 64 * 1024, move |cfg| {
        cfg.mesh_key = Some(MESH_KEY);
        cfg.relay_sessions = Some(service);
    });
    let key = s.shared.config.private_key.clone();
    Node {
        s,
        rx,
        sessions,
        key,
    }
}

/// Two nodes, A (192.0.2.1) and B (192.0.2.2), meshed both ways: each
/// one's link to the other is up and speaks the Ferry mesh extension, and
/// the other's link is connected to it as a mesh client.
struct Region {
    a: Node,
    b: Node,
    /// B's link, as A sees it.
    b_on_a: Slot,
    /// A's link, as B sees it.
    a_on_b: Slot,
}

fn take(rx: &mut ByteRx) -> Vec<u8> {
    let mut bytes = Vec::new();
    while rx
        .pop_with(|a, b| {
            bytes.extend_from_slice(a);
            bytes.extend_from_slice(b);
        })
        .is_some()
    {}
    bytes
}

impl Region {
    fn new(link_a_to_b_speaks: bool) -> Region {
        Region::of(node("192.0.2.1"), node("192.0.2.2"), link_a_to_b_speaks)
    }

    fn of(mut a: Node, mut b: Node, link_a_to_b_speaks: bool) -> Region {
        let b_on_a = ferry_mesh_peer(&mut a.s, &b.key);
        let a_on_b = ferry_mesh_peer(&mut b.s, &a.key);
        a.s.news(
            0,
            MeshNews::Up {
                server_key: b.key.public(),
                ferry_mesh: link_a_to_b_speaks,
            },
        );
        b.s.news(
            0,
            MeshNews::Up {
                server_key: a.key.public(),
                ferry_mesh: true,
            },
        );
        let mut r = Region {
            a,
            b,
            b_on_a,
            a_on_b,
        };
        r.pump();
        r
    }

    /// Client `slot` of A (`on_a`) or B asks for `peer`; the nodes then
    /// talk until they are done.
    fn ask(&mut self, on_a: bool, slot: Slot, peer: &NodePrivate, request_id: u32) {
        let n = if on_a { &mut self.a } else { &mut self.b };
        n.s.d.receive(slot, &allocate(&peer.public(), request_id));
        n.s.settle();
        self.pump();
    }

    /// Sessions in A's table and in B's.
    fn hosted(&self) -> (usize, usize) {
        (self.a.sessions.lock().len(), self.b.sessions.lock().len())
    }

    /// Carries what each node put into its link's ring to the other node
    /// (as the mesh thread and TLS would), until neither has more.
    fn pump(&mut self) {
        for _ in 0..16 {
            let (ab, ba) = (take(&mut self.a.rx[0]), take(&mut self.b.rx[0]));
            if ab.is_empty() && ba.is_empty() {
                return;
            }
            if !ab.is_empty() {
                self.b.s.d.receive(self.a_on_b, &ab);
                self.b.s.settle();
            }
            if !ba.is_empty() {
                self.a.s.d.receive(self.b_on_a, &ba);
                self.a.s.settle();
            }
        }
        panic!("the nodes kept sending meshSession frames");
    }
}

/// A client that asks for relay sessions version `version`.
fn relay_client(s: &mut Sim, key: &NodePrivate, version: u32) -> Slot {
    let info = ClientInfo {
        ferry_derp: version,
        ..support::info(None)
    };
    let slot = s.connect();
    s.greet_with(slot, key, &info, &[]);
    let _ = s.frames(slot);
    slot
}

/// The relaySessionEnd frames a client read (freed ones): session, peer,
/// host.
fn ends(s: &mut Sim, slot: Slot) -> Vec<(u32, NodePublic, NodePublic)> {
    ends_in(s.frames(slot))
}

/// The relaySessionEnd frames among `frames`.
fn ends_in(frames: Vec<(u8, Vec<u8>)>) -> Vec<(u32, NodePublic, NodePublic)> {
    frames
        .into_iter()
        .filter(|(ty, _)| *ty == v2::RELAY_SESSION_END)
        .map(|(_, body)| {
            let e = v2::parse_end(&body).unwrap();
            assert_eq!(e.reason, v2::EndReason::Freed);
            (e.vni, e.peer, e.host)
        })
        .collect()
}

/// The relaySession2 offers and the refusal reasons a client read.
fn answers(s: &mut Sim, slot: Slot) -> (Vec<SessionOffer2>, Vec<rs::RefuseReason>) {
    answers_in(s.frames(slot))
}

/// The relaySession2 offers and the refusal reasons among `frames`.
fn answers_in(frames: Vec<(u8, Vec<u8>)>) -> (Vec<SessionOffer2>, Vec<rs::RefuseReason>) {
    let mut offers = Vec::new();
    let mut refusals = Vec::new();
    for (ty, body) in frames {
        match ty {
            v2::RELAY_SESSION2 => offers.push(v2::parse_session2(&body).unwrap()),
            frame::RELAY_REFUSED => refusals.push(rs::parse_refused(&body).unwrap().reason),
            _ => {}
        }
    }
    (offers, refusals)
}

/// A region with a pair split across it: the anchor (the lower key) X
/// on A, Y on B, each node told of the other's client.
struct Split {
    r: Region,
    x: NodePrivate,
    y: NodePrivate,
    xs: Slot,
    ys: Slot,
}

fn split(link_a_to_b_speaks: bool) -> Split {
    split_in(Region::new(link_a_to_b_speaks))
}

fn split_in(r: Region) -> Split {
    let (x, y) = (NodePrivate::generate(), NodePrivate::generate());
    split_of(r, (x, y), 2)
}

/// [`split_in`] with these two keys (the lower is X, on A) and Y asking
/// for relay sessions version `y_version`.
fn split_of(mut r: Region, (x, y): (NodePrivate, NodePrivate), y_version: u32) -> Split {
    let (x, y) = if x.public() < y.public() {
        (x, y)
    } else {
        (y, x)
    };
    let xs = relay_client(&mut r.a.s, &x, 2);
    let ys = relay_client(&mut r.b.s, &y, y_version);
    r.a.s.news(0, MeshNews::Present(y.public()));
    r.b.s.news(0, MeshNews::Present(x.public()));
    Split { r, x, y, xs, ys }
}

impl Split {
    /// What X and Y read: their offers, and that neither was refused.
    fn offers(&mut self) -> (Vec<SessionOffer2>, Vec<SessionOffer2>) {
        let (xo, xr) = answers(&mut self.r.a.s, self.xs);
        let (yo, yr) = answers(&mut self.r.b.s, self.ys);
        assert_eq!((xr, yr), (vec![], vec![]), "refusals");
        (xo, yo)
    }
}

/// Checks the two clients' offers: one session, hosted by A (the
/// anchor's node) at its address, cross-node, a slot each.
fn one_session_on_a(p: &Split, (xo, yo): (&[SessionOffer2], &[SessionOffer2])) {
    assert!(!xo.is_empty() && !yo.is_empty(), "offers {xo:?} {yo:?}");
    let vni = xo[0].offer.vni;
    for o in xo.iter().chain(yo) {
        assert_eq!(o.offer.vni, vni, "one session");
        assert_eq!(o.host, p.r.a.key.public(), "hosted by the anchor's node");
        assert!(o.cross_node(), "marked cross-node");
        assert_eq!(o.offer.endpoints, ["192.0.2.1:3479".parse().unwrap()]);
    }
    assert_eq!(xo[0].offer.peer, p.y.public());
    assert_eq!(yo[0].offer.peer, p.x.public());
    assert_ne!(xo[0].offer.slot, yo[0].offer.slot, "a slot each");
    assert_eq!(p.r.hosted(), (1, 0), "sessions on A and on B");
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

/// A kind-1 allocate from node B's link to A for `asker` and A's client
/// `dst`, as B's mesh client would send it.
fn mesh_allocate(dst: NodePublic, asker: NodePublic, request_id: u32, ip: &str) -> Vec<u8> {
    let mut out = Vec::new();
    ms::put_mesh_session(
        &mut out,
        &MeshSession {
            dst,
            msg: MeshMsg::Allocate {
                asker,
                request_id,
                asker_ip: ip.parse().unwrap(),
                conn_id: u64::from(request_id),
            },
        },
    );
    out
}

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

/// A relaySessionEnd body as a meshSession (kind 4) to `dst`.
fn mesh_end(dst: NodePublic, vni: u32, peer: NodePublic, host: NodePublic) -> Vec<u8> {
    let mut out = Vec::new();
    ms::put_mesh_session(
        &mut out,
        &MeshSession {
            dst,
            msg: MeshMsg::End(v2::SessionEnd {
                vni,
                peer,
                host,
                reason: v2::EndReason::Freed,
                grace: std::time::Duration::ZERO,
            }),
        },
    );
    out
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
