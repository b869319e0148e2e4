//! The 8-byte header in front of every datagram of Ferry's relay sessions
//! and of direct UDP between SDK peers (`docs/relay-sessions.md`, §3).
//!
//! ```text
//! byte 0    00                      version 0, no options
//! byte 1    80 = control, 00 = data
//! byte 2-3  7a11 = control/probe, 7a12 = payload
//! byte 4-6  VNI (session id; 0 = direct between peers)
//! byte 7    00
//! ```
//!
//! The layout is Geneve's (RFC 8926) without options, as Tailscale's peer
//! relays use it, so one look at the first bytes tells a datagram on a
//! shared socket from STUN (whose byte 0 is never 0 with byte 1 `0x01`) and
//! from WireGuard (whose byte 0 is a message type 1–4).

/// Length of the header.
pub const LEN: usize = 8;
/// The largest session id (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// What follows the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Bind messages (to and from a relay) and peer probes.
    Control,
    /// Application bytes (WireGuard, for `ferry link`).
    Payload,
}

impl Protocol {
    const CONTROL: u16 = 0x7a11;
    const PAYLOAD: u16 = 0x7a12;

    fn wire(self) -> u16 {
        match self {
            Protocol::Control => Self::CONTROL,
            Protocol::Payload => Self::PAYLOAD,
        }
    }
}

/// A parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The control bit: set on bind messages between a client and a relay,
    /// clear on everything a relay forwards.
    pub control: bool,
    /// What follows.
    pub protocol: Protocol,
    /// Session id; 0 between peers directly.
    pub vni: u32,
}

/// Why bytes are not a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than [`LEN`] bytes.
    #[error("datagram shorter than the 8-byte header")]
    Short,
    /// Version, option length, reserved bits or reserved byte not zero.
    #[error("header version or reserved bits not zero")]
    Reserved,
    /// Neither 0x7a11 nor 0x7a12.
    #[error("unknown protocol {0:#06x}")]
    Protocol(u16),
}

impl Header {
    /// A data header (control bit clear).
    pub fn data(protocol: Protocol, vni: u32) -> Header {
        Header {
            control: false,
            protocol,
            vni,
        }
    }

    /// A control header for bind messages (control bit set, protocol
    /// control).
    pub fn bind(vni: u32) -> Header {
        Header {
            control: true,
            protocol: Protocol::Control,
            vni,
        }
    }

    /// The header's bytes. Panics if `vni` does not fit in 24 bits, which
    /// is a caller's bug (session ids are allocated below [`MAX_VNI`]).
    pub fn to_bytes(self) -> [u8; LEN] {
        assert!(
            self.vni <= MAX_VNI,
            "VNI {:#x} does not fit in 24 bits",
            self.vni
        );
        let p = self.protocol.wire().to_be_bytes();
        let v = self.vni.to_be_bytes();
        [
            0,
            if self.control { 0x80 } else { 0 },
            p[0],
            p[1],
            v[1],
            v[2],
            v[3],
            0,
        ]
    }

    /// Reads the header at the start of `datagram`; the rest is
    /// `&datagram[LEN..]`.
    pub fn parse(datagram: &[u8]) -> Result<Header, HeaderError> {
        let Some(h) = datagram.get(..LEN) else {
            return Err(HeaderError::Short);
        };
        if h[0] != 0 || h[1] & 0x7f != 0 || h[7] != 0 {
            return Err(HeaderError::Reserved);
        }
        let protocol = match u16::from_be_bytes([h[2], h[3]]) {
            Protocol::CONTROL => Protocol::Control,
            Protocol::PAYLOAD => Protocol::Payload,
            other => return Err(HeaderError::Protocol(other)),
        };
        Ok(Header {
            control: h[1] & 0x80 != 0,
            protocol,
            vni: u32::from_be_bytes([0, h[4], h[5], h[6]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_from_the_protocol_document() {
        // docs/relay-sessions.md §3 and derp-protocol.md §17.7.
        assert_eq!(
            Header::bind(1).to_bytes(),
            [0x00, 0x80, 0x7a, 0x11, 0, 0, 1, 0]
        );
        assert_eq!(
            Header::data(Protocol::Payload, 0x12_3456).to_bytes(),
            [0x00, 0x00, 0x7a, 0x12, 0x12, 0x34, 0x56, 0x00]
        );
        assert_eq!(
            Header::data(Protocol::Control, 1).to_bytes(),
            [0x00, 0x00, 0x7a, 0x11, 0, 0, 1, 0]
        );
    }

    #[test]
    fn round_trips_every_kind() {
        for control in [false, true] {
            for protocol in [Protocol::Control, Protocol::Payload] {
                for vni in [0, 1, 0xabcdef, MAX_VNI] {
                    let h = Header {
                        control,
                        protocol,
                        vni,
                    };
                    let mut bytes = h.to_bytes().to_vec();
                    bytes.extend_from_slice(b"rest");
                    assert_eq!(Header::parse(&bytes), Ok(h));
                }
            }
        }
    }

    #[test]
    fn refuses_what_is_not_a_header() {
        assert_eq!(Header::parse(&[0; 7]), Err(HeaderError::Short));
        // WireGuard handshake initiation: type 1, three zero bytes.
        assert_eq!(
            Header::parse(&[1, 0, 0, 0, 9, 9, 9, 9]),
            Err(HeaderError::Reserved)
        );
        // STUN binding request: 00 01, length, cookie.
        assert_eq!(
            Header::parse(&[0x00, 0x01, 0x00, 0x14, 0x21, 0x12, 0xa4, 0x42]),
            Err(HeaderError::Reserved)
        );
        assert_eq!(
            Header::parse(&[0, 0x40, 0x7a, 0x12, 0, 0, 1, 0]),
            Err(HeaderError::Reserved)
        );
        assert_eq!(
            Header::parse(&[0, 0, 0x7a, 0x12, 0, 0, 1, 1]),
            Err(HeaderError::Reserved)
        );
        assert_eq!(
            Header::parse(&[0, 0, 0x65, 0x58, 0, 0, 1, 0]),
            Err(HeaderError::Protocol(0x6558))
        );
    }

    #[test]
    #[should_panic(expected = "does not fit in 24 bits")]
    fn a_vni_over_24_bits_is_a_bug() {
        let _ = Header::data(Protocol::Payload, MAX_VNI + 1).to_bytes();
    }
}
