//! Public behaviour of `ferry_derp::certs`: certificate sources, the served
//! chain and its meta-certificate, SNI policy, protocol versions, and reload.
//!
//! Handshakes run between a rustls client and the server configuration
//! through in-memory buffers, so no sockets or sleeps are involved.

use std::fs;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ferry_derp::certs::{self, CertError, CertMode, CertSetup};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::version::{TLS12, TLS13};
use rustls::{
    ClientConfig, ClientConnection, ProtocolVersion, RootCertStore, ServerConfig, ServerConnection,
    SupportedProtocolVersion,
};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The server's DERP public key used throughout: bytes 0x00..0x1f.
const SERVER_KEY: [u8; 32] = {
    let mut k = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        k[i] = i as u8;
        i += 1;
    }
    k
};
const SERVER_KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

const HOST: &str = "derp.example.com";

// ---------------------------------------------------------------------------
// Fixtures

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "ferry-certs-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A test certificate authority.
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Ferry test CA");
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// Issues a leaf for `names`; returns (chain PEM: leaf then CA, key PEM,
    /// leaf DER).
    fn issue(&self, names: &[&str]) -> (String, String, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let leaf = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        let chain = format!("{}{}", leaf.pem(), self.cert.pem());
        (chain, key.serialize_pem(), leaf.der().clone())
    }
}

fn write_files(dir: &Path, base: &str, cert_pem: &str, key_pem: &str) {
    fs::write(dir.join(format!("{base}.crt")), cert_pem).unwrap();
    fs::write(dir.join(format!("{base}.key")), key_pem).unwrap();
}

/// Moves a file's mtime forward so the reloader's stamp certainly differs,
/// whatever the file system's timestamp granularity.
fn bump_mtime(path: &Path, by_secs: u64) {
    let file = fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() + Duration::from_secs(by_secs))
        .unwrap();
}

fn manual(dir: &Path, hostname: &str) -> Result<CertSetup, CertError> {
    certs::server_config(
        &CertMode::Manual {
            certdir: dir.to_owned(),
            hostname: hostname.to_owned(),
        },
        SERVER_KEY,
    )
}

fn self_signed(hostname: &str) -> CertSetup {
    certs::server_config(
        &CertMode::SelfSigned {
            hostname: hostname.to_owned(),
            certdir: None,
        },
        SERVER_KEY,
    )
    .unwrap()
}

