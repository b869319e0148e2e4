//! Kernel TLS hand-off: what can be checked without a kernel that has kTLS,
//! and the real thing where it has.
//!
//! - Key export: real rustls handshakes in memory (TLS 1.3 with each
//!   suite, TLS 1.2), handed to a [`FakeSocket`] that records the keys the
//!   kernel would get; they must be the client's keys for the opposite
//!   direction, with sequence numbers that count the records already
//!   exchanged.
//! - Refusals: while rustls holds unsent output, unread input or is still
//!   handshaking, `start` gives the connection back untouched and it keeps
//!   working.
//! - KeyUpdate: an unbuffered server and an unbuffered client, both turned
//!   into rustls `KernelConnection`s; the keys installed after the peer's
//!   KeyUpdate must be the client's next keys.
//! - Fallback on this machine's real kernel, and a real kTLS exchange over
//!   loopback (with a KeyUpdate) that runs only where the kernel has the
//!   TLS ULP and prints why it skips otherwise.

mod support;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_derp::transport::handoff::{Handoff, HandoffError, RecordBoundary, Refusal, Refused};
use ferry_derp::transport::kernel::{
    allow_kernel_tls, crypto_info, KernelSocket, KernelTls, RecordOutcome,
};
use ferry_engine::{Completion, Driver, EpollDriver};
use ferry_sys::ktls::{self as sys, Cipher, CryptoInfo, Direction, Version};
use rustls::client::UnbufferedClientConnection;
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::{PrivateKeyDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, UnbufferedStatus};
use rustls::{
    ClientConfig, ClientConnection, ConnectionTrafficSecrets, ServerConfig, ServerConnection,
    SupportedCipherSuite, SupportedProtocolVersion,
};

// ----- configurations -----

static TLS13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
static TLS12: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];

fn tls13_suites() -> [SupportedCipherSuite; 3] {
    use aws_lc_rs::cipher_suite::*;
    [
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
    ]
}

fn tls12_suites() -> [SupportedCipherSuite; 3] {
    use aws_lc_rs::cipher_suite::*;
    // rcgen's default key is ECDSA P-256.
    [
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ]
}

fn provider(suite: SupportedCipherSuite) -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![suite],
        ..aws_lc_rs::default_provider()
    })
}

fn version_of(
    suite: SupportedCipherSuite,
) -> (&'static [&'static SupportedProtocolVersion], Version) {
    if suite.tls13().is_some() {
        (TLS13, Version::Tls13)
    } else {
        (TLS12, Version::Tls12)
    }
}

fn cipher_of(suite: SupportedCipherSuite) -> Cipher {
    let name = format!("{:?}", suite.suite());
    if name.contains("AES_128_GCM") {
        Cipher::Aes128Gcm
    } else if name.contains("AES_256_GCM") {
        Cipher::Aes256Gcm
    } else {
        Cipher::Chacha20Poly1305
    }
}

/// A server configuration ready for kTLS, offering only `suite`.
fn server_config(suite: SupportedCipherSuite) -> Arc<ServerConfig> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let mut config = ServerConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(version_of(suite).0)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.cert.der().clone()],
            PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into()),
        )
        .unwrap();
    allow_kernel_tls(&mut config);
    Arc::new(config)
}

/// A client that accepts any certificate and lets its own keys be
/// exported, to compare with what the server hands the kernel.
fn client_config(suite: SupportedCipherSuite) -> Arc<ClientConfig> {
    let provider = provider(suite);
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(version_of(suite).0)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ferry_testkit::tls::Verifier::accept_any(
            provider,
        )))
        .with_no_client_auth();
    config.enable_secret_extraction = true;
    Arc::new(config)
}

fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").unwrap()
}

// ----- a socket that records what the kernel would be told -----

/// Stands in for a kTLS socket: records keys and records, and refuses
/// what it is told to refuse.
#[derive(Default)]
struct FakeSocket {
    /// `supports` answers this error.
    unsupported: Option<&'static str>,
    /// `can_rekey` answers this error.
    no_rekey: Option<&'static str>,
    /// `set_crypto_info` fails from this call on (0-based).
    fail_keys_from: Option<usize>,
    /// `send_record` answers `WouldBlock` this many times first.
    would_block: usize,
    ulp: bool,
    keys: Vec<(Direction, CryptoInfo)>,
    sent: Vec<(u8, Vec<u8>)>,
}

