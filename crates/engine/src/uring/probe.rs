//! Whether the io_uring back end can run on this machine, and why not.

use std::io;
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferry_sys::uring::errno::{ENOSYS, EPERM};
use ferry_sys::uring::{Event, Ring, RingError, RingOptions};

/// Whether the io_uring back end can run here; the reason when not. The
/// first call creates a small ring and runs a receive through it; the
/// answer is cached.
///
/// The probe runs on a thread of its own. When a ring is torn down, the
/// kernel queues a task-work item on every thread that submitted to it,
/// and that notification interrupts whatever the thread is blocked in: a
/// socket read with a timeout then fails with EINTR. A throwaway thread
/// keeps that away from the caller (the main thread, a test).
pub fn probe() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("ferry-uring-probe".into())
                .spawn(probe_uncached)
                .map_err(|e| format!("cannot start the io_uring probe thread: {e}"))
                .and_then(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err("the io_uring probe panicked".into()))
                })
        })
        .clone()
}

fn probe_uncached() -> Result<(), String> {
    let opts = RingOptions {
        sq_entries: 8,
        cq_entries: 16,
        buf_size: 4096,
        bufs_initial: 4,
        bufs_max: 4,
        defer_taskrun: true,
    };
    let mut ring = Ring::new(&opts).map_err(|e| explain(&e))?;
    let missing = ring
        .missing_opcodes()
        .map_err(|e| format!("io_uring opcode probe (IORING_REGISTER_PROBE) failed: {e}"))?;
    if !missing.is_empty() {
        return Err(format!(
            "the kernel's io_uring lacks opcodes {}",
            missing.join(", ")
        ));
    }
    self_test(&mut ring)
}

/// Runs a no-op and a multishot receive through `ring`.
fn self_test(ring: &mut Ring) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    const NOP: u64 = 1;
    const RECV: u64 = 2;
    let (a, mut b) = UnixStream::pair().map_err(|e| format!("self-test socketpair: {e}"))?;
    let fail = |what: &str, e: io::Error| format!("io_uring self-test: {what}: {e}");
    ring.nop(NOP).map_err(|e| fail("queueing a no-op", e))?;
    ring.recv_multi(a.as_fd(), RECV)
        .map_err(|e| fail("queueing a multishot receive", e))?;
    b.write_all(b"ferry").map_err(|e| fail("writing", e))?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut nop, mut got, mut still_armed, mut err) = (false, Vec::new(), false, None);
    while !(nop && got.len() >= 5) && err.is_none() {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "io_uring self-test: no completion within 2 s (no-op done: {nop}, received {} of 5 bytes)",
                got.len()
            ));
        }
        ring.submit_and_wait(Some(deadline - now))
            .map_err(|e| fail("io_uring_enter", e))?;
        ring.reap(&mut |ev| {
            if let Event::Completed {
                tag,
                result,
                more,
                data,
            } = ev
            {
                match tag {
                    NOP => nop = true,
                    RECV if result > 0 => {
                        got.extend_from_slice(data);
                        still_armed = more;
                    }
                    RECV => err = Some(result),
                    _ => {}
                }
            }
        });
    }
    if let Some(r) = err {
        return Err(fail(
            "multishot receive into provided buffers (Linux 6.0+)",
            io::Error::from_raw_os_error(-r),
        ));
    }
    if got != b"ferry" {
        return Err(format!(
            "io_uring self-test: received {got:?} instead of \"ferry\""
        ));
    }
    if !still_armed {
        return Err("io_uring self-test: the multishot receive did not stay armed".into());
    }
    Ok(())
}

/// Turns a ring creation failure into an operator-facing reason.
pub(super) fn explain(e: &RingError) -> String {
    match e.raw_os_error() {
        Some(EPERM) if e.stage == "io_uring_setup" => {
            match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                Some(2) => "io_uring is disabled on this machine (sysctl kernel.io_uring_disabled = 2)".into(),
                Some(1) => "io_uring is restricted to members of kernel.io_uring_group (sysctl kernel.io_uring_disabled = 1) and this process is not one".into(),
                _ => "io_uring_setup was refused with EPERM: a seccomp filter blocks it (Docker's default profile does) or a security module does".into(),
            }
        }
        Some(ENOSYS) => "io_uring_setup does not exist here (ENOSYS): a kernel built without io_uring, or a sandbox (gVisor, a seccomp profile) that hides it".into(),
        _ => format!("cannot create an io_uring instance: {e}"),
    }
}
