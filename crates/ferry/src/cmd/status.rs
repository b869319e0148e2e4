//! `ferry status`: what one relay is doing, read from its metrics endpoint
//! (`--metrics-addr`, or `/debug/varz` on the relay's own port from the
//! same host): connections by transport, throughput in and out (from two
//! scrapes a second apart), drops by reason, backpressure, admission, and
//! for a UDP relay its sessions, hub peers and drops. `--json` prints the
//! same as one object; `--watch` redraws it in place until interrupted.
//! Given a `/healthz` URL it is a health check: the answer in one line,
//! and a failing exit status when the service is not healthy.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

mod tailnet;

/// `ferry status` flags.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The relay's metrics: `host:port` (its --metrics-addr, read at
    /// /metrics) or a full http:// or https:// URL such as
    /// http://127.0.0.1:3340/debug/varz; a /healthz URL checks health.
    #[arg(default_value = "127.0.0.1:9100")]
    pub(crate) target: String,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,

    /// Redraw every this many seconds until interrupted (1-3600).
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    pub(crate) watch: Option<u64>,
}

/// One scrape: series (name and labels, as written) to value.
#[derive(Debug, Default)]
pub(crate) struct Scrape {
    series: Vec<(String, BTreeMap<String, String>, f64)>,
    at: Option<Instant>,
}

impl Scrape {
    fn parse(text: &str, at: Instant) -> Scrape {
        let mut series = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (head, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
                None => (head, BTreeMap::new()),
            };
            series.push((name.to_owned(), labels, value));
        }
        Scrape {
            series,
            at: Some(at),
        }
    }

    /// The sum of every series named `name` whose labels include `with`.
    pub(crate) fn sum(&self, name: &str, with: &[(&str, &str)]) -> Option<f64> {
        let mut found = None;
        for (n, labels, v) in &self.series {
            if n == name
                && with
                    .iter()
                    .all(|(k, want)| labels.get(*k).is_some_and(|got| got == want))
            {
                *found.get_or_insert(0.0) += v;
            }
        }
        found
    }

    /// Values of `name` by the value of its label `by`.
    fn by(&self, name: &str, by: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (n, labels, v) in &self.series {
            if n == name {
                let key = labels.get(by).cloned().unwrap_or_default();
                *out.entry(key).or_insert(0.0) += v;
            }
        }
        out
    }
}

/// `name="value",…` with the exposition format's escapes (`\\`, `\"`,
/// `\n`) undone, so a value may hold quotes and commas.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once("=\"") {
        let mut v = String::new();
        let mut end = after.len();
        let mut chars = after.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => v.push('\n'),
                    Some((_, c)) => v.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => v.push(c),
            }
        }
        out.insert(k.trim_matches([',', ' ']).to_owned(), v);
        rest = &after[end..];
    }
    out
}

/// The server `ferry status` asks: `http` or `https`, `host:port`, and the
/// host alone (for the `Host` header and the TLS name).
#[derive(Debug, PartialEq, Eq)]
struct Server {
    tls: bool,
    hostport: String,
    host: String,
}

impl Server {
    /// The URL of `path` on this server, for messages.
    fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.hostport)
    }
}

/// Where to GET, from the target argument.
fn endpoint(target: &str) -> Result<(Server, String)> {
    let (tls, rest) = match (
        target.strip_prefix("http://"),
        target.strip_prefix("https://"),
    ) {
        (Some(rest), _) => (false, Some(rest)),
        (_, Some(rest)) => (true, Some(rest)),
        _ => (false, None),
    };
    let (hostport, path) = match rest {
        Some(rest) => match rest.split_once('/') {
            Some((h, p)) => (h.to_owned(), format!("/{p}")),
            None => (rest.to_owned(), "/metrics".to_owned()),
        },
        None => (target.to_owned(), "/metrics".to_owned()),
    };
    let host = hostport
        .rsplit_once(':')
        .map_or(hostport.as_str(), |(h, _)| h)
        .trim_matches(|c| c == '[' || c == ']')
        .to_owned();
    // https:// without a port is the usual 443.
    let hostport = if tls && !hostport.ends_with(']') && !hostport.contains(':') {
        format!("{hostport}:443")
    } else {
        hostport
    };
    Ok((
        Server {
            tls,
            hostport,
            host,
        },
        path,
    ))
}

