//! The DERP server side of one connection, without I/O: the twin of
//! [`crate::client`].
//!
//! A [`ServerConn`] holds what the DERP protocol needs per connection and
//! nothing of the server around it: the frame [`Reader`], the three output
//! queues and their caps, and the clocks (handshake deadline, keepalive,
//! write timeout). Its owner (a shard of the DERP server, the fuzz target,
//! a test) holds the socket, the transport and the routing, and passes
//! the time in; a `ServerConn` never reads the clock and knows no socket,
//! TLS state or shard.
//!
//! Its methods come in three kinds, as quinn-proto's `Connection`'s do:
//!
//! - **Inputs** (`handle_*`): [`Reader::handle_bytes`] splits client bytes
//!   into frames and hands each one to the owner as an [`Action`] that
//!   borrows the owner's read buffer (no copy, no allocation);
//!   [`ServerConn::handle_timeout`] acts on the clocks;
//!   [`ServerConn::handle_sent`] ends a send in flight. The reader travels
//!   apart from the queues while it runs ([`ServerConn::take_reader`]): an
//!   action may queue output on this very connection (a packet to its own
//!   key, the pong for its ping), so the queues must stay reachable.
//! - **Commands** from the owner: [`ServerConn::establish`] and
//!   [`ServerConn::set_deadline`] move it through its life; it queues server
//!   frames ([`ServerConn::queue_packet`] with its [`Caps`],
//!   [`ServerConn::answer_ping`], [`ServerConn::queue_control`] for
//!   peerGone, peerPresent and the answers to relay-session requests,
//!   [`ServerConn::queue_restarting`]) and notes a send starting
//!   ([`ServerConn::start_send`]). Control frames the owner queues on a
//!   peer's behalf take a cap the owner chooses by who caused them (the
//!   connection itself, another client, presence for a watcher); a pong is
//!   queued at most once per flush. Disco and data have caps of their own,
//!   so bulk data cannot crowd out NAT traversal.
//! - **Outputs** (`poll_*`), drained by the owner after its inputs:
//!   [`ServerConn::poll_output`] moves the queued frames into the send
//!   buffer, control frames first, then disco, then data;
//!   [`ServerConn::poll_timeout`] says when [`ServerConn::handle_timeout`]
//!   is next due: the deadline until [`ServerConn::establish`] (handshake,
//!   or a farewell after [`ServerConn::set_deadline`]), then the write
//!   timeout of a send in flight and the next keepAlive.
//!
//! A driver's turn is then: bytes in (actions routed), timers, output
//! polled and written, the send noted.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::frame::{
    self, ClientFrame, Deframer, Fed, FrameError, PacketKind, ServerFramePolicy, PING_LEN,
};
use crate::key::NodePublic;

/// Capacity a data queue gets when it first carries data: it and the send
/// buffer swap roles on every flush, so it grows in a few large steps,
/// never packet by packet.
const QUEUE_START: usize = 64 * 1024;
/// Send buffers larger than this are released when a connection goes idle.
const IDLE_BUFFER_KEEP: usize = 64 * 1024;
/// What the control queue keeps once the handshake's responses are out:
/// room for a pong or a keepAlive.
const IDLE_CONTROL_KEEP: usize = 64;

/// What one client frame asks of the shard. Slices borrow the bytes given
/// to [`Reader::handle_bytes`] (or the reader's own buffer for a frame that
/// was split across reads).
#[derive(Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// sendPacket: route `packet` from this client to `dst`.
    Send {
        /// The destination key.
        dst: NodePublic,
        /// The packet.
        packet: &'a [u8],
    },
    /// forwardPacket (mesh peers only): route `packet` from `src` to `dst`.
    Forward {
        /// The original sender.
        src: NodePublic,
        /// The destination key.
        dst: NodePublic,
        /// The packet.
        packet: &'a [u8],
    },
    /// notePreferred: whether the client calls this server home.
    NotePreferred(bool),
    /// ping: answer with [`ServerConn::answer_ping`].
    Ping([u8; PING_LEN]),
    /// watchConns (mesh peers only): subscribe to presence changes.
    WatchConns,
    /// closePeer (mesh peers only): close every connection of this key.
    ClosePeer(NodePublic),
    /// Any other frame the policy let through (a pong from the client, a
    /// frame type this server does not know): the one place where frame
    /// types beyond the classic set reach the shard.
    Unknown {
        /// Raw frame type.
        ty: u8,
        /// Its payload.
        payload: &'a [u8],
    },
}

