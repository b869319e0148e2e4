//! Manual-mode certificate files, derper-compatible.
//!
//! derper's `--certmode=manual` reads `<certdir>/<name>.crt` and
//! `<certdir>/<name>.key`, where `<name>` is the hostname with every
//! character outside `[A-Za-z0-9.-]` removed (so an IPv6 hostname `2001:db8::1`
//! uses `2001db81.crt`). Ferry uses the same names so a derper deployment's
//! certificate directory works unchanged.
//!
//! Loading validates what the TLS handshake would otherwise discover late:
//! the leaf parses as X.509, covers the hostname, and matches the key.
//! When the hostname is an IP literal and neither file exists, a self-signed
//! certificate is generated and written there, so the `sha256-raw:` pin that
//! the DERP map carries stays the same across restarts.

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ferry_sys::files::Existing;
use rustls::client::verify_server_name;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::ParsedCertificate;
use rustls::sign::CertifiedKey;
use rustls::{Error as RustlsError, InconsistentKeys};

use super::{self_signed, sha256_raw_cert_name, CertError};

/// The certificate and key files for one hostname.
pub(super) struct CertFiles {
    /// `<certdir>/<name>.crt`: PEM certificates, leaf first.
    pub cert: PathBuf,
    /// `<certdir>/<name>.key`: one PEM private key.
    pub key: PathBuf,
    /// The hostname the leaf must be valid for.
    hostname: String,
    /// The same, as rustls checks it against the leaf.
    server_name: ServerName<'static>,
}

/// A file's identity and version, cheap to read with one `stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    dev: u64,
    ino: u64,
}

/// Stamps of the certificate and key file; `None` for a file that cannot be
/// stat'ed (missing, unreadable directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FilesStamp {
    cert: Option<FileStamp>,
    key: Option<FileStamp>,
}

/// The outcome of setting up manual mode.
pub(super) struct Loaded {
    /// Leaf chain and key, without the meta-certificate.
    pub leaf: CertifiedKey,
    /// `sha256-raw:` name of the leaf, when it is self-signed.
    pub cert_name: Option<String>,
    /// Files to watch for reload, with their stamp as loaded.
    pub watch: Option<(CertFiles, FilesStamp)>,
}

impl CertFiles {
    /// The files for `hostname` (normalized) in `certdir`.
    pub(super) fn new(
        certdir: &Path,
        hostname: &str,
        ip: Option<IpAddr>,
    ) -> Result<Self, CertError> {
        Self::named(certdir, hostname, ip, "")
    }

    /// The files `<name><suffix>.crt` and `.key` for `hostname`.
    fn named(
        certdir: &Path,
        hostname: &str,
        ip: Option<IpAddr>,
        suffix: &str,
    ) -> Result<Self, CertError> {
        let invalid = |reason| CertError::InvalidHostname {
            hostname: hostname.to_owned(),
            reason,
        };
        let base: String = hostname
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
            .collect();
        if base.is_empty() || base.chars().all(|c| c == '.') {
            return Err(invalid("no usable characters for a certificate file name"));
        }
        let server_name = match ip {
            Some(ip) => ServerName::IpAddress(ip.into()),
            None => ServerName::try_from(hostname.to_owned())
                .map_err(|_| invalid("not a valid DNS name or IP address"))?,
        };
        Ok(Self {
            cert: certdir.join(format!("{base}{suffix}.crt")),
            key: certdir.join(format!("{base}{suffix}.key")),
            hostname: hostname.to_owned(),
            server_name,
        })
    }

    /// Stats both files.
    pub(super) fn stamp(&self) -> FilesStamp {
        let stamp = |path: &Path| {
            fs::metadata(path).ok().map(|m| FileStamp {
                modified: m.modified().ok(),
                len: m.len(),
                dev: m.dev(),
                ino: m.ino(),
            })
        };
        FilesStamp {
            cert: stamp(&self.cert),
            key: stamp(&self.key),
        }
    }

