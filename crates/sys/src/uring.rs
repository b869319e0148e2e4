//! io_uring: one ring per shard, its provided buffers, and every piece of
//! memory the kernel reads or writes while an operation is in flight.
//!
//! [`Ring`] is a safe interface over the `io-uring` crate for the shard
//! engine's back end. Its rule is that whatever an operation points at is
//! owned by the ring until the kernel has finished with it:
//!
//! - receives name no memory: a multishot receive takes buffers from the
//!   ring's provided-buffer group (the private `bufring` module), and a completion lends the
//!   filled bytes to the caller for one callback before they are recycled;
//! - a send moves its `Vec<u8>` into the ring, which hands it back in
//!   [`Event::Sent`] only after the send's completion;
//! - the eventfd read behind [`Waker`] and timeout specifications live in
//!   the ring;
//! - on drop the ring cancels everything and waits for the last completion
//!   before freeing that memory; if the kernel does not answer in time
//!   (or the ring is dropped on a thread that may not drive it) the memory
//!   is leaked rather than freed under the kernel's feet.
//!
//! File descriptors are the caller's: an operation names a descriptor by
//! number, and the caller keeps it open until the operation's last
//! completion (otherwise the number may be reused and the operation act on
//! an unrelated file — wrong, but not a memory-safety matter).
//!
//! Submissions are queued as the caller makes them and go to the kernel in
//! [`Ring::submit_and_wait`], one `io_uring_enter` per loop turn (or earlier
//! when the submission queue fills). Completions are then read in
//! [`Ring::reap`]. Each operation carries a caller-chosen 62-bit tag; the
//! top two bits of the kernel's `user_data` say which kind of memory, if
//! any, the ring must release when the operation ends.

mod bufring;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::types::{CancelBuilder, Fd, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, EnterFlags, IoUring, Probe};

use bufring::BufRing;

/// The errno values a completion's negated result is compared with.
pub mod errno {
    pub use libc::{
        EAGAIN, EALREADY, ECANCELED, ECONNABORTED, ECONNRESET, EINTR, ENOBUFS, ENOSYS, EPERM,
        EPROTO,
    };
}

/// Largest tag an operation may carry.
pub const MAX_TAG: u64 = (1 << 62) - 1;

const CLASS_SHIFT: u32 = 62;
/// A tagged operation with nothing for the ring to release.
const CLASS_PLAIN: u64 = 0;
/// An accept: a successful result is a new descriptor.
const CLASS_ACCEPT: u64 = 1;
/// A send: the low bits index [`Ring::sends`].
const CLASS_SEND: u64 = 2;
/// The ring's own operations.
const CLASS_INTERNAL: u64 = 3;
const INTERNAL_WAKE: u64 = 1;
const INTERNAL_QUIESCE: u64 = 2;

/// Completions copied off the queue at a time by [`Ring::reap`].
const REAP_CHUNK: usize = 64;

/// Sends in flight the ring has room for before its table grows.
const SENDS_PREALLOCATED: usize = 1024;

/// The one provided-buffer group.
const BGID: u16 = 0;

/// How long dropping a ring waits for cancelled operations to finish.
const QUIESCE_WAIT: Duration = Duration::from_secs(2);

/// Sizes of a ring and its provided buffers.
#[derive(Clone, Copy, Debug)]
pub struct RingOptions {
    /// Submission queue entries (rounded up to a power of two by the kernel).
    pub sq_entries: u32,
    /// Completion queue entries.
    pub cq_entries: u32,
    /// Bytes per provided receive buffer.
    pub buf_size: u32,
    /// Provided buffers at start.
    pub bufs_initial: u16,
    /// Most provided buffers the ring grows to (at most 32768).
    pub bufs_max: u16,
    /// Try `DEFER_TASKRUN` (the default); `false` starts with the fallback
    /// set-up, so that it can be tested on kernels that have the flag.
    pub defer_taskrun: bool,
}

impl Default for RingOptions {
    fn default() -> Self {
        RingOptions {
            sq_entries: 2048,
            cq_entries: 16384,
            buf_size: 16 * 1024,
            bufs_initial: 64,
            bufs_max: 4096,
            defer_taskrun: true,
        }
    }
}

/// Which setup flags the kernel accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// `SINGLE_ISSUER | DEFER_TASKRUN` (6.1+): completions are produced only
    /// when the owning thread asks for them.
    DeferTaskrun,
    /// `SINGLE_ISSUER | COOP_TASKRUN` (6.0).
    SingleIssuer,
    /// `COOP_TASKRUN` only.
    Coop,
    /// No optional flags.
    Plain,
}

