//! Pacing: when a flow's next packets are due.
//!
//! A paced flow has a schedule: packet `k` is due at `start + k / pps`. The
//! event loop wakes about once a millisecond, asks [`Pacer::due`] how many
//! packets the schedule has reached, sends what the connection accepts and
//! reports it with [`Pacer::sent`]. Packets that fall more than
//! `max_lag` behind the schedule — because the connection was blocked by TCP
//! flow control, i.e. the server stopped reading — are not sent late in a
//! burst; they are counted as [`Pacer::skipped`] and the schedule moves on.
//! That keeps the offered load honest: a server that pushes back shows up as
//! skipped packets, not as a burst that distorts the next measurement.

/// The schedule of one flow. Times are nanoseconds on the run's clock.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Nanoseconds between packets; `None` means unpaced.
    interval_ns: Option<f64>,
    /// When the next packet is due.
    next_ns: f64,
    /// How far behind the schedule a flow may fall before packets are skipped.
    max_lag_ns: f64,
    skipped: u64,
}

/// The smallest lag tolerated before skipping: the event loop's wake-up
/// granularity is one millisecond, so anything finer would skip packets that
/// were merely waiting for the next turn.
pub const MIN_LAG_NS: f64 = 4_000_000.0;

impl Pacer {
    /// A pacer for `pps` packets per second (`None`: unpaced) whose first
    /// packet is due at `start_ns`. Up to `max_burst` packets (at least
    /// [`MIN_LAG_NS`] worth) may be sent late in one go after a stall.
    pub fn new(pps: Option<f64>, start_ns: u64, max_burst: u32) -> Self {
        let interval_ns = pps.filter(|p| *p > 0.0).map(|p| 1e9 / p);
        let max_lag_ns = interval_ns.map_or(0.0, |i| (i * f64::from(max_burst)).max(MIN_LAG_NS));
        Pacer {
            interval_ns,
            next_ns: start_ns as f64,
            max_lag_ns,
            skipped: 0,
        }
    }

    /// Whether the flow is paced at all.
    pub fn is_paced(&self) -> bool {
        self.interval_ns.is_some()
    }

    /// Packets due at `now_ns` (`u64::MAX` when unpaced). Moves the schedule
    /// past packets that are more than the allowed lag late, counting them
    /// as skipped.
    pub fn due(&mut self, now_ns: u64) -> u64 {
        let Some(interval) = self.interval_ns else {
            return u64::MAX;
        };
        let now = now_ns as f64;
        if now < self.next_ns {
            return 0;
        }
        let lag = now - self.next_ns;
        if lag > self.max_lag_ns {
            let skip = ((lag - self.max_lag_ns) / interval).ceil();
            self.skipped += skip as u64;
            self.next_ns += skip * interval;
        }
        ((now - self.next_ns) / interval).floor() as u64 + 1
    }

    /// Records that `n` due packets were sent.
    pub fn sent(&mut self, n: u64) {
        if let Some(interval) = self.interval_ns {
            self.next_ns += n as f64 * interval;
        }
    }

    /// When the next packet is due (0 when unpaced: always).
    pub fn next_due_ns(&self) -> u64 {
        if self.interval_ns.is_some() {
            self.next_ns.max(0.0) as u64
        } else {
            0
        }
    }

    /// Packets skipped so far because the flow fell too far behind.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn keeps_the_schedule() {
        // 10 000 pps: one packet every 100 µs, ten per millisecond.
        let mut p = Pacer::new(Some(10_000.0), 1000 * MS, 64);
        assert_eq!(p.due(999 * MS), 0, "nothing before the start");
        assert_eq!(p.due(1000 * MS), 1, "the first packet is due at the start");
        let mut sent = 0;
        for ms in 1000..1100 {
            let n = p.due(ms * MS);
            p.sent(n);
            sent += n;
        }
        // Packets due at 1000.0, 1000.1, ..., 1099.0 ms: exactly 991.
        assert_eq!(sent, 991);
        assert_eq!(p.skipped(), 0);
        assert_eq!(p.next_due_ns(), 1099 * MS + 100_000);
    }

    #[test]
    fn skips_after_a_stall_instead_of_bursting() {
        let mut p = Pacer::new(Some(10_000.0), 0, 8);
        let first = p.due(0);
        p.sent(first);
        // Blocked for 100 ms: 1000 packets became due. Only the allowed lag
        // (max(8 packets, 4 ms) = 4 ms = 40 packets, plus the one due now)
        // may go out late.
        let n = p.due(100 * MS);
        assert_eq!(n, 41);
        assert_eq!(p.skipped(), 959);
        p.sent(n);
        assert_eq!(p.due(100 * MS), 0);
        // Offered = sent + skipped, whatever the server did.
        assert_eq!(p.skipped() + n + 1, 1001);
    }

    #[test]
    fn partial_sends_leave_the_rest_due() {
        let mut p = Pacer::new(Some(1000.0), 0, 64);
        let n = p.due(3 * MS);
        assert_eq!(n, 4);
        p.sent(1);
        assert_eq!(p.due(3 * MS), 3);
    }

    #[test]
    fn unpaced() {
        let mut p = Pacer::new(None, 0, 64);
        assert!(!p.is_paced());
        assert_eq!(p.due(0), u64::MAX);
        p.sent(1_000_000);
        assert_eq!(p.skipped(), 0);
        assert_eq!(p.next_due_ns(), 0);
    }

    #[test]
    fn low_rates_have_sparse_packets() {
        let mut p = Pacer::new(Some(1.0), 0, 64);
        assert_eq!(p.due(0), 1);
        p.sent(1);
        assert_eq!(p.due(999 * MS), 0);
        assert_eq!(p.due(1000 * MS), 1);
    }
}
