//! Single-writer statistics cells for a shard's metrics.
//!
//! Each shard is the only writer of its cells, so an update is a relaxed
//! load and store on memory no other core writes — no locked instruction,
//! no contention. Readers (a scrape, on any thread) load them and sum the
//! shards.
//!
//! A scrape writes them out with [`exposition`], the one Prometheus text
//! writer of every service; a service with a metrics address of its own
//! serves the page with [`scrape`].

pub mod exposition;
pub mod scrape;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// A counter written by one thread only.
#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning thread may call this.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A gauge written by one thread only (may go negative per shard when a
/// value moves between shards; sums are exact).
#[derive(Default, Debug)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds `n` (may be negative). Only the owning thread may call this.
    #[inline]
    pub fn add(&self, n: i64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    /// Sets the value. Only the owning thread may call this.
    #[inline]
    pub fn set(&self, n: i64) {
        self.0.store(n, Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> i64 {
        self.0.load(Relaxed)
    }
}
