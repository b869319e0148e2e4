//! Picks the certificate chain for each handshake.
//!
//! The resolver runs inside rustls while a ClientHello is processed, on the
//! shard that owns the connection, so it only loads the current chain from an
//! `ArcSwap` (no lock, no I/O) and applies the SNI policy.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Which server names a ClientHello may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SniPolicy {
    /// Serve every ClientHello (IP hostnames, self-signed mode).
    Any,
    /// Serve a ClientHello without SNI or with SNI equal to this name
    /// (lowercase, no trailing dot), compared case-insensitively.
    Match(String),
}

impl SniPolicy {
    /// Whether a ClientHello carrying `sni` is served.
    pub(super) fn admits(&self, sni: Option<&str>) -> bool {
        match (self, sni) {
            (SniPolicy::Any, _) | (SniPolicy::Match(_), None) => true,
            (SniPolicy::Match(expected), Some(sni)) => {
                sni.trim_end_matches('.').eq_ignore_ascii_case(expected)
            }
        }
    }
}

/// The listener's `ResolvesServerCert`: one chain, swapped on reload.
#[derive(Debug)]
pub(super) struct ChainResolver {
    current: Arc<ArcSwap<CertifiedKey>>,
    sni: SniPolicy,
}

impl ChainResolver {
    pub(super) fn new(current: Arc<ArcSwap<CertifiedKey>>, sni: SniPolicy) -> Self {
        Self { current, sni }
    }
}

impl ResolvesServerCert for ChainResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = client_hello.server_name();
        if !self.sni.admits(sni) {
            // Returning no certificate makes rustls abort the handshake with
            // an alert. Scanners do this constantly, hence debug level.
            tracing::debug!(
                sni = sni.unwrap_or(""),
                "refusing TLS handshake for another server name"
            );
            return None;
        }
        Some(self.current.load_full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_policy_is_case_insensitive_and_admits_no_sni() {
        let policy = SniPolicy::Match("derp.example.com".into());
        assert!(policy.admits(None));
        assert!(policy.admits(Some("derp.example.com")));
        assert!(policy.admits(Some("DERP.Example.COM")));
        assert!(policy.admits(Some("derp.example.com.")));
        assert!(!policy.admits(Some("example.com")));
        assert!(!policy.admits(Some("derp.example.com.evil")));
        assert!(!policy.admits(Some("")));
    }

    #[test]
    fn any_policy_admits_everything() {
        assert!(SniPolicy::Any.admits(None));
        assert!(SniPolicy::Any.admits(Some("anything.invalid")));
    }
}
