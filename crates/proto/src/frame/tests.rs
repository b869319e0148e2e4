//! Unit tests for framing: `docs/derp-protocol.md` §17.2/§17.4 vectors, policy
//! tables, parser tolerance and deframer mechanics. Randomised tests live in
//! `tests/proptests.rs`.

use super::*;
use crate::testutil::{key_c, key_p, unhex};
use std::net::{Ipv4Addr, SocketAddrV4, SocketAddrV6};

fn built(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

#[test]
fn vectors_small_frames() {
    // `docs/derp-protocol.md` §17.2
    let ping = [1, 2, 3, 4, 5, 6, 7, 8];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (built(put_keepalive), "0600000000"),
        (built(|o| put_note_preferred(o, true)), "0700000001 | 01"),
        (built(|o| put_note_preferred(o, false)), "0700000001 | 00"),
        (built(put_watch_conns), "1000000000"),
        (
            built(|o| put_ping(o, &ping)),
            "1200000008 | 0102030405060708",
        ),
        (
            built(|o| put_pong(o, &ping)),
            "1300000008 | 0102030405060708",
        ),
        (built(|o| put_health(o, "BAD")), "1400000003 | 424144"),
        (built(|o| put_health(o, "")), "1400000000"),
        (
            built(|o| put_restarting(o, 2500, 10000)),
            "1500000008 | 000009c400002710",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, unhex(want), "{want}");
    }
}

const C_HEX: &str = "5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b";
const P_HEX: &str = "64b101b1d0be5a8704bd078f9895001fc03e8e9f9522f188dd128d9846d48466";

#[test]
fn vectors_data_and_control_frames() {
    // `docs/derp-protocol.md` §17.4
    let c = key_c();
    let p = key_p();
    let v4: SocketAddr = "198.51.100.23:41641".parse().unwrap();
    let v6: SocketAddr = "[2001:db8::2]:443".parse().unwrap();
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            built(|o| put_send_packet(o, &p, b"hello")),
            format!("0400000025 | {P_HEX} 68656c6c6f"),
        ),
        (
            built(|o| put_recv_packet(o, &c, b"hello")),
            format!("0500000025 | {C_HEX} 68656c6c6f"),
        ),
        (
            built(|o| put_forward_packet(o, &c, &p, b"hello")),
            format!("0a00000045 | {C_HEX} {P_HEX} 68656c6c6f"),
        ),
        (
            built(|o| put_peer_gone(o, &c, PeerGoneReason::Disconnected)),
            format!("0800000021 | {C_HEX} 00"),
        ),
        (
            built(|o| put_peer_gone(o, &p, PeerGoneReason::NotHere)),
            format!("0800000021 | {P_HEX} 01"),
        ),
        (
            built(|o| put_peer_present(o, &c, Some(v4), PEER_PRESENT_IS_REGULAR, "")),
            format!("0900000034 | {C_HEX} 00000000000000000000ffffc6336417 a2a9 01 00"),
        ),
        (
            built(|o| put_peer_present(o, &p, Some(v6), PEER_PRESENT_IS_MESH_PEER, "")),
            format!("0900000034 | {P_HEX} 20010db8000000000000000000000002 01bb 02 00"),
        ),
        (
            built(|o| put_peer_present(o, &c, Some(v4), PEER_PRESENT_IS_REGULAR, "ferry")),
            format!("0900000039 | {C_HEX} 00000000000000000000ffffc6336417 a2a9 01 05 6665727279"),
        ),
        (
            built(|o| put_close_peer(o, &p)),
            format!("1100000020 | {P_HEX}"),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, unhex(&want), "{want}");
    }
    // recv_packet_header is the first 37 bytes of the recvPacket frame.
    let whole = built(|o| put_recv_packet(o, &c, b"hello"));
    assert_eq!(recv_packet_header(&c, 5)[..], whole[..37]);
}

