//! relayAllocate on the DERP side (`shard/sessions.rs`) with a stand-in
//! session service: keys placed on chosen shards, so the request crosses
//! to the peer's shard and the offer comes back across, the refusals, and
//! a client that did not ask having the frame skipped; version 2's
//! relaySession2 to a client that asked for it.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_derp::Placement;
use ferry_proto::client::Event;
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::relay_session::v2::{EndReason, SessionEnd};
use ferry_proto::relay_session::SessionService;
use ferry_proto::relay_session::{
    put_allocate, Allocate, AllocateRequest, Hosted, Offers, RefuseReason, Refused, SessionOffer,
};
use support::{start, stop, Client};

const T: Duration = Duration::from_secs(5);

/// Hands out session 7 to every pair and tells both every time;
/// remembers who asked.
#[derive(Default)]
struct Stand(Mutex<Vec<(NodePublic, NodePublic, IpAddr)>>);

impl SessionService for Stand {
    fn port(&self) -> u16 {
        4242
    }

    fn allocate(&self, r: &AllocateRequest, _now: Instant) -> Result<Offers, RefuseReason> {
        self.0.lock().unwrap().push((r.asker, r.peer, r.ip));
        assert_ne!(r.conns[0], r.conns[1], "two connections, two numbers");
        let offer = |request_id, slot: u8, peer: &NodePublic| SessionOffer {
            request_id,
            vni: 7,
            peer: *peer,
            slot,
            token: [slot + 1; 32],
            endpoints: vec![SocketAddr::from(([127, 0, 0, 1], 4242))],
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
        };
        Ok(Offers {
            asker: Some(offer(r.request_id, 0, &r.peer)),
            peer: Some(offer(0, 1, &r.asker)),
        })
    }
}

fn info(ferry_derp: u32) -> ClientInfo {
    ClientInfo {
        ferry_derp,
        ..support::info(None)
    }
}

fn allocate(c: &mut Client, peer: &NodePublic, request_id: u32) {
    let mut f = Vec::new();
    put_allocate(
        &mut f,
        &Allocate {
            peer: *peer,
            request_id,
        },
    );
    c.write(&f).unwrap();
}

fn next_relay(c: &mut Client) -> Event {
    loop {
        let e = c.next_meaningful(T).expect("an event");
        if matches!(
            e,
            Event::RelaySession(_) | Event::RelaySession2(_) | Event::RelayRefused(_)
        ) {
            return e;
        }
    }
}

fn offers_cross_shards_to_both_peers_and_refusals_name_the_reason() {
    let stand = Arc::new(Stand::default());
    let service = stand.clone();
    let (server, addr) = start(2, move |cfg| {
        cfg.placement = Placement::FirstByte;
        cfg.relay_sessions = Some(service);
    });
    let ka = Placement::key_for(0, 2);
    let kb = Placement::key_for(1, 2);
    let kp = Placement::key_for(1, 2);
    let (pa, pb, pp) = (ka.public(), kb.public(), kp.public());
    let mut a = Client::connect_as(addr, ka, info(1));
    let mut b = Client::connect_as(addr, kb, info(1));
    let mut plain = Client::connect_as(addr, kp, info(0));

    // A (shard 0) asks for B (shard 1): both get their offer.
    allocate(&mut a, &pb, 41);
    let Event::RelaySession(oa) = next_relay(&mut a) else {
        panic!("A refused")
    };
    let Event::RelaySession(ob) = next_relay(&mut b) else {
        panic!("B refused")
    };
    assert_eq!((oa.request_id, oa.slot, oa.peer), (41, 0, pb));
    assert_eq!((ob.request_id, ob.slot, ob.peer), (0, 1, pa));
    assert_eq!(
        stand.0.lock().unwrap().as_slice(),
        &[(pa, pb, "127.0.0.1".parse::<IpAddr>().unwrap())]
    );

    // Refusals, each from the peer's shard.
    let absent = NodePrivate::generate().public();
    for (peer, id, reason) in [
        (pp, 42, RefuseReason::PeerNotCapable),
        (absent, 43, RefuseReason::PeerNotHere),
        (pa, 44, RefuseReason::SelfPeer),
    ] {
        allocate(&mut a, &peer, id);
        assert_eq!(
            next_relay(&mut a),
            Event::RelayRefused(Refused {
                request_id: id,
                peer,
                reason
            })
        );
    }
    assert_eq!(
        stand.0.lock().unwrap().len(),
        1,
        "refusals allocate nothing"
    );

    // From a client that did not ask, the frame is unknown: skipped, the
    // connection goes on, nobody hears of it.
    allocate(&mut plain, &pa, 45);
    plain.ping(*b"still up");
    assert_eq!(plain.next_meaningful(T).unwrap(), Event::Pong(*b"still up"));
    assert_eq!(stand.0.lock().unwrap().len(), 1);
    a.ping(*b"a is up!");
    assert_eq!(a.next_meaningful(T).unwrap(), Event::Pong(*b"a is up!"));
    stop(server);
}

