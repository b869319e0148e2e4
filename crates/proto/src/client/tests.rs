//! Unit tests for the client state machine: scripted server bytes built with
//! the crate's own builders and the `docs/derp-protocol.md` §17 vectors,
//! virtual time from one base instant.

use super::*;
use crate::frame::{
    put_frame, put_health, put_keepalive, put_peer_gone, put_peer_present, put_ping, put_pong,
    put_recv_packet, put_restarting, HEADER_LEN, PEER_PRESENT_IS_MESH_PEER,
    PEER_PRESENT_IS_REGULAR,
};
use crate::handshake::{seal_server_info, server_key_frame};
use crate::http::switching_protocols;
use crate::key::MeshKey;
use crate::nacl::BoxError;
use crate::testutil::{
    client_private, key_c, key_p, key_s, server_private, unhex, CLIENT_INFO_FRAME,
    FAST_START_REQUEST, SERVER_INFO_FRAME,
};

const NONCE: [u8; NONCE_LEN] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
];

const CLASSIC_REQUEST: &[u8] = b"GET /derp HTTP/1.1\r\n\
    Host: derp.example.com\r\n\
    User-Agent: Go-http-client/1.1\r\n\
    Connection: Upgrade\r\n\
    Upgrade: DERP\r\n\
    \r\n";

fn t0() -> Instant {
    use std::sync::OnceLock;
    static T0: OnceLock<Instant> = OnceLock::new();
    *T0.get_or_init(Instant::now)
}

fn at(secs: u64) -> Instant {
    t0() + Duration::from_secs(secs)
}

fn config() -> Config {
    let mut c = Config::new(client_private(), "derp.example.com");
    c.user_agent = "Go-http-client/1.1".into();
    c
}

fn fast_config() -> Config {
    Config {
        fast_start: Some(key_s()),
        ..config()
    }
}

fn client(config: Config) -> Client {
    Client::new(config, t0(), NONCE).unwrap()
}

