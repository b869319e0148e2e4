//! The relay's hand-off under a sender that never pauses.

use super::*;

// ----- the relay's hand-off under a sender that never pauses -----

/// How long the sender below keeps writing: longer than the relay tries to
/// move a session (5 s), so that a relay which only moves a session when a
/// read happens to end on a record boundary gives up first.
const STREAM_FOR: Duration = Duration::from_secs(8);

/// Where each TLS record in `wire` (whole records) ends.
fn record_ends(wire: &[u8]) -> Vec<usize> {
    let (mut at, mut ends) = (0, Vec::new());
    while at + 5 <= wire.len() {
        at += 5 + usize::from(u16::from_be_bytes([wire[at + 3], wire[at + 4]]));
        ends.push(at);
    }
    ends
}

/// A client whose bytes never reach the relay on a record boundary: its
/// Finished goes out with only part of its first application record
/// (fast start: the request and clientInfo, then packets), and from then
/// on it writes without a pause, each write ending a few bytes short of a
/// record's end. A relay that moves a session into the kernel only when a
/// read ends on a boundary never finds one (the move deadline passes: the
/// failure the VM's ferry-bench check and Tailscale's client saw on a
/// loaded host); the relay must read the rest of the record itself and
/// move. Every byte must still count: a packet sent after the stream
/// reaches its peer, and the relay saw every packet of the stream.
#[test]
fn a_sender_never_pausing_on_a_record_boundary_still_moves_into_the_kernel() {
    if let Err(reason) = sys::tls_ulp_available() {
        return ferry_testkit::skip_unless_required!(KTLS_REQUIRED, "{reason}");
    }
    // epoll: the back end that reads kTLS records (whatever FERRY_IO says).
    let mut cfg = ferry_derp::DerpConfig::new(ferry_proto::key::NodePrivate::generate());
    let mut config = (*support::self_signed_tls(&cfg).config).clone();
    allow_kernel_tls(&mut config);
    cfg.tls = Some(Arc::new(config));
    cfg.ktls = true;
    let server_key = cfg.public_key;
    let server = ferry_derp::Server::start(ferry_derp::ServerOptions {
        config: cfg,
        listeners: vec![ferry_derp::ListenerSpec {
            addr: (Ipv4Addr::LOCALHOST, 0).into(),
            kind: ferry_derp::ListenerKind::Derp,
        }],
        workers: 1,
        pin: false,
        stun: None,
        metrics_addr: None,
        io: ferry_engine::IoMode::Epoll,
        inherited: Vec::new(),
    })
    .expect("server starts");
    let addr = server.listen_addrs[0];
    let mut b = support::connect_tls(addr);

    // The handshake up to the client's Finished, which is held back.
    let provider = Arc::new(aws_lc_rs::default_provider());
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ferry_testkit::tls::Verifier::accept_any(
            provider,
        )))
        .with_no_client_auth();
    let mut tls = ClientConnection::new(Arc::new(config), localhost()).unwrap();
    let mut tcp = support::dial(addr, None);
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut wire = Vec::new();
    while tls.wants_write() {
        tls.write_tls(&mut wire).unwrap();
    }
    tcp.write_all(&wire).unwrap();
    wire.clear();
    for _ in 0..100 {
        if !tls.is_handshaking() {
            break;
        }
        tls.read_tls(&mut tcp).expect("the relay's handshake");
        tls.process_new_packets().expect("the relay's handshake");
    }
    assert!(!tls.is_handshaking(), "handshake finished");

    let key = ferry_proto::key::NodePrivate::generate();
    let a_public = key.public();
    let mut derp_config = support::config(key, support::info(None));
    derp_config.fast_start = Some(server_key);
    let mut derp = ferry_proto::client::Client::new(
        derp_config,
        Instant::now(),
        ferry_proto::nacl::random_nonce(),
    )
    .unwrap();
    let nobody = ferry_proto::key::NodePrivate::generate().public();
    let packet = [0x5a; 1000];
    let mut plain = Vec::new();
    derp.poll_transmit(&mut plain);

    // Each write holds back the last bytes of what rustls produced (the
    // tail of a record), and the next write starts with them.
    const HOLD: usize = 7;
    let (start, mut sent, mut batches) = (Instant::now(), 0u64, 0);
    // Where the first whole record starts in `wire`: after the first
    // write, `wire` begins with the held-back tail of the last record.
    let mut first_header = 0;
    while start.elapsed() < STREAM_FOR && batches < 1_000_000 {
        for _ in 0..30 {
            derp.send_packet(&mut plain, &nobody, &packet).unwrap();
            sent += 1;
        }
        tls.writer().write_all(&plain).unwrap();
        plain.clear();
        while tls.wants_write() {
            tls.write_tls(&mut wire).unwrap();
        }
        let cut = wire.len() - HOLD;
        assert!(
            !record_ends(&wire[first_header..]).contains(&(cut - first_header)),
            "a write ending inside a record"
        );
        tcp.write_all(&wire[..cut]).expect("the relay reads on");
        wire.drain(..cut);
        first_header = HOLD;
        batches += 1;
    }
    // The stream's end, and a packet after it.
    derp.send_packet(&mut plain, &b.public, b"after the stream")
        .unwrap();
    tls.writer().write_all(&plain).unwrap();
    while tls.wants_write() {
        tls.write_tls(&mut wire).unwrap();
    }
    tcp.write_all(&wire).unwrap();
    assert_eq!(
        b.recv_packet(Duration::from_secs(30))
            .expect("the packet after the stream"),
        (a_public, b"after the stream".to_vec())
    );
    let text = server.metrics().render();
    let ktls = support::metric_in(&text, "ferry_connections_by_transport{transport=\"ktls\"}");
    let dropped = support::metric_in(
        &text,
        "derp_packets_dropped{kind=\"other\",reason=\"unknown_dest\"}",
    );
    println!(
        "{batches} writes, {sent} packets in {:?}; {ktls} sessions in the kernel",
        start.elapsed()
    );
    assert_eq!(
        dropped, sent as f64,
        "every packet of the stream read and parsed"
    );
    assert_eq!(
        ktls, 2.0,
        "both sessions in the kernel, the streaming one too"
    );
    drop(tcp);
    support::stop(server);
}
