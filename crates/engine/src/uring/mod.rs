//! The io_uring back end: completions produced by the kernel.
//!
//! Each shard creates its own [`UringDriver`] on its own thread; the ring is
//! set up `SINGLE_ISSUER | DEFER_TASKRUN` where the kernel allows it (see
//! [`ferry_sys::uring`], which owns every piece of memory the kernel may
//! touch). One loop turn is one `io_uring_enter`: it submits everything the
//! shard queued since the last turn (sends, re-armed receives, closes) and
//! waits for the first completion or the turn's timeout; then every
//! completion is read and translated into [`Completion`]s.
//!
//! Per socket:
//!
//! - **Receive** is one multishot `RECV` drawing from the ring's provided
//!   buffers. A buffer is held only while its bytes are handed to the
//!   handler and goes straight back afterwards, so idle connections hold
//!   none. A receive that ends without `IORING_CQE_F_MORE` is re-armed at
//!   the next turn. Running out of buffers (`ENOBUFS`) ends a receive too:
//!   its bytes wait in the kernel until the next turn, which bounds how
//!   much one turn takes in, like a read budget. The pool starts small
//!   (64 × 16 KiB: it stays in cache, which measured faster than a large
//!   pool) and doubles, up to its maximum, when many receives run dry in
//!   the same turn — many sockets competing rather than a few busy ones.
//!   Arming waits for the start of the next turn, so a socket attached and
//!   paused in the same turn is never read. Pausing cancels the receive by
//!   its tag; bytes it delivered before the cancel took effect are still
//!   reported. An end of stream seen while paused is not reported: the
//!   receive armed on resume reads it again.
//! - **Send** moves the buffer into the ring; a short write is resubmitted
//!   from where it stopped, and the buffer comes back in
//!   [`Completion::Sent`] once all of it is written or the socket failed.
//! - **Close** cancels the socket's operations and closes the descriptor
//!   when the last of them has completed, so an operation never runs on a
//!   descriptor number that was reused. Send buffers stay alive until then.
//! - **Detach** cancels the receive and waits for its final completion
//!   inside the call (once per migrated connection). If the receive had
//!   delivered bytes that the shard has not seen yet, detach answers "not
//!   now": the bytes are reported next turn and the shard tries again.
//!
//! Every operation's tag carries the slot and a generation that changes on
//! each [`Driver::attach`], so completions of a closed socket whose slot
//! number was already reused are recognised and dropped.
//!
//! Listeners use multishot accept, re-armed when it ends. When it ends on
//! an error other than a connection that vanished before it was accepted
//! (EMFILE, ENFILE, ENOMEM, ENOBUFS above all) it is re-armed after a
//! 100 ms timer instead of at once, so a full descriptor table is retried,
//! not spun on. [`Driver::stop_accepting`] cancels the accept by its tag
//! and closes the listener when the accept's final completion arrives
//! (connections it took before the cancel are still reported). The waker is an eventfd with a read armed on the ring.
//!
//! Sockets are switched to blocking mode on attach: the ring waits for
//! readiness itself, and some kernels complete operations on `O_NONBLOCK`
//! descriptors with EAGAIN instead. Kernel TLS receive is not supported
//! ([`Driver::set_ktls_rx`] keeps its default), so the relay keeps TLS in
//! userspace on this back end.

mod probe;
mod state;

use std::collections::HashMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_sys::uring::errno::{EAGAIN, ECANCELED, EINTR, ENOBUFS};
use ferry_sys::uring::{Ring, RingOptions, Waker};

use crate::driver::{Completion, Driver, Slot};
use state::{key, tag, Closing, Kind, Listen, Local, RecvState, SendState, Sock, State, MAX_SLOT};

pub use ferry_sys::uring::RingOptions as UringOptions;
use probe::explain;
pub use probe::probe;

/// Pause before re-arming an accept that failed for lack of resources.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The buffer ring grows when, in one turn, at least one receive in
/// `GROW_RATIO` (relative to the number of buffers) ran out of buffers.
const GROW_RATIO: u32 = 4;
/// How long [`Driver::detach`] waits for a cancelled receive to end.
const DETACH_WAIT: Duration = Duration::from_millis(250);

