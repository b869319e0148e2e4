//! Token buckets: one per source IP for handshake messages, and a single
//! one for rare, costly actions.
//!
//! The per-source table has a fixed number of slots chosen by a keyed hash
//! of the address, so memory is bounded and a lookup never allocates. Two
//! addresses that share a slot evict each other's bucket (the newcomer
//! starts full); with a secret hash key an attacker cannot aim those
//! evictions at a chosen victim, and the worst they achieve is a fresh
//! burst for someone else.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::time::Instant;

pub use ferry_engine::limit::Bucket as TokenBucket;

#[derive(Clone, Copy)]
struct Slot {
    ip: Option<IpAddr>,
    bucket: TokenBucket,
}

/// Token buckets keyed by source IP in a fixed-size table.
pub struct SourceLimiter {
    slots: Box<[Slot]>,
    hasher: RandomState,
    fresh: TokenBucket,
}

impl SourceLimiter {
    /// `slots` (rounded up to a power of two) buckets of `rate` per second
    /// and `burst`.
    pub fn new(slots: usize, rate: f64, burst: f64) -> Self {
        let fresh = TokenBucket::new(rate, burst);
        SourceLimiter {
            slots: vec![
                Slot {
                    ip: None,
                    bucket: fresh
                };
                slots.next_power_of_two()
            ]
            .into_boxed_slice(),
            hasher: RandomState::new(),
            fresh,
        }
    }

    /// Takes a token from `ip`'s bucket.
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let i = (self.hasher.hash_one(ip) as usize) & (self.slots.len() - 1);
        let slot = &mut self.slots[i];
        if slot.ip != Some(ip) {
            *slot = Slot {
                ip: Some(ip),
                bucket: self.fresh,
            };
        }
        slot.bucket.try_take_one(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_limited_separately() {
        let t0 = Instant::now();
        let mut l = SourceLimiter::new(64, 1.0, 2.0);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(l.allow(a, t0) && l.allow(a, t0));
        assert!(!l.allow(a, t0));
        assert!(l.allow(b, t0), "another source has its own bucket");
    }
}
