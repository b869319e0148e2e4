//! DERP over TLS 1.3 with either record layer after the handshake:
//! Ferry's own (the default) and rustls (`--tls-records rustls`). Both
//! relay packets of every size (records cut by reads, several records per
//! read, flushes of many frames); a peer's KeyUpdate ends a session on
//! Ferry's layer cleanly (close_notify, as kTLS started from rustls's
//! buffered connection does) and is followed by rustls; a record that
//! fails authentication gets a bad_record_mac alert and the end; a TLS
//! 1.2 client stays on rustls and relays as well. A peer that breaks the
//! record rules rustls keeps (a padded plaintext over 2^14 + 1 bytes, more
//! than 32 records without content in a row) is cut off by both layers,
//! with the alert rustls would send, and no one else notices. Each case
//! checks which layer carries its sessions (`ferry_connections_by_transport`),
//! so that a session on the wrong one fails it.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_derp::config::TlsRecords;
use ferry_derp::Server;
use ferry_proto::client::Event;
use ferry_proto::key::NodePrivate;
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

/// A client whose TLS keys were taken out of rustls after the handshake:
/// it seals and opens records itself, so it can send what rustls would
/// not.
struct RawPeer {
    sock: std::net::TcpStream,
    tx: RawKeys,
    rx: RawKeys,
    /// Received bytes not yet opened.
    input: Vec<u8>,
}

struct RawKeys {
    key: aws_lc_rs::aead::LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl RawKeys {
    fn new((seq, secrets): (u64, rustls::ConnectionTrafficSecrets)) -> RawKeys {
        use aws_lc_rs::aead::{UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305};
        use rustls::ConnectionTrafficSecrets as S;
        let (alg, key, iv) = match &secrets {
            S::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            S::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            S::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => panic!("a TLS 1.3 AEAD"),
        };
        RawKeys {
            key: aws_lc_rs::aead::LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).unwrap()),
            iv: iv.as_ref().try_into().unwrap(),
            seq,
        }
    }

    fn nonce(&mut self) -> aws_lc_rs::aead::Nonce {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        aws_lc_rs::aead::Nonce::assume_unique_for_key(n)
    }
}

impl RawPeer {
    /// A DERP client over TLS 1.3 that relayed a little (so the relay has
    /// moved it to its record layer), then had its keys taken out.
    fn connect(addr: std::net::SocketAddr, b: &mut Client<Tls>) -> RawPeer {
        let mut config = ferry_testkit::tls::accept_any_config();
        config.enable_secret_extraction = true;
        let conn = rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
        let derp = support::config(NodePrivate::generate(), support::info(None));
        let mut a = Client::over(
            rustls::StreamOwned::new(conn, support::dial(addr, None)),
            derp,
        );
        assert_eq!(
            a.stream.conn.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        relay_burst(&mut a, b, 3, 100);
        relay_burst(b, &mut a, 3, 100);
        let rustls::StreamOwned { conn, sock } = a.stream;
        let secrets = conn.dangerous_extract_secrets().expect("the keys");
        RawPeer {
            sock,
            tx: RawKeys::new(secrets.tx),
            rx: RawKeys::new(secrets.rx),
            input: Vec::new(),
        }
    }

    /// Seals and sends one record: `content`, its type, `padding` zeros.
    fn send(&mut self, ty: u8, content: &[u8], padding: usize) {
        let mut record = vec![23, 3, 3];
        let len = (content.len() + 1 + padding + 16) as u16;
        record.extend_from_slice(&len.to_be_bytes());
        record.extend_from_slice(content);
        record.push(ty);
        record.resize(record.len() + padding, 0);
        let (header, body) = record.split_at_mut(5);
        let nonce = self.tx.nonce();
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, aws_lc_rs::aead::Aad::from(&*header), body)
            .unwrap();
        record.extend_from_slice(tag.as_ref());
        self.sock.write_all(&record).unwrap();
    }

