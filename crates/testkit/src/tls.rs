//! TLS clients for tests against servers with self-signed certificates.
//!
//! [`Verifier`] is the SDK's [`ferry_client::ChainVerifier`]: it checks the
//! certificate chain with a closure of the test's (accept anything, match
//! a pin, ...) and the handshake signatures with the provider's
//! algorithms, so the server must still hold the key of the certificate it
//! shows. Real clients verify for real (`ferry_client`'s TLS targets).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::ClientConfig;

/// A certificate verifier whose chain check is the test's.
pub use ferry_client::ChainVerifier as Verifier;

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