/// A manual-mode set-up for `HOST` from a fresh CA; returns the set-up, the
/// CA, the temp dir and the leaf.
fn manual_setup() -> (CertSetup, Ca, TempDir, CertificateDer<'static>) {
    let dir = TempDir::new();
    let ca = Ca::new();
    let (chain, key, leaf) = ca.issue(&[HOST]);
    write_files(dir.path(), HOST, &chain, &key);
    let setup = manual(dir.path(), HOST).unwrap();
    (setup, ca, dir, leaf)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

// ---------------------------------------------------------------------------
// Clients

/// A client that validates against `ca` the usual WebPKI way, offering `h2`
/// and `http/1.1` over ALPN (the server must pick neither).
fn webpki_client(
    ca: &CertificateDer<'static>,
    versions: &[&'static SupportedProtocolVersion],
) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// A client that pins like Tailscale's `CertName = "sha256-raw:<hex>"`:
/// among the presented certificates, ignoring those whose subject CN starts
/// with `derpkey`, exactly one must hash to the pin and be within its
/// validity period.
fn pinning_client(cert_name: &str, versions: &[&'static SupportedProtocolVersion]) -> ClientConfig {
    let hex = cert_name
        .strip_prefix("sha256-raw:")
        .expect("sha256-raw prefix");
    assert_eq!(hex.len(), 64);
    let pin = hex.to_owned();
    let verifier =
        ferry_testkit::tls::Verifier::new(provider(), move |end_entity, intermediates| {
            let mut non_meta = 0;
            let mut matched = false;
            for der in std::iter::once(end_entity).chain(intermediates) {
                let (_, cert) = X509Certificate::from_der(der)
                    .map_err(|_| rustls::Error::General("unparseable certificate".into()))?;
                if common_name(&cert).starts_with("derpkey") {
                    continue;
                }
                non_meta += 1;
                if hex_lower(&Sha256::digest(der.as_ref())) == pin && cert.validity().is_valid() {
                    matched = true;
                }
            }
            if non_meta == 1 && matched {
                Ok(())
            } else {
                Err(rustls::Error::General(format!(
                    "pin check failed: {non_meta} non-meta certs, matched={matched}"
                )))
            }
        });
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth()
}

// ---------------------------------------------------------------------------
// In-memory handshake

/// Which side of a failed handshake reported the error.
#[derive(Debug)]
enum Failed {
    Client(rustls::Error),
    Server(rustls::Error),
}

/// Asserts the server aborted because its resolver offered no certificate.
fn assert_no_certificate_resolved(err: Failed) {
    match err {
        Failed::Server(rustls::Error::General(msg)) => {
            assert!(msg.contains("no server certificate"), "{msg}")
        }
        other => panic!("expected the server to refuse, got {other:?}"),
    }
}

/// Moves every pending TLS record from one side to the other.
fn pump(from: &mut dyn FnMut(&mut Vec<u8>) -> bool, to: &mut dyn FnMut(&[u8])) {
    let mut buf = Vec::new();
    while from(&mut buf) {}
    if !buf.is_empty() {
        to(&buf);
    }
}

/// Runs a handshake between `client` and `server`, addressing the server as
/// `name`; returns both connections once neither is handshaking.
fn handshake(
    server: &Arc<ServerConfig>,
    client: ClientConfig,
    name: &str,
) -> Result<(ClientConnection, ServerConnection), Failed> {
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let mut c = ClientConnection::new(Arc::new(client), name).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    for _ in 0..16 {
        transfer_client_to_server(&mut c, &mut s);
        s.process_new_packets().map_err(Failed::Server)?;
        transfer_server_to_client(&mut s, &mut c);
        c.process_new_packets().map_err(Failed::Client)?;
        if !c.is_handshaking() && !s.is_handshaking() {
            // Deliver anything still in flight (e.g. would-be tickets).
            transfer_server_to_client(&mut s, &mut c);
            c.process_new_packets().map_err(Failed::Client)?;
            return Ok((c, s));
        }
    }
    panic!("handshake did not finish");
}

fn transfer_client_to_server(c: &mut ClientConnection, s: &mut ServerConnection) {
    pump(
        &mut |buf| c.wants_write() && c.write_tls(buf).unwrap() > 0,
        &mut |mut bytes| {
            while !bytes.is_empty() {
                s.read_tls(&mut bytes).unwrap();
            }
        },
    );
}

fn transfer_server_to_client(s: &mut ServerConnection, c: &mut ClientConnection) {
    pump(
        &mut |buf| s.wants_write() && s.write_tls(buf).unwrap() > 0,
        &mut |mut bytes| {
            while !bytes.is_empty() {
                c.read_tls(&mut bytes).unwrap();
            }
        },
    );
}

/// Sends an HTTP-like request and answer across an established session.
fn exchange_data(c: &mut ClientConnection, s: &mut ServerConnection) {
    c.writer().write_all(b"GET /derp HTTP/1.1\r\n\r\n").unwrap();
    transfer_client_to_server(c, s);
    s.process_new_packets().unwrap();
    let mut got = vec![0u8; 64];
    let n = s.reader().read(&mut got).unwrap();
    assert_eq!(&got[..n], b"GET /derp HTTP/1.1\r\n\r\n");

    s.writer()
        .write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
        .unwrap();
    transfer_server_to_client(s, c);
    c.process_new_packets().unwrap();
    let n = c.reader().read(&mut got).unwrap();
    assert_eq!(&got[..n], b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
}

fn served_chain(c: &ClientConnection) -> Vec<CertificateDer<'static>> {
    c.peer_certificates()
        .expect("server sent certificates")
        .to_vec()
}

// ---------------------------------------------------------------------------
// Certificate inspection

fn parse<'a>(der: &'a CertificateDer<'_>) -> X509Certificate<'a> {
    let (rest, cert) = X509Certificate::from_der(der.as_ref()).expect("well-formed X.509");
    assert!(rest.is_empty(), "trailing bytes after certificate");
    cert
}

fn common_name(cert: &X509Certificate<'_>) -> String {
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_name(der: &CertificateDer<'_>) -> String {
    format!("sha256-raw:{}", hex_lower(&Sha256::digest(der.as_ref())))
}

/// SANs of a certificate as strings: DNS names as-is, IPs formatted.
fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    let ext = cert
        .subject_alternative_name()
        .unwrap()
        .expect("subjectAltName present");
    ext.value
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::DNSName(dns) => dns.to_string(),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).unwrap()).to_string(),
                16 => IpAddr::from(<[u8; 16]>::try_from(*bytes).unwrap()).to_string(),
                _ => panic!("bad IP SAN"),
            },
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect()
}

