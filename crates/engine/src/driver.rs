//! The completion-shaped I/O interface.
//!
//! A shard never calls `read` or `write` itself. It hands the driver
//! sockets and send buffers, and the driver reports what finished. The
//! ownership rules are those of io_uring, so that a kernel-driven back end
//! can implement them without copies:
//!
//! - Receiving is armed per socket and stays armed (multishot) until paused
//!   with [`Driver::set_recv`]. Received bytes are lent to the handler for
//!   the duration of one [`Completion::Received`] call; the handler copies
//!   what it must keep.
//! - A send moves a `Vec<u8>` into the driver; at most one send is in flight
//!   per socket. The buffer comes back, cleared, in [`Completion::Sent`] once
//!   every byte was written (or the socket failed), so its capacity is
//!   reused and steady-state sending allocates nothing.
//! - Completions are delivered during [`Driver::turn`] to a callback that
//!   cannot reach the driver; the handler records what it wants done and
//!   submits it afterwards. All submissions of one loop turn therefore go
//!   out together, which is what batching on io_uring needs.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Index of a connection, chosen by the handler (its slab key).
pub type Slot = usize;

/// Something the driver finished.
#[derive(Debug)]
pub enum Completion<'a> {
    /// A listener accepted a connection. The stream is not yet attached.
    Accepted {
        /// Index returned by [`Driver::add_listener`].
        listener: usize,
        /// The new connection, non-blocking.
        stream: TcpStream,
        /// The remote address.
        peer: SocketAddr,
    },
    /// Bytes arrived on a connection.
    Received {
        /// The connection.
        slot: Slot,
        /// The bytes; valid only during this call.
        data: &'a [u8],
    },
    /// The peer closed its side (`None`) or the socket failed. No further
    /// `Received` completions follow for this slot.
    RecvClosed {
        /// The connection.
        slot: Slot,
        /// Why, when it was an error rather than an orderly end.
        error: Option<io::Error>,
    },
    /// A send finished: all bytes were written, or the socket failed.
    Sent {
        /// The connection.
        slot: Slot,
        /// The buffer given to [`Driver::send`], cleared.
        buf: Vec<u8>,
        /// `Err` when the socket failed before every byte was written.
        result: io::Result<()>,
    },
    /// A TLS record that is not application data arrived on a socket in
    /// kernel-TLS receive mode (see [`Driver::set_ktls_rx`]): an alert, or a
    /// post-handshake message such as KeyUpdate. Application data keeps
    /// arriving as [`Completion::Received`].
    Record {
        /// The connection.
        slot: Slot,
        /// TLS record content type (21 alert, 22 handshake, ...).
        record_type: u8,
        /// The decrypted record body; valid only during this call.
        data: &'a [u8],
    },
    /// Another thread rang this shard's doorbell.
    Woken,
}

/// The I/O back end of one shard.
pub trait Driver {
    /// Starts accepting on a listener; returns its index for
    /// [`Completion::Accepted`].
    fn add_listener(&mut self, listener: TcpListener) -> io::Result<usize>;

    /// Stops accepting on `listener` for good (a draining process: new
    /// connections stay in the socket's backlog for whoever else holds it,
    /// such as the next process under socket activation) and lets go of
    /// this driver's descriptor once nothing in flight uses it. Connections
    /// the kernel handed over before the stop took effect may still be
    /// reported; none once [`Driver::accepting`] says `false`.
    fn stop_accepting(&mut self, listener: usize);

    /// Whether `listener` may still report [`Completion::Accepted`]:
    /// `false` for an unknown index and once a stop has taken effect
    /// (at once on epoll; on io_uring when the cancelled accept ended).
    fn accepting(&self, listener: usize) -> bool;

    /// Takes ownership of a connected socket under `slot` and arms
    /// receiving on it.
    fn attach(&mut self, slot: Slot, stream: TcpStream) -> io::Result<()>;

