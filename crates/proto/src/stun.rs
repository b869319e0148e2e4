//! The STUN binding responder's codec (`docs/derp-protocol.md` §12, §17.6).
//!
//! A DERP node answers exactly one kind of UDP datagram: a Tailscale RFC 5389
//! Binding Request (SOFTWARE `tailnode`, FINGERPRINT last). The server path is
//! [`parse_binding_request`], which returns the transaction ID, followed by
//! [`write_binding_response`], which writes the XOR-MAPPED-ADDRESS answer into
//! a fixed stack buffer: no allocation per datagram. Anything that does not
//! parse is silently dropped by the caller.
//!
//! [`binding_request`] and [`parse_binding_response`] are the client side,
//! used by tests and probes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// STUN header length.
pub const HEADER_LEN: usize = 20;
/// The RFC 5389 magic cookie.
pub const MAGIC_COOKIE: [u8; 4] = [0x21, 0x12, 0xa4, 0x42];
/// Binding Request message type.
pub const BINDING_REQUEST: u16 = 0x0001;
/// Binding Success Response message type.
pub const BINDING_SUCCESS: u16 = 0x0101;
/// SOFTWARE attribute.
pub const ATTR_SOFTWARE: u16 = 0x8022;
/// FINGERPRINT attribute.
pub const ATTR_FINGERPRINT: u16 = 0x8028;
/// XOR-MAPPED-ADDRESS attribute.
pub const ATTR_XOR_MAPPED_ADDRESS: u16 = 0x0020;
/// Pre-RFC XOR-MAPPED-ADDRESS number some servers still send.
pub const ATTR_XOR_MAPPED_ADDRESS_ALT: u16 = 0x8020;
/// RFC 3489 MAPPED-ADDRESS.
pub const ATTR_MAPPED_ADDRESS: u16 = 0x0001;
/// The only SOFTWARE value answered.
pub const SOFTWARE: &[u8; 8] = b"tailnode";
/// FINGERPRINT is the CRC-32 of the preceding bytes XOR this value.
pub const FINGERPRINT_XOR: u32 = 0x5354_554e;
/// Length of the request Tailscale sends.
pub const REQUEST_LEN: usize = 40;
/// Largest response [`write_binding_response`] writes (IPv6).
pub const MAX_RESPONSE_LEN: usize = 44;

/// Why a datagram is not an acceptable STUN message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StunError {
    /// Shorter than the 20-byte STUN header, wrong top bits or wrong cookie.
    #[error("not a STUN message")]
    NotStun,
    /// A STUN message of a type other than the one expected.
    #[error("STUN message type {found:#06x}, expected {expected:#06x}")]
    WrongType {
        /// The message type found.
        found: u16,
        /// The message type required.
        expected: u16,
    },
    /// The header's length field disagrees with the datagram length.
    #[error("STUN length field says {declared} bytes of attributes, datagram has {actual}")]
    BadLength {
        /// Attribute bytes announced by the header.
        declared: usize,
        /// Attribute bytes present.
        actual: usize,
    },
    /// An attribute runs past the end of the message.
    #[error("malformed STUN attributes")]
    MalformedAttributes,
    /// No SOFTWARE attribute equal to `tailnode`.
    #[error("STUN request lacks SOFTWARE \"tailnode\"")]
    WrongSoftware,
    /// The last attribute is not a 4-byte FINGERPRINT.
    #[error("STUN request does not end with FINGERPRINT")]
    NoFingerprint,
    /// The FINGERPRINT value does not match the message.
    #[error("STUN FINGERPRINT mismatch")]
    BadFingerprint,
    /// A response carries no usable (XOR-)MAPPED-ADDRESS.
    #[error("STUN response has no usable mapped address")]
    NoAddress,
}

fn fingerprint(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes) ^ FINGERPRINT_XOR
}

/// Checks the header and returns (type, transaction ID, attributes).
fn parse_header(pkt: &[u8]) -> Result<(u16, [u8; 12], &[u8]), StunError> {
    if pkt.len() < HEADER_LEN || pkt[0] & 0xc0 != 0 || pkt[4..8] != MAGIC_COOKIE {
        return Err(StunError::NotStun);
    }
    let ty = u16::from_be_bytes([pkt[0], pkt[1]]);
    let declared = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    let attrs = &pkt[HEADER_LEN..];
    if declared != attrs.len() {
        return Err(StunError::BadLength {
            declared,
            actual: attrs.len(),
        });
    }
    let mut txid = [0u8; 12];
    txid.copy_from_slice(&pkt[8..20]);
    Ok((ty, txid, attrs))
}

