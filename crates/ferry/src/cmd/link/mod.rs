//! `ferry link`: carries a stock WireGuard interface's datagrams to its
//! peers over the best path that works: direct UDP, a Ferry relay
//! session, or DERP where nothing else passes.
//!
//! ```text
//! ferry link --config /etc/ferry/link.toml          # run beside WireGuard
//! ferry link pubkey --config /etc/ferry/link.toml   # this side's link key (created if missing)
//! ferry link status --config /etc/ferry/link.toml   # per peer: path, traffic, drops; relay state
//! ```
//!
//! Each remote peer is one local UDP address (its `Endpoint` in the local
//! WireGuard configuration) and one link key (its DERP address); see
//! [`config`] for the file and [`datapath`] for the data path. The paths
//! (direct UDP, a relay session, DERP) and the choice between them are the
//! SDK's `Endpoint`'s. WireGuard's keys are never read and nothing is
//! decrypted.

mod config;
mod datapath;
mod metrics;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferry_client::{Options, TlsRoots};
use ferry_proto::key::NodePrivate;
use ferry_sys::signal::Signal;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::key_file::KeyFile;
use config::Config;

/// `ferry link` flags.
#[derive(clap::Args, Debug)]
pub(crate) struct LinkArgs {
    #[command(subcommand)]
    action: Option<Action>,

    /// TOML configuration file (link key file, relays, peers); see
    /// docs/link.md.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,

    /// Log filter (tracing EnvFilter syntax); FERRY_LOG overrides.
    #[arg(long, default_value = "info", global = true)]
    log: String,

    /// Log line format: "text" or "json" (one object per line).
    #[arg(long = "log-format", default_value = "text", global = true)]
    log_format: String,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Print this side's link key (creating the key file if it is
    /// missing), for the peers' configurations.
    Pubkey,
    /// Show each peer's path, traffic and drops and each relay's state,
    /// from the running link's metrics_addr.
    Status {
        /// One JSON object instead of text (docs/link.md, "Status and metrics").
        #[arg(long)]
        json: bool,
    },
}

/// Runs `ferry link` and its subcommands.
pub(crate) fn run(args: &LinkArgs, origins: &crate::flags::Origins) -> Result<()> {
    let Some(path) = &args.config else {
        bail!("--config FILE is required (the link's TOML configuration; see docs/link.md)");
    };
    match args.action {
        Some(Action::Pubkey) => {
            let key_file = Config::key_file_only(path)?;
            let (key, created) = load_key(&key_file)?;
            if created {
                eprintln!("created {}", key_file.display());
            }
            println!("{}", key.public());
            Ok(())
        }
        Some(Action::Status { json }) => status(path, json),
        None => serve(args, origins, path),
    }
}

/// Reads the link key, or creates it (mode 0600) when the file does not
/// exist. `true` when it was created.
fn load_key(path: &Path) -> Result<(NodePrivate, bool)> {
    let key = KeyFile::load(path, "key_file")?;
    let created = key.persist("key_file")?;
    Ok((key.private, created))
}

/// `ferry check-config` for a link file: every check a start makes short
/// of binding sockets and creating the key (the relays' CA files are
/// read, the key file if it exists); returns a one-line summary.
pub(crate) fn check(path: &str, text: &str) -> Result<String> {
    let cfg = Config::from_toml(path, text)?;
    relay_options(&cfg)?;
    let key = KeyFile::load(&cfg.key_file, "key_file")?;
    let peers: Vec<&str> = cfg.peers.iter().map(|p| p.name.as_str()).collect();
    Ok(format!(
        "{} relays, {} peers ({}), key {}{}, metrics {}",
        cfg.relays.len(),
        peers.len(),
        peers.join(", "),
        cfg.key_file.display(),
        if key.unsaved.is_some() {
            " (created at the first start)"
        } else {
            ""
        },
        cfg.metrics_addr
            .map_or("off".to_string(), |a| format!("on {a}")),
    ))
}

