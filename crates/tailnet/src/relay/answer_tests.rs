use super::*;
use ferry_proto::disco::{AllocateRequest, Ping};
use ferry_proto::key::{DiscoPublic, NodePrivate};
use ferry_proto::tailnet::tailcfg::MapResponse;
use ferry_udp::peer_relay::Limits;
use std::net::SocketAddr;

/// A tailnet: Ferry (100.64.0.3) and peers a (.1), b (.2) and c (.4);
/// the filter grants the relay capability to a and b only, as Headscale
/// compiles a `cap/relay` grant.
struct Bed {
    netmap: Netmap,
    limiter: std::cell::RefCell<SourceLimiter>,
    ferry: DiscoPrivate,
    relays: PeerRelays,
    a: (NodePublic, DiscoPrivate),
    b: (NodePublic, DiscoPrivate),
    c: (NodePublic, DiscoPrivate),
}

fn node_json(id: u64, key: &NodePublic, disco: &DiscoPublic, ip: &str) -> String {
    format!(
        r#"{{"ID":{id},"Key":"{key}","DiscoKey":"{disco}","Addresses":["{ip}/32"],"HomeDERP":900,"Cap":142}}"#
    )
}

fn bed_with(self_cap_map: &str) -> Bed {
    let ferry = DiscoPrivate::generate();
    let me = NodePrivate::generate().public();
    let keys: Vec<(NodePublic, DiscoPrivate)> = (0..3)
        .map(|_| (NodePrivate::generate().public(), DiscoPrivate::generate()))
        .collect();
    let peers: Vec<String> = keys
        .iter()
        .zip([(1, "100.64.0.1"), (2, "100.64.0.2"), (4, "100.64.0.4")])
        .map(|((n, d), (id, ip))| node_json(id, n, &d.public(), ip))
        .collect();
    let json = format!(
        r#"{{"Node":{{"ID":3,"Key":"{me}","DiscoKey":"{fd}","Addresses":["100.64.0.3/32"],"CapMap":{{{self_cap_map}}}}},
            "Peers":[{peers}],
            "PacketFilters":{{"base":[
              {{"SrcIPs":["100.64.0.1","100.64.0.2"],"CapGrant":[
                {{"Dsts":["100.64.0.3/32"],"CapMap":{{"tailscale.com/cap/relay":[{{}}]}}}}]}}]}}}}"#,
        fd = ferry.public(),
        peers = peers.join(","),
    );
    let mut netmap = Netmap::default();
    netmap.apply(MapResponse::from_json(json.as_bytes()).expect("test netmap"));
    let relays = PeerRelays::new(DiscoPrivate::generate(), Limits::default());
    relays.set_addrs(vec![addr()]);
    let mut keys = keys.into_iter();
    Bed {
        netmap,
        limiter: std::cell::RefCell::new(limiter()),
        ferry,
        relays,
        a: keys.next().unwrap(),
        b: keys.next().unwrap(),
        c: keys.next().unwrap(),
    }
}

fn bed() -> Bed {
    bed_with("")
}

fn addr() -> SocketAddr {
    "10.78.0.1:40000".parse().unwrap()
}

fn sealed(from: &DiscoPrivate, to: &DiscoPublic, msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    disco::seal(
        &mut out,
        &from.shared(to),
        &from.public(),
        &ferry_proto::nacl::random_nonce(),
        msg,
    );
    out
}

fn request(bed: &Bed, from: &DiscoPrivate, pair: [DiscoPublic; 2], generation: u32) -> Vec<u8> {
    sealed(
        from,
        &bed.ferry.public(),
        &Message::AllocateRequest(AllocateRequest {
            client_disco: pair,
            generation,
        }),
    )
}

fn ask(bed: &Bed, src: &NodePublic, packet: &[u8]) -> Result<Answer, Drop> {
    ask_at(bed, src, packet, Instant::now())
}

fn ask_at(bed: &Bed, src: &NodePublic, packet: &[u8], now: Instant) -> Result<Answer, Drop> {
    answer(
        &bed.netmap,
        &mut bed.limiter.borrow_mut(),
        &bed.ferry,
        &bed.relays,
        src,
        packet,
        now,
        &ferry_proto::nacl::random_nonce(),
    )
}

