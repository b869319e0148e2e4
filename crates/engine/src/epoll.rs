//! The epoll back end: completions emulated on top of mio's readiness.
//!
//! Readiness is edge-triggered, so the driver remembers which sockets are
//! readable and keeps them on a ready list until a read comes back short or
//! `WouldBlock`. Each turn reads at most [`READ_BUDGET`] chunks per socket so
//! one busy sender cannot starve the others; what is left stays on the
//! ready list for the next turn. Sends are written as soon as they are
//! submitted; a send the kernel cannot take whole waits for the socket's
//! writable edge, and its completion is reported once every byte is out.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use crate::driver::{Completion, Driver, Slot};

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
    /// On the ready list (avoids duplicates).
    queued: bool,
    /// End of stream or an error was reported; nothing more to read.
    recv_done: bool,
    /// The send in flight and how much of it was written.
    send: Option<(Vec<u8>, usize)>,
}

struct Listener {
    inner: mio::net::TcpListener,
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
            ready: Vec::new(),
            done: Vec::new(),
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
            inner,
            ready: true,
            retry_at: None,
        });
        Ok(idx)
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
            queued: true,
            recv_done: false,
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
            if l.ready {
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
            if !l.ready || l.retry_at.is_some_and(|at| at > now) {
                continue;
            }
            l.retry_at = None;
            for _ in 0..ACCEPT_BUDGET {
                match l.inner.accept() {
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
                match sock.stream.read(scratch) {
                    Ok(0) => {
                        sock.recv_done = true;
                        on(Completion::RecvClosed { slot, error: None });
                        break;
                    }
                    Ok(n) => {
                        on(Completion::Received {
                            slot,
                            data: &scratch[..n],
                        });
                        if n < scratch.len() {
                            // A short read on a stream socket took all there
                            // was; new bytes bring a new edge.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};

    fn collect(d: &mut EpollDriver, turns: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..turns {
            d.turn(Some(Duration::from_millis(20)), &mut |c| {
                out.push(match c {
                    Completion::Accepted { listener, .. } => format!("accepted {listener}"),
                    Completion::Received { slot, data } => {
                        format!("recv {slot} {}", String::from_utf8_lossy(data))
                    }
                    Completion::RecvClosed { slot, error } => {
                        format!("closed {slot} {}", error.is_some())
                    }
                    Completion::Sent { slot, result, .. } => {
                        format!("sent {slot} {}", result.is_ok())
                    }
                    Completion::Record {
                        slot, record_type, ..
                    } => format!("record {slot} {record_type}"),
                    Completion::Woken => "woken".into(),
                })
            })
            .unwrap();
        }
        out
    }

    #[test]
    fn accept_receive_send_close() {
        let mut d = EpollDriver::new().unwrap();
        let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        let addr = l.local_addr().unwrap();
        d.add_listener(l).unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let mut accepted = None;
        for _ in 0..50 {
            d.turn(Some(Duration::from_millis(20)), &mut |c| {
                if let Completion::Accepted { stream, .. } = c {
                    accepted = Some(stream);
                }
            })
            .unwrap();
            if accepted.is_some() {
                break;
            }
        }
        d.attach(3, accepted.expect("accepted")).unwrap();
        client.write_all(b"hello").unwrap();
        let events = collect(&mut d, 5);
        assert!(events.contains(&"recv 3 hello".to_string()), "{events:?}");

        d.send(3, b"world".to_vec());
        let events = collect(&mut d, 2);
        assert!(events.contains(&"sent 3 true".to_string()), "{events:?}");
        let mut buf = [0u8; 5];
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"world");

        drop(client);
        let events = collect(&mut d, 5);
        assert!(events.contains(&"closed 3 false".to_string()), "{events:?}");
    }

    #[test]
    fn paused_socket_is_not_read_until_resumed() {
        let mut d = EpollDriver::new().unwrap();
        let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        d.attach(0, server).unwrap();
        d.set_recv(0, false);
        client.write_all(b"queued").unwrap();
        let events = collect(&mut d, 3);
        assert!(events.iter().all(|e| !e.starts_with("recv")), "{events:?}");
        d.set_recv(0, true);
        let events = collect(&mut d, 3);
        assert!(events.contains(&"recv 0 queued".to_string()), "{events:?}");
    }

    #[test]
    fn waker_interrupts_turn() {
        let mut d = EpollDriver::new().unwrap();
        let wake = d.waker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            wake();
        });
        let start = Instant::now();
        let mut woken = false;
        while !woken && start.elapsed() < Duration::from_secs(5) {
            d.turn(None, &mut |c| woken |= matches!(c, Completion::Woken))
                .unwrap();
        }
        t.join().unwrap();
        assert!(woken);
    }

    #[test]
    fn large_send_completes_after_peer_drains() {
        let mut d = EpollDriver::new().unwrap();
        let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        d.attach(1, server).unwrap();
        let payload = vec![7u8; 8 << 20];
        d.send(1, payload.clone());
        let reader = std::thread::spawn(move || {
            let mut client = client;
            let mut got = vec![0u8; 8 << 20];
            client.read_exact(&mut got).unwrap();
            got
        });
        let start = Instant::now();
        let mut sent = false;
        while !sent && start.elapsed() < Duration::from_secs(10) {
            d.turn(Some(Duration::from_millis(50)), &mut |c| {
                if let Completion::Sent { result, buf, .. } = c {
                    assert!(result.is_ok());
                    assert!(buf.is_empty() && buf.capacity() >= 8 << 20);
                    sent = true;
                }
            })
            .unwrap();
        }
        assert!(sent);
        assert_eq!(reader.join().unwrap(), payload);
    }
}
