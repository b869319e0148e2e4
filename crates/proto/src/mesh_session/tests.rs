use super::*;
use crate::relay_session::v2::{EndReason, FLAG_CROSS_NODE};
use crate::relay_session::{RefuseReason, SessionOffer};
use std::time::Duration;

fn key(b: u8) -> NodePublic {
    NodePublic([b; 32])
}

fn offer2() -> SessionOffer2 {
    SessionOffer2 {
        offer: SessionOffer {
            request_id: 7,
            vni: 0x12_3456,
            peer: key(0xbb),
            slot: 0,
            token: [0x22; 32],
            endpoints: vec![
                "192.0.2.1:3479".parse().unwrap(),
                "[2001:db8::1]:3479".parse().unwrap(),
            ],
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
        },
        host: key(0xcc),
        flags: FLAG_CROSS_NODE,
    }
}

/// Every kind, as §9.4's vectors have them.
fn vectors() -> Vec<(&'static str, MeshSession)> {
    let end = SessionEnd {
        vni: 0x12_3456,
        peer: key(0xbb),
        host: key(0xcc),
        reason: EndReason::Draining,
        grace: Duration::from_secs(10),
    };
    let m = |dst: u8, msg| MeshSession { dst: key(dst), msg };
    vec![
        (
            "allocate",
            m(
                0xbb,
                MeshMsg::Allocate {
                    asker: key(0xaa),
                    request_id: 7,
                    asker_ip: "198.51.100.7".parse().unwrap(),
                    conn_id: 0x0102_0304_0506_0708,
                },
            ),
        ),
        ("offer", m(0xaa, MeshMsg::Offer(offer2()))),
        (
            "refused",
            m(
                0xaa,
                MeshMsg::Refused(Refused {
                    request_id: 7,
                    peer: key(0xbb),
                    reason: RefuseReason::Other(7),
                }),
            ),
        ),
        ("end", m(0xaa, MeshMsg::End(end))),
        (
            "declined",
            m(
                0xcc,
                MeshMsg::Declined {
                    vni: 0x12_3456,
                    key: key(0xbb),
                    reason: 2,
                },
            ),
        ),
        (
            "state",
            m(
                0,
                MeshMsg::State {
                    flags: STATE_SESSIONS_ON,
                    hosted: 3,
                },
            ),
        ),
    ]
}

#[test]
fn vectors_from_the_protocol_document() {
    for (name, m) in vectors() {
        let mut out = Vec::new();
        put_mesh_session(&mut out, &m);
        assert_eq!(
            out,
            crate::testutil::relay_sessions_vector(&format!("meshSession {name}")),
            "meshSession {name}"
        );
        assert_eq!(out[0], MESH_SESSION);
        assert_eq!(m.msg.label(), name);
        assert_eq!(parse_mesh_session(&out[frame::HEADER_LEN..]), Ok(m));
    }
}

#[test]
fn the_largest_offer_fits_the_frame_limit() {
    let mut o = offer2();
    o.offer.endpoints = (0..rs::MAX_ENDPOINTS as u16)
        .map(|p| std::net::SocketAddr::from((Ipv6Addr::LOCALHOST, p + 1)))
        .collect();
    let mut out = Vec::new();
    put_mesh_session(
        &mut out,
        &MeshSession {
            dst: key(1),
            msg: MeshMsg::Offer(o),
        },
    );
    assert!(out.len() <= MAX_FRAME_LEN, "{}", out.len());
    assert!(parse_mesh_session(&out[frame::HEADER_LEN..]).is_ok());
}

