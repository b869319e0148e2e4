//! What the DERP server's flags resolve to, checked before anything is
//! bound or written: the listeners, TLS, timeouts, limits ([`Plan`]), and
//! the server's settings with the files they name read ([`prepare`]).
//! `ferry check-config` runs the same checks.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry_derp::bootstrap_dns::{self, BootstrapDns};
use ferry_derp::certs::CertMode;
use ferry_derp::config::AdmissionConfig;
use ferry_derp::{DerpConfig, HomePage};
use ferry_proto::key::MeshKey;
use ferry_proto::rate_config::RateConfig;

use super::args::DerpArgs;
use crate::flags::values::{check_workers, duration_flag};
use crate::key_file::KeyFile;

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

/// Refuses a name no CA certifies (`localhost`, `*.localhost`, a name
/// without a dot) for an ACME certificate: the relay would run with every
/// TLS handshake failing. This is what a start with nothing configured
/// (port 443, `--hostname localhost`) meets, so it stops, saying what to
/// set.
fn check_acme_hostname(hostname: &str) -> Result<()> {
    let name = hostname.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") || !name.contains('.') {
        bail!(
            "--hostname {hostname}: --certmode letsencrypt (the default on port 443) needs the relay's \
             public DNS name, and no CA certifies {hostname:?}: set --hostname (`hostname` in the \
             --config file, FERRY_HOSTNAME), or use --certmode manual or selfsigned, or --dev to \
             try it on this host"
        );
    }
    Ok(())
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
    pub acme: Option<super::acme::AcmeOptions>,
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
    /// Warnings to log once logging is up (the shard count, a missing
    /// tailscaled socket).
    pub warnings: Vec<String>,
    /// How long a non-draining client may hold its senders paused.
    pub backpressure_budget: Duration,
    /// How long a shard polls in quiet before it parks (zero: at once).
    pub busy_poll: Duration,
    /// Relay sessions' socket address and table limits, if on.
    pub relay_sessions: Option<(SocketAddr, ferry_udp::session::Limits)>,
    /// `--relay-advertise`: addresses, each with its port if given.
    pub relay_advertise: Vec<(IpAddr, Option<u16>)>,
    /// The tailnet node and its peer relay, if on.
    pub peer_relay: Option<super::tailnet::PeerRelayPlan>,
}

