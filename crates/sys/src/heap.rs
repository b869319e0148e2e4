//! The C allocator's own account of the heap (glibc malloc), and giving
//! its free memory back to the system.
//!
//! Resident memory alone cannot tell a process that holds more from one
//! whose allocator holds freed memory it has not returned (fragmentation,
//! per-thread arenas). `mallinfo2` splits the two; `malloc_trim` returns
//! free pages of every arena. Both walk all arenas under their locks: fine
//! for a metrics scrape or a quiet moment, not for a data path.

/// Heap figures from `mallinfo2`, bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HeapStats {
    /// Allocated and not freed (in arenas and in separate mappings).
    pub in_use: u64,
    /// Freed but still held by the allocator's arenas.
    pub free: u64,
    /// Obtained from the system for the arenas (`sbrk` and arena mappings).
    pub arena: u64,
    /// In separate mappings for large allocations.
    pub mmapped: u64,
}

/// The heap now, where the C library is glibc; `None` elsewhere.
pub fn heap_stats() -> Option<HeapStats> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments, returns a struct by value
        // and only reads the allocator's state under its own locks.
        let m = unsafe { libc::mallinfo2() };
        Some(HeapStats {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
            arena: m.arena as u64,
            mmapped: m.hblkhd as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Fixes the size from which allocations get mappings of their own
/// (`M_MMAP_THRESHOLD`), which also stops glibc from raising it (and the
/// trim threshold) each time such a mapping is freed; `true` if set. A no-op
/// (`false`) outside glibc.
pub fn set_mmap_threshold(bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        mallopt(libc::M_MMAP_THRESHOLD, bytes)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = bytes;
        false
    }
}

/// Fixes how much free memory at the top of an arena `free` leaves in
/// place before giving it back (`M_TRIM_THRESHOLD`); `true` if set. A no-op
/// (`false`) outside glibc.
pub fn set_trim_threshold(bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        mallopt(libc::M_TRIM_THRESHOLD, bytes)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = bytes;
        false
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallopt(param: libc::c_int, bytes: usize) -> bool {
    let Ok(v) = libc::c_int::try_from(bytes) else {
        return false;
    };
    // SAFETY: mallopt only changes the allocator's parameters under its own
    // lock; an out-of-range value is refused with 0.
    unsafe { libc::mallopt(param, v) == 1 }
}

/// Returns the free memory of every arena that the allocator can give back
/// to the system; `true` if any was. A no-op (`false`) outside glibc.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only takes the allocator's locks and releases
        // pages that hold no live allocation; 0 keeps no padding.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One allocate-and-free cycle's samples: before, with 64 blocks of
    /// 64 KiB held, after freeing them.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn cycle() -> (HeapStats, HeapStats, HeapStats) {
        let before = heap_stats().expect("glibc");
        // Below the mmap threshold, so it comes from an arena.
        let blocks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 * 1024]).collect();
        let held = heap_stats().expect("glibc");
        drop(blocks);
        let freed = heap_stats().expect("glibc");
        (before, held, freed)
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_live_allocation_is_in_use_and_a_freed_one_can_be_trimmed() {
        // The figures are the whole process's, and the other tests of this
        // binary allocate and free on their threads meanwhile (one freed a
        // 1 MiB mapping between two samples once): a cycle that shows both
        // the growth and the drop passes; at most 10 are tried, and all of
        // them are shown when none does.
        let mut tried = Vec::new();
        let (held, freed) = loop {
            let (before, held, freed) = cycle();
            let grew = held.in_use >= before.in_use + 60 * 64 * 1024;
            let dropped = freed.in_use + 60 * 64 * 1024 <= held.in_use;
            if grew && dropped {
                break (held, freed);
            }
            tried.push((before, held, freed));
            assert!(
                tried.len() < 10,
                "no cycle showed 64 live blocks of 64 KiB in use and then freed: {tried:#?}"
            );
        };
        assert!(held.arena >= held.in_use - held.mmapped);
        trim();
        let trimmed = heap_stats().expect("glibc");
        assert!(trimmed.free <= freed.free, "{freed:?} -> {trimmed:?}");
    }
}
