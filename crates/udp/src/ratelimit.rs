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

/// One token bucket.
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket refilling `rate` tokens per second up to `burst`.
    pub fn new(rate: f64, burst: f64) -> Self {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

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
        slot.bucket.take(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3.0);
        assert!(b.take(t0) && b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_millis(50)));
        assert!(b.take(t0 + Duration::from_millis(160)));
        // Long idle: never more than the burst.
        let later = t0 + Duration::from_secs(100);
        assert!((0..3).all(|_| b.take(later)));
        assert!(!b.take(later));
    }

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