#[test]
fn vectors_parse_back() {
    let c = key_c();
    let p = key_p();
    let send = unhex(&format!("{P_HEX} 68656c6c6f"));
    assert_eq!(
        parse_client_frame(0x04, &send),
        Ok(ClientFrame::SendPacket {
            dst: p,
            packet: b"hello"
        })
    );
    let fwd = unhex(&format!("{C_HEX} {P_HEX} 68656c6c6f"));
    assert_eq!(
        parse_client_frame(0x0a, &fwd),
        Ok(ClientFrame::ForwardPacket {
            src: c,
            dst: p,
            packet: b"hello"
        })
    );
    assert_eq!(
        parse_client_frame(0x11, &unhex(P_HEX)),
        Ok(ClientFrame::ClosePeer(p))
    );
    let present = unhex(&format!(
        "{C_HEX} 00000000000000000000ffffc6336417 a2a9 01 00"
    ));
    assert_eq!(
        parse_server_frame(0x09, &present),
        Ok(ServerFrame::PeerPresent {
            key: c,
            addr: Some("198.51.100.23:41641".parse().unwrap()),
            flags: 1,
            app_name: None,
        })
    );
    let present6 = unhex(&format!(
        "{P_HEX} 20010db8000000000000000000000002 01bb 02 00"
    ));
    assert_eq!(
        parse_server_frame(0x09, &present6),
        Ok(ServerFrame::PeerPresent {
            key: p,
            addr: Some("[2001:db8::2]:443".parse().unwrap()),
            flags: 2,
            app_name: None,
        })
    );
    let named = unhex(&format!(
        "{C_HEX} 00000000000000000000ffffc6336417 a2a9 01 05 6665727279"
    ));
    assert_eq!(
        parse_server_frame(0x09, &named),
        Ok(ServerFrame::PeerPresent {
            key: c,
            addr: Some("198.51.100.23:41641".parse().unwrap()),
            flags: 1,
            app_name: AppName::new(b"ferry"),
        })
    );
    assert_eq!(
        parse_server_frame(0x15, &unhex("000009c400002710")),
        Ok(ServerFrame::Restarting {
            reconnect_in_ms: 2500,
            try_for_ms: 10000
        })
    );
}

#[test]
fn header_round_trip_and_short_input() {
    assert_eq!(encode_header(0x04, 0x25), [4, 0, 0, 0, 0x25]);
    assert_eq!(decode_header(&[4, 0, 0, 0, 0x25, 9]), Some((4, 0x25)));
    assert_eq!(decode_header(&[4, 0, 0, 0]), None);
    assert_eq!(
        decode_header(&encode_header(0xff, u32::MAX)),
        Some((0xff, u32::MAX))
    );
}

#[test]
fn frame_types() {
    assert_eq!(FrameType::ALL.len(), 16);
    for t in FrameType::ALL {
        assert_eq!(FrameType::from_u8(t.as_u8()), Some(t));
        assert_eq!(u8::from(t), t as u8);
    }
    let assigned = (0..=255u8)
        .filter(|&b| FrameType::from_u8(b).is_some())
        .count();
    assert_eq!(assigned, 16);
    assert_eq!(FrameType::from_u8(0x0b), None);
    assert_eq!(FrameType::from_u8(0x16), None);
    assert_eq!(FrameType::Restarting as u8, 0x15);
    assert_eq!(FrameType::ForwardPacket as u8, 0x0a);
    assert_eq!(FrameLabel(0x04).to_string(), "sendPacket frame (0x04)");
    assert_eq!(FrameLabel(0x42).to_string(), "unknown frame (0x42)");
}

#[test]
fn constants() {
    assert_eq!(MAGIC, [0x44, 0x45, 0x52, 0x50, 0xF0, 0x9F, 0x94, 0x91]);
    assert_eq!(DISCO_MAGIC, [0x54, 0x53, 0xf0, 0x9f, 0x92, 0xac]);
    assert_eq!(MAX_PACKET_SIZE, 65536);
    assert_eq!(MIN_CLIENT_INFO_LEN, 56);
    assert_eq!(MAX_CLIENT_INFO_LEN, 262144);
    assert_eq!(MAX_CLIENT_READ_FRAME, 1 << 20);
    assert_eq!(PEER_PRESENT_LEN, 52);
    assert_eq!(
        (
            PEER_PRESENT_IS_REGULAR,
            PEER_PRESENT_IS_MESH_PEER,
            PEER_PRESENT_IS_PROBER,
            PEER_PRESENT_NOT_IDEAL
        ),
        (1, 2, 4, 8)
    );
}

