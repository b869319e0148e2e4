//! Datagrams waiting to leave through one socket, batched for `sendmmsg`
//! and coalesced for GSO.
//!
//! A shard receives a batch into one buffer, decides where each datagram
//! goes and queues it here as a span *of that same buffer*: nothing is
//! copied in user space. When the batch is done, [`Outbox::flush`] hands
//! everything to the kernel in as few `sendmmsg` calls as the limits allow.
//!
//! Coalescing: with GSO, consecutive datagrams to the same destination
//! travel in one message as long as they share one size (only the last may
//! be shorter), up to 64 segments and 64 KiB. A GRO slot (a run of
//! equal-size datagrams from one flow) therefore usually leaves as one
//! message, and so do consecutive single datagrams from one sender, which
//! is what a bulk WireGuard transfer looks like. Without GSO every datagram
//! is its own message.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use ferry_sys::gso::{MAX_GSO_BYTES, MAX_SEGMENTS};
use ferry_sys::mmsg::{OutMsg, SendBatch, Span, MAX_BATCH, MAX_SPANS};

/// What one [`Outbox::flush`] achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Datagrams the kernel accepted.
    pub sent: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Datagrams dropped because the send buffer was full.
    pub buffer_full: u64,
    /// Datagrams the kernel refused (unreachable, too big, ...).
    pub failed: u64,
    /// `sendmmsg` calls made.
    pub calls: u64,
    /// Messages that carried more than one datagram.
    pub gso_messages: u64,
    /// The device refused GSO: the caller should stop using it.
    pub gso_refused: bool,
}

/// Datagrams queued for one socket.
#[derive(Debug, Default)]
pub struct Outbox {
    spans: Vec<Span>,
    msgs: Vec<OutMsg>,
    /// Bytes in the last message.
    last_bytes: usize,
    /// Messages split by a failed GSO send, resent one datagram each.
    retry_spans: Vec<Span>,
    retry_msgs: Vec<OutMsg>,
}

/// Most bytes one GSO message may carry at this segment size.
fn max_run(seg: usize) -> usize {
    (MAX_SEGMENTS * seg).min(MAX_GSO_BYTES / seg * seg).max(seg)
}

fn segments(bytes: usize, seg: usize) -> usize {
    bytes.div_ceil(seg.max(1))
}

impl Outbox {
    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Queues `len` bytes at `start` of the buffer that will be given to
    /// [`Outbox::flush`]: a run of datagrams of `seg` bytes each (the last
    /// may be shorter; `seg == len` for a single datagram), to `dst` (or
    /// the connected peer).
    pub fn push(
        &mut self,
        dst: Option<SocketAddr>,
        start: usize,
        len: usize,
        seg: usize,
        gso: bool,
    ) {
        if len == 0 {
            return;
        }
        let seg = seg.clamp(1, len);
        if !gso || seg > usize::from(u16::MAX) {
            let mut at = start;
            let end = start + len;
            while at < end {
                let n = seg.min(end - at);
                self.new_msg(dst, at, n, 0);
                at += n;
            }
            return;
        }
        let mut at = start;
        let end = start + len;
        while at < end {
            let n = (end - at).min(max_run(seg));
            if !self.extend_last(dst, at, n, seg) {
                self.new_msg(dst, at, n, seg as u16);
            }
            at += n;
        }
    }

    /// Appends a run to the last message if GSO rules allow: same
    /// destination, every datagram so far full-size, and the run made of
    /// datagrams of the message's size (or one shorter datagram, which
    /// then ends the message).
    fn extend_last(
        &mut self,
        dst: Option<SocketAddr>,
        start: usize,
        len: usize,
        seg: usize,
    ) -> bool {
        let Some(last) = self.msgs.last_mut() else {
            return false;
        };
        let size = usize::from(last.segment);
        if last.dst != dst || size == 0 {
            return false;
        }
        let shape_ok = seg == size || (len == seg && len <= size);
        if !shape_ok
            || !self.last_bytes.is_multiple_of(size)
            || self.last_bytes + len > max_run(size)
            || last.count >= MAX_SEGMENTS
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

    /// Sends everything queued from `buf` through `fd` and empties the
    /// outbox. Datagrams that cannot be sent now are dropped (UDP has no
    /// backpressure to give): the result counts them.
    pub fn flush(&mut self, fd: BorrowedFd<'_>, buf: &[u8], tx: &mut SendBatch) -> Flushed {
        let mut out = Flushed::default();
        let mut split = Split {
            spans: &mut self.retry_spans,
            msgs: &mut self.retry_msgs,
        };
        send_all(
            fd,
            buf,
            &self.spans,
            &self.msgs,
            tx,
            &mut out,
            Some(&mut split),
        );
        self.spans.clear();
        self.msgs.clear();
        self.last_bytes = 0;
        out
    }
}

/// Scratch space for resending a refused GSO message datagram by datagram.
struct Split<'a> {
    spans: &'a mut Vec<Span>,
    msgs: &'a mut Vec<OutMsg>,
}

fn msg_stats(spans: &[Span], m: &OutMsg) -> (u64, u64) {
    let bytes: usize = spans[m.first..m.first + m.count]
        .iter()
        .map(|s| s.len)
        .sum();
    let dgrams = if m.segment == 0 {
        1
    } else {
        segments(bytes, usize::from(m.segment))
    };
    (dgrams as u64, bytes as u64)
}

