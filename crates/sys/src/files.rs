//! Files Ferry writes for itself: private keys (the node key, TLS keys,
//! the ACME account) and the certificates beside them.
//!
//! [`write_file`] never opens a name someone else may have prepared. The
//! bytes go into a fresh temporary file beside the target, created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` and the final mode from the start (a
//! file or a symlink left at that name makes the creation fail, and the
//! next name is tried; nothing is written through it and no mode is
//! inherited from it), synced, and then put in place in one step: a rename
//! that replaces whatever the target name held (a symlink there is
//! replaced, not followed), or a hard link that fails if the target
//! exists. A reader sees the old file or the whole new one, never a part.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Temporary names tried before giving up (each is new; a failure means
/// someone keeps planting files at them).
const TEMP_TRIES: u32 = 16;

/// What [`write_file`] does when the target exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Replace it (a renewed certificate or key).
    Replace,
    /// Keep it and fail with [`io::ErrorKind::AlreadyExists`] (a key made
    /// once that must never be overwritten).
    Keep,
}

/// Writes `bytes` to `path` with permission bits `mode` (0o600 for a
/// secret), as the module documentation says. The directory must exist.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32, existing: Existing) -> io::Result<()> {
    let (tmp, mut file) = create_temp(path, mode)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| match existing {
            Existing::Replace => std::fs::rename(&tmp, path),
            Existing::Keep => std::fs::hard_link(&tmp, path),
        });
    if written.is_err() || existing == Existing::Keep {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The new name is durable once its directory is; where a file system
    // cannot sync a directory, the file itself already is.
    if let Some(dir) = parent(path) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// A new file beside `path`, open for writing, at a name no one prepared.
fn create_temp(path: &Path, mode: u32) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy();
    let dir = parent(path).unwrap_or_else(|| Path::new("."));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut last = None;
    for _ in 0..TEMP_TRIES {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{nanos:x}.{n}.tmp", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(mode)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

fn parent(path: &Path) -> Option<&Path> {
    path.parent().filter(|d| !d.as_os_str().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!(
                "ferry-files-{tag}-{}-{}",
                std::process::id(),
                COUNTER_FOR_TESTS.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }

        /// Names in the directory, sorted.
        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    static COUNTER_FOR_TESTS: AtomicU64 = AtomicU64::new(0);

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_file_has_its_mode_and_no_temporary_stays() {
        let d = Dir::new("new");
        let key = d.0.join("node.key");
        write_file(&key, b"secret", 0o600, Existing::Keep).unwrap();
        assert_eq!(std::fs::read(&key).unwrap(), b"secret");
        assert_eq!(mode_of(&key), 0o600);
        let cert = d.0.join("node.crt");
        write_file(&cert, b"public", 0o644, Existing::Replace).unwrap();
        assert_eq!(mode_of(&cert) & 0o600, 0o600);
        assert_eq!(d.names(), ["node.crt", "node.key"]);
    }

    #[test]
    fn keep_never_overwrites_and_replace_does() {
        let d = Dir::new("keep");
        let key = d.0.join("k");
        write_file(&key, b"first", 0o600, Existing::Keep).unwrap();
        let e = write_file(&key, b"second", 0o600, Existing::Keep).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&key).unwrap(), b"first");
        // A replaced file gets the new mode, not the old one.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_file(&key, b"third", 0o600, Existing::Replace).unwrap();
        assert_eq!(std::fs::read(&key).unwrap(), b"third");
        assert_eq!(mode_of(&key), 0o600);
        assert_eq!(d.names(), ["k"]);
    }

    #[test]
    fn a_symlink_at_the_target_is_replaced_or_refused_never_followed() {
        let d = Dir::new("link");
        let victim = d.0.join("victim");
        std::fs::write(&victim, b"untouched").unwrap();
        let key = d.0.join("k");
        symlink(&victim, &key).unwrap();
        let e = write_file(&key, b"secret", 0o600, Existing::Keep).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        write_file(&key, b"secret", 0o600, Existing::Replace).unwrap();
        assert!(std::fs::symlink_metadata(&key).unwrap().is_file());
        assert_eq!(mode_of(&key), 0o600);
        assert_eq!(std::fs::read(&victim).unwrap(), b"untouched");
        // A dangling link, too.
        let dangling = d.0.join("dangling");
        symlink(d.0.join("nowhere"), &dangling).unwrap();
        write_file(&dangling, b"x", 0o600, Existing::Replace).unwrap();
        assert!(!d.0.join("nowhere").exists());
        assert!(std::fs::symlink_metadata(&dangling).unwrap().is_file());
    }

    #[test]
    fn the_temporary_file_is_private_from_its_creation() {
        let d = Dir::new("temp");
        let (tmp, file) = create_temp(&d.0.join("k"), 0o600).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0);
        assert_eq!(mode_of(&tmp), 0o600);
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".k.") && name.ends_with(".tmp"), "{name}");
        // Each call takes a new name.
        let (again, _) = create_temp(&d.0.join("k"), 0o600).unwrap();
        assert_ne!(tmp, again);
    }
}
