//! The token bucket every limit in Ferry uses, with time passed in: the
//! relay's per-client receive limits (`--rate-config`, in bytes), its
//! accept limit and peerGone(NotHere) notices, and the UDP relay's
//! per-source handshake limits and flood budget (in messages).

use std::time::{Duration, Instant};

/// Tokens refill at `rate` per second up to `burst`; taking more than
/// there are leaves a debt, and [`Bucket::take`] says how long until it is
/// paid, which is how long the taker should wait before taking again.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    /// When the tokens were counted; `None` until first used (a new
    /// bucket is full whenever that is).
    at: Option<Instant>,
}

impl Bucket {
    /// A full bucket: `rate` tokens a second, at most `burst`.
    pub fn new(rate: f64, burst: f64) -> Self {
        Bucket {
            rate,
            burst,
            tokens: burst,
            at: None,
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        }
        self.at = Some(self.at.map_or(now, |at| at.max(now)));
    }

    /// Takes `n` tokens (at most a full bucket's worth, so one large item
    /// never waits longer than a refill). Returns how long until the
    /// bucket is out of debt, or `None` when it is not in debt.
    pub fn take(&mut self, n: f64, now: Instant) -> Option<Duration> {
        self.refill(now);
        self.tokens -= n.min(self.burst);
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.rate))
    }

    /// Takes one token if there is a whole one; nothing otherwise.
    pub fn try_take_one(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debt_says_how_long_to_wait() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000.0, 500.0);
        assert_eq!(b.take(400.0, t0), None);
        // 100 left; taking 300 leaves a debt of 200 bytes: 200 ms.
        assert_eq!(b.take(300.0, t0), Some(Duration::from_millis(200)));
        // After those 200 ms the debt is paid.
        assert_eq!(b.take(0.0, t0 + Duration::from_millis(200)), None);
        // Never more than the burst at once: 10,000 counts as 500.
        let mut b = Bucket::new(1000.0, 500.0);
        assert_eq!(b.take(10_000.0, t0), None);
        // Refill stops at the burst.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(500.0, later), None);
        assert_eq!(b.take(1.0, later), Some(Duration::from_millis(1)));
    }

    #[test]
    fn whole_tokens() {
        let t0 = Instant::now();
        let mut b = Bucket::new(2.0, 3.0);
        assert!((0..3).all(|_| b.try_take_one(t0)));
        assert!(!b.try_take_one(t0));
        assert!(!b.try_take_one(t0 + Duration::from_millis(499)));
        assert!(b.try_take_one(t0 + Duration::from_millis(500)));
    }
}
