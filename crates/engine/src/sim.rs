//! A simulated driver for tests: completions are scripted, sends are
//! collected, and nothing waits on the clock.
//!
//! A [`SimDriver`] stands in for io_uring or epoll under a [`Handler`]
//! that a test drives turn by turn with a `now` of its own choosing (see
//! [`SimDriver::step`]). The test plays every peer: it queues bytes a peer
//! "sent" ([`SimDriver::receive`]), decides whether a peer reads what the
//! handler writes (a reading peer's sends complete on the next turn; a
//! stuck one's stay in flight until [`SimDriver::complete_send`]), and
//! reads what the handler wrote with [`SimDriver::take_output`]. Receiving
//! follows the real rule: bytes queued while the handler has paused a
//! socket stay queued (the kernel would hold them) until it resumes.
//!
//! Sockets are real loopback TCP streams, because accepted connections
//! arrive as [`TcpStream`]s and handlers set options on them; the driver
//! only holds them and never reads or writes them.
//!
//! [`Handler`]: crate::Handler

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::{Completion, Driver, Slot};
use crate::mailbox::Doorbell;
use crate::runtime::{self, BusyPoll, Handler, Wait};

/// What [`SimDriver`] reports as [`Driver::max_turn_bytes`].
pub const SIM_TURN_BYTES: usize = 256 * 1024;

/// What a simulated peer does with what the handler sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// Takes every send whole on the next turn.
    Reads,
    /// Takes nothing: sends stay in flight until the test completes them.
    Stuck,
}

struct Sock {
    /// Held so the handler's socket options have a socket to act on.
    stream: Option<TcpStream>,
    recv_enabled: bool,
    /// Bytes the peer sent that the handler has not been given yet.
    inbox: VecDeque<Vec<u8>>,
    /// The peer closed its side after the inbox.
    eof: bool,
    eof_reported: bool,
    in_flight: Option<Vec<u8>>,
    /// How much of the send in flight the peer has taken already.
    taken: usize,
    reader: Reader,
    /// Everything the peer took, not yet collected by the test.
    output: Vec<u8>,
    /// Bytes the peer took over the socket's life (its `bytes_acked`).
    acked: u64,
    /// What [`Driver::limit_recv`] capped its receive buffer at.
    recv_limit: Option<usize>,
}

/// A driver whose I/O a test scripts. See the module docs.
pub struct SimDriver {
    /// Accepted connections not yet reported, with their listener index.
    accepts: VecDeque<(usize, TcpStream, SocketAddr)>,
    socks: HashMap<Slot, Sock>,
    /// Sends the handler made on readers that take them, due next turn.
    completing: Vec<Slot>,
    /// Send completions the test released, due next turn.
    released: Vec<(Slot, io::Result<()>)>,
    /// Keeps the far ends of the streams open.
    far_ends: Vec<TcpStream>,
    listener: TcpListener,
    listeners: usize,
    /// Listeners the handler stopped ([`Driver::stop_accepting`]): their
    /// connections stay queued, as in a backlog nobody reads.
    stopped: Vec<usize>,
    /// How each newly attached socket's peer behaves.
    default_reader: Reader,
    /// Every socket's round trip ([`Driver::rtt`]); none by default.
    rtt: Option<std::time::Duration>,
    /// What peers of closed sockets read and the test has not collected.
    closed_output: HashMap<Slot, Vec<u8>>,
    /// The doorbell [`SimDriver::run_turn`] parks on; ringing it does
    /// nothing, as nothing here blocks.
    bell: Arc<Doorbell>,
}

impl SimDriver {
    /// A driver with no sockets.
    pub fn new() -> io::Result<SimDriver> {
        Ok(SimDriver {
            accepts: VecDeque::new(),
            socks: HashMap::new(),
            completing: Vec::new(),
            released: Vec::new(),
            far_ends: Vec::new(),
            listener: TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?,
            listeners: 0,
            stopped: Vec::new(),
            default_reader: Reader::Reads,
            rtt: None,
            closed_output: HashMap::new(),
            bell: Doorbell::new(Arc::new(|| {})),
        })
    }

    /// A peer connects to listener `listener` from `peer`: reported as
    /// [`Completion::Accepted`] on the next turn, or never if the handler
    /// stopped accepting on it (see [`SimDriver::backlog`]).
    pub fn connect(&mut self, listener: usize, peer: SocketAddr) -> io::Result<()> {
        let far = TcpStream::connect(self.listener.local_addr()?)?;
        let (near, _) = self.listener.accept()?;
        near.set_nonblocking(true)?;
        self.far_ends.push(far);
        self.accepts.push_back((listener, near, peer));
        Ok(())
    }

    /// The peer on `slot` sends `bytes` (delivered while receiving is on).
    pub fn receive(&mut self, slot: Slot, bytes: &[u8]) {
        if let Some(s) = self.socks.get_mut(&slot) {
            s.inbox.push_back(bytes.to_vec());
        }
    }

