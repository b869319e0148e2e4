//! Command line: derper's flag names and Go's flag syntax.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ferry_derp::tls::CertMode;

/// Ferry: a DERP relay for Tailscale and WireGuard traffic.
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
// As with Go's flag package, a flag given twice takes the later value.
#[command(args_override_self = true)]
pub(crate) struct Args {
    /// Another service instead of the DERP server (the default).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Listen address, as host:port; ":443" listens on every address.
    /// TLS is used on port 443 or with --certmode; otherwise plain HTTP.
    #[arg(short = 'a', long = "a", alias = "addr", default_value = ":443")]
    pub addr: String,

    /// Development mode: plain HTTP on 127.0.0.1:3340 (unless -a is given),
    /// STUN on 127.0.0.1:3478, a fresh key, and a printed DERP map.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub dev: bool,

    /// TOML file setting any of these flags, one key per flag (`stun_port =
    /// 3478`, `-a` is `addr`, `-c` is `key_file`; `ferry check-config FILE`
    /// checks one). Precedence: command line, then FERRY_* and DERP_*
    /// variables, then the file, then the defaults.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,

    /// Server key file ({"PrivateKey":"privkey:…"}, as derper's); created if
    /// missing. Default: /var/lib/ferry/ferry.key as root, else
    /// $XDG_CONFIG_HOME/ferry/ferry.key (~/.config/ferry/ferry.key).
    #[arg(short = 'c', long = "c", alias = "key-file")]
    pub config: Option<PathBuf>,

    /// Certificate mode: "letsencrypt" (from an ACME CA, --acme-directory;
    /// kept and renewed in --certdir), "manual" (<certdir>/<hostname>.crt
    /// and .key; an IP hostname without files gets a generated certificate)
    /// or "selfsigned" (generated once, kept in --certdir). derper's "gcp"
    /// is not supported. Default: letsencrypt on port 443, as derper.
    #[arg(long)]
    pub certmode: Option<String>,

    /// Directory holding the certificate files (--certmode manual), the
    /// generated certificate (selfsigned) or the ACME account and
    /// certificates (letsencrypt). Default: /var/lib/ferry/certs as
    /// root, else $XDG_CACHE_HOME/ferry-certs (~/.cache/ferry-certs).
    #[arg(long)]
    pub certdir: Option<PathBuf>,

    /// ACME directory for --certmode letsencrypt: any RFC 8555 CA (Let's
    /// Encrypt's staging, ZeroSSL, step-ca, ...). Its TLS certificate is
    /// checked against the system's CAs (SSL_CERT_FILE honoured).
    #[arg(long = "acme-directory", default_value = crate::acme::LETS_ENCRYPT)]
    pub acme_directory: String,

    /// Contact address given to the ACME CA (expiry notices).
    #[arg(long = "acme-email", default_value = "")]
    pub acme_email: String,

    /// How the ACME CA checks the name: "tls-alpn-01" on the DERP TLS
    /// listener (port 443 as the CA sees it) or "http-01" on the
    /// --http-port listener (port 80).
    #[arg(long = "acme-challenge", default_value = "tls-alpn-01")]
    pub acme_challenge: String,

    /// TLS host name (certificate file name and SNI to accept). derper's
    /// default is derp.tailscale.com; ferry's is localhost.
    #[arg(long, default_value = "localhost")]
    pub hostname: String,

