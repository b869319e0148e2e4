//! The client against a scripted server on loopback that sends every frame
//! a real server may send, right behind `serverInfo` in one write: each
//! becomes the right event in order, server pings are answered, and a
//! region's fallback node hears which node was meant (`Ideal-Node`).

use ferry_client::{DerpClient, Event, Options};
use ferry_proto::derp_map::DerpMap;
use ferry_proto::frame::{self, PeerGoneReason, HEADER_LEN};
use ferry_proto::handshake::{self, ServerInfo};
use ferry_proto::http::parse_request;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

/// Reads one frame (type, payload).
async fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).await.unwrap();
    let (ty, len) = frame::decode_header(&head).unwrap();
    let mut payload = vec![0; len as usize];
    s.read_exact(&mut payload).await.unwrap();
    (ty, payload)
}

/// Reads the client's HTTP request head.
async fn read_request(s: &mut TcpStream) -> ferry_proto::http::Request {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "client closed during the request");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(r) = parse_request(&buf).unwrap() {
            return r;
        }
    }
}

#[tokio::test]
async fn every_server_frame_becomes_an_event() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server_key = NodePrivate::generate();
    let peer = NodePublic::from_bytes([9; 32]);
    let ping = *b"pingdata";

    let server_pub = server_key.public();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let request = read_request(&mut s).await;
        assert!(!request.fast_start, "plain HTTP never uses fast start");
        let mut out = ferry_proto::http::switching_protocols(&server_pub);
        out.extend_from_slice(&handshake::server_key_frame(&server_pub));
        s.write_all(&out).await.unwrap();
        let (_, info) = read_frame(&mut s).await;
        let (client, _, shared) = handshake::open_client_info_keyed(&server_key, &info).unwrap();
        let mut out = handshake::seal_server_info_keyed(
            &shared,
            &ServerInfo::current(),
            &nacl::random_nonce(),
        );
        frame::put_health(&mut out, "overloaded");
        let addr = Some("192.0.2.7:41641".parse().unwrap());
        frame::put_peer_present(&mut out, &peer, addr, 1, "scripted");
        frame::put_peer_gone(&mut out, &peer, PeerGoneReason::NotHere);
        frame::put_ping(&mut out, &ping);
        frame::put_keepalive(&mut out);
        frame::put_recv_packet(&mut out, &peer, b"payload");
        frame::put_health(&mut out, "");
        frame::put_restarting(&mut out, 250, 5000);
        s.write_all(&out).await.unwrap();
        // The client answers the ping by itself.
        let (ty, payload) = read_frame(&mut s).await;
        (request.ideal_node, client, ty, payload, s)
    });

    // The region's first node is a closed port: the client falls back to
    // the second and names the first as the one it meant.
    let map = format!(
        r#"{{"Regions":{{"7":{{"Nodes":[
            {{"Name":"7a","HostName":"127.0.0.1","DERPPort":{dead}}},
            {{"Name":"7b","HostName":"127.0.0.1","DERPPort":{port}}}]}}}}}}"#
    );
    let region = DerpMap::from_json(map.as_bytes()).unwrap().regions[&7].clone();
    let mut options = Options::default();
    options.plain_http = true;
    let key = NodePrivate::generate();
    let me = key.public();
    let mut client = DerpClient::connect_region(&region, key, options)
        .await
        .unwrap();

    let mut events = Vec::new();
    for _ in 0..7 {
        let e = tokio::time::timeout(LIMIT, client.recv())
            .await
            .unwrap()
            .unwrap();
        events.push(e);
    }
    let mut it = events.into_iter();
    let mut next = || it.next().unwrap();
    assert!(
        matches!(next(), Event::Connected { server_key, fast_start: false, .. } if server_key == server_pub)
    );
    assert!(matches!(next(), Event::Health { problem: Some(p) } if p == "overloaded"));
    assert!(
        matches!(next(), Event::PeerPresent { peer: p, addr: Some(a), flags: 1, app_name: Some(n) }
        if p == peer && a.to_string() == "192.0.2.7:41641" && n.as_str() == "scripted")
    );
    assert!(
        matches!(next(), Event::PeerGone { peer: p, reason: PeerGoneReason::NotHere } if p == peer)
    );
    assert!(matches!(next(), Event::Packet { src, data } if src == peer && data == b"payload"));
    assert!(matches!(next(), Event::Health { problem: None }));
    assert!(matches!(next(), Event::Restarting { reconnect_in, try_for }
        if reconnect_in == Duration::from_millis(250) && try_for == Duration::from_secs(5)));

    let (ideal, client_key, ty, payload, _conn) =
        tokio::time::timeout(LIMIT, server).await.unwrap().unwrap();
    assert_eq!(ideal.as_deref(), Some("7a"));
    assert_eq!(client_key, me);
    assert_eq!(ty, frame::FrameType::Pong as u8);
    assert_eq!(payload, ping);
}