    /// The peer on `slot` closes its side (after what it sent).
    pub fn peer_closes(&mut self, slot: Slot) {
        if let Some(s) = self.socks.get_mut(&slot) {
            s.eof = true;
        }
    }

    /// How the peer on `slot` treats sends from now on; a peer that starts
    /// reading takes the send in flight on the next turn.
    pub fn set_reader(&mut self, slot: Slot, reader: Reader) {
        if let Some(s) = self.socks.get_mut(&slot) {
            s.reader = reader;
            if reader == Reader::Reads && s.in_flight.is_some() && !self.completing.contains(&slot)
            {
                self.completing.push(slot);
            }
        }
    }

    /// The round trip every socket reports from now on ([`Driver::rtt`]).
    pub fn set_rtt(&mut self, rtt: std::time::Duration) {
        self.rtt = Some(rtt);
    }

    /// How peers of sockets attached from now on treat sends.
    pub fn set_default_reader(&mut self, reader: Reader) {
        self.default_reader = reader;
    }

    /// The stuck peer on `slot` finally takes the send in flight (`Ok`),
    /// or the socket fails (`Err`); reported on the next turn.
    pub fn complete_send(&mut self, slot: Slot, result: io::Result<()>) {
        self.released.push((slot, result));
    }

    /// The stuck peer on `slot` reads `n` more bytes of the send in flight
    /// (at most what is left), which stays in flight: its `bytes_acked`
    /// moves, as a slow reader's does. Returns how many it took.
    pub fn take_part(&mut self, slot: Slot, n: usize) -> usize {
        let Some(s) = self.socks.get_mut(&slot) else {
            return 0;
        };
        let Some(buf) = s.in_flight.as_ref() else {
            return 0;
        };
        let n = n.min(buf.len() - s.taken);
        s.output.extend_from_slice(&buf[s.taken..s.taken + n]);
        s.taken += n;
        s.acked += n as u64;
        n
    }

    /// Everything the peer on `slot` has taken since the last call (also
    /// after the socket was closed).
    pub fn take_output(&mut self, slot: Slot) -> Vec<u8> {
        let mut out = self.closed_output.remove(&slot).unwrap_or_default();
        if let Some(s) = self.socks.get_mut(&slot) {
            out.append(&mut s.output);
        }
        out
    }

    /// Whether a send is in flight on `slot`.
    pub fn send_in_flight(&self, slot: Slot) -> bool {
        self.socks.get(&slot).is_some_and(|s| s.in_flight.is_some())
    }

    /// Connections waiting on listener `listener` and not reported (the
    /// handler stopped accepting on it).
    pub fn backlog(&self, listener: usize) -> usize {
        self.accepts.iter().filter(|a| a.0 == listener).count()
    }

    /// What the handler capped `slot`'s receive buffer at
    /// ([`Driver::limit_recv`]), if it did.
    pub fn recv_limit(&self, slot: Slot) -> Option<usize> {
        self.socks.get(&slot)?.recv_limit
    }

    /// Whether the handler has receiving on for `slot`.
    pub fn receiving(&self, slot: Slot) -> bool {
        self.socks.get(&slot).is_some_and(|s| s.recv_enabled)
    }

    /// Whether the next turn has completions to report (a real driver's
    /// wait would return at once).
    pub fn has_pending(&self) -> bool {
        self.accepts.iter().any(|a| !self.stopped.contains(&a.0))
            || !self.completing.is_empty()
            || !self.released.is_empty()
            || self
                .socks
                .values()
                .any(|s| s.recv_enabled && (!s.inbox.is_empty() || (s.eof && !s.eof_reported)))
    }

    /// Whether `slot` holds a socket (attached and not closed).
    pub fn is_open(&self, slot: Slot) -> bool {
        self.socks.contains_key(&slot)
    }

    /// Slots with a socket, in no particular order.
    pub fn slots(&self) -> Vec<Slot> {
        self.socks.keys().copied().collect()
    }

    /// One loop turn of `handler` at `now`, as the real loop runs it:
    /// completions, then [`Handler::after_turn`]. Returns the handler's
    /// next timeout.
    pub fn step<H: Handler<SimDriver>>(
        &mut self,
        handler: &mut H,
        now: Instant,
    ) -> Option<Duration> {
        let _ = self.turn(Some(Duration::ZERO), &mut |c| handler.on_completion(c, now));
        handler.after_turn(self, now);
        handler.timeout(now)
    }

    /// One turn of the real shard loop ([`runtime::turn`]) at `now`, with
    /// busy polling as `poll` allows. Nothing blocks: the answer says how
    /// a real driver would have waited before this turn's completions
    /// (parked, polled, or found work pending), which is what a test of
    /// busy polling checks with simulated time.
    pub fn run_turn<H: Handler<SimDriver>>(
        &mut self,
        handler: &mut H,
        poll: &mut BusyPoll,
        now: Instant,
    ) -> Wait {
        let bell = self.bell.clone();
        runtime::turn(self, &bell, handler, poll, &mut || now)
            .expect("the simulated driver does not fail")
    }
}