    /// Port of the plain-HTTP companion listener in TLS mode (captive-portal
    /// checks, redirects to HTTPS); -1 disables.
    #[arg(
        long = "http-port",
        default_value_t = 80,
        allow_negative_numbers = true
    )]
    pub http_port: i32,

    /// Run the STUN server.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub stun: bool,

    /// UDP port for STUN (bound on the -a address).
    #[arg(long = "stun-port", default_value_t = 3478)]
    pub stun_port: u16,

    /// Relay sessions for Ferry's SDK clients (docs/relay-sessions.md): the
    /// UDP port of the session socket, bound on the -a address; off when
    /// not given (0: a port the system picks).
    #[arg(long = "relay-port")]
    pub relay_port: Option<u16>,

    /// Relay sessions one client key may be in at once.
    #[arg(long = "relay-sessions-per-key", default_value_t = 32)]
    pub relay_sessions_per_key: usize,

    /// Free a bound relay session after this long without traffic (Go
    /// duration, 1s to 1h).
    #[arg(long = "relay-idle-timeout", default_value = "60s")]
    pub relay_idle_timeout: String,

    /// Serve DERP (false keeps only STUN and the HTTP endpoints).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub derp: bool,

    /// File holding the 64-hex-digit mesh key; clients presenting it get
    /// mesh privileges (watchConns, forwardPacket, closePeer).
    #[arg(long = "mesh-psk-file")]
    pub mesh_psk_file: Option<PathBuf>,

    /// Other nodes of this region to mesh with, comma-separated, as derper:
    /// `host[:port]`, or `name[:port]/dialhost` to connect to dialhost while
    /// verifying TLS for name. Needs --mesh-psk-file; this node's own name
    /// may be listed (it is recognised by its key and skipped). TLS to the
    /// peers is verified against the system's roots (SSL_CERT_FILE).
    #[arg(long = "mesh-with", default_value = "")]
    pub mesh_with: String,

    /// Cut off a client that does not read for this long (Go duration; 0
    /// disables; otherwise 10ms to 1h). Mesh peers get 30s.
    #[arg(long = "tcp-write-timeout", default_value = "2s")]
    pub tcp_write_timeout: String,

    /// TCP keepalive idle time for client sockets (Go duration; 0: system
    /// default; otherwise 1s to 9h6m7s, the kernel's limit).
    #[arg(long = "tcp-keepalive-time", default_value = "10m0s")]
    pub tcp_keepalive_time: String,

    /// TCP_USER_TIMEOUT for client sockets (Go duration; 0: system default;
    /// otherwise 1s to 24h).
    #[arg(long = "tcp-user-timeout", default_value = "15s")]
    pub tcp_user_timeout: String,

    /// derper's per-client receive limit file ({"PerClientRateLimitBytesPerSec":
    /// N, "PerClientRateBurstBytes": M}); reloaded on SIGHUP. A client over
    /// its rate is read more slowly (never dropped from); mesh peers are
    /// exempt.
    #[arg(long = "rate-config", default_value = "")]
    pub rate_config: String,

    /// New connections per second accepted on the DERP listener; the
    /// excess is closed at once.
    #[arg(
        long = "accept-connection-limit",
        default_value = "+Inf",
        allow_negative_numbers = true
    )]
    pub accept_connection_limit: f64,

    /// Burst for --accept-connection-limit.
    #[arg(long = "accept-connection-burst", default_value_t = i64::MAX)]
    pub accept_connection_burst: i64,

    /// Admit only clients the tailscaled on this host knows as peers of its
    /// tailnet (asked over its LocalAPI at --socket).
    #[arg(long = "verify-clients", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub verify_clients: bool,

    /// tailscaled's LocalAPI socket, for --verify-clients.
    #[arg(long, default_value = "/var/run/tailscale/tailscaled.sock")]
    pub socket: PathBuf,

    /// Admission controller: POSTed {"NodePublic","Source"} for every new
    /// client; only HTTP 200 with {"Allow":true} admits (Headscale serves
    /// one at /verify).
    #[arg(long = "verify-client-url", default_value = "")]
    pub verify_client_url: String,

    /// Admit clients when the admission controller cannot be reached.
    #[arg(long = "verify-client-url-fail-open", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub verify_client_url_fail_open: bool,

    /// Keep admission verdicts for this long per key and address (Go
    /// duration; 0, the default, asks for every connection as derper does;
    /// otherwise 1s to 24h).
    #[arg(long = "verify-client-cache", default_value = "0")]
    pub verify_client_cache: String,

    /// Admission questions asked at once (1 to 1024); more wait in a queue
    /// of 4096, past which clients are refused at once.
    #[arg(long = "verify-client-concurrency", default_value_t = 16)]
    pub verify_client_concurrency: usize,

    /// Connections from --trusted-proxies start with a PROXY protocol
    /// header (v1 or v2) naming the client; anyone else sending one is
    /// refused.
    #[arg(long = "proxy-protocol", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub proxy_protocol: bool,

    /// Proxies whose PROXY headers and X-Forwarded-For / Forwarded headers
    /// are believed: comma-separated addresses or networks (10.0.0.0/8,
    /// ::1).
    #[arg(long = "trusted-proxies", default_value = "")]
    pub trusted_proxies: String,

    /// Names whose addresses /bootstrap-dns serves to every client
    /// (comma-separated; resolved every 10 minutes).
    #[arg(long = "bootstrap-dns-names", default_value = "")]
    pub bootstrap_dns_names: String,

    /// Names /bootstrap-dns tells only to a client that asks for one by
    /// name (?q=NAME).
    #[arg(long = "unpublished-bootstrap-dns-names", default_value = "")]
    pub unpublished_bootstrap_dns_names: String,

    /// Root page: "" for the default page, "blank", or a URL to redirect to.
    #[arg(long, default_value = "")]
    pub home: String,

    /// Shard threads, 1 to 1024 (default: one per usable core; more than
    /// that is allowed, with a warning, and makes shards share cores).
    #[arg(long)]
    pub workers: Option<usize>,

    /// Pin each shard thread to its own core.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub pin: bool,

    /// I/O back end: auto (io_uring where the kernel allows it, else
    /// epoll), uring, or epoll.
    #[arg(long, default_value = "auto")]
    pub io: ferry_engine::IoMode,

    /// Kernel TLS: auto (move TLS sessions into the kernel where the TLS
    /// ULP is available), on (fail to start without it), or off.
    #[arg(long, default_value = "auto")]
    pub ktls: ferry_derp::transport::kernel::KtlsMode,

    /// TLS record layer after a TLS 1.3 handshake where kernel TLS is not
    /// used: ferry (Ferry's own: records opened and sealed in place, rustls
    /// dropped after the handshake) or rustls (rustls for the whole
    /// connection). TLS 1.2 always stays on rustls.
    #[arg(long = "tls-records", default_value = "ferry")]
    pub tls_records: ferry_derp::transport::records::TlsRecords,

    /// Extra listener serving Prometheus metrics at /metrics (any client;
    /// /debug/varz on the main listener is loopback-only).
    #[arg(long = "metrics-addr")]
    pub metrics_addr: Option<SocketAddr>,

    /// Time allowed from accept to a finished DERP handshake (Go duration,
    /// more than 0 and at most 10m).
    #[arg(long = "handshake-timeout", default_value = "10s")]
    pub handshake_timeout: String,

    /// Bytes of packets queued per client (64 KiB to 1 GiB); a client over
    /// it pauses the senders feeding it until it drains (backpressure), so
    /// nothing is dropped.
    #[arg(long = "send-queue-bytes", default_value_t = 1 << 20)]
    pub send_queue_bytes: usize,

    /// How long a client over its queue cap may hold its senders paused
    /// without taking anything from its socket before its own packets are
    /// dropped instead (Go duration; 0 never pauses a sender for longer
    /// than one turn).
    #[arg(long = "backpressure-budget", default_value = "50ms")]
    pub backpressure_budget: String,

    /// After a loop turn that had work, keep polling the sockets without
    /// sleeping for up to this long while more keeps arriving, then sleep
    /// (Go duration, 1us to 10ms; 0 is off). Trades CPU after traffic for
    /// the wake-up latency of the next packet; an idle relay still sleeps.
    #[arg(long = "busy-poll", default_value = "0")]
    pub busy_poll: String,

    /// Log filter: a level (error, warn, info, debug, trace, off) and/or
    /// target=level directives, comma-separated (tracing's EnvFilter
    /// syntax); FERRY_LOG overrides. A bad directive stops the start.
    #[arg(long, default_value = "info")]
    pub log: String,

    /// Log line format: "text" (for people) or "json" (one object per
    /// line, for log shippers; connection lines carry the client's key and
    /// address as fields).
    #[arg(long = "log-format", default_value = "text")]
    pub log_format: String,
}