/// Splits a client's bytes into frames and frames into [`Action`]s.
#[derive(Debug, Default)]
pub struct Reader {
    deframer: Deframer,
}

impl Reader {
    /// Processes `data` after anything held from earlier reads, calling `f`
    /// with each frame's payload length and action; `policy` says which
    /// frames this client may send (the mesh-only frames for a client that
    /// presented the mesh key, relayAllocate for one that asked for relay
    /// sessions). Stops early (returning
    /// [`Fed::Paused`], keeping the rest) when `f` breaks. A framing error or
    /// a malformed frame is returned as an error: the connection must end
    /// with `CloseReason::FrameError`.
    #[inline]
    pub fn handle_bytes(
        &mut self,
        data: &[u8],
        policy: ServerFramePolicy,
        mut f: impl FnMut(usize, Action<'_>) -> ControlFlow<()>,
    ) -> Result<Fed, FrameError> {
        let mut bad = None;
        let fed = self.deframer.feed(data, &policy, |ty, payload| {
            dispatch(ty, payload, &mut bad, &mut f)
        });
        bad.map_or(fed, Err)
    }

    /// Continues with the bytes held after [`Fed::Paused`].
    #[inline]
    pub fn resume(
        &mut self,
        policy: ServerFramePolicy,
        mut f: impl FnMut(usize, Action<'_>) -> ControlFlow<()>,
    ) -> Result<Fed, FrameError> {
        let mut bad = None;
        let fed = self.deframer.resume(&policy, |ty, payload| {
            dispatch(ty, payload, &mut bad, &mut f)
        });
        bad.map_or(fed, Err)
    }

    /// Reads handshake bytes: only a clientInfo frame may come, handed to
    /// `f` raw (type and payload); `f` breaks once it has it, and what
    /// follows stays held for [`Reader::resume`].
    pub fn handshake_bytes(
        &mut self,
        data: &[u8],
        f: impl FnMut(u8, &[u8]) -> ControlFlow<()>,
    ) -> Result<Fed, FrameError> {
        self.deframer.feed(data, &frame::ClientInfoFramePolicy, f)
    }

    /// Bytes held (a partial frame, or input after a pause).
    pub fn buffered_len(&self) -> usize {
        self.deframer.buffered_len()
    }
}

#[inline]
fn dispatch(
    ty: u8,
    payload: &[u8],
    bad: &mut Option<FrameError>,
    f: &mut impl FnMut(usize, Action<'_>) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let action = match frame::parse_client_frame(ty, payload) {
        Ok(ClientFrame::SendPacket { dst, packet }) => Action::Send { dst, packet },
        Ok(ClientFrame::ForwardPacket { src, dst, packet }) => Action::Forward { src, dst, packet },
        Ok(ClientFrame::NotePreferred(p)) => Action::NotePreferred(p),
        Ok(ClientFrame::Ping(data)) => Action::Ping(data),
        Ok(ClientFrame::WatchConns) => Action::WatchConns,
        Ok(ClientFrame::ClosePeer(key)) => Action::ClosePeer(key),
        Ok(ClientFrame::Pong(_) | ClientFrame::Other { .. }) => Action::Unknown { ty, payload },
        Err(e) => {
            *bad = Some(e);
            return ControlFlow::Break(());
        }
    };
    f(payload.len(), action)
}

/// Queue caps for [`ServerConn::queue_packet`] (the shard's settings).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Disco packets a queue holds at most.
    pub disco_packets: u32,
    /// Bytes of data frames past which senders pause (or packets drop).
    pub data_bytes: usize,
    /// Bytes of data frames past which even a paused sender's overshoot
    /// is dropped.
    pub hard_bytes: usize,
}

/// What [`ServerConn::queue_packet`] did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Queued, within the caps.
    Yes,
    /// Queued, but the data queue is over its cap: the sender should wait.
    OverCap,
    /// Dropped: over the cap (the `QueueTail` drop).
    Dropped,
}

