//! CPU affinity: the set of CPUs the process may use, and pinning the calling
//! thread to one of them.
//!
//! Shards pin themselves so that a connection's buffers stay in one core's
//! cache. The CPUs to choose from come from the process's own affinity mask
//! rather than from the machine's CPU count, so `taskset`, cpusets and
//! container CPU limits are respected.
//!
//! The kernel's affinity mask is an array of `unsigned long` words where bit
//! `n % BITS` of word `n / BITS` stands for CPU `n`. `libc::cpu_set_t` fixes
//! the array at 1024 CPUs; the calls here use a growable buffer instead so that
//! larger machines work too.

use std::io;
use std::mem::size_of;

use libc::c_ulong;

/// Bits in one word of an affinity mask.
const WORD_BITS: usize = c_ulong::BITS as usize;

/// Initial mask size in CPUs (the size of `cpu_set_t`).
const INITIAL_CPUS: usize = 1024;

/// Largest mask tried before giving up (the kernel's `NR_CPUS` upper bound).
const MAX_CPUS: usize = 1 << 16;

/// Pins the calling thread to `cpu`.
///
/// Fails with `EINVAL` when `cpu` is not online or not in the process's
/// allowed set (the kernel refuses masks with no usable CPU).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= MAX_CPUS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} is beyond the largest supported index {MAX_CPUS}"),
        ));
    }
    let words = (cpu / WORD_BITS + 1).max(INITIAL_CPUS / WORD_BITS);
    let mut mask = vec![0 as c_ulong; words];
    mask[cpu / WORD_BITS] |= 1 << (cpu % WORD_BITS);
    // SAFETY: `mask` is a live, properly aligned buffer of `words` c_ulongs
    // and we pass its exact byte length; the kernel only reads that many
    // bytes. `cpu_set_t` is itself an array of c_ulong, so the pointer cast
    // matches the layout the call expects. pid 0 means the calling thread.
    let rc = unsafe {
        libc::sched_setaffinity(
            0,
            words * size_of::<c_ulong>(),
            mask.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The CPUs this process may run on, in ascending order.
///
/// Reads the affinity mask of the process's main thread, so a shard that has
/// already pinned itself does not narrow the answer (as long as the main
/// thread is never pinned). Returns an empty vector only if the kernel call
/// fails, which should not happen on Linux.
pub fn available_cpus() -> Vec<usize> {
    match process_mask() {
        Ok(mask) => cpus_in_mask(&mask),
        Err(_) => Vec::new(),
    }
}

/// Reads the main thread's affinity mask, growing the buffer until the kernel
/// accepts its size (it rejects buffers smaller than its own `nr_cpu_ids`).
fn process_mask() -> io::Result<Vec<c_ulong>> {
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    let mut cpus = INITIAL_CPUS;
    loop {
        let words = cpus / WORD_BITS;
        let mut mask = vec![0 as c_ulong; words];
        // SAFETY: `mask` is a live, properly aligned, writable buffer of
        // `words` c_ulongs and we pass its exact byte length, so the kernel
        // (and glibc, which zero-fills the tail) write only inside it. The
        // cast matches `cpu_set_t`'s layout, an array of c_ulong.
        let rc = unsafe {
            libc::sched_getaffinity(
                pid,
                words * size_of::<c_ulong>(),
                mask.as_mut_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        if rc == 0 {
            return Ok(mask);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) && cpus < MAX_CPUS {
            cpus *= 2;
            continue;
        }
        return Err(err);
    }
}

/// Lists the CPU numbers whose bits are set in `mask`.
fn cpus_in_mask(mask: &[c_ulong]) -> Vec<usize> {
    let mut cpus = Vec::new();
    for (i, &word) in mask.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let bit = bits.trailing_zeros() as usize;
            cpus.push(i * WORD_BITS + bit);
            bits &= bits - 1;
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the calling thread's mask (pid 0), for checking a pin took.
    fn thread_cpus() -> Vec<usize> {
        let words = INITIAL_CPUS / WORD_BITS;
        let mut mask = vec![0 as c_ulong; words];
        // SAFETY: as in `process_mask`: an owned, aligned buffer of the
        // stated byte length.
        let rc = unsafe {
            libc::sched_getaffinity(
                0,
                words * size_of::<c_ulong>(),
                mask.as_mut_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        cpus_in_mask(&mask)
    }

    #[test]
    fn mask_bits_map_to_cpu_numbers() {
        let mut mask = vec![0 as c_ulong; 2];
        mask[0] = 0b1011;
        mask[1] = 1 << 3;
        assert_eq!(cpus_in_mask(&mask), vec![0, 1, 3, WORD_BITS + 3]);
        assert!(cpus_in_mask(&[0, 0]).is_empty());
    }

    #[test]
    fn available_cpus_is_sorted_and_nonempty() {
        let cpus = available_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        // std derives its answer from the same mask, further cut by any
        // cgroup CPU quota, so it can only be smaller.
        let parallelism = std::thread::available_parallelism().unwrap().get();
        assert!(cpus.len() >= parallelism, "{cpus:?} vs {parallelism}");
    }

    #[test]
    fn pinning_narrows_only_the_calling_thread() {
        let before = available_cpus();
        let target = *before.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(target).unwrap();
            assert_eq!(thread_cpus(), vec![target]);
        })
        .join()
        .unwrap();
        // The process-wide answer is unchanged by a pinned worker thread.
        assert_eq!(available_cpus(), before);
    }

    #[test]
    fn pinning_to_a_cpu_outside_the_mask_fails() {
        std::thread::spawn(|| {
            let huge = MAX_CPUS - 1;
            let err = pin_current_thread(huge).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
            assert!(pin_current_thread(MAX_CPUS).is_err());
        })
        .join()
        .unwrap();
    }
}
