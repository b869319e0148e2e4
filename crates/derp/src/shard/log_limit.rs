//! Rate-limited logging about connections: a misbehaving client must not
//! flood the log, so past a burst per second lines are counted, not
//! printed (`conn_log!`).

use std::time::{Duration, Instant};

/// Log lines per second per shard about misbehaving clients, beyond which
/// they are counted but not printed.
const LOG_BURST: u32 = 20;

/// Counts a shard's log lines about connections, per second.
pub(super) struct LogLimiter {
    window: Instant,
    lines: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter whose first second starts at `now`.
    pub(super) fn new(now: Instant) -> LogLimiter {
        LogLimiter {
            window: now,
            lines: 0,
            suppressed: 0,
        }
    }

    /// Whether a line may be printed at `now`. The first call in a new
    /// second logs how many lines the previous one suppressed.
    pub(super) fn allow(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            if self.suppressed > 0 {
                tracing::info!(
                    suppressed = self.suppressed,
                    "connection log lines suppressed in the last second"
                );
            }
            self.window = now;
            self.lines = 0;
            self.suppressed = 0;
        }
        self.lines += 1;
        if self.lines > LOG_BURST {
            self.suppressed += 1;
            false
        } else {
            true
        }
    }
}
