//! The epoll back end: completions emulated on top of mio's readiness.
//!
//! Readiness is edge-triggered, so the driver remembers which sockets are
//! readable and keeps them on a ready list until a read comes back short or
//! `WouldBlock`. Each turn reads at most [`READ_BUDGET`] chunks per socket so
//! one busy sender cannot starve the others; what is left stays on the
//! ready list for the next turn. Sends are written as soon as they are
//! submitted; a send the kernel cannot take whole waits for the socket's
//! writable edge, and its completion is reported once every byte is out.
//!
//! A socket switched to kernel-TLS receive mode ([`Driver::set_ktls_rx`])
//! is read with `recvmsg` and the record type the kernel attaches
//! ([`ferry_sys::ktls::recv_record`]): application data is reported as
//! before, any other record as [`Completion::Record`], after which that
//! socket is not read again until the next turn, so the handler can act on
//! the record first (a TLS 1.3 KeyUpdate stops the kernel from decrypting
//! until new keys are set; a read before that fails with `EKEYEXPIRED` and
//! ends the connection). A short read does not mean such a socket is dry:
//! the kernel also stops at a change of record type.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use crate::driver::{Completion, Driver, Slot};
use ferry_sys::ktls::record_type::APPLICATION_DATA;

/// Bytes read per `read` call.
pub const READ_CHUNK: usize = 64 * 1024;
/// Reads per socket per turn before moving on to the next socket.
pub const READ_BUDGET: usize = 4;
/// Connections accepted per listener per turn.
const ACCEPT_BUDGET: usize = 256;
/// Pause before retrying `accept` after a resource error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

const WAKE: Token = Token(usize::MAX);
const LISTENER_BASE: usize = usize::MAX - 1;

struct Sock {
    stream: mio::net::TcpStream,
    recv_enabled: bool,
    /// An edge was seen and the socket was not yet read dry.
    readable: bool,
    /// The peer's end (or an error) was signalled: a short read then does
    /// not mean the socket is dry, the end is still to be read.
    read_closed: bool,
    /// On the ready list (avoids duplicates).
    queued: bool,
    /// End of stream or an error was reported; nothing more to read.
    recv_done: bool,
    /// Kernel-TLS receive mode: read records with their type.
    ktls_rx: bool,
    /// The send in flight and how much of it was written.
    send: Option<(Vec<u8>, usize)>,
}

struct Listener {
    /// `None` once stopped ([`Driver::stop_accepting`]): deregistered and
    /// closed; its index stays taken.
    inner: Option<mio::net::TcpListener>,
    ready: bool,
    retry_at: Option<Instant>,
}

/// Completion-shaped I/O over epoll (via mio).
pub struct EpollDriver {
    poll: Poll,
    events: Events,
    waker: Arc<mio::Waker>,
    listeners: Vec<Listener>,
    socks: Vec<Option<Sock>>,
    ready: Vec<Slot>,
    done: Vec<(Slot, Vec<u8>, io::Result<()>)>,
    scratch: Box<[u8]>,
}

impl EpollDriver {
    /// Creates a driver with its own epoll instance and waker.
    pub fn new() -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE)?);
        Ok(EpollDriver {
            poll,
            events: Events::with_capacity(1024),
            waker,
            listeners: Vec::new(),
            socks: Vec::new(),
            // Sized so that a turn with many ready sockets or finished sends
            // does not allocate in the middle of forwarding.
            ready: Vec::with_capacity(256),
            done: Vec::with_capacity(256),
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
        })
    }

    fn sock(&mut self, slot: Slot) -> Option<&mut Sock> {
        self.socks.get_mut(slot).and_then(Option::as_mut)
    }

    /// Writes as much of the pending send as the socket takes.
    fn write_pending(sock: &mut Sock, slot: Slot, done: &mut Vec<(Slot, Vec<u8>, io::Result<()>)>) {
        let Some((buf, off)) = sock.send.as_mut() else {
            return;
        };
        let result = loop {
            if *off == buf.len() {
                break Some(Ok(()));
            }
            match sock.stream.write(&buf[*off..]) {
                Ok(0) => break Some(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => *off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Some(Err(e)),
            }
        };
        if let Some(result) = result {
            let (mut buf, _) = sock.send.take().expect("send present");
            buf.clear();
            done.push((slot, buf, result));
        }
    }
}

/// Reads once into `buf`: bytes and their TLS record type (always
/// application data outside kernel-TLS receive mode).
fn read_once(sock: &mut Sock, buf: &mut [u8]) -> io::Result<(usize, u8)> {
    if sock.ktls_rx {
        use std::os::fd::AsFd;
        let rec = ferry_sys::ktls::recv_record(sock.stream.as_fd(), buf)?;
        Ok((rec.len, rec.record_type))
    } else {
        Ok((sock.stream.read(buf)?, APPLICATION_DATA))
    }
}

