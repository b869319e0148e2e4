//! TLS for `https://` servers and DERP map nodes: which roots to trust, the
//! certificate checks a node asks for (a name, a `sha256-raw:` pin, or none
//! with `InsecureForTests`), and the DERP meta-certificate that lets a
//! client skip the HTTP round trip (protocol reference §4.1, §4.4).
//!
//! Everything uses rustls with the aws-lc-rs provider and no ALPN (DERP is
//! HTTP/1.1).

use crate::target::Verify;
use crate::Error;
use ferry_proto::key::NodePublic;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};
use std::sync::{Arc, OnceLock};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::time::ASN1Time;

/// Which certificate authorities `https://` servers are checked against.
#[derive(Clone, Default)]
pub enum TlsRoots {
    /// The system's CA certificates (honouring `SSL_CERT_FILE` and
    /// `SSL_CERT_DIR`), loaded once per process.
    #[default]
    System,
    /// These roots only (a test CA, a private CA).
    Custom(Arc<RootCertStore>),
    /// A complete rustls configuration, used as it is (a custom
    /// verifier); DERP map pins and `InsecureForTests` do not apply.
    Config(Arc<ClientConfig>),
}

impl std::fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsRoots::System => f.write_str("System"),
            TlsRoots::Custom(r) => write!(f, "Custom({} roots)", r.len()),
            TlsRoots::Config(_) => f.write_str("Config(..)"),
        }
    }
}

/// Subject common-name prefix of the meta-certificate.
const META_CN_PREFIX: &str = "derpkey";

fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _ignored) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found.errors.first().map(|e| e.to_string());
                return Err(format!(
                    "no system CA certificates found{}",
                    why.map(|w| format!(" ({w})")).unwrap_or_default()
                ));
            }
            Ok(Arc::new(store))
        })
        .clone()
}

/// The rustls configuration and server name for an `https://` request to
/// `host`, its certificate checked against `roots` for that name.
pub fn https_client_config(
    roots: &TlsRoots,
    host: &str,
) -> Result<(Arc<ClientConfig>, ServerName<'static>), Error> {
    client_config(roots, &Verify::Name(host.to_owned()), host)
}

/// The rustls configuration and server name for one TLS target.
pub(crate) fn client_config(
    roots: &TlsRoots,
    verify: &Verify,
    host: &str,
) -> Result<(Arc<ClientConfig>, ServerName<'static>), Error> {
    let setup = |reason: String| Error::TlsSetup {
        host: host.to_owned(),
        reason,
    };
    let server_name = ServerName::try_from(host.to_owned())
        .map_err(|e| setup(format!("not a valid server name: {e}")))?;
    if let TlsRoots::Config(config) = roots {
        return Ok((config.clone(), server_name));
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(e.to_string()))?;
    let check = match verify {
        Verify::Name(name) => {
            let store = match roots {
                TlsRoots::Custom(store) => store.clone(),
                _ => system_roots().map_err(setup)?,
            };
            let webpki = WebPkiServerVerifier::builder_with_provider(store, provider())
                .build()
                .map_err(|e| setup(e.to_string()))?;
            let expected = ServerName::try_from(name.clone())
                .map_err(|e| setup(format!("CertName {name:?}: {e}")))?;
            Check::Name { webpki, expected }
        }
        Verify::Pin(pin) => Check::Pin(*pin),
        Verify::Insecure => Check::Nothing,
    };
    let verifier =
        ChainVerifier::with_context(provider(), move |end_entity, intermediates, ocsp, now| {
            check.verify(end_entity, intermediates, ocsp, now)
        });
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok((Arc::new(config), server_name))
}

