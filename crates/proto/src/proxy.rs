//! The PROXY protocol: how a TCP proxy in front of the relay (haproxy,
//! nginx's `proxy_protocol`, a cloud load balancer) tells it which client a
//! connection really comes from.
//!
//! The proxy writes one header before any byte of the client's stream:
//! version 1 is a text line (`PROXY TCP4 <src> <dst> <sport> <dport>\r\n`,
//! at most [`V1_MAX_LEN`] bytes), version 2 a binary block that starts with
//! the 12-byte [`V2_SIGNATURE`]. [`parse`] reads either from the start of a
//! connection's bytes, says how many bytes the header took (the client's
//! stream starts after them) and which addresses it carries.
//!
//! Who may send a header is the listener's decision, not this module's: a
//! header is only believed from a trusted proxy's address, and an untrusted
//! peer that sends one is refused (see [`crate::forwarded::TrustedProxies`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The first bytes of a version 2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The first bytes of a version 1 header.
pub const V1_PREFIX: &[u8] = b"PROXY ";
/// Longest version 1 header, `\r\n` included (the specification's bound).
pub const V1_MAX_LEN: usize = 107;
/// Bytes of a version 2 header before its variable part.
pub const V2_FIXED_LEN: usize = 16;
/// Longest version 2 header accepted, fixed part included. The addresses
/// take at most 216 bytes (a pair of Unix paths); the rest is TLVs (ALPN,
/// authority, TLS details), which proxies keep short. A longer header is
/// refused rather than buffered.
pub const V2_MAX_LEN: usize = V2_FIXED_LEN + 2048;

/// What a complete header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes the header took; the proxied stream starts after them.
    pub len: usize,
    /// The client and the address it connected to, when the header names
    /// them: `None` for a connection the proxy made itself (v2 `LOCAL`, e.g.
    /// a health check), for v1 `UNKNOWN`, and for address families that are
    /// not IP (Unix sockets, unspecified). The peer's own address stands then.
    pub addresses: Option<Addresses>,
}

/// The two ends of the proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// The client, as the proxy saw it.
    pub source: SocketAddr,
    /// The address the client connected to (the proxy's listener).
    pub destination: SocketAddr,
}

/// Why the start of a connection is not a usable PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The bytes start like neither version's header.
    #[error("connection does not start with a PROXY protocol header")]
    NotProxy,
    /// No `\r\n` within the first [`V1_MAX_LEN`] bytes of a v1 header.
    #[error("PROXY v1 header longer than {max} bytes")]
    V1TooLong {
        /// The limit, [`V1_MAX_LEN`].
        max: usize,
    },
    /// A v1 line that does not follow the grammar; names the field.
    #[error("malformed PROXY v1 header: bad {0}")]
    V1Malformed(&'static str),
    /// A v2 header whose version nibble is not 2.
    #[error("PROXY v2 header with version {0}")]
    V2Version(u8),
    /// A v2 command other than `LOCAL` (0) and `PROXY` (1).
    #[error("PROXY v2 header with unknown command {0}")]
    V2Command(u8),
    /// A v2 header longer than [`V2_MAX_LEN`].
    #[error("PROXY v2 header of {len} bytes exceeds {max}")]
    V2TooLong {
        /// The length the header declares, fixed part included.
        len: usize,
        /// The limit, [`V2_MAX_LEN`].
        max: usize,
    },
    /// A v2 address block shorter than its family needs.
    #[error("PROXY v2 address block of {len} bytes is too short for family {family:#04x}")]
    V2ShortAddresses {
        /// The family and transport byte.
        family: u8,
        /// Bytes after the fixed part.
        len: usize,
    },
    /// A v2 header for a datagram transport on a stream connection, or an
    /// unknown family or transport.
    #[error("PROXY v2 header with unsupported family/transport {0:#04x}")]
    V2Family(u8),
}

/// Reads a PROXY header from the start of `buf`.
///
/// Returns `Ok(None)` while `buf` is a proper prefix of a header (read more
/// and call again with everything so far), the header once it is complete,
/// and an error as soon as the bytes cannot become a valid header.
pub fn parse(buf: &[u8]) -> Result<Option<Header>, ProxyError> {
    if starts_like(buf, &V2_SIGNATURE) {
        if buf.len() < V2_FIXED_LEN {
            return Ok(None);
        }
        return parse_v2(buf);
    }
    if starts_like(buf, V1_PREFIX) {
        if buf.len() < V1_PREFIX.len() {
            return Ok(None);
        }
        return parse_v1(buf);
    }
    Err(ProxyError::NotProxy)
}

