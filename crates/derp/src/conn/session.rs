//! The DERP server side of one connection, without I/O.
//!
//! A [`Session`] holds what the DERP protocol needs per connection and
//! nothing of the shard: the frame reader, the three output queues and
//! their caps, and the clocks (handshake deadline, keepalive, write
//! timeout). Its caller, the shard, owns the sockets and the routing, and
//! passes the time in; the session never reads the clock.
//!
//! - **Input**: [`Reader::handle_bytes`] splits client bytes into frames
//!   and hands each one to the caller as an [`Action`] that borrows the
//!   caller's read buffer (no copy, no allocation). The reader travels
//!   apart from the queues while it runs ([`Session::take_reader`]): an
//!   action may queue output on this very connection (a packet to its own
//!   key, the pong for its ping), so the queues must stay reachable.
//! - **Output**: the shard queues server frames ([`Session::queue_packet`]
//!   with its [`Caps`], [`Session::answer_ping`], peerGone, peerPresent,
//!   keepAlive, restarting) and drains them with [`Session::poll_output`]
//!   into the send buffer, control frames first, then disco, then data.
//!   Control frames the shard queues on a peer's behalf go through
//!   [`Session::queue_control`] with a cap the shard chooses by who caused
//!   them (the connection itself, another client, presence for a
//!   watcher); a pong is queued at most once per flush. Disco and data
//!   have caps of their own, so bulk data cannot crowd out NAT traversal.
//!   A send in flight is noted
//!   ([`Session::start_send`], [`Session::on_sent`]) for the write timeout.
//! - **Time**: [`Session::poll_timeout`] says when the session next needs
//!   [`Session::handle_timeout`]: the deadline until [`Session::establish`]
//!   (handshake, or a farewell after [`Session::set_deadline`]), then the
//!   write timeout of a send in flight and the next keepAlive.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use ferry_proto::frame::{
    self, ClientFrame, Deframer, Fed, FrameError, ServerFramePolicy, PING_LEN,
};
use ferry_proto::key::NodePublic;

use crate::metrics::PacketKind;

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
    /// ping: answer with [`Session::answer_ping`].
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

/// Queue caps for [`Session::queue_packet`] (the shard's settings).
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

/// What [`Session::queue_packet`] did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Queued, within the caps.
    Yes,
    /// Queued, but the data queue is over its cap: the sender should wait.
    OverCap,
    /// Dropped: over the cap (the `QueueTail` drop).
    Dropped,
}

/// Which clock went off in [`Session::handle_timeout`].
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

/// The DERP server session of one connection (see the module doc).
#[derive(Debug)]
pub struct Session {
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

impl Session {
    /// A session whose handshake must finish by `deadline`.
    pub fn new(deadline: Instant) -> Self {
        Session {
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

    /// Takes the frame reader out while it runs (see the module doc); put
    /// it back with [`Session::put_reader`].
    #[inline]
    pub fn take_reader(&mut self) -> Reader {
        std::mem::take(&mut self.reader)
    }

    /// Puts the reader back.
    #[inline]
    pub fn put_reader(&mut self, reader: Reader) {
        self.reader = reader;
    }

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

    /// When [`Session::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let Some(e) = self.established else {
            return Some(self.deadline);
        };
        let write = self.in_flight.zip(e.write_timeout).map(|(t, l)| t + l);
        Some(write.map_or(e.next_keepalive, |w| w.min(e.next_keepalive)))
    }

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

    /// The control queue, for bytes the caller frames itself and that one
    /// connection's handshake or end bounds (an HTTP response, a TLS
    /// alert, serverInfo). Frames a peer can cause again and again go
    /// through [`Session::queue_control`].
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

    /// Whether any frame waits to be written.
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.ctrl.is_empty() || !self.disco.is_empty() || !self.data.is_empty()
    }

