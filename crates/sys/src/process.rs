//! Self-observation: resident memory and open descriptors for metrics, and
//! whether the process runs as root (for its default paths).
//!
//! Both read `/proc/self`, which is cheap enough for a metrics scrape but not
//! for a data path. They return `None` rather than an error when `/proc` is
//! missing or unreadable (some sandboxes), since a missing gauge is not worth
//! failing a scrape over.

use std::fs;

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn rss_bytes() -> Option<u64> {
    let statm = fs::read_to_string("/proc/self/statm").ok()?;
    let pages = resident_pages(&statm)?;
    pages.checked_mul(page_size()?)
}

/// Number of file descriptors this process has open, from `/proc/self/fd`.
pub fn open_fds() -> Option<u64> {
    // Listing the directory itself holds one descriptor open, which shows up
    // in the listing; it is not counted.
    let entries = fs::read_dir("/proc/self/fd").ok()?;
    let count = entries.filter(|e| e.is_ok()).count() as u64;
    Some(count.saturating_sub(1))
}

/// Extracts the resident page count, the second field of a statm line
/// (`size resident shared text lib data dt`).
fn resident_pages(statm: &str) -> Option<u64> {
    statm.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// The system page size in bytes.
fn page_size() -> Option<u64> {
    // SAFETY: sysconf takes a plain integer and touches no caller memory.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0)
}

/// Whether the process's effective user is root.
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) takes no arguments, touches no memory and cannot
    // fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statm_second_field_is_resident_pages() {
        assert_eq!(resident_pages("1000 250 100 10 0 500 0\n"), Some(250));
        assert_eq!(resident_pages("1000"), None);
        assert_eq!(resident_pages("1000 x 1"), None);
        assert_eq!(resident_pages(""), None);
    }

    #[test]
    fn rss_is_plausible_and_grows_with_touched_memory() {
        let before = rss_bytes().unwrap();
        assert!(before > 0);
        assert_eq!(before % page_size().unwrap(), 0);
        // Touch 64 MiB so it becomes resident, then look again.
        let block = vec![1u8; 64 << 20];
        let after = rss_bytes().unwrap();
        assert!(
            after >= before + (32 << 20),
            "rss {before} -> {after} after touching 64 MiB"
        );
        drop(std::hint::black_box(block));
    }

    #[test]
    fn open_fds_tracks_opened_and_closed_files() {
        // Other tests run in parallel threads and open a file or two for a
        // moment, so allow some slack rather than demanding exact counts.
        const OPENED: u64 = 64;
        const SLACK: u64 = 8;
        let before = open_fds().unwrap();
        assert!(before >= 3, "stdin, stdout, stderr at least: {before}");
        let files: Vec<_> = (0..OPENED)
            .map(|_| fs::File::open("/proc/self/statm").unwrap())
            .collect();
        let during = open_fds().unwrap();
        drop(files);
        let after = open_fds().unwrap();
        assert!(during + SLACK >= before + OPENED, "{before} -> {during}");
        assert!(after + OPENED <= during + SLACK, "{during} -> {after}");
    }
}