/// Iterates over `(type, value)` of well-formed, 4-byte padded attributes.
/// Any trailing garbage yields one `Err` item.
fn attributes(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), StunError>> {
    std::iter::from_fn(move || {
        if b.is_empty() {
            return None;
        }
        if b.len() < 4 {
            b = &[];
            return Some(Err(StunError::MalformedAttributes));
        }
        let ty = u16::from_be_bytes([b[0], b[1]]);
        let len = usize::from(u16::from_be_bytes([b[2], b[3]]));
        let padded = (len + 3) & !3;
        if padded > b.len() - 4 {
            b = &[];
            return Some(Err(StunError::MalformedAttributes));
        }
        let value = &b[4..4 + len];
        b = &b[4 + padded..];
        Some(Ok((ty, value)))
    })
}

/// Accepts a Tailscale Binding Request and returns its transaction ID.
///
/// Requires: STUN header with cookie, type Binding Request, a length field
/// matching the datagram, well-formed attributes, a SOFTWARE attribute equal
/// to `tailnode`, and a valid 4-byte FINGERPRINT as the last attribute.
pub fn parse_binding_request(pkt: &[u8]) -> Result<[u8; 12], StunError> {
    let (ty, txid, attrs) = parse_header(pkt)?;
    if ty != BINDING_REQUEST {
        return Err(StunError::WrongType {
            found: ty,
            expected: BINDING_REQUEST,
        });
    }
    let mut software_ok = false;
    let mut last: Option<(u16, &[u8])> = None;
    for attr in attributes(attrs) {
        let (aty, value) = attr?;
        software_ok |= aty == ATTR_SOFTWARE && value == SOFTWARE;
        last = Some((aty, value));
    }
    if !software_ok {
        return Err(StunError::WrongSoftware);
    }
    let fp = match last {
        Some((ATTR_FINGERPRINT, v)) if v.len() == 4 => u32::from_be_bytes([v[0], v[1], v[2], v[3]]),
        _ => return Err(StunError::NoFingerprint),
    };
    // A 4-byte FINGERPRINT is the final 8 bytes; the CRC covers all before it.
    if fp != fingerprint(&pkt[..pkt.len() - 8]) {
        return Err(StunError::BadFingerprint);
    }
    Ok(txid)
}

/// Writes the Binding Success Response for `addr` into `out` and returns its
/// length: 32 bytes for IPv4 (family `01`; IPv4-mapped IPv6 addresses are
/// un-mapped first) or 44 bytes for IPv6 (family `02`).
pub fn write_binding_response(
    txid: &[u8; 12],
    addr: SocketAddr,
    out: &mut [u8; MAX_RESPONSE_LEN],
) -> usize {
    let ip = addr.ip().to_canonical();
    let (family, addr_len) = match ip {
        IpAddr::V4(_) => (1u8, 4usize),
        IpAddr::V6(_) => (2u8, 16usize),
    };
    let value_len = 4 + addr_len;
    let total = HEADER_LEN + 4 + value_len;
    out[0..2].copy_from_slice(&BINDING_SUCCESS.to_be_bytes());
    out[2..4].copy_from_slice(&((4 + value_len) as u16).to_be_bytes());
    out[4..8].copy_from_slice(&MAGIC_COOKIE);
    out[8..20].copy_from_slice(txid);
    out[20..22].copy_from_slice(&ATTR_XOR_MAPPED_ADDRESS.to_be_bytes());
    out[22..24].copy_from_slice(&(value_len as u16).to_be_bytes());
    out[24] = 0;
    out[25] = family;
    let port = addr.port() ^ u16::from_be_bytes([MAGIC_COOKIE[0], MAGIC_COOKIE[1]]);
    out[26..28].copy_from_slice(&port.to_be_bytes());
    let mut key = [0u8; 16];
    key[..4].copy_from_slice(&MAGIC_COOKIE);
    key[4..].copy_from_slice(txid);
    match ip {
        IpAddr::V4(v4) => {
            for (i, b) in v4.octets().iter().enumerate() {
                out[28 + i] = b ^ key[i];
            }
        }
        IpAddr::V6(v6) => {
            for (i, b) in v6.octets().iter().enumerate() {
                out[28 + i] = b ^ key[i];
            }
        }
    }
    total
}

