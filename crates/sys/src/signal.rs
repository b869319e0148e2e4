//! Process signals, taken synchronously by one thread.
//!
//! The binary blocks SIGINT, SIGTERM and SIGHUP before it starts any other
//! thread, so every thread inherits the mask and no handler ever runs
//! asynchronously (and SIGHUP's default action, ending the process, never
//! happens); the main thread then waits for one with `sigwait`: SIGINT or
//! SIGTERM start a graceful shutdown, SIGHUP a reload. Nothing here runs in
//! signal context.

use std::io;

/// A signal the main thread acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT or SIGTERM (the number): shut down gracefully.
    Terminate(i32),
    /// SIGHUP: reload what can be reloaded, keep running.
    Hangup,
}

impl Signal {
    /// The signal's usual name.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Terminate(libc::SIGINT) => "SIGINT",
            Signal::Terminate(libc::SIGTERM) => "SIGTERM",
            Signal::Terminate(_) => "a termination signal",
            Signal::Hangup => "SIGHUP",
        }
    }
}

fn handled_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; an all-zero value is a valid
    // starting point that sigemptyset then initialises properly.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; these calls
    // only write into it and cannot fail for valid signal numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
    }
    set
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and in threads
/// it creates afterwards).
pub fn block_signals() -> io::Result<()> {
    let set = handled_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Waits until SIGINT, SIGTERM or SIGHUP is pending and takes it. The
/// signals must have been blocked with [`block_signals`].
pub fn wait_signal() -> io::Result<Signal> {
    let set = handled_set();
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is initialised and `sig` is a valid out-pointer.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        match rc {
            0 if sig == libc::SIGHUP => return Ok(Signal::Hangup),
            0 => return Ok(Signal::Terminate(sig)),
            libc::EINTR => continue,
            err => return Err(io::Error::from_raw_os_error(err)),
        }
    }
}

/// Sends `signal` (a `libc::SIG*` number) to process `pid`: how tests and
/// tools ask a running relay to reload or stop.
pub fn send(pid: u32, signal: i32) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    crate::zero_or_errno(unsafe { libc::kill(pid, signal) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_signals_are_taken_by_sigwait() {
        // A thread of its own, so the mask does not leak into other tests.
        std::thread::spawn(|| {
            block_signals().unwrap();
            for (raw, expected) in [
                (libc::SIGHUP, Signal::Hangup),
                (libc::SIGTERM, Signal::Terminate(libc::SIGTERM)),
            ] {
                // SAFETY: sending a signal to this very thread, which blocks
                // it, only marks it pending.
                let rc = unsafe { libc::pthread_kill(libc::pthread_self(), raw) };
                assert_eq!(rc, 0);
                assert_eq!(wait_signal().unwrap(), expected);
            }
        })
        .join()
        .unwrap();
        assert_eq!(Signal::Hangup.name(), "SIGHUP");
    }
}
