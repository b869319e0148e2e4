//! The real client's address behind HTTP proxies: trusted proxy networks
//! and the `X-Forwarded-For` / `Forwarded` (RFC 7239) headers.
//!
//! Anyone can write these headers, so they are only believed when the
//! connection comes from a trusted proxy, and only as far back as the chain
//! of trusted proxies goes: [`client_address`] walks the hops from the one
//! nearest the relay outwards and stops at the first address that is not a
//! trusted proxy. That address is the client; whatever it claims about hops
//! before it is ignored.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// One network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Whether `ip` lies inside this network. An IPv4 network also holds
    /// the IPv4-mapped IPv6 form of its addresses.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack socket
/// reports for an IPv4 peer) as plain IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    let rest = prefix % 8;
    if a[..full] != b[..full] {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    a[full] & mask == b[full] & mask
}

/// Why a trusted-proxy list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    /// An entry that is neither an address nor `address/prefix`.
    #[error("{entry:?} is not an IP address or network (like 10.0.0.0/8 or ::1)")]
    Address {
        /// The entry as written.
        entry: String,
    },
    /// A prefix length longer than the address or not a number.
    #[error("{entry:?}: prefix length must be 0-{max}")]
    Prefix {
        /// The entry as written.
        entry: String,
        /// 32 or 128.
        max: u8,
    },
    /// Host bits set below the prefix (`10.0.0.1/8`): probably a typo.
    #[error("{entry:?} has bits set past its prefix (did you mean {suggest}?)")]
    HostBits {
        /// The entry as written.
        entry: String,
        /// The network the prefix describes.
        suggest: String,
    },
}

impl FromStr for Network {
    type Err = NetworkError;

    fn from_str(entry: &str) -> Result<Self, NetworkError> {
        let (addr, prefix) = match entry.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (entry, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| NetworkError::Address {
            entry: entry.to_owned(),
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => Some(p)
                .filter(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|&p| p <= max)
                .ok_or_else(|| NetworkError::Prefix {
                    entry: entry.to_owned(),
                    max,
                })?,
        };
        let net = Network { addr, prefix };
        let masked = net.masked();
        if masked.addr != addr {
            return Err(NetworkError::HostBits {
                entry: entry.to_owned(),
                suggest: masked.to_string(),
            });
        }
        Ok(net)
    }
}

impl Network {
    fn masked(self) -> Network {
        fn mask<const N: usize>(mut octets: [u8; N], prefix: u8) -> [u8; N] {
            for (i, o) in octets.iter_mut().enumerate() {
                let bits = usize::from(prefix).saturating_sub(i * 8).min(8);
                *o &= if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
            }
            octets
        }
        let addr = match self.addr {
            IpAddr::V4(a) => IpAddr::from(mask(a.octets(), self.prefix)),
            IpAddr::V6(a) => IpAddr::from(mask(a.octets(), self.prefix)),
        };
        Network { addr, ..self }
    }
}

/// The networks whose connections may say who the client is (a PROXY
/// header, `X-Forwarded-For`, `Forwarded`). Parsed from a comma-separated
/// list such as `10.0.0.0/8, 192.168.1.10, ::1`; empty trusts nobody.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Network>);

impl TrustedProxies {
    /// Whether `ip` belongs to a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }

    /// Whether no network is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The networks, in the order given.
    pub fn networks(&self) -> &[Network] {
        &self.0
    }
}

impl FromStr for TrustedProxies {
    type Err = NetworkError;

