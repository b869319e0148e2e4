//! Capability grants in the packet filter: does a peer hold a capability
//! (such as `tailscale.com/cap/relay`) on this node?
//!
//! A rule grants capabilities from its sources (`SrcIPs`: `*`, an address,
//! a CIDR prefix, or a range `a-b`) to the destinations of its `CapGrant`
//! entries (prefixes), naming them in `CapMap` (or the older `Caps` list).
//! The peer holds the capability on this node when some rule lists the
//! peer's address among its sources and one of its grants names the
//! capability for a destination holding this node's address of the same
//! family. Entries that do not parse match nothing.

use super::tailcfg::{FilterRule, Prefix};
use std::net::IpAddr;

impl Prefix {
    /// Whether `ip` lies in the prefix (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let bits = u32::from(self.bits.min(32));
                let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let bits = u32::from(self.bits.min(128));
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Whether the `SrcIPs` entry `entry` holds `ip`.
pub fn source_matches(entry: &str, ip: IpAddr) -> bool {
    if entry == "*" {
        return true;
    }
    if let Some((lo, hi)) = entry.split_once('-') {
        return match (lo.parse::<IpAddr>(), hi.parse::<IpAddr>()) {
            (Ok(IpAddr::V4(lo)), Ok(IpAddr::V4(hi))) => match ip {
                IpAddr::V4(a) => lo <= a && a <= hi,
                IpAddr::V6(_) => false,
            },
            (Ok(IpAddr::V6(lo)), Ok(IpAddr::V6(hi))) => match ip {
                IpAddr::V6(a) => lo <= a && a <= hi,
                IpAddr::V4(_) => false,
            },
            _ => false,
        };
    }
    if entry.contains('/') {
        return entry.parse::<Prefix>().is_ok_and(|p| p.contains(ip));
    }
    entry.parse::<IpAddr>().is_ok_and(|a| a == ip)
}

/// Whether the peer at `src` holds `cap` on the node whose addresses are
/// `self_addrs` (the first of `src`'s family is the one checked).
pub fn has_cap<'a>(
    rules: impl IntoIterator<Item = &'a FilterRule>,
    src: IpAddr,
    self_addrs: &[Prefix],
    cap: &str,
) -> bool {
    let Some(dst) = self_addrs
        .iter()
        .map(|p| p.addr)
        .find(|a| a.is_ipv4() == src.is_ipv4())
    else {
        return false;
    };
    rules.into_iter().any(|rule| {
        rule.src_ips.iter().any(|s| source_matches(s, src))
            && rule.cap_grant.iter().any(|g| {
                g.dsts.iter().any(|d| d.contains(dst))
                    && (g.cap_map.iter().any(|c| c == cap) || g.caps.iter().any(|c| c == cap))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tailnet::tailcfg::MapResponse;

    const RELAY: &str = "tailscale.com/cap/relay";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn prefixes(list: &[&str]) -> Vec<Prefix> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn prefixes_and_sources() {
        let p: Prefix = "100.64.0.0/10".parse().unwrap();
        assert!(p.contains(ip("100.127.255.255")) && !p.contains(ip("100.128.0.0")));
        assert!(!p.contains(ip("::1")));
        let all: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("1.2.3.4")));
        let six: Prefix = "fd7a:115c:a1e0::/48".parse().unwrap();
        assert!(six.contains(ip("fd7a:115c:a1e0::5")) && !six.contains(ip("fd7a:115c:a1e1::")));
        let one: Prefix = "fd7a::1/128".parse().unwrap();
        assert!(one.contains(ip("fd7a::1")) && !one.contains(ip("fd7a::2")));
        let a = ip("100.64.0.5");
        assert!(source_matches("*", a));
        assert!(source_matches("100.64.0.5", a) && !source_matches("100.64.0.6", a));
        assert!(source_matches("100.64.0.0/24", a) && !source_matches("100.65.0.0/16", a));
        assert!(source_matches("100.64.0.1-100.64.0.9", a));
        assert!(!source_matches("100.64.0.6-100.64.0.9", a));
        assert!(!source_matches("::-ffff::", a));
        assert!(!source_matches("garbage", a) && !source_matches("1.2.3.4/99", a));
    }

    #[test]
    fn relay_grant_as_headscale_compiles_it() {
        let m = MapResponse::from_json(
            br#"{"PacketFilters":{"base":[
                {"SrcIPs":["100.64.0.0/10"],"DstPorts":[{"IP":"*","Ports":{"First":0,"Last":65535}}]},
                {"SrcIPs":["100.64.0.1","fd7a:115c:a1e0::1"],"CapGrant":[
                  {"Dsts":["100.64.0.3/32","fd7a:115c:a1e0::3/128"],
                   "CapMap":{"tailscale.com/cap/relay":[{}]}}]}]}}"#,
        )
        .unwrap();
        let rules = &m.packet_filters.unwrap()["base"].clone().unwrap();
        let me = prefixes(&["100.64.0.3/32", "fd7a:115c:a1e0::3/128"]);
        assert!(has_cap(rules, ip("100.64.0.1"), &me, RELAY));
        assert!(has_cap(rules, ip("fd7a:115c:a1e0::1"), &me, RELAY));
        assert!(
            !has_cap(rules, ip("100.64.0.2"), &me, RELAY),
            "not a source"
        );
        assert!(!has_cap(rules, ip("100.64.0.1"), &me, "other/cap"));
        let other = prefixes(&["100.64.0.4/32"]);
        assert!(
            !has_cap(rules, ip("100.64.0.1"), &other, RELAY),
            "not a destination"
        );
        assert!(!has_cap(rules, ip("100.64.0.1"), &[], RELAY));
        let legacy = FilterRule {
            src_ips: vec!["*".into()],
            cap_grant: vec![crate::tailnet::tailcfg::CapGrant {
                dsts: prefixes(&["100.64.0.0/10"]),
                caps: vec![RELAY.into()],
                cap_map: vec![],
            }],
        };
        assert!(has_cap([&legacy], ip("100.100.1.1"), &me, RELAY));
    }
}
