//! The DERP listener's certificates: where they come from, the served
//! chain, ACME state, reload, and the rustls configuration around them.
//!
//! [`server_config`] turns a [`CertMode`] and the server's DERP public key
//! into a rustls [`ServerConfig`] using the aws-lc-rs provider, TLS 1.2 and
//! 1.3, no ALPN (a DERP connection is always HTTP/1.1, never `h2`) and no TLS
//! 1.3 session tickets (a session may later be handed to kTLS, which cannot
//! issue them).
//!
//! Where certificates come from:
//!
//! - [`CertMode::Manual`] reads `<certdir>/<hostname>.crt` and `.key`, as
//!   derper's `--certmode=manual` does. When the hostname is an IP literal and
//!   neither file exists, a self-signed certificate for that IP is generated,
//!   written there (so its pin survives restarts) and its `sha256-raw:`
//!   CertName is logged for the DERP map.
//! - [`CertMode::SelfSigned`] generates an ECDSA P-256 certificate for
//!   the hostname plus `localhost`, `127.0.0.1` and `::1`. With a directory
//!   it is kept there (`<name>.selfsigned.crt` and `.key`) and reused on the
//!   next start while it is valid for the hostname, so its pin survives
//!   restarts; without one it is new on every start.
//!
//! The served chain is the leaf (and, in manual mode, whatever intermediates
//! the file holds) followed by the DERP *meta-certificate*: a throw-away
//! Ed25519 certificate whose subject carries the server's public key, from
//! which TLS 1.3 clients learn the key and skip the HTTP upgrade round trip
//! (`docs/derp-protocol.md` §4.1, §4.4). Self-signed leaves are served
//! alone before the meta-certificate, because `sha256-raw:` pinning
//! clients accept exactly one non-meta certificate.
//!
//! The chain lives in an [`arc_swap::ArcSwap`] read by the
//! certificate resolver on every handshake; a [`CertReloader`] re-reads the
//! manual files when they change and swaps a new chain in. The handshake path
//! never touches the file system.
//!
//! In manual mode with a DNS hostname, a ClientHello naming another host is
//! refused (the handshake fails before any certificate is sent); a ClientHello
//! without SNI is served, since clients dialling an IP literal send none.
//!
//! Among the cipher suites a client offers, the server picks the one its
//! CPU encrypts cheapest, not the client's first
//! ([`crate::transport::suites`]).

mod acme;
mod manual;
mod meta;
mod reload;
mod resolver;
mod self_signed;

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sha2::{Digest, Sha256};

pub use acme::{AcmeState, ACME_TLS_ALPN};
pub use meta::{META_CN_PREFIX, META_SERIAL};
pub use reload::CertReloader;

use crate::transport::suites;
use resolver::{ChainResolver, SniPolicy};

/// Where the DERP listener's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertMode {
    /// derper's `--certmode=manual`: `<certdir>/<hostname>.crt` (PEM chain,
    /// leaf first) and `<certdir>/<hostname>.key` (PKCS#8, PKCS#1 or SEC1
    /// PEM), re-read when they change.
    Manual {
        /// Directory holding the certificate and key files.
        certdir: PathBuf,
        /// The name clients dial; also the files' base name.
        hostname: String,
    },
    /// Certificates from an ACME CA (derper's `--certmode letsencrypt`),
    /// obtained and renewed by a client outside the relay through the
    /// [`AcmeState`] in [`CertSetup::acme`].
    Acme {
        /// The name certificates are ordered for.
        hostname: String,
    },
    /// A self-signed certificate, generated once.
    SelfSigned {
        /// DNS name or IP literal the certificate is issued for.
        hostname: String,
        /// Where the generated certificate and key are kept between starts;
        /// `None`: a new one every start (tests).
        certdir: Option<PathBuf>,
    },
}

/// The DERP listener's certificates, ready: the rustls configuration
/// that serves them and what watches or renews them.
#[derive(Debug)]
pub struct CertSetup {
    /// The rustls configuration every accepted connection starts from.
    pub config: Arc<ServerConfig>,
    /// `sha256-raw:<hex>` of the leaf when it is self-signed, for the
    /// `CertName` field of the DERP map (`docs/derp-protocol.md` §4.1, §15).
    /// Describes the certificate loaded at start-up; a reload that brings a
    /// different self-signed leaf logs its new name.
    pub cert_name: Option<String>,
    /// Watches the manual-mode files; `None` when there are none to watch.
    pub reloader: Option<CertReloader>,
    /// In ACME mode: where the ACME client puts certificates and challenge
    /// answers.
    pub acme: Option<Arc<AcmeState>>,
    /// The chain being served (manual and self-signed modes).
    current: Option<Arc<ArcSwap<CertifiedKey>>>,
}