/// Which clock went off in [`ServerConn::handle_timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// The deadline passed (handshake unfinished, or a farewell not taken).
    Deadline,
    /// A send has been in flight for the write timeout: the client stopped
    /// reading.
    WriteTimeout,
    /// A keepAlive was queued; the connection needs a flush.
    KeepAlive,
}

/// The DERP server side of one connection (see the module doc).
#[derive(Debug)]
pub struct ServerConn {
    reader: Reader,
    ctrl: Vec<u8>,
    disco: Vec<u8>,
    disco_n: u32,
    data: Vec<u8>,
    data_n: u32,
    /// The send buffer when no send is in flight.
    spare: Vec<u8>,
    pong_pending: bool,
    /// A send is in flight since then, with that many plaintext bytes.
    in_flight: Option<Instant>,
    in_flight_bytes: usize,
    /// Until established: when the connection must be done.
    deadline: Instant,
    established: Option<Established>,
    /// Established, and the control queue still has the capacity the
    /// handshake's responses took (trimmed once the connection is quiet).
    trim_control: bool,
}

#[derive(Clone, Copy, Debug)]
struct Established {
    next_keepalive: Instant,
    keepalive: Duration,
    write_timeout: Option<Duration>,
}

impl ServerConn {
    /// A connection whose handshake must finish by `deadline`.
    pub fn new(deadline: Instant) -> Self {
        ServerConn {
            reader: Reader::default(),
            ctrl: Vec::new(),
            disco: Vec::new(),
            disco_n: 0,
            data: Vec::new(),
            data_n: 0,
            spare: Vec::new(),
            pong_pending: false,
            in_flight: None,
            in_flight_bytes: 0,
            deadline,
            established: None,
            trim_control: false,
        }
    }

    // ---- inputs ----

    /// Acts on the clocks at `now`: reports a passed deadline or write
    /// timeout, or queues a keepAlive (scheduling the next one `jitter()`
    /// after the interval) and gives back memory an earlier burst took.
    pub fn handle_timeout(
        &mut self,
        now: Instant,
        jitter: impl FnOnce() -> Duration,
    ) -> Option<Timeout> {
        let Some(e) = self.established.as_mut() else {
            return (now >= self.deadline).then_some(Timeout::Deadline);
        };
        if let (Some(since), Some(limit)) = (self.in_flight, e.write_timeout) {
            if now.duration_since(since) >= limit {
                return Some(Timeout::WriteTimeout);
            }
        }
        if now < e.next_keepalive {
            return None;
        }
        e.next_keepalive = now + e.keepalive + jitter();
        frame::put_keepalive(&mut self.ctrl);
        // A quiet moment: give back memory an earlier burst took.
        if self.in_flight.is_none() && self.spare.capacity() > IDLE_BUFFER_KEEP {
            self.spare = Vec::new();
        }
        if self.data.is_empty() && self.data.capacity() > IDLE_BUFFER_KEEP {
            self.data = Vec::new();
        }
        self.reader.deframer.shrink_if_idle();
        Some(Timeout::KeepAlive)
    }

    /// The send in flight finished (or failed); `buf`, its buffer, is the
    /// next send buffer.
    #[inline]
    pub fn handle_sent(&mut self, buf: Vec<u8>) {
        self.in_flight = None;
        self.in_flight_bytes = 0;
        self.spare = buf;
    }

    // ---- commands ----

    /// The handshake is done: from now on a keepAlive is queued every
    /// `keepalive` (plus the jitter drawn at each), the first at
    /// `first_keepalive`, and a send in flight for `write_timeout` ends
    /// the session.
    pub fn establish(
        &mut self,
        first_keepalive: Instant,
        keepalive: Duration,
        write_timeout: Option<Duration>,
    ) {
        self.established = Some(Established {
            next_keepalive: first_keepalive,
            keepalive,
            write_timeout,
        });
        self.trim_control = true;
    }

