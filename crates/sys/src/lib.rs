//! The one place in Ferry where `unsafe` code lives.
//!
//! Everything above this crate (protocol, engine, relay) stays in safe Rust;
//! when one of them needs a syscall that `std`, `socket2` or `mio` do not
//! cover, the call is wrapped here behind a safe function with an
//! `io::Result` or `Option`. Every `unsafe` block carries a `// SAFETY:`
//! comment stating what makes it sound, and `unsafe_op_in_unsafe_fn` is denied
//! so that rule also holds inside any `unsafe fn`; clippy enforces the
//! comments (`undocumented_unsafe_blocks`).
//!
//! Modules are named after what they control:
//!
//! - [`cpu`]: which CPUs this process may run on, and pinning a shard thread
//!   to one of them.
//! - [`limits`]: resource limits the relay raises at start-up.
//! - [`files`]: key and certificate files written owner-only, in one step,
//!   without following or reusing anything planted in the directory.
//! - [`signal`]: SIGINT, SIGTERM and SIGHUP taken synchronously by the main
//!   thread.
//! - [`process`]: cheap self-observation (resident memory, open descriptors)
//!   for metrics.
//! - [`heap`]: the C allocator's split of the heap into in use and free, and
//!   giving free memory back (`malloc_trim`).
//! - [`uring`]: an io_uring instance with its provided-buffer ring, owning
//!   all memory the kernel touches while operations are in flight.
//! - [`activation`]: listening sockets handed over by a service manager
//!   (`LISTEN_FDS`), and handing them to a child.
//! - [`ifaddrs`]: the host's interface addresses, and which interfaces are
//!   point-to-point tunnels.
//! - [`alloc_count`]: a counting global allocator for tests that prove a
//!   path allocates nothing.
//! - [`mmsg`]: batched UDP receive and send (`recvmmsg`/`sendmmsg`) with
//!   source addresses, GRO segment sizes, GSO and the drop counter.
//! - [`gso`]: probing and switching UDP GRO and GSO.
//! - [`train`]: datagrams grouped into GSO trains by the kernel's rules,
//!   sent with a fallback to single datagrams (every GSO send in Ferry).
//! - [`sockopt`]: forced socket buffer sizes and `SO_RXQ_OVFL`.
//! - [`port`]: making sure a port shared by one process's shards is not
//!   also joined by another process.
//! - [`ktls`]: kernel TLS: probing for it, handing a session's keys to a
//!   socket, and typed record reads and writes (cmsg parsing in `cmsg`).
//! - [`netns`]: moving a thread into a named network namespace (tests that
//!   run parts of themselves in namespaces they made).
//!
//! Ferry targets Linux only; this crate reads `/proc` and calls Linux-specific
//! syscalls.

#![allow(unsafe_code)] // the one crate where it lives (see the workspace lints)
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod activation;
pub mod alloc_count;
mod cmsg;
pub mod cpu;
pub mod files;
pub mod gso;
pub mod heap;
pub mod ifaddrs;
pub mod ktls;
pub mod limits;
pub mod mmsg;
mod msghdr;
pub mod netns;
pub mod pktinfo;
pub mod port;
pub mod process;
pub mod signal;
pub mod sockopt;
pub mod train;
pub mod uring;

pub use cpu::{available_cpus, pin_current_thread};
pub use limits::raise_nofile_limit;
pub use process::{is_root, open_fds, rss_bytes};

/// A system call's `0 or -1 with errno` return value as a result.
fn zero_or_errno(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
