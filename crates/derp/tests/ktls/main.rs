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

#[path = "../support/mod.rs"]
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

/// Set to 1 by the kernel test VM (scripts/test.d/55-vm.sh), whose kernel
/// has kTLS with every suite: a skip there is a failure.
const KTLS_REQUIRED: &str = "FERRY_REQUIRE_KTLS";

mod handoff;
mod key_update;
mod loopback;
mod nonstop;
