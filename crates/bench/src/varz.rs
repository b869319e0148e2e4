//! Reading the server's Prometheus metrics (`/debug/varz`, served by both
//! derper and Ferry to loopback clients) before and after a window, to show
//! *why* a run looked the way it did: queue drops, shard busy time.

use crate::target::Target;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Metric name prefixes kept in reports.
pub const INTERESTING: &[&str] = &[
    "derp_packets_dropped",
    "derp_packets_sent",
    "derp_packets_received",
    "derp_bytes_sent",
    "derp_bytes_received",
    "derp_current_connections",
    "derp_packets_forwarded",
    "ferry_mesh_link",
    "ferry_shard_busy_seconds_total",
    "ferry_shard_turns_total",
    "ferry_shard_cross_packets_total",
    "ferry_shard_packets_received_total",
    "ferry_shard_packets_sent_total",
    "ferry_ring_stalls_total",
    "ferry_queued_bytes",
    "ferry_io_backend",
    "ferry_backpressure",
];

/// Gauge name prefixes recorded over time in sampled runs
/// (`--sample-every`): what a server holds, as opposed to what it did.
pub const SAMPLED: &[&str] = &[
    "derp_current_connections",
    "ferry_queued_bytes",
    "ferry_recv_buffer",
    "ferry_buffer",
    "ferry_heap",
    "ferry_senders_paused",
    "process_resident_memory_bytes",
    "process_open_fds",
];

/// The samples of `all` whose names start with one of `prefixes`.
pub fn select(all: &BTreeMap<String, f64>, prefixes: &[&str]) -> BTreeMap<String, f64> {
    all.iter()
        .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Fetches `path` from the target over its own transport and returns the
/// parsed samples (`name{labels}` → value).
pub fn scrape(target: &Target, path: &str) -> Result<BTreeMap<String, f64>> {
    let timeout = Duration::from_secs(3);
    let tcp = TcpStream::connect_timeout(&target.addr, timeout)
        .with_context(|| format!("metrics: cannot connect to {}", target.addr))?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        target.host
    );
    let mut response = Vec::new();
    match (&target.tls, &target.server_name) {
        (Some(config), Some(name)) => {
            let conn = rustls::ClientConnection::new(config.clone(), name.clone())?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(request.as_bytes())?;
            read_all(&mut s, &mut response)?;
        }
        _ => {
            let mut s = tcp;
            s.write_all(request.as_bytes())?;
            read_all(&mut s, &mut response)?;
        }
    }
    let body =
        http_body(&response).with_context(|| format!("metrics: bad response from {path}"))?;
    Ok(parse_prometheus(&String::from_utf8_lossy(&body)))
}

/// Reads to EOF (at most 16 MiB); a TLS peer that closes without
/// close_notify is treated as EOF. Gives up as soon as the status line
/// shows anything but 200 (a server without metrics may answer `/debug/varz`
/// with an upgrade and then wait).
fn read_all(r: &mut impl Read, out: &mut Vec<u8>) -> Result<()> {
    let mut buf = [0u8; 16384];
    for _ in 0..1024 {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if let Some(line_end) = out.windows(2).position(|w| w == b"\r\n") {
                    let status = String::from_utf8_lossy(&out[..line_end]).into_owned();
                    if status.split_whitespace().nth(1) != Some("200") {
                        bail!("status {status:?}");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The body of an HTTP/1.1 response: checks for 200, undoes chunked
/// transfer encoding.
pub fn http_body(response: &[u8]) -> Result<Vec<u8>> {
    let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("no end of headers");
    };
    let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
    let status = head.lines().next().unwrap_or_default().to_owned();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("status {status:?}");
    }
    let body = &response[end + 4..];
    if !head
        .lines()
        .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"))
    {
        return Ok(body.to_vec());
    }
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    for _ in 0..1_000_000 {
        let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") else {
            bail!("truncated chunk header");
        };
        let size_text = String::from_utf8_lossy(&rest[..nl]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    bail!("too many chunks")
}

/// Parses Prometheus text exposition: `name{labels} value [timestamp]`.
pub fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // The series ends at the closing brace, or at the first space.
        let split = match line.find('{') {
            Some(_) => line.rfind('}').map(|i| i + 1),
            None => line.find(' '),
        };
        let Some(at) = split else { continue };
        let (series, rest) = line.split_at(at);
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        out.insert(series.to_owned(), value);
    }
    out
}

/// Changes of interesting series between two scrapes (non-zero only;
/// gauges are reported as their final value under `name@end`).
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (k, v) in after {
        if !INTERESTING.iter().any(|p| k.starts_with(p)) {
            continue;
        }
        let gauge = [
            "derp_current_connections",
            "ferry_queued_bytes",
            "ferry_io_backend",
            "ferry_mesh_link_up",
            "ferry_mesh_link_keys",
        ]
        .iter()
        .any(|g| k.starts_with(g));
        if gauge {
            out.insert(format!("{k}@end"), *v);
            continue;
        }
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d != 0.0 {
            out.insert(k.clone(), d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exposition() {
        let text = "# HELP x\n# TYPE derp_packets_dropped counter\nderp_packets_dropped{kind=\"other\",reason=\"queue_head\"} 12\nderp_current_connections 3\nbad line\nferry_shard_busy_seconds_total{shard=\"0\"} 1.5e0 1700000000\n";
        let m = parse_prometheus(text);
        assert_eq!(
            m["derp_packets_dropped{kind=\"other\",reason=\"queue_head\"}"],
            12.0
        );
        assert_eq!(m["derp_current_connections"], 3.0);
        assert_eq!(m["ferry_shard_busy_seconds_total{shard=\"0\"}"], 1.5);
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn deltas() {
        let before = parse_prometheus(
            "derp_packets_dropped{reason=\"a\"} 2\nderp_packets_sent 10\nother 1\n",
        );
        let after = parse_prometheus(
            "derp_packets_dropped{reason=\"a\"} 5\nderp_packets_sent 10\nother 9\nderp_current_connections 20\nderp_packets_forwarded_out 7\nferry_mesh_link_up{peer=\"b:1\"} 1\n",
        );
        let d = delta(&before, &after);
        assert_eq!(d.len(), 4);
        assert_eq!(d["derp_packets_dropped{reason=\"a\"}"], 3.0);
        assert_eq!(d["derp_current_connections@end"], 20.0);
        assert_eq!(d["derp_packets_forwarded_out"], 7.0);
        assert_eq!(d["ferry_mesh_link_up{peer=\"b:1\"}@end"], 1.0);
    }

    #[test]
    fn bodies() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
        assert_eq!(http_body(plain).unwrap(), b"abc");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(http_body(chunked).unwrap(), b"abcde");
        assert!(http_body(b"HTTP/1.1 403 Forbidden\r\n\r\n").is_err());
        assert!(http_body(b"HTTP/1.1 200").is_err());
    }
}
