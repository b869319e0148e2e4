//! Property tests of the public framing API: header and builder/parser round
//! trips, and the deframer's independence from how a stream is chunked or
//! paused.

use ferry_proto::app_name::AppName;
use ferry_proto::frame::*;
use ferry_proto::handshake::{ClientInfo, ServerInfo};
use ferry_proto::key::{MeshKey, NodePublic};
use proptest::prelude::*;
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;

fn key() -> impl Strategy<Value = NodePublic> {
    any::<[u8; 32]>().prop_map(NodePublic::from_bytes)
}

fn packet() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..200),
        1 => proptest::collection::vec(any::<u8>(), 0..=MAX_PACKET_SIZE),
    ]
}

fn addr() -> impl Strategy<Value = Option<SocketAddr>> {
    proptest::option::of(
        (any::<IpAddr>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::new(ip, port)),
    )
}

/// A frame a client may send, as the test's model.
#[derive(Debug, Clone)]
enum Model {
    Send(NodePublic, Vec<u8>),
    Forward(NodePublic, NodePublic, Vec<u8>),
    NotePreferred(bool),
    Ping([u8; 8]),
    WatchConns,
    ClosePeer(NodePublic),
    /// A frame the server skips: pong, keepAlive, clientInfo, unknown types.
    Skipped(u8, Vec<u8>),
}

fn skipped_type() -> impl Strategy<Value = u8> {
    prop_oneof![
        Just(0x01u8),
        Just(0x02),
        Just(0x06),
        Just(0x13),
        Just(0x14),
        0x0bu8..=0x0f,
        0x16u8..=0xff,
    ]
}

fn model() -> impl Strategy<Value = Model> {
    prop_oneof![
        4 => (key(), packet()).prop_map(|(k, p)| Model::Send(k, p)),
        2 => (key(), key(), packet()).prop_map(|(s, d, p)| Model::Forward(s, d, p)),
        1 => any::<bool>().prop_map(Model::NotePreferred),
        1 => any::<[u8; 8]>().prop_map(Model::Ping),
        1 => Just(Model::WatchConns),
        1 => key().prop_map(Model::ClosePeer),
        2 => (skipped_type(), proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(t, p)| Model::Skipped(t, p)),
    ]
}

impl Model {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Model::Send(k, p) => put_send_packet(out, k, p),
            Model::Forward(s, d, p) => put_forward_packet(out, s, d, p),
            Model::NotePreferred(b) => put_note_preferred(out, *b),
            Model::Ping(d) => put_ping(out, d),
            Model::WatchConns => put_watch_conns(out),
            Model::ClosePeer(k) => put_close_peer(out, k),
            Model::Skipped(t, p) => put_frame(out, *t, p),
        }
    }

    /// The (type, payload) the deframer should deliver, if any.
    fn delivered(&self) -> Option<(u8, Vec<u8>)> {
        if let Model::Skipped(..) = self {
            return None;
        }
        let mut f = Vec::new();
        self.encode(&mut f);
        Some((f[0], f[HEADER_LEN..].to_vec()))
    }
}

const MESH: ServerFramePolicy = ServerFramePolicy {
    mesh: true,
    relay_sessions: false,
    ferry_mesh: false,
};

fn stream_of(frames: &[Model]) -> Vec<u8> {
    let mut s = Vec::new();
    for f in frames {
        f.encode(&mut s);
    }
    s
}

fn expected(frames: &[Model]) -> Vec<(u8, Vec<u8>)> {
    frames.iter().filter_map(Model::delivered).collect()
}