/// SDK options for each relay: the system's roots, or the relay's
/// `ca_file`.
fn relay_options(cfg: &Config) -> Result<Vec<Options>> {
    let mut all = Vec::with_capacity(cfg.relays.len());
    for relay in &cfg.relays {
        let mut options = Options::default();
        if let Some(file) = &relay.ca_file {
            let what = || format!("{}.ca_file: {}", relay.field, file.display());
            let mut store = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(file).with_context(what)? {
                store.add(cert.with_context(what)?).with_context(what)?;
            }
            if store.is_empty() {
                bail!("{}: no certificates in the file", what());
            }
            options.tls_roots = TlsRoots::Custom(Arc::new(store));
        }
        all.push(options);
    }
    Ok(all)
}

fn serve(args: &LinkArgs, origins: &crate::flags::Origins, path: &Path) -> Result<()> {
    crate::logs::init_subcommand(&args.log, &args.log_format, origins)?;
    ferry_sys::signal::block_signals().context("blocking SIGINT/SIGTERM/SIGHUP")?;
    let cfg = Config::load(path)?;
    let options = relay_options(&cfg)?;
    let (key, created) = load_key(&cfg.key_file)?;
    if created {
        tracing::info!(key_file = %cfg.key_file.display(), "created a new link key");
    }
    if let Some(p) = cfg.peers.iter().find(|p| p.link_key == key.public()) {
        bail!(
            "{}: {}.link_key is this side's own link key",
            path.display(),
            p.field
        );
    }
    tracing::info!(link_key = %key.public(), peers = cfg.peers.len(), relays = cfg.relays.len(), "ferry link starting");
    for r in &cfg.relays {
        tracing::info!(relay = %r.name, url = %r.url, "relay");
    }
    let metrics = Arc::new(metrics::Metrics::new(&cfg));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Signals stay blocked everywhere; this thread waits for them.
    std::thread::Builder::new()
        .name("ferry-link-signals".into())
        .spawn(move || loop {
            match ferry_sys::signal::wait_signal() {
                Ok(Signal::Hangup) => tracing::info!(
                    "SIGHUP: ferry link reads its configuration only at start; restart it to apply changes"
                ),
                Ok(sig @ Signal::Terminate(_)) => {
                    tracing::info!(signal = sig.name(), "shutting down");
                    let _ = stop_tx.send(());
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "waiting for signals failed; shutting down");
                    let _ = stop_tx.send(());
                    return;
                }
            }
        })
        .context("starting the signal thread")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(datapath::run(cfg, key, options, metrics, async {
        let _ = stop_rx.await;
    }))?;
    tracing::info!("stopped");
    Ok(())
}

/// `ferry link status`: one scrape of the running link's metrics.
fn status(path: &Path, json: bool) -> Result<()> {
    let cfg = Config::load(path)?;
    let Some(addr) = cfg.metrics_addr else {
        bail!(
            "{}: metrics_addr is not set; ferry link status reads the running link's metrics there",
            path.display()
        );
    };
    let scrape = crate::cmd::status::fetch(&addr.to_string())?;
    if json {
        println!("{}", status_json(&cfg, &scrape));
    } else {
        print!("{}", status_text(&cfg, &scrape));
    }
    Ok(())
}