    /// Reads and validates the certificate chain and key.
    pub(super) fn load(&self, provider: &CryptoProvider) -> Result<CertifiedKey, CertError> {
        let cert_pem = read(&self.cert)?;
        let key_pem = read(&self.key)?;

        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| CertError::Pem {
                path: self.cert.clone(),
                source,
            })?;
        let Some(leaf) = chain.first() else {
            return Err(CertError::NoCertificate {
                path: self.cert.clone(),
            });
        };
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| match err {
            pem::Error::NoItemsFound => CertError::NoPrivateKey {
                path: self.key.clone(),
            },
            source => CertError::Pem {
                path: self.key.clone(),
                source,
            },
        })?;

        let parsed =
            ParsedCertificate::try_from(leaf).map_err(|source| CertError::BadCertificate {
                path: self.cert.clone(),
                source,
            })?;
        verify_server_name(&parsed, &self.server_name).map_err(|source| {
            CertError::NameMismatch {
                path: self.cert.clone(),
                hostname: self.hostname.clone(),
                source,
            }
        })?;

        let signing_key = provider
            .key_provider
            .load_private_key(key)
            .map_err(|source| CertError::UnsupportedKey {
                path: self.key.clone(),
                source,
            })?;
        let certified = CertifiedKey::new(chain, signing_key);
        match certified.keys_match() {
            // `Unknown`: the key type cannot report its public half; the
            // handshake itself would then fail visibly.
            Ok(()) | Err(RustlsError::InconsistentKeys(InconsistentKeys::Unknown)) => {}
            Err(RustlsError::InconsistentKeys(_)) => {
                return Err(CertError::KeyMismatch {
                    cert: self.cert.clone(),
                    key: self.key.clone(),
                })
            }
            Err(source) => {
                return Err(CertError::BadCertificate {
                    path: self.cert.clone(),
                    source,
                })
            }
        }
        Ok(certified)
    }
}

/// Loads the manual-mode files, or generates and saves a self-signed
/// certificate when the hostname is an IP and neither file exists.
pub(super) fn load_or_generate(
    files: CertFiles,
    ip: Option<IpAddr>,
    provider: &CryptoProvider,
) -> Result<Loaded, CertError> {
    if let Some(ip) = ip {
        if !exists(&files.cert)? && !exists(&files.key)? {
            return generate_for_ip(files, ip, provider);
        }
    }

    let stamp = files.stamp();
    let leaf = files.load(provider)?;
    let cert_name = self_signed_cert_name(&leaf.cert, &files.cert);
    if let Some(cert_name) = &cert_name {
        tracing::info!(
            cert = %files.cert.display(),
            %cert_name,
            "TLS certificate is self-signed; clients must pin it with this CertName"
        );
    }
    Ok(Loaded {
        leaf,
        cert_name,
        watch: Some((files, stamp)),
    })
}

/// derper's IP-certificate fallback: generate, save, and announce the pin.
fn generate_for_ip(
    files: CertFiles,
    ip: IpAddr,
    provider: &CryptoProvider,
) -> Result<Loaded, CertError> {
    let generated = self_signed::generate(&ip.to_string(), false)?;
    let cert_name = sha256_raw_cert_name(&generated.cert);

    let saved = save_generated(&files, &generated);
    if let Err(err) = &saved {
        tracing::warn!(
            error = %err,
            "could not save the generated certificate; it and its CertName will change on restart"
        );
    }
    tracing::info!(
        %ip,
        cert = %files.cert.display(),
        %cert_name,
        "no certificate files for this IP hostname; generated a self-signed certificate. \
         In the DERP map, set this node's HostName to the IP and CertName to the value shown"
    );

    let key = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(generated.key))
        .map_err(CertError::Config)?;
    let leaf = CertifiedKey::new(vec![generated.cert], key);
    let watch = saved.is_ok().then(|| {
        let stamp = files.stamp();
        (files, stamp)
    });
    Ok(Loaded {
        leaf,
        cert_name: Some(cert_name),
        watch,
    })
}