/// Tailscale's 40-byte Binding Request with the given transaction ID.
pub fn binding_request(txid: &[u8; 12]) -> [u8; REQUEST_LEN] {
    let mut p = [0u8; REQUEST_LEN];
    p[0..2].copy_from_slice(&BINDING_REQUEST.to_be_bytes());
    p[2..4].copy_from_slice(&((REQUEST_LEN - HEADER_LEN) as u16).to_be_bytes());
    p[4..8].copy_from_slice(&MAGIC_COOKIE);
    p[8..20].copy_from_slice(txid);
    p[20..22].copy_from_slice(&ATTR_SOFTWARE.to_be_bytes());
    p[22..24].copy_from_slice(&(SOFTWARE.len() as u16).to_be_bytes());
    p[24..32].copy_from_slice(SOFTWARE);
    p[32..34].copy_from_slice(&ATTR_FINGERPRINT.to_be_bytes());
    p[34..36].copy_from_slice(&4u16.to_be_bytes());
    let fp = fingerprint(&p[..32]);
    p[36..40].copy_from_slice(&fp.to_be_bytes());
    p
}

/// Decodes an address attribute value; `xor_key` is cookie ‖ txid for the
/// XOR forms and `None` for plain MAPPED-ADDRESS.
fn decode_address(value: &[u8], xor_key: Option<&[u8; 16]>) -> Option<SocketAddr> {
    if value.len() < 4 {
        return None;
    }
    let zero = [0u8; 16];
    let key = xor_key.unwrap_or(&zero);
    let port = u16::from_be_bytes([value[2] ^ key[0], value[3] ^ key[1]]);
    let raw = &value[4..];
    let ip = match (value[1], raw.len()) {
        (1, 4) => IpAddr::V4(Ipv4Addr::new(
            raw[0] ^ key[0],
            raw[1] ^ key[1],
            raw[2] ^ key[2],
            raw[3] ^ key[3],
        )),
        (2, 16) => {
            let octets: [u8; 16] = core::array::from_fn(|i| raw[i] ^ key[i]);
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip.to_canonical(), port))
}

