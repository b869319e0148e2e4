//! Datagrams by the batch: [`Datagrams`], the caller-owned buffer that
//! [`super::Endpoint::recv_batch`] fills and [`super::Endpoint::send_batch`]
//! sends, and [`UdpBatchSender`], which hands a run of datagrams to the
//! kernel in few system calls.
//!
//! A [`Datagrams`] keeps every datagram in one growing byte buffer, each
//! preceded by room for the 8-byte peer-message header, so a batch is
//! sealed in place and sent without copying it again; reused, it
//! allocates nothing per datagram once it has grown to a batch's size.
//!
//! [`UdpBatchSender`] cuts a list of (destination, bytes) into `sendmmsg`
//! calls of up to [`ferry_sys::mmsg::MAX_BATCH`] messages; consecutive
//! datagrams to one destination whose sizes are equal (the last of a run
//! may be shorter) leave as one UDP GSO message where the kernel has GSO.
//! It never waits: what the socket does not take now is reported unsent.

use ferry_proto::key::NodePublic;
use ferry_proto::udp_header::{self, Header, Protocol};
use ferry_sys::gso::{MAX_GSO_BYTES, MAX_SEGMENTS};
use ferry_sys::mmsg::{OutMsg, SendBatch, Span, MAX_BATCH, MAX_SPANS};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsFd;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Largest datagram that goes into a GSO train: what fits one Ethernet
/// frame over IPv6 (1500 − 40 − 8). A segment beyond the path MTU fails
/// the whole GSO message, where a single datagram would be fragmented.
const MAX_TRAIN_SEGMENT: usize = 1452;

/// One datagram's place in [`Datagrams`].
#[derive(Debug, Clone, Copy)]
struct Item {
    peer: NodePublic,
    /// Offset of the payload; the header's room is the 8 bytes before it.
    start: usize,
    len: usize,
}

/// Datagrams and their peers in one reusable buffer: what
/// [`super::Endpoint::recv_batch`] fills and
/// [`super::Endpoint::send_batch`] sends. Cleared and refilled, it keeps
/// its capacity, so a steady flow allocates nothing per datagram.
#[derive(Debug, Default)]
pub struct Datagrams {
    buf: Vec<u8>,
    items: Vec<Item>,
    /// `send_batch`'s scratch: the datagrams bound for the UDP socket…
    pub(super) udp: Vec<(SocketAddr, Range<usize>)>,
    /// … and the indices of those bound for DERP.
    pub(super) derp: Vec<usize>,
}

impl Datagrams {
    /// An empty batch.
    pub fn new() -> Datagrams {
        Datagrams::default()
    }

    /// Appends `data` for (or from) `peer`.
    pub fn push(&mut self, peer: &NodePublic, data: &[u8]) {
        self.buf.extend_from_slice(&[0; udp_header::LEN]);
        let start = self.buf.len();
        self.buf.extend_from_slice(data);
        self.items.push(Item {
            peer: *peer,
            start,
            len: data.len(),
        });
    }

    /// How many datagrams it holds.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Empties it, keeping its capacity.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.items.clear();
    }

    /// Datagram `i` and its peer.
    pub fn get(&self, i: usize) -> Option<(&NodePublic, &[u8])> {
        let it = self.items.get(i)?;
        Some((&it.peer, &self.buf[it.start..it.start + it.len]))
    }

    /// The datagrams in order, with their peers.
    pub fn iter(&self) -> impl Iterator<Item = (&NodePublic, &[u8])> + '_ {
        self.items
            .iter()
            .map(|it| (&it.peer, &self.buf[it.start..it.start + it.len]))
    }

    /// The datagrams as ranges of [`Datagrams::bytes`], with their peers
    /// (to hand them on with [`UdpBatchSender`] without copying).
    pub fn ranges(&self) -> impl Iterator<Item = (&NodePublic, Range<usize>)> + '_ {
        self.items
            .iter()
            .map(|it| (&it.peer, it.start..it.start + it.len))
    }

    /// The buffer [`Datagrams::ranges`] points into.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Moves datagrams `from..` of `other` to the end of this batch.
    pub(super) fn append_from(&mut self, other: &Datagrams, from: usize) {
        for (peer, data) in other.iter().skip(from) {
            self.push(peer, data);
        }
    }

    /// Writes datagram `i`'s data header (session `vni`) into its room
    /// and returns the whole peer message's range.
    pub(super) fn seal(&mut self, i: usize, vni: u32) -> Range<usize> {
        let it = self.items[i];
        let head = it.start - udp_header::LEN;
        self.buf[head..it.start].copy_from_slice(&Header::data(Protocol::Payload, vni).to_bytes());
        head..it.start + it.len
    }

    /// Datagram `i`'s peer and payload length.
    pub(super) fn item(&self, i: usize) -> (NodePublic, usize) {
        (self.items[i].peer, self.items[i].len)
    }
}