impl Setup {
    /// The flags, for logs.
    pub fn describe(self) -> &'static str {
        match self {
            Setup::DeferTaskrun => "single_issuer+defer_taskrun",
            Setup::SingleIssuer => "single_issuer+coop_taskrun",
            Setup::Coop => "coop_taskrun",
            Setup::Plain => "no setup flags",
        }
    }
}

/// Why a ring could not be created.
#[derive(Debug)]
pub struct RingError {
    /// The step that failed.
    pub stage: &'static str,
    /// The kernel's answer.
    pub source: io::Error,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.stage, self.source)
    }
}

impl std::error::Error for RingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl RingError {
    /// The errno, if the kernel gave one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// What [`Ring::reap`] reports.
#[derive(Debug)]
pub enum Event<'a> {
    /// A tagged operation produced a completion.
    Completed {
        /// The operation's tag.
        tag: u64,
        /// The kernel's result: a count, or a negated errno.
        result: i32,
        /// More completions follow for this operation (multishot).
        more: bool,
        /// Bytes a receive placed in a provided buffer; valid for this call
        /// only, then the buffer goes back to the kernel.
        data: &'a [u8],
    },
    /// An accept produced a completion.
    Accepted {
        /// The operation's tag.
        tag: u64,
        /// The new connection, or the negated errno.
        result: Result<OwnedFd, i32>,
        /// The accept stays armed.
        more: bool,
    },
    /// A send finished (completely or not); the buffer is the caller's
    /// again.
    Sent {
        /// The operation's tag.
        tag: u64,
        /// Bytes written, or the negated errno.
        result: i32,
        /// The buffer given to [`Ring::send`].
        buf: Vec<u8>,
        /// Where in `buf` the send started.
        offset: usize,
    },
    /// [`Waker::wake`] was called.
    Woken,
}

/// A completion waiting in the backlog, without its data.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// The operation's tag.
    pub tag: u64,
    /// The kernel's result.
    pub result: i32,
    /// More completions follow for this operation.
    pub more: bool,
}

#[derive(Clone, Copy)]
struct RawCqe {
    user_data: u64,
    result: i32,
    flags: u32,
}

struct InFlightSend {
    buf: Vec<u8>,
    offset: usize,
    tag: u64,
}

/// Interrupts [`Ring::submit_and_wait`] from any thread.
#[derive(Clone)]
pub struct Waker {
    fd: Arc<OwnedFd>,
}

impl Waker {
    /// Makes the ring's owner return from its wait (one `write` on an
    /// eventfd).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: the descriptor is an eventfd kept open by the Arc, and
        // the buffer is the 8 bytes of `one`, which outlive the call.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                std::ptr::addr_of!(one).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

/// One io_uring instance with its provided buffers.
///
/// Not `Send`: with `SINGLE_ISSUER` only the creating thread may drive it.
pub struct Ring {
    // Field order matters: the ring is torn down before the memory it may
    // have pointed at.
    ring: IoUring,
    bufs: BufRing,
    setup: Setup,
    sends: Vec<Option<InFlightSend>>,
    free_sends: Vec<usize>,
    wake_fd: Arc<OwnedFd>,
    /// Where the kernel writes the eventfd's counter.
    wake_buf: NonNull<u64>,
    wake_armed: bool,
    /// Timeout specifications, kept until their submission is consumed;
    /// boxed so that their addresses survive the Vec growing.
    #[allow(clippy::vec_box)]
    timespecs: Vec<Box<Timespec>>,
    /// Completions taken off the queue but not yet reported.
    backlog: Vec<RawCqe>,
    /// Operations whose last completion has not been read yet.
    in_flight: usize,
    quiescing: bool,
}

impl Ring {
    /// Creates a ring with the best setup flags this kernel accepts,
    /// registers its provided buffers and arms its waker.
    pub fn new(opts: &RingOptions) -> Result<Ring, RingError> {
        let (ring, setup) = build(opts)?;
        let mut bufs =
            BufRing::new(opts.buf_size, opts.bufs_initial, opts.bufs_max).map_err(|source| {
                RingError {
                    stage: "mapping provided buffers",
                    source,
                }
            })?;
        // SAFETY: the descriptor ring lives in `bufs`, which the Ring owns
        // and drops after the io_uring instance (field order), or leaks.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufs.ring_addr(), bufs.entries(), BGID, 0)
        }
        .map_err(|source| RingError {
            stage: "registering a provided-buffer ring (IORING_REGISTER_PBUF_RING, Linux 5.19+)",
            source,
        })?;
        bufs.publish();
        // Blocking on purpose: io_uring completes a read on an O_NONBLOCK
        // file with EAGAIN instead of waiting for it.
        // SAFETY: eventfd takes plain values and returns a new descriptor
        // or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(RingError {
                stage: "creating the wake eventfd",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let wake_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let wake_buf = NonNull::from(Box::leak(Box::new(0u64)));
        let mut r = Ring {
            ring,
            bufs,
            setup,
            // Sized so that steady state never grows them.
            sends: Vec::with_capacity(SENDS_PREALLOCATED),
            free_sends: Vec::with_capacity(SENDS_PREALLOCATED),
            wake_fd,
            wake_buf,
            wake_armed: false,
            timespecs: Vec::new(),
            backlog: Vec::new(),
            in_flight: 0,
            quiescing: false,
        };
        r.arm_wake().map_err(|source| RingError {
            stage: "arming the wake read",
            source,
        })?;
        Ok(r)
    }

