//! `ferry udp-relay`: the UDP relay for stock WireGuard.
//!
//! ```text
//! ferry udp-relay --listen :51820 --target home.example.net:51820      # static bounce
//! ferry udp-relay --listen :51820 --peer laptop=<pubkey> --peer nas=<pubkey>   # hub
//! ferry udp-relay --config /etc/ferry/udp.toml                          # either or both
//! ```
//!
//! Flags build the same [`ferry_udp::config::Config`] a file does. With
//! `--config`, routes come from the file only (mixing is refused, naming
//! both flags), and tuning flags given on the command line override the
//! file's values.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use ferry_proto::wireguard::PublicKey;
use ferry_sys::signal::Signal;
use ferry_udp::config::{
    self, parse_duration, parse_listen, Bounce, Config, ConfigError, Hub, HubPeer, Tuning,
};

/// Relay stock WireGuard over UDP: a static bounce (--target) or a
/// receiver-index hub (--peer), never decrypting anything.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct UdpRelayArgs {
    /// Listening address (":port", "ip:port", "[ipv6]:port"); repeat for
    /// several ports.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,

    /// Static bounce: relay every client to this host:port (a DNS name is
    /// re-resolved every --resolve-interval).
    #[arg(long, value_name = "HOST:PORT")]
    pub target: Option<String>,

    /// Hub: a WireGuard peer allowed to use the hub, as NAME=PUBKEY or
    /// PUBKEY (base64, as `wg pubkey` prints it); repeat for each peer.
    #[arg(long = "peer", value_name = "[NAME=]PUBKEY")]
    pub peer: Vec<String>,

    /// TOML configuration file (bounces, hub, tuning); see docs/udp-relay.md.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Close a bounce client's session after this long without traffic.
    #[arg(long = "idle-timeout", value_name = "DURATION")]
    pub idle_timeout: Option<String>,

    /// Re-resolve a DNS --target this often ("0" never).
    #[arg(long = "resolve-interval", value_name = "DURATION")]
    pub resolve_interval: Option<String>,

    /// Bounce: forward only WireGuard-shaped datagrams.
    #[arg(long = "wireguard-only", num_args = 0..=1, default_missing_value = "true")]
    pub wireguard_only: Option<bool>,

    /// Bounce: most concurrent clients.
    #[arg(long = "max-sessions")]
    pub max_sessions: Option<usize>,

    /// Shard threads (default: one per usable core).
    #[arg(long)]
    pub workers: Option<usize>,

    /// Pin each shard thread to its own core.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub pin: Option<bool>,

    /// Use UDP GRO on receive when the kernel supports it.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gro: Option<bool>,

    /// Use UDP GSO on send when the kernel supports it.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub gso: Option<bool>,

    /// Socket receive buffer, bytes (forced past net.core.rmem_max when
    /// the process has CAP_NET_ADMIN).
    #[arg(long = "recv-buffer", value_name = "BYTES")]
    pub recv_buffer: Option<usize>,

    /// Socket send buffer, bytes.
    #[arg(long = "send-buffer", value_name = "BYTES")]
    pub send_buffer: Option<usize>,

    /// Per source IP and second: handshake messages (hub), new clients and
    /// initiations (bounce).
    #[arg(long = "handshake-rate")]
    pub handshake_rate: Option<u32>,

    /// Burst allowed above --handshake-rate.
    #[arg(long = "handshake-burst")]
    pub handshake_burst: Option<u32>,

    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long = "metrics-addr", value_name = "ADDR")]
    pub metrics_addr: Option<String>,

    /// Log filter (tracing EnvFilter syntax); FERRY_LOG overrides.
    #[arg(long, default_value = "info")]
    pub log: String,

    /// Log line format: "text" or "json" (one object per line).
    #[arg(long = "log-format", default_value = "text")]
    pub log_format: String,
}

fn duration(
    field: &str,
    v: &Option<String>,
    default: std::time::Duration,
) -> Result<std::time::Duration, ConfigError> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration(s).ok_or(ConfigError::BadDuration {
            field: field.into(),
            value: s.clone(),
        }),
    }
}

/// Parses and checks a udp-relay configuration file's `text`, for the
/// start (and SIGHUP) and for `ferry check-config` alike: every error
/// starts with the file (and the line, where the parser knows it) and
/// names the key.
pub(crate) fn from_file(path: &str, text: &str) -> Result<Config> {
    Config::from_toml(path, text).map_err(|e| match e {
        // The parser's errors already start with the file and line.
        ConfigError::File { .. } => anyhow!(e),
        e => anyhow!("{path}: {e}"),
    })
}