impl FakeSocket {
    fn calls(&self) -> usize {
        usize::from(self.ulp) + self.keys.len() + self.sent.len()
    }

    fn key(&self, nth: usize) -> &CryptoInfo {
        &self.keys[nth].1
    }
}

impl KernelSocket for FakeSocket {
    fn supports(&self, _: Version, _: Cipher) -> Result<(), &'static str> {
        self.unsupported.map_or(Ok(()), Err)
    }

    fn can_rekey(&self) -> Result<(), &'static str> {
        self.no_rekey.map_or(Ok(()), Err)
    }

    fn enable_ulp(&mut self) -> io::Result<()> {
        assert!(!self.ulp, "ULP attached twice");
        self.ulp = true;
        Ok(())
    }

    fn set_crypto_info(&mut self, dir: Direction, info: &CryptoInfo) -> io::Result<()> {
        assert!(self.ulp, "keys before the ULP");
        if self.fail_keys_from.is_some_and(|n| self.keys.len() >= n) {
            return Err(io::Error::from_raw_os_error(libc_ebusy()));
        }
        let copy = CryptoInfo::new(
            info.version(),
            info.cipher(),
            info.key(),
            &info.nonce_base(),
            info.seq(),
        )
        .unwrap();
        self.keys.push((dir, copy));
        Ok(())
    }

    fn send_record(&mut self, record_type: u8, data: &[u8]) -> io::Result<usize> {
        if self.would_block > 0 {
            self.would_block -= 1;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.sent.push((record_type, data.to_vec()));
        Ok(data.len())
    }
}

fn libc_ebusy() -> i32 {
    16
}

/// The raw parts of one direction's rustls secrets.
fn parts(secrets: &ConnectionTrafficSecrets) -> (Cipher, Vec<u8>, Vec<u8>) {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (
            Cipher::Aes128Gcm,
            key.as_ref().to_vec(),
            iv.as_ref().to_vec(),
        ),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (
            Cipher::Aes256Gcm,
            key.as_ref().to_vec(),
            iv.as_ref().to_vec(),
        ),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (
            Cipher::Chacha20Poly1305,
            key.as_ref().to_vec(),
            iv.as_ref().to_vec(),
        ),
        _ => panic!("unknown secrets"),
    }
}

/// `info` holds exactly these secrets at this sequence number.
fn assert_keys(info: &CryptoInfo, (seq, secrets): &(u64, ConnectionTrafficSecrets), what: &str) {
    let (cipher, key, iv) = parts(secrets);
    assert_eq!(info.cipher(), cipher, "{what}: cipher");
    assert_eq!(info.key(), &key[..], "{what}: key");
    assert_eq!(&info.nonce_base()[..], &iv[..], "{what}: nonce base");
    assert_eq!(info.seq(), *seq, "{what}: sequence number");
    // The kernel's field sizes for the cipher.
    let (key_len, salt_len, iv_len) = match cipher {
        Cipher::Aes128Gcm => (16, 4, 8),
        Cipher::Aes256Gcm => (32, 4, 8),
        Cipher::Chacha20Poly1305 => (32, 0, 12),
    };
    assert_eq!(
        (info.key().len(), info.salt().len(), info.iv().len()),
        (key_len, salt_len, iv_len),
        "{what}: field sizes"
    );
}

// ----- buffered connections in memory -----

/// Moves everything `from` wants to write into `to`; returns the bytes.
macro_rules! transfer {
    ($from:expr, $to:expr) => {{
        let mut wire = Vec::new();
        while $from.wants_write() {
            $from.write_tls(&mut wire).unwrap();
        }
        let mut rd = &wire[..];
        while !rd.is_empty() {
            $to.read_tls(&mut rd).unwrap();
            $to.process_new_packets().unwrap();
        }
        wire.len()
    }};
}

/// Runs the handshake to its end, both sides flushed.
fn handshake(client: &mut ClientConnection, server: &mut ServerConnection) {
    for _ in 0..20 {
        let moved = transfer!(client, server) + transfer!(server, client);
        if moved == 0 && !client.is_handshaking() && !server.is_handshaking() {
            return;
        }
    }
    panic!("handshake did not finish");
}

/// Sends each message as its own record.
fn send_each(from: &mut impl DerefConn, msgs: &[&[u8]]) {
    for m in msgs {
        from.write_all_plain(m);
    }
}

/// The two buffered connection types alike, for the helpers.
trait DerefConn {
    fn write_all_plain(&mut self, data: &[u8]);
    fn read_plain(&mut self) -> Vec<u8>;
}

