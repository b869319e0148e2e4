//! `/healthz`: whether a relay is serving, for load balancers and
//! orchestrators. One rendering for both services: the DERP server answers
//! it on its DERP listener, the port-80 companion and `--metrics-addr`
//! (`ferry_derp::health`); `ferry udp-relay` on its `--metrics-addr`.
//! Any client may ask: it reveals no more than a home page. The body is
//! one JSON object:
//!
//! ```json
//! {"status":"ok","version":"0.1.0","backend":"uring","uptime_seconds":42}
//! ```
//!
//! with `200 OK` while the relay serves, and `"status":"draining"` with
//! `503 Service Unavailable` from the moment a graceful shutdown begins, so
//! a balancer stops sending new clients first.

use std::time::Duration;

use serde::Serialize;

/// The relay's health at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    /// A graceful shutdown has begun.
    pub draining: bool,
    /// The I/O back end in use (`uring` or `epoll`).
    pub backend: &'static str,
    /// Time since the relay started.
    pub uptime: Duration,
}

#[derive(Serialize)]
struct Body<'a> {
    status: &'a str,
    version: &'a str,
    backend: &'a str,
    uptime_seconds: u64,
}

impl Health {
    /// The HTTP status code this state is reported with.
    pub fn status_code(&self) -> u16 {
        if self.draining {
            503
        } else {
            200
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        let body = Body {
            status: if self.draining { "draining" } else { "ok" },
            version: env!("CARGO_PKG_VERSION"),
            backend: self.backend,
            uptime_seconds: self.uptime.as_secs(),
        };
        let mut text = serde_json::to_string(&body).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The whole HTTP response (never cached).
    pub fn response(&self) -> Vec<u8> {
        let (code, reason) = match self.status_code() {
            200 => (200, "OK"),
            _ => (503, "Service Unavailable"),
        };
        crate::http::response(
            code,
            reason,
            &[
                ("Content-Type", "application/json"),
                ("Cache-Control", "no-store"),
            ],
            self.body().as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_and_draining() {
        let mut h = Health {
            draining: false,
            backend: "epoll",
            uptime: Duration::from_millis(42_900),
        };
        assert_eq!(h.status_code(), 200);
        let v: serde_json::Value = serde_json::from_str(&h.body()).unwrap();
        assert_eq!(v["status"], "ok");
        assert_eq!(v["backend"], "epoll");
        assert_eq!(v["uptime_seconds"], 42);
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        let resp = String::from_utf8(h.response()).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(resp.contains("application/json"), "{resp}");

        h.draining = true;
        assert_eq!(h.status_code(), 503);
        let resp = String::from_utf8(h.response()).unwrap();
        assert!(resp.starts_with("HTTP/1.1 503 "), "{resp}");
        assert!(resp.contains("\"status\":\"draining\""), "{resp}");
    }
}