fn send_all(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    spans: &[Span],
    msgs: &[OutMsg],
    tx: &mut SendBatch,
    out: &mut Flushed,
    mut split: Option<&mut Split<'_>>,
) {
    let mut i = 0;
    while i < msgs.len() {
        // As many messages as one call takes, within the iovec limit.
        let mut end = i;
        let mut iovs = 0;
        while end < msgs.len() && end - i < MAX_BATCH && iovs + msgs[end].count <= MAX_SPANS {
            iovs += msgs[end].count;
            end += 1;
        }
        out.calls += 1;
        let err = match tx.send(fd, buf, spans, &msgs[i..end]) {
            Ok(n) if n > 0 => {
                for m in &msgs[i..i + n] {
                    let (d, b) = msg_stats(spans, m);
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
        let m = msgs[i];
        let (d, _) = msg_stats(spans, &m);
        match err.raw_os_error() {
            Some(libc::EAGAIN | libc::ENOBUFS) => {
                // Everything left would meet the same full buffer.
                out.buffer_full += msgs[i..].iter().map(|m| msg_stats(spans, m).0).sum::<u64>();
                return;
            }
            Some(code @ (libc::EIO | libc::EINVAL)) if d > 1 && split.is_some() => {
                // The device (or this size) refuses GSO: send this
                // message's datagrams one by one instead.
                out.gso_refused |= code == libc::EIO;
                let sp = split.as_mut().expect("checked");
                sp.spans.clear();
                sp.msgs.clear();
                let seg = usize::from(m.segment);
                for s in &spans[m.first..m.first + m.count] {
                    let mut at = s.start;
                    while at < s.start + s.len {
                        let n = seg.min(s.start + s.len - at);
                        sp.msgs.push(OutMsg {
                            dst: m.dst,
                            first: sp.spans.len(),
                            count: 1,
                            segment: 0,
                        });
                        sp.spans.push(Span { start: at, len: n });
                        at += n;
                    }
                }
                send_all(fd, buf, &sp.spans[..], &sp.msgs[..], tx, out, None);
            }
            _ => out.failed += d,
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst() -> Option<SocketAddr> {
        Some("192.0.2.1:1".parse().unwrap())
    }

    #[test]
    fn equal_datagrams_to_one_destination_share_a_message() {
        let mut o = Outbox::default();
        for i in 0..10 {
            o.push(dst(), i * 2000, 1452, 1452, true);
        }
        o.push(dst(), 20_000, 100, 100, true); // shorter: ends the run
        o.push(dst(), 30_000, 1452, 1452, true); // after a short one: new message
        assert_eq!(o.msgs.len(), 2);
        assert_eq!(o.msgs[0].segment, 1452);
        assert_eq!(o.msgs[0].count, 11);
        assert_eq!(msg_stats(&o.spans, &o.msgs[0]), (11, 10 * 1452 + 100));
        assert_eq!(o.msgs[1].first, 11);
    }

    #[test]
    fn contiguous_runs_merge_into_one_span() {
        let mut o = Outbox::default();
        // A GRO slot of 5 × 1000 + 300, then its neighbour slot's segments.
        o.push(dst(), 0, 5300, 1000, true);
        assert_eq!(o.msgs.len(), 1);
        assert_eq!(
            o.spans,
            vec![Span {
                start: 0,
                len: 5300
            }]
        );
        // Split one by one (as the hub does), contiguous: still one span.
        let mut o = Outbox::default();
        for k in 0..5 {
            o.push(dst(), k * 1000, 1000, 1000, true);
        }
        assert_eq!(
            o.spans,
            vec![Span {
                start: 0,
                len: 5000
            }]
        );
        assert_eq!(msg_stats(&o.spans, &o.msgs[0]), (5, 5000));
    }

    #[test]
    fn limits_split_messages() {
        let mut o = Outbox::default();
        // 100 segments of 100 bytes: more than 64 segments.
        o.push(dst(), 0, 10_000, 100, true);
        assert_eq!(o.msgs.len(), 2);
        assert_eq!(msg_stats(&o.spans, &o.msgs[0]), (64, 6400));
        // 1452-byte segments: at most 45 fit in 65 KB.
        let mut o = Outbox::default();
        for i in 0..60 {
            o.push(dst(), i * 1452, 1452, 1452, true);
        }
        let (d0, b0) = msg_stats(&o.spans, &o.msgs[0]);
        assert!(b0 as usize <= MAX_GSO_BYTES && d0 == 45, "{d0} {b0}");
        // Another destination never joins.
        let mut o = Outbox::default();
        o.push(dst(), 0, 1000, 1000, true);
        o.push(Some("192.0.2.2:1".parse().unwrap()), 1000, 1000, 1000, true);
        assert_eq!(o.msgs.len(), 2);
    }

    #[test]
    fn without_gso_every_datagram_is_a_message() {
        let mut o = Outbox::default();
        o.push(dst(), 0, 2500, 1000, false);
        assert_eq!(o.msgs.len(), 3);
        assert!(o.msgs.iter().all(|m| m.segment == 0 && m.count == 1));
        assert_eq!(
            o.spans[2],
            Span {
                start: 2000,
                len: 500
            }
        );
    }

    #[test]
    fn flush_sends_and_counts() {
        use std::net::UdpSocket;
        use std::os::fd::AsFd;
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = Some(rx.local_addr().unwrap());
        let buf = vec![7u8; 10_000];
        let mut o = Outbox::default();
        let gso = ferry_sys::gso::probe(tx_sock.as_fd()).gso;
        for i in 0..5 {
            o.push(to, i * 1000, 1000, 1000, gso);
        }
        let mut tx = SendBatch::new();
        let f = o.flush(tx_sock.as_fd(), &buf, &mut tx);
        assert_eq!((f.sent, f.bytes, f.failed), (5, 5000, 0));
        assert!(o.is_empty());
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let mut got = 0;
        let mut b = [0u8; 2000];
        while got < 5 {
            assert_eq!(rx.recv(&mut b).unwrap(), 1000);
            got += 1;
        }
    }
}