/// Decodes a Binding Success Response: its transaction ID and the mapped
/// address (XOR-MAPPED-ADDRESS `0x0020` or `0x8020` preferred, MAPPED-ADDRESS
/// `0x0001` as a fallback; IPv4-mapped IPv6 is returned as IPv4).
pub fn parse_binding_response(pkt: &[u8]) -> Result<([u8; 12], SocketAddr), StunError> {
    let (ty, txid, attrs) = parse_header(pkt)?;
    if ty != BINDING_SUCCESS {
        return Err(StunError::WrongType {
            found: ty,
            expected: BINDING_SUCCESS,
        });
    }
    let mut key = [0u8; 16];
    key[..4].copy_from_slice(&MAGIC_COOKIE);
    key[4..].copy_from_slice(&txid);
    let mut xor_addr = None;
    let mut plain_addr = None;
    for attr in attributes(attrs) {
        let (aty, value) = attr?;
        match aty {
            ATTR_XOR_MAPPED_ADDRESS | ATTR_XOR_MAPPED_ADDRESS_ALT if xor_addr.is_none() => {
                xor_addr = decode_address(value, Some(&key));
            }
            ATTR_MAPPED_ADDRESS if plain_addr.is_none() => {
                plain_addr = decode_address(value, None);
            }
            _ => {}
        }
    }
    xor_addr
        .or(plain_addr)
        .map(|a| (txid, a))
        .ok_or(StunError::NoAddress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::unhex;

    const TXID: [u8; 12] = [
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b,
    ];
    const REQUEST: &str =
        "0001 0014 2112a442 101112131415161718191a1b 8022 0008 7461696c6e6f6465 8028 0004 ac276261";
    const RESPONSE_V4: &str =
        "0101 000c 2112a442 101112131415161718191a1b 0020 0008 00 01 83bb ea12d545";
    const RESPONSE_V6: &str = "0101 0018 2112a442 101112131415161718191a1b 0020 0014 00 02 83bb 0113a9fa101112131415161718191a1a";
    const RESPONSE_GO_MAPPED: &str = "0101 0018 2112a442 101112131415161718191a1b 0020 0014 00 02 83bb 2112a442101112131415e9e8d3196b1c";

    fn respond(addr: &str) -> Vec<u8> {
        let mut out = [0u8; MAX_RESPONSE_LEN];
        let n = write_binding_response(&TXID, addr.parse().unwrap(), &mut out);
        out[..n].to_vec()
    }

    #[test]
    fn request_vector() {
        let want = unhex(REQUEST);
        assert_eq!(binding_request(&TXID)[..], want[..]);
        assert_eq!(parse_binding_request(&want), Ok(TXID));
    }

    #[test]
    fn response_vectors() {
        assert_eq!(respond("203.0.113.7:41641"), unhex(RESPONSE_V4));
        assert_eq!(
            respond("[::ffff:203.0.113.7]:41641"),
            unhex(RESPONSE_V4),
            "un-mapped"
        );
        assert_eq!(respond("[2001:db8::1]:41641"), unhex(RESPONSE_V6));
        let v4: SocketAddr = "203.0.113.7:41641".parse().unwrap();
        assert_eq!(parse_binding_response(&unhex(RESPONSE_V4)), Ok((TXID, v4)));
        assert_eq!(
            parse_binding_response(&unhex(RESPONSE_V6)),
            Ok((TXID, "[2001:db8::1]:41641".parse().unwrap()))
        );
        // Go derper on a dual-stack socket answers IPv4 clients with family 02.
        assert_eq!(
            parse_binding_response(&unhex(RESPONSE_GO_MAPPED)),
            Ok((TXID, v4))
        );
    }

    #[test]
    fn response_attribute_variants() {
        let mut alt = unhex(RESPONSE_V4);
        alt[20..22].copy_from_slice(&ATTR_XOR_MAPPED_ADDRESS_ALT.to_be_bytes());
        let v4: SocketAddr = "203.0.113.7:41641".parse().unwrap();
        assert_eq!(parse_binding_response(&alt), Ok((TXID, v4)));
        // Plain MAPPED-ADDRESS: no XOR.
        let mut plain =
            unhex("0101 000c 2112a442 101112131415161718191a1b 0001 0008 00 01 a2a9 cb007107");
        assert_eq!(parse_binding_response(&plain), Ok((TXID, v4)));
        plain[25] = 3;
        assert_eq!(parse_binding_response(&plain), Err(StunError::NoAddress));
        assert!(matches!(
            parse_binding_response(&unhex(REQUEST)),
            Err(StunError::WrongType { .. })
        ));
    }

    #[test]
    fn request_rejections() {
        let good = unhex(REQUEST);
        let check = |f: &dyn Fn(&mut Vec<u8>), want: StunError| {
            let mut p = good.clone();
            f(&mut p);
            assert_eq!(parse_binding_request(&p), Err(want));
        };
        check(&|p| p.truncate(19), StunError::NotStun);
        check(&|p| p[0] = 0x40, StunError::NotStun);
        check(&|p| p[4] = 0, StunError::NotStun);
        check(
            &|p| p[1] = 0x11,
            StunError::WrongType {
                found: 0x0011,
                expected: 1,
            },
        );
        check(
            &|p| p.push(0),
            StunError::BadLength {
                declared: 20,
                actual: 21,
            },
        );
        check(&|p| p[24] = b'T', StunError::WrongSoftware);
        check(&|p| p[39] ^= 1, StunError::BadFingerprint);
        check(&|p| p[10] ^= 1, StunError::BadFingerprint);
        check(
            &|p| {
                p[3] = 0x18;
                p.extend_from_slice(&[0x00, 0x24, 0x00, 0x00]);
            },
            StunError::NoFingerprint,
        );
        check(
            &|p| {
                p[3] = 0x15;
                p.push(0);
            },
            StunError::MalformedAttributes,
        );
        check(&|p| p[23] = 0x20, StunError::MalformedAttributes);
    }

    #[test]
    fn round_trips() {
        for addr in [
            "1.2.3.4:1",
            "[::1]:65535",
            "[fe80::1234]:0",
            "255.255.255.255:9",
        ] {
            let a: SocketAddr = addr.parse().unwrap();
            let mut out = [0u8; MAX_RESPONSE_LEN];
            let n = write_binding_response(&[0xee; 12], a, &mut out);
            assert_eq!(parse_binding_response(&out[..n]), Ok(([0xee; 12], a)));
        }
    }
}
