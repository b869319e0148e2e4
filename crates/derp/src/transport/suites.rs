//! Which cipher suite the server picks when a client leaves it free.
//!
//! A client offers its suites in its own order; by default rustls follows
//! it. What a suite costs is the server's business, though: every byte a
//! relay forwards is decrypted once and encrypted once per connection, on
//! the server's cores. So the server decides among the suites a client
//! offers ([`prefer_cheapest`]), by what this CPU does fastest: AES-GCM
//! where it has AES and carry-less multiply instructions (AES-128 before
//! AES-256: fewer rounds), ChaCha20-Poly1305 first where it has not. The
//! order is chosen once, when the configuration is built; a client that
//! offers one suite still gets it.

use ferry_sys::ktls::Cipher;
use rustls::crypto::CryptoProvider;
use rustls::{ServerConfig, SupportedCipherSuite};

use super::handoff::cipher_of;

/// Whether this CPU has the instructions that make AES-GCM cheap (AES
/// rounds and the carry-less multiply GHASH uses).
pub fn aes_is_fast() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Where a suite goes in the server's order: TLS 1.3 before TLS 1.2
/// (they never compete: a handshake picks among one version's suites),
/// then by what its AEAD costs on a CPU with (`aes_fast`) or without
/// AES instructions.
fn rank(suite: &SupportedCipherSuite, aes_fast: bool) -> (bool, u8) {
    let cost = match (cipher_of(suite.suite()), aes_fast) {
        (Some(Cipher::Aes128Gcm), true) | (Some(Cipher::Chacha20Poly1305), false) => 0,
        (Some(Cipher::Aes256Gcm), true) | (Some(Cipher::Aes128Gcm), false) => 1,
        (Some(Cipher::Chacha20Poly1305), true) | (Some(Cipher::Aes256Gcm), false) => 2,
        _ => 3,
    };
    (matches!(suite, SupportedCipherSuite::Tls12(_)), cost)
}

/// `provider` with its cipher suites in the order they cost on this CPU
/// (see the module docs); the rest of it as it was.
pub fn cheapest_first(mut provider: CryptoProvider) -> CryptoProvider {
    let aes_fast = aes_is_fast();
    provider.cipher_suites.sort_by_key(|s| rank(s, aes_fast));
    provider
}

