//! Admission ([`FramePolicy`] and the server's and client's rules) and the
//! incremental [`Deframer`] that applies it.

use super::*;

// ---------------------------------------------------------------------------
// Admission policy

/// What the deframer does with a frame once its header is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Read the whole payload and deliver the frame.
    Buffer,
    /// Discard the payload as it streams past, without buffering it.
    Skip,
    /// Fail the connection.
    Reject(FrameError),
}

/// Decides, from a header alone, whether a frame is delivered, skipped or
/// fatal. Must be a pure function of its arguments.
pub trait FramePolicy {
    /// The disposition of a frame of raw type `ty` with payload length `len`.
    fn check(&self, ty: u8, len: u32) -> Disposition;
}

fn range_disposition(ty: FrameType, len: u32, min: usize, max: usize) -> Disposition {
    match check_range(ty, len as usize, min, max) {
        Ok(()) => Disposition::Buffer,
        Err(e) => Disposition::Reject(e),
    }
}

fn exact_disposition(ty: FrameType, len: u32, expected: usize) -> Disposition {
    match check_exact(ty, len as usize, expected) {
        Ok(()) => Disposition::Buffer,
        Err(e) => Disposition::Reject(e),
    }
}

/// The Go server's rules for frames from a connected client
/// (`docs/derp-protocol.md` §5, §6, §8.11).
///
/// | Frame | Rule |
/// |---|---|
/// | sendPacket | 32 ..= 32 + 65 536 |
/// | forwardPacket | mesh only; 64 ..= 64 + 65 536 |
/// | watchConns | mesh only; exactly 0 |
/// | closePeer | mesh only; exactly 32 |
/// | notePreferred | exactly 1 |
/// | ping | 8 ..= 1 000 |
/// | relayAllocate (0xf0) | only with `relay_sessions`; exactly 36 |
/// | anything else | skipped, up to [`MAX_SKIPPED_FRAME`]; longer is fatal |
///
/// The mesh check comes first, as in Go (it happens before the payload is
/// read). derper since v1.104 also closes a connection that announces an
/// unknown frame longer than [`MAX_SKIPPED_FRAME`]: no client can send one
/// legitimately, and skipping nearly 4 GiB byte by byte only serves the
/// sender. (derper v1.102 still skips it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerFramePolicy {
    /// Whether the connection authenticated with the mesh key.
    pub mesh: bool,
    /// Whether the client asked for relay sessions (`"ferryRelay"` in its
    /// clientInfo) and the server offers them; without it relayAllocate is
    /// an unknown frame, skipped.
    pub relay_sessions: bool,
    /// Whether the connection is a mesh peer that asked for the Ferry
    /// mesh extension (`"ferryMesh"`); without it meshSession is an
    /// unknown frame, skipped.
    pub ferry_mesh: bool,
}

impl FramePolicy for ServerFramePolicy {
    fn check(&self, ty: u8, len: u32) -> Disposition {
        if ty == RELAY_ALLOCATE && self.relay_sessions {
            return match len as usize {
                crate::relay_session::ALLOCATE_LEN => Disposition::Buffer,
                n => Disposition::Reject(FrameError::BadLength {
                    frame: ty,
                    len: n,
                    expected: crate::relay_session::ALLOCATE_LEN,
                }),
            };
        }
        if ty == crate::mesh_session::MESH_SESSION && self.ferry_mesh {
            // Read, so that one past its limit is counted, not skipped.
            return up_to(ty, len, MAX_SKIPPED_FRAME, Disposition::Buffer);
        }
        let Some(t) = FrameType::from_u8(ty) else {
            return skip_disposition(ty, len);
        };
        let mesh_only = matches!(
            t,
            FrameType::ForwardPacket | FrameType::WatchConns | FrameType::ClosePeer
        );
        if mesh_only && !self.mesh {
            return Disposition::Reject(FrameError::MeshOnly { frame: ty });
        }
        match t {
            FrameType::SendPacket => range_disposition(t, len, KEY_LEN, KEY_LEN + MAX_PACKET_SIZE),
            FrameType::ForwardPacket => {
                range_disposition(t, len, 2 * KEY_LEN, 2 * KEY_LEN + MAX_PACKET_SIZE)
            }
            FrameType::WatchConns => exact_disposition(t, len, 0),
            FrameType::ClosePeer => exact_disposition(t, len, KEY_LEN),
            FrameType::NotePreferred => exact_disposition(t, len, 1),
            FrameType::Ping => range_disposition(t, len, PING_LEN, MAX_PING_LEN),
            _ => skip_disposition(ty, len),
        }
    }
}

