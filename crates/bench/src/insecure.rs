//! `--insecure`: TLS without certificate verification, for servers whose
//! certificate the generator has no way to trust (a self-signed one made by
//! the server itself, an address instead of a name).
//!
//! Only the chain check is skipped: the handshake's signatures are still
//! verified with the provider's algorithms, so the server must hold the key
//! of the certificate it shows, and the TLS work on both sides is the same
//! as with verification on. Every report of a run with `--insecure` says so.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate chain; checks handshake signatures.
#[derive(Debug)]
pub struct AnyChain {
    provider: Arc<CryptoProvider>,
}

impl AnyChain {
    /// Checks signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        AnyChain { provider }
    }
}

impl ServerCertVerifier for AnyChain {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
    use rustls::crypto::aws_lc_rs;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::server::{ClientHello, ResolvesServerCert};
    use rustls::sign::CertifiedKey;
    use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

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
            .with_custom_certificate_verifier(Arc::new(AnyChain::new(provider)))
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
