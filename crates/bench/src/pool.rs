//! A single-threaded set of connections that only handshake and then sit:
//! the machinery under `idle` (open many, hold them) and `churn` (open and
//! close at a rate).
//!
//! Each call to [`Pool::turn`] polls once, advances every connection that
//! has something to do, answers server pings, flushes, and reports
//! handshakes that finished and connections that failed. A connection that
//! has not finished its handshake within the timeout fails with
//! [`LinkError::Timeout`]. Slots freed during a turn are reused only in a
//! later turn, so a stale readiness event can never reach a new connection.

use crate::clock::now_ns;
use crate::conn::{Link, LinkError, PeerKey, Scratch};
use crate::target::Target;
use ferry_proto::client::Event;
use mio::{Events, Poll, Token};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// How often connections are checked for handshake timeouts.
const TIMEOUT_SCAN_NS: u64 = 50_000_000;

/// What happened to a connection during a turn.
#[derive(Debug)]
pub enum PoolEvent {
    /// The handshake finished.
    Ready {
        /// The connection's slot.
        slot: usize,
        /// Time from connect to serverInfo, nanoseconds.
        handshake_ns: u64,
    },
    /// The connection failed (and is gone from the pool).
    Failed {
        /// Its former slot.
        slot: usize,
        /// Why.
        error: LinkError,
        /// Whether it had finished its handshake.
        was_ready: bool,
    },
}

/// See the module docs.
pub struct Pool {
    poll: Poll,
    events: Events,
    links: Vec<Option<Link>>,
    free: Vec<usize>,
    freed: Vec<usize>,
    scratch: Scratch,
    handshake_timeout_ns: u64,
    last_scan: u64,
    ready: usize,
    open: usize,
    todo: Vec<(usize, bool, bool)>,
}

impl Pool {
    /// An empty pool whose handshakes must finish within `handshake_timeout`.
    pub fn new(handshake_timeout: Duration) -> io::Result<Self> {
        Ok(Pool {
            poll: Poll::new()?,
            events: Events::with_capacity(4096),
            links: Vec::new(),
            free: Vec::new(),
            freed: Vec::new(),
            scratch: Scratch::default(),
            handshake_timeout_ns: crate::clock::ns(handshake_timeout),
            last_scan: 0,
            ready: 0,
            open: 0,
            todo: Vec::new(),
        })
    }

    /// Connections open (handshaking or ready).
    pub fn open(&self) -> usize {
        self.open
    }

    /// Connections that finished their handshake and are still open.
    pub fn ready(&self) -> usize {
        self.ready
    }

    /// Connections still handshaking.
    pub fn in_flight(&self) -> usize {
        self.open - self.ready
    }

    /// The negotiated TLS parameters of any ready connection.
    pub fn tls_parameters(&self) -> Option<(String, String)> {
        self.links
            .iter()
            .flatten()
            .find(|l| l.is_ready())
            .and_then(|l| l.tls_parameters())
    }

    /// Starts a connection; returns its slot.
    pub fn connect(&mut self, target: &Target, key: Arc<PeerKey>) -> Result<usize, LinkError> {
        let mut link = Link::connect(target, key, now_ns())?;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.links.push(None);
                self.links.len() - 1
            }
        };
        link.register(self.poll.registry(), Token(slot))
            .map_err(LinkError::Connect)?;
        self.links[slot] = Some(link);
        self.open += 1;
        Ok(slot)
    }

    /// Closes the connection in `slot` (a plain TCP close).
    pub fn close(&mut self, slot: usize) {
        if let Some(mut l) = self.links.get_mut(slot).and_then(|l| l.take()) {
            let _ = l.deregister(self.poll.registry());
            if l.is_ready() {
                self.ready -= 1;
            }
            self.open -= 1;
            self.freed.push(slot);
        }
    }

    /// Closes every connection.
    pub fn close_all(&mut self) {
        for slot in 0..self.links.len() {
            self.close(slot);
        }
    }

    fn fail(&mut self, slot: usize, error: LinkError, out: &mut Vec<PoolEvent>) {
        let was_ready = self.links[slot].as_ref().is_some_and(|l| l.is_ready());
        self.close(slot);
        out.push(PoolEvent::Failed {
            slot,
            error,
            was_ready,
        });
    }

    /// Polls once (waiting at most `timeout`), advances connections and
    /// appends what happened to `out`.
    pub fn turn(&mut self, timeout: Duration, out: &mut Vec<PoolEvent>) -> io::Result<()> {
        self.free.append(&mut self.freed);
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        self.todo.clear();
        self.todo.extend(self.events.iter().map(|ev| {
            (
                ev.token().0,
                ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                ev.is_writable(),
            )
        }));
        for k in 0..self.todo.len() {
            let (slot, readable, writable) = self.todo[k];
            let Some(link) = self.links.get_mut(slot).and_then(|l| l.as_mut()) else {
                continue;
            };
            let was_ready = link.is_ready();
            let mut result = if writable { link.on_writable() } else { Ok(()) };
            if result.is_ok() && readable {
                // Server pings are answered by the DERP client itself.
                let mut on_frame = |_: &mut Vec<u8>, _: Event<&[u8]>| {};
                // Idle connections receive almost nothing; a small budget is
                // plenty and keeps one chatty socket from hogging the turn.
                result = link
                    .on_readable(&mut self.scratch, 1 << 16, &mut on_frame)
                    .map(|_| ());
            }
            if result.is_ok() && link.wants_flush() {
                result = link.flush();
            }
            match result {
                Err(e) => self.fail(slot, e, out),
                Ok(()) if !was_ready && link.is_ready() => {
                    self.ready += 1;
                    let handshake_ns = now_ns().saturating_sub(link.started_ns);
                    out.push(PoolEvent::Ready { slot, handshake_ns });
                }
                Ok(()) => {}
            }
        }
        let now = now_ns();
        if now.saturating_sub(self.last_scan) >= TIMEOUT_SCAN_NS {
            self.last_scan = now;
            for slot in 0..self.links.len() {
                let expired = self.links[slot]
                    .as_ref()
                    .filter(|l| {
                        !l.is_ready()
                            && now.saturating_sub(l.started_ns) > self.handshake_timeout_ns
                    })
                    .map(|l| l.stage());
                if let Some(stage) = expired {
                    self.fail(slot, LinkError::Timeout(stage), out);
                }
            }
        }
        Ok(())
    }
}