/// Counters a shard may export.
#[derive(Clone, Copy, Debug)]
pub struct UringStats {
    /// Setup flags the kernel accepted.
    pub setup: &'static str,
    /// Provided receive buffers that exist now.
    pub buffers: u16,
    /// Bytes per provided buffer.
    pub buffer_size: u32,
    /// Receives that ended because every buffer was in use, and were
    /// re-armed.
    pub enobufs: u64,
    /// Times the buffer ring grew.
    pub buffer_growths: u64,
    /// Closed sockets still waiting for their last completion.
    pub closing: usize,
}

/// Completion-shaped I/O over io_uring.
pub struct UringDriver {
    // Dropped first: the ring cancels and waits for its operations while
    // the sockets they use are still open.
    ring: Ring,
    st: State,
    waker: Waker,
    /// See [`Driver::max_turn_bytes`].
    max_turn_bytes: usize,
}

impl UringDriver {
    /// Creates a ring with the default sizes. Call on the thread that will
    /// drive it.
    pub fn new() -> io::Result<Self> {
        Self::with_options(&RingOptions::default())
    }

    /// Creates a ring with the given queue and buffer sizes.
    pub fn with_options(opts: &UringOptions) -> io::Result<Self> {
        let ring = Ring::new(opts).map_err(|e| io::Error::new(e.source.kind(), explain(&e)))?;
        let (n, size) = ring.buffers();
        tracing::debug!(
            setup = ring.setup().describe(),
            buffers = n,
            buffer_size = size,
            "io_uring ring ready"
        );
        let waker = ring.waker();
        // One socket's receives in one turn fill at most the whole buffer
        // pool, and never more than the socket's receive buffer held.
        let pool = usize::from(opts.bufs_max) * opts.buf_size as usize;
        let max_turn_bytes = ferry_sys::sockopt::tcp_rmem_max().map_or(pool, |r| r.min(pool));
        Ok(UringDriver {
            max_turn_bytes,
            ring,
            st: State {
                socks: Vec::new(),
                closing: HashMap::new(),
                listeners: Vec::new(),
                next_gen: 0,
                // Sized so that steady state never grows them.
                local: Vec::with_capacity(64),
                to_arm: Vec::with_capacity(1024),
                resend: Vec::with_capacity(256),
                recancel: Vec::with_capacity(64),
                accept_now: Vec::with_capacity(16),
                accept_later: Vec::with_capacity(16),
                accept_recancel: Vec::new(),
                dry_now: 0,
                enobufs: 0,
                growths: 0,
            },
            waker,
        })
    }

    /// Buffer and setup counters.
    pub fn stats(&self) -> UringStats {
        let (buffers, buffer_size) = self.ring.buffers();
        UringStats {
            setup: self.ring.setup().describe(),
            buffers,
            buffer_size,
            enobufs: self.st.enobufs,
            buffer_growths: self.st.growths,
            closing: self.st.closing.len(),
        }
    }

    fn live(&mut self, slot: Slot) -> Option<&mut Sock> {
        self.st.socks.get_mut(slot).and_then(Option::as_mut)
    }

    /// Arms the queued receives that are still wanted.
    fn arm_queued(&mut self) {
        let Self { ring, st, .. } = self;
        let mut to_arm = std::mem::take(&mut st.to_arm);
        for (slot, gen) in to_arm.drain(..) {
            let Some(sock) = st.socks.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if sock.gen != gen || sock.recv != RecvState::Queued {
                continue;
            }
            sock.recv = RecvState::Idle;
            if !sock.want_recv || sock.recv_done {
                continue;
            }
            match ring.recv_multi(sock.stream.as_fd(), tag(Kind::Recv, slot, gen)) {
                Ok(()) => sock.recv = RecvState::Armed,
                Err(error) => {
                    sock.recv_done = true;
                    st.local.push(Local::RecvClosed { slot, gen, error });
                }
            }
        }
        st.to_arm = to_arm;
    }