/// The datagrams of one received slot: `bytes` cut every `segment` bytes
/// when the kernel glued a GRO train together (the last may be shorter),
/// else `bytes` whole; an empty datagram is one empty slice.
pub fn gro_segments(bytes: &[u8], segment: usize) -> impl Iterator<Item = &[u8]> {
    let seg = if segment == 0 {
        bytes.len().max(1)
    } else {
        segment
    };
    let empty = bytes.is_empty().then_some(bytes);
    bytes.chunks(seg).chain(empty)
}

/// What one [`UdpBatchSender::send`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSent {
    /// Datagrams the kernel took.
    pub sent: usize,
    /// Datagrams taken or refused: the first `consumed` items.
    pub consumed: usize,
}

/// Sends runs of datagrams from one UDP socket with `sendmmsg`, as UDP GSO
/// trains where the kernel has GSO; keeps its scratch space between calls.
pub struct UdpBatchSender {
    sys: SendBatch,
    spans: Vec<Span>,
    msgs: Vec<OutMsg>,
    /// Datagrams in each message of `msgs`.
    counts: Vec<usize>,
    gso: bool,
}

impl std::fmt::Debug for UdpBatchSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpBatchSender")
            .field("gso", &self.gso)
            .finish_non_exhaustive()
    }
}

impl UdpBatchSender {
    /// A sender for `socket`, with GSO when the kernel offers it there.
    pub fn new(socket: &UdpSocket) -> UdpBatchSender {
        UdpBatchSender::with_gso(ferry_sys::gso::probe(socket.as_fd()).gso)
    }

    /// A sender that makes GSO trains only if `gso` (tests; a kernel
    /// without GSO).
    pub fn with_gso(gso: bool) -> UdpBatchSender {
        UdpBatchSender {
            sys: SendBatch::new(),
            spans: Vec::with_capacity(MAX_SPANS),
            msgs: Vec::with_capacity(MAX_BATCH),
            counts: Vec::with_capacity(MAX_BATCH),
            gso,
        }
    }