#[test]
fn disco_classification() {
    let mut pkt = vec![0u8; 62];
    pkt[..6].copy_from_slice(&DISCO_MAGIC);
    assert!(is_disco(&pkt));
    assert!(!is_disco(&pkt[..61]));
    pkt[0] = 0;
    assert!(!is_disco(&pkt));
    assert!(!is_disco(b""));
}

#[test]
fn peer_gone_reason_bytes() {
    for b in 0..=255u8 {
        assert_eq!(PeerGoneReason::from_u8(b).to_u8(), b);
    }
    assert_eq!(PeerGoneReason::from_u8(0), PeerGoneReason::Disconnected);
    assert_eq!(PeerGoneReason::from_u8(1), PeerGoneReason::NotHere);
    assert_eq!(PeerGoneReason::from_u8(0xf0), PeerGoneReason::Other(0xf0));
}

#[test]
fn client_frame_length_rules() {
    let err = |ty, len| parse_client_frame(ty, &vec![0u8; len]).unwrap_err();
    assert_eq!(
        err(0x04, 31),
        FrameError::TooShort {
            frame: 4,
            len: 31,
            min: 32
        }
    );
    assert_eq!(
        err(0x04, 32 + 65537),
        FrameError::TooLong {
            frame: 4,
            len: 32 + 65537,
            max: 32 + 65536
        }
    );
    assert!(parse_client_frame(0x04, &vec![0u8; 32 + 65536]).is_ok());
    assert!(matches!(
        parse_client_frame(0x04, &[0u8; 32]),
        Ok(ClientFrame::SendPacket { packet: [], .. })
    ));
    assert!(matches!(
        err(0x0a, 63),
        FrameError::TooShort { min: 64, .. }
    ));
    assert_eq!(
        err(0x07, 2),
        FrameError::BadLength {
            frame: 7,
            len: 2,
            expected: 1
        }
    );
    assert_eq!(
        parse_client_frame(0x07, &[7]),
        Ok(ClientFrame::NotePreferred(true))
    );
    assert!(matches!(err(0x10, 1), FrameError::BadLength { .. }));
    assert!(matches!(err(0x11, 33), FrameError::BadLength { .. }));
    assert!(matches!(err(0x12, 7), FrameError::TooShort { .. }));
    assert!(matches!(err(0x12, 1001), FrameError::TooLong { .. }));
    let mut long_ping = vec![9u8; 1000];
    long_ping[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        parse_client_frame(0x12, &long_ping),
        Ok(ClientFrame::Ping([1, 2, 3, 4, 5, 6, 7, 8]))
    );
    assert!(matches!(err(0x13, 7), FrameError::TooShort { .. }));
    assert_eq!(
        parse_client_frame(0x13, &[3; 9]),
        Ok(ClientFrame::Pong([3; 8]))
    );
    assert_eq!(
        parse_client_frame(0x06, b"x"),
        Ok(ClientFrame::Other { ty: 6 })
    );
    assert_eq!(
        parse_client_frame(0x77, b"x"),
        Ok(ClientFrame::Other { ty: 0x77 })
    );
    // Error messages name the frame and the limit.
    assert_eq!(
        err(0x04, 31).to_string(),
        "sendPacket frame (0x04) too short: 31 bytes, minimum 32"
    );
}

