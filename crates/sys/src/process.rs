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

/// What the Prometheus process collector reports (derper exports the same
/// names): each `None` where `/proc` does not say.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Virtual memory size in bytes.
    pub virtual_bytes: Option<u64>,
    /// The soft limit on open descriptors.
    pub max_fds: Option<u64>,
    /// The soft limit on address space (`u64::MAX` when unlimited).
    pub virtual_max_bytes: Option<u64>,
    /// Bytes received and sent on the process's network namespace's
    /// interfaces (`/proc/self/net/dev`, loopback included, as the Go
    /// collector counts them).
    pub net_rx_bytes: Option<u64>,
    /// See `net_rx_bytes`.
    pub net_tx_bytes: Option<u64>,
    /// When the machine booted (Unix seconds, `/proc/stat` btime).
    pub boot_time: Option<u64>,
}

/// Reads [`ProcessStats`] from `/proc`.
pub fn process_stats() -> ProcessStats {
    let stat = fs::read_to_string("/proc/self/stat").ok();
    let fields = stat.as_deref().and_then(stat_fields_after_comm);
    // SAFETY: sysconf takes a plain integer and touches no caller memory.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let cpu_seconds = fields.as_ref().and_then(|f| {
        // utime and stime are fields 14 and 15 of stat: 12th and 13th after
        // the command name (field 2) and the state (field 3).
        let utime: f64 = f.get(11)?.parse().ok()?;
        let stime: f64 = f.get(12)?.parse().ok()?;
        (ticks > 0).then(|| (utime + stime) / ticks as f64)
    });
    let virtual_bytes = fields.as_ref().and_then(|f| f.get(20)?.parse().ok());
    let limits = fs::read_to_string("/proc/self/limits").ok();
    let max_fds = limits
        .as_deref()
        .and_then(|l| soft_limit(l, "Max open files"));
    let virtual_max_bytes = limits
        .as_deref()
        .and_then(|l| soft_limit(l, "Max address space"));
    let netdev = fs::read_to_string("/proc/self/net/dev").ok();
    let (net_rx_bytes, net_tx_bytes) = match netdev.as_deref().map(net_dev_totals) {
        Some(Some((rx, tx))) => (Some(rx), Some(tx)),
        _ => (None, None),
    };
    let boot_time = fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
    });
    ProcessStats {
        cpu_seconds,
        virtual_bytes,
        max_fds,
        virtual_max_bytes,
        net_rx_bytes,
        net_tx_bytes,
        boot_time,
    }
}

/// The fields of a `/proc/<pid>/stat` line after the command name (which
/// may hold spaces and parentheses): state first.
fn stat_fields_after_comm(stat: &str) -> Option<Vec<String>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_ascii_whitespace().map(str::to_owned).collect())
}

/// A soft limit from `/proc/<pid>/limits` ("unlimited" is `u64::MAX`).
fn soft_limit(limits: &str, name: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with(name))?;
    match line[name.len()..].split_ascii_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        v => v.parse().ok(),
    }
}

/// Received and transmitted bytes summed over every interface of
/// `/proc/net/dev`.
fn net_dev_totals(dev: &str) -> Option<(u64, u64)> {
    let mut rx = 0u64;
    let mut tx = 0u64;
    for line in dev.lines().skip(2) {
        let (_, counters) = line.split_once(':')?;
        let f: Vec<&str> = counters.split_ascii_whitespace().collect();
        rx += f.first()?.parse::<u64>().ok()?;
        tx += f.get(8)?.parse::<u64>().ok()?;
    }
    Some((rx, tx))
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
    fn proc_formats() {
        let stat =
            "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 123 987654 10";
        let f = stat_fields_after_comm(stat).unwrap();
        assert_eq!(f[0], "S");
        assert_eq!(f[11], "250");
        assert_eq!(f[12], "50");
        assert_eq!(f[20], "987654");
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\nMax address space         unlimited            unlimited            bytes\n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1_048_576));
        assert_eq!(soft_limit(limits, "Max address space"), Some(u64::MAX));
        let dev = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  eth0: 2000      20    0    0    0     0          0         0     3000      30    0    0    0     0       0          0\n";
        assert_eq!(net_dev_totals(dev), Some((3000, 4000)));
    }

    #[test]
    fn process_stats_read_this_process() {
        let s = process_stats();
        assert!(s.cpu_seconds.is_some_and(|c| c >= 0.0));
        assert!(s.virtual_bytes.is_some_and(|v| v > 0));
        assert!(s.max_fds.is_some_and(|m| m > 0));
        assert!(s.boot_time.is_some_and(|b| b > 1_000_000_000));
    }

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
