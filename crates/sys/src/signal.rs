//! Termination signals, taken synchronously by one thread.
//!
//! The binary blocks SIGINT and SIGTERM before it starts any other thread,
//! so every thread inherits the mask and no handler ever runs
//! asynchronously; the main thread then waits for one with `sigwait` and
//! starts a graceful shutdown. Nothing here runs in signal context.

use std::io;

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; an all-zero value is a valid
    // starting point that sigemptyset then initialises properly.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t; these calls
    // only write into it and cannot fail for valid signal numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    set
}

/// Blocks SIGINT and SIGTERM in the calling thread (and in threads it
/// creates afterwards).
pub fn block_termination_signals() -> io::Result<()> {
    let set = termination_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Waits until SIGINT or SIGTERM is pending and returns its number. The
/// signals must have been blocked with [`block_termination_signals`].
pub fn wait_termination_signal() -> io::Result<i32> {
    let set = termination_set();
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is initialised and `sig` is a valid out-pointer.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        match rc {
            0 => return Ok(sig),
            libc::EINTR => continue,
            err => return Err(io::Error::from_raw_os_error(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_is_taken_by_sigwait() {
        // A thread of its own, so the mask does not leak into other tests.
        std::thread::spawn(|| {
            block_termination_signals().unwrap();
            // SAFETY: sending a signal to this very thread, which blocks it,
            // only marks it pending.
            let rc = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
            assert_eq!(rc, 0);
            assert_eq!(wait_termination_signal().unwrap(), libc::SIGTERM);
        })
        .join()
        .unwrap();
    }
}
