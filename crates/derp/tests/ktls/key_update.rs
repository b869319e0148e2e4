//! KeyUpdate between unbuffered connections in memory, and the renewal of
//! AES-GCM keys before their record limit.

use super::*;

#[test]
fn key_update_from_the_peer_installs_the_next_keys_both_ways() {
    for suite in tls13_suites() {
        let (client, server) = unbuffered_pair(suite, &[b"hello"], &[b"hi", b"there"]);
        let mut sock = FakeSocket::default();
        let mut session = KernelTls::start(server, &mut sock).expect("hand-off");
        assert!(session.can_rekey());
        let (theirs, mut client) = client.dangerous_into_kernel_connection().unwrap();
        assert_keys(sock.key(0), &theirs.rx, "initial tx");
        assert_keys(sock.key(1), &theirs.tx, "initial rx");
        assert_eq!((theirs.rx.0, theirs.tx.0), (2, 1));

        // The client updates its keys and asks for ours.
        let client_tx1 = client.update_tx_secret().unwrap();
        let out = session
            .on_record(&mut sock, 22, &KEY_UPDATE_REQUESTED)
            .unwrap();
        assert_eq!(out, RecordOutcome::KeyUpdated);
        assert!(!session.key_update_due());
        assert_eq!(sock.keys.len(), 4);
        assert_eq!(sock.keys[2].0, Direction::Rx);
        assert_keys(
            sock.key(2),
            &client_tx1,
            &format!("{suite:?} rx after update"),
        );
        // Our KeyUpdate went out before the new transmit keys went in.
        assert_eq!(sock.sent, vec![(22, KEY_UPDATE_NOT_REQUESTED.to_vec())]);
        assert_eq!(sock.keys[3].0, Direction::Tx);
        let client_rx1 = client.update_rx_secret().unwrap();
        assert_keys(
            sock.key(3),
            &client_rx1,
            &format!("{suite:?} tx after update"),
        );

        // An update without request changes only the receive keys.
        let client_tx2 = client.update_tx_secret().unwrap();
        let out = session
            .on_record(&mut sock, 22, &KEY_UPDATE_NOT_REQUESTED)
            .unwrap();
        assert_eq!(out, RecordOutcome::KeyUpdated);
        assert_eq!(sock.keys.len(), 5);
        assert_keys(sock.key(4), &client_tx2, "rx after second update");
        assert_eq!(sock.sent.len(), 1);
    }
}

#[test]
fn key_update_response_waits_when_the_send_buffer_is_full() {
    let suite = tls13_suites()[0];
    let (client, server) = unbuffered_pair(suite, &[], &[]);
    let mut sock = FakeSocket::default();
    let mut session = KernelTls::start(server, &mut sock).unwrap();
    let (_, mut client) = client.dangerous_into_kernel_connection().unwrap();
    client.update_tx_secret().unwrap();

    sock.would_block = 1;
    let out = session
        .on_record(&mut sock, 22, &KEY_UPDATE_REQUESTED)
        .unwrap();
    assert_eq!(out, RecordOutcome::KeyUpdated);
    assert!(session.key_update_due(), "our update is still owed");
    assert_eq!(
        sock.keys.len(),
        3,
        "receive keys replaced, transmit keys not yet"
    );
    assert!(sock.sent.is_empty());

    assert!(session.rekey_tx(&mut sock).unwrap());
    assert!(!session.key_update_due());
    assert_eq!(sock.sent, vec![(22, KEY_UPDATE_NOT_REQUESTED.to_vec())]);
    assert_keys(sock.key(3), &client.update_rx_secret().unwrap(), "tx");
}

#[test]
fn key_update_where_the_kernel_cannot_rekey_closes_cleanly() {
    let suite = tls13_suites()[0];
    let (_client, server) = unbuffered_pair(suite, &[], &[]);
    let mut sock = FakeSocket {
        no_rekey: Some("the kernel cannot replace TLS 1.3 keys (test)"),
        ..FakeSocket::default()
    };
    let mut session = KernelTls::start(server, &mut sock).unwrap();
    let err = session
        .on_record(&mut sock, 22, &KEY_UPDATE_REQUESTED)
        .unwrap_err();
    assert!(matches!(err, HandoffError::CannotRekey(_)), "{err}");
    assert_eq!(sock.keys.len(), 2, "no keys touched");
    // Our keys still match the peer's, so we can say goodbye.
    session.send_close_notify(&mut sock).unwrap();
    assert_eq!(sock.sent, vec![(21, vec![1, 0])]);

    // A session from a buffered connection cannot follow either.
    let (_client, server) = buffered_pair(suite, 0, 0);
    let mut sock = FakeSocket::default();
    let mut session = KernelTls::start(server, &mut sock).unwrap();
    let err = session
        .on_record(&mut sock, 22, &KEY_UPDATE_NOT_REQUESTED)
        .unwrap_err();
    assert!(
        err.to_string().contains("buffered rustls connection"),
        "{err}"
    );
    session.send_close_notify(&mut sock).unwrap();
    assert_eq!(sock.sent, vec![(21, vec![1, 0])]);
}