impl Driver for SimDriver {
    fn add_listener(&mut self, _listener: TcpListener) -> io::Result<usize> {
        self.listeners += 1;
        Ok(self.listeners - 1)
    }

    /// Stops at once. Listener indices the test connects to need no
    /// [`Driver::add_listener`] call, so any index can be stopped.
    fn stop_accepting(&mut self, listener: usize) {
        if !self.stopped.contains(&listener) {
            self.stopped.push(listener);
        }
    }

    fn accepting(&self, listener: usize) -> bool {
        !self.stopped.contains(&listener)
    }

    fn attach(&mut self, slot: Slot, stream: TcpStream) -> io::Result<()> {
        self.closed_output.remove(&slot);
        if self.socks.contains_key(&slot) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "slot already attached",
            ));
        }
        self.socks.insert(
            slot,
            Sock {
                stream: Some(stream),
                recv_enabled: true,
                inbox: VecDeque::new(),
                eof: false,
                eof_reported: false,
                in_flight: None,
                taken: 0,
                reader: self.default_reader,
                output: Vec::new(),
                acked: 0,
                recv_limit: None,
            },
        );
        Ok(())
    }

    fn detach(&mut self, slot: Slot) -> Option<TcpStream> {
        if self.send_in_flight(slot) {
            return None;
        }
        self.socks.remove(&slot)?.stream.take()
    }

    fn close(&mut self, slot: Slot) {
        if let Some(s) = self.socks.remove(&slot) {
            // What the peer read before the close stays readable.
            self.closed_output.entry(slot).or_default().extend(s.output);
        }
        self.completing.retain(|s| *s != slot);
        self.released.retain(|(s, _)| *s != slot);
    }

    fn set_recv(&mut self, slot: Slot, enabled: bool) {
        if let Some(s) = self.socks.get_mut(&slot) {
            s.recv_enabled = enabled;
        }
    }

    fn send(&mut self, slot: Slot, buf: Vec<u8>) {
        let Some(s) = self.socks.get_mut(&slot) else {
            return;
        };
        assert!(s.in_flight.is_none(), "one send in flight per slot");
        s.in_flight = Some(buf);
        if s.reader == Reader::Reads {
            self.completing.push(slot);
        }
    }

    fn turn(
        &mut self,
        _timeout: Option<Duration>,
        on: &mut dyn FnMut(Completion<'_>),
    ) -> io::Result<()> {
        let mut waiting = VecDeque::new();
        while let Some((listener, stream, peer)) = self.accepts.pop_front() {
            if self.stopped.contains(&listener) {
                waiting.push_back((listener, stream, peer));
                continue;
            }
            on(Completion::Accepted {
                listener,
                stream,
                peer,
            });
        }
        self.accepts = waiting;
        let mut slots: Vec<Slot> = self.socks.keys().copied().collect();
        slots.sort_unstable();
        for slot in slots {
            while let Some(s) = self.socks.get_mut(&slot) {
                if !s.recv_enabled {
                    break;
                }
                if let Some(bytes) = s.inbox.pop_front() {
                    on(Completion::Received { slot, data: &bytes });
                    continue;
                }
                if s.eof && !s.eof_reported {
                    s.eof_reported = true;
                    on(Completion::RecvClosed { slot, error: None });
                }
                break;
            }
        }
        let mut done: Vec<(Slot, io::Result<()>)> = std::mem::take(&mut self.completing)
            .into_iter()
            .map(|s| (s, Ok(())))
            .collect();
        done.append(&mut self.released);
        for (slot, result) in done {
            let Some(s) = self.socks.get_mut(&slot) else {
                continue;
            };
            let Some(mut buf) = s.in_flight.take() else {
                continue;
            };
            let taken = std::mem::take(&mut s.taken);
            if result.is_ok() {
                s.acked += (buf.len() - taken) as u64;
                s.output.extend_from_slice(&buf[taken..]);
            }
            buf.clear();
            on(Completion::Sent { slot, buf, result });
        }
        Ok(())
    }

    fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        Arc::new(|| {})
    }

    fn name(&self) -> &'static str {
        "sim"
    }

    fn max_turn_bytes(&self) -> usize {
        // A test queues what it likes; this is what the shard plans for.
        SIM_TURN_BYTES
    }

    fn bytes_acked(&self, slot: Slot) -> Option<u64> {
        self.socks.get(&slot).map(|s| s.acked)
    }

    fn rtt(&self, slot: Slot) -> Option<std::time::Duration> {
        self.socks.get(&slot).and(self.rtt)
    }

    fn limit_recv(&mut self, slot: Slot, bytes: usize) -> Option<usize> {
        let sock = self.socks.get_mut(&slot)?;
        sock.recv_limit = Some(bytes);
        Some(bytes)
    }
}