    /// Whether control bytes wait to be written.
    #[inline]
    pub fn has_control(&self) -> bool {
        !self.ctrl.is_empty()
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

    /// The send buffer to fill, empty (its memory is kept between sends).
    #[inline]
    pub fn take_send_buffer(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.spare);
        buf.clear();
        buf
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

    /// Moves only the control queue into `buf` (bytes that must go out
    /// raw, before encryption starts: a TLS alert, an HTTP response).
    pub fn poll_control(&mut self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.ctrl);
        self.ctrl.clear();
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

    /// The send finished; `buf` is the next send buffer.
    #[inline]
    pub fn on_sent(&mut self, buf: Vec<u8>) {
        self.in_flight = None;
        self.in_flight_bytes = 0;
        self.spare = buf;
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
mod tests {
    use super::*;

    fn policy(mesh: bool) -> ServerFramePolicy {
        ServerFramePolicy {
            mesh,
            relay_sessions: false,
        }
    }
    use ferry_proto::frame::{FrameType, PeerGoneReason, DISCO_MAGIC};

    const CAPS: Caps = Caps {
        disco_packets: 2,
        data_bytes: 200,
        hard_bytes: 400,
    };

    fn key(b: u8) -> NodePublic {
        NodePublic::from_bytes([b; 32])
    }

    fn frame_bytes(ty: FrameType, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame::put_frame(&mut out, ty as u8, payload);
        out
    }

    /// Every server frame in `bytes`, as (type, payload).
    fn frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let (ty, len) = frame::decode_header(rest).expect("header");
            let end = frame::HEADER_LEN + len as usize;
            out.push((ty, rest[frame::HEADER_LEN..end].to_vec()));
            rest = &rest[end..];
        }
        out
    }

    /// What `s` did with `packet` from key `src`.
    fn queue(s: &mut Session, src: u8, packet: &[u8], kind: PacketKind, overshoot: bool) -> Queued {
        s.queue_packet(&key(src), packet, kind, &CAPS, overshoot).0
    }

    fn drain(s: &mut Session) -> Vec<(u8, Vec<u8>)> {
        let mut buf = s.take_send_buffer();
        s.poll_output(&mut buf);
        frames(&buf)
    }

    fn established(now: Instant) -> Session {
        let mut s = Session::new(now + Duration::from_secs(10));
        s.establish(
            now + Duration::from_secs(60),
            Duration::from_secs(60),
            Some(Duration::from_secs(10)),
        );
        s
    }

    #[test]
    fn handshake_deadline_fires_exactly_at_the_deadline() {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(5);
        let mut s = Session::new(deadline);
        assert_eq!(s.poll_timeout(), Some(deadline));
        let no_jitter = || panic!("no keepalive before the handshake");
        assert_eq!(
            s.handle_timeout(deadline - Duration::from_millis(1), no_jitter),
            None
        );
        assert_eq!(
            s.handle_timeout(deadline, no_jitter),
            Some(Timeout::Deadline)
        );
        // Established, the deadline no longer applies.
        s.establish(t0 + Duration::from_secs(60), Duration::from_secs(60), None);
        assert_eq!(s.handle_timeout(deadline, no_jitter), None);
        // A farewell brings a deadline back.
        let bye = t0 + Duration::from_secs(7);
        s.set_deadline(bye);
        assert_eq!(s.poll_timeout(), Some(bye));
        assert_eq!(s.handle_timeout(bye, no_jitter), Some(Timeout::Deadline));
    }

    #[test]
    fn a_quiet_connection_gives_up_its_send_buffer_and_the_handshakes_room() {
        let t0 = Instant::now();
        let mut s = established(t0);
        s.control_mut().extend_from_slice(&[0u8; 512]);
        let mut buf = s.take_send_buffer();
        s.poll_output(&mut buf);
        s.start_send(t0, buf.len());
        assert_eq!(
            s.release_idle_send_buffer(usize::MAX),
            None,
            "a send in flight keeps its buffer"
        );
        s.on_sent(buf);
        s.answer_ping(&[1; PING_LEN]);
        assert_eq!(s.release_idle_send_buffer(usize::MAX), None, "output waits");
        let mut buf = s.take_send_buffer();
        s.poll_output(&mut buf);
        s.on_sent(buf);
        assert_eq!(s.release_idle_send_buffer(16), None, "too large to share");
        let released = s.release_idle_send_buffer(usize::MAX).expect("quiet");
        assert!(released.capacity() >= 512);
        assert!(s.ctrl.capacity() <= IDLE_CONTROL_KEEP);
        assert_eq!(s.spare.capacity(), 0);
    }

    #[test]
    fn keepalive_is_queued_when_due_and_rescheduled_with_the_jitter() {
        let t0 = Instant::now();
        let mut s = established(t0);
        let first = t0 + Duration::from_secs(60);
        assert_eq!(s.poll_timeout(), Some(first));
        assert_eq!(
            s.handle_timeout(first - Duration::from_millis(1), || Duration::ZERO),
            None
        );
        assert!(!s.has_output());
        let jitter = Duration::from_millis(1234);
        assert_eq!(s.handle_timeout(first, || jitter), Some(Timeout::KeepAlive));
        assert_eq!(
            s.poll_timeout(),
            Some(first + Duration::from_secs(60) + jitter)
        );
        assert_eq!(drain(&mut s), vec![(FrameType::KeepAlive as u8, vec![])]);
    }

    #[test]
    fn write_timeout_counts_from_the_start_of_the_send_in_flight() {
        let t0 = Instant::now();
        let mut s = established(t0);
        s.queue_packet(&key(1), b"data", PacketKind::Other, &CAPS, true);
        let mut buf = s.take_send_buffer();
        s.poll_output(&mut buf);
        let at = t0 + Duration::from_secs(1);
        s.start_send(at, buf.len());
        assert_eq!(s.sending_since(), Some(at));
        assert_eq!(s.poll_timeout(), Some(at + Duration::from_secs(10)));
        let none = || Duration::ZERO;
        assert_eq!(
            s.handle_timeout(at + Duration::from_millis(9_999), none),
            None
        );
        assert_eq!(
            s.handle_timeout(at + Duration::from_secs(10), none),
            Some(Timeout::WriteTimeout)
        );
        // A finished send stops the clock and returns the buffer.
        s.on_sent(buf);
        assert_eq!(s.sending_since(), None);
        assert_eq!(s.handle_timeout(at + Duration::from_secs(10), none), None);
    }

    #[test]
    fn output_goes_control_then_disco_then_data_and_control_is_never_dropped() {
        let mut s = established(Instant::now());
        let mut disco = DISCO_MAGIC.to_vec();
        disco.extend_from_slice(&[0; 40]);
        assert_eq!(
            queue(&mut s, 1, b"data-1", PacketKind::Other, true),
            Queued::Yes
        );
        for _ in 0..CAPS.disco_packets {
            assert_eq!(
                queue(&mut s, 2, &disco, PacketKind::Disco, true),
                Queued::Yes
            );
        }
        // The disco cap counts packets: the next one is dropped.
        assert_eq!(
            queue(&mut s, 2, &disco, PacketKind::Disco, true),
            Queued::Dropped
        );
        // Control frames go first whatever is queued.
        for _ in 0..100 {
            assert!(s.queue_control(usize::MAX, |q| frame::put_peer_gone(
                q,
                &key(3),
                PeerGoneReason::Disconnected
            )));
        }
        assert_eq!(s.queued_packets(), (2, 1));
        let out = drain(&mut s);
        assert_eq!(out.len(), 100 + 2 + 1);
        assert!(out[..100]
            .iter()
            .all(|(ty, _)| *ty == FrameType::PeerGone as u8));
        assert!(out[100..102]
            .iter()
            .all(|(ty, p)| *ty == FrameType::RecvPacket as u8 && p[32..] == disco[..]));
        assert_eq!(out[102].1[32..], b"data-1"[..]);
        assert_eq!(s.queued_packets(), (0, 0));
        assert!(!s.has_output());
    }

    #[test]
    fn control_frames_stop_at_the_cap_they_are_queued_under() {
        let mut s = established(Instant::now());
        let gone = |q: &mut Vec<u8>| frame::put_peer_gone(q, &key(3), PeerGoneReason::Disconnected);
        // 38-byte frames under a 100-byte cap: three fit (the third goes
        // past it), the fourth does not.
        let queued = (0..10).filter(|_| s.queue_control(100, gone)).count();
        assert_eq!(queued, 3);
        assert_eq!(s.queued_bytes(), 3 * 38);
        // A larger cap takes more; a flush empties the queue.
        assert!(s.queue_control(1000, gone));
        assert_eq!(drain(&mut s).len(), 4);
        assert!(s.queue_control(100, gone));
    }

    #[test]
    fn data_over_its_cap_pauses_the_sender_up_to_the_hard_cap_or_drops() {
        let mut s = established(Instant::now());
        let packet = [7u8; 100]; // 137-byte frames
        assert_eq!(
            s.queue_packet(&key(1), &packet, PacketKind::Other, &CAPS, true),
            (Queued::Yes, 137)
        );
        // Over the 200-byte cap: queued if the sender can be paused ...
        assert_eq!(
            queue(&mut s, 1, &packet, PacketKind::Other, true),
            Queued::OverCap
        );
        // ... dropped if it cannot (mesh-forwarded, or not draining) ...
        assert_eq!(
            queue(&mut s, 1, &packet, PacketKind::Other, false),
            Queued::Dropped
        );
        // ... and dropped past the hard cap whatever the sender.
        assert_eq!(
            queue(&mut s, 1, &packet, PacketKind::Other, true),
            Queued::Dropped
        );
        assert_eq!(s.queued_bytes(), 2 * 137);
        assert_eq!(s.queued_packets(), (0, 2));
    }

    #[test]
    fn only_data_queued_swaps_the_queue_into_the_send_buffer() {
        let mut s = established(Instant::now());
        s.queue_packet(&key(1), b"x", PacketKind::Other, &CAPS, true);
        let mut buf = s.take_send_buffer();
        s.poll_output(&mut buf);
        assert!(
            buf.capacity() >= QUEUE_START,
            "the queue itself became the buffer"
        );
        assert_eq!(frames(&buf).len(), 1);
    }

    #[test]
    fn one_pong_per_flush_and_the_next_ping_after_it() {
        let mut s = established(Instant::now());
        let mut reader = s.take_reader();
        let mut input = frame_bytes(FrameType::Ping, &[1; 8]);
        input.extend(frame_bytes(FrameType::Ping, &[2; 8]));
        let fed = reader.handle_bytes(&input, policy(false), |_, a| {
            match a {
                Action::Ping(data) => {
                    s.answer_ping(&data);
                }
                other => panic!("unexpected {other:?}"),
            }
            ControlFlow::Continue(())
        });
        s.put_reader(reader);
        assert_eq!(fed, Ok(Fed::Drained));
        assert_eq!(drain(&mut s), vec![(FrameType::Pong as u8, vec![1; 8])]);
        assert!(s.answer_ping(&[3; 8]));
        assert_eq!(drain(&mut s), vec![(FrameType::Pong as u8, vec![3; 8])]);
    }

    #[test]
    fn frames_become_actions_and_skipped_frames_none() {
        let mut reader = Reader::default();
        let mut input = Vec::new();
        frame::put_send_packet(&mut input, &key(9), b"hello");
        input.extend(frame_bytes(FrameType::NotePreferred, &[1]));
        input.extend(frame_bytes(FrameType::Pong, &[0; 8]));
        let mut seen = Vec::new();
        let fed = reader.handle_bytes(&input, policy(false), |len, a| {
            seen.push(format!("{len} {a:?}"));
            ControlFlow::Continue(())
        });
        assert_eq!(fed, Ok(Fed::Drained));
        assert_eq!(
            seen,
            vec![
                format!(
                    "37 {:?}",
                    Action::Send {
                        dst: key(9),
                        packet: b"hello"
                    }
                ),
                format!("1 {:?}", Action::NotePreferred(true)),
                // A client's pong is skipped by the frame policy unread.
            ]
        );
    }

    #[test]
    fn a_pause_keeps_the_rest_for_resume() {
        let mut reader = Reader::default();
        let mut input = frame_bytes(FrameType::NotePreferred, &[1]);
        input.extend(frame_bytes(FrameType::NotePreferred, &[0]));
        let fed = reader.handle_bytes(&input, policy(false), |_, _| ControlFlow::Break(()));
        assert_eq!(fed, Ok(Fed::Paused));
        assert!(reader.buffered_len() > 0);
        let mut rest = Vec::new();
        let fed = reader.resume(policy(false), |_, a| {
            rest.push(a == Action::NotePreferred(false));
            ControlFlow::Continue(())
        });
        assert_eq!((fed, rest), (Ok(Fed::Drained), vec![true]));
    }

    #[test]
    fn malformed_or_forbidden_frames_end_the_session() {
        // A sendPacket too short to hold its destination key.
        let mut reader = Reader::default();
        let input = frame_bytes(FrameType::SendPacket, &[1; 31]);
        let r = reader.handle_bytes(&input, policy(false), |_, a| {
            panic!("no action for a bad frame: {a:?}")
        });
        assert!(matches!(r, Err(FrameError::TooShort { .. })), "{r:?}");
        // A mesh-only frame from a client that is not a mesh peer.
        let mut reader = Reader::default();
        let input = frame_bytes(FrameType::WatchConns, &[]);
        let r = reader.handle_bytes(&input, policy(false), |_, a| {
            panic!("no action for a bad frame: {a:?}")
        });
        assert_eq!(
            r,
            Err(FrameError::MeshOnly {
                frame: FrameType::WatchConns as u8
            })
        );
        // The same frame from a mesh peer.
        let mut reader = Reader::default();
        let mut got = None;
        let r = reader.handle_bytes(&input, policy(true), |_, a| {
            got = Some(a == Action::WatchConns);
            ControlFlow::Continue(())
        });
        assert_eq!((r, got), (Ok(Fed::Drained), Some(true)));
    }

    #[test]
    fn restarting_goes_after_queued_data() {
        let mut s = established(Instant::now());
        s.queue_packet(&key(1), b"last", PacketKind::Other, &CAPS, true);
        s.queue_restarting(1000, 5000);
        let out = drain(&mut s);
        let kinds: Vec<u8> = out.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            kinds,
            vec![FrameType::RecvPacket as u8, FrameType::Restarting as u8]
        );
    }
}