impl DerefConn for ClientConnection {
    fn write_all_plain(&mut self, data: &[u8]) {
        self.writer().write_all(data).unwrap();
    }
    fn read_plain(&mut self) -> Vec<u8> {
        read_all(&mut self.reader())
    }
}

impl DerefConn for ServerConnection {
    fn write_all_plain(&mut self, data: &[u8]) {
        self.writer().write_all(data).unwrap();
    }
    fn read_plain(&mut self) -> Vec<u8> {
        read_all(&mut self.reader())
    }
}

fn read_all(r: &mut dyn Read) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    out
}

/// A finished buffered handshake with `client_records` records from the
/// client and `server_records` from the server already exchanged and read.
fn buffered_pair(
    suite: SupportedCipherSuite,
    client_records: usize,
    server_records: usize,
) -> (ClientConnection, ServerConnection) {
    let mut client = ClientConnection::new(client_config(suite), localhost()).unwrap();
    let mut server = ServerConnection::new(server_config(suite)).unwrap();
    handshake(&mut client, &mut server);
    let c: Vec<Vec<u8>> = (0..client_records)
        .map(|i| format!("c{i}").into_bytes())
        .collect();
    let s: Vec<Vec<u8>> = (0..server_records)
        .map(|i| format!("s{i}").into_bytes())
        .collect();
    send_each(
        &mut client,
        &c.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    );
    send_each(
        &mut server,
        &s.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    );
    transfer!(client, server);
    transfer!(server, client);
    assert_eq!(server.read_plain(), c.concat());
    assert_eq!(client.read_plain(), s.concat());
    (client, server)
}

fn expect_usable<C>(r: Result<KernelTls, Refused<C>>) -> (C, Refusal) {
    match r {
        Err(Refused::Usable { conn, reason }) => (conn, reason),
        Err(Refused::Dead(e)) => panic!("connection lost: {e}"),
        Ok(s) => panic!("handed over unexpectedly: {s:?}"),
    }
}

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
    let setup = ferry_derp::tls::server_config(
        &ferry_derp::tls::CertMode::SelfSigned {
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

// ----- unbuffered connections in memory, for key updates -----

/// The two unbuffered connection types alike.
trait Unbuffered {
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn handshaking(&self) -> bool;
}

impl Unbuffered for UnbufferedServerConnection {
    type Data = rustls::server::ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
}

impl Unbuffered for UnbufferedClientConnection {
    type Data = rustls::client::ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
}

/// Runs one side until it needs input: consumes `incoming`, appends its
/// output to `outgoing`, encrypts `send` once it may, collects plaintext
/// into `received`.
fn drive<C: Unbuffered>(
    conn: &mut C,
    incoming: &mut Vec<u8>,
    outgoing: &mut Vec<u8>,
    send: &mut Vec<Vec<u8>>,
    received: &mut Vec<u8>,
) {
    let mut scratch = vec![0u8; 64 * 1024];
    loop {
        let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming[..]);
        let mut stop = false;
        match state.expect("TLS state") {
            ConnectionState::EncodeTlsData(mut e) => {
                let n = e.encode(&mut scratch).unwrap();
                outgoing.extend_from_slice(&scratch[..n]);
            }
            ConnectionState::TransmitTlsData(t) => t.done(),
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(rec) = r.next_record() {
                    let rec = rec.unwrap();
                    discard += rec.discard;
                    received.extend_from_slice(rec.payload);
                }
            }
            ConnectionState::WriteTraffic(mut w) => {
                for m in send.drain(..) {
                    let n = w.encrypt(&m, &mut scratch).unwrap();
                    outgoing.extend_from_slice(&scratch[..n]);
                }
                stop = true;
            }
            ConnectionState::BlockedHandshake
            | ConnectionState::PeerClosed
            | ConnectionState::Closed => stop = true,
            other => panic!("unexpected state {other:?}"),
        }
        incoming.drain(..discard);
        if stop {
            return;
        }
    }
}

