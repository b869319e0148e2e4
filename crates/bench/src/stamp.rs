//! The 32 bytes at the front of every test packet, and the pre-built
//! `sendPacket` frames that carry them.
//!
//! ```text
//! 0      4     5       8        12       16         24            32
//! | FbP1 | kind| zero  | flow   | zero   | seq      | sent (ns)   | filler…
//! ```
//!
//! Integers are little-endian; `sent` is nanoseconds on the run's
//! monotonic clock ([`crate::clock`]), so one-way latency is simply
//! `now - sent` within one process. The magic keeps stray packets (and
//! anything a server injects) out of the statistics, and no test packet can
//! be mistaken for a disco packet (those start with `TS💬`).

use ferry_proto::frame::{self, FrameType, HEADER_LEN as FRAME_HEADER, KEY_LEN};
use ferry_proto::key::NodePublic;

/// Marks a ferry-bench packet.
pub const MAGIC: [u8; 4] = *b"FbP1";
/// Bytes of the stamp; packets are at least this long.
pub const STAMP_LEN: usize = 32;

const KIND_AT: usize = 4;
const FLOW_AT: usize = 8;
const SEQ_AT: usize = 16;
const SENT_AT: usize = 24;

/// What a packet is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One-way load: the receiver counts it and its latency.
    Data = 0,
    /// A probe the receiver sends back as [`Kind::Pong`].
    Ping = 1,
    /// An echoed probe: the original sender measures the round trip.
    Pong = 2,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            0 => Some(Kind::Data),
            1 => Some(Kind::Ping),
            2 => Some(Kind::Pong),
            _ => None,
        }
    }
}

/// A decoded stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Purpose.
    pub kind: Kind,
    /// Flow the packet belongs to.
    pub flow: u32,
    /// Sequence number within the flow.
    pub seq: u64,
    /// Send time, nanoseconds on the run's clock.
    pub sent_ns: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads the stamp at the front of `packet`, or `None` if it is not one of
/// ours.
#[inline]
pub fn read(packet: &[u8]) -> Option<Stamp> {
    if packet.len() < STAMP_LEN || packet[..4] != MAGIC {
        return None;
    }
    Some(Stamp {
        kind: Kind::from_u8(packet[KIND_AT])?,
        flow: u32::from_le_bytes(packet[FLOW_AT..FLOW_AT + 4].try_into().expect("4 bytes")),
        seq: u64_at(packet, SEQ_AT),
        sent_ns: u64_at(packet, SENT_AT),
    })
}

/// Offset of the packet inside a `sendPacket` frame.
pub const PACKET_IN_FRAME: usize = FRAME_HEADER + KEY_LEN;

/// A complete `sendPacket` frame for one flow, copied into the send buffer
/// and then stamped by [`Template::append`]: building a packet costs one
/// `memcpy` and two stores, never an allocation.
#[derive(Debug, Clone)]
pub struct Template {
    frame: Vec<u8>,
}

impl Template {
    /// A frame to `dst` carrying a `size`-byte packet (at least
    /// [`STAMP_LEN`]) of `kind` for `flow`.
    pub fn new(dst: &NodePublic, kind: Kind, flow: u32, size: usize) -> Self {
        let size = size.max(STAMP_LEN);
        let mut packet = vec![0u8; size];
        packet[..4].copy_from_slice(&MAGIC);
        packet[KIND_AT] = kind as u8;
        packet[FLOW_AT..FLOW_AT + 4].copy_from_slice(&flow.to_le_bytes());
        // A non-zero filler, so nothing along the way can compress it away.
        for (i, b) in packet[STAMP_LEN..].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(7);
        }
        let mut frame = Vec::with_capacity(PACKET_IN_FRAME + size);
        frame::put_send_packet(&mut frame, dst, &packet);
        Template { frame }
    }

    /// Bytes of the whole frame.
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    /// Never empty; here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.frame.is_empty()
    }

    /// Appends the frame to `out` with sequence `seq` and send time `sent_ns`.
    #[inline]
    pub fn append(&self, out: &mut Vec<u8>, seq: u64, sent_ns: u64) {
        let at = out.len();
        out.extend_from_slice(&self.frame);
        let p = &mut out[at + PACKET_IN_FRAME..];
        p[SEQ_AT..SEQ_AT + 8].copy_from_slice(&seq.to_le_bytes());
        p[SENT_AT..SENT_AT + 8].copy_from_slice(&sent_ns.to_le_bytes());
    }
}

/// Appends a `sendPacket` frame that returns `packet` (a received ping) to
/// `src` as a pong.
#[inline]
pub fn append_echo(out: &mut Vec<u8>, src: &[u8], packet: &[u8]) {
    let header = frame::encode_header(FrameType::SendPacket as u8, (KEY_LEN + packet.len()) as u32);
    out.extend_from_slice(&header);
    out.extend_from_slice(src);
    let at = out.len();
    out.extend_from_slice(packet);
    out[at + KIND_AT] = Kind::Pong as u8;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::frame::{parse_client_frame, ClientFrame};

    #[test]
    fn template_round_trip() {
        let dst = NodePublic::from_bytes([9; 32]);
        let t = Template::new(&dst, Kind::Ping, 77, 1400);
        assert_eq!(t.len(), 5 + 32 + 1400);
        let mut out = Vec::new();
        t.append(&mut out, 5, 123_456_789);
        t.append(&mut out, 6, 987_654_321);
        assert_eq!(out.len(), 2 * t.len());
        let (ty, len) = frame::decode_header(&out).unwrap();
        let payload = &out[5..5 + len as usize];
        let ClientFrame::SendPacket { dst: d, packet } = parse_client_frame(ty, payload).unwrap()
        else {
            panic!("not a sendPacket");
        };
        assert_eq!(d, dst);
        assert_eq!(
            read(packet),
            Some(Stamp {
                kind: Kind::Ping,
                flow: 77,
                seq: 5,
                sent_ns: 123_456_789
            })
        );
        assert!(!frame::is_disco(packet));
        let second = &out[t.len() + PACKET_IN_FRAME..];
        assert_eq!(read(second).unwrap().seq, 6);
    }

    #[test]
    fn echo_turns_a_ping_into_a_pong() {
        let t = Template::new(&NodePublic::from_bytes([1; 32]), Kind::Ping, 3, 64);
        let mut sent = Vec::new();
        t.append(&mut sent, 1, 2);
        let packet = &sent[PACKET_IN_FRAME..];
        let mut out = Vec::new();
        append_echo(&mut out, &[4; 32], packet);
        let (ty, len) = frame::decode_header(&out).unwrap();
        let ClientFrame::SendPacket { dst, packet: back } =
            parse_client_frame(ty, &out[5..5 + len as usize]).unwrap()
        else {
            panic!("not a sendPacket");
        };
        assert_eq!(dst, NodePublic::from_bytes([4; 32]));
        let s = read(back).unwrap();
        assert_eq!((s.kind, s.flow, s.seq, s.sent_ns), (Kind::Pong, 3, 1, 2));
    }

    #[test]
    fn rejects_foreign_packets() {
        assert_eq!(read(b"short"), None);
        assert_eq!(read(&[0u8; 64]), None);
        let mut p = [0u8; 32];
        p[..4].copy_from_slice(&MAGIC);
        p[KIND_AT] = 9;
        assert_eq!(read(&p), None);
    }
}