impl Plan {
    /// Resolves flags and their interplay (dev mode, TLS by port or mode).
    pub(crate) fn from_args(args: &DerpArgs) -> Result<Plan> {
        let addr_given = args.addr != ":443";
        let addr = if args.dev && !addr_given {
            SocketAddr::from((Ipv4Addr::LOCALHOST, 3340))
        } else {
            parse_listen_addr(&args.addr)?
        };
        let cert_mode = match (args.dev, args.certmode.as_deref()) {
            (true, None) => None,
            (_, Some("manual")) => Some(CertMode::Manual {
                certdir: args.certdir(),
                hostname: args.hostname.clone(),
            }),
            (_, Some("selfsigned")) => Some(CertMode::SelfSigned {
                hostname: args.hostname.clone(),
                certdir: Some(args.certdir()),
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
        if let Some(CertMode::Acme { hostname }) = &cert_mode {
            check_acme_hostname(hostname)?;
        }
        let acme = match &cert_mode {
            Some(CertMode::Acme { .. }) => Some(super::acme::AcmeOptions {
                directory: args.acme_directory.clone(),
                email: (!args.acme_email.is_empty()).then(|| args.acme_email.clone()),
                certdir: args.certdir(),
                challenge: args.acme_challenge.parse()?,
            }),
            _ => None,
        };
        // Port 0 is a port the system picks, as for every port flag.
        let port80 = match (&cert_mode, args.http_port) {
            (Some(_), p) if p >= 0 => Some(SocketAddr::new(
                addr.ip(),
                u16::try_from(p).context("--http-port: out of range")?,
            )),
            (Some(_), -1) | (None, _) => None,
            (Some(_), p) => {
                bail!("--http-port {p}: expected a port (0: one the system picks) or -1 (none)")
            }
        };
        // In dev mode without -a, STUN answers on every address, IPv4 and
        // IPv6 (one dual-stack socket), as derper -dev does and derpprobe
        // checks; the DERP listener itself stays on 127.0.0.1.
        let stun_ip = if args.dev && !addr_given {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            addr.ip()
        };
        let stun = args.stun.then(|| SocketAddr::new(stun_ip, args.stun_port));
        let q = args.send_queue_bytes;
        if !(MIN_SEND_QUEUE_BYTES..=MAX_SEND_QUEUE_BYTES).contains(&q) {
            bail!(
                "--send-queue-bytes {q}: must be between {MIN_SEND_QUEUE_BYTES} (one maximum-size DERP packet) and {MAX_SEND_QUEUE_BYTES}"
            );
        }
        let cpus = ferry_sys::available_cpus().len().max(1);
        let workers = args.workers.unwrap_or(cpus);
        let mut warnings: Vec<String> = check_workers("--workers", workers, cpus)?
            .into_iter()
            .collect();
        warnings.extend(verify_clients_warning(args));
        let us = Duration::from_micros;
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        let peer_relay = super::tailnet::PeerRelayPlan::from_args(args, addr.ip())?;
        let relay_advertise = relay_advertise(&args.relay_advertise)?;
        if !relay_advertise.is_empty() && args.relay_port.is_none() {
            bail!("--relay-advertise: goes with --relay-port");
        }
        Ok(Plan {
            relay_advertise,
            peer_relay,
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
            warnings,
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

/// `--disallow-app-names` as derper reads it: unset (empty) refuses
/// nothing; otherwise a comma split that keeps empty elements, so a
/// trailing comma refuses clients without a name.
fn disallowed_app_names(flag: &str) -> HashSet<String> {
    if flag.is_empty() {
        return HashSet::new();
    }
    flag.split(',').map(str::to_owned).collect()
}

/// With --verify-clients, what every client gets when tailscaled's
/// LocalAPI socket is not there (yet): refused, since nobody can say it
/// is a peer. Not an error, as tailscaled may start after the relay.
fn verify_clients_warning(args: &DerpArgs) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    if !args.verify_clients {
        return None;
    }
    let why = match std::fs::metadata(&args.socket) {
        Ok(m) if m.file_type().is_socket() => return None,
        Ok(_) => "is not a socket".to_string(),
        Err(e) => format!("cannot be used ({e})"),
    };
    Some(format!(
        "--verify-clients: tailscaled's LocalAPI socket {} {why}: every client is refused \
         until tailscaled answers there (start tailscaled, or name its socket with --socket)",
        args.socket.display()
    ))
}

/// What the DERP server's flags resolve to, checked, before anything is
/// bound or written.
pub(crate) struct Prepared {
    pub(crate) plan: Plan,
    pub(crate) key: KeyFile,
    pub(crate) config: DerpConfig,
    pub(crate) rate_path: Option<PathBuf>,
    pub(crate) dns: Arc<BootstrapDns>,
}

/// `ferry check-config` for a DERP-server file: every check a start makes
/// before binding anything; returns a one-line summary.
pub(crate) fn check(args: &DerpArgs) -> Result<String> {
    crate::logs::log_filter(&args.log).with_context(|| format!("--log {:?}", args.log))?;
    crate::logs::check_format(&args.log_format)?;
    let p = prepare(args)?;
    for warning in &p.plan.warnings {
        eprintln!("ferry: check-config: warning: {warning}");
    }
    // A manual certificate's files, read as the start reads them (for an
    // IP address without files the start generates one; selfsigned and
    // letsencrypt make their own, so nothing is read for them).
    if let Some(mode @ CertMode::Manual { hostname, .. }) = &p.plan.cert_mode {
        if hostname.parse::<IpAddr>().is_err() {
            ferry_derp::certs::server_config(mode, *p.config.public_key.as_bytes())
                .context("setting up TLS")?;
        }
    }
    let tls = match &p.plan.cert_mode {
        None => "plain HTTP".to_string(),
        Some(CertMode::Manual { hostname, .. }) => format!("TLS (manual) for {hostname}"),
        Some(CertMode::SelfSigned { hostname, .. }) => format!("TLS (selfsigned) for {hostname}"),
        Some(CertMode::Acme { hostname }) => format!("TLS (letsencrypt) for {hostname}"),
    };
    let off = || "off".to_string();
    let key = match (&p.key.unsaved, args.key_path()) {
        (Some(path), _) => format!("{} (created at the first start)", path.display()),
        (None, Some(path)) => path.display().to_string(),
        (None, None) => "a fresh one each run (--dev)".into(),
    };
    Ok(format!(
        "{} {} ({tls}{}), port 80 {}, STUN {}, metrics {}, {} workers, admission {}, key {}",
        if args.dev {
            "dev relay on"
        } else {
            "listens on"
        },
        p.plan.addr,
        if p.config.derp_enabled {
            ""
        } else {
            ", DERP off"
        },
        p.plan.port80.map_or_else(off, |a| a.to_string()),
        p.plan.stun.map_or_else(off, |a| a.to_string()),
        args.metrics_addr.map_or_else(off, |a| a.to_string()),
        p.plan.workers,
        admission_summary(&p.config.admission),
        key,
    ))
}

/// Resolves and checks the DERP server's flags, reading (never writing)
/// the files they name: the key, the mesh key, the rate config.
pub(crate) fn prepare(args: &DerpArgs) -> Result<Prepared> {
    let plan = Plan::from_args(args)?;
    let key = match args.key_path() {
        Some(path) => KeyFile::load(&path, "-c")?,
        None => KeyFile::ephemeral(),
    };
    let mut config = DerpConfig::new(key.private.clone());
    config.derp_enabled = args.derp;
    config.write_timeout = plan.write_timeout;
    config.tcp_keepalive = plan.tcp_keepalive;
    config.tcp_user_timeout = plan.tcp_user_timeout;
    config.handshake_timeout = plan.handshake_timeout;
    config.send_queue_bytes = args.send_queue_bytes;
    config.backpressure_budget = plan.backpressure_budget;
    config.busy_poll = plan.busy_poll;
    config.home = match args.home.as_str() {
        "" => HomePage::Default,
        "blank" => HomePage::Blank,
        url if url.starts_with("http://") || url.starts_with("https://") => {
            HomePage::Redirect(url.to_string())
        }
        other => bail!("--home: expected \"\", \"blank\" or an http(s) URL, got {other:?}"),
    };
    if let Some(path) = &args.mesh_psk_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--mesh-psk-file: reading {}", path.display()))?;
        config.mesh_key = Some(
            MeshKey::parse(&text)
                .map_err(|e| anyhow::anyhow!("--mesh-psk-file {}: {e}", path.display()))?,
        );
    }

    config.mesh_with = ferry_derp::config::MeshPeer::parse_list(&args.mesh_with)?;
    if !config.mesh_with.is_empty() && config.mesh_key.is_none() {
        bail!("--mesh-with requires --mesh-psk-file");
    }

    if !(1..=1024).contains(&args.verify_client_concurrency) {
        bail!(
            "--verify-client-concurrency {}: must be between 1 and 1024",
            args.verify_client_concurrency
        );
    }
    config.admission = AdmissionConfig {
        local_socket: args.verify_clients.then(|| args.socket.clone()),
        url: (!args.verify_client_url.is_empty()).then(|| args.verify_client_url.clone()),
        fail_open: args.verify_client_url_fail_open,
        cache_for: plan.verify_client_cache,
        concurrency: args.verify_client_concurrency,
        ..AdmissionConfig::default()
    };
    if args.accept_connection_limit.is_nan() || args.accept_connection_limit < 0.0 {
        bail!(
            "--accept-connection-limit {}: must be 0 or more (connections per second)",
            args.accept_connection_limit
        );
    }
    if args.accept_connection_burst < 0 {
        bail!(
            "--accept-connection-burst {}: must be 0 or more",
            args.accept_connection_burst
        );
    }
    if args.accept_connection_limit.is_finite() {
        config.accept_limit = Some((
            args.accept_connection_limit,
            args.accept_connection_burst as f64,
        ));
    }
    let rate_path = (!args.rate_config.is_empty()).then(|| PathBuf::from(&args.rate_config));
    if let Some(path) = &rate_path {
        config.rate = load_rate_config(path)?;
    }
    config.trusted_proxies = args
        .trusted_proxies
        .parse()
        .map_err(|e| anyhow::anyhow!("--trusted-proxies: {e}"))?;
    config.proxy_protocol = args.proxy_protocol;
    config.disallowed_app_names = disallowed_app_names(&args.disallow_app_names);
    if config.proxy_protocol && config.trusted_proxies.is_empty() {
        bail!("--proxy-protocol needs --trusted-proxies: the addresses of the proxies that send PROXY headers");
    }
    let published = bootstrap_dns::parse_names("--bootstrap-dns-names", &args.bootstrap_dns_names)?;
    let unpublished = bootstrap_dns::parse_names(
        "--unpublished-bootstrap-dns-names",
        &args.unpublished_bootstrap_dns_names,
    )?;
    let dns = bootstrap_dns::BootstrapDns::new(published, unpublished);
    config.bootstrap_dns = Some(dns.clone());
    Ok(Prepared {
        plan,
        key,
        config,
        rate_path,
        dns,
    })
}

/// Reads `--rate-config` (derper's JSON).
pub(crate) fn load_rate_config(path: &std::path::Path) -> Result<RateConfig> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("--rate-config: reading {}", path.display()))?;
    RateConfig::parse(&bytes).with_context(|| format!("--rate-config {}", path.display()))
}

/// One line on who may register, for the start-up log.
pub(crate) fn admission_summary(a: &AdmissionConfig) -> String {
    let mut parts = Vec::new();
    if let Some(socket) = &a.local_socket {
        parts.push(format!("tailscaled at {}", socket.display()));
    }
    if let Some(url) = &a.url {
        let open = if a.fail_open { "open" } else { "closed" };
        let url = ferry_derp::admission::redact_url(url);
        parts.push(format!("{url} (fails {open})"));
    }
    if parts.is_empty() {
        "everyone".to_owned()
    } else {
        parts.join(" then ")
    }
}

/// `--relay-advertise`'s list: specific addresses, a port each if given.
fn relay_advertise(list: &[String]) -> Result<Vec<(IpAddr, Option<u16>)>> {
    let max = ferry_proto::relay_session::MAX_ENDPOINTS;
    if list.len() > max {
        bail!("--relay-advertise: at most {max} addresses");
    }
    list.iter()
        .map(|s| {
            let (ip, port) = match s.parse::<SocketAddr>() {
                Ok(a) => (a.ip(), Some(a.port())),
                Err(_) => (
                    s.parse::<IpAddr>()
                        .with_context(|| format!("--relay-advertise {s}: not IP or IP:PORT"))?,
                    None,
                ),
            };
            if ip.is_unspecified() || port == Some(0) {
                bail!("--relay-advertise {s}: must be a specific address and port");
            }
            Ok((ip, port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn args(list: &[&str]) -> DerpArgs {
        let mut v = vec!["ferry"];
        v.extend_from_slice(list);
        super::super::args::parse(crate::flags::normalize_go_flags(
            v.into_iter().map(OsString::from),
        ))
        .unwrap()
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
        assert_eq!(a.key_file.as_deref(), Some(std::path::Path::new("k.json")));
        let b = args(&["--dev", "--certmode", "manual", "--hostname", "h"]);
        assert!(b.dev);
        assert_eq!(b.certmode.as_deref(), Some("manual"));
    }
    #[test]
    fn disallow_app_names_splits_as_derper_does() {
        let set = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        let parsed = |flag: &str| {
            let a = args(&["-disallow-app-names", flag]);
            disallowed_app_names(&a.disallow_app_names)
        };
        assert!(disallowed_app_names(&args(&[]).disallow_app_names).is_empty());
        assert_eq!(parsed("bad"), set(&["bad"]));
        assert_eq!(parsed("bad,worse"), set(&["bad", "worse"]));
        assert_eq!(parsed("bad,"), set(&["bad", ""]));
        assert_eq!(parsed(" bad"), set(&[" bad"]));
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
        assert_eq!(p.stun, Some("[::]:3478".parse().unwrap()), "as derper -dev");
        let p = Plan::from_args(&args(&["--dev", "-a", "127.0.0.1:9"])).unwrap();
        assert_eq!(
            p.stun,
            Some("127.0.0.1:3478".parse().unwrap()),
            "on -a's address"
        );
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
        // 0 is a port the system picks, as for every other port flag.
        let p = Plan::from_args(&args(&[
            "-a",
            "127.0.0.1:8443",
            "--certmode",
            "manual",
            "--http-port",
            "0",
        ]))
        .unwrap();
        assert_eq!(p.port80, Some("127.0.0.1:0".parse().unwrap()));
        assert!(Plan::from_args(&args(&["--certmode", "manual", "--http-port", "-2"])).is_err());
        let p = Plan::from_args(&args(&[
            "--certmode",
            "letsencrypt",
            "--hostname",
            "d.example",
        ]))
        .unwrap();
        assert!(matches!(p.cert_mode, Some(CertMode::Acme { .. })));
        // Nothing configured: port 443, ACME, localhost. No CA certifies
        // that name, so the start stops and says what to set.
        for name in ["localhost", "relay", "a.localhost"] {
            let e = Plan::from_args(&args(&["--hostname", name]))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("--hostname {name}: ")), "{e}");
        }
        assert!(Plan::from_args(&args(&["--certmode", "gcp"])).is_err());
        assert!(Plan::from_args(&args(&[
            "--certmode",
            "letsencrypt",
            "--acme-challenge",
            "dns-01"
        ]))
        .is_err());
        let p = Plan::from_args(&args(&["-dev", "-tcp-write-timeout", "0"])).unwrap();
        assert!(p.write_timeout.is_none());
    }
    #[test]
    fn relay_advertise_takes_specific_addresses_with_relay_port() {
        let plan = |extra: &[&str]| {
            let mut list = vec!["--dev", "--relay-port", "3479"];
            list.extend_from_slice(extra);
            Plan::from_args(&args(&list))
        };
        assert!(plan(&[]).unwrap().relay_advertise.is_empty());
        let p = plan(&["--relay-advertise", "192.0.2.1,[2001:db8::1]:4000"]).unwrap();
        assert_eq!(
            p.relay_advertise,
            [
                ("192.0.2.1".parse().unwrap(), None),
                ("2001:db8::1".parse().unwrap(), Some(4000))
            ]
        );
        for bad in ["0.0.0.0", "[::]:3479", "192.0.2.1:0", "relay.example"] {
            let e = plan(&["--relay-advertise", bad]).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--relay-advertise {bad}")), "{e}");
        }
        let e = Plan::from_args(&args(&["--dev", "--relay-advertise", "192.0.2.1"]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "--relay-advertise: goes with --relay-port");
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
}
