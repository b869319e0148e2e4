//! This host's addresses, for the candidates a wildcard-bound endpoint
//! announces: every local unicast address of the socket's family (Linux:
//! `/proc/net/fib_trie` for IPv4, `/proc/net/if_inet6` for IPv6, loopback
//! and link-local left out), or else the address the default route would
//! send from.
//!
//! Addresses of point-to-point interfaces (WireGuard and other tun devices,
//! PPP) are left out too: such an address is reached through its tunnel,
//! and when the tunnel is one this endpoint carries (`ferry link` beside a
//! WireGuard interface) a "direct" path to it would run inside itself —
//! working while the tunnel works over another path, then taking the
//! tunnel's own traffic and collapsing, again and again. A public address
//! on a PPP link is still found by STUN.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The host's addresses of the family of `v6`.
pub(crate) fn addresses(v6: bool) -> Vec<IpAddr> {
    let mut found = if v6 {
        std::fs::read_to_string("/proc/net/if_inet6")
            .map(|t| parse_if_inet6(&t))
            .unwrap_or_default()
    } else {
        std::fs::read_to_string("/proc/net/fib_trie")
            .map(|t| parse_fib_trie(&t))
            .unwrap_or_default()
    };
    if found.is_empty() {
        found.extend(route_source(v6));
    }
    let tunnels = ferry_sys::ifaddrs::interface_addrs()
        .map(|all| tunnel_addresses(&all))
        .unwrap_or_default();
    found.retain(|ip| !tunnels.contains(ip));
    found
}

/// The addresses that sit on point-to-point interfaces.
fn tunnel_addresses(all: &[ferry_sys::ifaddrs::InterfaceAddr]) -> Vec<IpAddr> {
    all.iter()
        .filter(|a| a.point_to_point)
        .map(|a| a.addr)
        .collect()
}

/// The IPv4 addresses the kernel's local table marks `host LOCAL`, in
/// order of first appearance, without loopback.
fn parse_fib_trie(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let line = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(ip) = line.parse::<Ipv4Addr>() {
            last = Some(ip);
        } else if line.starts_with("/32 host LOCAL") {
            if let Some(ip) = last.filter(|ip| !ip.is_loopback()) {
                if !out.contains(&IpAddr::V4(ip)) {
                    out.push(IpAddr::V4(ip));
                }
            }
        }
    }
    out
}

/// The global-scope IPv6 addresses of `/proc/net/if_inet6` (address in 32
/// hex digits, index, prefix, scope, flags, name).
fn parse_if_inet6(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let hex = f.next()?;
            let scope = f.nth(2)?;
            if hex.len() != 32 || scope != "00" {
                return None;
            }
            let bits = u128::from_str_radix(hex, 16).ok()?;
            let ip = Ipv6Addr::from(bits);
            (!ip.is_loopback()).then_some(IpAddr::V6(ip))
        })
        .collect()
}

/// The address the system would send from towards the internet (no packet
/// is sent: connecting a UDP socket only picks the route).
fn route_source(v6: bool) -> Option<IpAddr> {
    let (bind, probe): (SocketAddr, SocketAddr) = if v6 {
        (
            (Ipv6Addr::UNSPECIFIED, 0).into(),
            (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), 9).into(),
        )
    } else {
        (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            ([192, 0, 2, 1], 9).into(),
        )
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(probe).ok()?;
    Some(s.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_local_ipv4_addresses_of_fib_trie() {
        let text = "\
Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.0.0.0/24 2 0 2
        |-- 10.0.0.0
           /32 link BROADCAST
           /24 link UNICAST
        |-- 10.0.0.7
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 10.0.0.0/24 2 0 2
     |-- 10.0.0.7
        /32 host LOCAL
     |-- 192.168.5.2
        /32 host LOCAL
";
        assert_eq!(
            parse_fib_trie(text),
            vec![IpAddr::from([10, 0, 0, 7]), IpAddr::from([192, 168, 5, 2])]
        );
    }

    #[test]
    fn reads_the_global_ipv6_addresses_of_if_inet6() {
        let text = "\
00000000000000000000000000000001 01 80 10 80       lo
fe800000000000000000000000000001 02 40 20 80     eth0
20010db8000000000000000000000005 02 40 00 00     eth0
";
        assert_eq!(
            parse_if_inet6(text),
            vec!["2001:db8::5".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn point_to_point_addresses_are_tunnels() {
        let iface = |name: &str, addr: [u8; 4], point_to_point| ferry_sys::ifaddrs::InterfaceAddr {
            name: name.into(),
            addr: IpAddr::from(addr),
            point_to_point,
            loopback: false,
        };
        let all = [
            iface("eth0", [10, 0, 0, 7], false),
            iface("wg0", [10, 77, 120, 1], true),
        ];
        assert_eq!(tunnel_addresses(&all), vec![IpAddr::from([10, 77, 120, 1])]);
    }

    #[test]
    fn this_host_has_some_address_or_none_without_panicking() {
        for v6 in [false, true] {
            let tunnels = tunnel_addresses(&ferry_sys::ifaddrs::interface_addrs().unwrap());
            for ip in addresses(v6) {
                assert_eq!(ip.is_ipv6(), v6);
                assert!(!ip.is_loopback());
                assert!(
                    !tunnels.contains(&ip),
                    "{ip} is on a point-to-point interface"
                );
            }
        }
    }
}