/// Asserts everything `docs/derp-protocol.md` §4.1 requires of the
/// meta-certificate.
fn assert_meta_certificate(der: &CertificateDer<'_>) {
    const ED25519_OID: &str = "1.3.101.112";
    let cert = parse(der);

    assert_eq!(common_name(&cert), format!("derpkey{SERVER_KEY_HEX}"));
    assert_eq!(cert.subject().iter().count(), 1, "subject is the CN alone");
    assert_eq!(cert.issuer(), cert.subject(), "self-signed");
    // Minimal DER for 2 is the single byte 0x02; Go rejects padded
    // serials.
    assert_eq!(cert.raw_serial(), &[2]);
    assert_eq!(cert.version(), x509_parser::x509::X509Version::V3);
    assert_eq!(
        cert.public_key().algorithm.algorithm.to_id_string(),
        ED25519_OID
    );
    assert_eq!(
        cert.signature_algorithm.algorithm.to_id_string(),
        ED25519_OID
    );

    let bc = cert
        .basic_constraints()
        .unwrap()
        .expect("basicConstraints present");
    assert!(!bc.value.ca);

    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let thirty_days = 30 * 24 * 3600;
    let not_before = cert.validity().not_before.timestamp();
    let not_after = cert.validity().not_after.timestamp();
    assert!(
        (not_before - (now - thirty_days)).abs() < 300,
        "{not_before}"
    );
    assert!((not_after - (now + thirty_days)).abs() < 300, "{not_after}");

    // The same parser rustls clients use must accept it too.
    rustls::server::ParsedCertificate::try_from(der).expect("webpki parses the meta cert");
}

// ---------------------------------------------------------------------------
// Manual mode

#[test]
fn manual_mode_serves_file_chain_then_meta_over_tls12_and_tls13() {
    let (setup, ca, _dir, leaf) = manual_setup();
    assert_eq!(setup.cert_name, None, "CA-issued leaf is not pinned");
    let reloader = setup.reloader.as_ref().expect("manual files are watched");
    assert!(reloader.cert_path().ends_with("derp.example.com.crt"));
    assert!(reloader.key_path().ends_with("derp.example.com.key"));

    for (version, expected) in [
        (&TLS13, ProtocolVersion::TLSv1_3),
        (&TLS12, ProtocolVersion::TLSv1_2),
    ] {
        let client = webpki_client(&ca.der(), &[version]);
        let (mut c, mut s) = handshake(&setup.config, client, HOST).unwrap();
        assert_eq!(c.protocol_version(), Some(expected));
        assert_eq!(c.alpn_protocol(), None, "h2 must never be negotiated");
        assert_eq!(s.server_name(), Some(HOST));

        let chain = served_chain(&c);
        assert_eq!(chain.len(), 3, "leaf, intermediate from the file, meta");
        assert_eq!(chain[0], leaf);
        assert_eq!(chain[1], ca.der());
        assert_meta_certificate(&chain[2]);

        exchange_data(&mut c, &mut s);
    }
}

#[test]
fn config_has_no_alpn_and_no_tls13_tickets() {
    let (setup, ca, _dir, _) = manual_setup();
    assert!(setup.config.alpn_protocols.is_empty());
    assert_eq!(setup.config.send_tls13_tickets, 0);
    let (c, _s) = handshake(&setup.config, webpki_client(&ca.der(), &[&TLS13]), HOST).unwrap();
    assert_eq!(c.tls13_tickets_received(), 0);
}

#[test]
fn manual_mode_sni_must_match_hostname_when_present() {
    let (setup, ca, _dir, _) = manual_setup();

    // Another name: the server refuses before sending any certificate.
    for (version, name) in [(&TLS13, "other.example.com"), (&TLS12, "example.com")] {
        let err = handshake(&setup.config, webpki_client(&ca.der(), &[version]), name).unwrap_err();
        assert_no_certificate_resolved(err);
    }

    // The same name in other case is accepted.
    handshake(
        &setup.config,
        webpki_client(&ca.der(), &[&TLS13]),
        "DERP.Example.COM",
    )
    .unwrap();

    // No SNI at all (as when dialling an IP literal) is accepted.
    let mut client = webpki_client(&ca.der(), &[&TLS13]);
    client.enable_sni = false;
    let (c, s) = handshake(&setup.config, client, HOST).unwrap();
    assert_eq!(s.server_name(), None);
    assert_eq!(served_chain(&c).len(), 3);
}

