//! The run's clock: nanoseconds of `CLOCK_MONOTONIC` since the first call in
//! this process. Every thread reads the same clock, so a timestamp written
//! into a packet by one thread can be subtracted from the time another
//! thread receives it.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the process's first call.
#[inline]
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Nanoseconds in a duration, saturating.
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Sleeps until the clock reads `t_ns` (returns at once if it already has).
pub fn sleep_until(t_ns: u64) {
    let now = now_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos(t_ns - now));
    }
}