/// A client that asks for version 2 is answered version 2 and gets
/// relaySession2 naming this node as the host (no cross-node flag); a
/// version-1 client beside it keeps version 1's answer and frame, whoever
/// asks.
fn version_2_clients_get_offers_naming_this_node() {
    let stand = Arc::new(Stand::default());
    let service = stand.clone();
    let (server, addr) = start(2, move |cfg| {
        cfg.placement = Placement::FirstByte;
        cfg.relay_sessions = Some(service);
    });
    let (ka, kb) = (Placement::key_for(0, 2), Placement::key_for(1, 2));
    let (pa, pb) = (ka.public(), kb.public());
    let mut a = Client::connect_as(addr, ka, info(2));
    let mut b = Client::connect_as(addr, kb, info(1));
    let mut later = Client::connect_as(addr, NodePrivate::generate(), info(7));
    let versions = [&a, &b, &later].map(|c| c.server_info.ferry_derp.map(|r| r.version));
    assert_eq!(versions, [Some(2), Some(1), Some(2)]);
    let server_key = a.server_key;
    for (asker, id) in [(0, 51), (1, 52)] {
        if asker == 0 {
            allocate(&mut a, &pb, id);
        } else {
            allocate(&mut b, &pa, id);
        }
        let Event::RelaySession2(oa) = next_relay(&mut a) else {
            panic!("A got no relaySession2")
        };
        assert_eq!((oa.host, oa.flags, oa.cross_node()), (server_key, 0, false));
        assert_eq!(oa.offer.peer, pb);
        let Event::RelaySession(ob) = next_relay(&mut b) else {
            panic!("B got no relaySession")
        };
        assert_eq!(ob.peer, pa);
        let mine = if asker == 0 {
            oa.offer.request_id
        } else {
            ob.request_id
        };
        assert_eq!(mine, id);
    }
    later.ping(*b"later up");
    assert_eq!(later.next_meaningful(T).unwrap(), Event::Pong(*b"later up"));
    stop(server);
}

/// The Ferry mesh extension is answered in serverInfo only to a mesh peer
/// (the mesh key) that asked for it.
fn the_mesh_extension_is_answered_to_mesh_peers_that_asked() {
    let mesh_key = ferry_proto::key::MeshKey([5; 32]);
    let key = mesh_key.clone();
    let (server, addr) = start(1, move |cfg| cfg.mesh_key = Some(key));
    let with = |mesh: Option<ferry_proto::key::MeshKey>, asked: u32| ClientInfo {
        ferry_mesh: asked,
        ..support::info(mesh)
    };
    let answered = |info: ClientInfo| {
        let c = Client::connect_as(addr, NodePrivate::generate(), info);
        c.server_info.ferry_mesh.map(|m| m.version)
    };
    assert_eq!(answered(with(Some(mesh_key.clone()), 1)), Some(1));
    assert_eq!(answered(with(Some(mesh_key.clone()), 0)), None);
    assert_eq!(answered(with(None, 1)), None, "not a mesh peer");
    assert_eq!(
        answered(with(Some(ferry_proto::key::MeshKey([6; 32])), 1)),
        None,
        "a wrong mesh key is no mesh peer"
    );
    stop(server);
}