#[test]
fn selfsigned_with_a_certdir_keeps_its_certificate_per_hostname() {
    let dir = TempDir::new();
    let certdir = dir.path().join("certs");
    let setup = |hostname: &str| {
        certs::server_config(
            &CertMode::SelfSigned {
                hostname: hostname.into(),
                certdir: Some(certdir.clone()),
            },
            SERVER_KEY,
        )
        .unwrap()
    };
    let first = setup(HOST);
    let name = first.cert_name.clone().unwrap();
    let key = certdir.join(format!("{HOST}.selfsigned.key"));
    assert!(certdir.join(format!("{HOST}.selfsigned.crt")).is_file());
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A restart serves the same certificate, so the pin holds.
    let again = setup(HOST);
    assert_eq!(again.cert_name.as_deref(), Some(name.as_str()));
    let client = pinning_client(&name, &[&TLS13]);
    let (c, _s) = handshake(&again.config, client, HOST).unwrap();
    assert_eq!(sha256_name(&served_chain(&c)[0]), name);
    // Another hostname gets its own, kept as well.
    let other = setup("other.example.com");
    let other_name = other.cert_name.clone().unwrap();
    assert_ne!(other_name, name);
    assert_eq!(setup("other.example.com").cert_name, Some(other_name));
    // A kept certificate for another hostname is replaced, not served.
    fs::copy(
        certdir.join("other.example.com.selfsigned.crt"),
        certdir.join(format!("{HOST}.selfsigned.crt")),
    )
    .unwrap();
    fs::copy(certdir.join("other.example.com.selfsigned.key"), &key).unwrap();
    let replaced = setup(HOST);
    let replaced_name = replaced.cert_name.clone().unwrap();
    assert_ne!(replaced_name, name);
    assert_ne!(replaced_name, other.cert_name.clone().unwrap());
    // Unreadable garbage is an error naming the file, not overwritten.
    fs::write(&key, "not a key").unwrap();
    let err = certs::server_config(
        &CertMode::SelfSigned {
            hostname: HOST.into(),
            certdir: Some(certdir.clone()),
        },
        SERVER_KEY,
    )
    .unwrap_err();
    assert!(err.to_string().contains(".selfsigned.key"), "{err}");
}

#[test]
fn manual_ip_hostname_without_files_generates_persists_and_pins() {
    let dir = TempDir::new();
    let certdir = dir.path().join("not-yet-created");
    let setup = manual(&certdir, "127.0.0.1").unwrap();
    let cert_name = setup.cert_name.clone().expect("generated cert is pinned");

    // Saved under derper's names, key readable by the owner only.
    let crt = certdir.join("127.0.0.1.crt");
    let key = certdir.join("127.0.0.1.key");
    assert!(crt.is_file());
    let mode = fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(setup.reloader.is_some(), "saved files are watched");

    // Clients dialling the IP send no SNI and pin the leaf.
    for version in [&TLS13, &TLS12] {
        let client = pinning_client(&cert_name, &[version]);
        let (c, _s) = handshake(&setup.config, client, "127.0.0.1").unwrap();
        let chain = served_chain(&c);
        assert_eq!(chain.len(), 2, "self-signed leaf and meta only");
        assert_eq!(sha256_name(&chain[0]), cert_name);
        let leaf = parse(&chain[0]);
        assert_eq!(sans(&leaf), ["127.0.0.1"]);
        assert_meta_certificate(&chain[1]);
    }

    // An IP hostname has no SNI policy: any name is served.
    let client = pinning_client(&cert_name, &[&TLS13]);
    handshake(&setup.config, client, "whatever.example.net").unwrap();

    // The next start loads the saved files: same pin.
    let again = manual(&certdir, "127.0.0.1").unwrap();
    assert_eq!(again.cert_name.as_deref(), Some(cert_name.as_str()));
}

#[test]
fn manual_ipv6_hostname_uses_derper_file_name() {
    let dir = TempDir::new();
    let setup = manual(dir.path(), "::1").unwrap();
    assert!(setup.cert_name.is_some());
    // derper strips characters outside [A-Za-z0-9.-] from the file name.
    assert!(dir.path().join("1.crt").is_file());
    assert!(dir.path().join("1.key").is_file());
    let (c, _) = handshake(
        &setup.config,
        pinning_client(setup.cert_name.as_ref().unwrap(), &[&TLS13]),
        "::1",
    )
    .unwrap();
    assert_eq!(sans(&parse(&served_chain(&c)[0])), ["::1"]);
}

