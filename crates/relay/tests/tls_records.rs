//! DERP over TLS 1.3 with either record layer after the handshake:
//! Ferry's own (the default) and rustls (`--tls-records rustls`). Both
//! relay packets of every size (records cut by reads, several records per
//! read, flushes of many frames); a peer's KeyUpdate ends a session on
//! Ferry's layer cleanly (close_notify, as kTLS started from rustls's
//! buffered connection does) and is followed by rustls; a record that
//! fails authentication gets a bad_record_mac alert and the end; a TLS
//! 1.2 client stays on rustls and relays as well. Each case checks which
//! layer carries its sessions (`ferry_connections_by_transport`), so that
//! a session on the wrong one fails it.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::client::Event;
use ferry_proto::key::NodePrivate;
use ferry_relay::tls_records::TlsRecords;
use ferry_relay::Server;
use support::{connect_tls, Client, Tls};

const LAYERS: [TlsRecords; 2] = [TlsRecords::Ferry, TlsRecords::Rustls];

fn start(records: TlsRecords) -> (Server, std::net::SocketAddr) {
    support::start(2, |cfg| {
        cfg.tls = Some(support::self_signed_tls(cfg).config);
        cfg.tls_records = records;
    })
}

/// `a` sends `n` packets of `len` bytes (at least 4) to `b`, all sent
/// before any is read (so the relay's reads and flushes carry many
/// frames; `n * len` stays under the relay's per-client queue, or the
/// sender would block), and `b` gets each, in order.
fn relay_burst(a: &mut Client<Tls>, b: &mut Client<Tls>, n: u32, len: usize) {
    for i in 0..n {
        let mut payload = vec![(i % 251) as u8; len];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        a.send(&b.public, &payload);
    }
    for i in 0..n {
        let (src, got) = b.recv_packet(Duration::from_secs(10)).expect("packet");
        assert_eq!(src, a.public);
        assert_eq!(got.len(), len);
        assert_eq!(got[..4], i.to_be_bytes(), "packet {i} of {n} ({len} B)");
    }
}

/// Checks that `n` sessions are on the layer `records` makes them use
/// (`ferry_records` or `rustls`) and none on the other.
fn assert_on(server: &Server, records: TlsRecords, n: usize, what: &str) {
    let (on, other) = match records {
        TlsRecords::Ferry => ("ferry_records", "rustls"),
        TlsRecords::Rustls => ("rustls", "ferry_records"),
    };
    assert_eq!(
        (
            support::on_transport(server, on),
            support::on_transport(server, other)
        ),
        (n as f64, 0.0),
        "{what}: sessions on {on} and on {other}"
    );
}

/// How the server ended the session: `Ok(())` after its close_notify
/// (the stream's clean end), `Err` with the TLS error otherwise.
fn end_of(c: &mut Client<Tls>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the server did not end the session");
        match c.next_event(left) {
            Ok(Event::ServerClosed) => return Ok(()),
            Ok(_) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn both_record_layers_relay_every_size() {
    for records in LAYERS {
        let (server, addr) = start(records);
        let mut a = connect_tls(addr);
        let mut b = connect_tls(addr);
        for (n, len) in [(200, 4), (200, 1400), (40, 16_000), (8, 64 * 1024 - 100)] {
            relay_burst(&mut a, &mut b, n, len);
            relay_burst(&mut b, &mut a, n, len);
            assert_on(&server, records, 2, &format!("{records:?}, {len} B"));
        }
        support::stop(server);
    }
}

fn a_peers_key_update_ends_ferrys_session_cleanly_and_rustls_follows_it() {
    for records in LAYERS {
        let (server, addr) = start(records);
        let mut a = connect_tls(addr);
        let mut b = connect_tls(addr);
        relay_burst(&mut a, &mut b, 10, 100);
        assert_on(&server, records, 2, &format!("{records:?}"));
        a.stream.conn.refresh_traffic_keys().expect("a KeyUpdate");
        a.send(&b.public, b"after the key update");
        match records {
            TlsRecords::Ferry => {
                assert_eq!(end_of(&mut a), Ok(()), "ended with close_notify");
            }
            TlsRecords::Rustls => {
                let (src, got) = b.recv_packet(Duration::from_secs(10)).expect("packet");
                assert_eq!((src, &got[..]), (a.public, &b"after the key update"[..]));
                relay_burst(&mut b, &mut a, 10, 100);
            }
        }
        // The other session is untouched.
        let mut c = connect_tls(addr);
        relay_burst(&mut b, &mut c, 10, 1000);
        support::stop(server);
    }
}

fn a_forged_record_gets_bad_record_mac() {
    let (server, addr) = start(TlsRecords::Ferry);
    let mut a = connect_tls(addr);
    let mut b = connect_tls(addr);
    relay_burst(&mut a, &mut b, 10, 100);
    assert_on(&server, TlsRecords::Ferry, 2, "before the forged record");
    // A well-framed record whose tag cannot be right.
    let mut forged = vec![23, 3, 3, 0, 40];
    forged.extend_from_slice(&[0x5a; 40]);
    a.stream.sock.write_all(&forged).unwrap();
    let err = end_of(&mut a).expect_err("not a clean end");
    assert!(err.contains("BadRecordMac"), "{err}");
    relay_burst(&mut b, &mut connect_tls(addr), 5, 100);
    support::stop(server);
}

/// A DERP client that speaks TLS 1.2 only.
fn connect_tls12(addr: std::net::SocketAddr) -> Client<Tls> {
    use ferry_testkit::tls::{provider, Verifier};
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier::accept_any(provider())))
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let tcp = support::dial(addr, None);
    let derp = support::config(NodePrivate::generate(), support::info(None));
    let c = Client::over(rustls::StreamOwned::new(conn, tcp), derp);
    assert_eq!(
        c.stream.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    c
}

fn a_tls12_client_stays_on_rustls_and_relays() {
    let (server, addr) = start(TlsRecords::Ferry);
    let mut a = connect_tls12(addr);
    let mut b = connect_tls(addr);
    for (n, len) in [(100, 4), (40, 16_000)] {
        relay_burst(&mut a, &mut b, n, len);
        relay_burst(&mut b, &mut a, n, len);
        // The TLS 1.3 client moved to Ferry's layer, the TLS 1.2 one did not.
        assert_eq!(
            (
                support::on_transport(&server, "rustls"),
                support::on_transport(&server, "ferry_records")
            ),
            (1.0, 1.0),
            "{len} B: one session on each layer"
        );
    }
    support::stop(server);
}

ferry_testkit::per_backend!(
    both_record_layers_relay_every_size,
    a_peers_key_update_ends_ferrys_session_cleanly_and_rustls_follows_it,
    a_forged_record_gets_bad_record_mac,
    a_tls12_client_stays_on_rustls_and_relays,
);