/// Whether `buf` could be the start of a stream that begins with `prefix`.
fn starts_like(buf: &[u8], prefix: &[u8]) -> bool {
    let n = buf.len().min(prefix.len());
    buf[..n] == prefix[..n]
}

/// Whether a stream that starts with `buf` is an attempt at a PROXY header
/// (used to refuse headers from peers that are not trusted proxies):
/// `Some(true)` once `buf` holds a whole v1 prefix (`PROXY `) or v2
/// signature, `Some(false)` as soon as it matches neither, `None` while it
/// is too short to tell (`P` could begin `POST`).
pub fn starts_with_header(buf: &[u8]) -> Option<bool> {
    let v2 = starts_like(buf, &V2_SIGNATURE);
    let v1 = starts_like(buf, V1_PREFIX);
    if (v2 && buf.len() >= V2_SIGNATURE.len()) || (v1 && buf.len() >= V1_PREFIX.len()) {
        Some(true)
    } else if v1 || v2 {
        None
    } else {
        Some(false)
    }
}

fn parse_v1(buf: &[u8]) -> Result<Option<Header>, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let Some(cr) = window.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX_LEN {
            return Err(ProxyError::V1TooLong { max: V1_MAX_LEN });
        }
        // A bare `\r` not yet followed by anything, or still inside the line;
        // a `\n` alone can never become valid.
        if window.contains(&b'\n') {
            return Err(ProxyError::V1Malformed("line ending"));
        }
        return Ok(None);
    };
    let len = cr + 2;
    let line = std::str::from_utf8(&buf[V1_PREFIX.len()..cr])
        .map_err(|_| ProxyError::V1Malformed("characters"))?;
    let mut fields = line.split(' ');
    let proto = fields.next().unwrap_or_default();
    if proto == "UNKNOWN" {
        // The rest of the line is to be ignored (the specification).
        return Ok(Some(Header {
            len,
            addresses: None,
        }));
    }
    let want_v4 = match proto {
        "TCP4" => true,
        "TCP6" => false,
        _ => return Err(ProxyError::V1Malformed("protocol")),
    };
    let mut next = |what| fields.next().ok_or(ProxyError::V1Malformed(what));
    let src = parse_v1_ip(next("source address")?, want_v4, "source address")?;
    let dst = parse_v1_ip(next("destination address")?, want_v4, "destination address")?;
    let sport = parse_v1_port(next("source port")?, "source port")?;
    let dport = parse_v1_port(next("destination port")?, "destination port")?;
    if fields.next().is_some() {
        return Err(ProxyError::V1Malformed("trailing field"));
    }
    Ok(Some(Header {
        len,
        addresses: Some(Addresses {
            source: SocketAddr::new(src, sport),
            destination: SocketAddr::new(dst, dport),
        }),
    }))
}

fn parse_v1_ip(s: &str, want_v4: bool, what: &'static str) -> Result<IpAddr, ProxyError> {
    let ip = if want_v4 {
        s.parse::<Ipv4Addr>().map(IpAddr::V4)
    } else {
        s.parse::<Ipv6Addr>().map(IpAddr::V6)
    };
    ip.map_err(|_| ProxyError::V1Malformed(what))
}

/// A port: 1 to 5 decimal digits, no sign, no leading zero, at most 65535.
fn parse_v1_port(s: &str, what: &'static str) -> Result<u16, ProxyError> {
    let digits_only = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits_only || (s.len() > 1 && s.starts_with('0')) {
        return Err(ProxyError::V1Malformed(what));
    }
    s.parse().map_err(|_| ProxyError::V1Malformed(what))
}

