//! The relay's side of ACME certificates (`--certmode letsencrypt`): the
//! certificate the ACME client obtained, and the answers to the CA's
//! challenges.
//!
//! The ACME client itself (account, orders, renewal) runs on a thread of
//! its own in the `ferry` binary; it talks to the relay only through an
//! [`AcmeState`]: it swaps in each new certificate, and sets the answers
//! the CA will ask for while an order is pending. The resolver below reads
//! them on the shards during handshakes, without locks on the common path:
//!
//! - a ClientHello offering ALPN `acme-tls/1` (only the CA's validator
//!   does) for the hostname gets the TLS-ALPN-01 challenge certificate
//!   (RFC 8737);
//! - any other ClientHello gets the current certificate, or fails cleanly
//!   while there is none yet;
//! - `/.well-known/acme-challenge/<token>` on the plain listeners answers
//!   HTTP-01 (`crate::front`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::AcmeChallenges;

use super::resolver::SniPolicy;
use super::{with_meta, CertError};

/// The ALPN protocol of TLS-ALPN-01 validation.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// What the ACME client and the relay share.
#[derive(Debug)]
pub struct AcmeState {
    hostname: String,
    meta: CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: ArcSwapOption<CertifiedKey>,
    tls_alpn: ArcSwapOption<CertifiedKey>,
    http_tokens: Mutex<HashMap<String, String>>,
}

impl AcmeState {
    pub(super) fn new(
        hostname: String,
        meta: CertificateDer<'static>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Self {
        AcmeState {
            hostname,
            meta,
            provider,
            current: ArcSwapOption::empty(),
            tls_alpn: ArcSwapOption::empty(),
            http_tokens: Mutex::new(HashMap::new()),
        }
    }

    /// The name certificates are ordered for.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// Serves `chain` (leaf first, as the CA sent it) with `key` (PKCS#8
    /// DER) from the next handshake on; connections already up keep theirs.
    pub fn install(
        &self,
        chain: Vec<CertificateDer<'static>>,
        key: PrivatePkcs8KeyDer<'static>,
    ) -> Result<(), CertError> {
        let key = self
            .provider
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(key))
            .map_err(CertError::Config)?;
        let leaf = CertifiedKey::new(chain, key);
        leaf.keys_match().map_err(CertError::Config)?;
        self.current
            .store(Some(Arc::new(with_meta(leaf, &self.meta))));
        Ok(())
    }

    /// The leaf certificate being served, if one has been installed.
    pub fn served_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current
            .load()
            .as_ref()
            .and_then(|c| c.cert.first().cloned())
    }

    /// Whether a certificate is being served.
    pub fn has_certificate(&self) -> bool {
        self.current.load().is_some()
    }

    /// Answers TLS-ALPN-01 with a certificate for the hostname carrying
    /// the `acmeIdentifier` extension over `key_authorization_digest`
    /// (SHA-256 of the key authorization); `None` stops answering.
    pub fn set_tls_alpn_challenge(&self, digest: Option<&[u8]>) -> Result<(), CertError> {
        let Some(digest) = digest else {
            self.tls_alpn.store(None);
            return Ok(());
        };
        let mut params =
            rcgen::CertificateParams::new(vec![self.hostname.clone()]).map_err(|source| {
                CertError::Generate {
                    what: "TLS-ALPN-01 challenge certificate",
                    source,
                }
            })?;
        params
            .custom_extensions
            .push(rcgen::CustomExtension::new_acme_identifier(digest));
        let key = rcgen::KeyPair::generate().map_err(|source| CertError::Generate {
            what: "TLS-ALPN-01 challenge key",
            source,
        })?;
        let cert = params
            .self_signed(&key)
            .map_err(|source| CertError::Generate {
                what: "TLS-ALPN-01 challenge certificate",
                source,
            })?;
        let signing = self
            .provider
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                key.serialize_der(),
            )))
            .map_err(CertError::Config)?;
        self.tls_alpn.store(Some(Arc::new(CertifiedKey::new(
            vec![cert.der().clone()],
            signing,
        ))));
        Ok(())
    }

    /// Answers HTTP-01 for `token` with `key_authorization`; `None` stops.
    pub fn set_http_challenge(&self, token: &str, key_authorization: Option<&str>) {
        let mut tokens = self.http_tokens.lock().expect("acme tokens lock");
        match key_authorization {
            Some(k) => tokens.insert(token.to_owned(), k.to_owned()),
            None => tokens.remove(token),
        };
    }

    /// The HTTP-01 answer for `token`, if one is set.
    pub fn http_challenge(&self, token: &str) -> Option<String> {
        self.http_tokens
            .lock()
            .expect("acme tokens lock")
            .get(token)
            .cloned()
    }
}

impl AcmeChallenges for AcmeState {
    fn http_challenge(&self, token: &str) -> Option<String> {
        AcmeState::http_challenge(self, token)
    }
}

/// The listener's resolver in ACME mode.
#[derive(Debug)]
pub(super) struct AcmeResolver {
    state: Arc<AcmeState>,
    sni: SniPolicy,
}

impl AcmeResolver {
    pub(super) fn new(state: Arc<AcmeState>) -> Self {
        let sni = SniPolicy::Match(state.hostname.clone());
        AcmeResolver { state, sni }
    }
}

impl ResolvesServerCert for AcmeResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name();
        if !self.sni.admits(sni) {
            tracing::debug!(
                sni = sni.unwrap_or(""),
                "refusing TLS handshake for another server name"
            );
            return None;
        }
        let validation = hello
            .alpn()
            .is_some_and(|mut protocols| protocols.any(|p| p == ACME_TLS_ALPN));
        if validation {
            let cert = self.state.tls_alpn.load_full();
            if cert.is_none() {
                tracing::info!("TLS-ALPN-01 validation attempt while no challenge is pending");
            }
            return cert;
        }
        let cert = self.state.current.load_full();
        if cert.is_none() {
            tracing::debug!("TLS handshake refused: no ACME certificate yet");
        }
        cert
    }
}
