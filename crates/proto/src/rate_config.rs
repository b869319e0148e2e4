//! derper's per-client rate limit file (`--rate-config`).
//!
//! The file is one JSON object, read with Go's rules (keys match without
//! regard to case, unknown keys are ignored, `null` changes nothing):
//!
//! ```json
//! {"PerClientRateLimitBytesPerSec": 2000000, "PerClientRateBurstBytes": 131072}
//! ```
//!
//! Both values are unsigned integers; a rate of 0 (or none) turns limiting
//! off, and a burst below [`MIN_BURST`] is raised to it, so that the largest
//! frame a client may send always fits in the bucket.

use serde::de::{IgnoredAny, MapAccess};

use crate::frame::{KEY_LEN, MAX_PACKET_SIZE};
use crate::json::{self, FieldSink};

/// The smallest burst applied: one full `sendPacket` (key and packet).
pub const MIN_BURST: u64 = (MAX_PACKET_SIZE + KEY_LEN) as u64;

/// Per-client limits on what the relay reads from each client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateConfig {
    /// Bytes per second; 0 is no limit.
    pub bytes_per_sec: u64,
    /// Bucket depth in bytes.
    pub burst_bytes: u64,
}

/// Why a rate file was refused; names the problem as the decoder saw it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rate config is not a JSON object of unsigned integers: {0}")]
pub struct RateConfigError(pub String);

impl RateConfig {
    /// Reads a rate file's contents and returns the limits as applied
    /// (see [`RateConfig::applied`]).
    pub fn parse(bytes: &[u8]) -> Result<RateConfig, RateConfigError> {
        json::decode_object::<Fields>(bytes)
            .map(|f| {
                RateConfig {
                    bytes_per_sec: f.rate,
                    burst_bytes: f.burst,
                }
                .applied()
            })
            .map_err(|e| RateConfigError(e.to_string()))
    }

    /// The limits derper applies for these values: all zero when the rate
    /// is 0, otherwise the burst raised to at least [`MIN_BURST`].
    pub fn applied(self) -> RateConfig {
        if self.bytes_per_sec == 0 {
            RateConfig::default()
        } else {
            RateConfig {
                burst_bytes: self.burst_bytes.max(MIN_BURST),
                ..self
            }
        }
    }

    /// Whether clients are limited at all.
    pub fn is_limited(&self) -> bool {
        self.bytes_per_sec != 0
    }
}

#[derive(Default)]
struct Fields {
    rate: u64,
    burst: u64,
}

impl FieldSink for Fields {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let slot = match key {
            "perclientratelimitbytespersec" => &mut self.rate,
            "perclientrateburstbytes" => &mut self.burst,
            _ => {
                map.next_value::<IgnoredAny>()?;
                return Ok(());
            }
        };
        if let Some(v) = map.next_value::<Option<u64>>()? {
            *slot = v;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_derper_reads_and_applies_it() {
        let rc = |s: &str| RateConfig::parse(s.as_bytes());
        assert_eq!(
            rc(r#"{"PerClientRateLimitBytesPerSec": 2000000, "PerClientRateBurstBytes": 131072}"#),
            Ok(RateConfig {
                bytes_per_sec: 2_000_000,
                burst_bytes: 131_072
            })
        );
        // Burst raised to one full frame; any case; unknown keys ignored.
        assert_eq!(
            rc(r#"{"perclientratelimitbytespersec": 1000, "Comment": "x"}"#),
            Ok(RateConfig {
                bytes_per_sec: 1000,
                burst_bytes: 65_568
            })
        );
        // Rate 0 is off, whatever the burst.
        assert_eq!(
            rc(r#"{"PerClientRateBurstBytes": 5}"#),
            Ok(RateConfig::default())
        );
        assert_eq!(rc("{}"), Ok(RateConfig::default()));
        assert_eq!(rc("null"), Ok(RateConfig::default()));
        assert!(!rc("{}").unwrap().is_limited());
    }

    #[test]
    fn bad_files_are_refused() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"PerClientRateLimitBytesPerSec": -1}"#,
            r#"{"PerClientRateLimitBytesPerSec": 1.5}"#,
            r#"{"PerClientRateLimitBytesPerSec": 1e6}"#,
            r#"{"PerClientRateLimitBytesPerSec": 1000.0}"#,
            r#"{"PerClientRateLimitBytesPerSec": "100"}"#,
            r#"{"PerClientRateLimitBytesPerSec": 18446744073709551616}"#,
            r#"{} {}"#,
        ] {
            assert!(RateConfig::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