#[test]
fn failed_transmit_rekey_leaves_nothing_to_say() {
    let suite = tls13_suites()[0];
    let (_client, server) = unbuffered_pair(suite, &[], &[]);
    // Initial keys and the new receive keys go in; the new transmit keys
    // do not.
    let mut sock = FakeSocket {
        fail_keys_from: Some(3),
        ..FakeSocket::default()
    };
    let mut session = KernelTls::start(server, &mut sock).unwrap();
    let err = session
        .on_record(&mut sock, 22, &KEY_UPDATE_REQUESTED)
        .unwrap_err();
    assert!(
        err.to_string().starts_with("replacing the TLS_TX keys"),
        "{err}"
    );
    assert_eq!(sock.sent.len(), 1, "the KeyUpdate went out");
    // The peer expects keys we do not have: no close_notify.
    session.send_close_notify(&mut sock).unwrap();
    assert_eq!(sock.sent.len(), 1);
    assert!(session.rekey_tx(&mut sock).is_err());
}

#[test]
fn alerts_and_stray_records() {
    let suite = tls13_suites()[0];
    let (_client, server) = buffered_pair(suite, 0, 0);
    let mut sock = FakeSocket::default();
    let mut session = KernelTls::start(server, &mut sock).unwrap();
    assert_eq!(
        session.on_record(&mut sock, 21, &[1, 0]).unwrap(),
        RecordOutcome::Closed
    );
    let err = session.on_record(&mut sock, 21, &[2, 20]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "peer sent TLS alert BadRecordMac (level 2)"
    );
    assert!(session.on_record(&mut sock, 21, &[2]).is_err());
    for stray in [20u8, 23, 24, 99] {
        let err = session.on_record(&mut sock, stray, &[0]).unwrap_err();
        assert!(
            matches!(err, HandoffError::UnexpectedRecord { record_type } if record_type == stray),
            "{err}"
        );
    }
    let err = session.on_record(&mut sock, 22, &[4, 0, 0, 0]).unwrap_err();
    assert!(
        matches!(err, HandoffError::UnexpectedHandshake { msg_type: 4 }),
        "{err}"
    );

    // TLS 1.2 has no post-handshake messages to accept.
    let (_client, server) = buffered_pair(tls12_suites()[0], 0, 0);
    let mut session = KernelTls::start(server, &mut sock_fresh()).unwrap();
    let err = session
        .on_record(&mut sock_fresh(), 22, &KEY_UPDATE_NOT_REQUESTED)
        .unwrap_err();
    assert!(
        matches!(err, HandoffError::UnexpectedHandshake { msg_type: 24 }),
        "{err}"
    );
}

fn sock_fresh() -> FakeSocket {
    FakeSocket::default()
}

#[test]
fn aes_gcm_keys_are_renewed_before_their_record_limit() {
    let suite = tls13_suites()[0];
    let (_client, server) = unbuffered_pair(suite, &[], &[]);
    let mut sock = FakeSocket::default();
    let mut session = KernelTls::start(server, &mut sock).unwrap();
    session.note_sent(100).unwrap();
    assert!(!session.key_update_due());
    // 2^23 full records: half of AES-GCM's 2^24.
    session.note_sent((1usize << 23) * 16384).unwrap();
    assert!(session.key_update_due());
    assert!(session.rekey_tx(&mut sock).unwrap());
    assert!(!session.key_update_due());
    assert_eq!(sock.key(2).seq(), 0);

    // ChaCha20-Poly1305 has no such limit.
    let (_client, server) = unbuffered_pair(tls13_suites()[2], &[], &[]);
    let mut session = KernelTls::start(server, &mut sock_fresh()).unwrap();
    session.note_sent(1usize << 40).unwrap();
    assert!(!session.key_update_due());

    // Where keys cannot be renewed, the limit ends the connection.
    let (_client, server) = buffered_pair(suite, 0, 0);
    let mut session = KernelTls::start(server, &mut sock_fresh()).unwrap();
    let err = session.note_sent((1usize << 23) * 16384).unwrap_err();
    assert!(matches!(err, HandoffError::CannotRekey(_)), "{err}");
}