impl CertSetup {
    /// The leaf certificate handshakes get now (after reloads and ACME
    /// renewals), if any.
    pub fn served_leaf(&self) -> Option<CertificateDer<'static>> {
        match (&self.acme, &self.current) {
            (Some(acme), _) => acme.served_leaf(),
            (None, Some(current)) => current.load().cert.first().cloned(),
            (None, None) => None,
        }
    }

    /// Starts a thread that checks the certificate files every `interval`
    /// and swaps in a new chain when they change.
    ///
    /// Returns `Ok(None)` when this set-up has no files to watch. The thread
    /// ends on its own once every [`ServerConfig`] built here has been
    /// dropped (noticed within one `interval`).
    pub fn spawn_reloader(&self, interval: Duration) -> io::Result<Option<JoinHandle<()>>> {
        self.reloader
            .as_ref()
            .map(|reloader| reloader.spawn(interval))
            .transpose()
    }
}

/// Errors from loading, generating or reloading certificates, or from
/// building the rustls configuration around them.
///
/// Each variant names the file involved, so that an operator can act on the
/// message alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// The configured hostname cannot name a certificate.
    #[error("invalid TLS hostname {hostname:?}: {reason}")]
    InvalidHostname {
        /// The hostname as configured.
        hostname: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A certificate or key file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file is not well-formed PEM.
    #[error("{}: malformed PEM: {source}", path.display())]
    Pem {
        /// The file involved.
        path: PathBuf,
        /// What the PEM parser objected to.
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no `CERTIFICATE` block.
    #[error("{}: no CERTIFICATE block found", path.display())]
    NoCertificate {
        /// The certificate file.
        path: PathBuf,
    },
    /// The key file holds no `PRIVATE KEY`, `RSA PRIVATE KEY` or
    /// `EC PRIVATE KEY` block.
    #[error(
        "{}: no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block found",
        path.display()
    )]
    NoPrivateKey {
        /// The key file.
        path: PathBuf,
    },
    /// The private key's algorithm or encoding is not usable for TLS.
    #[error("{}: unusable private key: {source}", path.display())]
    UnsupportedKey {
        /// The key file.
        path: PathBuf,
        /// The crypto provider's objection.
        source: rustls::Error,
    },
    /// The first certificate in the file is not a well-formed X.509
    /// certificate.
    #[error("{}: leaf certificate is not valid X.509: {source}", path.display())]
    BadCertificate {
        /// The certificate file.
        path: PathBuf,
        /// The parser's objection.
        source: rustls::Error,
    },
    /// The private key does not belong to the leaf certificate.
    #[error(
        "{} does not hold the private key of the leaf certificate in {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The leaf certificate is not issued for the configured hostname.
    #[error(
        "{}: leaf certificate is not valid for {hostname:?}: {source}",
        path.display()
    )]
    NameMismatch {
        /// The certificate file.
        path: PathBuf,
        /// The configured hostname.
        hostname: String,
        /// How the names disagree.
        source: rustls::Error,
    },
    /// Generating a certificate failed.
    #[error("generating the {what}: {source}")]
    Generate {
        /// Which certificate was being generated.
        what: &'static str,
        /// rcgen's error.
        source: rcgen::Error,
    },
    /// rustls refused the configuration or a generated key.
    #[error("building the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// Builds the DERP listener's TLS configuration.