/// A TLS client session for `host`, checked against the system's CA
/// certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured), as every
/// outgoing TLS connection of Ferry's.
fn tls_session(host: &str) -> Result<rustls::ClientConnection> {
    let (config, name) = ferry_client::https_client_config(&ferry_client::TlsRoots::System, host)
        .with_context(|| format!("TLS for {host}"))?;
    rustls::ClientConnection::new(config, name).with_context(|| format!("TLS for {host}"))
}

/// GETs `path` from `server`: the status line and the body.
fn get(server: &Server, path: &str) -> Result<(String, String)> {
    let url = server.url(path);
    let addrs: Vec<_> = server
        .hostport
        .to_socket_addrs()
        .with_context(|| format!("{}: not an address", server.hostport))?
        .collect();
    let mut failed = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => failed = Some(anyhow::Error::new(e).context(format!("connecting to {addr}"))),
        }
    }
    let s = match (stream, failed) {
        (Some(s), _) => s,
        (None, Some(e)) => return Err(e),
        (None, None) => bail!("{}: no address", server.hostport),
    };
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut conn: Box<dyn ReadWrite> = if server.tls {
        Box::new(rustls::StreamOwned::new(tls_session(&server.host)?, s))
    } else {
        Box::new(s)
    };
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nUser-Agent: ferry-status\r\n\r\n",
        server.host
    )
    .with_context(|| format!("asking {url}"))?;
    let mut body = Vec::new();
    let read = conn.take(64 << 20).read_to_end(&mut body);
    // A TLS server that closes without close_notify has still sent the
    // whole answer (Connection: close).
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !body.is_empty() => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {url}"))),
    }
    let text = String::from_utf8_lossy(&body);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{url}: not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default().to_owned();
    Ok((status, rest.to_owned()))
}

/// A plain or a TLS connection.
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn is_ok(status: &str) -> bool {
    status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200")
}

/// One scrape of `target`'s metrics; an answer without a single series
/// (a `/healthz` or a page) is an error saying so.
pub(crate) fn fetch(target: &str) -> Result<Scrape> {
    let (server, path) = endpoint(target)?;
    let (status, body) = get(&server, &path)?;
    let url = server.url(&path);
    if !is_ok(&status) {
        bail!("{url}: {status}");
    }
    let scrape = Scrape::parse(&body, Instant::now());
    if scrape.series.is_empty() {
        bail!(
            "{url}: no metrics in the answer (a health check is `ferry status {}`)",
            server.url("/healthz")
        );
    }
    Ok(scrape)
}

/// What `/healthz` answers, on the DERP server's listeners and the UDP
/// relay's metrics listener alike.
#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
struct Health {
    status: String,
    version: Option<String>,
    backend: Option<String>,
    uptime_seconds: Option<u64>,
}

/// GETs `/healthz` from `server`: the status line and the answer.
fn health(server: &Server) -> Result<(String, Health)> {
    let (status, body) = get(server, "/healthz")?;
    let health = serde_json::from_str(&body)
        .with_context(|| format!("{}: {status}: not a health answer", server.url("/healthz")))?;
    Ok((status, health))
}

/// `ferry status http://…/healthz`: one line (or the JSON), and an error
/// unless the service answers 200 with status ok.
fn health_check(args: &StatusArgs, server: &Server) -> Result<()> {
    let (status, h) = health(server)?;
    if args.json {
        println!("{}", serde_json::to_string(&h)?);
    } else {
        println!(
            "ferry at {}: {}  version {}  back end {}  up {}s",
            args.target,
            h.status,
            h.version.as_deref().unwrap_or("?"),
            h.backend.as_deref().unwrap_or("?"),
            h.uptime_seconds.map_or("?".to_owned(), |u| u.to_string()),
        );
    }
    if !is_ok(&status) || h.status != "ok" {
        bail!(
            "{}: {status}: not healthy ({})",
            server.url("/healthz"),
            h.status
        );
    }
    Ok(())
}