/// A finished unbuffered handshake; the client sent `c` and the server `s`
/// as application records, all read.
fn unbuffered_pair(
    suite: SupportedCipherSuite,
    c: &[&[u8]],
    s: &[&[u8]],
) -> (UnbufferedClientConnection, UnbufferedServerConnection) {
    let mut client = UnbufferedClientConnection::new(client_config(suite), localhost()).unwrap();
    let mut server = UnbufferedServerConnection::new(server_config(suite)).unwrap();
    let (mut c2s, mut s2c) = (Vec::new(), Vec::new());
    let (mut c_send, mut s_send): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (
        c.iter().map(|m| m.to_vec()).collect(),
        s.iter().map(|m| m.to_vec()).collect(),
    );
    let (mut c_got, mut s_got) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        drive(&mut client, &mut s2c, &mut c2s, &mut c_send, &mut c_got);
        drive(&mut server, &mut c2s, &mut s2c, &mut s_send, &mut s_got);
        let done = !client.handshaking() && !server.handshaking();
        if done && c2s.is_empty() && s2c.is_empty() && c_send.is_empty() && s_send.is_empty() {
            assert_eq!(s_got, c.concat());
            assert_eq!(c_got, s.concat());
            return (client, server);
        }
    }
    panic!("unbuffered exchange did not finish");
}

const KEY_UPDATE_REQUESTED: [u8; 5] = [24, 0, 0, 1, 1];
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [24, 0, 0, 1, 0];

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

// ----- over real sockets -----

fn loopback_listener() -> TcpListener {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap()
}

/// A socket that tells a [`RecordBoundary`] what rustls read from it, as
/// the shard would.
struct Tap<'a> {
    sock: &'a mut TcpStream,
    boundary: &'a mut RecordBoundary,
}

impl Read for Tap<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.boundary.feed(&buf[..n]);
        Ok(n)
    }
}

impl Write for Tap<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// Accepts one connection and finishes the server side of the handshake
/// on it with a buffered rustls connection, every byte written.
fn accept_handshake(
    listener: &TcpListener,
    config: Arc<ServerConfig>,
) -> (TcpStream, ServerConnection) {
    let (mut sock, _) = listener.accept().unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut server = ServerConnection::new(config).unwrap();
    let mut boundary = RecordBoundary::new();
    let mut tap = Tap {
        sock: &mut sock,
        boundary: &mut boundary,
    };
    while server.is_handshaking() {
        server.complete_io(&mut tap).unwrap();
    }
    while server.wants_write() {
        server.write_tls(&mut tap).unwrap();
    }
    assert!(boundary.at_boundary(), "rustls read part of a record");
    (sock, server)
}

/// The same with an unbuffered rustls connection.
fn accept_handshake_unbuffered(
    listener: &TcpListener,
    config: Arc<ServerConfig>,
) -> (TcpStream, UnbufferedServerConnection) {
    let (mut sock, _) = listener.accept().unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut server = UnbufferedServerConnection::new(config).unwrap();
    let (mut incoming, mut outgoing) = (Vec::new(), Vec::new());
    let (mut nothing, mut got) = (Vec::new(), Vec::new());
    loop {
        drive(
            &mut server,
            &mut incoming,
            &mut outgoing,
            &mut nothing,
            &mut got,
        );
        sock.write_all(&outgoing).unwrap();
        outgoing.clear();
        if !server.handshaking() {
            break;
        }
        let mut buf = [0u8; 16 * 1024];
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "client left during the handshake");
        incoming.extend_from_slice(&buf[..n]);
    }
    // Our own buffer is the record boundary check here.
    assert!(incoming.is_empty() && got.is_empty());
    (sock, server)
}

/// The client's side: handshake, wait for the server's first message (so
/// nothing of ours is read before a hand-off), then a scripted exchange.
/// Returns what it read, as text, for the server to check.
fn client_script(config: Arc<ClientConfig>, addr: SocketAddr, key_update: bool) -> Vec<String> {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut conn = ClientConnection::new(config, localhost()).unwrap();
    let mut log = Vec::new();
    let read_some = |conn: &mut ClientConnection, sock: &mut TcpStream, log: &mut Vec<String>| {
        let mut buf = [0u8; 256];
        match rustls::Stream::new(conn, sock).read(&mut buf) {
            Ok(0) => log.push("eof".to_owned()),
            Ok(n) => log.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => log.push(format!("error: {e}")),
        }
    };
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).unwrap();
    }
    read_some(&mut conn, &mut sock, &mut log); // "ready"
    rustls::Stream::new(&mut conn, &mut sock)
        .write_all(b"ping")
        .unwrap();
    if key_update {
        // A KeyUpdate asking for ours, then data under the new key.
        conn.refresh_traffic_keys().unwrap();
        rustls::Stream::new(&mut conn, &mut sock)
            .write_all(b"after update")
            .unwrap();
        read_some(&mut conn, &mut sock, &mut log); // "pong", or the end
    }
    conn.send_close_notify();
    let _ = conn.complete_io(&mut sock);
    read_some(&mut conn, &mut sock, &mut log); // the server's close_notify
    log
}

