//! Resource limits raised at start-up.
//!
//! A relay holds one descriptor per client connection, so the default soft
//! limit of 1024 open files is far too low. The hard limit is what the
//! administrator (or systemd's `LimitNOFILE=`) granted; raising the soft limit
//! up to it needs no privilege.

use std::io;

/// Where Linux publishes the ceiling for any `RLIMIT_NOFILE` value.
const NR_OPEN_PATH: &str = "/proc/sys/fs/nr_open";

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the new soft
/// limit.
///
/// When the hard limit is unlimited, the soft limit is set to the kernel's
/// `fs.nr_open` ceiling instead (the kernel rejects larger values). A soft
/// limit already at the hard limit is left alone.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = get_nofile()?;
    let target = if lim.rlim_max == libc::RLIM_INFINITY {
        match nr_open() {
            Some(n) => n as libc::rlim_t,
            None => return Ok(lim.rlim_cur as u64),
        }
    } else {
        lim.rlim_max
    };
    if lim.rlim_cur >= target {
        return Ok(lim.rlim_cur as u64);
    }
    lim.rlim_cur = target;
    // SAFETY: `lim` is a fully initialised rlimit on our stack, valid for the
    // duration of the call; setrlimit only reads it.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(get_nofile()?.rlim_cur as u64)
}

/// Reads the current `RLIMIT_NOFILE` pair.
fn get_nofile() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a writable rlimit on our stack; getrlimit writes
    // exactly one rlimit through the pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

/// The kernel's `fs.nr_open`, if readable.
fn nr_open() -> Option<u64> {
    std::fs::read_to_string(NR_OPEN_PATH)
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_reaches_the_hard_limit_and_is_idempotent() {
        let before = get_nofile().unwrap();
        let raised = raise_nofile_limit().unwrap();
        let after = get_nofile().unwrap();
        assert_eq!(after.rlim_cur as u64, raised);
        assert!(raised >= before.rlim_cur as u64);
        assert_eq!(after.rlim_max, before.rlim_max, "hard limit untouched");
        if before.rlim_max != libc::RLIM_INFINITY {
            assert_eq!(after.rlim_cur, after.rlim_max);
        }
        assert_eq!(raise_nofile_limit().unwrap(), raised);
    }

    #[test]
    fn nr_open_is_readable() {
        assert!(nr_open().is_some_and(|n| n >= 1024));
    }
}
