//! Self-signed leaf certificates: development mode, and derper's fallback for
//! an IP hostname without certificate files.
//!
//! Clients cannot validate these against a CA; they pin them by hash through
//! the DERP map's `CertName = "sha256-raw:<hex>"`, which also checks the
//! validity period. The validity is therefore long, so that a pinned
//! certificate written to disk does not expire under a running deployment.

use std::net::IpAddr;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};

use super::CertError;

/// Backdating, to tolerate clients whose clocks run slow.
const BACKDATE: Duration = Duration::days(1);

/// Lifetime of a generated certificate.
const LIFETIME: Duration = Duration::days(10 * 365);

/// A freshly generated certificate and its key.
pub(super) struct Generated {
    /// The certificate, DER.
    pub cert: CertificateDer<'static>,
    /// Its ECDSA P-256 private key, PKCS#8 DER.
    pub key: PrivatePkcs8KeyDer<'static>,
    /// The certificate, PEM, for writing to disk.
    pub cert_pem: String,
    /// The key, PEM, for writing to disk.
    pub key_pem: String,
}

/// Generates an ECDSA P-256 certificate for `hostname` (a DNS name or IP
/// literal, already normalized).
///
/// With `loopback`, the certificate also names `localhost`, `127.0.0.1` and
/// `::1`, so local tools and tests can reach a development server by any of
/// them.
pub(super) fn generate(hostname: &str, loopback: bool) -> Result<Generated, CertError> {
    let generate = |source| CertError::Generate {
        what: "self-signed certificate",
        source,
    };

    let mut names = vec![san_for(hostname).map_err(generate)?];
    if loopback {
        let localhost = SanType::DnsName("localhost".try_into().map_err(generate)?);
        let v4 = SanType::IpAddress(IpAddr::from([127, 0, 0, 1]));
        let v6 = SanType::IpAddress(IpAddr::from(std::net::Ipv6Addr::LOCALHOST));
        for name in [localhost, v4, v6] {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }

    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, hostname);
    let now = OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    params.distinguished_name = subject;
    params.subject_alt_names = names;
    params.not_before = now - BACKDATE;
    params.not_after = now + LIFETIME;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(generate)?;
    let cert = params.self_signed(&key).map_err(generate)?;
    Ok(Generated {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert: cert.der().clone(),
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
    })
}

/// An IP SAN for an IP literal, a DNS SAN otherwise.
fn san_for(hostname: &str) -> Result<SanType, rcgen::Error> {
    Ok(match hostname.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(hostname.try_into()?),
    })
}
