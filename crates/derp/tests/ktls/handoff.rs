//! Key export and the refusals that give a connection back to rustls.

use super::*;

// ----- key export -----

#[test]
fn tls13_hand_off_exports_the_clients_keys_for_each_suite() {
    for suite in tls13_suites() {
        let (client, server) = buffered_pair(suite, 3, 2);
        let mut sock = FakeSocket::default();
        let session = KernelTls::start(server, &mut sock).expect("hand-off");
        assert_eq!(session.version(), Version::Tls13);
        assert_eq!(session.cipher(), cipher_of(suite));
        assert!(
            !session.can_rekey(),
            "buffered connections keep no key schedule"
        );
        assert!(sock.ulp);
        assert_eq!(sock.keys.len(), 2);
        assert_eq!(
            (sock.keys[0].0, sock.keys[1].0),
            (Direction::Tx, Direction::Rx)
        );
        assert_eq!(sock.key(0).version(), Version::Tls13);

        let theirs = client.dangerous_extract_secrets().unwrap();
        // No tickets: the server sent exactly its two records under the
        // application keys, and received the client's three.
        assert_eq!((theirs.rx.0, theirs.tx.0), (2, 3), "{suite:?}");
        assert_keys(sock.key(0), &theirs.rx, &format!("{suite:?} tx"));
        assert_keys(sock.key(1), &theirs.tx, &format!("{suite:?} rx"));
    }
}

#[test]
fn tls12_hand_off_exports_the_clients_keys_for_each_suite() {
    for suite in tls12_suites() {
        let (client, server) = buffered_pair(suite, 2, 4);
        let mut sock = FakeSocket::default();
        let session = KernelTls::start(server, &mut sock).expect("hand-off");
        assert_eq!(session.version(), Version::Tls12);
        assert_eq!(sock.key(0).version(), Version::Tls12);
        assert_eq!(sock.key(0).header().0, 0x0303);
        let theirs = client.dangerous_extract_secrets().unwrap();
        // TLS 1.2 counts each side's Finished as record 0.
        assert_eq!((theirs.rx.0, theirs.tx.0), (1 + 4, 1 + 2), "{suite:?}");
        assert_keys(sock.key(0), &theirs.rx, &format!("{suite:?} tx"));
        assert_keys(sock.key(1), &theirs.tx, &format!("{suite:?} rx"));
    }
}

#[test]
fn crypto_info_keeps_the_sequence_number() {
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
        iv: rustls::crypto::cipher::Iv::new(std::array::from_fn(|i| i as u8)),
    };
    let info = crypto_info(Version::Tls13, 41, &secrets).unwrap();
    assert_eq!(info.seq(), 41);
    assert_eq!(info.salt(), &[0, 1, 2, 3]);
    assert_eq!(info.iv(), &[4, 5, 6, 7, 8, 9, 10, 11]);
}

#[test]
fn production_config_needs_allow_kernel_tls() {
    let setup = ferry_derp::certs::server_config(
        &ferry_derp::certs::CertMode::SelfSigned {
            hostname: "localhost".into(),
            certdir: None,
        },
        [3; 32],
    )
    .unwrap();
    assert_eq!(
        setup.config.send_tls13_tickets, 0,
        "tls.rs sends no tickets"
    );
    let suite = aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;

    let mut prepared = (*setup.config).clone();
    allow_kernel_tls(&mut prepared);
    let mut client = ClientConnection::new(client_config(suite), localhost()).unwrap();
    let mut server = ServerConnection::new(Arc::new(prepared)).unwrap();
    handshake(&mut client, &mut server);
    KernelTls::start(server, &mut FakeSocket::default()).expect("hand-off");

    // Without it rustls refuses to export the keys only once it has been
    // consumed, so the connection is lost: configure it up front.
    let mut client = ClientConnection::new(client_config(suite), localhost()).unwrap();
    let mut server = ServerConnection::new(setup.config.clone()).unwrap();
    handshake(&mut client, &mut server);
    match KernelTls::start(server, &mut FakeSocket::default()) {
        Err(Refused::Dead(HandoffError::Extract(e))) => {
            assert!(e.to_string().contains("disabled"), "{e}")
        }
        other => panic!("expected a failed export, got {other:?}"),
    }
}

// ----- refusals give the connection back -----

#[test]
fn start_refuses_while_handshaking_and_the_handshake_goes_on() {
    let suite = tls13_suites()[0];
    let mut client = ClientConnection::new(client_config(suite), localhost()).unwrap();
    let server = ServerConnection::new(server_config(suite)).unwrap();
    let mut sock = FakeSocket::default();
    let (mut server, reason) = expect_usable(KernelTls::start(server, &mut sock));
    assert!(matches!(reason, Refusal::Handshaking), "{reason}");
    assert!(reason.is_transient());
    assert_eq!(sock.calls(), 0);
    handshake(&mut client, &mut server);
    KernelTls::start(server, &mut sock).expect("after the handshake");
}