fn parse_v2(buf: &[u8]) -> Result<Option<Header>, ProxyError> {
    let ver_cmd = buf[12];
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::V2Version(ver_cmd >> 4));
    }
    let command = ver_cmd & 0x0f;
    if command > 1 {
        return Err(ProxyError::V2Command(command));
    }
    let family = buf[13];
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = V2_FIXED_LEN + body;
    if len > V2_MAX_LEN {
        return Err(ProxyError::V2TooLong {
            len,
            max: V2_MAX_LEN,
        });
    }
    if buf.len() < len {
        return Ok(None);
    }
    let block = &buf[V2_FIXED_LEN..len];
    // LOCAL: the proxy's own connection; the family is to be ignored.
    if command == 0 {
        return Ok(Some(Header {
            len,
            addresses: None,
        }));
    }
    let need = match family {
        // UNSPEC: addresses unknown (the receiver uses the real peer).
        0x00 => None,
        // TCP over IPv4 / IPv6.
        0x11 => Some(12),
        0x21 => Some(36),
        // Unix stream: no IP address to take.
        0x31 => None,
        _ => return Err(ProxyError::V2Family(family)),
    };
    let Some(need) = need else {
        return Ok(Some(Header {
            len,
            addresses: None,
        }));
    };
    if block.len() < need {
        return Err(ProxyError::V2ShortAddresses {
            family,
            len: block.len(),
        });
    }
    let (src, dst, ports) = if family == 0x11 {
        let a: [u8; 4] = block[0..4].try_into().expect("4 bytes");
        let b: [u8; 4] = block[4..8].try_into().expect("4 bytes");
        (IpAddr::from(a), IpAddr::from(b), &block[8..12])
    } else {
        let a: [u8; 16] = block[0..16].try_into().expect("16 bytes");
        let b: [u8; 16] = block[16..32].try_into().expect("16 bytes");
        (IpAddr::from(a), IpAddr::from(b), &block[32..36])
    };
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    Ok(Some(Header {
        len,
        addresses: Some(Addresses {
            source: SocketAddr::new(src, sport),
            destination: SocketAddr::new(dst, dport),
        }),
    }))
}