    fn from_str(list: &str) -> Result<Self, NetworkError> {
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(TrustedProxies)
    }
}

impl fmt::Display for TrustedProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

/// The client's address for an HTTP request that arrived from `peer`.
///
/// `x_forwarded_for` and `forwarded` are the headers' values, several lines
/// of one header joined with `,` in the order received. `Forwarded` wins
/// when both are present (it is the standard form). The hops are read from
/// the nearest (last) outwards while each is a trusted proxy; the first
/// untrusted hop is the client. A hop that names no usable address
/// (`unknown`, an obfuscated `_name`, garbage) ends the walk: the last
/// trusted address before it stands, as nothing further out can be believed.
pub fn client_address(
    peer: IpAddr,
    trusted: &TrustedProxies,
    x_forwarded_for: Option<&str>,
    forwarded: Option<&str>,
) -> IpAddr {
    walk(peer, trusted, x_forwarded_for, forwarded).0
}

/// As [`client_address`], but `None` where the walk stops at a hop that
/// names no usable address: the client is unknown then (it is not the
/// last trusted proxy before that hop). For decisions that must not give
/// an unknown client the benefit of the doubt.
pub fn known_client_address(
    peer: IpAddr,
    trusted: &TrustedProxies,
    x_forwarded_for: Option<&str>,
    forwarded: Option<&str>,
) -> Option<IpAddr> {
    let (ip, known) = walk(peer, trusted, x_forwarded_for, forwarded);
    known.then_some(ip)
}

/// The walk of [`client_address`], and whether it ended on an address
/// (`false`: at a hop that names none).
fn walk(
    peer: IpAddr,
    trusted: &TrustedProxies,
    x_forwarded_for: Option<&str>,
    forwarded: Option<&str>,
) -> (IpAddr, bool) {
    let peer = canonical(peer);
    if !trusted.contains(peer) {
        return (peer, true);
    }
    let mut current = peer;
    let mut walk = |hops: &mut dyn DoubleEndedIterator<Item = Option<IpAddr>>| {
        for hop in hops.rev() {
            let Some(ip) = hop else { return false };
            current = canonical(ip);
            if !trusted.contains(current) {
                return true;
            }
        }
        true
    };
    let known = if let Some(f) = forwarded {
        walk(&mut f.split(',').map(forwarded_for_param))
    } else if let Some(x) = x_forwarded_for {
        walk(&mut x.split(',').map(|h| node_address(h.trim())))
    } else {
        true
    };
    (current, known)
}

/// The address in one `Forwarded` element's `for=` parameter.
fn forwarded_for_param(element: &str) -> Option<IpAddr> {
    let mut found = None;
    for pair in element.split(';') {
        let (name, value) = pair.trim().split_once('=')?;
        if name.trim().eq_ignore_ascii_case("for") {
            if found.is_some() {
                return None;
            }
            let value = value.trim();
            let value = match value.strip_prefix('"') {
                Some(v) => v.strip_suffix('"')?,
                None => value,
            };
            found = Some(node_address(value)?);
        }
    }
    found
}

/// An address as proxies write a hop: `192.0.2.1`, `192.0.2.1:4711`,
/// `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:4711`.
fn node_address(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = node.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    let inner = node.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trusted(list: &str) -> TrustedProxies {
        list.parse().unwrap()
    }

    #[test]
    fn networks_parse_and_match() {
        let t = trusted("10.0.0.0/8, 192.168.1.10 ,::1, 2001:db8::/32, 172.16.0.0/12");
        assert_eq!(
            t.to_string(),
            "10.0.0.0/8,192.168.1.10/32,::1/128,2001:db8::/32,172.16.0.0/12"
        );
        for yes in [
            "10.1.2.3",
            "192.168.1.10",
            "::1",
            "2001:db8:ffff::1",
            "172.31.255.255",
            "::ffff:10.9.9.9",
        ] {
            assert!(t.contains(ip(yes)), "{yes}");
        }
        for no in [
            "11.0.0.1",
            "192.168.1.11",
            "::2",
            "2001:db9::1",
            "172.32.0.0",
            "0.0.0.0",
        ] {
            assert!(!t.contains(ip(no)), "{no}");
        }
        assert!(trusted("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(trusted("").is_empty());
    }

    #[test]
    fn network_errors_say_what_is_wrong() {
        let err = |s: &str| s.parse::<TrustedProxies>().unwrap_err().to_string();
        assert!(err("10.0.0.1/8").contains("did you mean 10.0.0.0/8"));
        assert!(err("10.0.0.0/33").contains("0-32"));
        assert!(err("::/129").contains("0-128"));
        assert!(err("10.0.0.0/+8").contains("0-32"));
        assert!(err("example.com").contains("not an IP address"));
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let t = trusted("10.0.0.0/8");
        assert_eq!(
            client_address(ip("203.0.113.5"), &t, Some("198.51.100.1"), None),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn x_forwarded_for_walks_trusted_hops() {
        let t = trusted("10.0.0.0/8");
        let peer = ip("10.0.0.1");
        // Client, then a trusted inner proxy: the client stands.
        assert_eq!(
            client_address(peer, &t, Some("198.51.100.7, 10.0.0.2"), None),
            ip("198.51.100.7")
        );
        // A spoofed first hop before the real client is not believed.
        assert_eq!(
            client_address(peer, &t, Some("1.1.1.1, 198.51.100.7:5555"), None),
            ip("198.51.100.7")
        );
        // Every hop trusted: the farthest is the client.
        assert_eq!(
            client_address(peer, &t, Some("10.0.0.9,10.0.0.8"), None),
            ip("10.0.0.9")
        );
        // An unusable hop stops the walk at the last trusted address.
        assert_eq!(
            client_address(peer, &t, Some("1.1.1.1, unknown"), None),
            peer
        );
        assert_eq!(client_address(peer, &t, Some(""), None), peer);
        assert_eq!(client_address(peer, &t, None, None), peer);
    }

    #[test]
    fn forwarded_wins_and_parses_rfc7239_forms() {
        let t = trusted("10.0.0.0/8, ::1");
        let fwd = r#"for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https, For=10.0.0.3;by=10.0.0.1"#;
        assert_eq!(
            client_address(ip("::1"), &t, Some("9.9.9.9"), Some(fwd)),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &t, None, Some("for=unknown, for=10.0.0.4")),
            ip("10.0.0.4")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &t, None, Some("for=_hidden")),
            ip("10.0.0.1")
        );
        // Two `for` in one element is malformed: not believed.
        assert_eq!(
            client_address(ip("10.0.0.1"), &t, None, Some("for=1.2.3.4;for=5.6.7.8")),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn a_walk_that_stops_at_an_unusable_hop_names_no_known_client() {
        let t = trusted("10.0.0.0/8");
        let peer = ip("10.0.0.1");
        let known = |x: Option<&str>, f: Option<&str>| known_client_address(peer, &t, x, f);
        assert_eq!(
            known(Some("198.51.100.7, 10.0.0.2"), None),
            Some(ip("198.51.100.7"))
        );
        assert_eq!(known(Some("10.0.0.9"), None), Some(ip("10.0.0.9")));
        assert_eq!(known(None, None), Some(peer));
        for (x, f) in [
            (Some("1.1.1.1, unknown"), None),
            (Some(""), None),
            (None, Some("for=unknown, for=10.0.0.4")),
            (None, Some("for=_hidden")),
        ] {
            assert_eq!(known(x, f), None, "{x:?} {f:?}");
            assert_eq!(
                client_address(peer, &t, x, f) == peer,
                f.is_none() || f == Some("for=_hidden")
            );
        }
        // An untrusted peer is always its own, known, client.
        assert_eq!(
            known_client_address(ip("192.0.2.1"), &t, Some("unknown"), None),
            Some(ip("192.0.2.1"))
        );
    }

    #[test]
    fn mapped_ipv4_peers_are_canonical() {
        let t = trusted("127.0.0.1");
        assert_eq!(
            client_address(
                ip("::ffff:127.0.0.1"),
                &t,
                Some("::ffff:198.51.100.1"),
                None
            ),
            ip("198.51.100.1")
        );
    }
}