#[test]
fn manual_ip_hostname_with_only_one_file_is_an_error() {
    let dir = TempDir::new();
    let ca = Ca::new();
    let (_, key, _) = ca.issue(&["127.0.0.1"]);
    fs::write(dir.path().join("127.0.0.1.key"), key).unwrap();
    let err = manual(dir.path(), "127.0.0.1").unwrap_err();
    match &err {
        CertError::Io { path, source } => {
            assert!(path.ends_with("127.0.0.1.crt"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("127.0.0.1.crt"), "{err}");
}

#[test]
fn manual_mode_errors_name_the_file_and_problem() {
    let ca = Ca::new();

    // DNS hostname, no files: no generation, the missing file is named.
    let dir = TempDir::new();
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("derp.example.com.crt"), "{err}");

    // Certificate file without a CERTIFICATE block.
    let (chain, key, _) = ca.issue(&[HOST]);
    write_files(dir.path(), HOST, "not pem at all\n", &key);
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::NoCertificate { .. }), "{err:?}");
    assert!(err.to_string().contains("derp.example.com.crt"), "{err}");

    // Truncated PEM.
    write_files(dir.path(), HOST, &chain[..chain.len() / 3], &key);
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::Pem { .. }), "{err:?}");
    assert!(err.to_string().contains("derp.example.com.crt"), "{err}");

    // Key file holding a certificate instead of a key.
    write_files(dir.path(), HOST, &chain, &chain);
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::NoPrivateKey { .. }), "{err:?}");
    assert!(err.to_string().contains("derp.example.com.key"), "{err}");

    // Key of another certificate.
    let (_, other_key, _) = ca.issue(&[HOST]);
    write_files(dir.path(), HOST, &chain, &other_key);
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("derp.example.com.key") && msg.contains("derp.example.com.crt"));

    // Certificate for another name.
    let (wrong_chain, wrong_key, _) = ca.issue(&["other.example.com"]);
    write_files(dir.path(), HOST, &wrong_chain, &wrong_key);
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::NameMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("derp.example.com.crt"), "{err}");

    // Leaf that is not X.509.
    let junk = "-----BEGIN CERTIFICATE-----\nAAECAwQF\n-----END CERTIFICATE-----\n";
    write_files(dir.path(), HOST, junk, &key);
    let err = manual(dir.path(), HOST).unwrap_err();
    assert!(matches!(err, CertError::BadCertificate { .. }), "{err:?}");

    // Empty hostname.
    let err = manual(dir.path(), "").unwrap_err();
    assert!(matches!(err, CertError::InvalidHostname { .. }), "{err:?}");
}