fn built(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

/// 101 ‖ serverKey ‖ serverInfo, as derper writes them.
fn classic_handshake() -> Vec<u8> {
    let mut s = switching_protocols(&key_s());
    s.extend_from_slice(&server_key_frame(&key_s()));
    s.extend_from_slice(&unhex(SERVER_INFO_FRAME));
    s
}

/// serverKey ‖ serverInfo: what a server writes to a fast-start client.
fn fast_handshake() -> Vec<u8> {
    let mut s = server_key_frame(&key_s()).to_vec();
    s.extend_from_slice(&unhex(SERVER_INFO_FRAME));
    s
}

fn connected() -> Event {
    Event::Connected {
        server_key: key_s(),
        info: ServerInfo::current(),
    }
}

/// Feeds `input`, returning the owned events and the result.
fn feed(c: &mut Client, now: Instant, input: &[u8]) -> (Vec<Event>, Result<(), ClientError>) {
    let mut events = Vec::new();
    let r = c.handle_bytes(now, input, |e| events.push(e.into_owned()));
    (events, r)
}

fn feed_ok(c: &mut Client, input: &[u8]) -> Vec<Event> {
    let (events, r) = feed(c, t0(), input);
    r.unwrap();
    events
}

fn transmit(c: &mut Client) -> Vec<u8> {
    let mut out = Vec::new();
    c.poll_transmit(&mut out);
    out
}

/// A classic client past the handshake, its output drained.
fn connected_client(config: Config) -> Client {
    let mut c = client(config);
    transmit(&mut c);
    assert_eq!(feed_ok(&mut c, &classic_handshake()), vec![connected()]);
    transmit(&mut c);
    c
}

fn feed_err(c: &mut Client, input: &[u8]) -> ClientError {
    let (_, r) = feed(c, t0(), input);
    let e = r.unwrap_err();
    assert_eq!(c.stage(), Stage::Failed);
    assert_eq!(c.failure(), Some(&e));
    e
}

// ---------------------------------------------------------------------------
// Handshake

#[test]
fn classic_handshake_with_vectors() {
    let mut c = client(config());
    assert_eq!(c.stage(), Stage::AwaitUpgrade);
    assert_eq!(transmit(&mut c), CLASSIC_REQUEST);
    assert_eq!(transmit(&mut c), b"", "drained once");

    let script = classic_handshake();
    let sk_end = script.len() - unhex(SERVER_INFO_FRAME).len();
    assert_eq!(feed_ok(&mut c, &script[..sk_end]), vec![]);
    assert_eq!(c.stage(), Stage::AwaitServerInfo);
    assert_eq!(c.server_key(), Some(key_s()));
    // `docs/derp-protocol.md` §17.3: exactly the clientInfo vector.
    assert_eq!(transmit(&mut c), unhex(CLIENT_INFO_FRAME));

    assert_eq!(feed_ok(&mut c, &script[sk_end..]), vec![connected()]);
    assert!(c.is_connected());
    assert_eq!(c.server_info(), Some(&ServerInfo::current()));
    assert_eq!(transmit(&mut c), b"");
    assert_eq!(c.buffered_len(), 0);
    assert_eq!(c.public_key(), key_c());
}

#[test]
fn upgraded_transport_starts_at_server_key() {
    // WebSocket did the upgrade: nothing to send until serverKey, then the
    // same clientInfo; a fast-start key is ignored.
    let mut c = Client::new_upgraded(fast_config(), t0(), NONCE).unwrap();
    assert_eq!(c.stage(), Stage::AwaitServerKey);
    assert_eq!(transmit(&mut c), b"");
    assert_eq!(feed_ok(&mut c, &server_key_frame(&key_s())), vec![]);
    assert_eq!(transmit(&mut c), unhex(CLIENT_INFO_FRAME));
    assert_eq!(
        feed_ok(&mut c, &unhex(SERVER_INFO_FRAME)),
        vec![connected()]
    );
    // An HTTP head is not a frame here.
    let mut c = Client::new_upgraded(config(), t0(), NONCE).unwrap();
    assert!(matches!(
        feed_err(&mut c, b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        ClientError::Frame { .. }
    ));
}

#[test]
fn classic_handshake_without_public_key_header() {
    let mut c = client(config());
    let mut script = b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec();
    script.extend_from_slice(&fast_handshake());
    assert_eq!(feed_ok(&mut c, &script), vec![connected()]);
}

#[test]
fn the_server_s_own_session_accepts_the_client_info() {
    let mut c = client(config());
    transmit(&mut c);
    feed_ok(
        &mut c,
        &classic_handshake()[..classic_handshake().len() - 58],
    );
    let hello = transmit(&mut c);
    let (who, info) = handshake::open_client_info(&server_private(), &hello[HEADER_LEN..]).unwrap();
    assert_eq!(who, key_c());
    assert_eq!(info, config().info);
}

#[test]
fn fast_start_handshake() {
    let mut c = client(Config {
        ideal_node: Some("900a".into()),
        host: "derp.example.com:8443".into(),
        ..fast_config()
    });
    assert_eq!(c.stage(), Stage::AwaitServerInfo);
    // `docs/derp-protocol.md` §17.5 request, clientInfo right behind it.
    let mut want = FAST_START_REQUEST.to_vec();
    want.extend_from_slice(&unhex(CLIENT_INFO_FRAME));
    assert_eq!(transmit(&mut c), want);
    assert_eq!(feed_ok(&mut c, &fast_handshake()), vec![connected()]);
    assert_eq!(transmit(&mut c), b"");

    // Go does not need serverKey in fast start; neither do we.
    let mut c = client(fast_config());
    let mut script = built(put_keepalive);
    script.extend_from_slice(&unhex(SERVER_INFO_FRAME));
    assert_eq!(feed_ok(&mut c, &script), vec![connected()]);
}

/// Every split of the handshake and the frames after it, into two reads
/// and byte by byte, gives the same events and the same bytes to send.
#[test]
fn split_reads_at_every_boundary() {
    let mut tail = built(|o| put_recv_packet(o, &key_p(), b"hello"));
    put_ping(&mut tail, b"pingpong");
    put_health(&mut tail, "BAD");
    for (config, handshake) in [
        (config(), classic_handshake()),
        (fast_config(), fast_handshake()),
    ] {
        let mut script = handshake;
        script.extend_from_slice(&tail);

        let run = |chunks: &mut dyn Iterator<Item = &[u8]>| {
            let mut c = client(config.clone());
            let mut out = transmit(&mut c);
            let mut events = Vec::new();
            for chunk in chunks {
                events.extend(feed_ok(&mut c, chunk));
                c.poll_transmit(&mut out);
            }
            assert_eq!(c.buffered_len(), 0);
            (events, out)
        };
        let want = run(&mut std::iter::once(&script[..]));
        assert_eq!(want.0.len(), 4, "{:?}", want.0);
        for i in 0..=script.len() {
            let (a, b) = script.split_at(i);
            assert_eq!(run(&mut [a, b].into_iter()), want, "split at {i}");
        }
        assert_eq!(run(&mut script.chunks(1)), want, "byte by byte");
        assert_eq!(run(&mut script.chunks(7)), want, "7 at a time");
    }
}

// ---------------------------------------------------------------------------
// Steady state

#[test]
fn every_event_kind() {
    let mut c = connected_client(config());
    let v4: SocketAddr = "198.51.100.23:41641".parse().unwrap();
    let v6: SocketAddr = "[2001:db8::2]:443".parse().unwrap();
    let mut s = Vec::new();
    put_recv_packet(&mut s, &key_c(), b"hello");
    put_recv_packet(&mut s, &key_c(), b"");
    put_keepalive(&mut s);
    put_peer_gone(&mut s, &key_c(), PeerGoneReason::Disconnected);
    put_peer_gone(&mut s, &key_p(), PeerGoneReason::NotHere);
    put_frame(&mut s, FrameType::PeerGone as u8, key_p().as_bytes()); // old server: no reason
    put_peer_present(&mut s, &key_c(), Some(v4), PEER_PRESENT_IS_REGULAR, "ferry");
    put_peer_present(&mut s, &key_p(), Some(v6), PEER_PRESENT_IS_MESH_PEER, "");
    put_frame(&mut s, FrameType::PeerPresent as u8, key_c().as_bytes()); // key only
    put_ping(&mut s, b"\x01\x02\x03\x04\x05\x06\x07\x08");
    put_pong(&mut s, b"pongpong");
    put_health(&mut s, "BAD");
    put_health(&mut s, "");
    put_restarting(&mut s, 2500, 10_000);
    // Ignored as Go ignores them: unknown type, short recvPacket, repeated
    // handshake frames, short restarting.
    put_frame(&mut s, 0x20, &[9; 100]);
    put_frame(&mut s, FrameType::RecvPacket as u8, &[1; 31]);
    s.extend_from_slice(&server_key_frame(&key_s()));
    s.extend_from_slice(&unhex(SERVER_INFO_FRAME));
    put_frame(&mut s, FrameType::Restarting as u8, &[0; 7]);

    assert_eq!(
        feed_ok(&mut c, &s),
        vec![
            Event::Packet {
                src: key_c(),
                packet: b"hello".to_vec()
            },
            Event::Packet {
                src: key_c(),
                packet: vec![]
            },
            Event::KeepAlive,
            Event::PeerGone {
                key: key_c(),
                reason: PeerGoneReason::Disconnected
            },
            Event::PeerGone {
                key: key_p(),
                reason: PeerGoneReason::NotHere
            },
            Event::PeerGone {
                key: key_p(),
                reason: PeerGoneReason::Disconnected
            },
            Event::PeerPresent {
                key: key_c(),
                addr: Some(v4),
                flags: PEER_PRESENT_IS_REGULAR,
                app_name: crate::app_name::AppName::new(b"ferry"),
            },
            Event::PeerPresent {
                key: key_p(),
                addr: Some(v6),
                flags: PEER_PRESENT_IS_MESH_PEER,
                app_name: None,
            },
            Event::PeerPresent {
                key: key_c(),
                addr: None,
                flags: 0,
                app_name: None,
            },
            Event::Ping(*b"\x01\x02\x03\x04\x05\x06\x07\x08"),
            Event::Pong(*b"pongpong"),
            Event::Health(b"BAD".to_vec()),
            Event::Health(vec![]),
            Event::Restarting {
                reconnect_in: Duration::from_millis(2500),
                try_for: Duration::from_secs(10)
            },
        ]
    );
    assert_eq!(c.ignored_frames(), 5);
    // The ping was answered on its own, with `docs/derp-protocol.md` §17.2's
    // bytes.
    assert_eq!(transmit(&mut c), unhex("1300000008 | 0102030405060708"));

    let mut events = Vec::new();
    c.handle_eof(|e| events.push(e.into_owned())).unwrap();
    assert_eq!(events, vec![Event::ServerClosed]);
    assert_eq!(c.stage(), Stage::Closed);
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(feed(&mut c, t0(), b"x").1, Err(ClientError::Closed));
    assert_eq!(c.ping(&mut Vec::new(), [0; 8]), Err(ClientError::Closed));
}

#[test]
fn received_packets_borrow_the_input() {
    let mut c = connected_client(config());
    let input = built(|o| put_recv_packet(o, &key_p(), &[7; 1200]));
    let range = input.as_ptr_range();
    let mut seen = 0;
    c.handle_bytes(t0(), &input, |e| {
        let Event::Packet { src, packet } = e else {
            panic!("{e:?}")
        };
        assert_eq!(src, key_p());
        assert!(range.contains(&packet.as_ptr()), "packet was copied");
        seen += 1;
    })
    .unwrap();
    assert_eq!(seen, 1);
}

#[test]
fn without_can_ack_pings_the_owner_answers() {
    let mut cfg = config();
    cfg.info.can_ack_pings = false;
    let mut c = connected_client(cfg);
    let ping = built(|o| put_ping(o, b"87654321"));
    assert_eq!(feed_ok(&mut c, &ping), vec![Event::Ping(*b"87654321")]);
    assert_eq!(transmit(&mut c), b"", "no automatic pong");
    let mut out = Vec::new();
    c.pong(&mut out, *b"87654321").unwrap();
    assert_eq!(out, built(|o| put_pong(o, b"87654321")));
}

#[test]
fn relay_session_frames_reach_only_a_client_that_asked() {
    use crate::relay_session::{
        put_allocate, put_refused, put_session, Allocate, RefuseReason, Refused, SessionOffer,
    };
    let offer = SessionOffer {
        request_id: 3,
        vni: 0x42,
        peer: NodePublic::from_bytes([9; 32]),
        slot: 0,
        token: [1; 32],
        endpoints: vec!["192.0.2.1:3479".parse().unwrap()],
        bind_lifetime: Duration::from_secs(30),
        idle_lifetime: Duration::from_secs(60),
    };
    let refused = Refused {
        request_id: 4,
        peer: NodePublic::from_bytes([9; 32]),
        reason: RefuseReason::Limit,
    };
    let mut frames = built(|o| put_session(o, &offer));
    frames.extend(built(|o| put_refused(o, &refused)));
    // A malformed offer (no endpoint) is ignored, not fatal.
    frames.extend(built(|o| {
        frame::put_frame(o, frame::RELAY_SESSION, &[0; 81]);
    }));
    frames.extend(built(|o| put_ping(o, b"12345678")));

    let mut plain = connected_client(config());
    assert_eq!(
        feed_ok(&mut plain, &frames),
        vec![Event::Ping(*b"12345678")]
    );
    let mut cfg = config();
    cfg.info.ferry_derp = 1;
    let mut asked = connected_client(cfg);
    assert_eq!(
        feed_ok(&mut asked, &frames),
        vec![
            Event::RelaySession(offer),
            Event::RelayRefused(refused),
            Event::Ping(*b"12345678")
        ]
    );
    let mut out = Vec::new();
    let a = Allocate {
        peer: NodePublic::from_bytes([9; 32]),
        request_id: 5,
    };
    asked.relay_allocate(&mut out, &a).unwrap();
    assert!(out.ends_with(&built(|o| put_allocate(o, &a))));
}

#[test]
fn version_2_frames_reach_only_a_client_that_asked_for_version_2() {
    use crate::relay_session::v2::{
        put_end, put_session2, EndReason, SessionEnd, SessionOffer2, RELAY_SESSION2,
    };
    use crate::relay_session::SessionOffer;
    let offer = SessionOffer2 {
        offer: SessionOffer {
            request_id: 3,
            vni: 0x42,
            peer: NodePublic::from_bytes([9; 32]),
            slot: 1,
            token: [1; 32],
            endpoints: vec!["192.0.2.1:3479".parse().unwrap()],
            bind_lifetime: Duration::from_secs(30),
            idle_lifetime: Duration::from_secs(60),
        },
        host: NodePublic::from_bytes([7; 32]),
        flags: 1,
    };
    let end = SessionEnd {
        vni: 0x42,
        peer: NodePublic::from_bytes([9; 32]),
        host: NodePublic::from_bytes([7; 32]),
        reason: EndReason::Draining,
        grace: Duration::from_secs(10),
    };
    let mut frames = built(|o| put_session2(o, &offer));
    frames.extend(built(|o| put_end(o, &end)));
    // A malformed one (no endpoint) is ignored, not fatal.
    frames.extend(built(|o| frame::put_frame(o, RELAY_SESSION2, &[0; 114])));
    frames.extend(built(|o| put_ping(o, b"12345678")));
    for asked in [0, 1] {
        let mut cfg = config();
        cfg.info.ferry_derp = asked;
        let mut c = connected_client(cfg);
        assert_eq!(
            feed_ok(&mut c, &frames),
            vec![Event::Ping(*b"12345678")],
            "ferryRelay {asked}"
        );
        assert_eq!(c.ignored_frames(), 3, "ferryRelay {asked}");
    }
    let mut cfg = config();
    cfg.info.ferry_derp = 2;
    let mut v2 = connected_client(cfg);
    assert_eq!(
        feed_ok(&mut v2, &frames),
        vec![
            Event::RelaySession2(offer),
            Event::RelaySessionEnd(end),
            Event::Ping(*b"12345678")
        ]
    );
    assert_eq!(v2.ignored_frames(), 1);
}

// ---------------------------------------------------------------------------
// Commands

#[test]
fn commands_write_the_vector_bytes() {
    let mut cfg = config();
    cfg.info.mesh_key = Some(MeshKey([0xab; 32]));
    let mut c = connected_client(cfg);
    let p_hex = "64b101b1d0be5a8704bd078f9895001fc03e8e9f9522f188dd128d9846d48466";
    let c_hex = "5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b";
    let mut out = Vec::new();
    c.send_packet(&mut out, &key_p(), b"hello").unwrap();
    assert_eq!(out, unhex(&format!("0400000025 | {p_hex} 68656c6c6f")));
    out.clear();
    c.forward_packet(&mut out, &key_c(), &key_p(), b"hello")
        .unwrap();
    assert_eq!(
        out,
        unhex(&format!("0a00000045 | {c_hex} {p_hex} 68656c6c6f"))
    );
    out.clear();
    c.close_peer(&mut out, &key_p()).unwrap();
    assert_eq!(out, unhex(&format!("1100000020 | {p_hex}")));
    out.clear();
    c.watch_conns(&mut out).unwrap();
    c.note_preferred(&mut out, true).unwrap();
    c.note_preferred(&mut out, false).unwrap();
    c.ping(&mut out, [1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    c.pong(&mut out, [1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(
        out,
        unhex(
            "1000000000 | 0700000001 01 | 0700000001 00 |
             1200000008 0102030405060708 | 1300000008 0102030405060708"
        )
    );
    // The largest packet goes; one byte more does not, and writes nothing.
    out.clear();
    c.send_packet(&mut out, &key_p(), &vec![0; MAX_PACKET_SIZE])
        .unwrap();
    assert_eq!(out.len(), HEADER_LEN + 32 + MAX_PACKET_SIZE);
    out.clear();
    assert_eq!(
        c.send_packet(&mut out, &key_p(), &vec![0; MAX_PACKET_SIZE + 1]),
        Err(ClientError::PacketTooLarge {
            frame: "sendPacket",
            len: MAX_PACKET_SIZE + 1,
            max: MAX_PACKET_SIZE
        })
    );
    assert!(out.is_empty());
    assert!(
        c.is_connected(),
        "a refused command does not end the connection"
    );
}

#[test]
fn commands_wait_for_client_info_and_keep_stream_order() {
    let mut c = client(config());
    let mut out = Vec::new();
    assert_eq!(
        c.note_preferred(&mut out, true),
        Err(ClientError::NotReady {
            frame: "notePreferred",
            stage: Stage::AwaitUpgrade
        })
    );
    let script = classic_handshake();
    feed_ok(&mut c, &script[..script.len() - 58]);
    // As Go does: notePreferred right after clientInfo, before serverInfo.
    // The request and clientInfo the client queued go first.
    c.note_preferred(&mut out, true).unwrap();
    let mut want = CLASSIC_REQUEST.to_vec();
    want.extend_from_slice(&unhex(CLIENT_INFO_FRAME));
    want.extend_from_slice(&unhex("0700000001 01"));
    assert_eq!(out, want);
    assert_eq!(c.pending_len(), 0);
}

#[test]
fn mesh_commands_need_a_mesh_key() {
    let mut c = connected_client(config());
    let mut out = Vec::new();
    assert_eq!(
        c.watch_conns(&mut out),
        Err(ClientError::NotMesh {
            frame: "watchConns"
        })
    );
    assert_eq!(
        c.close_peer(&mut out, &key_p()),
        Err(ClientError::NotMesh { frame: "closePeer" })
    );
    assert_eq!(
        c.forward_packet(&mut out, &key_c(), &key_p(), b"x"),
        Err(ClientError::NotMesh {
            frame: "forwardPacket"
        })
    );
    assert!(out.is_empty());
}

#[test]
fn box_key_is_reused_for_the_same_server_only() {
    let mut first = connected_client(config());
    let cached = first.box_key().cloned().unwrap();
    assert_eq!((cached.client(), cached.server()), (key_c(), key_s()));
    let hello = |cfg: Config| {
        let mut c = client(cfg);
        transmit(&mut c);
        let script = classic_handshake();
        feed_ok(&mut c, &script[..script.len() - 58]);
        transmit(&mut c)
    };
    let with_cache = hello(Config {
        box_key: Some(cached),
        ..config()
    });
    assert_eq!(with_cache, unhex(CLIENT_INFO_FRAME));
    // A key for another server is ignored, not used.
    let other = BoxKey::new(&client_private(), key_p());
    assert_eq!(
        hello(Config {
            box_key: Some(other),
            ..config()
        }),
        unhex(CLIENT_INFO_FRAME)
    );
    // Nor one made for another client key.
    let stranger = BoxKey::new(&server_private(), key_s());
    assert_eq!(
        hello(Config {
            box_key: Some(stranger),
            ..config()
        }),
        unhex(CLIENT_INFO_FRAME)
    );
    first.handle_eof(|_| {}).unwrap();
}

#[test]
fn header_values_with_line_breaks_are_refused() {
    let e = Client::new(
        Config {
            user_agent: "x\r\nEvil: 1".into(),
            ..config()
        },
        t0(),
        NONCE,
    )
    .unwrap_err();
    assert_eq!(
        e,
        ClientError::HeaderInjection {
            header: "User-Agent"
        }
    );
}

// ---------------------------------------------------------------------------
// Errors

fn classic_after_101() -> Client {
    let mut c = client(config());
    feed_ok(&mut c, &switching_protocols(&key_s()));
    assert_eq!(c.stage(), Stage::AwaitServerKey);
    c
}

fn awaiting_server_info() -> Client {
    let mut c = classic_after_101();
    feed_ok(&mut c, &server_key_frame(&key_s()));
    c
}

#[test]
fn bad_upgrade_responses() {
    let mut c = client(config());
    assert_eq!(
        feed_err(
            &mut c,
            b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 5\r\n\r\nnope!"
        ),
        ClientError::UpgradeRefused {
            status: 426,
            reason: "Upgrade Required".into()
        }
    );
    let mut c = client(config());
    assert!(matches!(
        feed_err(&mut c, b"SSH-2.0-OpenSSH\r\n\r\n"),
        ClientError::MalformedResponse { .. }
    ));
    let mut c = client(config());
    let mut head = b"HTTP/1.1 101 Switching Protocols\r\nX: ".to_vec();
    head.resize(MAX_RESPONSE_HEAD, b'a');
    assert_eq!(
        feed_err(&mut c, &head),
        ClientError::ResponseTooLarge {
            max: MAX_RESPONSE_HEAD
        }
    );
    // The Derp-Public-Key header must agree with serverKey.
    let mut c = client(config());
    let mut script = switching_protocols(&key_p());
    script.extend_from_slice(&server_key_frame(&key_s()));
    assert_eq!(
        feed_err(&mut c, &script),
        ClientError::ServerKeyMismatch {
            expected: key_p(),
            got: key_s()
        }
    );
}

#[test]
fn bad_server_key_frames() {
    let mut sk = server_key_frame(&key_s());
    sk[HEADER_LEN] ^= 1;
    assert_eq!(
        feed_err(&mut classic_after_101(), &sk),
        ClientError::Handshake(HandshakeError::BadMagic)
    );
    let short = built(|o| put_frame(o, FrameType::ServerKey as u8, &frame::MAGIC));
    assert_eq!(
        feed_err(&mut classic_after_101(), &short),
        ClientError::Handshake(HandshakeError::TooShort {
            frame: "serverKey",
            len: 8,
            min: 40
        })
    );
    // Over 1 KiB: refused on the header, before the payload is read.
    let header = frame::encode_header(FrameType::ServerKey as u8, 1025);
    assert_eq!(
        feed_err(&mut classic_after_101(), &header),
        ClientError::Frame {
            stage: Stage::AwaitServerKey,
            source: FrameError::TooLong {
                frame: 0x01,
                len: 1025,
                max: 1024
            }
        }
    );
    // Any other first frame.
    let e = feed_err(
        &mut classic_after_101(),
        &frame::encode_header(FrameType::RecvPacket as u8, 37),
    );
    assert_eq!(
        e,
        ClientError::Frame {
            stage: Stage::AwaitServerKey,
            source: FrameError::Unexpected {
                frame: 0x05,
                expected: 0x01
            }
        }
    );
    assert_eq!(
        e.to_string(),
        "expected serverKey frame (0x01) but got recvPacket frame (0x05) \
         while waiting for the serverKey frame"
    );
}

#[test]
fn bad_server_info_frames() {
    let mut si = unhex(SERVER_INFO_FRAME);
    *si.last_mut().unwrap() ^= 1;
    assert_eq!(
        feed_err(&mut awaiting_server_info(), &si),
        ClientError::Handshake(HandshakeError::BoxOpen {
            frame: "serverInfo",
            source: BoxError::AuthFailed
        })
    );
    // Sealed for someone else.
    let other = seal_server_info(
        &server_private(),
        &key_p(),
        &ServerInfo::current(),
        &[1; 24],
    );
    assert!(matches!(
        feed_err(&mut awaiting_server_info(), &other),
        ClientError::Handshake(HandshakeError::BoxOpen { .. })
    ));
    // A packet before serverInfo.
    let pkt = built(|o| put_recv_packet(o, &key_p(), b"early"));
    assert_eq!(
        feed_err(&mut awaiting_server_info(), &pkt),
        ClientError::Frame {
            stage: Stage::AwaitServerInfo,
            source: FrameError::Unexpected {
                frame: 0x05,
                expected: 0x03
            }
        }
    );
    // Classic mode has had its serverKey; a second one is out of place.
    assert!(matches!(
        feed_err(&mut awaiting_server_info(), &server_key_frame(&key_s())),
        ClientError::Frame {
            source: FrameError::Unexpected { frame: 0x01, .. },
            ..
        }
    ));
}

#[test]
fn fast_start_errors() {
    // A server without fast-start support answers with a 101
    // (`docs/derp-protocol.md` §4.4).
    let mut c = client(fast_config());
    assert_eq!(
        feed_err(&mut c, &switching_protocols(&key_s())),
        ClientError::FastStartRefused
    );
    // serverKey must match the key from the meta-certificate.
    let mut c = client(fast_config());
    assert_eq!(
        feed_err(&mut c, &server_key_frame(&key_p())),
        ClientError::ServerKeyMismatch {
            expected: key_s(),
            got: key_p()
        }
    );
}

#[test]
fn frames_over_one_mebibyte_are_refused_on_the_header() {
    let mut c = connected_client(config());
    // Exactly 1 MiB is read; more is a connection error.
    let header = frame::encode_header(0x20, (1 << 20) as u32);
    feed_ok(&mut c, &header);
    let mut c = connected_client(config());
    let header = frame::encode_header(FrameType::RecvPacket as u8, (1 << 20) + 1);
    let e = feed_err(&mut c, &header);
    assert_eq!(
        e,
        ClientError::Frame {
            stage: Stage::Connected,
            source: FrameError::TooLong {
                frame: 0x05,
                len: (1 << 20) + 1,
                max: 1 << 20
            }
        }
    );
    // Poisoned: inputs and commands report the same error.
    assert_eq!(feed(&mut c, t0(), b"more").1, Err(e.clone()));
    assert_eq!(c.handle_eof(|_| {}), Err(e.clone()));
    assert_eq!(c.handle_timeout(at(1000)), Err(e.clone()));
    assert_eq!(
        c.send_packet(&mut Vec::new(), &key_p(), b"x"),
        Err(e.clone())
    );
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.buffered_len(), 0);
}

/// Found by fuzzing: a pong queued in the same read as a fatal frame must
/// still be handed out, or what the client sends would depend on how the
/// stream was split into reads.
#[test]
fn bytes_queued_before_an_error_are_still_transmitted() {
    let mut c = connected_client(config());
    let mut s = built(|o| put_ping(o, b"12345678"));
    s.extend_from_slice(&frame::encode_header(0x85, u32::MAX));
    assert!(matches!(feed_err(&mut c, &s), ClientError::Frame { .. }));
    assert_eq!(transmit(&mut c), built(|o| put_pong(o, b"12345678")));
}

#[test]
fn eof_during_handshake_and_inside_a_frame() {
    let mut c = client(config());
    assert_eq!(
        c.handle_eof(|_| {}),
        Err(ClientError::ClosedDuringHandshake {
            stage: Stage::AwaitUpgrade
        })
    );
    let mut c = awaiting_server_info();
    assert_eq!(
        c.handle_eof(|_| {}),
        Err(ClientError::ClosedDuringHandshake {
            stage: Stage::AwaitServerInfo
        })
    );
    let mut c = connected_client(config());
    let pkt = built(|o| put_recv_packet(o, &key_p(), b"cut short"));
    feed_ok(&mut c, &pkt[..20]);
    assert_eq!(
        c.handle_eof(|_| panic!("no event")),
        Err(ClientError::Truncated { held: 20 })
    );
    assert_eq!(c.stage(), Stage::Failed);
}

// ---------------------------------------------------------------------------
// Time

#[test]
fn handshake_deadline() {
    let mut c = client(config());
    assert_eq!(c.poll_timeout(), Some(at(10)));
    c.handle_timeout(at(9)).unwrap();
    // Bytes do not extend the handshake limit.
    feed(&mut c, at(9), &switching_protocols(&key_s()))
        .1
        .unwrap();
    assert_eq!(c.poll_timeout(), Some(at(10)));
    assert_eq!(
        c.handle_timeout(at(10)),
        Err(ClientError::HandshakeTimeout {
            stage: Stage::AwaitServerKey,
            limit: Duration::from_secs(10)
        })
    );
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn keepalive_deadline() {
    let mut c = client(Config {
        keepalive_timeout: Duration::from_secs(30),
        ..config()
    });
    feed(&mut c, at(1), &classic_handshake()).1.unwrap();
    assert_eq!(c.poll_timeout(), Some(at(31)));
    c.handle_timeout(at(30)).unwrap();
    // Any byte from the server moves the deadline.
    let (events, r) = feed(&mut c, at(20), &built(put_keepalive));
    r.unwrap();
    assert_eq!(events, vec![Event::KeepAlive]);
    assert_eq!(c.poll_timeout(), Some(at(50)));
    // A time earlier than one already seen does not move it back.
    feed(&mut c, at(5), &built(put_keepalive)).1.unwrap();
    assert_eq!(c.poll_timeout(), Some(at(50)));
    c.handle_timeout(at(49)).unwrap();
    let e = c.handle_timeout(at(50)).unwrap_err();
    assert_eq!(
        e,
        ClientError::KeepaliveTimeout {
            limit: Duration::from_secs(30)
        }
    );
    assert!(e.to_string().contains("30s"), "{e}");
    assert_eq!(c.stage(), Stage::Failed);
}

#[test]
fn during_the_handshake_the_earlier_deadline_counts() {
    let c = client(Config {
        keepalive_timeout: Duration::from_secs(3),
        ..config()
    });
    assert_eq!(c.poll_timeout(), Some(at(3)));
}