/// What the view shows, computed from two scrapes.
#[derive(Debug, serde::Serialize)]
struct View {
    kind: &'static str,
    version: Option<String>,
    backend: Option<String>,
    uptime_seconds: Option<u64>,
    connections: BTreeMap<String, u64>,
    bytes_in_per_second: Option<f64>,
    bytes_out_per_second: Option<f64>,
    packets_in_per_second: Option<f64>,
    packets_out_per_second: Option<f64>,
    drops: BTreeMap<String, u64>,
    backpressure_pauses: Option<u64>,
    senders_paused: Option<u64>,
    budget_expired: Option<u64>,
    admission: BTreeMap<String, u64>,
    /// Handshake failures (refused clients) by reason.
    refused: BTreeMap<String, u64>,
    /// App names of clients refused for their name, by reason: the few
    /// the relay keeps per reason (quoted), with their counts.
    refused_app_names: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per mesh peer (`--mesh-with`): whether its link is up.
    mesh_links: BTreeMap<String, bool>,
    /// Packets forwarded to and from the region's other nodes, per second.
    forwarded_out_per_second: Option<f64>,
    forwarded_in_per_second: Option<f64>,
    udp_sessions: Option<u64>,
    udp_hub_peers: Option<u64>,
    /// The tailnet node and its peer relay, when the relay is one.
    tailnet: Option<tailnet::Tailnet>,
}

/// A counter or gauge's value as the count it is.
fn count(v: f64) -> u64 {
    v.max(0.0).round() as u64
}

/// A map of values as counts.
fn counts(m: BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    m.into_iter().map(|(k, v)| (k, count(v))).collect()
}

fn rate(a: &Scrape, b: &Scrape, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    let dt = b.at?.saturating_duration_since(a.at?).as_secs_f64();
    let (x, y) = (a.sum(name, with)?, b.sum(name, with)?);
    (dt > 0.0).then(|| ((y - x) / dt).max(0.0))
}

fn view(a: &Scrape, b: &Scrape) -> View {
    let udp = b.sum("ferry_udp_shards", &[]).is_some();
    let label = |name: &str, key: &str| {
        b.series
            .iter()
            .find(|(n, _, _)| n == name)
            .and_then(|(_, l, _)| l.get(key).cloned())
    };
    let mut drops = BTreeMap::new();
    for (name, by) in [
        ("derp_packets_dropped", "reason"),
        ("ferry_udp_drops_total", "reason"),
    ] {
        for (reason, v) in b.by(name, by) {
            if v > 0.0 && !reason.is_empty() {
                *drops.entry(reason).or_insert(0.0) += v;
            }
        }
    }
    let mut admission = BTreeMap::new();
    for (n, labels, v) in &b.series {
        if n == "ferry_admission_decisions_total" && *v > 0.0 {
            let key = match (labels.get("result"), labels.get("reason")) {
                (Some(r), Some(why)) if !why.is_empty() => format!("{r}:{why}"),
                (Some(r), _) => r.clone(),
                _ => continue,
            };
            *admission.entry(key).or_insert(0.0) += v;
        }
    }
    let mut refused_app_names: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (n, labels, v) in &b.series {
        if n == "ferry_refused_app_names_total" && *v > 0.0 {
            if let (Some(why), Some(name)) = (labels.get("reason"), labels.get("app_name")) {
                *refused_app_names
                    .entry(why.clone())
                    .or_default()
                    .entry(name.clone())
                    .or_insert(0) += count(*v);
            }
        }
    }
    let refused = b
        .by("ferry_handshake_failures_total", "reason")
        .into_iter()
        .filter(|(why, v)| *v > 0.0 && !why.is_empty())
        .map(|(why, v)| (why, count(v)))
        .collect();
    let (bytes_in, bytes_out, pkts_in, pkts_out) = if udp {
        (
            rate(a, b, "ferry_udp_bytes_total", &[]),
            None,
            rate(a, b, "ferry_udp_packets_total", &[]),
            None,
        )
    } else {
        (
            rate(a, b, "derp_bytes_received", &[]),
            rate(a, b, "derp_bytes_sent", &[]),
            rate(a, b, "derp_packets_received", &[]),
            rate(a, b, "derp_packets_sent", &[]),
        )
    };
    View {
        kind: if udp { "udp-relay" } else { "derp" },
        version: label("version", "version"),
        backend: label("ferry_io_backend", "backend"),
        uptime_seconds: b.sum("uptime_sec", &[]).map(count),
        connections: counts(b.by("ferry_connections_by_transport", "transport")),
        bytes_in_per_second: bytes_in,
        bytes_out_per_second: bytes_out,
        packets_in_per_second: pkts_in,
        packets_out_per_second: pkts_out,
        drops: counts(drops),
        backpressure_pauses: b.sum("ferry_backpressure_pauses_total", &[]).map(count),
        senders_paused: b.sum("ferry_senders_paused", &[]).map(count),
        budget_expired: b
            .sum("ferry_backpressure_budget_expired_total", &[])
            .map(count),
        admission: counts(admission),
        refused,
        refused_app_names,
        mesh_links: b
            .by("ferry_mesh_link_up", "peer")
            .into_iter()
            .map(|(peer, up)| (peer, up > 0.0))
            .collect(),
        forwarded_out_per_second: rate(a, b, "derp_packets_forwarded_out", &[]),
        forwarded_in_per_second: rate(a, b, "derp_packets_forwarded_in", &[]),
        udp_sessions: b.sum("ferry_udp_sessions", &[]).map(count),
        udp_hub_peers: b.sum("ferry_udp_hub_known_peers", &[]).map(count),
        tailnet: tailnet::view(a, b),
    }
}