#[test]
fn a_granted_peer_gets_an_endpoint_sealed_to_its_disco_key() {
    let bed = bed();
    let pair = [bed.a.1.public(), bed.b.1.public()];
    let got = ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, pair, 7)).expect("answered");
    assert!(!got.existing);
    assert_eq!(disco::sender(&got.packet), Some(bed.ferry.public()));
    let Ok(Message::AllocateResponse(r)) =
        disco::open(&bed.a.1.shared(&bed.ferry.public()), &got.packet)
    else {
        panic!("not a sealed allocation response");
    };
    assert_eq!(r.generation, 7);
    assert_eq!(r.endpoint.server_disco, bed.relays.server_disco());
    let mut sorted = pair;
    sorted.sort_by(|x, y| x.as_bytes().cmp(y.as_bytes()));
    assert_eq!(r.endpoint.client_disco, sorted);
    assert_eq!(r.endpoint.endpoints, [addr()]);
    assert!(bed.relays.lock().has_endpoint(r.endpoint.vni));

    // The other side asking for the same pair gets the same endpoint.
    let again = ask(&bed, &bed.b.0, &request(&bed, &bed.b.1, pair, 9)).expect("answered");
    assert!(again.existing);
    let Ok(Message::AllocateResponse(r2)) =
        disco::open(&bed.b.1.shared(&bed.ferry.public()), &again.packet)
    else {
        panic!("not a sealed allocation response");
    };
    assert_eq!((r2.generation, r2.endpoint.vni), (9, r.endpoint.vni));
}

#[test]
fn a_peer_without_the_grant_gets_nothing() {
    let bed = bed();
    let pair = [bed.c.1.public(), bed.a.1.public()];
    assert_eq!(
        ask(&bed, &bed.c.0, &request(&bed, &bed.c.1, pair, 1)).unwrap_err(),
        Drop::NoGrant
    );
    assert!(bed.relays.lock().is_empty());
}

#[test]
fn packets_not_from_the_peer_it_claims_are_dropped() {
    let bed = bed();
    let pair = [bed.a.1.public(), bed.b.1.public()];
    let good = request(&bed, &bed.a.1, pair, 1);
    // A node key the netmap does not have.
    let stranger = NodePrivate::generate().public();
    assert_eq!(ask(&bed, &stranger, &good).unwrap_err(), Drop::UnknownPeer);
    // a's packet relayed as if from b: b's disco key is not the sender.
    assert_eq!(ask(&bed, &bed.b.0, &good).unwrap_err(), Drop::StaleDisco);
    // a's old disco key (a restarted client whose new key the netmap has).
    let old = DiscoPrivate::generate();
    let stale = request(&bed, &old, [old.public(), bed.b.1.public()], 1);
    assert_eq!(ask(&bed, &bed.a.0, &stale).unwrap_err(), Drop::StaleDisco);
    // Sealed to another disco key than Ferry's.
    let mut wrong = Vec::new();
    disco::seal(
        &mut wrong,
        &bed.a.1.shared(&DiscoPrivate::generate().public()),
        &bed.a.1.public(),
        &ferry_proto::nacl::random_nonce(),
        &Message::AllocateRequest(AllocateRequest {
            client_disco: pair,
            generation: 1,
        }),
    );
    assert_eq!(ask(&bed, &bed.a.0, &wrong).unwrap_err(), Drop::BadBox);
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert_eq!(ask(&bed, &bed.a.0, &flipped).unwrap_err(), Drop::BadBox);
    assert_eq!(ask(&bed, &bed.a.0, b"hello").unwrap_err(), Drop::NotDisco);
    let mut big = good.clone();
    big.resize(MAX_DISCO + 1, 0);
    assert_eq!(ask(&bed, &bed.a.0, &big).unwrap_err(), Drop::Oversize);
    assert!(bed.relays.lock().is_empty());
}

#[test]
fn only_allocation_requests_naming_the_sender_are_answered() {
    let bed = bed();
    let ping = sealed(
        &bed.a.1,
        &bed.ferry.public(),
        &Message::Ping(Ping {
            tx_id: [1; 12],
            node_key: None,
            padding: 0,
        }),
    );
    assert_eq!(
        ask(&bed, &bed.a.0, &ping).unwrap_err(),
        Drop::UnexpectedType
    );
    let others = [bed.b.1.public(), bed.c.1.public()];
    assert_eq!(
        ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, others, 1)).unwrap_err(),
        Drop::NotInPair
    );
    let same = [bed.a.1.public(), bed.a.1.public()];
    assert_eq!(
        ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, same, 1)).unwrap_err(),
        Drop::Refused(Refusal::SamePair)
    );
}