fn into_std(stream: mio::net::TcpStream) -> TcpStream {
    TcpStream::from(OwnedFd::from(stream))
}

impl Driver for EpollDriver {
    fn add_listener(&mut self, listener: TcpListener) -> io::Result<usize> {
        listener.set_nonblocking(true)?;
        let idx = self.listeners.len();
        let mut inner = mio::net::TcpListener::from_std(listener);
        self.poll.registry().register(
            &mut inner,
            Token(LISTENER_BASE - idx),
            Interest::READABLE,
        )?;
        self.listeners.push(Listener {
            inner: Some(inner),
            ready: true,
            retry_at: None,
        });
        Ok(idx)
    }

    fn stop_accepting(&mut self, listener: usize) {
        let Some(l) = self.listeners.get_mut(listener) else {
            return;
        };
        if let Some(mut inner) = l.inner.take() {
            let _ = self.poll.registry().deregister(&mut inner);
        }
        l.ready = false;
        l.retry_at = None;
    }

    fn accepting(&self, listener: usize) -> bool {
        self.listeners
            .get(listener)
            .is_some_and(|l| l.inner.is_some())
    }

    fn attach(&mut self, slot: Slot, stream: TcpStream) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        let mut stream = mio::net::TcpStream::from_std(stream);
        self.poll.registry().register(
            &mut stream,
            Token(slot),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        if self.socks.len() <= slot {
            self.socks.resize_with(slot + 1, || None);
        }
        // Start as readable: bytes may already be waiting (a socket moved
        // from another shard), and a spurious read only costs a WouldBlock.
        self.socks[slot] = Some(Sock {
            stream,
            recv_enabled: true,
            readable: true,
            read_closed: false,
            queued: true,
            recv_done: false,
            ktls_rx: false,
            send: None,
        });
        self.ready.push(slot);
        Ok(())
    }

    fn detach(&mut self, slot: Slot) -> Option<TcpStream> {
        let sock = self.socks.get_mut(slot)?;
        if sock.as_ref()?.send.is_some() {
            return None;
        }
        let mut sock = sock.take()?;
        let _ = self.poll.registry().deregister(&mut sock.stream);
        Some(into_std(sock.stream))
    }

    fn close(&mut self, slot: Slot) {
        if let Some(mut sock) = self.socks.get_mut(slot).and_then(Option::take) {
            let _ = self.poll.registry().deregister(&mut sock.stream);
            if !self.done.is_empty() {
                self.done.retain(|(s, _, _)| *s != slot);
            }
        }
    }

    fn set_recv(&mut self, slot: Slot, enabled: bool) {
        let Some(sock) = self.sock(slot) else { return };
        sock.recv_enabled = enabled;
        let requeue = enabled && sock.readable && !sock.queued && !sock.recv_done;
        if requeue {
            sock.queued = true;
            self.ready.push(slot);
        }
    }

    fn send(&mut self, slot: Slot, buf: Vec<u8>) {
        let Some(sock) = self.socks.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        debug_assert!(sock.send.is_none(), "one send in flight per slot");
        sock.send = Some((buf, 0));
        Self::write_pending(sock, slot, &mut self.done);
    }