const RSA_PKCS1_KEY: &str = r"-----BEGIN RSA PRIVATE KEY-----
MIIEowIBAAKCAQEAsYKwPrF4bINVeTyDf+lULf1WrHVYrfGXS6UTO+RVaOGPtbZS
mNkzkLmzC1USuOa3ss9itCe7KE0vql+W2/3HG2t12JEMbYnscT2o3hhwR+uNB28C
hL2qyD5rF3FTU2y8tt19w3zFXIGGZuOx/wubnhkvAR7AUvOQGtVldypi0yZ0n3ja
L9oHwqtKIrB2Gs0gwQpJMorzusZAWyIpYnJSv8YJpzgjRuuVnYa9eDBUXkICckV9
co4cdX2mnvNy9lm4e6s3miM4W5x4kq5ZOjfH2PjpSwFSy/BSzTpai4oHmRkPgset
h4nC90u7goYsS9kRd6ARAitDQzhs35nRMNftTQIDAQABAoIBACvoMhUHy8w3fiRj
UfmJKt/HSrGUww8fc3dsCQJm+7NaG7RsOSkCjK0vKbjTXbKrquOJRZZfP317/h7L
zyJyNtYy8e7UDfloRLpL8KGi9N7tRjCBBmP0EDLAsbeWOfCoNFOdHLcGfUDg7vAz
QPtfkSn9e7FwvEyoX0wr3ZGow9ILRu++syvL3QwteLsXcthhGg4UdcqIPMkhpHTL
VAHGQCwD2fpdhNqkQd/BE9ceCnWD4+LkGBQnpYkirQILCa6zYUSJ96NmiM7SjfPR
V3PVnht2PrnLw45Q4arioyX4OdvLJSsMrkmsy9jxy0T8CFmcixn4ozE2/pQaMEtc
+F1mCFcCgYEA4QohdRKS5mT9SZ5utYDVO7NFD1SzNU5mpxmPOD7hHr2Dpfw2RjEG
PFs5cNLBKOnnhWo5INQBBvwUruTdZ44vo5b8lwixtaw3IneN0lbLELt6TCy1W9+/
sVz7Ip4IyZcUKrc5F2rC+cRdJJQtf8D96e1wHaHXiUg4tElhRNZ6cQsCgYEAye6W
y1Je7H4uB/Yv5G/NzTRj3G6T/39POIGLOQH9JNgV90RFXTKOmgfZBxAEljWIyvQq
io4ViqPpVynvEttoP4ylBdJ3Fvn6EjeYhx9a5w8mUP/HRcuwxua9OWMIWvp6b5kQ
Tm0D+PuBxRJQ+lcvgVuewRqiCx6TGIYXxJNOQgcCgYEA04VSLVhn+2axLKFeLfwK
cTLvlplmWJR4qFe95oAz2VEIjNujqBYsZk7YjtOJ+4rfsudFCzY6QPZv+nPkJ5Hd
9UXV5aCmaLyWli8JfstV00Rkj3T2goStCWj8JG2mlNUMf5n4b6pJ2bpYUil1Gr+r
6lTjLPcSQFdB9TOD2dA/BkECgYAo3acYyLe7JqIMLG9uzI2avMKE5r/+0fXnWpgh
VlyzqyNu4hsjjEq9s17hhgVXnMftQtKlLbIAV8GuSSc/6rVDPyRadEhzlu1b6HJu
zhKodjFr7QeYAWvqJOIgjgEv4EcM9K4PIRLPvZ56koVe1GwhwrfzHn+yvmJIcUK4
HpOU2wKBgFyT1s9dVXfBM6QHpPaQoKhTZfzH6Nqh+aGiqnX/WQriW2AhB9aFLSb3
4GnvqrmqwaL17meYuhYWmeFIYqm1XqMb/IFvRa6L9J5NV/ejTaIuec66zh1I3wlJ
9xB/CldDJdFgruo0W8BIk/8u7G65aydaHvj/OQlUDvDg7hn5o95u
-----END RSA PRIVATE KEY-----
";
const RSA_CERT: &str = r"-----BEGIN CERTIFICATE-----
MIIDMDCCAhigAwIBAgIURl4tK2wPcUbf2FNxbiZIMPm44DAwDQYJKoZIhvcNAQEL
BQAwGjEYMBYGA1UEAwwPcnNhLmV4YW1wbGUuY29tMCAXDTI2MTEyMTAxNTg1NloY
DzIxMjYxMDI4MDE1ODU2WjAaMRgwFgYDVQQDDA9yc2EuZXhhbXBsZS5jb20wggEi
MA0GCSqGSIb3DQEBAQUAA4IBDwAwggEKAoIBAQCxgrA+sXhsg1V5PIN/6VQt/Vas
dVit8ZdLpRM75FVo4Y+1tlKY2TOQubMLVRK45reyz2K0J7soTS+qX5bb/ccba3XY
kQxtiexxPajeGHBH640HbwKEvarIPmsXcVNTbLy23X3DfMVcgYZm47H/C5ueGS8B
HsBS85Aa1WV3KmLTJnSfeNov2gfCq0oisHYazSDBCkkyivO6xkBbIiliclK/xgmn
OCNG65Wdhr14MFReQgJyRX1yjhx1faae83L2Wbh7qzeaIzhbnHiSrlk6N8fY+OlL
AVLL8FLNOlqLigeZGQ+Cx62HicL3S7uChixL2RF3oBECK0NDOGzfmdEw1+1NAgMB
AAGjbDBqMB0GA1UdDgQWBBSB8S1lW57uLu0aTcUzS+NAmN3G7jAfBgNVHSMEGDAW
gBSB8S1lW57uLu0aTcUzS+NAmN3G7jAaBgNVHREEEzARgg9yc2EuZXhhbXBsZS5j
b20wDAYDVR0TAQH/BAIwADANBgkqhkiG9w0BAQsFAAOCAQEAf5T7bZjk26NL2qts
uW00rgIKcBtKB5sfAeG2wqCJxMbXEqbyoBpnan9mLDHkvHN0y1D1YVmLP33ZmMJI
y3h7FdbD8jrgLHyYVx75nyY+TMf/3dIHwI/y2Hjtmh8w73E2D02DlQJAaU0f84+h
jDUlF1VODGXGAovCJ8lgHVbhsesb9lbnI+vd4Cj7mj4TrOd9ieU0nFhoU0Dmoojy
WF1I3W9Zwpyp2+pY2Il6tBcg/ZyMEoBUM6VcVIwBOf+czmK7tetzaTNVNgmVAYm7
QJsdrNZ1s7uYQZgp6sFdlLyZ2yhvi26Ebl5uTaSRT9nBNoVDs8/l5P1l6DJusYOH
cw3rhg==
-----END CERTIFICATE-----
";
const EC_SEC1_KEY: &str = r"-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIEQQPw72POtY8jGByZQctKBzSouUfmixwhseLrobZkovoAoGCCqGSM49
AwEHoUQDQgAEj0Ypu2f5l0R3KFi7W0cnlAFLW9UGwI2RS9f29ivRsOToep22EW7R
k2+LztzzJqCDc7JEbbfkbds0KMir4U1wQw==
-----END EC PRIVATE KEY-----
";
const EC_CERT: &str = r"-----BEGIN CERTIFICATE-----
MIIBojCCAUegAwIBAgIUMEZGbpVzXlptN/4z3Ao4RuNHyLQwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOZWMuZXhhbXBsZS5jb20wIBcNMjYxMTIxMDE1ODU2WhgPMjEy
NjEwMjgwMTU4NTZaMBkxFzAVBgNVBAMMDmVjLmV4YW1wbGUuY29tMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEj0Ypu2f5l0R3KFi7W0cnlAFLW9UGwI2RS9f29ivR
sOToep22EW7Rk2+LztzzJqCDc7JEbbfkbds0KMir4U1wQ6NrMGkwHQYDVR0OBBYE
FBoyuJjxg4UKPYcRxfidSyHOifBsMB8GA1UdIwQYMBaAFBoyuJjxg4UKPYcRxfid
SyHOifBsMBkGA1UdEQQSMBCCDmVjLmV4YW1wbGUuY29tMAwGA1UdEwEB/wQCMAAw
CgYIKoZIzj0EAwIDSQAwRgIhAN4VMaXT4o8Moxv6qkaqdclL9g+mCqZ8AcnKumzJ
AksiAiEA4gmjUEcEUPtbHqw792XeTwfxGAm4YNkSX4B4Y4ZFtpQ=
-----END CERTIFICATE-----
";

