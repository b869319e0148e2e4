//! Bounce clients whose target has not answered yet, oldest first, per
//! route. At a route's client limit a new client may take the place of
//! the oldest of them once it is [`GIVE_WAY_AFTER`] old: a flood of
//! datagrams from many (spoofed) sources opens clients nobody answers,
//! and must not lock every new client out for a whole idle timeout. A
//! client its target answered is never taken.
//!
//! Entries are checked lazily: a client that was answered or closed since
//! stays in its queue until the queue is searched or pruned (every timer
//! tick), so the queues hold at most the open unanswered clients between
//! two ticks.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a target has to answer before its client may give way:
/// WireGuard's REKEY_TIMEOUT, after which a client retries its handshake.
pub(super) const GIVE_WAY_AFTER: Duration = Duration::from_secs(5);

/// Per route: (slab key, serial, opened at), in the order opened.
pub(super) struct Unanswered {
    routes: Vec<VecDeque<(usize, u64, Instant)>>,
}

impl Unanswered {
    pub(super) fn new(routes: usize) -> Unanswered {
        Unanswered {
            routes: (0..routes).map(|_| VecDeque::new()).collect(),
        }
    }

    /// A client of `route` opened at `at` (`serial` tells it from a later
    /// one in the same slab slot).
    pub(super) fn opened(&mut self, route: usize, key: usize, serial: u64, at: Instant) {
        self.routes[route].push_back((key, serial, at));
    }

    /// The oldest client of `route` that `live` says is still open and
    /// unanswered, if it is [`GIVE_WAY_AFTER`] old at `now`; removed from
    /// the queue. Entries no longer live are dropped on the way.
    pub(super) fn take_oldest(
        &mut self,
        route: usize,
        now: Instant,
        live: impl Fn(usize, u64) -> bool,
    ) -> Option<usize> {
        let q = &mut self.routes[route];
        while let Some(&(key, serial, at)) = q.front() {
            if !live(key, serial) {
                q.pop_front();
                continue;
            }
            if now.saturating_duration_since(at) < GIVE_WAY_AFTER {
                return None;
            }
            q.pop_front();
            return Some(key);
        }
        None
    }

    /// Drops every entry `live` no longer accepts.
    pub(super) fn prune(&mut self, live: impl Fn(usize, u64) -> bool) {
        for q in &mut self.routes {
            q.retain(|&(key, serial, _)| live(key, serial));
        }
    }

    /// Entries held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.routes.iter().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_live_session_gives_way_once_old_enough() {
        let t0 = Instant::now();
        let mut u = Unanswered::new(2);
        u.opened(0, 7, 1, t0);
        u.opened(0, 8, 2, t0 + Duration::from_secs(1));
        u.opened(1, 9, 3, t0);
        let all = |_, _| true;
        assert_eq!(u.take_oldest(0, t0 + Duration::from_secs(4), all), None);
        assert_eq!(u.take_oldest(0, t0 + GIVE_WAY_AFTER, all), Some(7));
        // Key 8 was answered (or closed, or its slot reused): skipped.
        let not_8 = |k, _| k != 8;
        assert_eq!(u.take_oldest(0, t0 + GIVE_WAY_AFTER * 2, not_8), None);
        assert_eq!(u.take_oldest(1, t0 + GIVE_WAY_AFTER, all), Some(9));
        assert_eq!(u.len(), 0);
    }

    #[test]
    fn pruning_keeps_only_live_entries() {
        let t0 = Instant::now();
        let mut u = Unanswered::new(1);
        for k in 0..10 {
            u.opened(0, k, k as u64, t0);
        }
        u.prune(|k, serial| k % 2 == 0 && serial == k as u64);
        assert_eq!(u.len(), 5);
    }
}
