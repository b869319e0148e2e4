//! Watching a process from outside through `/proc`: CPU time, resident
//! memory, open descriptors. Used for the server under test (given its pid)
//! and for ferry-bench itself, to show whether the load generator was the
//! bottleneck.

use std::fs;

/// The kernel's fixed unit for CPU times in `/proc/<pid>/stat` (USER_HZ).
const TICKS_PER_SECOND: f64 = 100.0;

fn proc_path(pid: Option<u32>, file: &str) -> String {
    match pid {
        Some(p) => format!("/proc/{p}/{file}"),
        None => format!("/proc/self/{file}"),
    }
}

/// User + system CPU seconds consumed by the process so far (all threads).
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    parse_stat_cpu(&fs::read_to_string(proc_path(pid, "stat")).ok()?)
}

/// Extracts utime + stime from the text of `/proc/<pid>/stat`.
pub fn parse_stat_cpu(stat: &str) -> Option<f64> {
    // The command name is in parentheses and may contain anything, so count
    // fields after the last ')'. Field 3 (state) comes first there; utime
    // and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SECOND)
}

/// Resident set size in bytes.
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    parse_status_rss(&fs::read_to_string(proc_path(pid, "status")).ok()?)
}

/// Extracts `VmRSS` (in bytes) from the text of `/proc/<pid>/status`.
pub fn parse_status_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Number of open file descriptors.
pub fn open_fds(pid: Option<u32>) -> Option<u64> {
    Some(fs::read_dir(proc_path(pid, "fd")).ok()?.count() as u64)
}

/// Whether a process with this pid exists.
pub fn exists(pid: u32) -> bool {
    fs::metadata(format!("/proc/{pid}")).is_ok()
}

/// The machine's CPU counters from `/proc/stat`, in seconds summed over
/// all CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineCpu {
    /// Time in processes: user, nice and system. Interrupt and softirq
    /// time is left out: on loopback the network stack's work for the
    /// benchmark's own packets runs there, and it is not "other work".
    pub busy_s: f64,
    /// Time stolen by the hypervisor.
    pub steal_s: f64,
    /// Every field, idle included: over a window this should be the window
    /// times the CPUs; less means the whole machine stood still.
    pub total_s: f64,
    /// Number of CPUs listed.
    pub cpus: usize,
}

/// Reads the machine's CPU counters.
pub fn machine_cpu() -> Option<MachineCpu> {
    parse_proc_stat(&fs::read_to_string("/proc/stat").ok()?)
}

/// Parses the `cpu` lines of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<MachineCpu> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest
    // time is already inside user and nice.
    let get = |i: usize| v.get(i).copied().unwrap_or(0.0);
    let cpus = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    Some(MachineCpu {
        busy_s: (get(0) + get(1) + get(2)) / TICKS_PER_SECOND,
        steal_s: get(7) / TICKS_PER_SECOND,
        total_s: (0..8).map(get).sum::<f64>() / TICKS_PER_SECOND,
        cpus: cpus.max(1),
    })
}

/// CPU seconds and RSS of one process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// CPU seconds so far.
    pub cpu_s: f64,
    /// Resident bytes.
    pub rss: u64,
}

/// Samples `pid` (or this process).
pub fn sample(pid: Option<u32>) -> Sample {
    Sample {
        cpu_s: cpu_seconds(pid).unwrap_or(0.0),
        rss: rss_bytes(pid).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_and_status() {
        let stat =
            "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 1 1";
        assert_eq!(parse_stat_cpu(stat), Some(3.0));
        assert_eq!(parse_stat_cpu("garbage"), None);
        let status = "Name:\tferry\nVmPeak:\t  1000 kB\nVmRSS:\t   2048 kB\nThreads:\t3\n";
        assert_eq!(parse_status_rss(status), Some(2048 * 1024));
        assert_eq!(parse_status_rss("Name: x\n"), None);
    }

    #[test]
    fn parses_proc_stat() {
        let text = "cpu  100 10 50 1000 5 3 2 7 0 0\ncpu0 50 5 25 500 2 1 1 3 0 0\ncpu1 50 5 25 500 3 2 1 4 0 0\nintr 1\n";
        let m = parse_proc_stat(text).unwrap();
        assert!((m.busy_s - 1.6).abs() < 1e-9);
        assert!((m.steal_s - 0.07).abs() < 1e-9);
        assert!((m.total_s - 11.77).abs() < 1e-9);
        assert_eq!(m.cpus, 2);
        assert!(machine_cpu().is_some());
    }

    #[test]
    fn reads_this_process() {
        assert!(rss_bytes(None).unwrap() > 0);
        assert!(cpu_seconds(None).is_some());
        assert!(open_fds(None).unwrap() >= 3);
        assert!(exists(std::process::id()));
    }
}
