//! Packets in the byte rings between shards: a [`RingHeader`] (how the
//! packet came in, its keys, the sending connection) and the packet, read
//! back in place as a [`RingPacket`].

use ferry_proto::key::NodePublic;

/// How a packet came into the DERP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    /// A client's sendPacket: it may be forwarded to a mesh peer, and its
    /// sender may be paused.
    Send = 0,
    /// A mesh peer's forwardPacket: delivered here or dropped, never
    /// forwarded again, and its link never paused.
    Forward = 1,
}

/// What goes in front of a packet in a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RingHeader {
    /// How the packet came in.
    pub(super) via: Via,
    /// Its sender's key.
    pub(super) src: NodePublic,
    /// Its destination's key.
    pub(super) dst: NodePublic,
    /// The sending connection's slot on the shard whose ring this is.
    pub(super) slot: u32,
    /// That connection's generation.
    pub(super) gen: u32,
}

impl RingHeader {
    /// Encoded length.
    pub(super) const LEN: usize = 1 + 32 + 32 + 4 + 4;

    /// The header's bytes.
    #[inline]
    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0] = self.via as u8;
        out[1..33].copy_from_slice(self.src.as_bytes());
        out[33..65].copy_from_slice(self.dst.as_bytes());
        out[65..69].copy_from_slice(&self.slot.to_le_bytes());
        out[69..73].copy_from_slice(&self.gen.to_le_bytes());
        out
    }
}

/// A packet read from a ring, borrowing the ring's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct RingPacket<'a> {
    /// Its header.
    pub(super) header: RingHeader,
    /// The packet.
    pub(super) packet: &'a [u8],
}

impl<'a> RingPacket<'a> {
    /// Reads a header and the packet after it (`None`: too short, or an
    /// unknown `via`).
    #[inline]
    pub(super) fn parse(r: &'a [u8]) -> Option<RingPacket<'a>> {
        if r.len() < RingHeader::LEN {
            return None;
        }
        let via = match r[0] {
            0 => Via::Send,
            1 => Via::Forward,
            _ => return None,
        };
        let key = |b: &[u8]| b.try_into().ok().map(NodePublic::from_bytes);
        Some(RingPacket {
            header: RingHeader {
                via,
                src: key(&r[1..33])?,
                dst: key(&r[33..65])?,
                slot: u32::from_le_bytes(r[65..69].try_into().ok()?),
                gen: u32::from_le_bytes(r[69..73].try_into().ok()?),
            },
            packet: &r[RingHeader::LEN..],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_packets_round_trip() {
        let header = RingHeader {
            via: Via::Forward,
            src: NodePublic::from_bytes([1; 32]),
            dst: NodePublic::from_bytes([2; 32]),
            slot: 7,
            gen: 9,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(b"pkt");
        assert_eq!(
            RingPacket::parse(&bytes),
            Some(RingPacket {
                header,
                packet: b"pkt"
            })
        );
        assert!(RingPacket::parse(&bytes[..10]).is_none());
        bytes[0] = 2;
        assert!(RingPacket::parse(&bytes).is_none(), "unknown via");
    }
}