#[test]
fn fallback_on_this_kernel_keeps_the_connection_in_userspace() {
    let suite = tls13_suites()[0];
    let listener = loopback_listener();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || client_script(client_config(suite), addr, false));
    let (mut sock, server) = accept_handshake(&listener, server_config(suite));

    let mut server = match (
        sys::tls_ulp_available(),
        KernelTls::start(server, sock.as_fd()),
    ) {
        (Err(reason), Err(Refused::Usable { conn, reason: got })) => {
            println!("kernel TLS unavailable, staying in userspace: {got}");
            assert!(matches!(got, Refusal::Kernel(r) if r == reason), "{got}");
            conn
        }
        (Ok(()), Ok(_)) => {
            drop(sock);
            let _ = client.join();
            return ferry_testkit::skip_expected!(
                "this kernel has kTLS, so there is no fallback to test here"
            );
        }
        (probe, other) => panic!("probe says {probe:?} but start gave {other:?}"),
    };

    // The same connection goes on with rustls over the socket.
    server.writer().write_all(b"ready").unwrap();
    server.complete_io(&mut sock).unwrap();
    let mut got = Vec::new();
    while got.len() < 4 {
        server.complete_io(&mut sock).unwrap();
        got.extend(read_all(&mut server.reader()));
    }
    assert_eq!(got, b"ping");
    // The client's close_notify, then ours.
    while !server.process_new_packets().unwrap().peer_has_closed() {
        server.read_tls(&mut sock).unwrap();
    }
    server.send_close_notify();
    server.complete_io(&mut sock).unwrap();
    assert_eq!(client.join().unwrap(), vec!["ready", "eof"]);
}

#[derive(Debug, PartialEq)]
enum Event {
    Data(Vec<u8>),
    Record(u8, Vec<u8>),
    Closed(Option<io::ErrorKind>),
}

/// Reads one connection through the epoll driver, one event at a time.
struct Reader {
    d: EpollDriver,
    pending: std::collections::VecDeque<Event>,
    /// Sends the driver reported finished.
    sent: usize,
}

impl Reader {
    fn next(&mut self) -> Event {
        let start = Instant::now();
        while self.pending.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no event within 10 s"
            );
            self.turn();
        }
        self.pending.pop_front().unwrap()
    }

    /// One driver turn, its completions noted.
    fn turn(&mut self) {
        let (pending, sent) = (&mut self.pending, &mut self.sent);
        self.d
            .turn(Some(Duration::from_millis(20)), &mut |c| match c {
                Completion::Received { data, .. } => pending.push_back(Event::Data(data.to_vec())),
                Completion::Sent { .. } => *sent += 1,
                Completion::Record {
                    record_type, data, ..
                } => pending.push_back(Event::Record(record_type, data.to_vec())),
                Completion::RecvClosed { error, .. } => {
                    pending.push_back(Event::Closed(error.map(|e| e.kind())))
                }
                _ => {}
            })
            .unwrap();
    }

    /// Application data until `len` bytes arrived.
    fn data(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < len {
            match self.next() {
                Event::Data(b) => out.extend(b),
                other => panic!("expected data, got {other:?}"),
            }
        }
        out
    }
}

/// Set to 1 by the kernel test VM (scripts/test.d/55-vm.sh), whose kernel
/// has kTLS with every suite: a skip there is a failure.
const KTLS_REQUIRED: &str = "FERRY_REQUIRE_KTLS";

#[test]
fn real_kernel_tls_over_loopback() {
    if let Err(reason) = sys::tls_ulp_available() {
        return ferry_testkit::skip_unless_required!(KTLS_REQUIRED, "{reason}");
    }
    let supported = |suite: SupportedCipherSuite| match sys::kernel_supports(
        version_of(suite).1,
        cipher_of(suite),
    ) {
        Ok(()) => true,
        Err(reason) => {
            ferry_testkit::skip_unless_required!(KTLS_REQUIRED, "{suite:?}: {reason}");
            false
        }
    };
    for suite in tls13_suites() {
        if supported(suite) {
            real_exchange(suite, true, true);
        }
    }
    // A buffered session cannot follow a KeyUpdate and says goodbye.
    real_exchange(tls13_suites()[0], false, true);
    for suite in tls12_suites() {
        if supported(suite) {
            real_exchange(suite, false, false);
        }
    }
}