    /// Whether it sends GSO trains (it stops when the kernel refuses one).
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Sends `items` (destination, range of `buf`) in order without
    /// waiting, until the socket would block. Says how many the kernel
    /// took and how many were dealt with (taken, or refused with an
    /// error); the rest, from `consumed` on, waits for the socket to be
    /// writable or is dropped, as the caller likes.
    pub fn send(
        &mut self,
        socket: &UdpSocket,
        buf: &[u8],
        items: &[(SocketAddr, Range<usize>)],
    ) -> BatchSent {
        let mut sent = 0;
        let mut next = 0;
        // Each turn sends at least one message, skips one the kernel
        // refused, turns GSO off (once), or stops.
        while next < items.len() {
            self.plan(&items[next..]);
            let r = socket.try_io(Interest::WRITABLE, || {
                self.sys.send(socket.as_fd(), buf, &self.spans, &self.msgs)
            });
            match r {
                Ok(0) => break,
                Ok(taken) => {
                    let n: usize = self.counts[..taken].iter().sum();
                    sent += n;
                    next += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if self.msgs[0].segment != 0 => {
                    // EIO (no checksum offload on the way), EINVAL (a
                    // segment beyond the path MTU): single datagrams then.
                    tracing::debug!(error = %e, "UDP GSO refused; sending datagrams one by one");
                    self.gso = false;
                }
                Err(e) => {
                    tracing::trace!(error = %e, "UDP send failed");
                    next += self.counts[0];
                }
            }
        }
        BatchSent {
            sent,
            consumed: next,
        }
    }

    /// Fills `spans`, `msgs` and `counts` with the first messages of
    /// `items` (at least one).
    fn plan(&mut self, items: &[(SocketAddr, Range<usize>)]) {
        self.spans.clear();
        self.msgs.clear();
        self.counts.clear();
        let mut i = 0;
        while i < items.len() && self.msgs.len() < MAX_BATCH && self.spans.len() < MAX_SPANS {
            let (dst, first) = &items[i];
            let seg = first.len();
            let first_span = self.spans.len();
            self.spans.push(span(first));
            let mut total = seg;
            let mut j = i + 1;
            if self.gso && seg <= MAX_TRAIN_SEGMENT {
                while let Some((d, r)) = items.get(j) {
                    let fits = d == dst
                        && r.len() <= seg
                        && !r.is_empty()
                        && j - i < MAX_SEGMENTS
                        && total + r.len() <= MAX_GSO_BYTES
                        && self.spans.len() < MAX_SPANS;
                    if !fits {
                        break;
                    }
                    self.spans.push(span(r));
                    total += r.len();
                    j += 1;
                    // A shorter datagram ends a train.
                    if r.len() < seg {
                        break;
                    }
                }
            }
            let count = j - i;
            self.msgs.push(OutMsg {
                dst: Some(*dst),
                first: first_span,
                count,
                segment: if count > 1 { seg as u16 } else { 0 },
            });
            self.counts.push(count);
            i = j;
        }
    }
}

fn span(r: &Range<usize>) -> Span {
    Span {
        start: r.start,
        len: r.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::key::NodePrivate;

    fn dst(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn datagrams_keep_order_peers_and_header_room() {
        let (a, b) = (
            NodePrivate::generate().public(),
            NodePrivate::generate().public(),
        );
        let mut d = Datagrams::new();
        d.push(&a, b"one");
        d.push(&b, b"");
        d.push(&a, b"three");
        assert_eq!(d.len(), 3);
        let got: Vec<_> = d.iter().map(|(p, x)| (*p, x.to_vec())).collect();
        assert_eq!(
            got,
            vec![(a, b"one".to_vec()), (b, vec![]), (a, b"three".to_vec())]
        );
        let r = d.seal(2, 7);
        let msg = &d.bytes()[r];
        let (h, _) = ferry_proto::peer_msg::parse(msg).unwrap();
        assert_eq!((h.vni, &msg[udp_header::LEN..]), (7, &b"three"[..]));
        let mut e = Datagrams::new();
        e.append_from(&d, 1);
        assert_eq!(e.get(1), Some((&a, &b"three"[..])));
        d.clear();
        assert!(d.is_empty() && d.get(0).is_none());
    }

    #[test]
    fn gro_slots_are_cut_at_the_segment_size() {
        let train: Vec<u8> = (0..250u8).collect();
        let cut: Vec<&[u8]> = gro_segments(&train, 100).collect();
        assert_eq!(cut, vec![&train[..100], &train[100..200], &train[200..]]);
        assert_eq!(gro_segments(&train, 250).count(), 1);
        assert_eq!(gro_segments(&train, 0).count(), 1);
        assert_eq!(gro_segments(&[], 0).collect::<Vec<_>>(), vec![&[] as &[u8]]);
        assert_eq!(gro_segments(&[], 1200).count(), 1);
    }

    #[test]
    fn plan_makes_trains_of_equal_sizes_per_destination() {
        let mut s = UdpBatchSender::with_gso(true);
        // 3 × 100 to A then 40 to A: one train; 100 to B; 100, 120 to A:
        // two messages (a longer one cannot follow).
        let sizes = [
            (1, 100),
            (1, 100),
            (1, 100),
            (1, 40),
            (2, 100),
            (1, 100),
            (1, 120),
        ];
        let mut at = 0;
        let items: Vec<_> = sizes
            .iter()
            .map(|&(p, n)| {
                at += n;
                (dst(p), at - n..at)
            })
            .collect();
        s.plan(&items);
        let shape: Vec<_> = s.msgs.iter().map(|m| (m.dst, m.count, m.segment)).collect();
        assert_eq!(
            shape,
            vec![
                (Some(dst(1)), 4, 100),
                (Some(dst(2)), 1, 0),
                (Some(dst(1)), 1, 0),
                (Some(dst(1)), 1, 0)
            ]
        );
        assert_eq!(s.counts, vec![4, 1, 1, 1]);
        // Without GSO: one message per datagram.
        let mut s = UdpBatchSender::with_gso(false);
        s.plan(&items);
        assert_eq!(s.msgs.len(), items.len());
        assert!(s.msgs.iter().all(|m| m.count == 1 && m.segment == 0));
    }

    #[test]
    fn plan_bounds_trains_and_batches() {
        let mut s = UdpBatchSender::with_gso(true);
        let items: Vec<_> = (0..200)
            .map(|i| (dst(1), i * 1000..(i + 1) * 1000))
            .collect();
        s.plan(&items);
        // 64 KiB of payload at most per train.
        assert!(s.counts.iter().all(|&c| c * 1000 <= MAX_GSO_BYTES));
        assert_eq!(s.counts.iter().sum::<usize>(), 200);
        let big: Vec<_> = (0..200)
            .map(|i| (dst(1), i * 2000..(i + 1) * 2000))
            .collect();
        s.plan(&big);
        // Beyond an Ethernet frame: no trains, at most a batch.
        assert_eq!(s.msgs.len(), MAX_BATCH);
        assert!(s.counts.iter().all(|&c| c == 1));
    }
}
