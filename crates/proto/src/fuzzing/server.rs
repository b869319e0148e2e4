//! The `server` fuzz target: one DERP server connection ([`ServerConn`]
//! and its frame [`Reader`](crate::server::Reader)) driven the way a shard
//! of the DERP server drives it, with a client's arbitrary bytes and the
//! shard's events in between.
//!
//! Input: `data[0]` chooses the connection (bit 0 mesh peer, bit 1 relay
//! sessions, bit 6 a clientInfo handshake first, else established at once;
//! bit 7 tight queue caps, else the shard's defaults) and how the client's
//! bytes are cut (bits 2-3: single bytes, up to 16, up to 4 096, all at
//! once; bits 4-5: how often the frame callback pauses input: never, 1 in
//! 8, 1 in 2, always). `data[1]` is a number of events (at most
//! [`MAX_EVENTS`]), 4 bytes each: kind, argument and a 16-bit offset into
//! the client's stream, which is the rest of the input. An event runs once
//! the stream has been fed up to its offset: time passing (the connection's
//! timers run), a flush (the queues drained into a send buffer that stays
//! in flight: raw, part by part as for TLS, or as WebSocket messages), the
//! send finishing, a packet from another client, an idle buffer release,
//! or control frames from the shard (peerGone, peerPresent, restarting).
//!
//! The client's frames are handled as the shard does: a sendPacket to the
//! connection's own key is queued back to it (the loopback a client can
//! use to fill its own queue; over the data cap the sender pauses, as the
//! shard pauses it), a forwardPacket to it is queued without pausing, a
//! ping is answered, anything else is noted.
//!
//! Checked after every step:
//!
//! - nothing panics;
//! - what a flush takes out is exactly control, then disco, then data as
//!   queued (inside whole binary messages for WebSocket), and parses as
//!   server frames;
//! - the queues keep their caps: disco packets at most the disco cap, data
//!   at most the hard cap, a packet over the soft cap queued only when its
//!   sender may pause; the client itself adds at most one pong per flush to
//!   the control queue, however many pings it sends;
//! - the frame reader holds at most one frame;
//! - the timers make progress: a due timer always fires, and after it the
//!   next one is later (a shard never spins on a connection);
//! - the same result whatever the cutting of the stream and the pauses:
//!   the whole transcript (actions, queue outcomes, flushed bytes, timers)
//!   equals that of feeding each stretch between two events at once.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::frame::{
    self, Fed, FrameError, FrameType, PacketKind, PeerGoneReason, ServerFramePolicy, DISCO_MAGIC,
    DISCO_MIN_LEN, HEADER_LEN, KEY_LEN, MAX_PACKET_SIZE, PING_LEN,
};
use crate::key::NodePublic;
use crate::server::{Action, Caps, Queued, ServerConn, Timeout};
use crate::websocket;

use super::{chunks, max_chunk, XorShift, MAX_BUFFERED_FRAME};

/// Events read from one input at most.
pub(crate) const MAX_EVENTS: usize = 64;
/// The shard's defaults (see `DerpConfig`).
const HANDSHAKE: Duration = Duration::from_secs(10);
const KEEPALIVE: Duration = Duration::from_secs(60);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// A pong frame's length.
const PONG_FRAME: usize = HEADER_LEN + PING_LEN;

const TIGHT_CAPS: Caps = Caps {
    disco_packets: 2,
    data_bytes: 300,
    hard_bytes: 700,
};
/// One shard's caps with the default settings (1 MiB queue).
const DEFAULT_CAPS: Caps = Caps {
    disco_packets: 32,
    data_bytes: 1 << 20,
    hard_bytes: (1 << 20) + MAX_PACKET_SIZE,
};

/// An application name for peerPresent: none, a short one, or the
/// longest valid one.
fn name(b: u8) -> &'static str {
    ["", "ferry", "0123456789abcdefghijklmnopqrstuv"][usize::from(b % 3)]
}

fn key(b: u8) -> NodePublic {
    NodePublic::from_bytes([b; 32])
}

/// The connection's own key.
fn own() -> NodePublic {
    key(0xaa)
}

/// One event of the shard's, run once the stream was fed up to `at`.
#[derive(Clone, Copy, Debug)]
struct Event {
    at: usize,
    kind: u8,
    arg: u8,
}

