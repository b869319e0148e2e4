//! The live one-line status on a terminal.
//!
//! When standard error is a terminal (and `--quiet` is not given) the line
//! is redrawn in place at most five times a second; otherwise nothing is
//! printed, so logs and CI output stay clean.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// See the module docs.
pub struct Progress {
    enabled: bool,
    last: Option<Instant>,
    drawn: bool,
}

impl Progress {
    /// A progress line, drawn only if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Self {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            last: None,
            drawn: false,
        }
    }

    /// Redraws the line (rate-limited).
    pub fn show(&mut self, line: &str) {
        if !self.enabled {
            return;
        }
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.last = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.drawn = true;
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
