//! GSO trains: datagrams queued for one socket, grouped into `sendmmsg`
//! messages as UDP GSO allows, and sent with a fallback to single
//! datagrams where the kernel refuses a train all the same.
//!
//! A caller pushes runs of datagrams that are byte ranges of one buffer
//! (typically the buffer `recvmmsg` filled, or a batch the application
//! sealed in place), then sends them all; nothing is copied and, once the
//! vectors have grown to a batch's size, nothing is allocated. Every GSO
//! send in Ferry (the UDP relay's bounce, hub and session ports, the SDK's
//! batches, `ferry link`'s deliveries to WireGuard, the load generator)
//! goes through [`Trains`], so the rules live here once:
//!
//! - A train goes to one destination. Its datagrams all have the train's
//!   segment size but the last, which may be shorter and then ends it.
//! - The segment size is at most what one 1,500-byte frame carries
//!   ([`max_segment`]: 1,472 bytes to an IPv4 address, 1,452 to IPv6).
//!   The kernel refuses a train whose segment is larger than the route's
//!   MTU (`EMSGSIZE`; `EINVAL` before Linux 6.x), where it would have
//!   fragmented the same datagram sent alone; so a datagram over the
//!   segment limit always leaves alone, never in a train, and no shorter
//!   datagram joins it.
//! - At most [`MAX_SEGMENTS`] datagrams (the kernel's `UDP_MAX_SEGMENTS`
//!   is 64 on every kernel with GSO; newer ones allow 128) and
//!   [`MAX_GSO_BYTES`] bytes per train.
//!
//! What the kernel refuses anyway (a path whose MTU is below 1,500, a
//! device that cannot checksum: `EMSGSIZE`, `EINVAL`, `EIO`) is sent again
//! one datagram per message, and counted ([`Sent::fallbacks`]); `EIO`
//! also says the device refuses GSO altogether ([`Sent::gso_refused`]).
//! A full socket buffer stops the send: the rest is reported unsent
//! ([`Sent::unsent`]), for the caller to drop or to send again when the
//! socket is writable.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use crate::gso::{MAX_GSO_BYTES, MAX_SEGMENTS};
use crate::mmsg::{OutMsg, SendBatch, Span, MAX_BATCH, MAX_SPANS};

/// Largest GSO segment to an IPv4 destination: a 1,500-byte frame less
/// the IPv4 and UDP headers.
pub const MAX_SEGMENT_V4: usize = 1500 - 20 - 8;
/// Largest GSO segment to an IPv6 destination (or one whose family is not
/// known: a connected socket): 1,500 less the IPv6 and UDP headers.
pub const MAX_SEGMENT_V6: usize = 1500 - 40 - 8;

/// The largest datagram that may travel in a train to `dst`: an
/// IPv4-mapped IPv6 address (a dual-stack socket's way to reach IPv4) is
/// IPv4; `None` (the socket's connected peer) is taken as IPv6, which
/// fits either.
pub fn max_segment(dst: Option<SocketAddr>) -> usize {
    match dst {
        Some(SocketAddr::V4(_)) => MAX_SEGMENT_V4,
        Some(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_some() => MAX_SEGMENT_V4,
        _ => MAX_SEGMENT_V6,
    }
}

/// What one [`Trains::send`] did, in datagrams (a train counts as the
/// datagrams it carries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Datagrams the kernel took.
    pub sent: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Datagrams the kernel refused (unreachable, too large, ...).
    pub failed: u64,
    /// Datagrams not tried because the socket's buffer was full; they are
    /// the last ones queued, in order.
    pub unsent: u64,
    /// `sendmmsg` calls made.
    pub calls: u64,
    /// Messages sent that carried more than one datagram.
    pub gso_messages: u64,
    /// Trains the kernel refused, sent again one datagram per message.
    pub fallbacks: u64,
    /// A train was refused with `EIO`: the device cannot do GSO at all.
    pub gso_refused: bool,
}

impl Sent {
    /// Datagrams dealt with (taken or refused): everything before the
    /// first one left [`Sent::unsent`].
    pub fn consumed(&self) -> u64 {
        self.sent + self.failed
    }
}

/// Datagrams queued for one socket as GSO trains (see the module doc).
#[derive(Debug)]
pub struct Trains {
    spans: Vec<Span>,
    msgs: Vec<OutMsg>,
    /// Bytes in the last message.
    last_bytes: usize,
    /// Most datagrams per train.
    max_segments: usize,
    /// A refused train, one datagram per message.
    single_spans: Vec<Span>,
    single_msgs: Vec<OutMsg>,
}

impl Default for Trains {
    fn default() -> Self {
        Trains::new()
    }
}

