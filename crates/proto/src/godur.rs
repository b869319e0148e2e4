//! Go's duration syntax (`time.ParseDuration`), which derper's flags use and
//! Ferry's flags and config files accept: a sequence of decimal numbers,
//! each with a unit `h`, `m`, `s`, `ms`, `us` (or `µs`), `ns` — "10s",
//! "1h30m", "250ms", "1.5s" — or a bare "0". Negative durations are not
//! accepted (no Ferry setting has a use for them).

use std::time::Duration;

/// Parses a Go duration; `None` if `s` is not one or does not fit a
/// [`Duration`].
pub fn parse(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse("10m0s"), Some(Duration::from_secs(600)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse("20µs"), Some(Duration::from_micros(20)));
        assert_eq!(parse(" 0 "), Some(Duration::ZERO));
    }

    #[test]
    fn rejects_what_go_rejects_or_overflows() {
        for bad in [
            "",
            "5",
            "1x",
            "s",
            "1..5s",
            "-1s",
            "99999999999999999999999h",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
