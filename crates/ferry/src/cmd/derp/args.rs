//! The DERP server's flags (derper's names, Go's syntax), and how the
//! configuration file and the environment are layered under them
//! ([`layered`]; the order is [`crate::flags`]'s).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, FromArgMatches};

use crate::flags::{self, Given, Origins};

/// The DERP server: the default service of `ferry`.
#[derive(clap::Args, Debug)]
pub(crate) struct DerpArgs {
    /// Listen address, as host:port; ":443" listens on every address.
    /// TLS is used on port 443 or with --certmode; otherwise plain HTTP.
    #[arg(
        short = 'a',
        long = "addr",
        visible_alias = "a",
        default_value = ":443"
    )]
    pub addr: String,

    /// Development mode: plain HTTP on 127.0.0.1:3340 (unless -a is given),
    /// STUN on port 3478 of every address (IPv4 and IPv6, as derper -dev),
    /// a fresh key, and a printed DERP map.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub dev: bool,

    /// TOML file setting any of these flags, one key per flag (`stun_port =
    /// 3478`, `-a` is `addr`, `-c` is `key_file`; `ferry check-config FILE`
    /// checks one). Precedence: command line, then FERRY_* and DERP_*
    /// variables, then the file, then the defaults.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,

    /// Server key file ({"PrivateKey":"privkey:…"}, as derper's); created if
    /// missing. Default: $STATE_DIRECTORY/ferry.key under a service manager
    /// that sets it (systemd's StateDirectory=), else
    /// /var/lib/ferry/ferry.key as root, else
    /// $XDG_CONFIG_HOME/ferry/ferry.key (~/.config/ferry/ferry.key).
    /// derper's -c.
    #[arg(short = 'c', long = "key-file", visible_alias = "c")]
    pub key_file: Option<PathBuf>,

    /// Certificate mode: "letsencrypt" (from an ACME CA, --acme-directory;
    /// kept and renewed in --certdir), "manual" (<certdir>/<hostname>.crt
    /// and .key; an IP hostname without files gets a generated certificate)
    /// or "selfsigned" (generated once, kept in --certdir). derper's "gcp"
    /// is not supported. Default: letsencrypt on port 443, as derper.
    #[arg(long)]
    pub certmode: Option<String>,

    /// Directory holding the certificate files (--certmode manual), the
    /// generated certificate (selfsigned) or the ACME account and
    /// certificates (letsencrypt). Default: $STATE_DIRECTORY/certs under a
    /// service manager that sets it, else /var/lib/ferry/certs as root,
    /// else $XDG_CACHE_HOME/ferry-certs (~/.cache/ferry-certs).
    #[arg(long)]
    pub certdir: Option<PathBuf>,

    /// ACME directory for --certmode letsencrypt: any RFC 8555 CA (Let's
    /// Encrypt's staging, ZeroSSL, step-ca, ...). Its TLS certificate is
    /// checked against the system's CAs (SSL_CERT_FILE honoured).
    #[arg(long = "acme-directory", default_value = super::acme::LETS_ENCRYPT)]
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
    /// checks, redirects to HTTPS); -1 disables, 0 is a port the system
    /// picks (as for every port flag).
    #[arg(
        long = "http-port",
        default_value_t = 80,
        allow_negative_numbers = true
    )]
    pub http_port: i32,

    /// Run the STUN server.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub stun: bool,

    /// UDP port for STUN (bound on the -a address; 0: a port the system
    /// picks).
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

    /// Relay sessions across the nodes of a region: where clients of every
    /// node reach this node's session socket (`IP` or `IP:PORT`, comma
    /// separated, at most 16; the port defaults to --relay-port's). Offers
    /// name these instead of the bound address. Without it, a node whose
    /// session socket is bound to an unspecified address (`-a :443`)
    /// names its interface addresses (not loopback, not IPv6 link-local)
    /// in the offers of pairs split across nodes, and the bound address
    /// in the others.
    #[arg(
        long = "relay-advertise",
        value_delimiter = ',',
        value_name = "IP[:PORT]"
    )]
    pub relay_advertise: Vec<String>,

    /// Join a tailnet at this control server (Headscale;
    /// `http://host[:port]` or `https://host[:port]`, its certificate
    /// checked against the system's CAs, SSL_CERT_FILE honoured)
    /// as a node, and serve its nodes as a Tailscale peer relay on
    /// --peer-relay-port. Goes with --tailnet-auth-key-file and
    /// --peer-relay-port; the node's keys are kept in ferry-tailnet.json
    /// beside the -c key file.
    #[arg(long = "tailnet-login-server", value_name = "URL")]
    pub tailnet_login_server: Option<String>,

    /// File holding the tailnet pre-auth key (a reusable key made with the
    /// relay's tag), used when the node registers.
    #[arg(long = "tailnet-auth-key-file", value_name = "FILE")]
    pub tailnet_auth_key_file: Option<PathBuf>,

    /// UDP port of the peer relay (Tailscale's peer-relay protocol), bound
    /// on the -a address (0: a port the system picks).
    #[arg(long = "peer-relay-port")]
    pub peer_relay_port: Option<u16>,

    /// The peer relay's public addresses (`ADDR:PORT,...`) to offer
    /// clients instead of the -a address (or the interfaces' addresses):
    /// for a relay behind NAT or a port forward. Needs the tailnet flags.
    #[arg(long = "peer-relay-endpoints", value_name = "ADDR:PORT,...")]
    pub peer_relay_endpoints: Option<String>,

    /// The node's host name in the tailnet (default: this host's name).
    #[arg(long = "tailnet-hostname")]
    pub tailnet_hostname: Option<String>,

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

    /// Client application names (clientInfo `AppName`) to refuse,
    /// comma-separated as derper splits them (no trimming; an empty element,
    /// as in `bad,`, refuses clients that send no name). Mesh peers are
    /// exempt; checked before admission.
    #[arg(long = "disallow-app-names", default_value = "")]
    pub disallow_app_names: String,

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
    pub tls_records: ferry_derp::config::TlsRecords,

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
    /// syntax); also FERRY_LOG, as every flag's variable. A bad directive
    /// stops the start.
    #[arg(long, default_value = "info")]
    pub log: String,

    /// Log line format: "text" (for people) or "json" (one object per
    /// line, for log shippers; connection lines carry the client's key and
    /// address as fields).
    #[arg(long = "log-format", default_value = "text")]
    pub log_format: String,
}

