//! TLS clients for tests against servers with self-signed certificates.
//!
//! [`Verifier`] checks the certificate chain with a closure of the test's
//! (accept anything, match a pin, ...) and the handshake signatures with
//! the provider's algorithms, so the server must still hold the key of the
//! certificate it shows. Real clients verify for real
//! (`ferry_client::tls`).

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

/// The chain check of a [`Verifier`]: the end entity and intermediates.
pub type ChainCheck =
    dyn Fn(&CertificateDer<'_>, &[CertificateDer<'_>]) -> Result<(), rustls::Error> + Send + Sync;

/// A certificate verifier whose chain check is the test's.
pub struct Verifier {
    provider: Arc<CryptoProvider>,
    check: Box<ChainCheck>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier").finish_non_exhaustive()
    }
}

impl Verifier {
    /// Verifies chains with `check` and signatures with `provider`.
    pub fn new(
        provider: Arc<CryptoProvider>,
        check: impl Fn(&CertificateDer<'_>, &[CertificateDer<'_>]) -> Result<(), rustls::Error>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Verifier {
            provider,
            check: Box::new(check),
        }
    }

    /// Accepts any certificate chain (signatures are still checked).
    pub fn accept_any(provider: Arc<CryptoProvider>) -> Self {
        Verifier::new(provider, |_, _| Ok(()))
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        (self.check)(end_entity, intermediates).map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The provider the tests use (aws-lc-rs, as the relay).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A client configuration (safe default versions) that accepts any
/// certificate chain.
pub fn accept_any_config() -> ClientConfig {
    let provider = provider();
    ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier::accept_any(provider)))
        .with_no_client_auth()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_check_decides() {
        let der = CertificateDer::from(vec![1, 2, 3]);
        let name = ServerName::try_from("localhost").unwrap();
        let any = Verifier::accept_any(provider());
        assert!(any
            .verify_server_cert(&der, &[], &name, &[], UnixTime::now())
            .is_ok());
        let none = Verifier::new(provider(), |_, _| {
            Err(rustls::Error::General("refused".into()))
        });
        assert!(none
            .verify_server_cert(&der, &[], &name, &[], UnixTime::now())
            .is_err());
    }
}
