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
//! may be shorter), each within one frame, leave as one UDP GSO message
//! where the kernel has GSO ([`ferry_sys::train`] has the rules). It never
//! waits: what the socket does not take now is reported unsent.

use super::paths::PathAddr;
use ferry_proto::key::NodePublic;
use ferry_proto::udp_header::{self, Header, Protocol};
use ferry_sys::mmsg::SendBatch;
use ferry_sys::train::Trains;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsFd;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// One datagram from a peer, as [`super::Endpoint::recv`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Datagram {
    /// The peer that sent it.
    pub peer: NodePublic,
    /// The path it came on.
    pub path: PathAddr,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// One datagram's place in [`Datagrams`].
#[derive(Debug, Clone, Copy)]
struct Item {
    peer: NodePublic,
    /// The path it came on (received batches only).
    path: Option<PathAddr>,
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
    /// `send_batch`'s scratch: the datagrams bound for the UDP socket,
    /// and the index and path of each…
    pub(super) udp: Vec<(SocketAddr, Range<usize>)>,
    pub(super) udp_index: Vec<(usize, PathAddr)>,
    /// … and the indices of those bound for DERP.
    pub(super) derp: Vec<usize>,
}

impl Datagrams {
    /// An empty batch.
    pub fn new() -> Datagrams {
        Datagrams::default()
    }

    /// Appends `data` for `peer` (to send it).
    pub fn push(&mut self, peer: &NodePublic, data: &[u8]) {
        self.push_from(peer, None, data);
    }

    /// Appends `data` from `peer`, received on `path`.
    pub(super) fn push_from(&mut self, peer: &NodePublic, path: Option<PathAddr>, data: &[u8]) {
        self.buf.extend_from_slice(&[0; udp_header::LEN]);
        let start = self.buf.len();
        self.buf.extend_from_slice(data);
        self.items.push(Item {
            peer: *peer,
            path,
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

    /// The path datagram `i` came on (`None` for one pushed to send).
    pub fn path(&self, i: usize) -> Option<PathAddr> {
        self.items.get(i)?.path
    }

    /// Datagram `i` as [`super::Endpoint::recv`] returns it (copied out),
    /// for a received batch.
    pub fn datagram(&self, i: usize) -> Option<Datagram> {
        let it = self.items.get(i)?;
        Some(Datagram {
            peer: it.peer,
            path: it.path?,
            data: self.buf[it.start..it.start + it.len].to_vec(),
        })
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
        for (i, (peer, data)) in other.iter().enumerate().skip(from) {
            self.push_from(peer, other.path(i), data);
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
    /// GSO trains the kernel refused (a path MTU under 1,500, a device
    /// without checksum offload), sent again one datagram at a time.
    pub fallbacks: usize,
}

/// Sends runs of datagrams from one UDP socket with `sendmmsg`, as UDP GSO
/// trains where the kernel has GSO (by the rules of
/// [`ferry_sys::train`]); keeps its scratch space between calls.
pub struct UdpBatchSender {
    sys: SendBatch,
    trains: Trains,
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
            trains: Trains::new(),
            gso,
        }
    }

    /// Whether it sends GSO trains (it stops when the device refuses one
    /// with `EIO`).
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Sends `items` (destination, range of `buf`) in order without
    /// waiting, until the socket would block. Says how many the kernel
    /// took and how many were dealt with (taken, or refused with an
    /// error); the rest, from `consumed` on, waits for the socket to be
    /// writable or is dropped, as the caller likes. A train the kernel
    /// refuses is sent again datagram by datagram.
    pub fn send(
        &mut self,
        socket: &UdpSocket,
        buf: &[u8],
        items: &[(SocketAddr, Range<usize>)],
    ) -> BatchSent {
        self.trains.clear();
        for (dst, r) in items {
            self.trains
                .push(Some(*dst), r.start, r.len(), r.len(), self.gso);
        }
        let sys = &mut self.sys;
        let out = self.trains.send(|spans, msgs| {
            socket.try_io(Interest::WRITABLE, || {
                sys.send(socket.as_fd(), buf, spans, msgs)
            })
        });
        if out.gso_refused && self.gso {
            tracing::debug!("the device refused a UDP GSO train; sending datagrams one by one");
            self.gso = false;
        }
        if out.failed > 0 {
            tracing::trace!(failed = out.failed, "UDP sends refused");
        }
        BatchSent {
            sent: out.sent as usize,
            consumed: out.consumed() as usize,
            fallbacks: out.fallbacks as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::key::NodePrivate;

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
}