/// The server key from a meta-certificate in `chain`, if one is there:
/// subject CN `derpkey` + 64 hex digits, serial number 1…255.
pub(crate) fn meta_server_key(chain: &[CertificateDer<'_>]) -> Option<NodePublic> {
    chain.iter().find_map(|der| {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let serial = cert.raw_serial();
        let serial = &serial[serial.iter().take_while(|b| **b == 0).count()..];
        if serial.len() != 1 {
            return None;
        }
        meta_key(&cert)
    })
}

fn meta_key(cert: &X509Certificate<'_>) -> Option<NodePublic> {
    cert.subject().iter_common_name().find_map(|cn| {
        let hex = cn.as_str().ok()?.strip_prefix(META_CN_PREFIX)?;
        NodePublic::from_hex(hex).ok()
    })
}

fn is_meta(der: &CertificateDer<'_>) -> bool {
    X509Certificate::from_der(der).is_ok_and(|(_, c)| {
        c.subject()
            .iter_common_name()
            .any(|cn| cn.as_str().is_ok_and(|s| s.starts_with(META_CN_PREFIX)))
    })
}

#[derive(Debug)]
enum Check {
    /// WebPKI for `expected` (the node's `CertName` may differ from the SNI).
    Name {
        webpki: Arc<WebPkiServerVerifier>,
        expected: ServerName<'static>,
    },
    /// `sha256-raw:` pin.
    Pin([u8; 32]),
    /// `InsecureForTests`.
    Nothing,
}

impl Check {
    /// The chain check of one target.
    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        match self {
            Check::Name { webpki, expected } => webpki
                .verify_server_cert(end_entity, intermediates, expected, ocsp_response, now)
                .map(|_| ()),
            Check::Pin(pin) => {
                let mut chain = std::iter::once(end_entity)
                    .chain(intermediates)
                    .filter(|c| !is_meta(c));
                let (Some(only), None) = (chain.next(), chain.next()) else {
                    return Err(rustls::Error::General(
                        "a pinned DERP server must present exactly one certificate besides the meta-certificate".into(),
                    ));
                };
                if Sha256::digest(only.as_ref()).as_slice() != pin {
                    return Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::ApplicationVerificationFailure,
                    ));
                }
                let valid = X509Certificate::from_der(only).is_ok_and(|(_, c)| {
                    ASN1Time::from_timestamp(now.as_secs() as i64)
                        .is_ok_and(|t| c.validity().is_valid_at(t))
                });
                if !valid {
                    return Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::Expired,
                    ));
                }
                Ok(())
            }
            Check::Nothing => Ok(()),
        }
    }
}

/// The whole check of a chain: end entity, intermediates, OCSP response
/// and the time of the handshake.
type FullCheck = dyn Fn(&CertificateDer<'_>, &[CertificateDer<'_>], &[u8], UnixTime) -> Result<(), rustls::Error>
    + Send
    + Sync;

/// A certificate verifier whose chain check is the caller's, and whose
/// handshake signatures are always verified with the provider's
/// algorithms: whatever the chain check accepts, the server must still
/// hold the key of the certificate it shows, and the TLS work is the same
/// as with full verification.
///
/// The SDK builds its targets' checks on it (a name, a pin, or nothing
/// for `InsecureForTests`); load generators and tests use
/// [`ChainVerifier::accept_any`] against servers with certificates they
/// cannot trust (self-signed, made by the server itself), or
/// [`ChainVerifier::new`] with a check of their own.
pub struct ChainVerifier {
    provider: Arc<CryptoProvider>,
    check: Box<FullCheck>,
}

impl std::fmt::Debug for ChainVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainVerifier").finish_non_exhaustive()
    }
}