/// The DERP server's flags as a command of their own (what the file's
/// keys and the variables are checked against).
pub(crate) fn command() -> clap::Command {
    DerpArgs::augment_args(clap::Command::new("ferry").args_override_self(true))
}

/// The DERP server's flags from `argv` alone (no file, no environment),
/// for `ferry check-config` and tests.
pub(crate) fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<DerpArgs> {
    let matches = command().try_get_matches_from(argv)?;
    Ok(DerpArgs::from_arg_matches(&matches)?)
}

/// The command line `argv` (Go-style flags already turned into clap's
/// form) with the `--config` file's flags and then the environment's put
/// in front, so that each later source wins; and who set what. The file
/// is `--config` on the command line, else `FERRY_CONFIG`.
///
/// A command line clap refuses (or `--help`) is returned as it is: the
/// real parse then reports it.
pub(crate) fn layered(
    argv: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Vec<OsString>, Origins)> {
    let command = command();
    let Ok(matches) = command.clone().try_get_matches_from(&argv) else {
        return Ok((argv, Origins::default()));
    };
    let from_command_line = flags::from_command_line(&command, &matches);
    let from_env = flags::env::given(&command, super::derper::DERPER_IMAGE_ENV, env)?;
    let config = from_env
        .iter()
        .chain(&from_command_line)
        .rfind(|g| g.long == "config")
        .map(|g| PathBuf::from(&g.value));
    let from_file = match config {
        Some(path) => flags::file::read(&path, &command, file_hint)?,
        None => Vec::new(),
    };
    let mut out = Vec::with_capacity(argv.len() + from_file.len() + from_env.len());
    let mut rest = argv.into_iter();
    out.extend(rest.next());
    out.extend(from_file.iter().chain(&from_env).map(Given::flag));
    out.extend(rest);
    let given = [from_file, from_env, from_command_line].concat();
    Ok((out, Origins::new(&command, given)))
}

/// Keys of `ferry udp-relay --config` files that the DERP server does not
/// have: a DERP-server file holding one is probably a UDP relay's.
pub(crate) const UDP_ONLY_KEYS: &[&str] = &[
    "bounce",
    "hub",
    "gro",
    "gso",
    "recv_buffer",
    "send_buffer",
    "handshake_rate",
    "handshake_burst",
];

/// Why a DERP-server file may hold an unknown key: it is another file.
pub(crate) fn file_hint(key: &str) -> Option<String> {
    UDP_ONLY_KEYS
        .contains(&key)
        .then(|| "a `ferry udp-relay --config` key: this file is for the DERP server".to_string())
}