/// One thing that happened, in order: two runs over the same input must
/// write the same list.
#[derive(Debug, PartialEq, Eq)]
enum Note {
    ClientInfo(usize),
    Send {
        to_self: bool,
        len: usize,
        queued: Option<Queued>,
    },
    Forward {
        to_self: bool,
        len: usize,
        queued: Option<Queued>,
    },
    Ping([u8; PING_LEN], bool),
    Preferred(bool),
    WatchConns,
    ClosePeer(NodePublic),
    Unknown(u8, usize),
    Error(FrameError),
    Queued(Queued),
    /// A flush: its length and a hash of its bytes.
    Flushed(usize, u64),
    Sent,
    Released(usize),
    Timer(Timeout),
}

/// What the queues must hold, from what was put in them.
#[derive(Default)]
struct Model {
    ctrl: Vec<u8>,
    disco: Vec<u8>,
    disco_n: u32,
    data: Vec<u8>,
    data_n: u32,
    /// Bytes of recvPacket frames in `data` (the restarting notice, which
    /// the shard may append there, is not under the caps).
    data_packets: usize,
    /// Whether a pong waits in `ctrl` (no other is queued until a flush).
    pong_pending: bool,
}

impl Model {
    fn len(&self) -> usize {
        self.ctrl.len() + self.disco.len() + self.data.len()
    }

    /// What `queue_packet` must do with a frame of `frame_len` bytes.
    fn expect(&self, kind: PacketKind, frame_len: usize, caps: &Caps, overshoot: bool) -> Queued {
        match kind {
            PacketKind::Disco if self.disco_n >= caps.disco_packets => Queued::Dropped,
            PacketKind::Disco => Queued::Yes,
            PacketKind::Other => {
                let after = self.data.len() + frame_len;
                if after <= caps.data_bytes {
                    Queued::Yes
                } else if overshoot && after <= caps.hard_bytes {
                    Queued::OverCap
                } else {
                    Queued::Dropped
                }
            }
        }
    }

    fn put(&mut self, src: &NodePublic, packet: &[u8], kind: PacketKind) {
        match kind {
            PacketKind::Disco => {
                frame::put_recv_packet(&mut self.disco, src, packet);
                self.disco_n += 1;
            }
            PacketKind::Other => {
                frame::put_recv_packet(&mut self.data, src, packet);
                self.data_n += 1;
                self.data_packets += HEADER_LEN + KEY_LEN + packet.len();
            }
        }
    }

    /// Everything queued, in the order a flush takes it; the queues empty.
    fn take(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.ctrl);
        out.append(&mut self.disco);
        out.append(&mut self.data);
        *self = Model::default();
        out
    }
}

/// One run of the connection over the input.
struct Run {
    policy: ServerFramePolicy,
    caps: Caps,
    t0: Instant,
    now: Instant,
    conn: ServerConn,
    established: bool,
    /// The buffer of the send in flight.
    in_flight: Option<Vec<u8>>,
    model: Model,
    notes: Vec<Note>,
    ended: bool,
    /// Pauses input after 1 in this many frames (0: never).
    pause_one_in: usize,
    pauses: XorShift,
}

impl Run {
    fn new(ctl: u8, t0: Instant, pause_one_in: usize) -> Run {
        let established = ctl & 0x40 == 0;
        let mut conn = ServerConn::new(t0 + HANDSHAKE);
        if established {
            conn.establish(t0 + KEEPALIVE, KEEPALIVE, Some(WRITE_TIMEOUT));
        }
        Run {
            policy: ServerFramePolicy {
                mesh: ctl & 1 != 0,
                relay_sessions: ctl & 2 != 0,
                // A mesh peer with relay sessions also speaks the mesh
                // extension (meshSession buffered).
                ferry_mesh: ctl & 3 == 3,
            },
            caps: if ctl & 0x80 != 0 {
                TIGHT_CAPS
            } else {
                DEFAULT_CAPS
            },
            t0,
            now: t0,
            conn,
            established,
            in_flight: None,
            model: Model::default(),
            notes: Vec::new(),
            ended: false,
            pause_one_in,
            pauses: XorShift::new(0x5eed_0001 ^ u32::from(ctl)),
        }
    }