    /// Work found while reading completions: re-arm accepts, resubmit the
    /// rest of short sends, grow the buffers if they ran out.
    fn after_reap(&mut self) {
        let Self { ring, st, .. } = self;
        let dry = std::mem::take(&mut st.dry_now);
        let (pool, _) = ring.buffers();
        // A few sockets running dry is flow control: their bytes wait in the
        // kernel until the next turn, as with a per-turn read budget, and a
        // small pool stays in cache. Many running dry at once means many
        // sockets compete for the pool; more buffers then serve more of
        // them per turn.
        if dry > 0 && dry * GROW_RATIO >= u32::from(pool) && ring.grow_buffers() {
            st.growths += 1;
            let (n, size) = ring.buffers();
            tracing::info!(
                buffers = n,
                buffer_size = size,
                "io_uring receive buffers ran out; grew the buffer ring"
            );
        }
        for idx in st.accept_recancel.drain(..) {
            if st.listeners[idx].armed {
                let _ =
                    ring.cancel_accept(tag(Kind::Accept, idx, 0), tag(Kind::AcceptCancel, idx, 0));
            }
        }
        for (slot, gen) in st.recancel.drain(..) {
            let recv_tag = tag(Kind::Recv, slot, gen);
            let _ = ring.cancel(recv_tag, tag(Kind::RecvCancel, slot, gen));
        }
        let mut resend = std::mem::take(&mut st.resend);
        for (slot, gen, buf, off) in resend.drain(..) {
            let Some(sock) = st.socks.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if sock.gen != gen {
                continue;
            }
            submit_send(ring, &mut st.local, sock, (slot, gen), buf, off);
        }
        st.resend = resend;
        let mut now = std::mem::take(&mut st.accept_now);
        for idx in now.drain(..) {
            let l = &mut st.listeners[idx];
            if !l.wants_accept() {
                continue;
            }
            let fd = l.socket.as_ref().expect("wanted").as_fd();
            match ring.accept_multi(fd, tag(Kind::Accept, idx, 0)) {
                Ok(()) => l.armed = true,
                Err(e) => {
                    tracing::warn!(listener = idx, error = %e, "could not re-arm accept; retrying shortly");
                    st.accept_later.push(idx);
                }
            }
        }
        st.accept_now = now;
        for idx in st.accept_later.drain(..) {
            if !st.listeners[idx].wants_accept() {
                continue;
            }
            if let Err(e) = ring.timeout(ACCEPT_BACKOFF, tag(Kind::AcceptBackoff, idx, 0)) {
                tracing::error!(listener = idx, error = %e, "could not schedule an accept retry");
            }
        }
    }
}

