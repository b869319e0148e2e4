//! Reconnect delays: exponential backoff with jitter, from a generator the
//! caller seeds, so a schedule can be reproduced in a test.
//!
//! Attempt `n` (from 0) waits a delay drawn uniformly from the upper half
//! of `min(initial · 2ⁿ, max)` ("equal jitter": never less than half the
//! nominal delay, so retries stay spread out, and never more than it). A
//! successful handshake resets the count.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// How reconnect attempts are spaced: [`BackoffOptions::default`] (100 ms
/// doubling to 10 s) or [`BackoffOptions::new`].
///
/// ```
/// use ferry_client::BackoffOptions;
/// use std::time::Duration;
///
/// let b = BackoffOptions::new(Duration::from_millis(50), Duration::from_secs(1)).with_seed(7);
/// assert_eq!((b.initial, b.max, b.seed), (Duration::from_millis(50), Duration::from_secs(1), Some(7)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackoffOptions {
    /// Nominal delay before the first retry.
    pub initial: Duration,
    /// Largest nominal delay.
    pub max: Duration,
    /// Seed of the jitter generator; `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        BackoffOptions {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            seed: None,
        }
    }
}

impl BackoffOptions {
    /// Delays from `initial` doubling up to `max`, jitter drawn from the
    /// OS.
    pub fn new(initial: Duration, max: Duration) -> BackoffOptions {
        BackoffOptions {
            initial,
            max,
            seed: None,
        }
    }

    /// With the jitter generator seeded, so the schedule repeats.
    pub fn with_seed(mut self, seed: u64) -> BackoffOptions {
        self.seed = Some(seed);
        self
    }
}

/// The delay schedule of one client.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
    rng: StdRng,
}

impl Backoff {
    pub(crate) fn new(options: &BackoffOptions) -> Self {
        let rng = match options.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Backoff {
            initial: options.initial,
            max: options.max.max(options.initial),
            attempt: 0,
            rng,
        }
    }

    /// The delay before the next attempt; each call counts one attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        let nominal = self.initial.saturating_mul(factor).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = nominal / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(self.rng.gen_range(0..=nanos))
    }

    /// Starts over after a successful connection.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64) -> BackoffOptions {
        BackoffOptions {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            seed: Some(seed),
        }
    }

    #[test]
    fn doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let mut b = Backoff::new(&options(7));
        let nominal = [100, 200, 400, 800, 1600, 2000, 2000, 2000];
        for n in nominal {
            let d = b.next_delay();
            let n = Duration::from_millis(n);
            assert!(d >= n / 2 && d <= n, "{d:?} outside [{:?}, {n:?}]", n / 2);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    /// The default schedule the README states: 100 ms doubling to 10 s.
    #[test]
    fn the_default_schedule_is_100_ms_doubling_to_10_s() {
        let mut b = Backoff::new(&BackoffOptions {
            seed: Some(3),
            ..BackoffOptions::default()
        });
        let nominal = [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000];
        for n in nominal {
            let d = b.next_delay();
            let n = Duration::from_millis(n);
            assert!(d >= n / 2 && d <= n, "{d:?} outside [{:?}, {n:?}]", n / 2);
        }
    }

    #[test]
    fn the_seed_fixes_the_schedule_and_jitter_varies() {
        let run = |seed| {
            let mut b = Backoff::new(&options(seed));
            (0..20).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        // Capped attempts are not all the same delay.
        let capped = &run(3)[6..];
        assert!(capped.iter().any(|d| *d != capped[0]), "{capped:?}");
    }

    #[test]
    fn never_overflows() {
        let mut b = Backoff::new(&BackoffOptions {
            initial: Duration::from_secs(u64::MAX / 4),
            max: Duration::MAX,
            seed: Some(0),
        });
        for _ in 0..100 {
            b.next_delay();
        }
    }
}