    /// A DERP packet to `dst`, in one record.
    fn send_packet(&mut self, dst: &ferry_proto::key::NodePublic, packet: &[u8]) {
        let mut frame = Vec::new();
        ferry_proto::frame::put_send_packet(&mut frame, dst, packet);
        self.send(23, &frame, 0);
    }

    /// Reads until the relay's alert: its description (records of DERP
    /// frames before it are skipped), or `None` if the connection ends
    /// without one.
    fn alert(&mut self) -> Option<u8> {
        use std::io::Read;
        self.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        loop {
            while self.input.len() >= 5 {
                let len = usize::from(u16::from_be_bytes([self.input[3], self.input[4]]));
                if self.input.len() < 5 + len {
                    break;
                }
                let mut record: Vec<u8> = self.input.drain(..5 + len).collect();
                let (header, body) = record.split_at_mut(5);
                let nonce = self.rx.nonce();
                let plain = self
                    .rx
                    .key
                    .open_in_place(nonce, aws_lc_rs::aead::Aad::from(&*header), body)
                    .expect("the relay's records open");
                let end = plain.iter().rposition(|&b| b != 0).unwrap();
                if plain[end] == 21 {
                    return Some(plain[1]);
                }
            }
            let mut buf = [0u8; 65536];
            match self.sock.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.input.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    panic!("no alert and no close within 10 s: the relay took the record")
                }
                Err(e) => panic!("waiting for the relay's alert: {e}"),
            }
        }
    }
}

/// Both record layers cut off a peer that pads a record past the
/// plaintext limit (record_overflow) or sends a 33rd record without
/// content in a row (unexpected_message on Ferry's; rustls closes without
/// an alert); up to the limits, they relay. Other clients keep relaying.
fn records_past_the_plaintext_and_empty_run_limits_end_the_session() {
    for records in LAYERS {
        let (server, addr) = start(records);
        let mut b = connect_tls(addr);

        // Padding to exactly 2^14 + 1 bytes of inner plaintext is fine;
        // one byte more is not.
        let mut a = RawPeer::connect(addr, &mut b);
        let mut frame = Vec::new();
        ferry_proto::frame::put_send_packet(&mut frame, &b.public, b"padded");
        let room = (1 << 14) + 1 - frame.len() - 1;
        a.send(23, &frame, room);
        let (_, got) = b.recv_packet(Duration::from_secs(10)).expect("packet");
        assert_eq!(got, b"padded", "{records}");
        a.send(23, &frame, room + 1);
        assert_eq!(a.alert(), Some(22), "{records}: record_overflow");

        // 32 empty records, data, 32 more, data: relayed; then 33.
        let mut a = RawPeer::connect(addr, &mut b);
        for round in 0..2 {
            for i in 0..32 {
                a.send(23, b"", i % 4);
            }
            a.send_packet(&b.public, b"after 32 empty records");
            let (_, got) = b.recv_packet(Duration::from_secs(10)).expect("packet");
            assert_eq!(got, b"after 32 empty records", "{records} round {round}");
        }
        for _ in 0..33 {
            a.send(23, b"", 0);
        }
        a.send_packet(&b.public, b"never relayed");
        let alert = a.alert();
        match records {
            TlsRecords::Ferry => assert_eq!(alert, Some(10), "unexpected_message"),
            TlsRecords::Rustls => assert_eq!(alert, None, "rustls sends no alert"),
        }
        let mut c = connect_tls(addr);
        relay_burst(&mut b, &mut c, 5, 100);
        assert!(
            b.recv_packet(Duration::from_millis(200)).is_err(),
            "nothing more from the cut-off peer"
        );
        support::stop(server);
    }
}

ferry_testkit::per_backend!(
    both_record_layers_relay_every_size,
    a_peers_key_update_ends_ferrys_session_cleanly_and_rustls_follows_it,
    a_forged_record_gets_bad_record_mac,
    a_tls12_client_stays_on_rustls_and_relays,
    records_past_the_plaintext_and_empty_run_limits_end_the_session,
);