/// Makes a server built on a [`cheapest_first`] provider choose by its
/// own order among the suites a client offers.
pub fn prefer_cheapest(config: &mut ServerConfig) {
    config.ignore_client_order = true;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{self, CertMode};
    use ferry_testkit::tls::{provider, Verifier};
    use rustls::crypto::aws_lc_rs::default_provider;
    use rustls::version::{TLS12, TLS13};
    use rustls::{
        CipherSuite, ClientConfig, ClientConnection, ServerConnection, SupportedProtocolVersion,
    };
    use std::sync::Arc;

    /// What the DERP listener's configuration negotiates with a client
    /// that offers `offered`, in that order, on `version`.
    fn negotiated(
        offered: &[CipherSuite],
        version: &'static SupportedProtocolVersion,
    ) -> CipherSuite {
        let mode = CertMode::SelfSigned {
            hostname: "localhost".into(),
            certdir: None,
        };
        let setup = certs::server_config(&mode, [7; 32]).unwrap();
        let all = provider();
        let only = Arc::new(CryptoProvider {
            cipher_suites: offered
                .iter()
                .map(|o| *all.cipher_suites.iter().find(|s| s.suite() == *o).unwrap())
                .collect(),
            ..(*all).clone()
        });
        let client = ClientConfig::builder_with_provider(only.clone())
            .with_protocol_versions(&[version])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier::accept_any(only)))
            .with_no_client_auth();
        let mut c =
            ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap()).unwrap();
        let mut s = ServerConnection::new(setup.config).unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            s.read_tls(&mut &wire[..]).unwrap();
            s.process_new_packets().unwrap();
            let mut wire = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut wire).unwrap();
            }
            c.read_tls(&mut &wire[..]).unwrap();
            c.process_new_packets().unwrap();
            if !s.is_handshaking() && !c.is_handshaking() {
                break;
            }
        }
        assert!(!s.is_handshaking() && !c.is_handshaking());
        let suite = s.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(c.negotiated_cipher_suite().unwrap().suite(), suite);
        suite
    }

    /// A client that leaves the choice free, offering the suite this CPU
    /// handles worst first, gets the cheapest one here: AES-128-GCM where
    /// the CPU has AES instructions (as the machines Ferry is tested on
    /// have), else ChaCha20-Poly1305; on TLS 1.3 and TLS 1.2 alike. A
    /// client offering one suite still gets it.
    #[test]
    fn the_listener_picks_the_cheapest_suite_a_client_offers() {
        use CipherSuite as S;
        let fast = aes_is_fast();
        let (tls13, tls12) = if fast {
            (
                S::TLS13_AES_128_GCM_SHA256,
                S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            )
        } else {
            (
                S::TLS13_CHACHA20_POLY1305_SHA256,
                S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            )
        };
        let cases: [(&[S], &'static SupportedProtocolVersion, S); 4] = [
            (
                &[
                    S::TLS13_CHACHA20_POLY1305_SHA256,
                    S::TLS13_AES_256_GCM_SHA384,
                    S::TLS13_AES_128_GCM_SHA256,
                ],
                &TLS13,
                tls13,
            ),
            (
                &[
                    S::TLS13_AES_256_GCM_SHA384,
                    S::TLS13_AES_128_GCM_SHA256,
                    S::TLS13_CHACHA20_POLY1305_SHA256,
                ],
                &TLS13,
                tls13,
            ),
            (
                &[
                    S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                    S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                    S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                ],
                &TLS12,
                tls12,
            ),
            (
                &[S::TLS13_AES_256_GCM_SHA384],
                &TLS13,
                S::TLS13_AES_256_GCM_SHA384,
            ),
        ];
        for (offered, version, expected) in cases {
            assert_eq!(
                negotiated(offered, version),
                expected,
                "offered {offered:?}, AES instructions: {fast}"
            );
        }
    }

    fn order(aes_fast: bool) -> Vec<CipherSuite> {
        let mut p = default_provider();
        p.cipher_suites.sort_by_key(|s| rank(s, aes_fast));
        p.cipher_suites.iter().map(|s| s.suite()).collect()
    }

    /// The order on either kind of CPU (whichever this one is): TLS 1.3
    /// first, the cheapest AEAD leading each version, nothing lost.
    #[test]
    fn aes_128_leads_with_aes_instructions_and_chacha_without() {
        use CipherSuite as S;
        let with = order(true);
        assert_eq!(
            with[..3],
            [
                S::TLS13_AES_128_GCM_SHA256,
                S::TLS13_AES_256_GCM_SHA384,
                S::TLS13_CHACHA20_POLY1305_SHA256,
            ]
        );
        assert_eq!(cipher_of(with[3]), Some(Cipher::Aes128Gcm), "{with:?}");
        let without = order(false);
        assert_eq!(
            without[..3],
            [
                S::TLS13_CHACHA20_POLY1305_SHA256,
                S::TLS13_AES_128_GCM_SHA256,
                S::TLS13_AES_256_GCM_SHA384,
            ]
        );
        assert_eq!(
            cipher_of(without[3]),
            Some(Cipher::Chacha20Poly1305),
            "{without:?}"
        );
        let mut before: Vec<u16> = default_provider()
            .cipher_suites
            .iter()
            .map(|s| u16::from(s.suite()))
            .collect();
        let mut after: Vec<u16> = with.iter().map(|s| u16::from(*s)).collect();
        before.sort_unstable();
        after.sort_unstable();
        assert_eq!(after, before);
    }
}
