//! Plain HTTP against a test server: whole responses and metrics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Scrapes one metric (sum of matching lines) from `/debug/varz`.
pub fn metric(addr: SocketAddr, name_and_labels: &str) -> f64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /debug/varz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    metric_in(&body, name_and_labels)
}

/// One metric (sum of matching lines) from a Prometheus text body.
pub fn metric_in(body: &str, name_and_labels: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(n, _)| *n == name_and_labels)
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// A plain HTTP request; returns the whole response.
pub fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}