impl Driver for UringDriver {
    fn add_listener(&mut self, listener: TcpListener) -> io::Result<usize> {
        let idx = self.st.listeners.len();
        if idx > MAX_SLOT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many listeners",
            ));
        }
        // The ring waits for readiness itself; on an O_NONBLOCK descriptor
        // some kernels complete with EAGAIN instead.
        listener.set_nonblocking(false)?;
        self.ring
            .accept_multi(listener.as_fd(), tag(Kind::Accept, idx, 0))?;
        self.st.listeners.push(Listen {
            socket: Some(listener),
            armed: true,
            stopping: false,
        });
        Ok(idx)
    }

    fn stop_accepting(&mut self, listener: usize) {
        let Some(l) = self.st.listeners.get_mut(listener) else {
            return;
        };
        if l.stopping {
            return;
        }
        l.stopping = true;
        if !l.armed {
            // Waiting for a retry or a re-arm, or never armed: nothing in
            // the ring uses it.
            l.socket = None;
            return;
        }
        let target = tag(Kind::Accept, listener, 0);
        if let Err(e) = self
            .ring
            .cancel_accept(target, tag(Kind::AcceptCancel, listener, 0))
        {
            // The accept stays armed; the next cancel attempt is after a
            // turn.
            tracing::warn!(listener, error = %e, "could not cancel an accept; trying again");
            self.st.accept_recancel.push(listener);
        }
    }

    fn accepting(&self, listener: usize) -> bool {
        self.st
            .listeners
            .get(listener)
            .is_some_and(|l| l.socket.is_some())
    }

    fn attach(&mut self, slot: Slot, stream: TcpStream) -> io::Result<()> {
        if slot > MAX_SLOT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is beyond the io_uring driver's limit {MAX_SLOT}"),
            ));
        }
        if self.st.socks.get(slot).is_some_and(Option::is_some) {
            debug_assert!(false, "slot {slot} attached twice");
            self.close(slot);
        }
        stream.set_nonblocking(false)?;
        self.st.next_gen = self.st.next_gen.wrapping_add(1).max(1);
        let gen = self.st.next_gen;
        if self.st.socks.len() <= slot {
            self.st.socks.resize_with(slot + 1, || None);
        }
        self.st.socks[slot] = Some(Sock {
            stream,
            gen,
            recv: RecvState::Idle,
            want_recv: true,
            recv_done: false,
            send: SendState::Idle,
        });
        self.st.queue_arm(slot);
        Ok(())
    }

    fn detach(&mut self, slot: Slot) -> Option<TcpStream> {
        let sock = self.live(slot)?;
        if sock.send != SendState::Idle {
            return None;
        }
        sock.want_recv = false;
        let gen = sock.gen;
        let recv_tag = tag(Kind::Recv, slot, gen);
        match sock.recv {
            RecvState::Idle | RecvState::Queued => {}
            RecvState::Armed => {
                self.ring
                    .cancel(recv_tag, tag(Kind::RecvCancel, slot, gen))
                    .ok()?;
                self.live(slot)?.recv = RecvState::Cancelling;
                self.wait_recv_end(recv_tag)?;
            }
            RecvState::Cancelling => self.wait_recv_end(recv_tag)?,
        }
        let stream = self.st.socks[slot].take()?.stream;
        // Hand it back as it came (and as the epoll back end expects it).
        let _ = stream.set_nonblocking(true);
        Some(stream)
    }

    fn close(&mut self, slot: Slot) {
        let Some(sock) = self.st.socks.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let recv_in_ring = matches!(sock.recv, RecvState::Armed | RecvState::Cancelling);
        let mut ops = u32::from(recv_in_ring) + u32::from(sock.send == SendState::InRing);
        if ops == 0 {
            return; // dropping the stream closes it
        }
        match self
            .ring
            .cancel_fd(sock.stream.as_fd(), tag(Kind::CloseCancel, slot, sock.gen))
        {
            Ok(()) => ops += 1,
            // Without a cancel, ending the connection ends its operations.
            Err(_) => {
                let _ = sock.stream.shutdown(std::net::Shutdown::Both);
            }
        }
        self.st.closing.insert(
            key(slot, sock.gen),
            Closing {
                stream: sock.stream,
                ops,
            },
        );
    }

    fn set_recv(&mut self, slot: Slot, enabled: bool) {
        let Some(sock) = self.live(slot) else { return };
        sock.want_recv = enabled;
        let (gen, state) = (sock.gen, sock.recv);
        if enabled {
            self.st.queue_arm(slot);
        } else if state == RecvState::Queued {
            // Not in the ring yet: it is simply not armed.
            sock.recv = RecvState::Idle;
        } else if state == RecvState::Armed {
            let recv_tag = tag(Kind::Recv, slot, gen);
            if self
                .ring
                .cancel(recv_tag, tag(Kind::RecvCancel, slot, gen))
                .is_ok()
            {
                if let Some(sock) = self.live(slot) {
                    sock.recv = RecvState::Cancelling;
                }
            }
        }
    }

    fn send(&mut self, slot: Slot, buf: Vec<u8>) {
        let Self { ring, st, .. } = self;
        let Some(sock) = st.socks.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        debug_assert!(sock.send == SendState::Idle, "one send in flight per slot");
        let gen = sock.gen;
        if buf.is_empty() {
            sock.send = SendState::Local;
            st.local.push(Local::Sent {
                slot,
                gen,
                buf,
                result: Ok(()),
            });
            return;
        }
        submit_send(ring, &mut st.local, sock, (slot, gen), buf, 0);
    }

    fn turn(
        &mut self,
        timeout: Option<Duration>,
        on: &mut dyn FnMut(Completion<'_>),
    ) -> io::Result<()> {
        self.arm_queued();
        let wait = if self.st.local.is_empty() && !self.ring.has_backlog() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        self.ring.submit_and_wait(wait)?;
        let Self { ring, st, .. } = self;
        let mut local = std::mem::take(&mut st.local);
        for l in local.drain(..) {
            match l {
                Local::Sent {
                    slot,
                    gen,
                    buf,
                    result,
                } => {
                    if st.is_live(slot, gen) {
                        st.socks[slot].as_mut().expect("live").send = SendState::Idle;
                        on(Completion::Sent { slot, buf, result });
                    }
                }
                Local::RecvClosed { slot, gen, error } => {
                    if st.is_live(slot, gen) {
                        on(Completion::RecvClosed {
                            slot,
                            error: Some(error),
                        });
                    }
                }
            }
        }
        if st.local.is_empty() {
            st.local = local;
        }
        ring.reap(&mut |ev| st.on_event(ev, on));
        self.after_reap();
        Ok(())
    }

    fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        let w = self.waker.clone();
        Arc::new(move || w.wake())
    }

    fn name(&self) -> &'static str {
        "uring"
    }

    fn max_turn_bytes(&self) -> usize {
        self.max_turn_bytes
    }

    fn bytes_acked(&self, slot: Slot) -> Option<u64> {
        use std::os::fd::AsFd;
        let sock = self.st.socks.get(slot)?.as_ref()?;
        ferry_sys::sockopt::tcp_bytes_acked(sock.stream.as_fd()).ok()
    }

    fn rtt(&self, slot: Slot) -> Option<std::time::Duration> {
        use std::os::fd::AsFd;
        let sock = self.st.socks.get(slot)?.as_ref()?;
        ferry_sys::sockopt::tcp_rtt(sock.stream.as_fd()).ok()
    }

    fn limit_recv(&mut self, slot: Slot, bytes: usize) -> Option<usize> {
        use std::os::fd::AsFd;
        let sock = self.live(slot)?;
        ferry_sys::sockopt::cap_recv_buffer(sock.stream.as_fd(), bytes).ok()
    }

    fn recv_buffers(&self) -> crate::RecvBuffers {
        let s = self.stats();
        crate::RecvBuffers {
            bytes: u64::from(s.buffers) * u64::from(s.buffer_size),
            exhausted: s.enobufs,
            growths: s.buffer_growths,
        }
    }
}