    /// Queues a packet from `src` as the shard's `deliver` does, checking
    /// the outcome against the caps.
    fn deliver(&mut self, src: &NodePublic, packet: &[u8], overshoot: bool) -> Queued {
        let kind = PacketKind::of(packet);
        let frame_len = HEADER_LEN + KEY_LEN + packet.len();
        let want = self.model.expect(kind, frame_len, &self.caps, overshoot);
        let (got, len) = self
            .conn
            .queue_packet(src, packet, kind, &self.caps, overshoot);
        assert_eq!(len, frame_len, "queue_packet reports the frame's length");
        assert_eq!(got, want, "{kind:?} packet of {} bytes", packet.len());
        if got != Queued::Dropped {
            self.model.put(src, packet, kind);
        }
        got
    }

    /// One client frame, as the shard's `handle_action` takes it.
    fn action(&mut self, action: Action<'_>) -> ControlFlow<()> {
        let mut pause = false;
        let note = match action {
            Action::Send { dst, packet } => {
                let to_self = dst == own();
                let queued = to_self.then(|| self.deliver(&own(), packet, true));
                // Over the cap the shard pauses the sender.
                pause = queued == Some(Queued::OverCap);
                Note::Send {
                    to_self,
                    len: packet.len(),
                    queued,
                }
            }
            Action::Forward { src, dst, packet } => {
                assert!(
                    self.policy.mesh,
                    "forwardPacket from a client that is no mesh peer"
                );
                let to_self = dst == own();
                let queued = to_self.then(|| self.deliver(&src, packet, false));
                Note::Forward {
                    to_self,
                    len: packet.len(),
                    queued,
                }
            }
            Action::Ping(data) => {
                let queued = self.conn.answer_ping(&data);
                assert_eq!(queued, !self.model.pong_pending, "one pong per flush");
                if queued {
                    frame::put_pong(&mut self.model.ctrl, &data);
                    self.model.pong_pending = true;
                }
                Note::Ping(data, queued)
            }
            Action::NotePreferred(p) => Note::Preferred(p),
            Action::WatchConns => {
                assert!(
                    self.policy.mesh,
                    "watchConns from a client that is no mesh peer"
                );
                Note::WatchConns
            }
            Action::ClosePeer(k) => {
                assert!(
                    self.policy.mesh,
                    "closePeer from a client that is no mesh peer"
                );
                Note::ClosePeer(k)
            }
            Action::Unknown { ty, payload } => {
                if ty == frame::RELAY_ALLOCATE && self.policy.relay_sessions {
                    // The policy buffers it only at its exact length.
                    crate::relay_session::parse_allocate(payload)
                        .unwrap_or_else(|e| panic!("delivered relayAllocate fails: {e}"));
                }
                assert!(
                    FrameType::from_u8(ty).is_none_or(|t| t == FrameType::Pong),
                    "frame type {ty} reached the shard as unknown"
                );
                Note::Unknown(ty, payload.len())
            }
        };
        self.notes.push(note);
        self.check();
        if pause || (self.pause_one_in != 0 && self.pauses.below(self.pause_one_in) == 0) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    /// Feeds one piece of the client's stream.
    fn feed(&mut self, chunk: &[u8]) {
        if self.ended {
            return;
        }
        let mut reader = self.conn.take_reader();
        let mut result = if self.established {
            reader.handle_bytes(chunk, self.policy, |_, a| self.action(a))
        } else {
            let notes = &mut self.notes;
            let r = reader.handshake_bytes(chunk, |ty, payload| {
                assert_eq!(ty, FrameType::ClientInfo as u8);
                notes.push(Note::ClientInfo(payload.len()));
                ControlFlow::Break(())
            });
            if r == Ok(Fed::Paused) {
                // clientInfo: the connection registers, and what followed
                // it is read under the steady-state rules.
                self.established = true;
                self.conn
                    .establish(self.now + KEEPALIVE, KEEPALIVE, Some(WRITE_TIMEOUT));
                reader.resume(self.policy, |_, a| self.action(a))
            } else {
                r
            }
        };
        // Input paused: the shard resumes it (here at once, so that pauses
        // change nothing that can be seen).
        let mut resumes = 0;
        while result == Ok(Fed::Paused) {
            resumes += 1;
            assert!(resumes <= chunk.len() + 1, "a pause consumed no frame");
            result = reader.resume(self.policy, |_, a| self.action(a));
        }
        match result {
            Ok(_) => {
                // Before the handshake, a clientInfo frame may be larger.
                let limit = if self.established {
                    MAX_BUFFERED_FRAME
                } else {
                    HEADER_LEN + frame::MAX_CLIENT_INFO_LEN
                };
                assert!(
                    reader.buffered_len() < limit,
                    "the reader holds {} bytes",
                    reader.buffered_len()
                );
            }
            Err(e) => {
                self.notes.push(Note::Error(e));
                self.ended = true;
            }
        }
        self.conn.put_reader(reader);
        self.check();
    }

    /// One of the shard's events.
    fn event(&mut self, kind: u8, arg: u8) {
        if self.ended {
            return;
        }
        match kind % 6 {
            0 => {
                let unit = [1, 100, 1_000, 60_000][usize::from(arg >> 6)];
                self.now += Duration::from_millis(u64::from(arg & 0x3f) * unit);
                self.timers(arg);
            }
            1 => self.flush(arg),
            2 => {
                if let Some(buf) = self.in_flight.take() {
                    self.conn.handle_sent(buf);
                    self.notes.push(Note::Sent);
                }
            }
            3 if self.established => {
                // A packet from another client (never paused here).
                let len = [0, 1, 8, 100, 1_400, 9_000, MAX_PACKET_SIZE][usize::from(arg % 7)];
                let mut packet = vec![arg; len];
                if arg & 0x80 != 0 && len >= DISCO_MIN_LEN {
                    packet[..DISCO_MAGIC.len()].copy_from_slice(&DISCO_MAGIC);
                }
                let q = self.deliver(&key(arg & 7), &packet, arg & 0x40 != 0);
                self.notes.push(Note::Queued(q));
            }
            4 => {
                let quiet = self.in_flight.is_none() && self.model.len() == 0;
                let got = self.conn.release_idle_send_buffer(usize::from(arg) << 10);
                assert!(
                    got.is_none() || quiet,
                    "a busy connection released its buffer"
                );
                self.notes
                    .push(Note::Released(got.map_or(0, |b| b.capacity())));
            }
            5 if self.established => match arg % 3 {
                0 => {
                    // Control frames others cause go in under a cap (64 B
                    // to 8 KiB here): over it, nothing is queued.
                    let reason = PeerGoneReason::from_u8(arg >> 4);
                    let cap = 64 << (arg % 8);
                    let room = self.model.ctrl.len() < cap;
                    let queued = self
                        .conn
                        .queue_control(cap, |q| frame::put_peer_gone(q, &key(arg), reason));
                    assert_eq!(queued, room, "peerGone queued over the cap");
                    if room {
                        frame::put_peer_gone(&mut self.model.ctrl, &key(arg), reason);
                    }
                }
                1 => {
                    let addr = (arg & 4 != 0).then(|| ([10, 0, 0, arg], 4000).into());
                    let cap = 64 << (arg % 8);
                    let room = self.model.ctrl.len() < cap;
                    let queued = self.conn.queue_control(cap, |q| {
                        frame::put_peer_present(q, &key(arg), addr, arg >> 4, name(arg))
                    });
                    assert_eq!(queued, room, "peerPresent queued over the cap");
                    if room {
                        let ctrl = &mut self.model.ctrl;
                        frame::put_peer_present(ctrl, &key(arg), addr, arg >> 4, name(arg));
                    }
                }
                _ => {
                    let (ms, try_for) = (u32::from(arg) * 100, u32::from(arg) * 1000);
                    self.conn.queue_restarting(ms, try_for);
                    let m = &mut self.model;
                    let tail = if m.data.is_empty() && m.disco.is_empty() {
                        &mut m.ctrl
                    } else {
                        &mut m.data
                    };
                    frame::put_restarting(tail, ms, try_for);
                }
            },
            _ => {}
        }
        self.check();
    }

    /// Runs the timers due at `now`; each due timer must fire, and after
    /// the last one the next deadline must be later than `now`.
    fn timers(&mut self, arg: u8) {
        for _ in 0..3 {
            let due = self
                .conn
                .poll_timeout()
                .expect("a connection always has a deadline");
            if due > self.now {
                return;
            }
            let jitter = || Duration::from_millis(u64::from(arg) * 10);
            let fired = self.conn.handle_timeout(self.now, jitter);
            let Some(t) = fired else {
                panic!(
                    "a timer due at {:?} did not fire at {:?}",
                    due - self.t0,
                    self.now - self.t0
                );
            };
            self.notes.push(Note::Timer(t));
            match t {
                Timeout::KeepAlive => {
                    assert!(self.established, "keepAlive before the handshake");
                    frame::put_keepalive(&mut self.model.ctrl);
                }
                Timeout::Deadline => {
                    assert!(!self.established, "a deadline after the handshake");
                    assert!(self.now >= self.t0 + HANDSHAKE);
                    self.ended = true;
                    return;
                }
                Timeout::WriteTimeout => {
                    let since = self.conn.sending_since().expect("a send in flight");
                    assert!(self.in_flight.is_some());
                    assert!(self.now >= since + WRITE_TIMEOUT);
                    self.ended = true;
                    return;
                }
            }
        }
        panic!("timers still due after three rounds at one instant");
    }

    /// The shard's flush: only with no send in flight; the bytes are
    /// checked and stay in flight until a send-finished event.
    fn flush(&mut self, arg: u8) {
        if self.in_flight.is_some() {
            return;
        }
        let mut buf = self.conn.take_send_buffer();
        assert!(buf.is_empty(), "a send buffer comes empty");
        let want = self.model.take();
        match arg % 3 {
            0 => self.conn.poll_output(&mut buf),
            // As for TLS: the writer copies the three parts itself.
            1 => self
                .conn
                .poll_output_with(|parts| parts.iter().for_each(|p| buf.extend_from_slice(p))),
            // As for WebSocket: the frames become binary messages first.
            _ => {
                let mut out = Vec::new();
                self.conn.rewrap_output(&mut out, |out, parts| {
                    websocket::put_binary_parts(out, &parts)
                });
                self.conn.poll_output(&mut buf);
                let mut derp = Vec::new();
                websocket::Decoder::for_client()
                    .feed(&buf, &mut derp, |c| {
                        panic!("a WebSocket control frame {c:?}")
                    })
                    .expect("whole WebSocket messages");
                assert_eq!(derp, want, "the messages carry the queued frames");
                check_frames(&derp);
                if !buf.is_empty() {
                    self.conn.start_send(self.now, buf.len());
                    self.notes.push(Note::Flushed(buf.len(), fnv(&buf)));
                    self.in_flight = Some(buf);
                } else {
                    self.conn.keep_send_buffer(buf);
                }
                return;
            }
        }
        assert_eq!(
            buf, want,
            "the flush is control, then disco, then data, as queued"
        );
        check_frames(&buf);
        if buf.is_empty() {
            self.conn.keep_send_buffer(buf);
            return;
        }
        self.conn.start_send(self.now, buf.len());
        self.notes.push(Note::Flushed(buf.len(), fnv(&buf)));
        self.in_flight = Some(buf);
    }

    /// The invariants that hold between any two steps.
    fn check(&self) {
        let (m, s, caps) = (&self.model, &self.conn, &self.caps);
        assert_eq!(s.queued_bytes(), m.len(), "queued bytes");
        assert_eq!(s.queued_packets(), (m.disco_n, m.data_n), "queued packets");
        assert_eq!(s.has_output(), m.len() > 0);
        assert!(m.disco_n <= caps.disco_packets, "disco over its cap");
        assert!(m.data_packets <= caps.hard_bytes, "data over the hard cap");
        assert!(
            !m.pong_pending || m.ctrl.len() >= PONG_FRAME,
            "a pending pong is queued"
        );
        assert_eq!(s.sending_since().is_some(), self.in_flight.is_some());
    }
}

/// FNV-1a, to keep flushed bytes out of the transcript.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The flushed bytes are whole server frames that parse.
fn check_frames(mut buf: &[u8]) {
    while !buf.is_empty() {
        let (ty, len) = frame::decode_header(buf).expect("a whole frame header");
        let end = HEADER_LEN + len as usize;
        assert!(buf.len() >= end, "a frame cut short");
        let payload = &buf[HEADER_LEN..end];
        frame::parse_server_frame(ty, payload).expect("a server frame that parses");
        assert!(
            FrameType::from_u8(ty).is_some(),
            "unknown frame type {ty} sent"
        );
        buf = &buf[end..];
    }
}

/// Runs the connection over `stream` with `events` (sorted by offset); with
/// `cut`, each stretch between two events is cut into pieces.
fn run(ctl: u8, t0: Instant, events: &[Event], stream: &[u8], cut: Option<usize>) -> Vec<Note> {
    let pause_one_in = match (cut.is_some(), (ctl >> 4) & 3) {
        (false, _) | (true, 0) => 0,
        (true, 1) => 8,
        (true, 2) => 2,
        (true, _) => 1,
    };
    let mut r = Run::new(ctl, t0, pause_one_in);
    let mut rng = XorShift::new(0x2545_f491 ^ u32::from(ctl).wrapping_mul(0x0101_0101));
    let mut fed = 0;
    let stretches = events
        .iter()
        .map(|e| (e.at, Some(e)))
        .chain([(stream.len(), None)]);
    for (at, event) in stretches {
        let stretch = &stream[fed..at];
        fed = at;
        match cut {
            Some(max) => chunks(stretch, max, &mut rng).for_each(|c| r.feed(c)),
            None if !stretch.is_empty() => r.feed(stretch),
            None => {}
        }
        if let Some(e) = event {
            r.event(e.kind, e.arg);
        }
    }
    // The client reads everything: the last flush must parse too.
    r.event(2, 0);
    r.event(1, 0);
    r.notes
}

/// Splits an input into the connection byte, the events (sorted by
/// offset) and the client's stream.
fn parse(data: &[u8]) -> Option<(u8, Vec<Event>, &[u8])> {
    let [ctl, n, rest @ ..] = data else {
        return None;
    };
    let n = usize::from(*n).min(MAX_EVENTS).min(rest.len() / 4);
    let (table, stream) = rest.split_at(n * 4);
    let mut events: Vec<Event> = table
        .chunks_exact(4)
        .map(|e| Event {
            at: usize::from(u16::from_le_bytes([e[2], e[3]])) % (stream.len() + 1),
            kind: e[0],
            arg: e[1],
        })
        .collect();
    events.sort_by_key(|e| e.at);
    Some((*ctl, events, stream))
}

/// Drives one DERP server connection with `data` (see the module doc).
pub fn server(data: &[u8]) {
    let Some((ctl, events, stream)) = parse(data) else {
        return;
    };
    let t0 = Instant::now();
    let whole = run(ctl, t0, &events, stream, None);
    let cut = run(
        ctl,
        t0,
        &events,
        stream,
        Some(max_chunk(ctl >> 2, stream.len())),
    );
    assert_eq!(
        cut, whole,
        "the transcript depends on how the bytes were cut"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transcript of a committed seed, fed at once.
    fn notes(seed: &str) -> Vec<Note> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/server/");
        let data = std::fs::read(format!("{path}{seed}")).expect("seed file");
        let (ctl, events, stream) = parse(&data).expect("a seed with a header");
        server(&data);
        run(ctl, Instant::now(), &events, stream, None)
    }

    #[test]
    fn seeds_reach_what_they_are_named_for() {
        let n = notes("ping_flood");
        let answered = n
            .iter()
            .filter(|x| matches!(x, Note::Ping(_, true)))
            .count();
        let ignored = n
            .iter()
            .filter(|x| matches!(x, Note::Ping(_, false)))
            .count();
        assert_eq!((answered, ignored), (3, 37), "one pong per flush");

        let n = notes("tight_caps_self_flood");
        let queued = |q| {
            n.iter()
                .filter(|x| matches!(x, Note::Send { queued: Some(g), .. } if *g == q))
                .count()
        };
        assert!(queued(Queued::OverCap) > 0 && queued(Queued::Dropped) > 0);

        assert!(notes("write_timeout").contains(&Note::Timer(Timeout::WriteTimeout)));
        assert!(notes("handshake_deadline").contains(&Note::Timer(Timeout::Deadline)));
        let n = notes("handshake_then_frames");
        assert!(matches!(n[0], Note::ClientInfo(_)));
        assert!(n.contains(&Note::Timer(Timeout::KeepAlive)));
        assert!(matches!(notes("too_long").last(), Some(Note::Error(_))));
        assert!(notes("mesh_peer").contains(&Note::WatchConns));
        let n = notes("relay_allocate");
        assert!(n.contains(&Note::Unknown(frame::RELAY_ALLOCATE, 36)));
        assert!(matches!(n.last(), Some(Note::Error(_))));
        let n = notes("others_and_control");
        assert!(n.contains(&Note::Queued(Queued::Dropped)), "{n:?}");
    }
}