/// Refusals by reason, each with the app names seen for it:
/// `disallowed_app_name 3 ("bad" 2, "worse" 1), eof 1`.
fn refused_text(v: &View) -> String {
    let parts: Vec<String> = v
        .refused
        .iter()
        .map(|(why, n)| match v.refused_app_names.get(why) {
            Some(names) if !names.is_empty() => {
                let names: Vec<String> = names.iter().map(|(a, k)| format!("{a} {k}")).collect();
                format!("{why} {n} ({})", names.join(", "))
            }
            _ => format!("{why} {n}"),
        })
        .collect();
    parts.join(", ")
}

fn human_rate(v: Option<f64>, unit: &str) -> String {
    let Some(v) = v else {
        return "-".to_owned();
    };
    let (x, prefix) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    format!("{x:.1} {prefix}{unit}/s")
}

fn text(target: &str, v: &View) -> String {
    let mut out = String::new();
    let opt = |x: Option<u64>| x.map_or("-".to_owned(), |x| x.to_string());
    out.push_str(&format!(
        "ferry {} at {target}  version {}  back end {}  up {}s\n",
        v.kind,
        v.version.as_deref().unwrap_or("?"),
        v.backend.as_deref().unwrap_or("?"),
        opt(v.uptime_seconds),
    ));
    if v.kind == "derp" {
        let conns: Vec<String> = v
            .connections
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect();
        out.push_str(&format!(
            "connections  {}\n",
            if conns.is_empty() {
                "none".to_owned()
            } else {
                conns.join(", ")
            }
        ));
        out.push_str(&format!(
            "in           {}  {}\nout          {}  {}\n",
            human_rate(v.bytes_in_per_second.map(|b| b * 8.0), "bit"),
            human_rate(v.packets_in_per_second, "pkt"),
            human_rate(v.bytes_out_per_second.map(|b| b * 8.0), "bit"),
            human_rate(v.packets_out_per_second, "pkt"),
        ));
        out.push_str(&format!(
            "backpressure {} pauses, {} senders paused now, {} budget expiries\n",
            opt(v.backpressure_pauses),
            opt(v.senders_paused),
            opt(v.budget_expired),
        ));
        if !v.admission.is_empty() {
            let a: Vec<String> = v
                .admission
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            out.push_str(&format!("admission    {}\n", a.join(", ")));
        }
        if !v.refused.is_empty() {
            out.push_str(&format!("refused      {}\n", refused_text(v)));
        }
        if v.mesh_links.is_empty() {
            out.push_str("mesh links   none (no --mesh-with)\n");
        } else {
            let links: Vec<String> = v
                .mesh_links
                .iter()
                .map(|(peer, up)| format!("{peer} {}", if *up { "up" } else { "DOWN" }))
                .collect();
            out.push_str(&format!(
                "mesh links   {}  forwarded out {} in {}\n",
                links.join(", "),
                human_rate(v.forwarded_out_per_second, "pkt"),
                human_rate(v.forwarded_in_per_second, "pkt"),
            ));
        }
    } else {
        out.push_str(&format!(
            "relayed      {}  {}\nsessions     {}  hub peers {}\n",
            human_rate(v.bytes_in_per_second.map(|b| b * 8.0), "bit"),
            human_rate(v.packets_in_per_second, "pkt"),
            opt(v.udp_sessions),
            opt(v.udp_hub_peers),
        ));
    }
    if let Some(t) = &v.tailnet {
        tailnet::text(t, &mut out);
    }
    let drops: Vec<String> = v.drops.iter().map(|(k, n)| format!("{k} {n}")).collect();
    out.push_str(&format!(
        "drops        {}\n",
        if drops.is_empty() {
            "none".to_owned()
        } else {
            drops.join(", ")
        }
    ));
    out
}