fn without_a_service_nobody_gets_the_frame_read() {
    let (server, addr) = start(1, |_| {});
    let ka = NodePrivate::generate();
    let kb = NodePrivate::generate();
    let pb = kb.public();
    let mut a = Client::connect_as(addr, ka, info(1));
    let _b = Client::connect_as(addr, kb, info(1));
    allocate(&mut a, &pb, 1);
    a.ping(*b"ping-one");
    assert_eq!(a.next_meaningful(T).unwrap(), Event::Pong(*b"ping-one"));
    stop(server);
}

/// Hosts two sessions that it names: 7 (A and B) and 8 (A and C).
struct Hosting([NodePublic; 3]);

impl SessionService for Hosting {
    fn port(&self) -> u16 {
        4242
    }

    fn allocate(&self, _: &AllocateRequest, _: Instant) -> Result<Offers, RefuseReason> {
        Err(RefuseReason::Off)
    }

    fn hosted(&self) -> Vec<Hosted> {
        let [a, b, c] = self.0;
        vec![
            Hosted {
                vni: 7,
                keys: [a, b],
                via: None,
            },
            Hosted {
                vni: 8,
                keys: [c, a],
                via: None,
            },
        ]
    }
}

/// A graceful stop tells every version-2 key of each hosted session that
/// it ends (draining, the shutdown grace), on whichever shard the key
/// is, before `restarting`; a version-1 key gets only `restarting`.
fn a_graceful_stop_ends_hosted_sessions_before_restarting() {
    let (ka, kb, kc) = (
        Placement::key_for(0, 2),
        Placement::key_for(1, 2),
        Placement::key_for(1, 2),
    );
    let keys = [ka.public(), kb.public(), kc.public()];
    let [pa, pb, pc] = keys;
    let (server, addr) = start(2, move |cfg| {
        cfg.placement = Placement::FirstByte;
        cfg.shutdown_grace = Duration::from_millis(1500);
        cfg.relay_sessions = Some(Arc::new(Hosting(keys)));
    });
    let mut a = Client::connect_as(addr, ka, info(2));
    let mut b = Client::connect_as(addr, kb, info(2));
    let mut c = Client::connect_as(addr, kc, info(1));
    let host = a.server_key;
    server.shutdown();
    let until_restart = |cl: &mut Client| {
        let mut ends = Vec::new();
        loop {
            match cl.next_meaningful(T).expect("an event") {
                Event::RelaySessionEnd(e) => ends.push(e),
                Event::Restarting { .. } => return ends,
                _ => {}
            }
        }
    };
    let end = |vni, peer| SessionEnd {
        vni,
        peer,
        host,
        reason: EndReason::Draining,
        grace: Duration::from_millis(1500),
    };
    assert_eq!(until_restart(&mut a), vec![end(7, pb), end(8, pc)]);
    assert_eq!(until_restart(&mut b), vec![end(7, pa)]);
    assert_eq!(
        until_restart(&mut c),
        vec![],
        "version 1: no relaySessionEnd"
    );
    server.wait().expect("a clean stop");
}

ferry_testkit::per_backend!(
    a_graceful_stop_ends_hosted_sessions_before_restarting,
    offers_cross_shards_to_both_peers_and_refusals_name_the_reason,
    version_2_clients_get_offers_naming_this_node,
    the_mesh_extension_is_answered_to_mesh_peers_that_asked,
    without_a_service_nobody_gets_the_frame_read,
);