/// `--certmode selfsigned` with a directory: the generated certificate and
/// key are kept as `<certdir>/<name>.selfsigned.crt` and `.key` and used
/// again on the next start while they are valid for `hostname`, so the
/// `sha256-raw:` CertName a DERP map pins survives restarts. Files for
/// another hostname, or not self-signed, are replaced; files that cannot be
/// read or parsed are an error (they are not silently overwritten).
///
/// Returns the leaf (without the meta-certificate) and its CertName.
pub(super) fn load_or_generate_self_signed(
    certdir: &Path,
    hostname: &str,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, String), CertError> {
    let ip = hostname.parse::<IpAddr>().ok();
    let files = CertFiles::named(certdir, hostname, ip, ".selfsigned")?;
    if exists(&files.cert)? || exists(&files.key)? {
        let stale = match files.load(provider) {
            Ok(leaf) => match self_signed_cert_name(&leaf.cert, &files.cert) {
                Some(cert_name) => {
                    tracing::info!(
                        cert = %files.cert.display(),
                        %hostname,
                        %cert_name,
                        "using the self-signed TLS certificate generated earlier"
                    );
                    return Ok((leaf, cert_name));
                }
                None => "is not self-signed",
            },
            Err(CertError::NameMismatch { .. }) => "was made for another hostname",
            Err(err) => return Err(err),
        };
        tracing::warn!(
            cert = %files.cert.display(),
            %hostname,
            "the kept self-signed certificate {stale}; generating a new one (its CertName changes)"
        );
        for path in [&files.cert, &files.key] {
            fs::remove_file(path).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(CertError::Io {
                    path: path.clone(),
                    source: e,
                }),
            })?;
        }
    }
    let generated = self_signed::generate(hostname, true)?;
    let cert_name = sha256_raw_cert_name(&generated.cert);
    match save_generated(&files, &generated) {
        Ok(()) => tracing::info!(
            %hostname,
            cert = %files.cert.display(),
            %cert_name,
            "generated a self-signed TLS certificate and kept it for the next start"
        ),
        Err(err) => tracing::warn!(
            error = %err,
            %cert_name,
            "generated a self-signed TLS certificate but could not keep it; it and its CertName will change on restart"
        ),
    }
    let key = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(generated.key))
        .map_err(CertError::Config)?;
    Ok((CertifiedKey::new(vec![generated.cert], key), cert_name))
}

/// Writes a generated key (owner-only) and certificate, never overwriting.
fn save_generated(files: &CertFiles, generated: &self_signed::Generated) -> Result<(), CertError> {
    if let Some(dir) = files.cert.parent() {
        fs::create_dir_all(dir).map_err(|source| CertError::Io {
            path: dir.to_owned(),
            source,
        })?;
    }
    write_new(&files.key, generated.key_pem.as_bytes(), 0o600)?;
    if let Err(err) = write_new(&files.cert, generated.cert_pem.as_bytes(), 0o644) {
        // Without its certificate the key file would make the next start
        // fail; take it back.
        let _ = fs::remove_file(&files.key);
        return Err(err);
    }
    Ok(())
}

/// Creates `path` with `mode` and writes `contents`, failing if it exists.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    ferry_sys::files::write_file(path, contents, mode, Existing::Keep).map_err(|source| {
        CertError::Io {
            path: path.to_owned(),
            source,
        }
    })
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    fs::read(path).map_err(|source| CertError::Io {
        path: path.to_owned(),
        source,
    })
}

fn exists(path: &Path) -> Result<bool, CertError> {
    path.try_exists().map_err(|source| CertError::Io {
        path: path.to_owned(),
        source,
    })
}

