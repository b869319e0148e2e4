//! A global allocator that counts, for tests proving that a path does not
//! allocate.
//!
//! A test binary installs it with
//! `#[global_allocator] static A: ferry_sys::alloc_count::Counting = ferry_sys::alloc_count::Counting;`
//! and compares [`allocations`] before and after the work it measures.
//! Every call goes straight to the system allocator; the count (and the
//! size of the most recent allocation, for failure messages) is all it
//! adds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static COUNT: AtomicU64 = AtomicU64::new(0);
static LAST_SIZE: AtomicU64 = AtomicU64::new(0);
/// While set, the sizes of allocations go into `SIZES` too.
static RECORDING: AtomicBool = AtomicBool::new(false);
static RECORDED: AtomicU64 = AtomicU64::new(0);
/// How many sizes a recording keeps (the first ones).
pub const RECORDED_SIZES: usize = 32;
static SIZES: [AtomicU64; RECORDED_SIZES] = [const { AtomicU64::new(0) }; RECORDED_SIZES];

/// The counting allocator.
pub struct Counting;

/// Allocations and reallocations so far, in every thread.
pub fn allocations() -> u64 {
    COUNT.load(Ordering::Relaxed)
}

/// Size of the most recent allocation or reallocation.
pub fn last_size() -> u64 {
    LAST_SIZE.load(Ordering::Relaxed)
}

/// Starts recording: from now until [`stop_recording`], allocations are
/// counted apart and the sizes of the first [`RECORDED_SIZES`] kept.
pub fn start_recording() {
    RECORDED.store(0, Ordering::SeqCst);
    RECORDING.store(true, Ordering::SeqCst);
}

/// Stops recording; returns how many allocations happened while it ran and
/// the sizes of the first of them (the list is built after recording
/// stopped, so it is not counted).
pub fn stop_recording() -> (u64, Vec<u64>) {
    RECORDING.store(false, Ordering::SeqCst);
    let n = RECORDED.load(Ordering::SeqCst);
    let sizes = SIZES
        .iter()
        .take(n as usize)
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    (n, sizes)
}

fn note(size: usize) {
    COUNT.fetch_add(1, Ordering::Relaxed);
    LAST_SIZE.store(size as u64, Ordering::Relaxed);
    if RECORDING.load(Ordering::Relaxed) {
        let n = RECORDED.fetch_add(1, Ordering::Relaxed) as usize;
        if let Some(slot) = SIZES.get(n) {
            slot.store(size as u64, Ordering::Relaxed);
        }
    }
}

// SAFETY: every method forwards its arguments unchanged to the system
// allocator and returns its result; counting touches only two atomics,
// never the memory handed out, so the GlobalAlloc contract is System's.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract; passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `alloc_zeroed`'s contract; passed through.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds
        // `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