/// Cuts `len` bytes into chunks at the given (unsorted, possibly repeated)
/// fractions.
fn cut_points(len: usize, cuts: &[u32]) -> Vec<usize> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| (*c as usize) % (len + 1))
        .chain([0, len])
        .collect();
    points.sort_unstable();
    points.dedup();
    points
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn header_round_trip(ty: u8, len: u32, tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut buf = encode_header(ty, len).to_vec();
        buf.extend_from_slice(&tail);
        prop_assert_eq!(decode_header(&buf), Some((ty, len)));
        prop_assert_eq!(decode_header(&buf[..4]), None);
    }

    #[test]
    fn client_builders_round_trip(m in model()) {
        let mut f = Vec::new();
        m.encode(&mut f);
        let (ty, len) = decode_header(&f).unwrap();
        prop_assert_eq!(len as usize, f.len() - HEADER_LEN);
        let payload = &f[HEADER_LEN..];
        if let Model::Skipped(..) = m {
            // The server never parses these (a short pong included).
            prop_assert_eq!(MESH.check(ty, len), Disposition::Skip);
            return Ok(());
        }
        prop_assert_eq!(MESH.check(ty, len), Disposition::Buffer);
        let parsed = parse_client_frame(ty, payload).unwrap();
        match (&m, parsed) {
            (Model::Send(k, p), ClientFrame::SendPacket { dst, packet }) => {
                prop_assert_eq!(*k, dst);
                prop_assert_eq!(&p[..], packet);
            }
            (Model::Forward(s, d, p), ClientFrame::ForwardPacket { src, dst, packet }) => {
                prop_assert_eq!((*s, *d), (src, dst));
                prop_assert_eq!(&p[..], packet);
            }
            (Model::NotePreferred(b), ClientFrame::NotePreferred(got)) => prop_assert_eq!(*b, got),
            (Model::Ping(d), ClientFrame::Ping(got)) => prop_assert_eq!(*d, got),
            (Model::WatchConns, ClientFrame::WatchConns) => {}
            (Model::ClosePeer(k), ClientFrame::ClosePeer(got)) => prop_assert_eq!(*k, got),
            (m, parsed) => prop_assert!(false, "{:?} parsed as {:?}", m, parsed),
        }
    }

    #[test]
    fn server_builders_round_trip(
        src in key(),
        pkt in packet(),
        reason: u8,
        a in addr(),
        flags: u8,
        ping: [u8; 8],
        health in ".{0,40}",
        app_name in "[ -~]{0,32}",
        reconnect: u32,
        try_for: u32,
    ) {
        fn parse(f: &[u8]) -> ServerFrame<'_> {
            let (ty, len) = decode_header(f).unwrap();
            assert_eq!(len as usize, f.len() - HEADER_LEN);
            parse_server_frame(ty, &f[HEADER_LEN..]).unwrap()
        }
        let mut f = Vec::new();
        put_recv_packet(&mut f, &src, &pkt);
        prop_assert_eq!(&f[..37], &recv_packet_header(&src, pkt.len())[..]);
        prop_assert_eq!(parse(&f), ServerFrame::RecvPacket { src, packet: &pkt });

        let mut f = Vec::new();
        put_peer_gone(&mut f, &src, PeerGoneReason::from_u8(reason));
        prop_assert_eq!(parse(&f), ServerFrame::PeerGone { key: src, reason: PeerGoneReason::from_u8(reason) });

        let mut f = Vec::new();
        put_peer_present(&mut f, &src, a, flags, &app_name);
        prop_assert_eq!(f.len(), HEADER_LEN + PEER_PRESENT_LEN + app_name.len());
        let want_addr = a.map(canonical_addr).filter(|a| !(a.ip().is_unspecified() && a.ip().is_ipv6() && a.port() == 0));
        let app_name = AppName::new(app_name.as_bytes());
        prop_assert_eq!(parse(&f), ServerFrame::PeerPresent { key: src, addr: want_addr, flags, app_name });

        let mut f = Vec::new();
        put_ping(&mut f, &ping);
        put_pong(&mut f, &ping);
        put_keepalive(&mut f);
        put_health(&mut f, &health);
        put_restarting(&mut f, reconnect, try_for);
        let mut seen = Vec::new();
        let mut d = Deframer::new();
        d.feed(&f, &ClientFramePolicy, |ty, p| {
            seen.push(format!("{:?}", parse_server_frame(ty, p).unwrap()));
            ControlFlow::Continue(())
        }).unwrap();
        prop_assert_eq!(seen, vec![
            format!("{:?}", ServerFrame::Ping(ping)),
            format!("{:?}", ServerFrame::Pong(ping)),
            format!("{:?}", ServerFrame::KeepAlive),
            format!("{:?}", ServerFrame::Health(health.as_bytes())),
            format!("{:?}", ServerFrame::Restarting { reconnect_in_ms: reconnect, try_for_ms: try_for }),
        ]);
    }

    #[test]
    fn deframer_ignores_chunking(
        frames in proptest::collection::vec(model(), 0..24),
        cuts in proptest::collection::vec(any::<u32>(), 0..40),
    ) {
        let stream = stream_of(&frames);
        let points = cut_points(stream.len(), &cuts);
        let mut d = Deframer::new();
        let mut got = Vec::new();
        for w in points.windows(2) {
            let fed = d.feed(&stream[w[0]..w[1]], &MESH, |ty, p| {
                got.push((ty, p.to_vec()));
                ControlFlow::Continue(())
            }).unwrap();
            prop_assert_eq!(fed, Fed::Drained);
            prop_assert!(d.buffered_len() <= HEADER_LEN + 2 * KEY_LEN + MAX_PACKET_SIZE);
        }
        prop_assert!(d.is_empty());
        prop_assert_eq!(got, expected(&frames));
        let skipped = frames.iter().filter(|f| matches!(f, Model::Skipped(..))).count();
        prop_assert_eq!(d.skipped_frames(), skipped as u64);
    }

    #[test]
    fn deframer_break_resume_equivalence(
        frames in proptest::collection::vec(model(), 0..24),
        cuts in proptest::collection::vec(any::<u32>(), 0..12),
        breaks in proptest::collection::vec(any::<bool>(), 0..64),
        resume_first in proptest::collection::vec(any::<bool>(), 0..64),
    ) {
        let stream = stream_of(&frames);
        let points = cut_points(stream.len(), &cuts);
        let mut d = Deframer::new();
        let mut got = Vec::new();
        let mut n = 0usize;
        let mut on_frame = |ty: u8, p: &[u8]| {
            got.push((ty, p.to_vec()));
            n += 1;
            if breaks.get(n).copied().unwrap_or(false) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        for (step, w) in points.windows(2).enumerate() {
            // Sometimes drain pauses before feeding more, sometimes not.
            if resume_first.get(step).copied().unwrap_or(true) {
                while d.resume(&MESH, &mut on_frame).unwrap() == Fed::Paused {}
            }
            d.feed(&stream[w[0]..w[1]], &MESH, &mut on_frame).unwrap();
        }
        while d.resume(&MESH, &mut on_frame).unwrap() == Fed::Paused {}
        prop_assert!(d.is_empty());
        prop_assert_eq!(got, expected(&frames));
    }

    #[test]
    fn long_skipped_frames_never_buffer(
        ty in skipped_type(),
        len in 1024u32..=MAX_SKIPPED_FRAME as u32,
        chunks in proptest::collection::vec(1usize..5000, 1..30),
        mesh: bool,
    ) {
        let policy = ServerFramePolicy { mesh, relay_sessions: false, ferry_mesh: false };
        let header = encode_header(ty, len);
        let junk = vec![0x5au8; 5000];
        let mut d = Deframer::new();
        // Deliver the header split in two, then junk.
        d.feed(&header[..2], &policy, |_, _| ControlFlow::Continue(())).unwrap();
        d.feed(&header[2..], &policy, |_, _| ControlFlow::Continue(())).unwrap();
        prop_assert_eq!(d.skipped_frames(), 1);
        let mut left = len as usize;
        for c in chunks {
            if c >= left {
                break;
            }
            d.feed(&junk[..c], &policy, |_, _| {
                panic!("nothing may be delivered while skipping")
            }).unwrap();
            left -= c;
            prop_assert_eq!(d.buffered_len(), 0);
            prop_assert!(d.capacity() <= 8);
            prop_assert_eq!(d.skip_remaining(), left);
        }
    }

    #[test]
    fn over_long_skipped_frames_are_fatal(
        ty in skipped_type(),
        len in (MAX_SKIPPED_FRAME as u32 + 1)..=u32::MAX,
        split in 1usize..5,
        mesh: bool,
    ) {
        let policy = ServerFramePolicy { mesh, relay_sessions: false, ferry_mesh: false };
        let header = encode_header(ty, len);
        let mut d = Deframer::new();
        d.feed(&header[..split], &policy, |_, _| ControlFlow::Continue(())).unwrap();
        let err = d
            .feed(&header[split..], &policy, |_, _| ControlFlow::Continue(()))
            .unwrap_err();
        prop_assert_eq!(
            err,
            FrameError::TooLong { frame: ty, len: len as usize, max: MAX_SKIPPED_FRAME }
        );
    }

    #[test]
    fn client_info_json_round_trip(
        mesh in proptest::option::of(any::<[u8; 32]>().prop_filter("non-zero", |k| *k != [0; 32])),
        version: u32,
        can_ack_pings: bool,
        is_prober: bool,
        app_name in proptest::option::of("\\PC{1,20}"),
        ferry_derp: u32,
        ferry_mesh: u32,
    ) {
        let info = ClientInfo { mesh_key: mesh.map(MeshKey), version, can_ack_pings, is_prober, app_name, ferry_derp, ferry_mesh };
        prop_assert_eq!(ClientInfo::from_json(&info.to_json()).unwrap(), info);
    }

    #[test]
    fn server_info_json_round_trip(version: u32, rate: u64, burst: u64, mesh: Option<u32>) {
        let ferry_mesh = mesh.map(|version| ferry_proto::handshake::MeshCapability { version });
        let info = ServerInfo { version, token_bucket_bytes_per_second: rate, token_bucket_bytes_burst: burst, ferry_derp: None, ferry_mesh };
        prop_assert_eq!(ServerInfo::from_json(&info.to_json()).unwrap(), info);
    }
}