/// Services other than the DERP server.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum Command {
    /// Relay stock WireGuard over UDP: a static bounce (--target) or a
    /// receiver-index hub (--peer), never decrypting anything.
    UdpRelay(Box<crate::udp::UdpRelayArgs>),
    /// Show what a running relay (DERP or UDP) is doing, from its metrics
    /// endpoint.
    Status(crate::status::StatusArgs),
    /// Check a configuration file (the DERP server's --config or
    /// `ferry udp-relay --config`) without starting anything: exit 0 with a
    /// one-line summary, or 2 with the error.
    CheckConfig(crate::config_file::CheckArgs),
    /// Carry a stock WireGuard interface's datagrams to its peers over
    /// the best path: direct UDP, a relay session or DERP (`ferry link
    /// --config FILE`; `pubkey`, `status`).
    Link(Box<crate::link::LinkArgs>),
}

/// derper image conventions operators already use, and the flag each
/// means (same meaning as in those images).
pub(crate) const DERPER_IMAGE_ENV: &[(&str, &str)] = &[
    ("DERP_ADDR", "a"),
    ("DERP_DOMAIN", "hostname"),
    ("DERP_HOSTNAME", "hostname"),
    ("DERP_CERT_MODE", "certmode"),
    ("DERP_CERT_DIR", "certdir"),
    ("DERP_STUN", "stun"),
    ("DERP_STUN_PORT", "stun-port"),
    ("DERP_HTTP_PORT", "http-port"),
    ("DERP_VERIFY_CLIENTS", "verify-clients"),
    ("DERP_VERIFY_CLIENT_URL", "verify-client-url"),
    (
        "DERP_VERIFY_CLIENT_URL_FAIL_OPEN",
        "verify-client-url-fail-open",
    ),
];

