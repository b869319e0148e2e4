//! Certificate reload without restart (manual mode).
//!
//! A [`CertReloader`] remembers a stamp (modification time, size, inode) of
//! the certificate and key files. Each [`CertReloader::check`] compares fresh
//! stamps against it and, when either file changed, loads and validates both
//! and stores the new chain (with the same meta-certificate) in the
//! `ArcSwap` the resolver reads. Handshakes already under way keep the chain
//! they loaded; new ones see the new chain. A file that fails to load leaves
//! the previous chain in service and is retried when it changes again.
//!
//! The reloader holds only a weak reference to the chain, so a reload thread
//! winds down once the server configuration is gone.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;

use super::manual::{self_signed_cert_name, CertFiles, FilesStamp};
use super::{with_meta, CertError};

/// Watches the manual-mode certificate files and swaps in new certificates.
///
/// Cloning is cheap; clones share the same state.
#[derive(Clone)]
pub struct CertReloader {
    inner: Arc<Inner>,
}

struct Inner {
    files: CertFiles,
    meta: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
    target: Weak<ArcSwap<CertifiedKey>>,
    /// Stamp of the files as last loaded (or last failed to load).
    seen: Mutex<FilesStamp>,
}

impl CertReloader {
    pub(super) fn new(
        files: CertFiles,
        loaded: FilesStamp,
        meta: CertificateDer<'static>,
        provider: Arc<CryptoProvider>,
        target: &Arc<ArcSwap<CertifiedKey>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                files,
                meta,
                provider,
                target: Arc::downgrade(target),
                seen: Mutex::new(loaded),
            }),
        }
    }

    /// The certificate file being watched.
    pub fn cert_path(&self) -> &Path {
        &self.inner.files.cert
    }

    /// The key file being watched.
    pub fn key_path(&self) -> &Path {
        &self.inner.files.key
    }

    /// Checks the files once and reloads them if they changed.
    ///
    /// Returns `Ok(true)` when a new chain was swapped in, `Ok(false)` when
    /// nothing changed (or the configuration is gone), and the load error
    /// when the changed files were unusable, in which case the previous
    /// chain stays in service. Both outcomes are also logged.
    pub fn check(&self) -> Result<bool, CertError> {
        let Some(target) = self.inner.target.upgrade() else {
            return Ok(false);
        };
        // Stamp before reading: if a file changes while being read, the next
        // check sees a newer stamp and loads it again.
        let now = self.inner.files.stamp();
        {
            let mut seen = self
                .inner
                .seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *seen == now {
                return Ok(false);
            }
            // Recorded even if loading fails, so a broken file is reported
            // once per change rather than on every tick.
            *seen = now;
        }
        match self.inner.files.load(&self.inner.provider) {
            Ok(leaf) => {
                // A self-signed replacement changes the pin clients need.
                let cert_name = self_signed_cert_name(&leaf.cert, self.cert_path());
                target.store(Arc::new(with_meta(leaf, &self.inner.meta)));
                tracing::info!(
                    cert = %self.cert_path().display(),
                    key = %self.key_path().display(),
                    cert_name = cert_name.as_deref().unwrap_or("(CA-issued)"),
                    "reloaded TLS certificate"
                );
                Ok(true)
            }
            Err(err) => {
                tracing::error!(error = %err, "TLS certificate reload failed; keeping the previous certificate");
                Err(err)
            }
        }
    }

    /// Starts a thread that calls [`check`](Self::check) every `interval`
    /// for as long as the server configuration exists.
    pub fn spawn(&self, interval: Duration) -> io::Result<JoinHandle<()>> {
        let reloader = self.clone();
        thread::Builder::new()
            .name("ferry-tls-reload".into())
            .spawn(move || {
                while reloader.in_use() {
                    thread::sleep(interval);
                    // Errors are logged by `check`; the old chain stays.
                    let _ = reloader.check();
                }
                tracing::debug!("TLS configuration dropped; reload thread exiting");
            })
    }

    /// Whether any server configuration still reads the chain.
    fn in_use(&self) -> bool {
        self.inner.target.strong_count() > 0
    }
}

impl fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert", &self.inner.files.cert)
            .field("key", &self.inner.files.key)
            .finish_non_exhaustive()
    }
}