fn status_text(cfg: &Config, s: &crate::cmd::status::Scrape) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let v = |name: &str, with: &[(&str, &str)]| s.sum(name, with).unwrap_or(0.0);
    for r in &cfg.relays {
        let l = [("relay", r.name.as_str())];
        let state = match (v("ferry_link_relay_connected", &l) > 0.0, relay_node(r, s)) {
            (true, Some(node)) => format!("connected to {node}"),
            // A link that exports no node (an older version) is still up.
            (true, None) => "connected".to_owned(),
            (false, _) => "down".to_owned(),
        };
        let _ = writeln!(
            out,
            "relay {} ({}): {state}; {} connects, {} disconnects or failed attempts",
            r.name,
            r.url,
            v("ferry_link_relay_connects_total", &l),
            v("ferry_link_relay_disconnects_total", &l),
        );
    }
    for (p, j) in cfg.peers.iter().zip(peers_json(cfg, s)) {
        let peer = p.name.as_str();
        let mut drops: Vec<String> = metrics::DropReason::ALL
            .iter()
            .map(|why| (why.label(), j["drops"][why.label()].as_u64().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        if drops.is_empty() {
            drops.push("none".into());
        }
        let path = j["path"].as_str().unwrap_or("none").to_uppercase();
        let _ = writeln!(
            out,
            "peer {peer} (endpoint {}): path {} via {}; drops: {}",
            p.endpoint,
            if path == "DERP" {
                path
            } else {
                path.to_lowercase()
            },
            cfg.relays[p.relay].name,
            drops.join(", ")
        );
        for kind in metrics::KINDS.map(metrics::kind_label) {
            let Some(pj) = j["paths"].get(kind) else {
                continue;
            };
            let rtt = pj["rtt_ms"]
                .as_f64()
                .map_or("no RTT yet".to_owned(), |ms| format!("RTT {ms:.1} ms"));
            let flow =
                |dir: &str| format!("{} packets, {} bytes", pj[dir]["packets"], pj[dir]["bytes"]);
            let _ = writeln!(
                out,
                "  {kind}: {}, {rtt}; to peer {}; from peer {}",
                if pj["working"] == true {
                    "working"
                } else {
                    "not answering"
                },
                flow("to_peer"),
                flow("from_peer"),
            );
        }
        let switches: Vec<String> = metrics::REASONS
            .map(metrics::reason_label)
            .iter()
            .filter_map(|r| {
                let n = j["switches"][r].as_u64().unwrap_or(0);
                (n > 0).then(|| format!("{r} {n}"))
            })
            .collect();
        match j["last_switch"].as_object() {
            Some(ls) => {
                let _ = writeln!(
                    out,
                    "  last switch: {} -> {} ({}) at {}; switches: {}; possibly lost at switches: {}",
                    ls["from"].as_str().unwrap_or("?"),
                    ls["to"].as_str().unwrap_or("?"),
                    ls["reason"].as_str().unwrap_or("?"),
                    ls["at_unix"]
                        .as_f64()
                        .map_or("?".to_owned(), |at| when(at, unix_now())),
                    switches.join(", "),
                    j["lost"],
                );
            }
            None => {
                let _ = writeln!(out, "  no switch yet");
            }
        }
    }
    let _ = writeln!(
        out,
        "{} datagrams not from a configured peer dropped",
        v("ferry_link_rejected_total", &[])
    );
    out
}

/// The URL of the node the relay's connection is up to (from
/// `ferry_link_relay_node`), or `None` while it is down.
fn relay_node<'a>(r: &'a config::Relay, s: &crate::cmd::status::Scrape) -> Option<&'a str> {
    let n = s.sum("ferry_link_relay_node", &[("relay", r.name.as_str())])? as usize;
    let i = n.checked_sub(1)?;
    r.urls().nth(i).map(String::as_str)
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A Unix time as a reader wants it: the UTC date and time, and how long
/// ago that was at `now` (`2026-11-28 11:40:02 UTC, 3 min ago`).
fn when(at: f64, now: f64) -> String {
    let secs = at.max(0.0) as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = ferry_proto::date::civil_from_days(days);
    let ago = (now - at).max(0.0) as u64;
    let ago = match ago {
        0..=119 => format!("{ago} s ago"),
        120..=7_199 => format!("{} min ago", ago / 60),
        7_200..=172_799 => format!("{} h ago", ago / 3_600),
        _ => format!("{} d ago", ago / 86_400),
    };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC, {ago}",
        rest / 3_600,
        rest / 60 % 60,
        rest % 60
    )
}

/// `ferry link status --json`: the same scrape as one object, for scripts
/// (the namespace tests read the path from it).
fn status_json(cfg: &Config, s: &crate::cmd::status::Scrape) -> serde_json::Value {
    use serde_json::json;
    let n = |name: &str, with: &[(&str, &str)]| s.sum(name, with).unwrap_or(0.0) as u64;
    let relays: Vec<_> = cfg
        .relays
        .iter()
        .map(|r| {
            let l = [("relay", r.name.as_str())];
            json!({
                "name": r.name,
                "url": r.url.to_string(),
                "connected": n("ferry_link_relay_connected", &l) > 0,
                "node": relay_node(r, s),
                "connects": n("ferry_link_relay_connects_total", &l),
                "disconnects": n("ferry_link_relay_disconnects_total", &l),
            })
        })
        .collect();
    json!({
        "relays": relays,
        "peers": peers_json(cfg, s),
        "rejected": n("ferry_link_rejected_total", &[]),
    })
}