/// Runs `ferry status`.
pub(crate) fn run(args: &StatusArgs) -> Result<()> {
    if let Some(every) = args.watch {
        if !(1..=3600).contains(&every) {
            bail!("--watch {every}: must be between 1 and 3600 seconds");
        }
    }
    let (server, path) = endpoint(&args.target)?;
    if path == "/healthz" {
        return health_check(args, &server);
    }
    let interval = Duration::from_secs(args.watch.unwrap_or(1));
    let mut before = fetch(&args.target)?;
    loop {
        std::thread::sleep(interval);
        let now = fetch(&args.target)?;
        let mut v = view(&before, &now);
        if v.version.is_none() {
            // The UDP relay's metrics carry no version, back end or
            // uptime; its /healthz does.
            if let Ok((_, h)) = health(&server) {
                (v.version, v.backend, v.uptime_seconds) = (h.version, h.backend, h.uptime_seconds);
            }
        }
        if path == "/debug/varz" {
            // This scrape is a plain connection to the DERP listener.
            if let Some(plain) = v.connections.get_mut("plain") {
                *plain = plain.saturating_sub(1);
            }
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&v)?)?;
        } else {
            if args.watch.is_some() {
                // Home the cursor and clear, so the view redraws in place.
                write!(out, "\x1b[H\x1b[2J")?;
            }
            write!(out, "{}", text(&args.target, &v))?;
        }
        out.flush()?;
        if args.watch.is_none() {
            return Ok(());
        }
        before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DERP: &str = "# TYPE derp_bytes_received counter\nderp_bytes_received 1000\nderp_bytes_sent 500\nderp_packets_received 10\nderp_packets_sent 5\nferry_connections_by_transport{transport=\"ferry_records\"} 3\nferry_connections_by_transport{transport=\"plain\"} 1\nderp_packets_dropped{reason=\"queue_tail\",kind=\"other\"} 7\nderp_packets_dropped{reason=\"queue_tail\",kind=\"disco\"} 1\nderp_packets_dropped{reason=\"gone\",kind=\"other\"} 0\nferry_io_backend{backend=\"uring\",reason=\"io_uring available\"} 1\nversion{version=\"0.1.0\",binary=\"ferry\"} 1\nuptime_sec 42\nferry_admission_decisions_total{result=\"reject\",reason=\"denied\"} 2\n";

    #[test]
    fn a_derp_view_from_two_scrapes() {
        let t0 = Instant::now();
        let a = Scrape::parse(DERP, t0);
        let later = DERP
            .replace("derp_bytes_received 1000", "derp_bytes_received 3000")
            .replace("derp_packets_sent 5", "derp_packets_sent 25");
        let b = Scrape::parse(&later, t0 + Duration::from_secs(2));
        let v = view(&a, &b);
        assert_eq!(v.kind, "derp");
        assert_eq!(v.bytes_in_per_second, Some(1000.0));
        assert_eq!(v.packets_out_per_second, Some(10.0));
        assert_eq!(v.connections.get("ferry_records"), Some(&3));
        assert_eq!(v.drops.get("queue_tail"), Some(&8));
        assert!(!v.drops.contains_key("gone"));
        assert_eq!(v.backend.as_deref(), Some("uring"));
        assert_eq!(v.version.as_deref(), Some("0.1.0"));
        assert_eq!(v.admission.get("reject:denied"), Some(&2));
        assert!(v.refused.is_empty());
        let t = text("x", &v);
        assert!(!t.contains("refused"), "{t}");
        assert!(t.contains("connections  ferry_records 3, plain 1"), "{t}");
        assert!(t.contains("in           8.0 kbit/s  0.0 pkt/s"), "{t}");
        assert!(t.contains("out          0.0 bit/s  10.0 pkt/s"), "{t}");
        assert!(t.contains("drops        queue_tail 8"), "{t}");
    }

    #[test]
    fn mesh_links_and_forwarding() {
        let t0 = Instant::now();
        let a = Scrape::parse(DERP, t0);
        assert!(text("x", &view(&a, &a)).contains("mesh links   none (no --mesh-with)"));
        let meshed = format!(
            "{DERP}ferry_mesh_link_up{{peer=\"b.example.com\"}} 1\nferry_mesh_link_up{{peer=\"c.example.com:8443\"}} 0\nderp_packets_forwarded_out 100\nderp_packets_forwarded_in 0\n"
        );
        let a = Scrape::parse(&meshed, t0);
        let b = Scrape::parse(
            &meshed.replace(
                "derp_packets_forwarded_out 100",
                "derp_packets_forwarded_out 300",
            ),
            t0 + Duration::from_secs(2),
        );
        let t = text("x", &view(&a, &b));
        assert!(
            t.contains("mesh links   b.example.com up, c.example.com:8443 DOWN  forwarded out 100.0 pkt/s in 0.0 pkt/s"),
            "{t}"
        );
    }

    #[test]
    fn refused_clients_by_reason_with_their_app_names() {
        let t0 = Instant::now();
        let page = format!(
            "{DERP}ferry_handshake_failures_total{{reason=\"disallowed_app_name\"}} 3\n\
ferry_handshake_failures_total{{reason=\"eof\"}} 1\n\
ferry_handshake_failures_total{{reason=\"box_open\"}} 0\n\
ferry_refused_app_names_total{{reason=\"disallowed_app_name\",app_name=\"\\\"bad\\\"\"}} 2\n\
ferry_refused_app_names_total{{reason=\"disallowed_app_name\",app_name=\"\\\"a\\\",b\\\"\"}} 1\n"
        );
        let a = Scrape::parse(&page, t0);
        let v = view(&a, &a);
        assert_eq!(v.refused.get("disallowed_app_name"), Some(&3));
        assert!(!v.refused.contains_key("box_open"));
        let names = &v.refused_app_names["disallowed_app_name"];
        assert_eq!(names.get("\"bad\""), Some(&2));
        assert_eq!(names.get("\"a\",b\""), Some(&1), "{names:?}");
        let t = text("x", &v);
        assert!(
            t.contains("refused      disallowed_app_name 3 (\"a\",b\" 1, \"bad\" 2), eof 1"),
            "{t}"
        );
    }

    #[test]
    fn targets() {
        let server = |tls, hostport: &str, host: &str| Server {
            tls,
            hostport: hostport.into(),
            host: host.into(),
        };
        assert_eq!(
            endpoint("127.0.0.1:9100").unwrap(),
            (
                server(false, "127.0.0.1:9100", "127.0.0.1"),
                "/metrics".into()
            )
        );
        assert_eq!(
            endpoint("http://[::1]:3340/debug/varz").unwrap(),
            (server(false, "[::1]:3340", "::1"), "/debug/varz".into())
        );
        assert_eq!(
            endpoint("https://derp.example.com/debug/varz").unwrap(),
            (
                server(true, "derp.example.com:443", "derp.example.com"),
                "/debug/varz".into()
            )
        );
    }
}