#[test]
fn start_refuses_while_rustls_holds_unsent_output() {
    let suite = tls13_suites()[1];
    let (mut client, mut server) = buffered_pair(suite, 0, 0);
    server.write_all_plain(b"not yet on the wire");
    let mut sock = FakeSocket::default();
    let (mut server, reason) = expect_usable(KernelTls::start(server, &mut sock));
    assert!(matches!(reason, Refusal::UnsentTls), "{reason}");
    assert_eq!(sock.calls(), 0, "nothing touched the socket");
    // Still a working rustls connection.
    transfer!(server, client);
    assert_eq!(client.read_plain(), b"not yet on the wire");
    KernelTls::start(server, &mut sock).expect("once flushed");
    assert_eq!(sock.key(0).seq(), 1);
}

#[test]
fn start_refuses_while_rustls_holds_unread_input() {
    let suite = tls13_suites()[2];
    let (mut client, mut server) = buffered_pair(suite, 0, 0);
    client.write_all_plain(b"unread");
    transfer!(client, server);
    let mut sock = FakeSocket::default();
    let (mut server, reason) = expect_usable(KernelTls::start(server, &mut sock));
    assert!(matches!(reason, Refusal::PendingInput), "{reason}");
    assert_eq!(reason.label(), "pending_input");
    assert_eq!(sock.calls(), 0);
    assert_eq!(server.read_plain(), b"unread");
    // Both ways still work.
    server.write_all_plain(b"reply");
    transfer!(server, client);
    assert_eq!(client.read_plain(), b"reply");
    KernelTls::start(server, &mut sock).expect("once read");
    assert_eq!((sock.key(0).seq(), sock.key(1).seq()), (1, 1));
}

#[test]
fn start_refuses_after_the_peers_close_notify() {
    let suite = tls13_suites()[0];
    let (mut client, mut server) = buffered_pair(suite, 1, 0);
    client.send_close_notify();
    transfer!(client, server);
    let (_server, reason) = expect_usable(KernelTls::start(server, &mut FakeSocket::default()));
    assert!(matches!(reason, Refusal::PendingInput), "{reason}");
}

#[test]
fn tls13_tickets_must_reach_the_wire_before_a_hand_off() {
    let suite = tls13_suites()[0];
    for tickets in [0usize, 2] {
        let mut config = (*server_config(suite)).clone();
        config.send_tls13_tickets = tickets;
        let mut client = ClientConnection::new(client_config(suite), localhost()).unwrap();
        let mut server = ServerConnection::new(Arc::new(config)).unwrap();
        transfer!(client, server); // ClientHello
        transfer!(server, client); // ServerHello .. Finished
        transfer!(client, server); // client Finished
        assert!(!server.is_handshaking());
        // rustls queues the tickets as soon as the client's Finished is in.
        assert_eq!(server.wants_write(), tickets > 0, "{tickets} tickets");
        let mut sock = FakeSocket::default();
        let mut ticket_records = 0;
        let server = if tickets > 0 {
            let (mut server, reason) = expect_usable(KernelTls::start(server, &mut sock));
            assert!(matches!(reason, Refusal::UnsentTls), "{reason}");
            let mut wire = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut wire).unwrap();
            }
            ticket_records = count_records(&wire);
            assert!(ticket_records >= 1);
            client.read_tls(&mut &wire[..]).unwrap();
            client.process_new_packets().unwrap();
            server
        } else {
            server
        };
        KernelTls::start(server, &mut sock).expect("hand-off");
        // Tickets travel in records under the application keys (rustls
        // packs both into one): the kernel's count continues after them.
        assert_eq!(sock.key(0).seq(), ticket_records, "{tickets} tickets");
        assert_eq!(sock.key(1).seq(), 0);
    }
}

/// Number of whole TLS records in `wire`.
fn count_records(mut wire: &[u8]) -> u64 {
    let mut n = 0;
    while wire.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([wire[3], wire[4]]));
        wire = &wire[(5 + len).min(wire.len())..];
        n += 1;
    }
    n
}

#[test]
fn fallback_keeps_rustls_working_when_the_kernel_refuses() {
    let suite = tls13_suites()[0];
    let (mut client, server) = buffered_pair(suite, 1, 1);
    let mut sock = FakeSocket {
        unsupported: Some("the kernel has no TLS ULP (test)"),
        ..FakeSocket::default()
    };
    let (mut server, reason) = expect_usable(KernelTls::start(server, &mut sock));
    assert!(matches!(reason, Refusal::Kernel(_)), "{reason}");
    assert!(!reason.is_transient());
    assert_eq!(reason.to_string(), "the kernel has no TLS ULP (test)");
    assert_eq!(sock.calls(), 0);
    for i in 0..5 {
        let msg = format!("round {i}");
        client.write_all_plain(msg.as_bytes());
        transfer!(client, server);
        assert_eq!(server.read_plain(), msg.as_bytes());
        server.write_all_plain(msg.as_bytes());
        transfer!(server, client);
        assert_eq!(client.read_plain(), msg.as_bytes());
    }
}

#[test]
fn failures_after_the_ulp_is_attached_are_fatal() {
    let suite = tls13_suites()[0];
    let (_client, server) = buffered_pair(suite, 0, 0);
    let mut sock = FakeSocket {
        fail_keys_from: Some(1),
        ..FakeSocket::default()
    };
    match KernelTls::start(server, &mut sock) {
        Err(Refused::Dead(e @ HandoffError::Socket { .. })) => {
            assert!(e.to_string().starts_with("setting TLS_RX: "), "{e}")
        }
        other => panic!("expected a dead connection, got {other:?}"),
    }
}