#[test]
fn a_relay_without_an_address_or_turned_off_answers_nothing() {
    let bed = bed();
    bed.relays.set_addrs(Vec::new());
    let pair = [bed.a.1.public(), bed.b.1.public()];
    assert_eq!(
        ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, pair, 1)).unwrap_err(),
        Drop::Refused(Refusal::NotReady)
    );
    let off = bed_with(r#""disable-relay-server":null"#);
    let pair = [off.a.1.public(), off.b.1.public()];
    assert_eq!(
        ask(&off, &off.a.0, &request(&off, &off.a.1, pair, 1)).unwrap_err(),
        Drop::Disabled
    );
}

#[test]
fn a_withdrawn_grant_frees_the_requesters_endpoints() {
    let mut bed = bed();
    let pair = [bed.a.1.public(), bed.b.1.public()];
    ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, pair, 1)).expect("answered");
    assert_eq!(
        revoke_ungranted(&bed.netmap, &bed.relays),
        0,
        "still granted"
    );
    assert_eq!(bed.relays.lock().len(), 1);
    // A netmap without this node yet frees nothing.
    assert_eq!(revoke_ungranted(&Netmap::default(), &bed.relays), 0);
    bed.netmap.filters.clear();
    assert_eq!(revoke_ungranted(&bed.netmap, &bed.relays), 1);
    assert!(bed.relays.lock().is_empty());
}

#[test]
fn turning_the_relay_off_frees_every_endpoint() {
    let mut bed = bed();
    let pair = [bed.a.1.public(), bed.b.1.public()];
    ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, pair, 1)).expect("answered");
    let me = bed.netmap.self_node.as_mut().unwrap();
    me.cap_map.push(DISABLE_RELAY.into());
    assert_eq!(revoke_ungranted(&bed.netmap, &bed.relays), 1);
}

#[test]
fn a_peer_past_its_rate_is_dropped_before_any_crypto() {
    let bed = bed();
    let pair = [bed.a.1.public(), bed.b.1.public()];
    let packet = request(&bed, &bed.a.1, pair, 1);
    let burst = REQUEST_BURST as usize;
    // One instant throughout: the buckets do not refill.
    let now = Instant::now();
    for i in 0..burst {
        assert!(ask_at(&bed, &bed.a.0, &packet, now).is_ok(), "request {i}");
    }
    assert_eq!(
        ask_at(&bed, &bed.a.0, &packet, now).unwrap_err(),
        Drop::RateLimited
    );
    // Garbage counts too: it costs a box open.
    let mut flipped = request(&bed, &bed.b.1, pair, 1);
    *flipped.last_mut().unwrap() ^= 1;
    for _ in 0..burst {
        assert_eq!(
            ask_at(&bed, &bed.b.0, &flipped, now).unwrap_err(),
            Drop::BadBox
        );
    }
    assert_eq!(
        ask_at(&bed, &bed.b.0, &flipped, now).unwrap_err(),
        Drop::RateLimited
    );
    // Another peer is not held back.
    let c_pair = [bed.c.1.public(), bed.a.1.public()];
    assert_eq!(
        ask_at(&bed, &bed.c.0, &request(&bed, &bed.c.1, c_pair, 1), now).unwrap_err(),
        Drop::NoGrant
    );
}

#[test]
fn every_reason_has_its_own_label() {
    let labels: std::collections::BTreeSet<_> = Drop::ALL.iter().map(|d| d.label()).collect();
    assert_eq!(labels.len(), Drop::ALL.len());
    for (i, d) in Drop::ALL.iter().enumerate() {
        assert_eq!(d.index(), i);
    }
}

