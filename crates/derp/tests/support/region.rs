//! Two simulated Ferry nodes of one region, meshed both ways, with
//! relay-session tables: what the cross-node relay-session tests
//! (`mesh_sessions.rs`, `mesh_session_limits.rs`) build on.

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

use super::sim::{allocate, meshed, Sim};

pub(crate) const MESH_KEY: MeshKey = MeshKey([7; 32]);

/// A mesh peer with `key` that asked for the Ferry mesh extension.
pub(crate) fn ferry_mesh_peer(s: &mut Sim, key: &NodePrivate) -> Slot {
    let asked = ClientInfo {
        ferry_mesh: ms::VERSION,
        ..super::info(Some(MESH_KEY))
    };
    let slot = s.connect();
    s.greet_with(slot, key, &asked, &[]);
    let _ = s.frames(slot);
    slot
}

pub(crate) fn dropped(s: &Sim, reason: &str) -> f64 {
    s.metric(&format!(
        "ferry_mesh_session_dropped_total{{reason=\"{reason}\"}}"
    ))
}

/// The meshSession frames a shard put into one link's ring.
pub(crate) fn mesh_sessions(rx: &mut ByteRx) -> Vec<MeshSession> {
    let bytes = take(rx);
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

/// One node of a simulated two-node region: a shard with one mesh link
/// (to the other node) and a real session table bound at `ip`.
pub(crate) struct Node {
    pub(crate) s: Sim,
    pub(crate) rx: Vec<ByteRx>,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) key: NodePrivate,
}

pub(crate) fn node(ip: &str) -> Node {
    node_with(ip, 1, Limits::default())
}

/// A node with `links` mesh links and a session table with `limits`.
pub(crate) fn node_with(ip: &str, links: usize, limits: Limits) -> Node {
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
pub(crate) struct Region {
    pub(crate) a: Node,
    pub(crate) b: Node,
    /// B's link, as A sees it.
    pub(crate) b_on_a: Slot,
    /// A's link, as B sees it.
    pub(crate) a_on_b: Slot,
}

/// Every byte waiting in a link's ring.
pub(crate) fn take(rx: &mut ByteRx) -> Vec<u8> {
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
    pub(crate) fn new(link_a_to_b_speaks: bool) -> Region {
        Region::of(node("192.0.2.1"), node("192.0.2.2"), link_a_to_b_speaks)
    }

    pub(crate) fn of(mut a: Node, mut b: Node, link_a_to_b_speaks: bool) -> Region {
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
    pub(crate) fn ask(&mut self, on_a: bool, slot: Slot, peer: &NodePrivate, request_id: u32) {
        let n = if on_a { &mut self.a } else { &mut self.b };
        n.s.d.receive(slot, &allocate(&peer.public(), request_id));
        n.s.settle();
        self.pump();
    }

    /// Sessions in A's table and in B's.
    pub(crate) fn hosted(&self) -> (usize, usize) {
        (self.a.sessions.lock().len(), self.b.sessions.lock().len())
    }

    /// Carries what each node put into its link's ring to the other node
    /// (as the mesh thread and TLS would), until neither has more.
    pub(crate) fn pump(&mut self) {
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
pub(crate) fn relay_client(s: &mut Sim, key: &NodePrivate, version: u32) -> Slot {
    let info = ClientInfo {
        ferry_derp: version,
        ..super::info(None)
    };
    let slot = s.connect();
    s.greet_with(slot, key, &info, &[]);
    let _ = s.frames(slot);
    slot
}

/// The relaySessionEnd frames a client read (freed ones): session, peer,
/// host.
pub(crate) fn ends(s: &mut Sim, slot: Slot) -> Vec<(u32, NodePublic, NodePublic)> {
    ends_in(s.frames(slot))
}

/// The relaySessionEnd frames among `frames`.
pub(crate) fn ends_in(frames: Vec<(u8, Vec<u8>)>) -> Vec<(u32, NodePublic, NodePublic)> {
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
pub(crate) fn answers(s: &mut Sim, slot: Slot) -> (Vec<SessionOffer2>, Vec<rs::RefuseReason>) {
    answers_in(s.frames(slot))
}

/// The relaySession2 offers and the refusal reasons among `frames`.
pub(crate) fn answers_in(
    frames: Vec<(u8, Vec<u8>)>,
) -> (Vec<SessionOffer2>, Vec<rs::RefuseReason>) {
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
pub(crate) struct Split {
    pub(crate) r: Region,
    pub(crate) x: NodePrivate,
    pub(crate) y: NodePrivate,
    pub(crate) xs: Slot,
    pub(crate) ys: Slot,
}

pub(crate) fn split(link_a_to_b_speaks: bool) -> Split {
    split_in(Region::new(link_a_to_b_speaks))
}

pub(crate) fn split_in(r: Region) -> Split {
    let (x, y) = (NodePrivate::generate(), NodePrivate::generate());
    split_of(r, (x, y), 2)
}

/// [`split_in`] with these two keys (the lower is X, on A) and Y asking
/// for relay sessions version `y_version`.
pub(crate) fn split_of(mut r: Region, (x, y): (NodePrivate, NodePrivate), y_version: u32) -> Split {
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
    pub(crate) fn offers(&mut self) -> (Vec<SessionOffer2>, Vec<SessionOffer2>) {
        let (xo, xr) = answers(&mut self.r.a.s, self.xs);
        let (yo, yr) = answers(&mut self.r.b.s, self.ys);
        assert_eq!((xr, yr), (vec![], vec![]), "refusals");
        (xo, yo)
    }
}

/// Checks the two clients' offers: one session, hosted by A (the
/// anchor's node) at its address, cross-node, a slot each.
pub(crate) fn one_session_on_a(p: &Split, (xo, yo): (&[SessionOffer2], &[SessionOffer2])) {
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

/// A kind-1 allocate from node B's link to A for `asker` and A's client
/// `dst`, as B's mesh client would send it.
pub(crate) fn mesh_allocate(
    dst: NodePublic,
    asker: NodePublic,
    request_id: u32,
    ip: &str,
) -> Vec<u8> {
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

/// A relaySessionEnd body as a meshSession (kind 4) to `dst`.
pub(crate) fn mesh_end(dst: NodePublic, vni: u32, peer: NodePublic, host: NodePublic) -> Vec<u8> {
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