/// One connection through kTLS both ways: plaintext written to the socket
/// reaches the rustls client, the client's records arrive as plaintext
/// through the epoll driver, a KeyUpdate is followed (TLS 1.3 from an
/// unbuffered server, where the kernel can rekey) or answered with a clean
/// close, and close_notify ends it.
fn real_exchange(suite: SupportedCipherSuite, unbuffered: bool, key_update: bool) {
    let listener = loopback_listener();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || client_script(client_config(suite), addr, key_update));
    let what = format!("{suite:?}, unbuffered: {unbuffered}");
    let (mut sock, mut session) = if unbuffered {
        let (sock, server) = accept_handshake_unbuffered(&listener, server_config(suite));
        assert!(server.ready().is_ok());
        let session = KernelTls::start(server, sock.as_fd())
            .unwrap_or_else(|r| panic!("{what}: hand-off refused: {r:?}"));
        (sock, session)
    } else {
        let (sock, server) = accept_handshake(&listener, server_config(suite));
        assert!(server.ready().is_ok());
        let session = KernelTls::start(server, sock.as_fd())
            .unwrap_or_else(|r| panic!("{what}: hand-off refused: {r:?}"));
        (sock, session)
    };
    assert_eq!(session.can_rekey(), unbuffered && key_update);
    // The kernel encrypts a plain write.
    sock.write_all(b"ready").unwrap();

    let mut d = EpollDriver::new().unwrap();
    d.attach(0, sock).unwrap();
    d.set_ktls_rx(0).unwrap();
    let mut r = Reader {
        d,
        pending: Default::default(),
        sent: 0,
    };
    assert_eq!(r.data(4), b"ping", "{what}");

    let mut rekeyed = false;
    if key_update {
        match r.next() {
            Event::Record(22, msg) => {
                assert_eq!(msg, KEY_UPDATE_REQUESTED, "{what}");
                match session.on_record(r.d.fd(0).unwrap(), 22, &msg) {
                    Ok(RecordOutcome::KeyUpdated) => rekeyed = true,
                    Err(HandoffError::CannotRekey(reason)) => {
                        println!("{what}: KeyUpdate not followed: {reason}");
                        assert!(
                            !unbuffered || sys::kernel_can_rekey().is_err(),
                            "{what}: {reason}"
                        );
                    }
                    other => panic!("{what}: KeyUpdate: {other:?}"),
                }
            }
            other => panic!("{what}: expected the client's KeyUpdate, got {other:?}"),
        }
        if rekeyed {
            assert!(!session.key_update_due());
            assert_eq!(r.data(12), b"after update", "{what}");
            r.d.send(0, b"pong".to_vec());
            session.note_sent(4).unwrap();
        }
    }
    if !key_update || rekeyed {
        match r.next() {
            Event::Record(21, alert) => assert_eq!(
                session.on_record(r.d.fd(0).unwrap(), 21, &alert).unwrap(),
                RecordOutcome::Closed,
                "{what}"
            ),
            other => panic!("{what}: expected close_notify, got {other:?}"),
        }
    }
    session.send_close_notify(r.d.fd(0).unwrap()).unwrap();
    // Let the pending send (the pong) finish before closing, and keep
    // reading for a moment: what the client sent after its KeyUpdate must
    // leave our receive queue, or closing the socket sends a reset instead
    // of a FIN and the client's last read fails with a broken pipe instead
    // of the end of the stream it checks for.
    let start = Instant::now();
    while r.sent < usize::from(rekeyed) || start.elapsed() < Duration::from_millis(200) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: the pong was not sent within 10 s"
        );
        r.turn();
    }
    r.d.close(0);
    let log = client.join().unwrap();
    let expected: Vec<&str> = match (key_update, rekeyed) {
        (false, _) => vec!["ready", "eof"],
        (true, true) => vec!["ready", "pong", "eof"],
        // We said goodbye instead of following the update.
        (true, false) => vec!["ready", "eof", "eof"],
    };
    assert_eq!(log, expected, "{what}");
}

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
            !record_ends(&wire).contains(&cut),
            "a write ending inside a record"
        );
        tcp.write_all(&wire[..cut]).expect("the relay reads on");
        wire.drain(..cut);
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