#[test]
fn a_peers_disco_key_is_first_seen_once_whoever_asks() {
    let bed = bed();
    let mut seen = FirstSeen::default();
    // b asks for the pair: a's key is named there too, and a is a peer.
    let pair = [bed.a.1.public(), bed.b.1.public()];
    let got = ask(&bed, &bed.b.0, &request(&bed, &bed.b.1, pair, 1)).expect("answered");
    assert_eq!(got.client_disco, {
        let mut s = pair;
        s.sort_by(|x, y| x.as_bytes().cmp(y.as_bytes()));
        s
    });
    let mut first = seen.note(&bed.netmap, &got);
    first.sort_by(|x, y| x.1.as_bytes().cmp(y.1.as_bytes()));
    let mut want = vec![(bed.a.0, bed.a.1.public()), (bed.b.0, bed.b.1.public())];
    want.sort_by(|x, y| x.1.as_bytes().cmp(y.1.as_bytes()));
    assert_eq!(first, want);
    // Named again (another endpoint, either asker): nothing new.
    let pair_ac = [bed.a.1.public(), bed.c.1.public()];
    let got = ask(&bed, &bed.a.0, &request(&bed, &bed.a.1, pair_ac, 1)).expect("answered");
    assert_eq!(seen.note(&bed.netmap, &got), [(bed.c.0, bed.c.1.public())]);
    assert_eq!(seen.note(&bed.netmap, &got), []);
    // A key of the requester's choosing, no peer's: never a line.
    let stranger = DiscoPrivate::generate().public();
    let got = ask(
        &bed,
        &bed.a.0,
        &request(&bed, &bed.a.1, [bed.a.1.public(), stranger], 1),
    )
    .expect("answered");
    assert_eq!(seen.note(&bed.netmap, &got), []);
}

/// Forged disco over DERP: a box truncated anywhere (down to the header)
/// or grown past the largest disco message is dropped by its reason,
/// answered by nothing, and allocates nothing.
#[test]
fn truncated_and_oversize_boxes_get_nothing() {
    let bed = bed();
    let pair = [bed.a.1.public(), bed.b.1.public()];
    let good = request(&bed, &bed.a.1, pair, 1);
    let header = disco::MAGIC.len() + 32;
    for len in [0, 5, header - 1] {
        assert_eq!(
            ask(&bed, &bed.a.0, &good[..len]).unwrap_err(),
            Drop::NotDisco,
            "{len} bytes"
        );
    }
    // Up to the header, the sender is read and the peer looked up: the
    // box then does not open.
    for len in (header..good.len()).step_by(7) {
        let r = ask(&bed, &bed.a.0, &good[..len]).unwrap_err();
        assert!(
            matches!(r, Drop::BadBox | Drop::NotDisco),
            "{len} bytes: {r:?}"
        );
    }
    // The largest message a peer sends is far below MAX_DISCO; a packet
    // past it is dropped before the node key is looked up, even from a
    // stranger.
    let mut big = good.clone();
    big.resize(MAX_DISCO + 1, 0);
    let stranger = NodePrivate::generate().public();
    assert_eq!(ask(&bed, &stranger, &big).unwrap_err(), Drop::Oversize);
    assert!(bed.relays.lock().is_empty());
    assert_eq!(bed.relays.lock().counters().allocated, 0);
}

/// A granted peer asking for endpoint after endpoint (each with another
/// made-up partner) gets its per-requester limit and no more, then its
/// rate; another granted peer still gets its endpoint.
#[test]
fn an_allocation_flood_from_one_peer_leaves_room_for_others() {
    let mut bed = bed();
    let per_requester = 8;
    bed.relays = PeerRelays::new(
        DiscoPrivate::generate(),
        Limits {
            per_requester,
            ..Limits::default()
        },
    );
    bed.relays.set_addrs(vec![addr()]);
    // All at one instant: the rate's bucket does not refill meanwhile.
    let now = Instant::now();
    let (mut new, mut limit, mut rate) = (0, 0, 0);
    for _ in 0..200 {
        let partner = DiscoPrivate::generate().public();
        let packet = request(&bed, &bed.a.1, [bed.a.1.public(), partner], 1);
        match ask_at(&bed, &bed.a.0, &packet, now) {
            Ok(a) => {
                assert!(!a.existing);
                new += 1;
            }
            Err(Drop::Refused(Refusal::RequesterLimit)) => limit += 1,
            Err(Drop::RateLimited) => rate += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    let cap = per_requester;
    assert_eq!(new, cap, "endpoints for one flooding peer");
    assert_eq!(
        new + limit,
        REQUEST_BURST as usize,
        "the burst, then the rate"
    );
    assert_eq!(rate, 200 - REQUEST_BURST as usize);
    assert_eq!(bed.relays.lock().len(), cap);
    let b_pair = [bed.b.1.public(), bed.c.1.public()];
    let b = ask_at(&bed, &bed.b.0, &request(&bed, &bed.b.1, b_pair, 1), now).unwrap();
    assert!(!b.existing);
    assert_eq!(bed.relays.lock().len(), cap + 1);
}