/// Builds the relay configuration from flags (and the file, if given).
pub(crate) fn build_config(args: &UdpRelayArgs) -> Result<Config> {
    let mut cfg = if let Some(path) = &args.config {
        let route_flags = [
            ("--listen", !args.listen.is_empty()),
            ("--target", args.target.is_some()),
            ("--peer", !args.peer.is_empty()),
            ("--idle-timeout", args.idle_timeout.is_some()),
            ("--resolve-interval", args.resolve_interval.is_some()),
            ("--wireguard-only", args.wireguard_only.is_some()),
            ("--max-sessions", args.max_sessions.is_some()),
        ];
        if let Some((flag, _)) = route_flags.iter().find(|(_, given)| *given) {
            return Err(ConfigError::Conflict {
                field: (*flag).into(),
                other: "--config".into(),
                why: "with a configuration file, listening addresses, targets and peers come from the file",
            }
            .into());
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--config: reading {}", path.display()))?;
        from_file(&path.display().to_string(), &text)?
    } else {
        cli_config(args)?
    };
    let t = &mut cfg.tuning;
    if let Some(v) = args.workers {
        t.workers = v;
    }
    if let Some(v) = args.pin {
        t.pin = v;
    }
    if let Some(v) = args.gro {
        t.gro = v;
    }
    if let Some(v) = args.gso {
        t.gso = v;
    }
    if let Some(v) = args.recv_buffer {
        t.recv_buffer = v;
    }
    if let Some(v) = args.send_buffer {
        t.send_buffer = v;
    }
    if let Some(v) = args.handshake_rate {
        t.handshake_rate = v;
    }
    if let Some(v) = args.handshake_burst {
        t.handshake_burst = v;
    }
    if let Some(s) = &args.metrics_addr {
        cfg.metrics_addr = Some(parse_listen("--metrics-addr", s)?.addr);
    }
    // A tuning value out of range is named as the flag when it came from
    // one ("--recv-buffer", not the file's "recv_buffer").
    let from_flag = |field: &str| match field {
        "workers" => args.workers.is_some(),
        "recv_buffer" => args.recv_buffer.is_some(),
        "send_buffer" => args.send_buffer.is_some(),
        "handshake_rate" => args.handshake_rate.is_some() || args.handshake_burst.is_some(),
        _ => false,
    };
    cfg.validate().map_err(|e| match e {
        ConfigError::OutOfRange { field, why } if from_flag(&field) => ConfigError::OutOfRange {
            field: format!("--{}", field.replace('_', "-")),
            why,
        },
        e => e,
    })?;
    Ok(cfg)
}

fn cli_config(args: &UdpRelayArgs) -> Result<Config, ConfigError> {
    if args.target.is_some() && !args.peer.is_empty() {
        return Err(ConfigError::Conflict {
            field: "--target".into(),
            other: "--peer".into(),
            why: "a listening address is either a static bounce (--target) or a hub (--peer); use a --config file to run both on different ports",
        });
    }
    if args.target.is_none() && args.peer.is_empty() {
        return Err(ConfigError::NothingToDo);
    }
    let listen = args
        .listen
        .iter()
        .map(|s| parse_listen("--listen", s))
        .collect::<Result<Vec<_>, _>>()?;
    if listen.is_empty() {
        return Err(ConfigError::NoListen {
            field: "--listen".into(),
        });
    }
    let mut cfg = Config {
        bounce: Vec::new(),
        hub: None,
        tuning: Tuning::default(),
        metrics_addr: None,
    };
    if let Some(target) = &args.target {
        cfg.bounce.push(Bounce {
            listen,
            target: target.clone(),
            target_field: "--target".into(),
            idle_timeout: duration(
                "--idle-timeout",
                &args.idle_timeout,
                config::DEFAULT_IDLE_TIMEOUT,
            )?,
            resolve_interval: duration(
                "--resolve-interval",
                &args.resolve_interval,
                config::DEFAULT_RESOLVE_INTERVAL,
            )?,
            wireguard_only: args.wireguard_only.unwrap_or(false),
            max_sessions: args.max_sessions.unwrap_or(65536),
        });
    } else {
        for (flag, given) in [
            ("--idle-timeout", args.idle_timeout.is_some()),
            ("--resolve-interval", args.resolve_interval.is_some()),
            ("--wireguard-only", args.wireguard_only.is_some()),
            ("--max-sessions", args.max_sessions.is_some()),
        ] {
            if given {
                return Err(ConfigError::Conflict {
                    field: flag.into(),
                    other: "--peer".into(),
                    why: "it applies to a static bounce (--target), and the hub forwards only WireGuard anyway",
                });
            }
        }
        let mut peers = Vec::new();
        for (i, spec) in args.peer.iter().enumerate() {
            let (name, key) = match spec.split_once('=') {
                // A base64 key ends in '=': split only at an '=' before it.
                Some((name, key)) if !key.is_empty() => (name.to_string(), key),
                _ => (format!("peer{i}"), spec.as_str()),
            };
            let public_key = PublicKey::from_base64(key).map_err(|error| ConfigError::BadKey {
                field: format!("--peer {spec}"),
                error,
            })?;
            peers.push(HubPeer {
                name,
                public_key,
                allow: None,
                endpoint: None,
                field: format!("--peer {spec}"),
            });
        }
        cfg.hub = Some(Hub {
            listen,
            peers,
            max_indices: 65536,
        });
    }
    Ok(cfg)
}

/// Runs the relay until SIGINT or SIGTERM; SIGHUP re-reads `--config`.
pub(crate) fn run(args: &UdpRelayArgs, origins: &crate::flags::Origins) -> Result<()> {
    crate::logs::init_subcommand(&args.log, &args.log_format, origins)?;
    ferry_sys::signal::block_signals().context("blocking SIGINT/SIGTERM/SIGHUP")?;
    let mut cfg = build_config(args)?;
    if cfg.tuning.workers != 0 {
        let cpus = ferry_sys::available_cpus().len().max(1);
        let flag = if args.workers.is_some() || args.config.is_none() {
            "--workers"
        } else {
            "workers"
        };
        if let Some(warning) = crate::flags::values::check_workers(flag, cfg.tuning.workers, cpus)?
        {
            tracing::warn!("{warning}");
        }
    }
    let relay = ferry_udp::Relay::start(&cfg)?;
    for (field, addr) in relay.bound() {
        tracing::info!(%field, %addr, "listening");
    }
    for b in &cfg.bounce {
        tracing::info!(
            field = %b.target_field,
            target = %b.target,
            idle_timeout = %crate::flags::values::go_duration(b.idle_timeout),
            resolve_interval = %crate::flags::values::go_duration(b.resolve_interval),
            wireguard_only = b.wireguard_only,
            max_sessions = b.max_sessions,
            "static bounce"
        );
    }
    if let Some(h) = &cfg.hub {
        let names: Vec<&str> = h.peers.iter().map(|p| p.name.as_str()).collect();
        tracing::info!(
            peers = h.peers.len(),
            names = %names.join(", "),
            max_indices = h.max_indices,
            "receiver-index hub"
        );
    }
    if let Some(addr) = relay.metrics_addr() {
        tracing::info!(url = %format!("http://{addr}/metrics"), "metrics");
    }
    loop {
        match ferry_sys::signal::wait_signal().context("waiting for a signal")? {
            Signal::Hangup => reread(args, &relay, &mut cfg),
            sig @ Signal::Terminate(_) => {
                tracing::info!(signal = sig.name(), "shutting down");
                break;
            }
        }
    }
    relay.shutdown();
    tracing::info!("stopped");
    Ok(())
}

/// SIGHUP: re-reads the configuration, applies what a running relay can
/// change (the hub's peers, `hub.max_indices`, the handshake limits) and
/// logs every change, applied or needing a restart (listening addresses,
/// shard count, buffers, offloads, bounces, metrics address). A file that
/// is no longer valid is reported and the running configuration stays
/// whole.
fn reread(args: &UdpRelayArgs, relay: &ferry_udp::Relay, running: &mut Config) {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(path) = &args.config else {
        tracing::info!("SIGHUP: no --config file to re-read; flags take effect only on a restart");
        return;
    };
    tracing::info!(path = %path.display(), "SIGHUP: re-reading the configuration");
    let applied = build_config(args).and_then(|new| {
        let changes = relay.reconfigure(running, &new)?;
        Ok((new, changes))
    });
    let (new, changes) = match applied {
        Ok(c) => c,
        Err(e) => {
            relay.metrics().reloads_failed.fetch_add(1, Relaxed);
            tracing::error!(error = %crate::flags::error_text(&e), "SIGHUP: the configuration file is not usable; still running with the one loaded before");
            return;
        }
    };
    relay.metrics().reloads_applied.fetch_add(1, Relaxed);
    if changes.is_empty() {
        tracing::info!("SIGHUP: the configuration is unchanged");
        return;
    }
    for change in &changes {
        if change.live {
            tracing::info!(%change, "SIGHUP: applied");
        } else {
            tracing::warn!(%change, "SIGHUP: changed in the file; takes effect only after a restart");
        }
    }
    *running = running.with_live_parts_of(&new);
    let live = changes.iter().filter(|c| c.live).count();
    tracing::info!(
        applied = live,
        need_restart = changes.len() - live,
        hub_peers = running.hub.as_ref().map_or(0, |h| h.peers.len()),
        "SIGHUP: configuration reloaded"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use crate::flags::normalize_go_flags;
    use clap::Parser;
    use std::ffi::OsString;

    const A: &str = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I=";
    const B: &str = "2U8lQNjeBL0yOxqE5T323qgIdDE7NgTDB370HDIKG0s=";

    fn parse(list: &[&str]) -> Result<UdpRelayArgs, clap::Error> {
        let mut v = vec!["ferry", "udp-relay"];
        v.extend_from_slice(list);
        match Cli::try_parse_from(normalize_go_flags(v.into_iter().map(OsString::from)))?.command {
            Some(Command::UdpRelay(a)) => Ok(*a),
            other => panic!("not udp-relay: {other:?}"),
        }
    }

    fn err(list: &[&str]) -> String {
        build_config(&parse(list).unwrap()).unwrap_err().to_string()
    }

    #[test]
    fn bounce_and_hub_from_flags() {
        let c = build_config(
            &parse(&[
                "--listen",
                ":51820",
                "--listen",
                "127.0.0.1:51821",
                "--target",
                "vpn.example.com:51820",
                "-idle-timeout=90s",
                "--gro=false",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(c.bounce[0].listen.len(), 2);
        assert_eq!(c.bounce[0].target, "vpn.example.com:51820");
        assert_eq!(c.bounce[0].idle_timeout, std::time::Duration::from_secs(90));
        assert!(!c.tuning.gro);
        let c = build_config(
            &parse(&[
                "--listen",
                ":51830",
                "--peer",
                &format!("laptop={A}"),
                "--peer",
                B,
            ])
            .unwrap(),
        )
        .unwrap();
        let h = c.hub.unwrap();
        assert_eq!(h.peers[0].name, "laptop");
        assert_eq!(h.peers[1].name, "peer1");
        assert_eq!(h.peers[1].public_key.to_base64(), B);
    }

    #[test]
    fn mistakes_name_the_flag() {
        let e = err(&["--listen", ":1", "--target", "h:1", "--peer", A]);
        assert!(e.starts_with("--target conflicts with --peer"), "{e}");
        let e = err(&["--target", "h:1"]);
        assert!(e.starts_with("--listen:"), "{e}");
        let e = err(&["--listen", ":1", "--target", "nowhere"]);
        assert!(e.starts_with("--target:"), "{e}");
        let e = err(&["--listen", "somewhere", "--target", "h:1"]);
        assert!(e.starts_with("--listen:"), "{e}");
        let e = err(&["--listen", ":1", "--peer", "x=notakey", "--peer", A]);
        assert!(e.starts_with("--peer x=notakey:"), "{e}");
        let e = err(&["--listen", ":1", "--peer", A, "--idle-timeout", "1m"]);
        assert!(e.starts_with("--idle-timeout conflicts with --peer"), "{e}");
        let e = err(&["--config", "/nonexistent.toml", "--target", "h:1"]);
        assert!(e.starts_with("--target conflicts with --config"), "{e}");
        let e = err(&["--listen", ":1"]);
        assert!(e.contains("nothing to relay"), "{e}");
        let e = err(&["--listen", ":1", "--target", "h:1", "--send-buffer", "0"]);
        assert!(
            e.starts_with("--send-buffer: 0: a socket buffer must be"),
            "{e}"
        );
        let e = err(&[
            "--listen",
            ":1",
            "--target",
            "h:1",
            "--idle-timeout",
            "soon",
        ]);
        assert!(e.starts_with("--idle-timeout:"), "{e}");
    }
}