/// The DERP server's flags from the environment, for containers: every
/// long flag as `FERRY_<NAME>` (upper case, `-` as `_`; `-a` is
/// `FERRY_ADDR`), and the `DERP_*` names of common derper images
/// ([`DERPER_IMAGE_ENV`]). They are put in front of the command line, so a
/// flag given there wins over `FERRY_*`, which wins over `DERP_*`; the
/// `--config` file's flags go in front of these
/// ([`crate::config_file::with_file`]), so all of them win over the file.
/// `FERRY_LOG` keeps its own meaning (it overrides `--log`), and nothing is
/// added for a subcommand (`ferry udp-relay`, `ferry status`).
pub(crate) fn flags_from_env(
    argv: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Vec<OsString> {
    use clap::CommandFactory;
    let command = Args::command();
    let subcommand = argv
        .get(1)
        .and_then(|a| a.to_str())
        .is_some_and(|a| command.get_subcommands().any(|c| c.get_name() == a));
    if subcommand {
        return argv;
    }
    let mut from_env: Vec<OsString> = Vec::new();
    for (var, flag) in DERPER_IMAGE_ENV {
        if let Some(v) = env(var) {
            from_env.push(format!("--{flag}={v}").into());
        }
    }
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let name = if long == "a" {
            "ADDR".to_owned()
        } else {
            long.to_uppercase().replace('-', "_")
        };
        if name == "LOG" {
            continue;
        }
        if let Some(v) = env(&format!("FERRY_{name}")) {
            from_env.push(format!("--{long}={v}").into());
        }
    }
    if from_env.is_empty() {
        return argv;
    }
    let mut out = Vec::with_capacity(argv.len() + from_env.len());
    out.extend(argv.first().cloned());
    out.extend(from_env);
    out.extend(argv.into_iter().skip(1));
    out
}

/// Rewrites Go-style single-dash long flags (`-dev`, `-stun-port=1`) to
/// clap's double-dash form. Short flags (`-a`, `-c`) and negative numbers
/// are left alone.
pub(crate) fn normalize_go_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest_are_values = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || rest_are_values {
            out.push(arg);
            continue;
        }
        let Some(s) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            rest_are_values = true;
            out.push(arg);
            continue;
        }
        let bytes = s.as_bytes();
        let single_dash_long = bytes.len() > 2
            && bytes[0] == b'-'
            && bytes[1] != b'-'
            && bytes[1].is_ascii_alphabetic()
            && !(bytes[2] == b'=' && (bytes[1] == b'a' || bytes[1] == b'c'));
        if single_dash_long {
            let name_end = s.find('=').unwrap_or(s.len());
            // "-a" and "-c" with an attached value ("-a:443") stay short.
            if name_end > 2 || s.contains('=') {
                out.push(OsString::from(format!("-{s}")));
                continue;
            }
        }
        out.push(arg);
    }
    out
}

/// Builds the log filter from `spec` (tracing's `EnvFilter` syntax),
/// refusing what tracing would silently drop or misread: a directive that
/// does not parse, and a bare word that is not a level (`verbose`,
/// `debu`), which tracing takes as a target name and thereby turns every
/// other message off. Errors name the directive.
pub(crate) fn log_filter(spec: &str) -> Result<tracing_subscriber::EnvFilter> {
    use tracing_subscriber::filter::{Directive, LevelFilter};
    let mut directives = 0;
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        if let Err(e) = d.parse::<Directive>() {
            bail!("bad directive {d:?}: {e}");
        }
        let bare = !d.contains(['=', '[', '{']);
        if bare && d.parse::<LevelFilter>().is_err() {
            bail!(
                "bad directive {d:?}: not a level (error, warn, info, debug, trace, off); \
                 for one module's logs write target=level, e.g. ferry_derp=debug"
            );
        }
    }
    if directives == 0 {
        bail!("empty filter; give a level such as info");
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(spec)
        .with_context(|| format!("bad filter {spec:?}"))
}

/// A derper flag that ferry does not implement yet.
struct Unsupported {
    /// Its name, without dashes.
    name: &'static str,
    /// It is a Go boolean flag (`-flag` or `-flag=false`, never a separate
    /// value).
    boolean: bool,
    /// derper's default, which changes nothing and is therefore accepted;
    /// `None` when no value is harmless.
    harmless: Option<&'static str>,
    /// What it does in derper.
    what: &'static str,
}

/// derper v1.102.5's flags that ferry does not implement. Each is refused
/// at start (unless given derper's own default, which does nothing): a
/// flag accepted and ignored would leave an operator believing in a
/// behaviour the relay does not have.
const UNSUPPORTED_DERPER_FLAGS: &[Unsupported] = &[
    Unsupported {
        name: "secrets-url",
        boolean: false,
        harmless: Some(""),
        what: "the mesh key from a setec secrets server",
    },
    Unsupported {
        name: "secrets-path-prefix",
        boolean: false,
        harmless: None,
        what: "the mesh key from a setec secrets server",
    },
    Unsupported {
        name: "secrets-cache-dir",
        boolean: false,
        harmless: None,
        what: "the mesh key from a setec secrets server",
    },
    Unsupported {
        name: "acme-ip-certs",
        boolean: true,
        harmless: Some("false"),
        what: "Let's Encrypt certificates for IP addresses",
    },
    Unsupported {
        name: "ace",
        boolean: true,
        harmless: Some("false"),
        what: "the CONNECT proxy",
    },
];