#[test]
fn bad_bodies_are_refused_by_reason() {
    let mut body = Vec::new();
    put_mesh_session(&mut body, &vectors()[0].1);
    let body = body.split_off(frame::HEADER_LEN);
    let e = parse_mesh_session(&body[..KEY_LEN]).unwrap_err();
    assert_eq!(e.label(), "malformed", "{e}");
    let e = parse_mesh_session(&body[..body.len() - 1]).unwrap_err();
    assert_eq!(e.label(), "malformed", "{e}");
    let mut unknown = body.clone();
    unknown[KEY_LEN] = 7;
    assert_eq!(
        parse_mesh_session(&unknown),
        Err(MeshSessionError::UnknownKind(7))
    );
    unknown[KEY_LEN] = 0;
    assert_eq!(
        parse_mesh_session(&unknown),
        Err(MeshSessionError::UnknownKind(0))
    );
    let big = vec![0u8; MAX_BODY_LEN + 1];
    assert_eq!(
        parse_mesh_session(&big),
        Err(MeshSessionError::Oversize(MAX_BODY_LEN + 1))
    );
    // A state or declined body one byte off.
    for kind in [5u8, 6] {
        let mut b = vec![0u8; KEY_LEN + 1 + if kind == 5 { DECLINED_LEN } else { STATE_LEN } + 1];
        b[KEY_LEN] = kind;
        assert_eq!(parse_mesh_session(&b).unwrap_err().label(), "malformed");
    }
}

#[test]
fn an_ipv6_asker_round_trips() {
    let m = MeshSession {
        dst: key(2),
        msg: MeshMsg::Allocate {
            asker: key(3),
            request_id: u32::MAX,
            asker_ip: "2001:db8::7".parse().unwrap(),
            conn_id: u64::MAX,
        },
    };
    let mut out = Vec::new();
    put_mesh_session(&mut out, &m);
    assert_eq!(parse_mesh_session(&out[frame::HEADER_LEN..]), Ok(m));
}

#[test]
fn the_capability_in_client_and_server_info() {
    // docs/relay-sessions.md §9.1.
    use crate::handshake::{ClientInfo, MeshCapability, ServerInfo};
    use crate::key::MeshKey;
    let ask = ClientInfo {
        mesh_key: Some(MeshKey([7; 32])),
        version: 2,
        ferry_mesh: VERSION,
        ..ClientInfo::default()
    };
    let json = String::from_utf8(ask.to_json()).unwrap();
    assert!(
        json.ends_with(r#","CanAckPings":false,"ferryMesh":1}"#),
        "{json}"
    );
    assert_eq!(ClientInfo::from_json(json.as_bytes()).unwrap(), ask);
    let answer = ServerInfo {
        ferry_mesh: Some(MeshCapability { version: VERSION }),
        ..ServerInfo::current()
    };
    assert_eq!(
        answer.to_json(),
        br#"{"version":2,"ferryMesh":{"version":1}}"#
    );
    assert_eq!(ServerInfo::from_json(&answer.to_json()).unwrap(), answer);
    // What this version cannot read means "not spoken".
    let odd = ClientInfo::from_json(br#"{"ferryMesh":{"v":2}}"#).unwrap();
    assert_eq!(odd.ferry_mesh, 0);
    let odd = ServerInfo::from_json(br#"{"version":2,"ferryMesh":1}"#).unwrap();
    assert_eq!(odd.ferry_mesh, None);
    // Without the key, the JSON is as before (derper, older Ferry).
    assert_eq!(ServerInfo::current().to_json(), br#"{"version":2}"#);
}

#[test]
fn a_server_reads_mesh_sessions_only_from_peers_that_asked() {
    use crate::frame::{Deframer, ServerFramePolicy};
    use std::ops::ControlFlow;
    let mut f = Vec::new();
    put_mesh_session(&mut f, &vectors()[5].1);
    // Past the body limit, still read (and then refused by the parser).
    let mut big = Vec::new();
    frame::put_frame(&mut big, MESH_SESSION, &[0; MAX_BODY_LEN + 1]);
    f.extend_from_slice(&big);
    for (ferry_mesh, want) in [(false, 0), (true, 2)] {
        let policy = ServerFramePolicy {
            mesh: true,
            relay_sessions: false,
            ferry_mesh,
        };
        let mut d = Deframer::new();
        let mut got = 0;
        d.feed(&f, &policy, |ty, _| {
            assert_eq!(ty, MESH_SESSION);
            got += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(got, want, "ferry_mesh {ferry_mesh}");
    }
}
