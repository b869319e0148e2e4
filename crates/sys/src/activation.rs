//! Sockets handed over by a service manager (systemd's socket activation:
//! `LISTEN_FDS` descriptors from 3 on), and the same hand-over when
//! spawning a child, for tests and for anything that plays the manager.
//!
//! A listening socket that outlives the process serving it is what makes a
//! restart invisible to clients: while one process drains and the next
//! starts, connections wait in the socket's backlog instead of being
//! refused.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The first descriptor of the protocol.
const FIRST: RawFd = 3;
/// More than any service needs; a larger count is refused as malformed.
const MAX_FDS: usize = 64;

/// Takes the descriptors a service manager passed (`LISTEN_FDS=n`: fds 3
/// to 3+n-1), once: the variables are removed, so a child does not see
/// them, and each descriptor is marked close-on-exec. `LISTEN_PID`, when
/// set, must be this process (otherwise the descriptors were meant for a
/// parent and none are taken). No variable: no descriptors. Call it at
/// start, before other threads read the environment.
pub fn listen_fds() -> io::Result<Vec<OwnedFd>> {
    let Ok(count) = std::env::var("LISTEN_FDS") else {
        return Ok(Vec::new());
    };
    let pid = std::env::var("LISTEN_PID").ok();
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDNAMES");
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return Ok(Vec::new());
        }
    }
    let n: usize = count.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={count:?} is not a count"),
        )
    })?;
    if n > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={n}: more than {MAX_FDS} descriptors"),
        ));
    }
    let mut fds = Vec::with_capacity(n);
    for fd in FIRST..FIRST + n as RawFd {
        // SAFETY: F_GETFD only reads the descriptor's flags; an fd that is
        // not open gives EBADF, checked below, before anything owns it.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "LISTEN_FDS={n}: descriptor {fd} is not open ({})",
                    io::Error::last_os_error()
                ),
            ));
        }
        // SAFETY: as above; only the close-on-exec flag is added.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        // SAFETY: the protocol hands descriptors 3.. to this process; the
        // variables were removed above, so this is the only place that
        // takes them, once, and nothing else in the process owns them.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Ok(fds)
}

/// Makes `cmd`'s child receive `fds` as descriptors 3, 4, … with
/// `LISTEN_FDS` set, as a service manager would (without `LISTEN_PID`,
/// which only the child could know). The caller keeps its own descriptors.
pub fn pass_listen_fds(cmd: &mut Command, fds: &[BorrowedFd<'_>]) {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    assert!(raw.len() <= MAX_FDS, "at most {MAX_FDS} descriptors");
    cmd.env("LISTEN_FDS", raw.len().to_string());
    cmd.env_remove("LISTEN_PID");
    // SAFETY: the closure runs in the child between fork and exec and
    // calls only dup/dup2/fcntl/close, which are async-signal-safe; it
    // allocates nothing (the vector was built before the fork and is only
    // read). Sources are first moved above the target range so that a
    // dup2 onto 3+i never closes a source still to be copied.
    unsafe {
        cmd.pre_exec(move || {
            let base = FIRST + raw.len() as RawFd + 16;
            let mut high = [0 as RawFd; MAX_FDS];
            for (i, &fd) in raw.iter().enumerate().take(MAX_FDS) {
                let moved = libc::fcntl(fd, libc::F_DUPFD, base);
                if moved < 0 {
                    return Err(io::Error::last_os_error());
                }
                high[i] = moved;
            }
            for (i, &fd) in high.iter().enumerate().take(raw.len().min(MAX_FDS)) {
                let target = FIRST + i as RawFd;
                if libc::dup2(fd, target) < 0 {
                    return Err(io::Error::last_os_error());
                }
                // dup2 leaves the copy without close-on-exec: it survives
                // the exec.
                libc::close(fd);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_receives_the_listener_as_fd_3() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut cmd = Command::new("sh");
        // The shell reports what it has at fd 3 and the variable.
        cmd.args(["-c", "echo $LISTEN_FDS; readlink /proc/self/fd/3"]);
        use std::os::fd::AsFd;
        pass_listen_fds(&mut cmd, &[listener.as_fd()]);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("1"), "{text}");
        assert!(lines.next().unwrap_or("").starts_with("socket:["), "{text}");
        // The parent still has its listener.
        assert_eq!(listener.local_addr().unwrap(), addr);
    }
}