/// The state directory a service manager gives the service: systemd's
/// `StateDirectory=` sets `STATE_DIRECTORY` (the first, if several). The
/// defaults below live there, so that a unit needs no flags for them and
/// the configuration file can still set them.
fn state_directory() -> Option<PathBuf> {
    let dirs = std::env::var_os("STATE_DIRECTORY")?;
    let first = dirs.to_str()?.split(':').next()?;
    (!first.is_empty()).then(|| PathBuf::from(first))
}

/// Where certificates live by default.
pub(crate) fn default_certdir() -> PathBuf {
    if let Some(dir) = state_directory() {
        return dir.join("certs");
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
    if let Some(dir) = state_directory() {
        return dir.join("ferry.key");
    }
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

impl DerpArgs {
    /// The certificate directory: --certdir, else the default.
    pub(crate) fn certdir(&self) -> PathBuf {
        self.certdir.clone().unwrap_or_else(default_certdir)
    }

    /// The key file: --key-file, else the default; `None` in dev mode
    /// without one (a fresh key each run).
    pub(crate) fn key_path(&self) -> Option<PathBuf> {
        match (&self.key_file, self.dev) {
            (Some(p), _) => Some(p.clone()),
            (None, true) => None,
            (None, false) => Some(default_key_path()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(list: &[&str]) -> Vec<OsString> {
        std::iter::once("ferry")
            .chain(list.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn env(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    fn resolved(argv: Vec<OsString>, env: impl Fn(&str) -> Option<String>) -> (DerpArgs, Origins) {
        let (argv, origins) = layered(argv, env).unwrap();
        (parse(argv).unwrap(), origins)
    }

    #[test]
    fn command_line_beats_environment_beats_file() {
        let file = std::env::temp_dir().join(format!("ferry-layered-{}.toml", std::process::id()));
        std::fs::write(
            &file,
            "hostname = \"file.example\"\nstun_port = 1\nworkers = 3\nlog = \"warn\"\n",
        )
        .unwrap();
        let config = file.display().to_string();
        let (args, origins) = resolved(
            argv(&["--config", &config, "--hostname", "flag.example"]),
            env(vec![
                ("DERP_DOMAIN", "image.example".into()),
                ("FERRY_HOSTNAME", "env.example".into()),
                ("FERRY_STUN_PORT", "3479".into()),
                ("DERP_STUN_PORT", "3480".into()),
                ("FERRY_LOG", "debug".into()),
            ]),
        );
        assert_eq!(args.hostname, "flag.example");
        assert_eq!(args.stun_port, 3479, "FERRY_* over DERP_* over the file");
        assert_eq!(args.workers, Some(3), "the file over the default");
        assert_eq!(args.log, "debug", "FERRY_LOG is --log's variable");
        assert!(origins.disagreements().iter().any(|d| d
            .starts_with("--hostname: --hostname \"flag.example\" on the command line wins over")));
        // FERRY_CONFIG names the file; no file, no environment: as given.
        let (args, _) = resolved(argv(&[]), env(vec![("FERRY_CONFIG", config.clone())]));
        assert_eq!(args.hostname, "file.example");
        let (args, origins) = resolved(argv(&["--dev"]), env(vec![]));
        assert!(args.dev && origins.given().len() == 1);
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn every_flag_has_one_file_key() {
        let keys = flags::file::keys(&command());
        let mut names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert!(names.contains(&"stun_port") && !names.contains(&"config"));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "two flags share a key");
    }

    /// The example file names every key (set or commented out), and what
    /// it sets is the default: it documents the defaults truly.
    #[test]
    fn the_example_file_has_every_key_at_its_default() {
        let text = include_str!("../../../../../packaging/ferry.toml");
        for (key, _) in flags::file::keys(&command()) {
            let shown = text.lines().any(|l| {
                let l = l.trim_start_matches("# ");
                l.strip_prefix(key.as_str())
                    .is_some_and(|rest| rest.starts_with(" = "))
            });
            assert!(shown, "packaging/ferry.toml has no line for `{key}`");
        }
        let given = flags::file::parse("ferry.toml", text, &command(), file_hint).unwrap();
        let argv = std::iter::once(OsString::from("ferry")).chain(given.iter().map(Given::flag));
        let from_file = format!("{:?}", parse(argv).unwrap());
        let defaults = format!("{:?}", parse([OsString::from("ferry")]).unwrap());
        assert_eq!(from_file, defaults);
    }
}