#[test]
fn manual_mode_reads_pkcs1_rsa_and_sec1_ec_keys() {
    // Fixtures made once with `openssl genrsa -traditional` and
    // `openssl ecparam -genkey -noout`: self-signed, valid for a century.
    for (host, cert, key) in [
        ("rsa.example.com", RSA_CERT, RSA_PKCS1_KEY),
        ("ec.example.com", EC_CERT, EC_SEC1_KEY),
    ] {
        let first_line = key.lines().next().unwrap();
        assert!(!first_line.contains("BEGIN PRIVATE KEY"), "not PKCS#8");
        let dir = TempDir::new();
        write_files(dir.path(), host, cert, key);
        let setup = manual(dir.path(), host).unwrap();
        // Self-signed file certificates are reported for pinning too.
        let cert_name = setup.cert_name.clone().expect("self-signed file is pinned");
        for version in [&TLS13, &TLS12] {
            let (c, _) = handshake(&setup.config, pinning_client(&cert_name, &[version]), host)
                .unwrap_or_else(|e| panic!("{host}: {e:?}"));
            assert_eq!(served_chain(&c).len(), 2);
        }
    }
}

// ---------------------------------------------------------------------------
// Self-signed mode

#[test]
fn self_signed_mode_serves_leaf_and_meta_for_any_sni() {
    let setup = self_signed("derp.test");
    assert!(setup.reloader.is_none());
    let cert_name = setup.cert_name.clone().unwrap();
    assert!(cert_name.starts_with("sha256-raw:"));
    assert_eq!(cert_name.len(), "sha256-raw:".len() + 64);

    for version in [&TLS13, &TLS12] {
        for name in ["derp.test", "unrelated.invalid", "127.0.0.1"] {
            let (mut c, mut s) =
                handshake(&setup.config, pinning_client(&cert_name, &[version]), name).unwrap();
            let chain = served_chain(&c);
            assert_eq!(chain.len(), 2, "pinning tolerates one non-meta cert");
            assert_eq!(sha256_name(&chain[0]), cert_name);
            assert_meta_certificate(&chain[1]);
            exchange_data(&mut c, &mut s);
        }
    }

    let chain = {
        let (c, _) = handshake(
            &setup.config,
            pinning_client(&cert_name, &[&TLS13]),
            "derp.test",
        )
        .unwrap();
        served_chain(&c)
    };
    let leaf = parse(&chain[0]);
    assert_eq!(sans(&leaf), ["derp.test", "localhost", "127.0.0.1", "::1"]);
    assert_eq!(common_name(&leaf), "derp.test");
    // ECDSA with the P-256 curve.
    let spki = leaf.public_key();
    assert_eq!(spki.algorithm.algorithm.to_id_string(), "1.2.840.10045.2.1");
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .unwrap()
        .as_oid()
        .unwrap();
    assert_eq!(curve.to_id_string(), "1.2.840.10045.3.1.7");
    assert!(!leaf.basic_constraints().unwrap().unwrap().value.ca);
}

#[test]
fn self_signed_mode_uses_an_ip_san_for_an_ip_hostname() {
    let setup = self_signed("192.0.2.7");
    let cert_name = setup.cert_name.clone().unwrap();
    let (c, _) = handshake(
        &setup.config,
        pinning_client(&cert_name, &[&TLS13]),
        "192.0.2.7",
    )
    .unwrap();
    let leaf_der = &served_chain(&c)[0];
    assert_eq!(
        sans(&parse(leaf_der)),
        ["192.0.2.7", "localhost", "127.0.0.1", "::1"]
    );
}

#[test]
fn each_configuration_has_its_own_meta_key_but_the_same_subject() {
    let a = self_signed("derp.test");
    let b = self_signed("derp.test");
    let meta = |setup: &CertSetup| {
        let (c, _) = handshake(
            &setup.config,
            pinning_client(setup.cert_name.as_ref().unwrap(), &[&TLS13]),
            "derp.test",
        )
        .unwrap();
        served_chain(&c).pop().unwrap()
    };
    let (ma, mb) = (meta(&a), meta(&b));
    assert_ne!(ma, mb, "fresh Ed25519 key per configuration");
    assert_eq!(parse(&ma).subject(), parse(&mb).subject());
}

