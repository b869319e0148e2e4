//! Rate-limited log lines about dropped input: what a remote party sends
//! is counted always, but logged at most once per reason per interval, so
//! a flood of bad packets makes as many lines as a single one.

use std::time::{Duration, Instant};

/// How often a line per reason may be logged about the peer relay's
/// dropped input (allocation requests over DERP, the port's control
/// datagrams).
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// Per reason (an index below `N`): when a line was last logged and how
/// many drops were not logged since. Holds no heap memory.
#[derive(Debug)]
pub struct DropLog<const N: usize> {
    every: Duration,
    logged: [Option<Instant>; N],
    suppressed: [u64; N],
}

impl<const N: usize> DropLog<N> {
    /// A gate that lets one line per reason through every `every`.
    pub fn new(every: Duration) -> DropLog<N> {
        DropLog {
            every,
            logged: [None; N],
            suppressed: [0; N],
        }
    }

    /// `count` drops for reason `reason` at `now`: `Some(n)` if a line is
    /// to be logged now, `n` being the drops of this reason not logged
    /// since the last line; `None` if they are only counted. A reason out
    /// of range is never logged.
    pub fn note(&mut self, reason: usize, count: u64, now: Instant) -> Option<u64> {
        let (Some(logged), Some(suppressed)) =
            (self.logged.get_mut(reason), self.suppressed.get_mut(reason))
        else {
            return None;
        };
        if count == 0 {
            return None;
        }
        if logged.is_some_and(|t| now.saturating_duration_since(t) < self.every) {
            *suppressed = suppressed.saturating_add(count);
            return None;
        }
        *logged = Some(now);
        // The drops of this call beyond the one the line names are not
        // logged either.
        Some(std::mem::replace(suppressed, count - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_reason_per_interval_whatever_the_flood() {
        let t0 = Instant::now();
        let mut log = DropLog::<3>::new(Duration::from_secs(10));
        let mut lines = Vec::new();
        // 10 000 drops of reason 0 over 25 s, 1 000 of reason 1 at once.
        for i in 0..10_000u64 {
            let now = t0 + Duration::from_micros(i * 2_500);
            if let Some(s) = log.note(0, 1, now) {
                lines.push((0, now.duration_since(t0).as_secs(), s));
            }
        }
        if let Some(s) = log.note(1, 1_000, t0 + Duration::from_secs(1)) {
            lines.push((1, 1, s));
        }
        assert_eq!(
            lines,
            [(0, 0, 0), (0, 10, 3_999), (0, 20, 3_999), (1, 1, 0)]
        );
        // The next line of reason 1 names the 999 not logged, and those
        // of reason 0 since the 20 s line.
        assert_eq!(log.note(1, 1, t0 + Duration::from_secs(11)), Some(999));
        assert_eq!(log.note(0, 1, t0 + Duration::from_secs(30)), Some(1_999));
        assert_eq!(log.note(2, 0, t0), None, "no drops, no line");
        assert_eq!(log.note(3, 1, t0), None, "out of range");
    }
}
