//! Latency histogram with bounded relative error, and the percentiles drawn
//! from it.
//!
//! Values (nanoseconds) below 128 get a bucket each; above that every power
//! of two is split into 64 equal buckets, so a bucket is never wider than
//! 1/64 of its lower bound and a reported percentile is within 1.6 % of the
//! true sample. Recording is an index computation and an increment: no
//! allocation, no sorting, and histograms from several threads merge by
//! adding counts.

use serde::{Deserialize, Serialize};

const LINEAR: u64 = 128;
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// First exponent handled by the log-linear part (2^7 = 128).
const FIRST_EXP: u32 = 7;
const BUCKETS: usize = LINEAR as usize + (64 - FIRST_EXP as usize) * SUB as usize;

/// Counts of nanosecond values in log-linear buckets.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish()
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let sub = (v >> (exp - SUB_BITS)) - SUB;
    (LINEAR + u64::from(exp - FIRST_EXP) * SUB + sub) as usize
}

/// The lowest value and the width of bucket `i`.
fn bucket_range(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < LINEAR {
        return (i, 1);
    }
    let k = i - LINEAR;
    let exp = FIRST_EXP as u64 + k / SUB;
    let sub = SUB + k % SUB;
    let width = 1u64 << (exp - SUB_BITS as u64);
    (sub * width, width)
}

impl Histogram {
    /// An empty histogram (about 30 KiB of counters).
    pub fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    /// Records one value.
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// Forgets every value, keeping the counters' memory.
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.total = 0;
        self.min = u64::MAX;
        self.max = 0;
        self.sum = 0;
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Adds another histogram's values to this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// The value at quantile `q` (0 ..= 1): the middle of the bucket holding
    /// the sample of rank ⌈q·n⌉, clamped to the observed minimum and maximum
    /// (the first and last ranks are the exact minimum and maximum). `None`
    /// when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        // The extreme ranks are known exactly.
        if rank >= self.total {
            return Some(self.max);
        }
        if rank == 1 {
            return Some(self.min);
        }
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, width) = bucket_range(i);
                return Some((low + width / 2).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// The usual summary, in microseconds.
    pub fn percentiles(&self) -> Percentiles {
        let us = |v: Option<u64>| v.map_or(0.0, |ns| ns as f64 / 1e3);
        Percentiles {
            count: self.total,
            min: if self.total == 0 {
                0.0
            } else {
                self.min as f64 / 1e3
            },
            mean: if self.total == 0 {
                0.0
            } else {
                self.sum as f64 / self.total as f64 / 1e3
            },
            p50: us(self.quantile(0.50)),
            p90: us(self.quantile(0.90)),
            p99: us(self.quantile(0.99)),
            p999: us(self.quantile(0.999)),
            max: us((self.total > 0).then_some(self.max)),
        }
    }
}

/// Percentiles of a latency distribution, in microseconds. All zero when
/// `count` is zero.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Percentiles {
    /// Samples behind the figures.
    pub count: u64,
    /// Smallest sample.
    pub min: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Whether min ≤ p50 ≤ p90 ≤ p99 ≤ p999 ≤ max.
    pub fn is_ordered(&self) -> bool {
        let v = [self.min, self.p50, self.p90, self.p99, self.p999, self.max];
        v.windows(2).all(|w| w[0] <= w[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_forgets_everything() {
        let mut h = Histogram::new();
        for v in [5, 500, 50_000] {
            h.record(v);
        }
        h.clear();
        assert_eq!(h.count(), 0);
        assert_eq!(h.quantile(0.5), None);
        h.record(700);
        assert_eq!(h.quantile(0.0), Some(700));
        assert_eq!(h.quantile(1.0), Some(700));
        assert_eq!(h.percentiles().count, 1);
    }

    #[test]
    fn buckets_tile_the_range() {
        // Every bucket starts where the previous one ended.
        let mut next = 0;
        for i in 0..BUCKETS {
            let (low, width) = bucket_range(i);
            assert_eq!(low, next, "bucket {i}");
            assert_eq!(index(low), i);
            assert_eq!(index(low + (width - 1)), i);
            next = low.wrapping_add(width);
        }
        assert_eq!(next, 0, "the last bucket ends at 2^64");
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_of_a_uniform_distribution() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 1000); // 1 µs .. 100 ms
        }
        let p = h.percentiles();
        assert_eq!(p.count, 100_000);
        assert!(p.is_ordered(), "{p:?}");
        for (got, want) in [
            (p.p50, 50_000.0),
            (p.p90, 90_000.0),
            (p.p99, 99_000.0),
            (p.p999, 99_900.0),
        ] {
            assert!((got - want).abs() / want < 0.016, "got {got} want {want}");
        }
        assert_eq!(p.min, 1.0);
        assert_eq!(p.max, 100_000.0);
        assert!((p.mean - 50_000.5).abs() < 1e-6);
    }

    #[test]
    fn small_values_are_exact_and_quantiles_clamp() {
        let mut h = Histogram::new();
        for v in [5, 5, 5, 7] {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), Some(5));
        assert_eq!(h.quantile(1.0), Some(7));
        assert_eq!(h.quantile(0.0), Some(5));
        let mut one = Histogram::new();
        one.record(1_234_567);
        let p = one.percentiles();
        assert_eq!(p.p50, 1234.567);
        assert_eq!(p.max, 1234.567);
    }

    #[test]
    fn empty_and_merge() {
        let empty = Histogram::new();
        assert_eq!(empty.quantile(0.5), None);
        assert_eq!(empty.percentiles(), Percentiles::default());
        assert!(Percentiles::default().is_ordered());

        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        for v in 0..1000 {
            a.record(v);
            b.record(v + 1000);
        }
        a.merge(&b);
        assert_eq!(a.count(), 2000);
        let p50 = a.quantile(0.5).unwrap();
        assert!((990..=1010).contains(&p50), "{p50}");
        assert_eq!(a.quantile(1.0), Some(1999));
    }
}
