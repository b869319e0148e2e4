//! The allocator's policy for a long-running relay: memory that load took
//! is given back when the load is gone.
//!
//! A receiver's queue and send buffer grow to its queue cap (1 MiB) in
//! bursts and are dropped again when it is quiet. With glibc's defaults the
//! threshold for separate mappings rises to the size of each such buffer
//! freed, so from then on buffers of that size come from the arenas, which
//! grow with the churn and keep what was freed in their middle: resident
//! memory climbs in steps under steady load and stays after it. With the
//! threshold fixed ([`tune`]) large buffers are mapped and unmapped on
//! their own; what is left free in the arenas after a load is returned by
//! a low-priority thread ([`spawn_trimmer`]) once it is worth a trim.

use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use ferry_sys::heap::{self, HeapStats};

/// Allocations from this size get mappings of their own: per-connection
/// queues and send buffers past their first 64 KiB step, never a packet
/// or a TLS record.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Free memory at the top of an arena that `free` leaves in place. Fixing
/// the mmap threshold would also fix this one at glibc's 128 KiB, and the
/// shard's arena would then shrink and grow (page faults, zeroed pages) on
/// every few flushes under load: a fifth of the shard's cycles in a TLS
/// profile. It must stay modest all the same: `malloc_trim` returns the
/// free pages inside a thread's arena but not its top, which only `free`
/// gives back, past this threshold.
pub const TRIM_THRESHOLD: usize = 16 << 20;

/// How often the trimmer looks at the heap.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Free arena memory below this is never worth a trim.
const TRIM_FLOOR: u64 = 8 << 20;

/// Fixes the allocator's mapping threshold at [`MMAP_THRESHOLD`] and its
/// trim threshold at [`TRIM_THRESHOLD`], each unless the operator set
/// glibc's own tunable for it in the environment (`MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`). Returns whether both were set here.
pub fn tune() -> bool {
    let set = |var: &str, f: fn(usize) -> bool, v: usize| std::env::var_os(var).is_none() && f(v);
    let mmap = set(
        "MALLOC_MMAP_THRESHOLD_",
        heap::set_mmap_threshold,
        MMAP_THRESHOLD,
    );
    let trim = set(
        "MALLOC_TRIM_THRESHOLD_",
        heap::set_trim_threshold,
        TRIM_THRESHOLD,
    );
    mmap && trim
}

/// Whether the arenas hold enough free memory to give back: more than the
/// floor and more than a quarter of what is in use. Under steady load the
/// free share stays small (freed blocks are reused at once); it grows when
/// load drops.
pub fn worth_trimming(s: &HeapStats) -> bool {
    s.free > TRIM_FLOOR && s.free > s.in_use / 4
}

/// Trims the heap if [`worth_trimming`]: `None` if it was not, else
/// whether the allocator gave any memory back.
pub fn trim_if_worth_it() -> Option<bool> {
    heap::heap_stats()
        .filter(worth_trimming)
        .map(|_| heap::trim())
}

/// Starts a thread that calls [`trim_if_worth_it`] every `every`, off the
/// shards' path; it lives as long as the process.
pub fn spawn_trimmer(every: Duration) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ferry-heap".to_owned())
        .spawn(move || loop {
            std::thread::sleep(every);
            trim_if_worth_it();
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(in_use: u64, free: u64) -> HeapStats {
        HeapStats {
            in_use,
            free,
            arena: in_use + free,
            mmapped: 0,
        }
    }

    #[test]
    fn trims_only_what_is_worth_it() {
        let mib = 1 << 20;
        // Steady load: a little free beside a lot in use.
        assert!(!worth_trimming(&stats(200 * mib, 6 * mib)));
        assert!(!worth_trimming(&stats(200 * mib, 40 * mib)));
        // After the load: mostly free.
        assert!(worth_trimming(&stats(2 * mib, 13 * mib)));
        assert!(worth_trimming(&stats(100 * mib, 30 * mib)));
        // Small heaps are left alone.
        assert!(!worth_trimming(&stats(mib / 2, 7 * mib)));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn tune_sets_both_thresholds_unless_the_environment_did() {
        let by_env = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
            || std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some();
        assert_eq!(tune(), !by_env);
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn memory_freed_in_a_thread_is_given_back() {
        // Blocks below the threshold, allocated and freed by another
        // thread (its own arena), interleaved with blocks it keeps so the
        // free ones are not all at the top of the heap.
        let kept = std::thread::spawn(|| {
            let mut keep = Vec::new();
            let mut drop_later = Vec::new();
            for i in 0..2048u32 {
                let b = vec![i as u8; 16 * 1024];
                if i % 16 == 0 {
                    keep.push(b);
                } else {
                    drop_later.push(b);
                }
            }
            drop(drop_later);
            let before = heap::heap_stats().expect("glibc");
            assert_eq!(trim_if_worth_it(), Some(true), "{before:?}");
            keep.len()
        })
        .join()
        .expect("thread");
        assert_eq!(kept, 128);
    }
}