/// Longest frame a server skips without reading it (a sendPacket's largest
/// payload: 64 KiB of packet after a 32-byte key); a longer frame of a type
/// the server ignores closes the connection.
pub const MAX_SKIPPED_FRAME: usize = KEY_LEN + MAX_PACKET_SIZE;

fn skip_disposition(ty: u8, len: u32) -> Disposition {
    up_to(ty, len, MAX_SKIPPED_FRAME, Disposition::Skip)
}

/// `within` for a frame of raw type `ty` no longer than `max`; fatal
/// otherwise.
fn up_to(ty: u8, len: u32, max: usize, within: Disposition) -> Disposition {
    if len as usize > max {
        Disposition::Reject(FrameError::TooLong {
            frame: ty,
            len: len as usize,
            max,
        })
    } else {
        within
    }
}

/// The server's rule for the first frame of a connection
/// (`docs/derp-protocol.md` §7.6): it must be `clientInfo` of
/// [`MIN_CLIENT_INFO_LEN`] ..= [`MAX_CLIENT_INFO_LEN`] bytes. Use it for the
/// first frame, break out of the callback, then continue with
/// [`ServerFramePolicy`] via [`Deframer::resume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientInfoFramePolicy;

impl FramePolicy for ClientInfoFramePolicy {
    fn check(&self, ty: u8, len: u32) -> Disposition {
        if ty != FrameType::ClientInfo as u8 {
            return Disposition::Reject(FrameError::Unexpected {
                frame: ty,
                expected: FrameType::ClientInfo as u8,
            });
        }
        range_disposition(
            FrameType::ClientInfo,
            len,
            MIN_CLIENT_INFO_LEN,
            MAX_CLIENT_INFO_LEN,
        )
    }
}

/// The Go client's rule: any frame up to [`MAX_CLIENT_READ_FRAME`] (1 MiB) is
/// read; a larger one is a connection error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFramePolicy;

impl FramePolicy for ClientFramePolicy {
    fn check(&self, ty: u8, len: u32) -> Disposition {
        up_to(ty, len, MAX_CLIENT_READ_FRAME, Disposition::Buffer)
    }
}

// ---------------------------------------------------------------------------
// Deframer

/// How a [`Deframer::feed`] or [`Deframer::resume`] call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fed {
    /// All input was consumed: every complete frame was delivered, and any
    /// trailing partial frame (or skip in progress) is held for next time.
    Drained,
    /// The callback returned `Break`. Unprocessed input has been copied into
    /// the deframer; call [`Deframer::resume`] to continue.
    Paused,
}

/// Incremental, mostly zero-copy frame splitter.
///
/// Feed it whatever a read returned; it calls back once per admitted frame.
/// Frames wholly inside the input are delivered as subslices of it. A frame
/// split across reads is assembled in an internal buffer that grows only to
/// that frame's size (which the policy bounded). Skipped frames are never
/// buffered: the deframer just counts down the bytes still to discard.
///
/// After an error the deframer is poisoned: every later call returns the same
/// error, and its buffer is released.
#[derive(Default)]
pub struct Deframer {
    /// Bytes of the stream not yet processed, from `pos` on: a partial frame,
    /// or everything after the frame at which the callback paused.
    buf: Vec<u8>,
    pos: usize,
    /// Payload bytes of a skipped frame still to be discarded.
    skip_remaining: usize,
    skipped_frames: u64,
    poisoned: Option<FrameError>,
}

impl fmt::Debug for Deframer {
    // Summarise rather than dump up to 64 KiB of held bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deframer")
            .field("buffered_len", &self.buffered_len())
            .field("capacity", &self.buf.capacity())
            .field("skip_remaining", &self.skip_remaining)
            .field("skipped_frames", &self.skipped_frames)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl Deframer {
    /// A deframer at the start of a stream, holding no memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Processes `input` after anything already held. See the type docs.
    pub fn feed<P: FramePolicy>(
        &mut self,
        input: &[u8],
        policy: &P,
        mut on_frame: impl FnMut(u8, &[u8]) -> ControlFlow<()>,
    ) -> Result<Fed, FrameError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let result = self.run(input, policy, &mut on_frame);
        if let Err(e) = &result {
            self.poisoned = Some(e.clone());
            self.buf = Vec::new();
            self.pos = 0;
            self.skip_remaining = 0;
        }
        result
    }

    /// Continues after [`Fed::Paused`] with the held bytes and no new input.
    pub fn resume<P: FramePolicy>(
        &mut self,
        policy: &P,
        on_frame: impl FnMut(u8, &[u8]) -> ControlFlow<()>,
    ) -> Result<Fed, FrameError> {
        self.feed(&[], policy, on_frame)
    }