/// Builds a version 2 `PROXY` header for a TCP connection from `source` to
/// `destination` (both of one IP family), with no TLVs: what a proxy in
/// front of the relay writes. Tests and the load generator use it.
///
/// # Panics
/// If the two addresses are of different families.
pub fn v2_header(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x21);
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        _ => panic!("PROXY header addresses of different families: {source} and {destination}"),
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(src: &str, dst: &str) -> Option<Addresses> {
        Some(Addresses {
            source: src.parse().unwrap(),
            destination: dst.parse().unwrap(),
        })
    }

    #[test]
    fn v1_tcp4_and_tcp6() {
        let line = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET /derp";
        let h = parse(line).unwrap().unwrap();
        assert_eq!(h.len, line.len() - b"GET /derp".len());
        assert_eq!(h.addresses, addrs("192.0.2.1:56324", "198.51.100.2:443"));

        let line = b"PROXY TCP6 2001:db8::1 2001:db8::2 4711 443\r\n";
        let h = parse(line).unwrap().unwrap();
        assert_eq!(h.len, line.len());
        assert_eq!(
            h.addresses,
            addrs("[2001:db8::1]:4711", "[2001:db8::2]:443")
        );
    }

    #[test]
    fn v1_unknown_carries_no_addresses() {
        let h = parse(b"PROXY UNKNOWN ffff::1 x y z\r\n").unwrap().unwrap();
        assert_eq!(h.addresses, None);
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap().len, 15);
    }

    #[test]
    fn v1_every_prefix_is_incomplete() {
        let line = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
        for n in 0..line.len() {
            assert_eq!(parse(&line[..n]), Ok(None), "prefix of {n} bytes");
        }
    }

    #[test]
    fn v1_refusals_name_the_field() {
        let cases: [(&[u8], ProxyError); 9] = [
            (
                b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n",
                ProxyError::V1Malformed("protocol"),
            ),
            (
                b"PROXY TCP4 1.2.3.400 1.2.3.4 1 2\r\n",
                ProxyError::V1Malformed("source address"),
            ),
            (
                b"PROXY TCP4 ::1 ::1 1 2\r\n",
                ProxyError::V1Malformed("source address"),
            ),
            (
                b"PROXY TCP6 ::1 1.2.3.4 1 2\r\n",
                ProxyError::V1Malformed("destination address"),
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 +1 2\r\n",
                ProxyError::V1Malformed("source port"),
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 1 65536\r\n",
                ProxyError::V1Malformed("destination port"),
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n",
                ProxyError::V1Malformed("source port"),
            ),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2 3\r\n",
                ProxyError::V1Malformed("trailing field"),
            ),
            (
                b"PROXY TCP4 1.2.3.4\n",
                ProxyError::V1Malformed("line ending"),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse(input),
                Err(want),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        let long = [b"PROXY ".as_slice(), &[b'A'; 200]].concat();
        assert_eq!(parse(&long), Err(ProxyError::V1TooLong { max: V1_MAX_LEN }));
    }

    #[test]
    fn not_a_header() {
        assert_eq!(parse(b"GET /derp HTTP/1.1\r\n"), Err(ProxyError::NotProxy));
        assert_eq!(parse(&[0x16, 0x03, 0x01]), Err(ProxyError::NotProxy));
        assert_eq!(parse(b""), Ok(None));
        assert_eq!(starts_with_header(b""), None);
        assert_eq!(starts_with_header(b"P"), None);
        assert_eq!(starts_with_header(b"POST /"), Some(false));
        assert_eq!(starts_with_header(b"PROXY"), None);
        assert_eq!(starts_with_header(b"PROXY "), Some(true));
        assert_eq!(starts_with_header(b"\r\n\r\n"), None);
        assert_eq!(starts_with_header(&V2_SIGNATURE), Some(true));
        assert_eq!(starts_with_header(b"GET"), Some(false));
        assert_eq!(starts_with_header(&[0x16, 0x03]), Some(false));
    }

    #[test]
    fn v2_round_trip_both_families_and_every_prefix() {
        for (s, d) in [
            ("192.0.2.1:56324", "198.51.100.2:443"),
            ("[2001:db8::1]:4711", "[2001:db8::2]:443"),
        ] {
            let header = v2_header(s.parse().unwrap(), d.parse().unwrap());
            let mut stream = header.clone();
            stream.extend_from_slice(b"\x16\x03\x01");
            let h = parse(&stream).unwrap().unwrap();
            assert_eq!(h.len, header.len());
            assert_eq!(h.addresses, addrs(s, d));
            for n in 0..header.len() {
                assert_eq!(parse(&header[..n]), Ok(None), "prefix of {n} bytes");
            }
        }
    }

    /// A header as haproxy writes it with `send-proxy-v2`: TCP over IPv4
    /// and TLVs after the addresses (here ALPN and a no-op), which are
    /// skipped.
    #[test]
    fn v2_with_tlvs_and_local() {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x11, 0x00, 12 + 5 + 4]);
        h.extend_from_slice(&[127, 0, 0, 2, 127, 0, 0, 1, 0x30, 0x39, 0x01, 0xbb]);
        h.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2']);
        h.extend_from_slice(&[0x04, 0x00, 0x01, 0x00]);
        let parsed = parse(&h).unwrap().unwrap();
        assert_eq!(parsed.len, h.len());
        assert_eq!(parsed.addresses, addrs("127.0.0.2:12345", "127.0.0.1:443"));

        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        assert_eq!(
            parse(&local),
            Ok(Some(Header {
                len: 16,
                addresses: None
            }))
        );
    }

    #[test]
    fn v2_refusals() {
        let with = |ver_cmd: u8, fam: u8, len: u16| {
            let mut h = V2_SIGNATURE.to_vec();
            h.push(ver_cmd);
            h.push(fam);
            h.extend_from_slice(&len.to_be_bytes());
            h.resize(16 + usize::from(len).min(64), 0);
            h
        };
        assert_eq!(parse(&with(0x11, 0x11, 12)), Err(ProxyError::V2Version(1)));
        assert_eq!(parse(&with(0x22, 0x11, 12)), Err(ProxyError::V2Command(2)));
        assert_eq!(
            parse(&with(0x21, 0x11, 60000)),
            Err(ProxyError::V2TooLong {
                len: 60016,
                max: V2_MAX_LEN
            })
        );
        assert_eq!(
            parse(&with(0x21, 0x21, 12)),
            Err(ProxyError::V2ShortAddresses {
                family: 0x21,
                len: 12
            })
        );
        assert_eq!(
            parse(&with(0x21, 0x12, 12)),
            Err(ProxyError::V2Family(0x12))
        );
        assert_eq!(
            parse(&with(0x21, 0x00, 0)).unwrap().unwrap().addresses,
            None
        );
    }
}
