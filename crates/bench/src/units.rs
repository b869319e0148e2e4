//! Quantities on the command line: offered rates and durations.
//!
//! Rates are decimal (SI) bits per second of DERP packet payload, the unit
//! network people quote: `500M` is 500 000 000 bit/s. A `pps` suffix gives
//! packets per second instead, and `max` means "as fast as the server
//! accepts" (the sender is then limited only by TCP flow control).

use std::fmt;
use std::time::Duration;

/// An offered rate for one flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// No pacing: keep the connection's send buffer full.
    Max,
    /// Bits per second of packet payload.
    Bits(f64),
    /// Packets per second.
    Packets(f64),
}

impl Rate {
    /// Packets per second for `packet_size`-byte packets; `None` for [`Rate::Max`].
    pub fn pps(&self, packet_size: usize) -> Option<f64> {
        match *self {
            Rate::Max => None,
            Rate::Bits(bps) => Some(bps / (8.0 * packet_size.max(1) as f64)),
            Rate::Packets(pps) => Some(pps),
        }
    }

    /// Megabits per second for `packet_size`-byte packets; `None` for [`Rate::Max`].
    pub fn mbps(&self, packet_size: usize) -> Option<f64> {
        self.pps(packet_size)
            .map(|pps| pps * packet_size as f64 * 8.0 / 1e6)
    }

    /// This rate divided `n` ways (a total split over flows).
    pub fn split(&self, n: usize) -> Rate {
        let n = n.max(1) as f64;
        match *self {
            Rate::Max => Rate::Max,
            Rate::Bits(b) => Rate::Bits(b / n),
            Rate::Packets(p) => Rate::Packets(p / n),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rate::Max => f.write_str("max"),
            Rate::Bits(b) => write!(f, "{}M", b / 1e6),
            Rate::Packets(p) => write!(f, "{p}pps"),
        }
    }
}

/// Parses `max`, `0`, `250M`, `1.5G`, `800Mbit`, `20k`, `5000pps`, `10kpps`.
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    if lower == "max" || lower == "unlimited" || lower == "0" {
        return Ok(Rate::Max);
    }
    let (body, packets) = match lower.strip_suffix("pps") {
        Some(b) => (b, true),
        None => (
            lower
                .strip_suffix("bit/s")
                .or_else(|| lower.strip_suffix("bps"))
                .or_else(|| lower.strip_suffix("bit"))
                .unwrap_or(&lower),
            false,
        ),
    };
    let (num, mult) = split_si(body);
    let value: f64 = num.parse().map_err(|_| {
        format!("rate {t:?}: expected a number with an optional k/M/G suffix, `pps`, or `max`")
    })?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!(
            "rate {t:?}: must be positive (use `max` for no pacing)"
        ));
    }
    let v = value * mult;
    Ok(if packets {
        Rate::Packets(v)
    } else {
        Rate::Bits(v)
    })
}

fn split_si(body: &str) -> (&str, f64) {
    match body.as_bytes().last() {
        Some(b'k') => (&body[..body.len() - 1], 1e3),
        Some(b'm') => (&body[..body.len() - 1], 1e6),
        Some(b'g') => (&body[..body.len() - 1], 1e9),
        _ => (body, 1.0),
    }
}

/// Parses `5s`, `500ms`, `250us`, `2m`, `1.5s` (Go's syntax); a bare
/// number is seconds. At most 24 h.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let d = match t.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::try_from_secs_f64(secs).ok(),
        Ok(_) => None,
        Err(_) => ferry_proto::godur::parse(t),
    }
    .ok_or_else(|| format!("duration {t:?}: expected a number with s, ms, us, m or h"))?;
    if d > Duration::from_secs(86_400) {
        return Err(format!("duration {t:?}: out of range (0 ..= 24 h)"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("max").unwrap(), Rate::Max);
        assert_eq!(parse_rate("0").unwrap(), Rate::Max);
        assert_eq!(parse_rate("250M").unwrap(), Rate::Bits(250e6));
        assert_eq!(parse_rate("1.5G").unwrap(), Rate::Bits(1.5e9));
        assert_eq!(parse_rate("800Mbit").unwrap(), Rate::Bits(800e6));
        assert_eq!(parse_rate("10kpps").unwrap(), Rate::Packets(10e3));
        assert_eq!(parse_rate("5000pps").unwrap(), Rate::Packets(5000.0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-5M").is_err());
    }

    #[test]
    fn rate_conversions() {
        let r = Rate::Bits(1400.0 * 8.0 * 1000.0);
        assert!((r.pps(1400).unwrap() - 1000.0).abs() < 1e-9);
        assert!((r.mbps(1400).unwrap() - 11.2).abs() < 1e-9);
        assert_eq!(r.split(4), Rate::Bits(1400.0 * 2000.0));
        assert_eq!(Rate::Max.pps(1400), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("1000000s").is_err());
    }
}
