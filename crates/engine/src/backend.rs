//! Choosing the I/O back end at start-up.
//!
//! `auto` takes io_uring where the kernel allows it and falls back to epoll
//! where it does not (Docker's default seccomp profile answers EPERM,
//! `kernel.io_uring_disabled` answers EPERM or ENOSYS, old kernels lack the
//! features the driver needs). The choice and its reason are logged and
//! exported as a metric, so an operator can tell which engine runs and why.

use std::fmt;

/// What the operator asked for (`--io`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// io_uring if it works here, else epoll.
    #[default]
    Auto,
    /// io_uring or fail.
    Uring,
    /// epoll.
    Epoll,
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoMode::Auto),
            "uring" | "io_uring" => Ok(IoMode::Uring),
            "epoll" => Ok(IoMode::Epoll),
            other => Err(format!("expected auto, uring or epoll, got {other:?}")),
        }
    }
}

/// The back end that runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// epoll via mio.
    Epoll,
    /// io_uring.
    Uring,
}

impl Backend {
    /// Short name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Epoll => "epoll",
            Backend::Uring => "uring",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the demanded back end cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// `--io uring` was demanded and io_uring cannot run here.
    #[error("--io uring: io_uring is not usable here: {why}")]
    UringUnavailable {
        /// What the probe found (the kernel's refusal, a seccomp filter).
        why: String,
    },
}

/// The back end for `mode` and why; an error when `uring` was demanded and
/// is not available.
pub fn select(mode: IoMode) -> Result<(Backend, String), BackendError> {
    match mode {
        IoMode::Epoll => Ok((Backend::Epoll, "epoll requested (--io epoll)".into())),
        IoMode::Uring => match crate::uring::probe() {
            Ok(()) => Ok((
                Backend::Uring,
                "io_uring requested (--io uring) and available".into(),
            )),
            Err(why) => Err(BackendError::UringUnavailable { why }),
        },
        IoMode::Auto => match crate::uring::probe() {
            Ok(()) => Ok((Backend::Uring, "io_uring available".into())),
            Err(why) => Ok((
                Backend::Epoll,
                format!("io_uring not usable ({why}); using epoll"),
            )),
        },
    }
}
