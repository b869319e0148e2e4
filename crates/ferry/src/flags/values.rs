//! Values several commands' flags share: Go durations (derper's syntax,
//! also the UDP relay's) and shard counts.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Parses a Go duration ("2s", "10m0s", "1h30m", "250ms", "0").
pub(crate) fn parse_go_duration(s: &str) -> Result<Duration> {
    ferry_proto::godur::parse(s).with_context(|| {
        format!("invalid duration {s:?} (Go syntax: a number and a unit h, m, s, ms, us or ns, as in 10s or 1h30m)")
    })
}

/// A duration flag: `0` means "off" (returns `None`) where `zero_ok`,
/// anything else must lie within `min..=max`.
pub(crate) fn duration_flag(
    flag: &str,
    s: &str,
    zero_ok: bool,
    min: Duration,
    max: Duration,
) -> Result<Option<Duration>> {
    let d = parse_go_duration(s).with_context(|| format!("--{flag}"))?;
    if d.is_zero() {
        if zero_ok {
            return Ok(None);
        }
        bail!("--{flag} {s}: must be more than 0");
    }
    if d < min || d > max {
        bail!(
            "--{flag} {s}: must be between {} and {}{}",
            go_duration(min),
            go_duration(max),
            if zero_ok { " (or 0)" } else { "" }
        );
    }
    Ok(Some(d))
}

/// A duration as Go prints one, for messages and logs: "10ms", "3m0s",
/// "1h0m0s", "0s".
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_micros(1) {
        return format!("{}ns", d.as_nanos());
    }
    if ms == 0 {
        return format!("{}µs", d.as_micros());
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

/// Most shard threads either service accepts.
pub(crate) const MAX_WORKERS: usize = 1024;

/// Checks a shard count against the usable CPUs. Zero and more than
/// [`MAX_WORKERS`] are refused; more than `cpus` is allowed (a test box,
/// a container whose CPU quota is not its CPU set) but returns a warning
/// to log, since shards then share cores and pinned ones double up.
pub(crate) fn check_workers(flag: &str, workers: usize, cpus: usize) -> Result<Option<String>> {
    if workers == 0 {
        bail!("{flag} 0: at least one shard is needed (omit {flag} for one per usable core)");
    }
    if workers > MAX_WORKERS {
        bail!("{flag} {workers}: at most {MAX_WORKERS}");
    }
    Ok((workers > cpus).then(|| {
        format!(
            "{flag} {workers} is more than the {cpus} usable CPU(s): shards will share cores \
             (pinned shards double up), which costs latency and throughput"
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(
            parse_go_duration("10m0s").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(
            parse_go_duration("1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("1x").is_err());
    }

    #[test]
    fn ranges_and_worker_counts() {
        let ms = Duration::from_millis;
        assert_eq!(duration_flag("x", "0", true, ms(1), ms(10)).unwrap(), None);
        assert!(duration_flag("x", "0", false, ms(1), ms(10)).is_err());
        let e = duration_flag("x", "1h", true, ms(10), Duration::from_secs(60))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--x 1h: must be between 10ms and 1m0s (or 0)");
        assert_eq!(go_duration(Duration::from_secs(32767)), "9h6m7s");
        assert_eq!(go_duration(Duration::from_micros(50)), "50µs");
        assert_eq!(go_duration(Duration::from_nanos(5)), "5ns");
        assert!(check_workers("--workers", 0, 2).is_err());
        assert!(check_workers("--workers", 1025, 2).is_err());
        assert_eq!(check_workers("--workers", 2, 2).unwrap(), None);
        assert!(check_workers("--workers", 3, 2).unwrap().is_some());
    }
}
