//! Reading metrics in tests (Prometheus text, from a relay's `/debug/varz`
//! or `/metrics`, or rendered in-process). A series that is not there is an
//! error, never 0: a check such as "nothing was dropped" must fail when the
//! counter was renamed or the scrape broke, not pass.
//!
//! A series is named as the exporter writes it: the metric name alone, or
//! with its labels in the exporter's order (`derp_packets_dropped{kind=
//! "other",reason="queue_tail"}`). [`Scrape::family`] sums every series
//! of a name, whatever its labels.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// One scrape's text.
#[derive(Clone, Debug)]
pub struct Scrape {
    text: String,
}

impl Scrape {
    /// A scrape from Prometheus text (e.g. `Metrics::render()`).
    pub fn parse(text: impl Into<String>) -> Scrape {
        Scrape { text: text.into() }
    }

    /// GETs `path` (`/debug/varz`, `/metrics`) from `addr`; panics when the
    /// answer is not a 200.
    pub fn fetch(addr: SocketAddr, path: &str) -> Scrape {
        let response = get(addr, path);
        let Some((head, body)) = response.split_once("\r\n\r\n") else {
            panic!("GET {path} from {addr}: no HTTP response: {response:?}");
        };
        assert!(
            head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
            "GET {path} from {addr}: {head}"
        );
        Scrape::parse(body)
    }

    /// The scrape's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The value of `series` (the sum when several lines carry it), or
    /// `None` when no line does.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.sum_where(|name| name == series)
    }

    /// The value of `series`; panics with the series and the scrape when no
    /// line carries it.
    pub fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("no series {series} in the scrape:\n{}", self.text))
    }

    /// The sum of every series of the metric `name`, whatever its labels;
    /// panics when there is none.
    pub fn family(&self, name: &str) -> f64 {
        self.sum_where(|series| {
            series == name
                || series
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{'))
        })
        .unwrap_or_else(|| panic!("no series of {name} in the scrape:\n{}", self.text))
    }

    /// Every series (name and labels) whose name starts with `prefix`, with
    /// its value, in scrape order; panics when there is none.
    pub fn series_with_prefix(&self, prefix: &str) -> Vec<(String, f64)> {
        let all: Vec<(String, f64)> = self
            .samples()
            .filter(|(series, _)| series.starts_with(prefix))
            .map(|(s, v)| (s.to_owned(), v))
            .collect();
        assert!(
            !all.is_empty(),
            "no series starting with {prefix} in the scrape:\n{}",
            self.text
        );
        all
    }

    fn sum_where(&self, mut want: impl FnMut(&str) -> bool) -> Option<f64> {
        let mut found = None;
        for (series, value) in self.samples() {
            if want(series) {
                *found.get_or_insert(0.0) += value;
            }
        }
        found
    }

    /// `(series, value)` of every sample line; panics on a line that is
    /// not one (a broken exporter is an error too).
    fn samples(&self) -> impl Iterator<Item = (&str, f64)> {
        self.text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (series, value) = l
                    .rsplit_once(' ')
                    .unwrap_or_else(|| panic!("not a sample line: {l:?}"));
                let value = match value {
                    "+Inf" => f64::INFINITY,
                    "-Inf" => f64::NEG_INFINITY,
                    v => v
                        .parse()
                        .unwrap_or_else(|e| panic!("not a sample line ({e}): {l:?}")),
                };
                (series, value)
            })
    }
}

/// The value of `series` at `addr`'s `/debug/varz`; panics when it is
/// absent.
pub fn metric(addr: SocketAddr, series: &str) -> f64 {
    Scrape::fetch(addr, "/debug/varz").value(series)
}

/// The value of `series` in Prometheus `text`; panics when it is absent.
pub fn metric_in(text: &str, series: &str) -> f64 {
    Scrape::parse(text).value(series)
}

/// Scrapes `path` at `addr` until `series` is there and `done` holds for
/// its value, or `timeout` passes; returns the value, or panics with
/// `what`, the last value (or its absence) and the last scrape. For
/// series that appear only once something happened (a per-peer series),
/// an absent series counts as "not yet"; it still fails at the deadline.
pub fn wait_metric(
    addr: SocketAddr,
    path: &str,
    series: &str,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(f64) -> bool,
) -> f64 {
    let deadline = Instant::now() + timeout;
    loop {
        let scrape = Scrape::fetch(addr, path);
        let value = scrape.get(series);
        if let Some(v) = value.filter(|v| done(*v)) {
            return v;
        }
        if Instant::now() >= deadline {
            match value {
                Some(v) => panic!(
                    "{what}: {series} is {v} after {timeout:?}; the scrape:\n{}",
                    scrape.text
                ),
                None => panic!(
                    "{what}: no series {series} within {timeout:?}; the scrape:\n{}",
                    scrape.text
                ),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plain HTTP GET with `Connection: close`; the whole response.
fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT)
        .unwrap_or_else(|e| panic!("scraping {addr}{path}: {e}"));
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap_or_else(|e| panic!("scraping {addr}{path}: {e}"));
    let mut body = Vec::new();
    s.read_to_end(&mut body)
        .unwrap_or_else(|e| panic!("scraping {addr}{path}: {e}"));
    String::from_utf8(body).unwrap_or_else(|e| panic!("scraping {addr}{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP a_total A.\n# TYPE a_total counter\na_total 3\n\
        b{kind=\"x\"} 1\nb{kind=\"y\"} 2.5\nbc 7\n";

    #[test]
    fn a_present_series_is_read_and_an_absent_one_is_an_error() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.value("a_total"), 3.0);
        assert_eq!(s.value("b{kind=\"y\"}"), 2.5);
        assert_eq!(s.get("b{kind=\"z\"}"), None);
        assert_eq!(s.get("b"), None, "a family is not a series");
        assert_eq!(s.family("b"), 3.5, "bc is another family");
        let absent = std::panic::catch_unwind(|| Scrape::parse(TEXT).value("gone_total"));
        let msg = *absent.unwrap_err().downcast::<String>().unwrap();
        assert!(
            msg.contains("no series gone_total") && msg.contains("a_total 3"),
            "{msg}"
        );
        assert!(std::panic::catch_unwind(|| Scrape::parse(TEXT).family("gone")).is_err());
        assert!(std::panic::catch_unwind(|| metric_in("", "a_total")).is_err());
    }

    #[test]
    fn a_line_that_is_not_a_sample_is_an_error() {
        assert!(std::panic::catch_unwind(|| Scrape::parse("a_total x\n").get("a_total")).is_err());
    }
}