#[test]
fn server_frame_tolerance() {
    let c = key_c();
    let key_only = c.as_bytes().to_vec();
    // peerPresent: 32 = key only; 50 = with address; 51+ = with flags.
    assert_eq!(
        parse_server_frame(0x09, &key_only),
        Ok(ServerFrame::PeerPresent {
            key: c,
            addr: None,
            flags: 0,
            app_name: None,
        })
    );
    let mut with_addr = key_only.clone();
    with_addr.extend_from_slice(&Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped().octets());
    with_addr.extend_from_slice(&80u16.to_be_bytes());
    assert_eq!(
        parse_server_frame(0x09, &with_addr[..49]),
        Ok(ServerFrame::PeerPresent {
            key: c,
            addr: None,
            flags: 0,
            app_name: None,
        })
    );
    assert_eq!(
        parse_server_frame(0x09, &with_addr),
        Ok(ServerFrame::PeerPresent {
            key: c,
            addr: Some("10.1.2.3:80".parse().unwrap()),
            flags: 0,
            app_name: None,
        })
    );
    let mut longer = with_addr.clone();
    longer.extend_from_slice(&[PEER_PRESENT_IS_PROBER, 0xee, 0xee]);
    assert_eq!(
        parse_server_frame(0x09, &longer),
        Ok(ServerFrame::PeerPresent {
            key: c,
            addr: Some("10.1.2.3:80".parse().unwrap()),
            flags: 4,
            app_name: None,
        })
    );
    assert_eq!(
        parse_server_frame(0x09, &key_only[..31]),
        Ok(ServerFrame::Other { ty: 9 })
    );
    // peerGone without a reason byte means Disconnected.
    assert_eq!(
        parse_server_frame(0x08, &key_only),
        Ok(ServerFrame::PeerGone {
            key: c,
            reason: PeerGoneReason::Disconnected
        })
    );
    assert_eq!(
        parse_server_frame(0x08, &key_only[..5]),
        Ok(ServerFrame::Other { ty: 8 })
    );
    // Short frames a Go client drops.
    for ty in [0x05, 0x12, 0x13, 0x15] {
        assert_eq!(
            parse_server_frame(ty, &[0; 7]),
            Ok(ServerFrame::Other { ty })
        );
    }
    assert_eq!(parse_server_frame(0x06, b""), Ok(ServerFrame::KeepAlive));
    assert_eq!(
        parse_server_frame(0x14, b"x"),
        Ok(ServerFrame::Health(b"x"))
    );
    assert_eq!(
        parse_server_frame(0x03, b"box"),
        Ok(ServerFrame::ServerInfo(b"box"))
    );
    assert_eq!(
        parse_server_frame(0xaa, b""),
        Ok(ServerFrame::Other { ty: 0xaa })
    );
    let mut sk = MAGIC.to_vec();
    sk.extend_from_slice(c.as_bytes());
    assert_eq!(parse_server_frame(0x01, &sk), Ok(ServerFrame::ServerKey(c)));
    sk[0] = b'X';
    assert_eq!(
        parse_server_frame(0x01, &sk),
        Ok(ServerFrame::Other { ty: 1 })
    );
}

