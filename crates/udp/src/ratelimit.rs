//! Token buckets: one per source for handshake messages, and a single
//! one for rare, costly actions.
//!
//! A source is an IPv4 address or an IPv6 /64 (a host picks any address
//! of its /64 at will, so a per-address limit would not limit it;
//! IPv4-mapped addresses count as IPv4). The per-source table has a fixed
//! number of entries, in sets of [`WAYS`] chosen by a keyed hash of the
//! source, so memory is bounded and a lookup never allocates. A new
//! source takes a free entry of its set, with a full bucket, or else the
//! set's least recently used entry *with that entry's bucket as it is*:
//! tokens only ever come from refilling, so a flood that moves over many
//! addresses (spoofed, or a v6 host's many /64s) gets no fresh burst per
//! address, and all it takes in aggregate is what the entries it lands in
//! refill. With a secret hash key nobody can aim at a chosen victim's set;
//! a source that shares a full set with a flood shares its buckets.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

pub use ferry_engine::limit::Bucket as TokenBucket;

/// Entries per set.
pub const WAYS: usize = 4;

#[derive(Clone, Copy)]
struct Entry {
    source: Option<IpAddr>,
    bucket: TokenBucket,
    used: Option<Instant>,
}

/// Token buckets keyed by source in a fixed-size table.
pub struct SourceLimiter {
    sets: Box<[[Entry; WAYS]]>,
    hasher: RandomState,
}

/// What a source is limited as: its IPv4 address, or its IPv6 /64.
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u128::from(u64::MAX)))),
        },
    }
}

impl SourceLimiter {
    /// `entries` (rounded up to a power of two, at least [`WAYS`]) buckets
    /// of `rate` per second and `burst`.
    pub fn new(entries: usize, rate: f64, burst: f64) -> Self {
        let fresh = Entry {
            source: None,
            bucket: TokenBucket::new(rate, burst),
            used: None,
        };
        let sets = (entries.next_power_of_two() / WAYS).max(1);
        SourceLimiter {
            sets: vec![[fresh; WAYS]; sets].into_boxed_slice(),
            hasher: RandomState::new(),
        }
    }

    fn set_of(&self, ip: IpAddr) -> usize {
        (self.hasher.hash_one(source(ip)) as usize) & (self.sets.len() - 1)
    }

    /// Takes a token from the bucket of `ip`'s source.
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let key = source(ip);
        let i = self.set_of(ip);
        let set = &mut self.sets[i];
        let w = set
            .iter()
            .position(|e| e.source == Some(key))
            .or_else(|| set.iter().position(|e| e.source.is_none()))
            .unwrap_or_else(|| (0..WAYS).min_by_key(|&w| set[w].used).unwrap_or(0));
        let e = &mut set[w];
        e.source = Some(key);
        e.used = Some(e.used.map_or(now, |u| u.max(now)));
        e.bucket.try_take_one(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn sources_are_limited_separately() {
        let t0 = Instant::now();
        let mut l = SourceLimiter::new(64, 1.0, 2.0);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(l.allow(a, t0) && l.allow(a, t0));
        assert!(!l.allow(a, t0));
        // A source in another set (the hash is random: look for one).
        let b = (2..=255u8)
            .map(|n| IpAddr::from([192, 0, 2, n]))
            .find(|b| l.set_of(*b) != l.set_of(a))
            .expect("some address in another slot");
        assert!(l.allow(b, t0), "another source has its own bucket");
    }

    #[test]
    fn every_address_of_one_ipv6_64_shares_its_bucket() {
        let t0 = Instant::now();
        let mut l = SourceLimiter::new(4096, 1.0, 2.0);
        let host = |n: u16| IpAddr::from(Ipv6Addr::new(0x2001, 0xdb8, 7, 1, 0, 0, 0, n));
        assert!(l.allow(host(1), t0) && l.allow(host(1), t0));
        // A host that picks a new address of its /64 for every message
        // gets no new burst.
        let more = (2..1000).filter(|&n| l.allow(host(n), t0)).count();
        assert_eq!(more, 0, "messages allowed from other addresses of the /64");
        // IPv4-mapped addresses are limited as the IPv4 address.
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped = IpAddr::from(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert!(l.allow(v4, t0) && l.allow(mapped, t0));
        assert!(!l.allow(v4, t0) && !l.allow(mapped, t0));
    }

    #[test]
    fn sources_that_share_a_set_get_no_fresh_burst() {
        let t0 = Instant::now();
        // One set: every source lands in it, the first few in entries of
        // their own.
        let mut l = SourceLimiter::new(1, 1.0, 2.0);
        let sources: Vec<IpAddr> = (1..=200u8)
            .map(|n| IpAddr::from([198, 51, 100, n]))
            .collect();
        let allowed = sources.iter().filter(|s| l.allow(**s, t0)).count();
        assert!(
            allowed <= 2 * WAYS,
            "a flood from many sources got {allowed} past the set's buckets"
        );
        // And the bucket refills at its rate.
        assert!(l.allow(sources[0], t0 + std::time::Duration::from_secs(1)));
    }
}
