//! Moving the calling thread into a named network namespace.
//!
//! Tests that run as root make namespaces with `ip netns add NAME` (which
//! leaves a handle at `/run/netns/NAME`) and run parts of themselves
//! inside them: a thread that called [`enter`] creates its sockets in that
//! namespace, and so do the threads it starts afterwards. A socket keeps
//! the namespace it was made in wherever it is used from. Other threads of
//! the process are not affected.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The handle `ip netns add NAME` leaves for namespace `name`.
pub fn named(name: &str) -> std::path::PathBuf {
    Path::new("/run/netns").join(name)
}

/// Moves the calling thread into the network namespace whose handle is at
/// `path` (see [`named`]). Needs `CAP_SYS_ADMIN`.
pub fn enter(path: &Path) -> io::Result<()> {
    let ns = File::open(path)?;
    // SAFETY: `ns` is an open descriptor owned by this function for the
    // whole call; setns only reads it and changes the calling thread's
    // network namespace, which touches no memory of this process.
    crate::zero_or_errno(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_an_error_and_changes_nothing() {
        let err = enter(&named("ferry-no-such-namespace")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_file_that_is_no_namespace_is_refused() {
        // Any regular file: setns answers EINVAL for a descriptor of the
        // wrong kind (and EPERM without the capability).
        let err = enter(Path::new("/proc/self/status")).unwrap_err();
        assert!(
            matches!(err.raw_os_error(), Some(libc::EINVAL | libc::EPERM)),
            "{err}"
        );
    }
}