/// Each peer's path, paths, switches and drops from one scrape.
fn peers_json(cfg: &Config, s: &crate::cmd::status::Scrape) -> Vec<serde_json::Value> {
    use serde_json::{json, Map};
    let v = |name: &str, with: &[(&str, &str)]| s.sum(name, with);
    let n = |name: &str, with: &[(&str, &str)]| v(name, with).unwrap_or(0.0) as u64;
    cfg.peers
        .iter()
        .map(|p| {
            let peer = p.name.as_str();
            let kinds = metrics::KINDS.map(metrics::kind_label);
            let current = kinds
                .iter()
                .find(|k| n("ferry_link_peer_path", &[("peer", peer), ("path", k)]) > 0);
            let mut paths = Map::new();
            for kind in kinds {
                let l = [("peer", peer), ("path", kind)];
                let flow = |dir: &str| {
                    let l = [("peer", peer), ("direction", dir), ("path", kind)];
                    Some(json!({
                        "packets": v("ferry_link_peer_packets_total", &l)? as u64,
                        "bytes": n("ferry_link_peer_bytes_total", &l),
                    }))
                };
                if let (Some(to), Some(from)) = (flow("to_peer"), flow("from_peer")) {
                    let rtt = v("ferry_link_peer_rtt_seconds", &l).map(|s| s * 1e3);
                    paths.insert(
                        kind.to_owned(),
                        json!({
                            "working": n("ferry_link_peer_path_working", &l) > 0,
                            "rtt_ms": rtt,
                            "to_peer": to,
                            "from_peer": from,
                        }),
                    );
                }
            }
            let drops: Map<_, _> = metrics::DropReason::ALL
                .iter()
                .map(|why| {
                    let l = [("peer", peer), ("reason", why.label())];
                    (
                        why.label().to_owned(),
                        n("ferry_link_peer_drops_total", &l).into(),
                    )
                })
                .collect();
            let switches: Map<_, _> = metrics::REASONS
                .map(metrics::reason_label)
                .iter()
                .map(|r| {
                    let l = [("peer", peer), ("reason", r)];
                    (
                        (*r).to_owned(),
                        n("ferry_link_peer_switches_total", &l).into(),
                    )
                })
                .collect();
            // One series holds the last switch; its labels say what it was.
            let ends = ["none", "direct", "relay", "derp"];
            let last_switch = ends
                .iter()
                .flat_map(|from| ends.iter().map(move |to| (from, to)))
                .flat_map(|(from, to)| {
                    metrics::REASONS
                        .map(metrics::reason_label)
                        .map(move |r| (from, to, r))
                })
                .find_map(|(from, to, reason)| {
                    let l = [
                        ("peer", peer),
                        ("from", from),
                        ("to", to),
                        ("reason", reason),
                    ];
                    let at = v("ferry_link_peer_last_switch_timestamp_seconds", &l)?;
                    Some(json!({ "from": from, "to": to, "reason": reason, "at_unix": at }))
                });
            json!({
                "name": peer,
                "endpoint": p.endpoint.to_string(),
                "relay": cfg.relays[p.relay].name,
                "prefer": p.prefer.map(metrics::kind_label),
                "only": p.only.map(metrics::kind_label),
                "path": current,
                "paths": paths,
                "switches": switches,
                "lost": n("ferry_link_peer_switch_lost_total", &[("peer", peer)]),
                "last_switch": last_switch,
                "drops": drops,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_time_reads_as_a_date_and_an_age() {
        assert_eq!(when(0.0, 59.0), "1970-01-01 00:00:00 UTC, 59 s ago");
        // 2026-11-28 11:40:02 UTC.
        let at = 1_795_866_002.0;
        assert_eq!(when(at, at + 200.0), "2026-11-28 11:40:02 UTC, 3 min ago");
        assert_eq!(when(at, at + 90_000.0), "2026-11-28 11:40:02 UTC, 25 h ago");
        assert_eq!(
            when(951_782_400.0, 951_782_400.0 + 200_000.0),
            "2000-02-29 00:00:00 UTC, 2 d ago"
        );
    }
}