/// Refuses derper flags that ferry does not implement, naming the flag,
/// before anything else happens, and drops those given derper's default
/// value (they change nothing). `args` are in clap's double-dash form
/// (after [`normalize_go_flags`]); what is returned goes to clap.
pub(crate) fn without_derper_defaults(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    out.extend(it.next());
    while let Some(arg) = it.next() {
        let Some(body) = arg.to_str().and_then(|s| s.strip_prefix("--")) else {
            out.push(arg);
            continue;
        };
        if body.is_empty() {
            // "--": the rest are values.
            out.push(arg);
            out.extend(it);
            break;
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let Some(flag) = UNSUPPORTED_DERPER_FLAGS.iter().find(|f| f.name == name) else {
            out.push(arg);
            continue;
        };
        let value = match (inline, flag.boolean) {
            (Some(v), _) => v,
            (None, true) => "true".to_string(),
            (None, false) => it
                .next()
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let harmless = flag
            .harmless
            .is_some_and(|d| d == value || (d == "+Inf" && value.eq_ignore_ascii_case("inf")));
        if !harmless {
            bail!(
                "--{name}: derper's flag for {} is not supported by ferry yet (see \"Differences from derper\" in the README)",
                flag.what
            );
        }
    }
    Ok(out)
}

/// Parses a Go duration ("2s", "10m0s", "1h30m", "250ms", "0").
pub(crate) fn parse_go_duration(s: &str) -> Result<Duration> {
    ferry_proto::godur::parse(s).with_context(|| {
        format!("invalid duration {s:?} (Go syntax: a number and a unit h, m, s, ms, us or ns, as in 10s or 1h30m)")
    })
}

/// Parses derper's -a syntax: "host:port", ":port", "[v6]:port".
pub(crate) fn parse_listen_addr(s: &str) -> Result<SocketAddr> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .with_context(|| format!("-a {s:?}: bad port"))?;
        return Ok(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Some((host, port)) = s.rsplit_once(':') {
        let port: u16 = port
            .parse()
            .with_context(|| format!("-a {s:?}: bad port"))?;
        if host == "localhost" {
            return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
        }
        use std::net::ToSocketAddrs;
        if let Some(a) = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
        {
            return Ok(a);
        }
    }
    bail!("-a {s:?}: expected host:port or :port")
}

/// A duration flag: `0` means "off" (returns `None`) where `zero_ok`,
/// anything else must lie within `min..=max`.
fn duration_flag(
    flag: &str,
    s: &str,
    zero_ok: bool,
    min: Duration,
    max: Duration,
) -> Result<Option<Duration>> {
    let d = parse_go_duration(s).with_context(|| format!("--{flag}"))?;
    if d.is_zero() {
        if zero_ok {
            return Ok(None);
        }
        bail!("--{flag} {s}: must be more than 0");
    }
    if d < min || d > max {
        bail!(
            "--{flag} {s}: must be between {} and {}{}",
            go_duration(min),
            go_duration(max),
            if zero_ok { " (or 0)" } else { "" }
        );
    }
    Ok(Some(d))
}

/// A duration as Go prints one, for messages and logs: "10ms", "3m0s",
/// "1h0m0s", "0s".
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_micros(1) {
        return format!("{}ns", d.as_nanos());
    }
    if ms == 0 {
        return format!("{}µs", d.as_micros());
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

/// Most shard threads either service accepts.
pub(crate) const MAX_WORKERS: usize = 1024;

/// Checks a shard count against the usable CPUs. Zero and more than
/// [`MAX_WORKERS`] are refused; more than `cpus` is allowed (a test box,
/// a container whose CPU quota is not its CPU set) but returns a warning
/// to log, since shards then share cores and pinned ones double up.
pub(crate) fn check_workers(flag: &str, workers: usize, cpus: usize) -> Result<Option<String>> {
    if workers == 0 {
        bail!("{flag} 0: at least one shard is needed (omit {flag} for one per usable core)");
    }
    if workers > MAX_WORKERS {
        bail!("{flag} {workers}: at most {MAX_WORKERS}");
    }
    Ok((workers > cpus).then(|| {
        format!(
            "{flag} {workers} is more than the {cpus} usable CPU(s): shards will share cores \
             (pinned shards double up), which costs latency and throughput"
        )
    }))
}

/// Smallest --send-queue-bytes: one maximum-size DERP packet (64 KiB).
pub(crate) const MIN_SEND_QUEUE_BYTES: usize = 64 << 10;
/// Largest --send-queue-bytes.
pub(crate) const MAX_SEND_QUEUE_BYTES: usize = 1 << 30;

/// What the flags resolve to.
#[derive(Debug)]
pub(crate) struct Plan {
    /// DERP listener.
    pub addr: SocketAddr,
    /// TLS set-up, if TLS.
    pub cert_mode: Option<CertMode>,
    /// Port-80 companion listener.
    pub port80: Option<SocketAddr>,
    /// STUN socket.
    pub stun: Option<SocketAddr>,
    /// Write timeout.
    pub write_timeout: Option<Duration>,
    /// The ACME client's settings (with --certmode letsencrypt).
    pub acme: Option<crate::acme::AcmeOptions>,
    /// How long admission verdicts are kept.
    pub verify_client_cache: Option<Duration>,
    /// TCP keepalive.
    pub tcp_keepalive: Option<Duration>,
    /// TCP user timeout.
    pub tcp_user_timeout: Option<Duration>,
    /// Handshake deadline.
    pub handshake_timeout: Duration,
    /// Shard threads.
    pub workers: usize,
    /// A warning about the shard count, to log once logging is up.
    pub workers_warning: Option<String>,
    /// How long a non-draining client may hold its senders paused.
    pub backpressure_budget: Duration,
    /// How long a shard polls in quiet before it parks (zero: at once).
    pub busy_poll: Duration,
    /// Relay sessions' socket address and table limits, if on.
    pub relay_sessions: Option<(SocketAddr, ferry_udp::session::Limits)>,
}

impl Plan {
    /// Resolves flags and their interplay (dev mode, TLS by port or mode).
    pub(crate) fn from_args(args: &Args) -> Result<Plan> {
        let addr_given = args.addr != ":443";
        let addr = if args.dev && !addr_given {
            SocketAddr::from((Ipv4Addr::LOCALHOST, 3340))
        } else {
            parse_listen_addr(&args.addr)?
        };
        let cert_mode = match (args.dev, args.certmode.as_deref()) {
            (true, None) => None,
            (_, Some("manual")) => Some(CertMode::Manual {
                certdir: certdir(args),
                hostname: args.hostname.clone(),
            }),
            (_, Some("selfsigned")) => Some(CertMode::SelfSigned {
                hostname: args.hostname.clone(),
                certdir: Some(certdir(args)),
            }),
            (_, Some("letsencrypt")) | (false, None)
                if args.certmode.is_some() || addr.port() == 443 =>
            {
                Some(CertMode::Acme {
                    hostname: args.hostname.clone(),
                })
            }
            (_, Some("gcp")) => {
                bail!("--certmode gcp: not supported by ferry yet (Google's certificate manager); use --certmode letsencrypt with --acme-directory, or manual")
            }
            (_, Some(other)) => {
                bail!("--certmode {other:?}: expected letsencrypt, manual or selfsigned")
            }
            (false, None) => None,
        };
        let acme = match &cert_mode {
            Some(CertMode::Acme { .. }) => Some(crate::acme::AcmeOptions {
                directory: args.acme_directory.clone(),
                email: (!args.acme_email.is_empty()).then(|| args.acme_email.clone()),
                certdir: certdir(args),
                challenge: args.acme_challenge.parse()?,
            }),
            _ => None,
        };
        let port80 = match (&cert_mode, args.http_port) {
            (Some(_), p) if p > 0 => Some(SocketAddr::new(
                addr.ip(),
                u16::try_from(p).context("--http-port: out of range")?,
            )),
            (Some(_), -1 | 0) | (None, _) => None,
            (Some(_), p) => bail!("--http-port {p}: expected a port or -1"),
        };
        let stun = args
            .stun
            .then(|| SocketAddr::new(addr.ip(), args.stun_port));
        let q = args.send_queue_bytes;
        if !(MIN_SEND_QUEUE_BYTES..=MAX_SEND_QUEUE_BYTES).contains(&q) {
            bail!(
                "--send-queue-bytes {q}: must be between {MIN_SEND_QUEUE_BYTES} (one maximum-size DERP packet) and {MAX_SEND_QUEUE_BYTES}"
            );
        }
        let cpus = ferry_sys::available_cpus().len().max(1);
        let workers = args.workers.unwrap_or(cpus);
        let workers_warning = check_workers("--workers", workers, cpus)?;
        let us = Duration::from_micros;
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        Ok(Plan {
            addr,
            acme,
            cert_mode,
            port80,
            stun,
            write_timeout: duration_flag(
                "tcp-write-timeout",
                &args.tcp_write_timeout,
                true,
                ms(10),
                secs(3600),
            )?,
            // The kernel's TCP_KEEPIDLE limit is 32767 s.
            tcp_keepalive: duration_flag(
                "tcp-keepalive-time",
                &args.tcp_keepalive_time,
                true,
                secs(1),
                secs(32767),
            )?,
            tcp_user_timeout: duration_flag(
                "tcp-user-timeout",
                &args.tcp_user_timeout,
                true,
                secs(1),
                secs(24 * 3600),
            )?,
            verify_client_cache: duration_flag(
                "verify-client-cache",
                &args.verify_client_cache,
                true,
                secs(1),
                secs(24 * 3600),
            )?,
            handshake_timeout: duration_flag(
                "handshake-timeout",
                &args.handshake_timeout,
                false,
                ms(100),
                secs(600),
            )?
            .context("--handshake-timeout: must be more than 0")?,
            workers,
            workers_warning,
            backpressure_budget: duration_flag(
                "backpressure-budget",
                &args.backpressure_budget,
                true,
                ms(1),
                secs(60),
            )?
            .unwrap_or(Duration::ZERO),
            busy_poll: duration_flag("busy-poll", &args.busy_poll, true, us(1), ms(10))?
                .unwrap_or(Duration::ZERO),
            relay_sessions: match args.relay_port {
                None => None,
                Some(port) => {
                    if args.relay_sessions_per_key == 0 {
                        bail!("--relay-sessions-per-key 0: must be at least 1");
                    }
                    let idle = duration_flag(
                        "relay-idle-timeout",
                        &args.relay_idle_timeout,
                        false,
                        secs(1),
                        secs(3600),
                    )?
                    .context("--relay-idle-timeout: must be more than 0")?;
                    let limits = ferry_udp::session::Limits {
                        per_key: args.relay_sessions_per_key,
                        idle_lifetime: idle,
                        ..Default::default()
                    };
                    Some((SocketAddr::new(addr.ip(), port), limits))
                }
            },
        })
    }
}

fn certdir(args: &Args) -> PathBuf {
    if let Some(d) = &args.certdir {
        return d.clone();
    }
    if ferry_sys::is_root() {
        return PathBuf::from("/var/lib/ferry/certs");
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("ferry-certs")
}

/// Where the server key lives by default.
pub(crate) fn default_key_path() -> PathBuf {
    if ferry_sys::is_root() {
        PathBuf::from("/var/lib/ferry/ferry.key")
    } else {
        std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .unwrap_or_else(|| PathBuf::from("."))
            .join("ferry")
            .join("ferry.key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Args {
        let mut v = vec!["ferry"];
        v.extend_from_slice(list);
        Args::parse_from(normalize_go_flags(v.into_iter().map(OsString::from)))
    }

    #[test]
    fn go_style_flags_parse() {
        let a = args(&[
            "-dev",
            "-a",
            "127.0.0.1:9",
            "-stun-port=5",
            "-stun=false",
            "-http-port",
            "-1",
            "-c",
            "k.json",
        ]);
        assert!(a.dev);
        assert_eq!(a.addr, "127.0.0.1:9");
        assert_eq!(a.stun_port, 5);
        assert!(!a.stun);
        assert_eq!(a.http_port, -1);
        assert_eq!(a.config.as_deref(), Some(std::path::Path::new("k.json")));
        let b = args(&["--dev", "--certmode", "manual", "--hostname", "h"]);
        assert!(b.dev);
        assert_eq!(b.certmode.as_deref(), Some("manual"));
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(
            parse_go_duration("10m0s").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(
            parse_go_duration("1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("1x").is_err());
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen_addr(":443").unwrap(),
            "[::]:443".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("127.0.0.1:3340").unwrap(),
            "127.0.0.1:3340".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:1").unwrap(),
            "[::1]:1".parse().unwrap()
        );
        assert!(parse_listen_addr("nonsense").is_err());
    }

    #[test]
    fn dev_mode_defaults_and_tls_choice() {
        let p = Plan::from_args(&args(&["--dev"])).unwrap();
        assert_eq!(p.addr, "127.0.0.1:3340".parse().unwrap());
        assert!(p.cert_mode.is_none());
        assert_eq!(p.stun, Some("127.0.0.1:3478".parse().unwrap()));
        let p = Plan::from_args(&args(&["-a", "127.0.0.1:8443"])).unwrap();
        assert!(
            p.cert_mode.is_none(),
            "non-443 without --certmode is plain HTTP, like derper"
        );
        let p = Plan::from_args(&args(&[
            "-a",
            "127.0.0.1:8443",
            "--certmode",
            "manual",
            "--http-port",
            "-1",
        ]))
        .unwrap();
        assert!(p.cert_mode.is_some());
        assert!(p.port80.is_none());
        let p = Plan::from_args(&args(&["--certmode", "letsencrypt"])).unwrap();
        assert!(matches!(p.cert_mode, Some(CertMode::Acme { .. })));
        assert!(Plan::from_args(&args(&["--certmode", "gcp"])).is_err());
        assert!(Plan::from_args(&args(&[
            "--certmode",
            "letsencrypt",
            "--acme-challenge",
            "dns-01"
        ]))
        .is_err());
        let p = Plan::from_args(&args(&["-tcp-write-timeout", "0"])).unwrap();
        assert!(p.write_timeout.is_none());
    }

    #[test]
    fn flags_from_the_environment() {
        let argv = |list: &[&str]| -> Vec<OsString> {
            std::iter::once("ferry")
                .chain(list.iter().copied())
                .map(OsString::from)
                .collect()
        };
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let out = flags_from_env(
            argv(&["--hostname", "flag.example"]),
            env(&[
                ("DERP_DOMAIN", "image.example"),
                ("FERRY_HOSTNAME", "env.example"),
                ("FERRY_STUN_PORT", "3479"),
                ("FERRY_ADDR", ":8443"),
                ("FERRY_LOG", "debug"),
                ("FERRY_ARGS", "--io epoll"),
            ]),
        );
        // DERP_* first, then FERRY_*, then the command line: later wins.
        let args = Args::parse_from(out.clone());
        assert_eq!(args.hostname, "flag.example");
        assert_eq!(args.stun_port, 3479);
        assert_eq!(args.addr, ":8443");
        assert_eq!(args.log, "info", "FERRY_LOG is not turned into --log");
        let out = flags_from_env(
            argv(&[]),
            env(&[
                ("DERP_DOMAIN", "image.example"),
                ("FERRY_HOSTNAME", "env.example"),
            ]),
        );
        assert_eq!(Args::parse_from(out).hostname, "env.example");
        let out = flags_from_env(
            argv(&[]),
            env(&[
                ("DERP_DOMAIN", "image.example"),
                ("DERP_CERT_MODE", "manual"),
            ]),
        );
        let args = Args::parse_from(out);
        assert_eq!(args.hostname, "image.example");
        assert_eq!(args.certmode.as_deref(), Some("manual"));
        // A subcommand gets nothing from the environment.
        let out = flags_from_env(argv(&["status"]), env(&[("FERRY_HOSTNAME", "env.example")]));
        assert_eq!(out, argv(&["status"]));
    }

    #[test]
    fn derper_flags_without_ferry_support() {
        let argv = |list: &[&str]| -> Vec<OsString> {
            std::iter::once("ferry")
                .chain(list.iter().copied())
                .map(OsString::from)
                .collect()
        };
        let e = without_derper_defaults(argv(&["--secrets-url", "https://x"])).unwrap_err();
        assert!(e.to_string().starts_with("--secrets-url: "), "{e}");
        // A boolean flag never takes the next argument as its value.
        let e = without_derper_defaults(argv(&["--ace", "-a", ":1"])).unwrap_err();
        assert!(e.to_string().starts_with("--ace: "), "{e}");
        // derper's defaults are dropped; everything else is kept in order.
        let kept = without_derper_defaults(argv(&[
            "--acme-ip-certs=false",
            "-a",
            ":1",
            "--ace=false",
            "--secrets-url",
            "",
            "--dev",
        ]))
        .unwrap();
        assert_eq!(kept, argv(&["-a", ":1", "--dev"]));
        // After "--" nothing is a flag.
        let kept = without_derper_defaults(argv(&["--", "--ace"])).unwrap();
        assert_eq!(kept, argv(&["--", "--ace"]));
    }

    #[test]
    fn log_filters_name_the_bad_directive() {
        assert!(log_filter("info").is_ok());
        assert!(log_filter("warn,ferry_derp=debug").is_ok());
        let e = log_filter("info,verbose").unwrap_err().to_string();
        assert!(e.starts_with("bad directive \"verbose\""), "{e}");
        let e = log_filter("ferry=loud").unwrap_err().to_string();
        assert!(e.starts_with("bad directive \"ferry=loud\""), "{e}");
        assert!(log_filter(" , ").is_err());
    }

    #[test]
    fn busy_poll_is_off_by_default_and_bounded() {
        let p = Plan::from_args(&args(&["--dev"])).unwrap();
        assert_eq!(p.busy_poll, Duration::ZERO);
        let p = Plan::from_args(&args(&["--dev", "--busy-poll", "50us"])).unwrap();
        assert_eq!(p.busy_poll, Duration::from_micros(50));
        let e = Plan::from_args(&args(&["--dev", "--busy-poll", "1s"]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--busy-poll 1s: must be between 1µs and 10ms (or 0)");
    }

    #[test]
    fn ranges_and_worker_counts() {
        let ms = Duration::from_millis;
        assert_eq!(duration_flag("x", "0", true, ms(1), ms(10)).unwrap(), None);
        assert!(duration_flag("x", "0", false, ms(1), ms(10)).is_err());
        let e = duration_flag("x", "1h", true, ms(10), Duration::from_secs(60))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--x 1h: must be between 10ms and 1m0s (or 0)");
        assert_eq!(go_duration(Duration::from_secs(32767)), "9h6m7s");
        assert_eq!(go_duration(Duration::from_micros(50)), "50µs");
        assert_eq!(go_duration(Duration::from_nanos(5)), "5ns");
        assert!(check_workers("--workers", 0, 2).is_err());
        assert!(check_workers("--workers", 1025, 2).is_err());
        assert_eq!(check_workers("--workers", 2, 2).unwrap(), None);
        assert!(check_workers("--workers", 3, 2).unwrap().is_some());
    }
}