/// Datagrams in message `m` of `spans`, and its bytes.
fn shape(spans: &[Span], m: &OutMsg) -> (u64, u64) {
    let bytes: usize = spans[m.first..m.first + m.count]
        .iter()
        .map(|s| s.len)
        .sum();
    let dgrams = match usize::from(m.segment) {
        0 => 1,
        seg => bytes.div_ceil(seg).max(1),
    };
    (dgrams as u64, bytes as u64)
}

/// What a failed send of one message means.
enum Refusal {
    /// The socket's buffer is full: stop.
    Full,
    /// The kernel will not take this train as one: send its datagrams
    /// singly (`true`: the device refuses GSO at all).
    Train(bool),
    /// This message is refused: skip it.
    Message,
}

fn refusal(e: &io::Error, is_train: bool) -> Refusal {
    match e.raw_os_error() {
        Some(libc::ENOBUFS) => Refusal::Full,
        _ if e.kind() == io::ErrorKind::WouldBlock => Refusal::Full,
        Some(code @ (libc::EMSGSIZE | libc::EINVAL | libc::EIO)) if is_train => {
            Refusal::Train(code == libc::EIO)
        }
        _ => Refusal::Message,
    }
}

impl Trains {
    /// Nothing queued; trains of up to [`MAX_SEGMENTS`] datagrams.
    pub fn new() -> Trains {
        Trains::with_max_segments(MAX_SEGMENTS)
    }

