//! A value that a control thread replaces while shards run: the hub's
//! settings after a reload ([`crate::live`]), a bounce target's address
//! after the resolver moved it ([`crate::shard::TargetCell`]).
//!
//! The writer publishes a new value and bumps the generation; a reader
//! keeps the generation it last took and compares it once per turn (one
//! atomic load, none per packet), taking the lock only when it changed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A value a control thread replaces (the reload's settings, the
/// resolver's bounce target address) and shards read when its generation
/// changes.
#[derive(Debug)]
pub struct Published<T> {
    generation: AtomicU64,
    value: Mutex<Arc<T>>,
}

impl<T> Published<T> {
    /// A cell holding `value`, at generation 0.
    pub fn new(value: T) -> Self {
        Published {
            generation: AtomicU64::new(0),
            value: Mutex::new(Arc::new(value)),
        }
    }

    /// Publishes a new value.
    pub fn set(&self, value: T) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes each time a value is published.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_tells_new_values_by_generation() {
        let cell = Published::new(1);
        let seen = cell.generation();
        assert_eq!(*cell.get(), 1);
        cell.set(2);
        assert_ne!(cell.generation(), seen);
        assert_eq!(*cell.get(), 2);
    }
}