    /// Number of stream bytes held internally (partial frame or paused input).
    pub fn buffered_len(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Whether the deframer sits at a frame boundary: nothing held and no
    /// skipped payload left to discard.
    pub fn is_empty(&self) -> bool {
        self.buffered_len() == 0 && self.skip_remaining == 0
    }

    /// Frames skipped (not delivered) so far because the policy said
    /// [`Disposition::Skip`].
    pub fn skipped_frames(&self) -> u64 {
        self.skipped_frames
    }

    /// Payload bytes of the current skipped frame still to be discarded.
    pub fn skip_remaining(&self) -> usize {
        self.skip_remaining
    }

    /// Capacity of the internal buffer, in bytes (memory held per connection).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Releases the internal buffer's memory if nothing is held, so idle
    /// connections cost no buffer space.
    pub fn shrink_if_idle(&mut self) {
        if self.buffered_len() == 0 {
            self.buf = Vec::new();
            self.pos = 0;
        }
    }

    fn run<P: FramePolicy>(
        &mut self,
        mut input: &[u8],
        policy: &P,
        on_frame: &mut impl FnMut(u8, &[u8]) -> ControlFlow<()>,
    ) -> Result<Fed, FrameError> {
        loop {
            if self.skip_remaining > 0 {
                let from_held = self.skip_remaining.min(self.buffered_len());
                self.pos += from_held;
                self.skip_remaining -= from_held;
                self.release_if_consumed();
                let from_input = self.skip_remaining.min(input.len());
                input = &input[from_input..];
                self.skip_remaining -= from_input;
                if self.skip_remaining > 0 {
                    return Ok(Fed::Drained);
                }
            }

            if self.buffered_len() > 0 {
                // Held bytes come first; complete the frame at `pos` from
                // `input` if it is partial.
                if !self.top_up(&mut input, HEADER_LEN) {
                    return Ok(Fed::Drained);
                }
                let (ty, len) =
                    decode_header(&self.buf[self.pos..]).expect("top_up guarantees a whole header");
                match policy.check(ty, len) {
                    Disposition::Reject(e) => return Err(e),
                    Disposition::Skip => {
                        self.pos += HEADER_LEN;
                        self.skip_remaining = len as usize;
                        self.skipped_frames += 1;
                        self.release_if_consumed();
                    }
                    Disposition::Buffer => {
                        let total = HEADER_LEN + len as usize;
                        if !self.top_up(&mut input, total) {
                            return Ok(Fed::Drained);
                        }
                        let start = self.pos;
                        self.pos += total;
                        let flow = on_frame(ty, &self.buf[start + HEADER_LEN..start + total]);
                        if flow.is_break() {
                            self.hold(input);
                            return Ok(Fed::Paused);
                        }
                        self.release_if_consumed();
                    }
                }
                continue;
            }

            // Nothing held: deliver whole frames straight out of `input`.
            loop {
                let Some((ty, len)) = decode_header(input) else {
                    self.hold(input);
                    return Ok(Fed::Drained);
                };
                match policy.check(ty, len) {
                    Disposition::Reject(e) => return Err(e),
                    Disposition::Skip => {
                        input = &input[HEADER_LEN..];
                        self.skip_remaining = len as usize;
                        self.skipped_frames += 1;
                        break;
                    }
                    Disposition::Buffer => {
                        let total = HEADER_LEN + len as usize;
                        if input.len() < total {
                            // Size the buffer for the whole frame once.
                            self.buf.reserve_exact(total);
                            self.hold(input);
                            return Ok(Fed::Drained);
                        }
                        let (frame, rest) = input.split_at(total);
                        input = rest;
                        if on_frame(ty, &frame[HEADER_LEN..]).is_break() {
                            self.hold(input);
                            return Ok(Fed::Paused);
                        }
                    }
                }
            }
        }
    }

    /// Moves bytes from `input` into the buffer until `need` bytes are held
    /// from `pos`. Returns whether that many are now held.
    fn top_up(&mut self, input: &mut &[u8], need: usize) -> bool {
        let have = self.buffered_len();
        if have >= need {
            return true;
        }
        self.compact();
        self.buf.reserve_exact(need - have);
        let take = (need - have).min(input.len());
        self.buf.extend_from_slice(&input[..take]);
        *input = &input[take..];
        self.buffered_len() >= need
    }

    /// Appends unprocessed input to the held bytes.
    fn hold(&mut self, input: &[u8]) {
        if input.is_empty() {
            self.release_if_consumed();
            return;
        }
        self.compact();
        self.buf.extend_from_slice(input);
    }

    /// Moves held bytes to the front of the buffer.
    fn compact(&mut self) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// Resets the buffer (keeping its capacity) once everything is consumed.
    fn release_if_consumed(&mut self) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }
}