// ---------------------------------------------------------------------------
// Reload

#[test]
fn reload_swaps_in_rewritten_files_and_keeps_meta() {
    let (setup, ca, dir, first_leaf) = manual_setup();
    let reloader = setup.reloader.clone().unwrap();
    let chain_now = || {
        let (c, _) = handshake(&setup.config, webpki_client(&ca.der(), &[&TLS13]), HOST).unwrap();
        served_chain(&c)
    };
    let before = chain_now();
    assert_eq!(before[0], first_leaf);
    assert!(!reloader.check().unwrap(), "nothing changed yet");

    // Rewrite both files in place with a new leaf and key.
    let (chain, key, second_leaf) = ca.issue(&[HOST]);
    write_files(dir.path(), HOST, &chain, &key);
    bump_mtime(reloader.cert_path(), 10);
    assert!(reloader.check().unwrap());
    let after = chain_now();
    assert_eq!(after[0], second_leaf);
    assert_eq!(after.last(), before.last(), "meta-certificate is kept");
    assert!(!reloader.check().unwrap(), "stamp recorded");

    // A broken key keeps the current certificate in service.
    fs::write(reloader.key_path(), "garbage").unwrap();
    bump_mtime(reloader.key_path(), 20);
    let err = reloader.check().unwrap_err();
    assert!(matches!(err, CertError::NoPrivateKey { .. }), "{err:?}");
    assert_eq!(chain_now()[0], second_leaf);
    // Reported once per change, not on every check.
    assert!(!reloader.check().unwrap());

    // Half-way through a rotation: new certificate, old key.
    let (chain3, key3, third_leaf) = ca.issue(&[HOST]);
    fs::write(reloader.key_path(), &key).unwrap();
    fs::write(reloader.cert_path(), &chain3).unwrap();
    bump_mtime(reloader.cert_path(), 30);
    bump_mtime(reloader.key_path(), 30);
    let err = reloader.check().unwrap_err();
    assert!(matches!(err, CertError::KeyMismatch { .. }), "{err:?}");
    assert_eq!(chain_now()[0], second_leaf);

    // The key lands: the rotation completes.
    fs::write(reloader.key_path(), &key3).unwrap();
    bump_mtime(reloader.key_path(), 40);
    assert!(reloader.check().unwrap());
    assert_eq!(chain_now()[0], third_leaf);
}

#[test]
fn reload_notices_files_replaced_by_rename() {
    let (setup, ca, dir, _) = manual_setup();
    let reloader = setup.reloader.clone().unwrap();
    let (chain, key, new_leaf) = ca.issue(&[HOST]);
    // The way certbot-style tools deploy: write elsewhere, rename over.
    // The inode changes even if size and mtime happened to match.
    let staged_crt = dir.path().join("staged.crt");
    let staged_key = dir.path().join("staged.key");
    fs::write(&staged_crt, chain).unwrap();
    fs::write(&staged_key, key).unwrap();
    fs::rename(&staged_key, reloader.key_path()).unwrap();
    fs::rename(&staged_crt, reloader.cert_path()).unwrap();
    assert!(reloader.check().unwrap());
    let (c, _) = handshake(&setup.config, webpki_client(&ca.der(), &[&TLS12]), HOST).unwrap();
    assert_eq!(served_chain(&c)[0], new_leaf);
}

#[test]
fn reload_thread_ends_when_the_configuration_is_dropped() {
    let (setup, _ca, _dir, _) = manual_setup();
    let handle = setup
        .spawn_reloader(Duration::from_millis(1))
        .unwrap()
        .expect("manual mode has a reloader");
    let reloader = setup.reloader.clone().unwrap();
    drop(setup);
    handle.join().unwrap();
    // With the configuration gone, a check is a no-op.
    assert!(!reloader.check().unwrap());

    assert!(self_signed("derp.test")
        .spawn_reloader(Duration::from_secs(1))
        .unwrap()
        .is_none());
}

#[test]
fn pinning_refuses_a_second_non_meta_certificate() {
    // docs/derp-protocol.md §19: a pinned leaf followed by an intermediate
    // fails, which is why generated leaves are served with the meta cert
    // alone. Checked here so the pin verifier's approvals above mean
    // something.
    let (setup, _ca, _dir, leaf) = manual_setup();
    let client = pinning_client(&sha256_name(&leaf), &[&TLS13]);
    match handshake(&setup.config, client, HOST).unwrap_err() {
        Failed::Client(rustls::Error::General(msg)) => {
            assert!(msg.contains("2 non-meta"), "{msg}")
        }
        other => panic!("expected the pinning client to refuse, got {other:?}"),
    }
}