    /// The setup flags in use.
    pub fn setup(&self) -> Setup {
        self.setup
    }

    /// Provided buffers that exist now, and their size.
    pub fn buffers(&self) -> (u16, u32) {
        (self.bufs.count(), self.bufs.buf_size())
    }

    /// Doubles the provided buffers up to the configured maximum; `false`
    /// when already there.
    pub fn grow_buffers(&mut self) -> bool {
        let grown = self.bufs.grow();
        self.bufs.publish();
        grown
    }

    /// A handle that interrupts this ring's wait from another thread.
    pub fn waker(&self) -> Waker {
        Waker {
            fd: self.wake_fd.clone(),
        }
    }

    /// Names of the opcodes this driver needs that the kernel lacks.
    pub fn missing_opcodes(&self) -> io::Result<Vec<&'static str>> {
        let mut probe = Probe::new();
        self.ring.submitter().register_probe(&mut probe)?;
        let needed = [
            (opcode::Nop::CODE, "NOP"),
            (opcode::Accept::CODE, "ACCEPT"),
            (opcode::Recv::CODE, "RECV"),
            (opcode::Send::CODE, "SEND"),
            (opcode::Read::CODE, "READ"),
            (opcode::Timeout::CODE, "TIMEOUT"),
            (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
        ];
        Ok(needed
            .iter()
            .filter(|(code, _)| !probe.is_supported(*code))
            .map(|&(_, name)| name)
            .collect())
    }