    /// The connection must be done by `at` (a new handshake stage, or a
    /// farewell to be taken): keepalives and the write timeout stop.
    pub fn set_deadline(&mut self, at: Instant) {
        self.deadline = at;
        self.established = None;
    }

    /// Takes the frame reader out while it runs (see the module doc); put
    /// it back with [`ServerConn::put_reader`].
    #[inline]
    pub fn take_reader(&mut self) -> Reader {
        std::mem::take(&mut self.reader)
    }

    /// Puts the reader back.
    #[inline]
    pub fn put_reader(&mut self, reader: Reader) {
        self.reader = reader;
    }

    /// The control queue, for bytes the caller frames itself and that one
    /// connection's handshake or end bounds (an HTTP response, a TLS
    /// alert, serverInfo). Frames a peer can cause again and again go
    /// through [`ServerConn::queue_control`].
    pub fn control_mut(&mut self) -> &mut Vec<u8> {
        &mut self.ctrl
    }

    /// Queues the control frame(s) `put` writes, unless `cap` bytes of
    /// control frames wait already (then nothing is written and `false`
    /// returned: the caller drops the frame or closes the connection). The
    /// queue so holds at most `cap` plus one frame.
    pub fn queue_control(&mut self, cap: usize, put: impl FnOnce(&mut Vec<u8>)) -> bool {
        if self.ctrl.len() >= cap {
            return false;
        }
        put(&mut self.ctrl);
        true
    }

    /// Queues a pong for `data` unless one is queued and not yet flushed
    /// (further pings are ignored until then); `true` if queued.
    pub fn answer_ping(&mut self, data: &[u8; PING_LEN]) -> bool {
        if self.pong_pending {
            return false;
        }
        self.pong_pending = true;
        frame::put_pong(&mut self.ctrl, data);
        true
    }

    /// Queues the restarting notice after everything already queued
    /// (control frames go out first, so a data queue takes it at its end):
    /// a client that leaves when told loses nothing.
    pub fn queue_restarting(&mut self, reconnect_in_ms: u32, try_for_ms: u32) {
        let tail = if self.data.is_empty() && self.disco.is_empty() {
            &mut self.ctrl
        } else {
            &mut self.data
        };
        frame::put_restarting(tail, reconnect_in_ms, try_for_ms);
    }

    /// Queues `packet` from `src` as a recvPacket frame, within `caps`.
    /// Disco packets have a count cap and are dropped over it. Data over
    /// its byte cap is queued when `may_overshoot` (the sender will be
    /// paused; [`Queued::OverCap`]) up to the hard cap, and dropped
    /// otherwise. Returns the recvPacket frame's length with the outcome.
    #[inline]
    pub fn queue_packet(
        &mut self,
        src: &NodePublic,
        packet: &[u8],
        kind: PacketKind,
        caps: &Caps,
        may_overshoot: bool,
    ) -> (Queued, usize) {
        let frame_len = frame::HEADER_LEN + 32 + packet.len();
        match kind {
            PacketKind::Disco => {
                if self.disco_n >= caps.disco_packets {
                    return (Queued::Dropped, frame_len);
                }
                frame::put_recv_packet(&mut self.disco, src, packet);
                self.disco_n += 1;
                (Queued::Yes, frame_len)
            }
            PacketKind::Other => {
                let after = self.data.len() + frame_len;
                let over = after > caps.data_bytes;
                if over && (!may_overshoot || after > caps.hard_bytes) {
                    return (Queued::Dropped, frame_len);
                }
                if self.data.capacity() < QUEUE_START {
                    self.data.reserve(QUEUE_START);
                }
                frame::put_recv_packet(&mut self.data, src, packet);
                self.data_n += 1;
                (if over { Queued::OverCap } else { Queued::Yes }, frame_len)
            }
        }
    }