#[tokio::test]
async fn websocket_pings_are_answered_and_frames_unwrapped() {
    use ferry_proto::websocket::{self, ControlFrame, Decoder};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/derp", listener.local_addr().unwrap());
    let server_key = NodePrivate::generate();
    let server_pub = server_key.public();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let request = read_request(&mut s).await;
        let key = request.websocket_key.expect("a WebSocket upgrade");
        // The 101, a ping and serverKey in one write, the frame split over
        // two binary messages.
        let mut out = websocket::accept_response(&key);
        out.extend_from_slice(&[0x89, 2, b'h', b'i']);
        let sk = handshake::server_key_frame(&server_pub);
        websocket::put_binary(&mut out, &sk[..7]);
        websocket::put_binary(&mut out, &sk[7..]);
        s.write_all(&out).await.unwrap();
        // The client answers the ping and sends clientInfo, masked.
        let mut d = Decoder::new();
        let (mut data, mut ctrl) = (Vec::new(), Vec::new());
        while data.len() < HEADER_LEN
            || data.len() < HEADER_LEN + frame::decode_header(&data).unwrap().1 as usize
        {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "client closed");
            d.feed(&chunk[..n], &mut data, |c| ctrl.push(c)).unwrap();
        }
        let (client, _, shared) =
            handshake::open_client_info_keyed(&server_key, &data[HEADER_LEN..]).unwrap();
        let mut derp = handshake::seal_server_info_keyed(
            &shared,
            &ServerInfo::current(),
            &nacl::random_nonce(),
        );
        frame::put_recv_packet(&mut derp, &client, b"via websocket");
        let mut out = Vec::new();
        websocket::put_binary(&mut out, &derp);
        s.write_all(&out).await.unwrap();
        (ctrl, s)
    });
    let mut options = Options::default();
    options.websocket = true;
    let key = NodePrivate::generate();
    let me = key.public();
    let mut client = DerpClient::connect(&url, key, options).await.unwrap();
    let e = tokio::time::timeout(LIMIT, client.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(e, Event::Connected { server_key, fast_start: false, .. } if server_key == server_pub)
    );
    let e = tokio::time::timeout(LIMIT, client.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(e, Event::Packet { src, data } if src == me && data == b"via websocket"));
    let (ctrl, _conn) = tokio::time::timeout(LIMIT, server).await.unwrap().unwrap();
    assert_eq!(ctrl, [ControlFrame::Pong]);
}

#[tokio::test]
async fn nothing_to_dial_is_an_error() {
    let err = DerpClient::connect_to(Vec::new(), NodePrivate::generate(), Options::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ferry_client::Error::NoTarget), "{err}");
    let map = DerpMap::from_json(
        br#"{"Regions":{"1":{"Nodes":[{"Name":"s","HostName":"x","STUNOnly":true}]}}}"#,
    )
    .unwrap();
    let err = DerpClient::connect_region(
        &map.regions[&1],
        NodePrivate::generate(),
        Options::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ferry_client::Error::NoTarget), "{err}");
    let err = DerpClient::connect("ftp://x/derp", NodePrivate::generate(), Options::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ferry_client::Error::InvalidUrl { .. }),
        "{err}"
    );
}
