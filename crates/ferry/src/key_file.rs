//! Key files in derper's JSON format (`{"PrivateKey":"privkey:…"}`): the
//! DERP server's `--key-file` and `ferry link`'s `key_file`. A missing
//! file means a new key, written (owner-only, never over an existing file)
//! once the service has started, so a refused start writes nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ferry_proto::key::NodePrivate;

/// A key, and where it still has to be written.
pub(crate) struct KeyFile {
    /// The key.
    pub private: NodePrivate,
    /// Where a freshly made key goes ([`KeyFile::persist`]); `None` when
    /// it was read from its file (or is never kept).
    pub unsaved: Option<PathBuf>,
}

impl KeyFile {
    /// Reads the key at `path`, or makes a new one for that path when the
    /// file does not exist. `what` names the setting in errors (`--key-file`,
    /// `key_file`).
    pub(crate) fn load(path: &Path, what: &str) -> Result<KeyFile> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(KeyFile {
                private: NodePrivate::from_key_file_json(&text)
                    .map_err(|e| anyhow::anyhow!("{what} {}: {e}", path.display()))?,
                unsaved: None,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KeyFile {
                private: NodePrivate::generate(),
                unsaved: Some(path.to_path_buf()),
            }),
            Err(e) => Err(e).with_context(|| format!("{what}: reading {}", path.display())),
        }
    }

    /// A fresh key that is never written (`--dev`).
    pub(crate) fn ephemeral() -> KeyFile {
        KeyFile {
            private: NodePrivate::generate(),
            unsaved: None,
        }
    }

    /// Writes a new key to its file (owner-only), creating the directory;
    /// `true` when it wrote one.
    pub(crate) fn persist(&self, what: &str) -> Result<bool> {
        let Some(path) = &self.unsaved else {
            return Ok(false);
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("{what}: creating {}", dir.display()))?;
        }
        write_private(path, self.private.to_key_file_json().as_bytes())
            .with_context(|| format!("{what}: writing {}", path.display()))?;
        Ok(true)
    }
}

/// Writes a new file, owner-only, never over an existing one.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    ferry_sys::files::write_file(path, bytes, 0o600, ferry_sys::files::Existing::Keep)
}