/// peerPresent's application name as Go's client reads it: the name when
/// the length byte's promise is kept and the name is valid, no name for
/// an empty, short or invalid one; bytes after the name are ignored.
#[test]
fn peer_present_app_name_leniency() {
    let c = key_c();
    let mut base = c.as_bytes().to_vec();
    base.extend_from_slice(&Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped().octets());
    base.extend_from_slice(&80u16.to_be_bytes());
    base.push(PEER_PRESENT_IS_REGULAR);
    let name_of = |tail: &[u8]| {
        let mut f = base.clone();
        f.extend_from_slice(tail);
        match parse_server_frame(0x09, &f).unwrap() {
            ServerFrame::PeerPresent {
                addr,
                flags,
                app_name,
                ..
            } => {
                assert_eq!(addr, Some("10.1.2.3:80".parse().unwrap()));
                assert_eq!(flags, PEER_PRESENT_IS_REGULAR);
                app_name.map(|n| n.as_str().to_owned())
            }
            other => panic!("{other:?}"),
        }
    };
    let with_len = |name: &[u8]| {
        let mut t = vec![name.len() as u8];
        t.extend_from_slice(name);
        t
    };
    assert_eq!(name_of(&[]), None, "51 bytes: an older server");
    assert_eq!(name_of(&[0]), None, "empty name");
    for n in [1, 31, 32] {
        let name = vec![b'a'; n];
        assert_eq!(name_of(&with_len(&name)), Some("a".repeat(n)), "{n} bytes");
    }
    assert_eq!(name_of(&with_len(&[b'a'; 33])), None, "33 bytes");
    assert_eq!(name_of(&with_len(b"a\x1f")), None, "0x1f");
    assert_eq!(name_of(&with_len(b"a\x7f")), None, "0x7f");
    assert_eq!(
        name_of(&with_len(b" ~")),
        Some(" ~".into()),
        "0x20 and 0x7e"
    );
    assert_eq!(
        name_of(&[5, b'f', b'e', b'r', b'r']),
        None,
        "one byte short"
    );
    assert_eq!(name_of(&[3, b'a', b'b', b'c', 0xff]), Some("abc".into()));
    // What the builder writes reads back.
    for name in ["", "x", "0123456789abcdefghijklmnopqrstuv"] {
        let f = built(|o| put_peer_present(o, &c, None, 0, name));
        assert_eq!(f.len(), HEADER_LEN + PEER_PRESENT_LEN + name.len());
        match parse_server_frame(f[0], &f[HEADER_LEN..]).unwrap() {
            ServerFrame::PeerPresent { app_name, .. } => {
                assert_eq!(app_name.as_ref().map_or("", AppName::as_str), name)
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn peer_present_address_forms() {
    let c = key_c();
    let parse = |addr: Option<SocketAddr>| {
        let f = built(|o| put_peer_present(o, &c, addr, 0, ""));
        assert_eq!(f.len(), HEADER_LEN + PEER_PRESENT_LEN);
        match parse_server_frame(f[0], &f[HEADER_LEN..]).unwrap() {
            ServerFrame::PeerPresent { addr, .. } => addr,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(parse(None), None);
    let mapped = SocketAddr::V6(SocketAddrV6::new(
        Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped(),
        7,
        0,
        0,
    ));
    assert_eq!(
        parse(Some(mapped)),
        Some(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::new(192, 0, 2, 1),
            7
        )))
    );
    assert_eq!(canonical_addr(mapped), parse(Some(mapped)).unwrap());
    let v4: SocketAddr = "0.0.0.0:0".parse().unwrap();
    assert_eq!(parse(Some(v4)), Some(v4));
}

#[test]
fn relay_allocate_is_read_only_from_clients_that_asked() {
    use Disposition::*;
    let ask = |mesh| ServerFramePolicy {
        mesh,
        relay_sessions: true,
        ferry_mesh: false,
    };
    for mesh in [false, true] {
        let plain = ServerFramePolicy {
            mesh,
            relay_sessions: false,
            ferry_mesh: false,
        };
        // Without the capability: an unknown frame, skipped like derper.
        assert_eq!(plain.check(RELAY_ALLOCATE, 36), Skip);
        assert_eq!(plain.check(RELAY_ALLOCATE, 100), Skip);
        // With it: exactly 36 bytes.
        assert_eq!(ask(mesh).check(RELAY_ALLOCATE, 36), Buffer);
        for len in [0, 35, 37, 65_568] {
            assert!(matches!(
                ask(mesh).check(RELAY_ALLOCATE, len),
                Reject(FrameError::BadLength { expected: 36, .. })
            ));
        }
        // The server-to-client types stay unknown frames from a client.
        for ty in [RELAY_SESSION, RELAY_REFUSED] {
            assert_eq!(ask(mesh).check(ty, 36), Skip);
        }
        assert_eq!(
            ask(mesh).check(0x04, 32),
            plain.check(0x04, 32),
            "everything else as before"
        );
    }
}

#[test]
fn server_policy_table() {
    let ordinary = ServerFramePolicy {
        mesh: false,
        relay_sessions: false,
        ferry_mesh: false,
    };
    let mesh = ServerFramePolicy {
        mesh: true,
        relay_sessions: false,
        ferry_mesh: false,
    };
    use Disposition::*;
    let max = MAX_PACKET_SIZE as u32;
    for p in [ordinary, mesh] {
        assert_eq!(p.check(0x04, 32), Buffer);
        assert_eq!(p.check(0x04, 32 + max), Buffer);
        assert!(matches!(
            p.check(0x04, 31),
            Reject(FrameError::TooShort { .. })
        ));
        assert!(matches!(
            p.check(0x04, 33 + max),
            Reject(FrameError::TooLong { .. })
        ));
        assert_eq!(p.check(0x07, 1), Buffer);
        assert!(matches!(
            p.check(0x07, 0),
            Reject(FrameError::BadLength { .. })
        ));
        assert_eq!(p.check(0x12, 8), Buffer);
        assert_eq!(p.check(0x12, 1000), Buffer);
        assert!(matches!(p.check(0x12, 7), Reject(_)));
        assert!(matches!(p.check(0x12, 1001), Reject(_)));
        // Ignored frames are skipped up to 64 KiB + 32 bytes; a longer one
        // closes the connection (derper since v1.104).
        for ty in [
            0x01, 0x02, 0x03, 0x05, 0x06, 0x08, 0x09, 0x13, 0x14, 0x15, 0x0b, 0x16, 0xff,
        ] {
            assert_eq!(p.check(ty, 0), Skip, "type {ty:#x}");
            assert_eq!(p.check(ty, 65_568), Skip, "type {ty:#x}");
            for len in [65_569, u32::MAX] {
                assert_eq!(
                    p.check(ty, len),
                    Reject(FrameError::TooLong {
                        frame: ty,
                        len: len as usize,
                        max: MAX_SKIPPED_FRAME
                    }),
                    "type {ty:#x}"
                );
            }
        }
    }
    for ty in [0x0a, 0x10, 0x11] {
        assert_eq!(
            ordinary.check(ty, 0),
            Reject(FrameError::MeshOnly { frame: ty })
        );
    }
    assert_eq!(mesh.check(0x0a, 64), Buffer);
    assert_eq!(mesh.check(0x0a, 64 + max), Buffer);
    assert!(matches!(
        mesh.check(0x0a, 63),
        Reject(FrameError::TooShort { .. })
    ));
    assert!(matches!(
        mesh.check(0x0a, 65 + max),
        Reject(FrameError::TooLong { .. })
    ));
    assert_eq!(mesh.check(0x10, 0), Buffer);
    assert!(matches!(
        mesh.check(0x10, 1),
        Reject(FrameError::BadLength { .. })
    ));
    assert_eq!(mesh.check(0x11, 32), Buffer);
    assert!(matches!(
        mesh.check(0x11, 31),
        Reject(FrameError::BadLength { .. })
    ));
    assert_eq!(
        FrameError::MeshOnly { frame: 0x10 }.to_string(),
        "watchConns frame (0x10) is mesh-only and this connection did not present the mesh key"
    );
}

#[test]
fn client_and_handshake_policies() {
    use Disposition::*;
    assert_eq!(ClientFramePolicy.check(0x05, 1 << 20), Buffer);
    assert_eq!(
        ClientFramePolicy.check(0x05, (1 << 20) + 1),
        Reject(FrameError::TooLong {
            frame: 5,
            len: (1 << 20) + 1,
            max: 1 << 20
        })
    );
    assert_eq!(ClientFramePolicy.check(0x99, 0), Buffer);
    assert_eq!(ClientInfoFramePolicy.check(0x02, 56), Buffer);
    assert_eq!(ClientInfoFramePolicy.check(0x02, 262144), Buffer);
    assert!(matches!(
        ClientInfoFramePolicy.check(0x02, 55),
        Reject(FrameError::TooShort { .. })
    ));
    assert!(matches!(
        ClientInfoFramePolicy.check(0x02, 262145),
        Reject(FrameError::TooLong { .. })
    ));
    assert_eq!(
        ClientInfoFramePolicy.check(0x04, 40),
        Reject(FrameError::Unexpected {
            frame: 4,
            expected: 2
        })
    );
}

// ---------------------------------------------------------------------------
// Deframer mechanics

/// Collects every delivered frame.
fn collect(
    d: &mut Deframer,
    input: &[u8],
    policy: &impl FramePolicy,
    out: &mut Vec<(u8, Vec<u8>)>,
) -> Result<Fed, FrameError> {
    d.feed(input, policy, |ty, p| {
        out.push((ty, p.to_vec()));
        ControlFlow::Continue(())
    })
}

fn sample_stream() -> Vec<u8> {
    let mut s = Vec::new();
    put_send_packet(&mut s, &key_p(), b"hello");
    put_ping(&mut s, &[1; 8]);
    put_note_preferred(&mut s, true);
    s
}

const MESH: ServerFramePolicy = ServerFramePolicy {
    mesh: true,
    relay_sessions: false,
    ferry_mesh: false,
};
const ORDINARY: ServerFramePolicy = ServerFramePolicy {
    mesh: false,
    relay_sessions: false,
    ferry_mesh: false,
};

#[test]
fn whole_frames_are_not_copied() {
    let stream = sample_stream();
    let range = stream.as_ptr_range();
    let mut d = Deframer::new();
    let mut n = 0;
    let fed = d
        .feed(&stream, &ORDINARY, |_, p| {
            assert!(range.contains(&p.as_ptr()) || p.is_empty());
            n += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(fed, Fed::Drained);
    assert_eq!(n, 3);
    assert!(d.is_empty());
    assert_eq!(d.capacity(), 0, "nothing was buffered");
}

#[test]
fn partial_frame_is_buffered_exactly() {
    let mut stream = Vec::new();
    put_send_packet(&mut stream, &key_p(), &[7u8; 1000]);
    let mut d = Deframer::new();
    let mut got = Vec::new();
    assert_eq!(
        collect(&mut d, &stream[..3], &ORDINARY, &mut got),
        Ok(Fed::Drained)
    );
    assert_eq!(d.buffered_len(), 3);
    assert_eq!(
        collect(&mut d, &stream[3..100], &ORDINARY, &mut got),
        Ok(Fed::Drained)
    );
    assert_eq!(d.buffered_len(), 100);
    assert!(d.capacity() <= stream.len().max(8), "{}", d.capacity());
    assert!(got.is_empty());
    assert_eq!(
        collect(&mut d, &stream[100..], &ORDINARY, &mut got),
        Ok(Fed::Drained)
    );
    assert_eq!(got, vec![(4, stream[5..].to_vec())]);
    assert!(d.is_empty());
    d.shrink_if_idle();
    assert_eq!(d.capacity(), 0);
}

/// Skips every frame, whatever its length: the deframer's own limit on a
/// skipped frame is the policy's business.
struct SkipAll;

impl FramePolicy for SkipAll {
    fn check(&self, _ty: u8, _len: u32) -> Disposition {
        Disposition::Skip
    }
}

#[test]
fn skipped_frames_stream_by_unbuffered() {
    let mut d = Deframer::new();
    let mut got = Vec::new();
    // A frame announcing 4 GiB - 1 bytes, which a policy skips (the
    // server's policy rejects it instead: see `server_policy_table`).
    let header = encode_header(0x42, u32::MAX);
    assert_eq!(
        collect(&mut d, &header[..2], &SkipAll, &mut got),
        Ok(Fed::Drained)
    );
    assert_eq!(
        collect(&mut d, &header[2..], &SkipAll, &mut got),
        Ok(Fed::Drained)
    );
    assert_eq!(d.skipped_frames(), 1);
    assert_eq!(d.skip_remaining(), u32::MAX as usize);
    let junk = vec![0xabu8; 1 << 16];
    for _ in 0..4 {
        collect(&mut d, &junk, &SkipAll, &mut got).unwrap();
        assert_eq!(d.buffered_len(), 0);
        assert!(d.capacity() <= 8);
    }
    assert_eq!(d.skip_remaining(), u32::MAX as usize - 4 * (1 << 16));
    assert!(!d.is_empty());
    assert!(got.is_empty());

    // A pong (skipped by servers) in the middle of real frames.
    let mut stream = Vec::new();
    put_pong(&mut stream, &[5; 8]);
    stream.extend_from_slice(&sample_stream());
    let mut d = Deframer::new();
    collect(&mut d, &stream, &ORDINARY, &mut got).unwrap();
    assert_eq!(d.skipped_frames(), 1);
    assert_eq!(got.len(), 3);
}

#[test]
fn break_and_resume() {
    let stream = sample_stream();
    let mut d = Deframer::new();
    let mut got = Vec::new();
    let fed = d
        .feed(&stream, &ORDINARY, |ty, p| {
            got.push((ty, p.to_vec()));
            ControlFlow::Break(())
        })
        .unwrap();
    assert_eq!(fed, Fed::Paused);
    assert_eq!(got.len(), 1);
    assert_eq!(d.buffered_len(), stream.len() - (5 + 37));
    // Resume one frame at a time.
    let fed = d
        .resume(&ORDINARY, |ty, p| {
            got.push((ty, p.to_vec()));
            ControlFlow::Break(())
        })
        .unwrap();
    assert_eq!(fed, Fed::Paused);
    assert_eq!(got.len(), 2);
    let fed = collect(&mut d, &[], &ORDINARY, &mut got).unwrap();
    assert_eq!(fed, Fed::Drained);
    assert_eq!(got.len(), 3);
    assert!(d.is_empty());
    assert_eq!(got[1], (0x12, vec![1; 8]));
    assert_eq!(got[2], (0x07, vec![1]));
}

#[test]
fn feed_while_paused_keeps_order() {
    let stream = sample_stream();
    let mut d = Deframer::new();
    let mut got = Vec::new();
    d.feed(&stream[..50], &ORDINARY, |ty, p| {
        got.push((ty, p.to_vec()));
        ControlFlow::Break(())
    })
    .unwrap();
    // Feed the rest without resuming first: held bytes are processed first.
    collect(&mut d, &stream[50..], &ORDINARY, &mut got).unwrap();
    let types: Vec<u8> = got.iter().map(|f| f.0).collect();
    assert_eq!(types, [0x04, 0x12, 0x07]);
}

#[test]
fn switching_policy_after_the_first_frame() {
    // The server handshake: clientInfo first, then steady-state rules.
    let mut stream = Vec::new();
    put_frame(&mut stream, 0x02, &[0u8; 100]);
    put_watch_conns(&mut stream);
    let mut d = Deframer::new();
    let mut first = None;
    let fed = d
        .feed(&stream, &ClientInfoFramePolicy, |ty, p| {
            first = Some((ty, p.len()));
            ControlFlow::Break(())
        })
        .unwrap();
    assert_eq!((fed, first), (Fed::Paused, Some((2, 100))));
    let mut got = Vec::new();
    assert_eq!(
        d.resume(&ORDINARY, |ty, _| {
            got.push(ty);
            ControlFlow::Continue(())
        }),
        Err(FrameError::MeshOnly { frame: 0x10 })
    );
    let mut d = Deframer::new();
    d.feed(&stream, &ClientInfoFramePolicy, |_, _| {
        ControlFlow::Break(())
    })
    .unwrap();
    d.resume(&MESH, |ty, _| {
        got.push(ty);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(got, [0x10]);
}

#[test]
fn errors_poison() {
    let mut stream = sample_stream();
    stream.extend_from_slice(&encode_header(0x04, 70000));
    let mut d = Deframer::new();
    let mut got = Vec::new();
    let err = collect(&mut d, &stream, &ORDINARY, &mut got).unwrap_err();
    assert_eq!(
        err,
        FrameError::TooLong {
            frame: 4,
            len: 70000,
            max: 32 + 65536
        }
    );
    assert_eq!(got.len(), 3, "frames before the bad header are delivered");
    assert_eq!(
        collect(&mut d, &sample_stream(), &ORDINARY, &mut got),
        Err(err.clone())
    );
    assert_eq!(
        d.resume(&ORDINARY, |_, _| ControlFlow::Continue(())),
        Err(err)
    );
    assert_eq!(got.len(), 3);
    assert_eq!(d.capacity(), 0);
}

#[test]
fn byte_at_a_time() {
    let mut stream = sample_stream();
    put_frame(&mut stream, 0x99, &[1, 2, 3]);
    put_watch_conns(&mut stream);
    let mut d = Deframer::new();
    let mut got = Vec::new();
    for b in &stream {
        collect(&mut d, std::slice::from_ref(b), &MESH, &mut got).unwrap();
    }
    let types: Vec<u8> = got.iter().map(|f| f.0).collect();
    assert_eq!(types, [0x04, 0x12, 0x07, 0x10]);
    assert_eq!(d.skipped_frames(), 1);
    assert!(d.is_empty());
}