    fn turn(
        &mut self,
        timeout: Option<Duration>,
        on: &mut dyn FnMut(Completion<'_>),
    ) -> io::Result<()> {
        let now = Instant::now();
        let mut timeout = timeout;
        let mut accept_due = false;
        for l in &mut self.listeners {
            if l.ready && l.inner.is_some() {
                match l.retry_at {
                    Some(at) if at > now => {
                        let wait = at - now;
                        timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
                    }
                    _ => accept_due = true,
                }
            }
        }
        if !self.ready.is_empty() || !self.done.is_empty() || accept_due {
            timeout = Some(Duration::ZERO);
        }
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }

        let mut woken = false;
        for ev in self.events.iter() {
            let token = ev.token();
            if token == WAKE {
                woken = true;
            } else if token.0 > LISTENER_BASE - self.listeners.len() && token.0 <= LISTENER_BASE {
                self.listeners[LISTENER_BASE - token.0].ready = true;
            } else if let Some(sock) = self.socks.get_mut(token.0).and_then(Option::as_mut) {
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    sock.readable = true;
                    sock.read_closed |= ev.is_read_closed() || ev.is_error();
                    if sock.recv_enabled && !sock.queued && !sock.recv_done {
                        sock.queued = true;
                        self.ready.push(token.0);
                    }
                }
                if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                    Self::write_pending(sock, token.0, &mut self.done);
                }
            }
        }
        if woken {
            on(Completion::Woken);
        }
        for (slot, buf, result) in self.done.drain(..) {
            on(Completion::Sent { slot, buf, result });
        }

        let now = Instant::now();
        for (idx, l) in self.listeners.iter_mut().enumerate() {
            let Some(inner) = l.inner.as_ref() else {
                continue;
            };
            if !l.ready || l.retry_at.is_some_and(|at| at > now) {
                continue;
            }
            l.retry_at = None;
            for _ in 0..ACCEPT_BUDGET {
                match inner.accept() {
                    Ok((stream, peer)) => on(Completion::Accepted {
                        listener: idx,
                        stream: into_std(stream),
                        peer,
                    }),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        l.ready = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                        ) => {}
                    Err(e) => {
                        // EMFILE, ENFILE, ENOBUFS: the backlog stays, retry shortly.
                        tracing::warn!(listener = idx, error = %e, "accept failed; retrying shortly");
                        l.retry_at = Some(now + ACCEPT_BACKOFF);
                        break;
                    }
                }
            }
        }

        let Self {
            socks,
            ready,
            scratch,
            ..
        } = self;
        let mut i = 0;
        while i < ready.len() {
            let slot = ready[i];
            let Some(sock) = socks.get_mut(slot).and_then(Option::as_mut) else {
                ready.swap_remove(i);
                continue;
            };
            if !sock.recv_enabled || sock.recv_done || !sock.readable {
                sock.queued = false;
                ready.swap_remove(i);
                continue;
            }
            for _ in 0..READ_BUDGET {
                match read_once(sock, scratch) {
                    Ok((0, APPLICATION_DATA)) => {
                        sock.recv_done = true;
                        on(Completion::RecvClosed { slot, error: None });
                        break;
                    }
                    Ok((n, record_type)) if record_type != APPLICATION_DATA => {
                        on(Completion::Record {
                            slot,
                            record_type,
                            data: &scratch[..n],
                        });
                        // Stays readable: read on next turn, once the
                        // handler has acted on the record.
                        break;
                    }
                    Ok((n, _)) => {
                        on(Completion::Received {
                            slot,
                            data: &scratch[..n],
                        });
                        if n < scratch.len() && !sock.read_closed && !sock.ktls_rx {
                            // A short read on a stream socket took all there
                            // was; new bytes bring a new edge. (Not so when
                            // the end already arrived: its edge was used up
                            // by this turn, and reading on returns it.)
                            sock.readable = false;
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        sock.readable = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        sock.recv_done = true;
                        on(Completion::RecvClosed {
                            slot,
                            error: Some(e),
                        });
                        break;
                    }
                }
            }
            if sock.readable && !sock.recv_done {
                i += 1;
            } else {
                sock.queued = false;
                ready.swap_remove(i);
            }
        }
        Ok(())
    }

    fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        let w = self.waker.clone();
        Arc::new(move || {
            let _ = w.wake();
        })
    }

    fn name(&self) -> &'static str {
        "epoll"
    }

    fn fd(&self, slot: Slot) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.socks.get(slot)?.as_ref().map(|s| s.stream.as_fd())
    }

    fn max_turn_bytes(&self) -> usize {
        READ_CHUNK * READ_BUDGET
    }

    fn bytes_acked(&self, slot: Slot) -> Option<u64> {
        use std::os::fd::AsFd;
        let sock = self.socks.get(slot)?.as_ref()?;
        ferry_sys::sockopt::tcp_bytes_acked(sock.stream.as_fd()).ok()
    }

    fn rtt(&self, slot: Slot) -> Option<std::time::Duration> {
        use std::os::fd::AsFd;
        let sock = self.socks.get(slot)?.as_ref()?;
        ferry_sys::sockopt::tcp_rtt(sock.stream.as_fd()).ok()
    }

    fn limit_recv(&mut self, slot: Slot, bytes: usize) -> Option<usize> {
        use std::os::fd::AsFd;
        let sock = self.sock(slot)?;
        ferry_sys::sockopt::cap_recv_buffer(sock.stream.as_fd(), bytes).ok()
    }

    fn set_ktls_rx(&mut self, slot: Slot) -> io::Result<()> {
        let sock = self
            .sock(slot)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no socket in this slot"))?;
        sock.ktls_rx = true;
        Ok(())
    }
}

// Behaviour is tested, for every back end alike, in tests/driver.rs.