    /// The send buffer to fill, empty (its memory is kept between sends).
    #[inline]
    pub fn take_send_buffer(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.spare);
        buf.clear();
        buf
    }

    /// A send holding `plaintext` bytes of queued frames starts at `now`.
    #[inline]
    pub fn start_send(&mut self, now: Instant, plaintext: usize) {
        self.in_flight = Some(now);
        self.in_flight_bytes = plaintext;
    }

    /// Keeps `buf` (nothing was sent) as the next send buffer.
    #[inline]
    pub fn keep_send_buffer(&mut self, buf: Vec<u8>) {
        self.spare = buf;
    }

    /// Gives up the send buffer when the connection is quiet (no send in
    /// flight, nothing queued) and the buffer small enough to share:
    /// the caller pools it, so that idle connections hold none. Larger
    /// buffers stay until a keepAlive finds the connection idle. The
    /// first time after the handshake, the control queue's memory also
    /// shrinks back to a pong's worth (only then: a WebSocket client's
    /// control queue carries its framed output and keeps its size).
    pub fn release_idle_send_buffer(&mut self, share_up_to: usize) -> Option<Vec<u8>> {
        if self.in_flight.is_some() || self.has_output() {
            return None;
        }
        if std::mem::take(&mut self.trim_control) {
            self.ctrl.shrink_to(IDLE_CONTROL_KEEP);
        }
        let cap = self.spare.capacity();
        (cap > 0 && cap <= share_up_to).then(|| std::mem::take(&mut self.spare))
    }

    // ---- outputs ----

    /// When [`ServerConn::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let Some(e) = self.established else {
            return Some(self.deadline);
        };
        let write = self.in_flight.zip(e.write_timeout).map(|(t, l)| t + l);
        Some(write.map_or(e.next_keepalive, |w| w.min(e.next_keepalive)))
    }

    /// Moves every queued frame into `buf`, control first. With only data
    /// queued and `buf` empty, the queue itself becomes the send buffer
    /// and `buf`'s memory the queue: no copy.
    #[inline]
    pub fn poll_output(&mut self, buf: &mut Vec<u8>) {
        if self.ctrl.is_empty() && self.disco.is_empty() && buf.is_empty() {
            std::mem::swap(buf, &mut self.data);
        } else {
            buf.extend_from_slice(&self.ctrl);
            buf.extend_from_slice(&self.disco);
            buf.extend_from_slice(&self.data);
            self.ctrl.clear();
            self.disco.clear();
            self.data.clear();
        }
        self.output_taken();
    }

    /// Hands the queued frames (control, disco, data) to `write` and empties
    /// the queues: for a writer that frames or encrypts them itself.
    #[inline]
    pub fn poll_output_with(&mut self, write: impl FnOnce([&[u8]; 3])) {
        write([&self.ctrl, &self.disco, &self.data]);
        self.ctrl.clear();
        self.disco.clear();
        self.data.clear();
        self.output_taken();
    }

    /// Rewrites the queued frames through `wrap` (which writes into `out`
    /// what must go out instead, e.g. WebSocket messages); the result is
    /// queued as control bytes and `out` keeps the old control queue's
    /// memory.
    pub fn rewrap_output(
        &mut self,
        out: &mut Vec<u8>,
        wrap: impl FnOnce(&mut Vec<u8>, [&[u8]; 3]),
    ) {
        wrap(out, [&self.ctrl, &self.disco, &self.data]);
        self.ctrl.clear();
        self.disco.clear();
        self.data.clear();
        std::mem::swap(&mut self.ctrl, out);
    }

    #[inline]
    fn output_taken(&mut self) {
        self.disco_n = 0;
        self.data_n = 0;
        self.pong_pending = false;
    }

    // ---- state ----

    /// Whether any frame waits to be written.
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.ctrl.is_empty() || !self.disco.is_empty() || !self.data.is_empty()
    }

    /// Bytes of queued frames.
    #[inline]
    pub fn queued_bytes(&self) -> usize {
        self.ctrl.len() + self.disco.len() + self.data.len()
    }

    /// Packets queued (disco, data): what a close drops.
    pub fn queued_packets(&self) -> (u32, u32) {
        (self.disco_n, self.data_n)
    }

    /// Since when a send is in flight, if one is.
    #[inline]
    pub fn sending_since(&self) -> Option<Instant> {
        self.in_flight
    }

    /// Plaintext bytes in the send in flight.
    #[inline]
    pub fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }
}

#[cfg(test)]
mod tests;