impl UringDriver {
    /// Waits until the receive tagged `recv_tag` has delivered its final
    /// completion. `None` when it has not within [`DETACH_WAIT`], or when
    /// completions the handler must see first (bytes, an error) arrived on
    /// the way; those are reported by the next turn.
    fn wait_recv_end(&mut self, recv_tag: u64) -> Option<()> {
        let deadline = Instant::now() + DETACH_WAIT;
        loop {
            let mut ended = false;
            let mut news = false;
            for p in self.ring.pending().filter(|p| p.tag == recv_tag) {
                if p.result > 0
                    || (p.result < 0 && !matches!(-p.result, ECANCELED | ENOBUFS | EINTR | EAGAIN))
                {
                    news = true;
                }
                ended |= !p.more;
            }
            if ended {
                return (!news).then_some(());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            self.ring.submit_and_wait(Some(deadline - now)).ok()?;
            self.ring.stash();
        }
    }
}

/// Puts `buf`, from byte `off` on, into the ring as the send of `sock`
/// (`slot` and generation `gen`); when the ring refuses it, the failure
/// is a local completion, reported at the next turn.
fn submit_send(
    ring: &mut Ring,
    local: &mut Vec<Local>,
    sock: &mut Sock,
    (slot, gen): (Slot, u32),
    buf: Vec<u8>,
    off: usize,
) {
    match ring.send(sock.stream.as_fd(), buf, off, tag(Kind::Send, slot, gen)) {
        Ok(()) => sock.send = SendState::InRing,
        Err((e, mut buf)) => {
            buf.clear();
            sock.send = SendState::Local;
            local.push(Local::Sent {
                slot,
                gen,
                buf,
                result: Err(e),
            });
        }
    }
}