impl ChainVerifier {
    /// Checks chains (end entity, intermediates) with `check` and
    /// signatures with `provider`'s algorithms.
    pub fn new(
        provider: Arc<CryptoProvider>,
        check: impl Fn(&CertificateDer<'_>, &[CertificateDer<'_>]) -> Result<(), rustls::Error>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self::with_context(provider, move |end_entity, intermediates, _, _| {
            check(end_entity, intermediates)
        })
    }

    /// Accepts any certificate chain; signatures are still checked.
    pub fn accept_any(provider: Arc<CryptoProvider>) -> Self {
        Self::new(provider, |_, _| Ok(()))
    }

    /// Like [`ChainVerifier::new`], the check also given the OCSP response
    /// and the time of the handshake.
    fn with_context(
        provider: Arc<CryptoProvider>,
        check: impl Fn(
                &CertificateDer<'_>,
                &[CertificateDer<'_>],
                &[u8],
                UnixTime,
            ) -> Result<(), rustls::Error>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        ChainVerifier {
            provider,
            check: Box::new(check),
        }
    }
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        (self.check)(end_entity, intermediates, ocsp_response, now)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SerialNumber};

    fn cert(cn: &str, serial: &[u8]) -> CertificateDer<'static> {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.serial_number = Some(SerialNumber::from_slice(serial));
        p.self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .der()
            .clone()
    }

    #[test]
    fn meta_certificate_key() {
        let key = NodePublic::from_bytes([7; 32]);
        let cn = format!("derpkey{}", key.to_hex());
        let leaf = cert("derp.example.com", &[1]);
        assert_eq!(meta_server_key(&[leaf.clone(), cert(&cn, &[2])]), Some(key));
        assert!(is_meta(&cert(&cn, &[2])) && !is_meta(&leaf));
        // The serial (protocol version) must fit a byte and not be zero.
        assert_eq!(meta_server_key(&[cert(&cn, &[0])]), None);
        assert_eq!(meta_server_key(&[cert(&cn, &[1, 0])]), None);
        // The rest of the name must be a key.
        assert_eq!(meta_server_key(&[cert("derpkey00", &[2])]), None);
        assert_eq!(meta_server_key(&[leaf]), None);
        assert_eq!(
            meta_server_key(&[CertificateDer::from(vec![0x30, 0x03])]),
            None
        );
    }

    #[test]
    fn the_chain_check_decides() {
        let der = CertificateDer::from(vec![1, 2, 3]);
        let name = ServerName::try_from("localhost").unwrap();
        let any = ChainVerifier::accept_any(provider());
        assert!(any
            .verify_server_cert(&der, &[], &name, &[], UnixTime::now())
            .is_ok());
        let none = ChainVerifier::new(provider(), |_, _| {
            Err(rustls::Error::General("refused".into()))
        });
        assert!(none
            .verify_server_cert(&der, &[], &name, &[], UnixTime::now())
            .is_err());
    }

    /// Every certificate verifier of the workspace (the SDK's targets,
    /// the load generators' `--insecure`, the tests' clients) is this
    /// module's [`ChainVerifier`]: no crate writes its own.
    #[test]
    fn the_workspace_has_one_certificate_verifier() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let needle = concat!("impl ServerCert", "Verifier for");
        let mut found = Vec::new();
        let mut dirs = vec![crates];
        for _ in 0..100_000 {
            let Some(dir) = dirs.pop() else { break };
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                let name = entry.file_name();
                if path.is_dir() && name != "target" && name != "corpus" {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && std::fs::read_to_string(&path).is_ok_and(|t| t.contains(needle))
                {
                    found.push(path);
                }
            }
        }
        assert!(dirs.is_empty(), "the walk of crates/ did not finish");
        assert_eq!(found.len(), 1, "certificate verifiers: {found:?}");
        assert!(found[0].ends_with("client/src/tls.rs"), "{found:?}");
    }

    /// [`ChainVerifier::accept_any`] against a server with a certificate
    /// nobody vouches for.
    mod accept_any {
        use super::super::*;
        use rustls::crypto::aws_lc_rs;
        use rustls::pki_types::PrivateKeyDer;
        use rustls::server::{ClientHello, ResolvesServerCert};
        use rustls::sign::CertifiedKey;
        use rustls::{ClientConnection, ServerConfig, ServerConnection};

        /// Serves `cert` and signs the handshake with `key` (which need not
        /// be the certificate's).
        #[derive(Debug)]
        struct Serve(Arc<CertifiedKey>);

        impl ResolvesServerCert for Serve {
            fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
                Some(self.0.clone())
            }
        }

        fn server(cert_key: &rcgen::KeyPair, signing_key: &rcgen::KeyPair) -> ServerConfig {
            let cert = rcgen::CertificateParams::new(vec!["bench.invalid".to_owned()])
                .unwrap()
                .self_signed(cert_key)
                .unwrap();
            let provider = aws_lc_rs::default_provider();
            let key = PrivateKeyDer::try_from(signing_key.serialize_der()).unwrap();
            let signer = provider.key_provider.load_private_key(key).unwrap();
            let certified = CertifiedKey::new(vec![cert.der().clone()], signer);
            ServerConfig::builder_with_provider(Arc::new(provider))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(Serve(Arc::new(certified))))
        }

        fn client() -> ClientConfig {
            let provider = Arc::new(aws_lc_rs::default_provider());
            ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainVerifier::accept_any(provider)))
                .with_no_client_auth()
        }

        /// Runs a handshake in memory; the client's error, if any.
        fn handshake(server: ServerConfig) -> Result<(), rustls::Error> {
            let name = ServerName::try_from("bench.invalid").unwrap();
            let mut c = ClientConnection::new(Arc::new(client()), name).unwrap();
            let mut s = ServerConnection::new(Arc::new(server)).unwrap();
            for _ in 0..20 {
                if !c.is_handshaking() && !s.is_handshaking() {
                    return Ok(());
                }
                let mut wire = Vec::new();
                c.write_tls(&mut wire).unwrap();
                s.read_tls(&mut wire.as_slice()).unwrap();
                // The server's own view does not matter here; the client's does.
                let _ = s.process_new_packets();
                let mut wire = Vec::new();
                s.write_tls(&mut wire).unwrap();
                c.read_tls(&mut wire.as_slice()).unwrap();
                c.process_new_packets()?;
            }
            panic!("no handshake after 20 round trips");
        }

        #[test]
        fn accepts_a_self_signed_certificate() {
            let key = rcgen::KeyPair::generate().unwrap();
            handshake(server(&key, &key)).expect("any chain is accepted");
        }

        #[test]
        fn still_checks_the_handshake_signature() {
            let (shown, signing) = (
                rcgen::KeyPair::generate().unwrap(),
                rcgen::KeyPair::generate().unwrap(),
            );
            let err = handshake(server(&shown, &signing))
                .expect_err("a server without the certificate's key is refused");
            assert_eq!(
                err,
                rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)
            );
        }
    }
}