    /// Queues an SQE.
    ///
    /// # Safety
    ///
    /// Every pointer in `sqe` must stay valid, and the memory it names must
    /// not be freed or (for memory the kernel writes) accessed, until the
    /// operation's last completion has been read from the queue.
    unsafe fn push(&mut self, sqe: &squeue::Entry) -> io::Result<()> {
        for _ in 0..4 {
            // SAFETY: forwarded from this function's contract.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                self.in_flight += 1;
                return Ok(());
            }
            // The queue is full: hand what is there to the kernel now.
            match self.ring.submit() {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EBUSY | libc::EAGAIN | libc::EINTR)
                    ) =>
                {
                    // The completion queue is backed up: make room.
                    self.stash();
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "io_uring submission queue stays full",
        ))
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let sqe = opcode::Read::new(
            Fd(self.wake_fd.as_raw_fd()),
            self.wake_buf.as_ptr().cast::<u8>(),
            std::mem::size_of::<u64>() as u32,
        )
        .build()
        .user_data(CLASS_INTERNAL << CLASS_SHIFT | INTERNAL_WAKE);
        // SAFETY: `wake_buf` is a heap u64 owned by the ring and freed only
        // in Drop after every operation ended (or leaked); the ring never
        // reads or writes it, so the kernel's write races with nothing. The
        // eventfd stays open as long as the ring holds its Arc.
        unsafe { self.push(&sqe)? };
        self.wake_armed = true;
        Ok(())
    }

    /// Queues a multishot receive on `fd` into the provided buffers
    /// (Linux 6.0+).
    pub fn recv_multi(&mut self, fd: BorrowedFd<'_>, tag: u64) -> io::Result<()> {
        let sqe = opcode::RecvMulti::new(Fd(fd.as_raw_fd()), BGID)
            .build()
            .user_data(plain(tag));
        // SAFETY: the receive writes only into provided buffers, which the
        // ring owns and keeps mapped until its operations have ended.
        unsafe { self.push(&sqe) }
    }

    /// Queues a multishot accept on a listening socket (Linux 5.19+). New
    /// connections are non-blocking and close-on-exec.
    pub fn accept_multi(&mut self, fd: BorrowedFd<'_>, tag: u64) -> io::Result<()> {
        let sqe = opcode::AcceptMulti::new(Fd(fd.as_raw_fd()))
            .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            .build()
            .user_data(CLASS_ACCEPT << CLASS_SHIFT | (tag & MAX_TAG));
        // SAFETY: a multishot accept names no memory.
        unsafe { self.push(&sqe) }
    }

    /// Queues a send of `buf[offset..]` on `fd`. The kernel retries short
    /// writes on stream sockets by itself (`MSG_WAITALL`), so the result
    /// is usually all of it. The buffer comes back in [`Event::Sent`], or
    /// at once with the error if the send could not be queued.
    pub fn send(
        &mut self,
        fd: BorrowedFd<'_>,
        buf: Vec<u8>,
        offset: usize,
        tag: u64,
    ) -> Result<(), (io::Error, Vec<u8>)> {
        let offset = offset.min(buf.len());
        let len = (buf.len() - offset).min(u32::MAX as usize) as u32;
        let ptr = buf[offset..].as_ptr();
        let idx = match self.free_sends.pop() {
            Some(i) => i,
            None => {
                self.sends.push(None);
                self.sends.len() - 1
            }
        };
        // Moving the Vec into the table moves its header, not its bytes.
        self.sends[idx] = Some(InFlightSend { buf, offset, tag });
        let sqe = opcode::Send::new(Fd(fd.as_raw_fd()), ptr, len)
            .flags(libc::MSG_NOSIGNAL | libc::MSG_WAITALL)
            .build()
            .user_data(CLASS_SEND << CLASS_SHIFT | idx as u64);
        // SAFETY: `ptr..ptr+len` lies in the heap buffer of the Vec now in
        // `self.sends[idx]`; the ring neither mutates nor drops it until
        // this send's completion is read (`dispatch` takes it out then,
        // Drop leaks it if the kernel never answers).
        match unsafe { self.push(&sqe) } {
            Ok(()) => Ok(()),
            Err(e) => {
                let s = self.sends[idx].take().expect("just stored");
                self.free_sends.push(idx);
                Err((e, s.buf))
            }
        }
    }

    /// Queues the cancellation of the operation tagged `target`.
    pub fn cancel(&mut self, target: u64, tag: u64) -> io::Result<()> {
        let sqe = opcode::AsyncCancel::new(plain(target))
            .build()
            .user_data(plain(tag));
        // SAFETY: a cancellation names no memory.
        unsafe { self.push(&sqe) }
    }

    /// Queues the cancellation of the accept queued with
    /// [`Ring::accept_multi`] under `target`.
    pub fn cancel_accept(&mut self, target: u64, tag: u64) -> io::Result<()> {
        let sqe = opcode::AsyncCancel::new(CLASS_ACCEPT << CLASS_SHIFT | (target & MAX_TAG))
            .build()
            .user_data(plain(tag));
        // SAFETY: a cancellation names no memory.
        unsafe { self.push(&sqe) }
    }

    /// Queues the cancellation of every operation on `fd` (Linux 5.19+).
    pub fn cancel_fd(&mut self, fd: BorrowedFd<'_>, tag: u64) -> io::Result<()> {
        let sqe = opcode::AsyncCancel2::new(CancelBuilder::fd(Fd(fd.as_raw_fd())).all())
            .build()
            .user_data(plain(tag));
        // SAFETY: a cancellation names no memory.
        unsafe { self.push(&sqe) }
    }

    /// Queues a timer that completes (with `-ETIME`) after `after`.
    pub fn timeout(&mut self, after: Duration, tag: u64) -> io::Result<()> {
        let ts = Box::new(Timespec::from(after));
        let sqe = opcode::Timeout::new(&*ts).build().user_data(plain(tag));
        self.timespecs.push(ts);
        // SAFETY: the kernel copies the timespec when it takes the SQE; the
        // box stays in `self.timespecs` until the submission queue has been
        // emptied by a submit.
        unsafe { self.push(&sqe) }
    }

    /// Queues a no-op.
    pub fn nop(&mut self, tag: u64) -> io::Result<()> {
        let sqe = opcode::Nop::new().build().user_data(plain(tag));
        // SAFETY: a no-op names no memory.
        unsafe { self.push(&sqe) }
    }

    /// Submits everything queued and waits up to `timeout` (`None`: until
    /// something completes; zero: not at all) — one system call. Timeouts
    /// and signals are not errors.
    pub fn submit_and_wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let queued = self.ring.submission().len() as u32;
        let submitter = self.ring.submitter();
        let result = match timeout {
            None => submitter.submit_and_wait(1),
            Some(t) if t.is_zero() => {
                // GETEVENTS with a minimum of zero: run deferred task work
                // (DEFER_TASKRUN posts completions only then) without
                // sleeping.
                // SAFETY: no argument pointer is passed; the counts are
                // plain values.
                unsafe {
                    submitter.enter::<libc::sigset_t>(queued, 0, EnterFlags::GETEVENTS.bits(), None)
                }
            }
            Some(t) => {
                let ts = Timespec::from(t);
                let args = SubmitArgs::new().timespec(&ts);
                submitter.submit_with_args(1, &args)
            }
        };
        match result {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => return Err(e),
        }
        if self.ring.submission().is_empty() {
            self.timespecs.clear();
        }
        Ok(())
    }

    /// Whether completions wait in the backlog (so the next wait should not
    /// block).
    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Moves every completion in the queue to the backlog without
    /// reporting it; [`Ring::pending`] shows them and the next
    /// [`Ring::reap`] reports them first.
    pub fn stash(&mut self) {
        let mut cq = self.ring.completion();
        cq.sync();
        for e in &mut cq {
            if !cqueue::more(e.flags()) {
                self.in_flight -= 1;
            }
            self.backlog.push(RawCqe {
                user_data: e.user_data(),
                result: e.result(),
                flags: e.flags(),
            });
        }
    }

    /// The completions in the backlog.
    pub fn pending(&self) -> impl Iterator<Item = Pending> + '_ {
        self.backlog.iter().filter_map(|c| {
            let tag = match c.user_data >> CLASS_SHIFT {
                CLASS_PLAIN | CLASS_ACCEPT => c.user_data & MAX_TAG,
                CLASS_SEND => {
                    self.sends
                        .get((c.user_data & MAX_TAG) as usize)?
                        .as_ref()?
                        .tag
                }
                _ => return None,
            };
            Some(Pending {
                tag,
                result: c.result,
                more: cqueue::more(c.flags),
            })
        })
    }

    /// Reports every completion: the backlog first, then the queue (at
    /// most one queue's worth, so a stream of completions cannot keep the
    /// caller here). Allocates nothing.
    pub fn reap(&mut self, f: &mut dyn FnMut(Event<'_>)) {
        if !self.backlog.is_empty() {
            let mut backlog = std::mem::take(&mut self.backlog);
            for c in backlog.drain(..) {
                self.dispatch(c, f);
            }
            if self.backlog.is_empty() {
                self.backlog = backlog; // keep the capacity
            }
        }
        let mut chunk = [RawCqe {
            user_data: 0,
            result: 0,
            flags: 0,
        }; REAP_CHUNK];
        let mut budget = self.ring.params().cq_entries() as usize;
        while budget > 0 {
            let mut n = 0;
            {
                let mut cq = self.ring.completion();
                for e in (&mut cq).take(REAP_CHUNK.min(budget)) {
                    if !cqueue::more(e.flags()) {
                        self.in_flight -= 1;
                    }
                    chunk[n] = RawCqe {
                        user_data: e.user_data(),
                        result: e.result(),
                        flags: e.flags(),
                    };
                    n += 1;
                }
            }
            if n == 0 {
                break;
            }
            budget -= n;
            for &c in &chunk[..n] {
                self.dispatch(c, f);
            }
        }
        self.bufs.publish();
        if !self.wake_armed && !self.quiescing {
            if let Err(e) = self.arm_wake() {
                // Retried after the next reap; until then a wake is seen at
                // the next timeout at the latest.
                let _ = e;
            }
        }
    }

    fn dispatch(&mut self, c: RawCqe, f: &mut dyn FnMut(Event<'_>)) {
        let more = cqueue::more(c.flags);
        let low = c.user_data & MAX_TAG;
        match c.user_data >> CLASS_SHIFT {
            CLASS_PLAIN => match cqueue::buffer_select(c.flags) {
                Some(bid) => {
                    let len = usize::try_from(c.result).unwrap_or(0);
                    let data = self.bufs.data(bid, len).unwrap_or(&[]);
                    f(Event::Completed {
                        tag: low,
                        result: c.result,
                        more,
                        data,
                    });
                    self.bufs.recycle(bid);
                }
                None => f(Event::Completed {
                    tag: low,
                    result: c.result,
                    more,
                    data: &[],
                }),
            },
            CLASS_ACCEPT => {
                let result = if c.result >= 0 {
                    // SAFETY: a successful accept completion's result is a
                    // descriptor the kernel just installed for us; nothing
                    // else knows its number yet.
                    Ok(unsafe { OwnedFd::from_raw_fd(c.result as RawFd) })
                } else {
                    Err(-c.result)
                };
                f(Event::Accepted {
                    tag: low,
                    result,
                    more,
                });
            }
            CLASS_SEND => {
                let idx = low as usize;
                if let Some(s) = self.sends.get_mut(idx).and_then(Option::take) {
                    self.free_sends.push(idx);
                    f(Event::Sent {
                        tag: s.tag,
                        result: c.result,
                        buf: s.buf,
                        offset: s.offset,
                    });
                }
            }
            _ => {
                if low == INTERNAL_WAKE && !more {
                    self.wake_armed = false;
                    if c.result > 0 {
                        f(Event::Woken);
                    }
                }
            }
        }
    }
}

/// The `user_data` of a plain tagged operation.
fn plain(tag: u64) -> u64 {
    debug_assert!(tag <= MAX_TAG, "tag {tag:#x} uses reserved bits");
    CLASS_PLAIN << CLASS_SHIFT | (tag & MAX_TAG)
}

/// Creates the io_uring instance, dropping optional flags the kernel
/// refuses (`EINVAL`).
fn build(opts: &RingOptions) -> Result<(IoUring, Setup), RingError> {
    let attempts = [
        Setup::DeferTaskrun,
        Setup::SingleIssuer,
        Setup::Coop,
        Setup::Plain,
    ];
    let mut last = None;
    let skip = usize::from(!opts.defer_taskrun);
    for setup in attempts.into_iter().skip(skip) {
        let mut b = IoUring::builder();
        b.setup_cqsize(opts.cq_entries).setup_clamp();
        match setup {
            Setup::DeferTaskrun => {
                b.setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_submit_all();
            }
            Setup::SingleIssuer => {
                b.setup_single_issuer()
                    .setup_coop_taskrun()
                    .setup_submit_all();
            }
            Setup::Coop => {
                b.setup_coop_taskrun();
            }
            Setup::Plain => {}
        }
        match b.build(opts.sq_entries) {
            Ok(ring) => return Ok((ring, setup)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = Some(e),
            Err(source) => {
                return Err(RingError {
                    stage: "io_uring_setup",
                    source,
                })
            }
        }
    }
    Err(RingError {
        stage: "io_uring_setup",
        source: last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
    })
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.quiescing = true;
        // Completions already read: close accepted sockets, free buffers.
        self.reap(&mut |_| {});
        if self.in_flight > 0 {
            let sqe = opcode::AsyncCancel2::new(CancelBuilder::any())
                .build()
                .user_data(CLASS_INTERNAL << CLASS_SHIFT | INTERNAL_QUIESCE);
            // SAFETY: a cancellation names no memory.
            let _ = unsafe { self.push(&sqe) };
            let deadline = Instant::now() + QUIESCE_WAIT;
            while self.in_flight > 0 {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                // EEXIST here means another thread owns this ring: give up.
                if self.submit_and_wait(Some(deadline - now)).is_err() {
                    break;
                }
                self.reap(&mut |_| {});
            }
        }
        if self.in_flight > 0 {
            // The kernel may still read or write this memory: leak it.
            self.bufs.leak();
            std::mem::forget(std::mem::take(&mut self.sends));
            std::mem::forget(std::mem::take(&mut self.timespecs));
        } else {
            let _ = self.ring.submitter().unregister_buf_ring(BGID);
            // SAFETY: `wake_buf` came from `Box::leak` in `Ring::new`, and
            // no operation is in flight, so the kernel no longer writes it.
            drop(unsafe { Box::from_raw(self.wake_buf.as_ptr()) });
        }
    }
}