    /// Gives a socket back (to move it to another shard). Only valid while
    /// no send is in flight on it; returns `None` if the slot is unknown or
    /// a send is in flight.
    fn detach(&mut self, slot: Slot) -> Option<TcpStream>;

    /// Closes a socket. A send in flight is abandoned and its buffer
    /// dropped; no completion follows for this slot.
    fn close(&mut self, slot: Slot);

    /// Pauses (`false`) or resumes (`true`) receiving. Bytes the kernel
    /// already holds stay there, so TCP flow control reaches the sender.
    fn set_recv(&mut self, slot: Slot, enabled: bool);

    /// Queues `buf` to be written in full. At most one send per slot may be
    /// in flight; the handler waits for [`Completion::Sent`] before the next.
    fn send(&mut self, slot: Slot, buf: Vec<u8>);

    /// Waits up to `timeout` (`None`: until something happens) and reports
    /// completions. Returns after one batch; the caller loops.
    fn turn(
        &mut self,
        timeout: Option<Duration>,
        on: &mut dyn FnMut(Completion<'_>),
    ) -> io::Result<()>;

    /// A handle other threads use to interrupt [`Driver::turn`].
    fn waker(&self) -> std::sync::Arc<dyn Fn() + Send + Sync>;

    /// Short name for logs and metrics ("epoll", "uring").
    fn name(&self) -> &'static str;

    /// The socket of `slot`, for socket options (kernel TLS set-up).
    /// `None` from a back end that does not expose its sockets, which then
    /// keeps TLS in userspace.
    fn fd(&self, _slot: Slot) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// From now on, read `slot` as a kernel-TLS socket: application data
    /// as before, other records as [`Completion::Record`] (the kernel
    /// refuses a plain read of a non-data record). Back ends that cannot
    /// do this return `Unsupported`, and the relay keeps TLS in userspace.
    fn set_ktls_rx(&mut self, _slot: Slot) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    /// The most bytes one turn can report as received for one socket. A
    /// handler that pauses a socket may still be handed this much from the
    /// turn in which it paused, and sizes its overshoot bounds with it.
    fn max_turn_bytes(&self) -> usize;

    /// Bytes of `slot`'s outgoing stream the peer has acknowledged so far
    /// (TCP's `bytes_acked`). Two readings some time apart tell a peer that
    /// takes bytes slowly (the count moves) from one that takes none (it
    /// stands still), which a send's completion cannot: a large send to a
    /// slow reader stays in flight for a long time too. `None` for an
    /// unknown slot or where the kernel does not say.
    fn bytes_acked(&self, _slot: Slot) -> Option<u64> {
        None
    }

    /// The kernel's smoothed round-trip time of `slot`'s connection;
    /// `None` for an unknown slot or where the kernel does not say.
    fn rtt(&self, _slot: Slot) -> Option<std::time::Duration> {
        None
    }

    /// Bounds what waits for `slot` in the kernel when its handler reads it
    /// slowly on purpose (a receive limit): fixes its receive buffer at
    /// about `bytes` as the kernel counts it (`SO_RCVBUF`, which also stops
    /// the kernel from growing it; see `ferry_sys::sockopt::cap_recv_buffer`).
    /// Reading goes on as before. Returns the buffer the kernel reports; `None` where
    /// the back end does not do this.
    fn limit_recv(&mut self, _slot: Slot, _bytes: usize) -> Option<usize> {
        None
    }

    /// The receive buffers this back end owns, for metrics. Back ends
    /// whose sockets are read into the caller's memory by the kernel on
    /// demand (epoll) own none and report zeros.
    fn recv_buffers(&self) -> RecvBuffers {
        RecvBuffers::default()
    }
}

/// Receive buffers a back end owns (io_uring's provided-buffer ring).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvBuffers {
    /// Bytes of receive buffers held now.
    pub bytes: u64,
    /// Receives that found every buffer in use and were re-armed.
    pub exhausted: u64,
    /// Times the pool grew.
    pub growths: u64,
}