/// The `sha256-raw:` name of a self-signed leaf, or `None` for a CA-issued
/// one. Warns when a self-signed leaf comes with more certificates, which
/// pinning clients reject (`docs/derp-protocol.md` §19).
pub(super) fn self_signed_cert_name(chain: &[CertificateDer<'_>], path: &Path) -> Option<String> {
    let leaf = chain.first()?;
    if is_self_issued(leaf) != Some(true) {
        return None;
    }
    if chain.len() > 1 {
        tracing::warn!(
            cert = %path.display(),
            extra = chain.len() - 1,
            "self-signed leaf is followed by further certificates; clients pinning it \
             with a sha256-raw CertName will refuse the chain"
        );
    }
    Some(sha256_raw_cert_name(leaf))
}

/// Whether a certificate's issuer and subject names are byte-identical, the
/// mark of a self-signed certificate. `None` if the DER cannot be walked.
fn is_self_issued(cert: &[u8]) -> Option<bool> {
    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const VERSION: u8 = 0xa0; // [0] EXPLICIT

    let (cert, _) = der_expect(cert, SEQUENCE)?;
    let (tbs, _) = der_expect(cert.content, SEQUENCE)?;
    let mut rest = tbs.content;
    if rest.first() == Some(&VERSION) {
        rest = der_expect(rest, VERSION)?.1;
    }
    let (_serial, rest) = der_expect(rest, INTEGER)?;
    let (_signature, rest) = der_expect(rest, SEQUENCE)?;
    let (issuer, rest) = der_expect(rest, SEQUENCE)?;
    let (_validity, rest) = der_expect(rest, SEQUENCE)?;
    let (subject, _) = der_expect(rest, SEQUENCE)?;
    Some(issuer.whole == subject.whole)
}

/// One DER element: its full encoding and its contents.
struct Der<'a> {
    whole: &'a [u8],
    content: &'a [u8],
}

/// Splits the leading DER element with tag `tag` off `input`.
fn der_expect(input: &[u8], tag: u8) -> Option<(Der<'_>, &[u8])> {
    let (&found, after_tag) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut after_len) = after_tag.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let octets = usize::from(first & 0x7f);
        if octets == 0 || octets > 4 || after_len.len() < octets {
            return None;
        }
        let (len_bytes, rest) = after_len.split_at(octets);
        after_len = rest;
        len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if after_len.len() < len {
        return None;
    }
    let header = input.len() - after_len.len();
    let (whole, rest) = input.split_at(header + len);
    Some((
        Der {
            whole,
            content: &whole[header..],
        },
        rest,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_follow_derper() {
        let dir = Path::new("/certs");
        let f = CertFiles::new(dir, "derp.example.com", None).unwrap();
        assert_eq!(f.cert, Path::new("/certs/derp.example.com.crt"));
        assert_eq!(f.key, Path::new("/certs/derp.example.com.key"));
        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        let f = CertFiles::new(dir, "2001:db8::1", Some(ip)).unwrap();
        assert_eq!(f.cert, Path::new("/certs/2001db81.crt"));
        let ip: IpAddr = "::".parse().unwrap();
        assert!(matches!(
            CertFiles::new(dir, "::", Some(ip)),
            Err(CertError::InvalidHostname { .. })
        ));
        assert!(CertFiles::new(dir, "not a name", None).is_err());
    }

    #[test]
    fn self_issued_detection() {
        let generated = self_signed::generate("derp.example.com", false).unwrap();
        assert_eq!(is_self_issued(&generated.cert), Some(true));

        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["derp.example.com".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        assert_eq!(is_self_issued(leaf.der()), Some(false));

        assert_eq!(is_self_issued(b""), None);
        assert_eq!(is_self_issued(&generated.cert[..40]), None);
    }

    #[test]
    fn der_lengths() {
        // Short form.
        let (el, rest) = der_expect(&[0x30, 0x01, 0xaa, 0xbb], 0x30).unwrap();
        assert_eq!(el.content, &[0xaa]);
        assert_eq!(rest, &[0xbb]);
        // Long form, two length octets.
        let mut long = vec![0x04, 0x82, 0x01, 0x00];
        long.extend_from_slice(&[7; 256]);
        let (el, rest) = der_expect(&long, 0x04).unwrap();
        assert_eq!(el.content.len(), 256);
        assert!(rest.is_empty());
        // Truncated, wrong tag, indefinite length.
        assert!(der_expect(&[0x30, 0x05, 0x00], 0x30).is_none());
        assert!(der_expect(&[0x31, 0x00], 0x30).is_none());
        assert!(der_expect(&[0x30, 0x80], 0x30).is_none());
    }
}
