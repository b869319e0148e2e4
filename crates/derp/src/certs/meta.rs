//! The DERP meta-certificate (`docs/derp-protocol.md` §4.1).
//!
//! A TLS 1.3 client scans the served chain for a certificate whose subject
//! common name is `derpkey` followed by 64 hex digits; those digits are the
//! server's DERP public key and the serial number is the DERP protocol
//! version. Knowing both before the HTTP request lets the client send
//! `Derp-Fast-Start: 1` and skip the `101 Switching Protocols` round trip.
//!
//! Only the subject and serial are read, but Go's TLS stack parses every
//! certificate in a chain and aborts on any malformed one, so this must be a
//! proper X.509 v3 certificate: self-signed with a fresh Ed25519 key, basic
//! constraints present and not a CA, valid from 30 days ago to 30 days ahead.

use rcgen::{
    CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, SerialNumber, PKCS_ED25519,
};
use rustls::pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};

use super::{hex_lower, CertError};

/// Subject common-name prefix that marks the meta-certificate.
pub const META_CN_PREFIX: &str = "derpkey";

/// Serial number of the meta-certificate: the DERP protocol version it
/// advertises.
pub const META_SERIAL: u8 = 2;

/// How far either side of `now` the meta-certificate is valid.
const VALIDITY: Duration = Duration::days(30);

/// Generates the meta-certificate for `server_public`, valid around `now`.
pub(super) fn meta_certificate(
    server_public: &[u8; 32],
    now: OffsetDateTime,
) -> Result<CertificateDer<'static>, CertError> {
    let generate = |source| CertError::Generate {
        what: "DERP meta-certificate",
        source,
    };
    let key = KeyPair::generate_for(&PKCS_ED25519).map_err(generate)?;

    let mut subject = DistinguishedName::new();
    subject.push(
        DnType::CommonName,
        format!("{META_CN_PREFIX}{}", hex_lower(server_public)),
    );
    let mut params = CertificateParams::default();
    params.distinguished_name = subject;
    params.serial_number = Some(SerialNumber::from_slice(&[META_SERIAL]));
    params.not_before = now - VALIDITY;
    params.not_after = now + VALIDITY;
    // `ExplicitNoCa` writes basicConstraints with cA = FALSE, as derper's
    // meta-certificate has; `NoCa` would omit the extension.
    params.is_ca = IsCa::ExplicitNoCa;

    let cert = params.self_signed(&key).map_err(generate)?;
    Ok(cert.der().clone())
}