///
/// `server_public` is the server's DERP node public key; it goes into the
/// meta-certificate, so it must be the real key or fast-start clients fail.
pub fn server_config(mode: &CertMode, server_public: [u8; 32]) -> Result<CertSetup, CertError> {
    let provider = Arc::new(suites::cheapest_first(
        rustls::crypto::aws_lc_rs::default_provider(),
    ));
    let meta = meta::meta_certificate(&server_public, time::OffsetDateTime::now_utc())?;

    if let CertMode::Acme { hostname } = mode {
        let hostname = normalize_hostname(hostname)?;
        if hostname.parse::<IpAddr>().is_ok() {
            return Err(CertError::InvalidHostname {
                hostname,
                reason: "ACME certificates need a DNS name",
            });
        }
        let state = Arc::new(AcmeState::new(hostname, meta, provider.clone()));
        let mut config = build_config(provider, Arc::new(acme::AcmeResolver::new(state.clone())))?;
        // The CA's validator offers only acme-tls/1 (RFC 8737); rustls refuses
        // a ClientHello whose ALPN list shares nothing with ours, so
        // http/1.1 stays first for browsers and other clients that send ALPN.
        config.alpn_protocols = vec![b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()];
        return Ok(CertSetup {
            config: Arc::new(config),
            cert_name: None,
            reloader: None,
            acme: Some(state),
            current: None,
        });
    }
    let (leaf, sni, cert_name, watch) = match mode {
        CertMode::SelfSigned {
            hostname,
            certdir: Some(certdir),
        } => {
            let hostname = normalize_hostname(hostname)?;
            let (leaf, cert_name) =
                manual::load_or_generate_self_signed(certdir, &hostname, &provider)?;
            (leaf, SniPolicy::Any, Some(cert_name), None)
        }
        CertMode::SelfSigned {
            hostname,
            certdir: None,
        } => {
            let hostname = normalize_hostname(hostname)?;
            let generated = self_signed::generate(&hostname, true)?;
            let cert_name = sha256_raw_cert_name(&generated.cert);
            tracing::info!(
                %hostname,
                %cert_name,
                "using a generated self-signed TLS certificate (not kept: no directory)"
            );
            let key = provider
                .key_provider
                .load_private_key(PrivateKeyDer::Pkcs8(generated.key))
                .map_err(CertError::Config)?;
            let leaf = CertifiedKey::new(vec![generated.cert], key);
            (leaf, SniPolicy::Any, Some(cert_name), None)
        }
        CertMode::Acme { .. } => unreachable!("handled above"),
        CertMode::Manual { certdir, hostname } => {
            let hostname = normalize_hostname(hostname)?;
            let ip = hostname.parse::<IpAddr>().ok();
            let files = manual::CertFiles::new(certdir, &hostname, ip)?;
            let loaded = manual::load_or_generate(files, ip, &provider)?;
            let sni = match ip {
                Some(_) => SniPolicy::Any,
                None => SniPolicy::Match(hostname.clone()),
            };
            (loaded.leaf, sni, loaded.cert_name, loaded.watch)
        }
    };

    let current = Arc::new(ArcSwap::from_pointee(with_meta(leaf, &meta)));
    let reloader = watch.map(|(files, stamp)| {
        CertReloader::new(files, stamp, meta.clone(), provider.clone(), &current)
    });
    let resolver = ChainResolver::new(current.clone(), sni);
    let config = build_config(provider, Arc::new(resolver))?;
    Ok(CertSetup {
        config: Arc::new(config),
        cert_name,
        reloader,
        acme: None,
        current: Some(current),
    })
}

/// The certificate and key files `--certmode manual` reads for `hostname`
/// in `certdir` (derper's names: `<certdir>/<name>.crt` and `.key`).
pub fn manual_paths(
    certdir: &std::path::Path,
    hostname: &str,
) -> Result<(PathBuf, PathBuf), CertError> {
    let hostname = normalize_hostname(hostname)?;
    let ip = hostname.parse::<IpAddr>().ok();
    let files = manual::CertFiles::new(certdir, &hostname, ip)?;
    Ok((files.cert, files.key))
}

/// `sha256-raw:` followed by the lowercase hex SHA-256 of a certificate's
/// DER, the `CertName` form that makes clients pin that exact certificate.
pub fn sha256_raw_cert_name(cert: &CertificateDer<'_>) -> String {
    format!("sha256-raw:{}", hex_lower(&Sha256::digest(cert.as_ref())))
}

/// Assembles the rustls configuration around a certificate resolver.
fn build_config(
    provider: Arc<CryptoProvider>,
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Result<ServerConfig, CertError> {
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(CertError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    // Tickets would be encrypted under keys that a kTLS hand-off cannot
    // carry along, and DERP connections are long-lived anyway.
    config.send_tls13_tickets = 0;
    // Empty already; kept explicit because offering `h2` would let clients
    // negotiate HTTP/2, on which `/derp` cannot be upgraded.
    config.alpn_protocols.clear();
    // The server, not the client, picks what its CPU encrypts cheapest.
    suites::prefer_cheapest(&mut config);
    Ok(config)
}

/// Appends the meta-certificate to a leaf chain.
fn with_meta(leaf: CertifiedKey, meta: &CertificateDer<'static>) -> CertifiedKey {
    let mut chain = leaf.cert;
    chain.push(meta.clone());
    CertifiedKey::new(chain, leaf.key)
}

/// Trims a trailing dot and lowercases, refusing empty names.
fn normalize_hostname(hostname: &str) -> Result<String, CertError> {
    let trimmed = hostname.trim().trim_end_matches('.');
    if trimmed.is_empty() {
        return Err(CertError::InvalidHostname {
            hostname: hostname.to_owned(),
            reason: "empty",
        });
    }
    Ok(trimmed.to_ascii_lowercase())
}

/// Lowercase hex, as the DERP map and the meta-certificate spell keys.
fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex_lower(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    #[test]
    fn hostnames_are_normalized() {
        assert_eq!(
            normalize_hostname("DERP.Example.com.").unwrap(),
            "derp.example.com"
        );
        assert_eq!(normalize_hostname("::1").unwrap(), "::1");
        assert!(matches!(
            normalize_hostname(" ."),
            Err(CertError::InvalidHostname { .. })
        ));
    }

    #[test]
    fn cert_name_is_sha256_of_der() {
        let der = CertificateDer::from(b"abc".to_vec());
        assert_eq!(
            sha256_raw_cert_name(&der),
            "sha256-raw:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