    /// Nothing queued; trains of up to `n` datagrams (1 to
    /// [`MAX_SEGMENTS`]; a load generator's fixed train length).
    pub fn with_max_segments(n: usize) -> Trains {
        Trains {
            spans: Vec::new(),
            msgs: Vec::new(),
            last_bytes: 0,
            max_segments: n.clamp(1, MAX_SEGMENTS),
            single_spans: Vec::new(),
            single_msgs: Vec::new(),
        }
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Forgets everything queued (keeping the room).
    pub fn clear(&mut self) {
        self.spans.clear();
        self.msgs.clear();
        self.last_bytes = 0;
    }

    /// The queued messages' byte ranges.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The queued messages (indices into [`Trains::spans`]).
    pub fn msgs(&self) -> &[OutMsg] {
        &self.msgs
    }

    /// Queues `len` bytes at `start` of the buffer that will be sent: a run
    /// of datagrams of `segment` bytes each (the last may be shorter;
    /// `segment == len` for one datagram; `len == 0` is one empty
    /// datagram), to `dst` (`None`: the connected peer). With `gso` off,
    /// or datagrams over [`max_segment`], each datagram is a message of
    /// its own.
    pub fn push(
        &mut self,
        dst: Option<SocketAddr>,
        start: usize,
        len: usize,
        segment: usize,
        gso: bool,
    ) {
        if len == 0 {
            self.new_msg(dst, start, 0, 0);
            return;
        }
        let seg = segment.clamp(1, len);
        let end = start + len;
        let mut at = start;
        if !gso || seg > max_segment(dst) {
            while at < end {
                let n = seg.min(end - at);
                self.new_msg(dst, at, n, 0);
                at += n;
            }
            return;
        }
        while at < end {
            let n = (end - at).min(self.max_run(seg));
            if !self.extend_last(dst, at, n, seg) {
                self.new_msg(dst, at, n, seg as u16);
            }
            at += n;
        }
    }

    /// Most bytes one train of `seg`-byte datagrams may carry.
    fn max_run(&self, seg: usize) -> usize {
        (self.max_segments * seg)
            .min(MAX_GSO_BYTES / seg * seg)
            .max(seg)
    }

    /// Appends a run of `seg`-byte datagrams to the last message if the
    /// rules allow: same destination, a train whose datagrams so far are
    /// all full, and the run made of datagrams of the train's size (or one
    /// shorter datagram, which then ends the train), within the limits.
    fn extend_last(
        &mut self,
        dst: Option<SocketAddr>,
        start: usize,
        len: usize,
        seg: usize,
    ) -> bool {
        let max_run = match self.msgs.last() {
            Some(last) if last.segment != 0 => self.max_run(usize::from(last.segment)),
            _ => return false,
        };
        let last = self.msgs.last_mut().expect("checked");
        let size = usize::from(last.segment);
        let same_size = seg == size;
        let one_shorter = len == seg && seg < size;
        if last.dst != dst
            || !(same_size || one_shorter)
            || !self.last_bytes.is_multiple_of(size)
            || self.last_bytes + len > max_run
        {
            return false;
        }
        let tail = self.spans.last_mut().expect("a message has spans");
        if tail.start + tail.len == start {
            tail.len += len;
        } else {
            self.spans.push(Span { start, len });
            last.count += 1;
        }
        self.last_bytes += len;
        true
    }

    fn new_msg(&mut self, dst: Option<SocketAddr>, start: usize, len: usize, segment: u16) {
        self.msgs.push(OutMsg {
            dst,
            first: self.spans.len(),
            count: 1,
            segment,
        });
        self.spans.push(Span { start, len });
        self.last_bytes = len;
    }

    /// Sends everything queued, from `buf`, through `fd` with `tx`'s
    /// scratch space, and empties the queue.
    pub fn flush(&mut self, fd: BorrowedFd<'_>, buf: &[u8], tx: &mut SendBatch) -> Sent {
        self.send(|spans, msgs| tx.send(fd, buf, spans, msgs))
    }

    /// Sends everything queued with `sys`, which is `sendmmsg` over the
    /// caller's socket and buffer (given spans and at most [`MAX_BATCH`]
    /// messages, it returns how many messages the kernel took, or the
    /// first one's error); empties the queue. Stops at a full socket
    /// buffer (`WouldBlock`, `ENOBUFS`).
    pub fn send(&mut self, mut sys: impl FnMut(&[Span], &[OutMsg]) -> io::Result<usize>) -> Sent {
        let mut out = Sent::default();
        let (spans, msgs) = (&self.spans, &self.msgs);
        let mut i = 0;
        while i < msgs.len() {
            let end = batch_end(msgs, i);
            out.calls += 1;
            let err = match sys(spans, &msgs[i..end]) {
                Ok(n) if n > 0 => {
                    let n = n.min(end - i);
                    for m in &msgs[i..i + n] {
                        let (d, b) = shape(spans, m);
                        out.sent += d;
                        out.bytes += b;
                        out.gso_messages += u64::from(d > 1);
                    }
                    i += n;
                    continue;
                }
                Ok(_) => io::Error::from(io::ErrorKind::WriteZero),
                Err(e) => e,
            };
            let (d, _) = shape(spans, &msgs[i]);
            let full = match refusal(&err, d > 1) {
                Refusal::Full => true,
                Refusal::Train(no_gso) => {
                    out.fallbacks += 1;
                    out.gso_refused |= no_gso;
                    let singles = (&mut self.single_spans, &mut self.single_msgs);
                    let full = send_singly(spans, &msgs[i], singles, &mut sys, &mut out);
                    i += 1;
                    full
                }
                Refusal::Message => {
                    out.failed += d;
                    i += 1;
                    false
                }
            };
            if full {
                out.unsent += msgs[i..].iter().map(|m| shape(spans, m).0).sum::<u64>();
                break;
            }
        }
        self.clear();
        out
    }
}

/// The end of the `sendmmsg` call that starts at message `i`: at most
/// [`MAX_BATCH`] messages and [`MAX_SPANS`] spans (and at least one).
fn batch_end(msgs: &[OutMsg], i: usize) -> usize {
    let (mut end, mut iovs) = (i, 0);
    while end < msgs.len() && end - i < MAX_BATCH && iovs + msgs[end].count <= MAX_SPANS {
        iovs += msgs[end].count;
        end += 1;
    }
    end.max(i + 1)
}

/// Sends train `m`'s datagrams one per message; `true` if the socket's
/// buffer filled first (the datagrams of `m` not tried are counted
/// unsent).
fn send_singly(
    spans: &[Span],
    m: &OutMsg,
    (single_spans, single_msgs): (&mut Vec<Span>, &mut Vec<OutMsg>),
    sys: &mut impl FnMut(&[Span], &[OutMsg]) -> io::Result<usize>,
    out: &mut Sent,
) -> bool {
    single_spans.clear();
    single_msgs.clear();
    let seg = usize::from(m.segment);
    for s in &spans[m.first..m.first + m.count] {
        let mut at = s.start;
        while at < s.start + s.len {
            let n = seg.min(s.start + s.len - at);
            single_msgs.push(OutMsg {
                dst: m.dst,
                first: single_spans.len(),
                count: 1,
                segment: 0,
            });
            single_spans.push(Span { start: at, len: n });
            at += n;
        }
    }
    let mut i = 0;
    while i < single_msgs.len() {
        let end = batch_end(single_msgs, i);
        out.calls += 1;
        match sys(single_spans, &single_msgs[i..end]) {
            Ok(n) if n > 0 => {
                for s in &single_msgs[i..i + n.min(end - i)] {
                    out.sent += 1;
                    out.bytes += single_spans[s.first].len as u64;
                }
                i += n.min(end - i);
            }
            Ok(_) => {
                out.failed += 1;
                i += 1;
            }
            Err(e) => {
                if let Refusal::Full = refusal(&e, false) {
                    out.unsent += (single_msgs.len() - i) as u64;
                    return true;
                }
                out.failed += 1;
                i += 1;
            }
        }
    }
    false
}

#[cfg(test)]
#[path = "train_tests.rs"]
mod tests;
