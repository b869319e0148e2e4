//! A test certificate authority and a certificate it issued for
//! `localhost`, written where both DERP servers read a manual certificate
//! (derper's `--certmode manual --certdir`, Ferry's `CertMode::Manual`):
//! `localhost.crt` and `localhost.key` in one directory.

use crate::tempdir::TempDir;
use rustls::pki_types::CertificateDer;
use std::sync::Arc;

/// The CA's root, the leaf it signed, and the directory holding the leaf.
pub struct TestCa {
    /// Holds `localhost.crt` and `localhost.key`.
    pub dir: TempDir,
    /// The root certificate clients are to trust.
    pub root: CertificateDer<'static>,
    /// The leaf certificate servers present.
    pub leaf: CertificateDer<'static>,
    /// The root certificate in PEM (for `SSL_CERT_FILE`).
    pub root_pem: String,
}

impl TestCa {
    /// A new CA and leaf (fresh keys each time).
    pub fn new() -> Arc<TestCa> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ferry test CA");
        let ca = ca.self_signed(&ca_key).expect("CA certificate");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("leaf parameters")
            .signed_by(&leaf_key, &ca, &ca_key)
            .expect("leaf certificate");
        let dir = TempDir::new("test-ca");
        std::fs::write(dir.path().join("localhost.crt"), leaf.pem()).expect("writing the leaf");
        std::fs::write(dir.path().join("localhost.key"), leaf_key.serialize_pem())
            .expect("writing the leaf's key");
        Arc::new(TestCa {
            dir,
            root: ca.der().clone(),
            leaf: leaf.der().clone(),
            root_pem: ca.pem(),
        })
    }

    /// A root store holding this CA alone.
    pub fn root_store(&self) -> rustls::RootCertStore {
        let mut store = rustls::RootCertStore::empty();
        store.add(self.root.clone()).expect("a valid root");
        store
    }
}
