//! `ferry`: the relay binary.
//!
//! Flags follow Tailscale's `derper` wherever the meaning is shared, and,
//! like Go's flag package, accept a single dash (`-a`, `-dev`,
//! `-stun-port=3478`) as well as two. `ferry --dev` runs a local relay with
//! embedded defaults: plain HTTP DERP on 127.0.0.1:3340 and STUN on
//! 127.0.0.1:3478, with a fresh key, printing what a client needs.

// The doc comments on the flag structs are clap's --help text, written for
// a terminal: `[ipv6]:port` and `<certdir>` there are not rustdoc links or
// HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod acme;
mod cli;
mod config_file;
mod link;
mod status;
mod udp;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ferry_derp::admission::AdmissionConfig;
use ferry_derp::bootstrap_dns;
use ferry_derp::tls::{self, CertMode};
use ferry_derp::{DerpConfig, HomePage, ListenerKind, ListenerSpec, Server, ServerOptions};
use ferry_proto::key::{MeshKey, NodePrivate};
use ferry_proto::rate_config::RateConfig;

use cli::Args;
use ferry_sys::signal::Signal;

fn main() {
    if let Err(e) = run() {
        eprintln!("ferry: {}", error_text(&e));
        std::process::exit(1);
    }
}

/// An error and its causes, each once: a cause whose text its context
/// already quotes (as `thiserror` messages with `{source}` do) is not
/// repeated.
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn run() -> Result<()> {
    let argv = cli::flags_from_env(cli::normalize_go_flags(std::env::args_os()), |k| {
        std::env::var(k).ok()
    });
    let argv = cli::without_derper_defaults(argv)?;
    let (argv, origins) = config_file::with_file(argv)?;
    let args = Args::parse_from(argv);
    match &args.command {
        Some(cli::Command::UdpRelay(udp_args)) => return udp::run(udp_args),
        Some(cli::Command::Status(status_args)) => return status::run(status_args),
        Some(cli::Command::CheckConfig(check_args)) => return config_file::check(check_args),
        Some(cli::Command::Link(link_args)) => return link::run(link_args),
        None => {}
    }
    // An error about a flag the --config file set names its key and line.
    serve(&args).map_err(|e| origins.locate(e))
}

/// What the DERP server's flags resolve to, checked, before anything is
/// bound or written.
struct Prepared {
    plan: cli::Plan,
    key: Key,
    config: DerpConfig,
    rate_path: Option<std::path::PathBuf>,
    dns: std::sync::Arc<bootstrap_dns::BootstrapDns>,
}

/// `ferry check-config` for a DERP-server file: every check a start makes
/// before binding anything; returns a one-line summary.
pub(crate) fn check_derp(args: &Args) -> Result<String> {
    cli::log_filter(&args.log).with_context(|| format!("--log {:?}", args.log))?;
    check_log_format(&args.log_format)?;
    let p = prepare(args)?;
    if let Some(warning) = &p.plan.workers_warning {
        eprintln!("ferry: check-config: warning: {warning}");
    }
    let tls = match &p.plan.cert_mode {
        None => "plain HTTP".to_string(),
        Some(CertMode::Manual { hostname, .. }) => format!("TLS (manual) for {hostname}"),
        Some(CertMode::SelfSigned { hostname, .. }) => format!("TLS (selfsigned) for {hostname}"),
        Some(CertMode::Acme { hostname }) => format!("TLS (letsencrypt) for {hostname}"),
    };
    let off = || "off".to_string();
    let key = match &p.key.unsaved {
        Some(path) => format!("{} (created at the first start)", path.display()),
        None => args
            .config
            .as_ref()
            .map_or("a fresh one each run (--dev)".into(), |p| {
                p.display().to_string()
            }),
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
fn prepare(args: &Args) -> Result<Prepared> {
    let plan = cli::Plan::from_args(args)?;
    let key = load_key(args)?;
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

    config.mesh_with = ferry_derp::mesh::MeshPeer::parse_list(&args.mesh_with)?;
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
    let rate_path =
        (!args.rate_config.is_empty()).then(|| std::path::PathBuf::from(&args.rate_config));
    if let Some(path) = &rate_path {
        config.rate = load_rate_config(path)?;
    }
    config.trusted_proxies = args
        .trusted_proxies
        .parse()
        .map_err(|e| anyhow::anyhow!("--trusted-proxies: {e}"))?;
    config.proxy_protocol = args.proxy_protocol;
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

/// Runs the DERP server until SIGINT or SIGTERM.
fn serve(args: &Args) -> Result<()> {
    // Listening sockets from a service manager (packaging/systemd's
    // ferry.socket), taken before any other thread exists.
    let inherited: Vec<std::sync::Arc<std::net::TcpListener>> = ferry_sys::activation::listen_fds()
        .context("sockets from the service manager (LISTEN_FDS)")?
        .into_iter()
        .map(|fd| std::sync::Arc::new(std::net::TcpListener::from(fd)))
        .collect();
    init_logging(&args.log, &args.log_format)?;

    // Signals are handled by the main thread only: block them before any
    // other thread exists so every thread inherits the mask.
    ferry_sys::signal::block_signals().context("blocking SIGINT/SIGTERM/SIGHUP")?;
    match ferry_sys::raise_nofile_limit() {
        Ok(n) => tracing::debug!(limit = n, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
    // Memory taken by load goes back when the load does (issue 17).
    ferry_derp::heap::tune();
    if let Err(e) = ferry_derp::heap::spawn_trimmer(ferry_derp::heap::TRIM_EVERY) {
        tracing::warn!(error = %e, "could not start the heap trimmer");
    }

    // Everything is checked before anything is written: the key file is
    // only created once the relay runs.
    let Prepared {
        plan,
        key,
        mut config,
        rate_path,
        dns,
    } = prepare(args)?;
    if let Some(warning) = &plan.workers_warning {
        tracing::warn!("{warning}");
    }
    if rate_path.is_some() {
        tracing::info!(
            rate = config.rate.bytes_per_sec,
            burst = config.rate.burst_bytes,
            "rate config applied: client-rate bytes/sec, client-burst bytes"
        );
    }

    let mut cert_name = None;
    let mut reloader = None;
    let mut acme_start = None;
    let mut tls_setup = None;
    if let Some(mode) = &plan.cert_mode {
        let setup =
            tls::server_config(mode, *config.public_key.as_bytes()).context("setting up TLS")?;
        cert_name = setup.cert_name.clone();
        config.tls_records = args.tls_records;
        match args.ktls.resolve() {
            Ok(true) => {
                // Same certificate resolver (and reloader), plus what a
                // hand-off to the kernel needs.
                let mut server_config = (*setup.config).clone();
                ferry_derp::transport::kernel::allow_kernel_tls(&mut server_config);
                config.tls = Some(std::sync::Arc::new(server_config));
                config.ktls = true;
                tracing::info!("kernel TLS: sessions move into the kernel after the handshake");
            }
            Ok(false) => {
                config.tls = Some(setup.config.clone());
                let why = ferry_sys::ktls::tls_ulp_available()
                    .err()
                    .unwrap_or("--ktls off");
                tracing::info!(reason = why, "kernel TLS not used: TLS stays in userspace");
            }
            Err(why) => bail!("--ktls on: {why}"),
        }
        if matches!(mode, CertMode::Manual { .. }) {
            // Certificates renewed on disk are picked up without a restart
            // (and at once on SIGHUP).
            setup
                .spawn_reloader(CERT_CHECK_INTERVAL)
                .context("starting the certificate reloader")?;
            reloader = setup.reloader.clone();
        }
        if let (Some(state), Some(opts)) = (&setup.acme, &plan.acme) {
            config.acme = Some(state.clone());
            acme_start = Some((opts.clone(), state.clone()));
        }
        tls_setup = Some(setup);
    }

    // Relay sessions: the UDP socket group first, so serverInfo can name
    // its port from the first client on.
    let mut session_relay = None;
    if let Some((addr, limits)) = plan.relay_sessions {
        let sessions = std::sync::Arc::new(ferry_udp::session::Sessions::new(limits));
        let tuning = ferry_udp::config::Tuning {
            workers: plan.workers,
            pin: false,
            ..Default::default()
        };
        let relay =
            ferry_udp::Relay::start_sessions("--relay-port", addr, sessions.clone(), tuning)
                .context("starting relay sessions")?;
        tracing::info!(addr = %sessions.bound().unwrap_or(addr), per_key = limits.per_key, idle = ?limits.idle_lifetime, "relay sessions on");
        config.relay_sessions = Some(sessions.clone());
        session_relay = Some((relay, sessions));
    }

    let mut listeners = vec![ListenerSpec {
        addr: plan.addr,
        kind: ListenerKind::Derp,
    }];
    if let Some(addr) = plan.port80 {
        listeners.push(ListenerSpec {
            addr,
            kind: ListenerKind::Port80,
        });
    }
    let server = Server::start(ServerOptions {
        config: config.clone(),
        listeners,
        workers: plan.workers,
        pin: args.pin,
        stun: plan.stun,
        metrics_addr: args.metrics_addr,
        io: args.io,
        inherited,
    })
    .context("starting the relay")?;
    {
        let dns = dns.clone();
        server
            .metrics()
            .add_source(Box::new(move |w| dns.render_metrics(w)));
    }
    dns.spawn_refresher()
        .context("starting the bootstrap DNS resolver")?;
    if let Some((relay, sessions)) = &session_relay {
        let (udp, sessions) = (relay.metrics().clone(), sessions.clone());
        server.metrics().add_source(Box::new(move |w| {
            w.push_str(&udp.render());
            sessions.render(w);
        }));
    }
    if let Some(setup) = tls_setup {
        server
            .metrics()
            .add_source(Box::new(move |w| certificate_metrics(w, &setup)));
    }
    // derper publishes its rate limits only when --rate-config is given.
    let rate_now = std::sync::Arc::new(std::sync::Mutex::new(config.rate));
    if rate_path.is_some() {
        let rate_now = rate_now.clone();
        server.metrics().add_source(Box::new(move |w| {
            let rate = *rate_now.lock().expect("rate lock");
            ferry_derp::metrics::write_gauge(
                w,
                "derp_rate_limit_per_client_bytes_per_second",
                "Per-client receive limit (--rate-config); 0 is none.",
                rate.bytes_per_sec as i64,
            );
            ferry_derp::metrics::write_gauge(
                w,
                "derp_rate_limit_per_client_burst_bytes",
                "Per-client receive burst (--rate-config).",
                rate.burst_bytes as i64,
            );
        }));
    }
    if let Some((opts, state)) = acme_start {
        let stats = std::sync::Arc::new(acme::AcmeStats::default());
        {
            let stats = stats.clone();
            server
                .metrics()
                .add_source(Box::new(move |w| stats.render(w)));
        }
        acme::spawn(opts, state, stats).context("starting the ACME client")?;
    }
    if let Err(e) = key.persist() {
        server.shutdown();
        let _ = server.wait();
        return Err(e);
    }

    let addr = server.listen_addrs[0];
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let off = || "off".to_string();
    tracing::info!(
        url = %format!("{scheme}://{addr}/derp"),
        key = %config.public_key,
        http_port = %server.listen_addrs.get(1).map_or_else(off, |a| format!("http://{a}")),
        stun = %server.stun_addr.map_or_else(off, |a| a.to_string()),
        metrics = %server.metrics_addr.map_or_else(off, |a| format!("http://{a}/metrics")),
        mesh_key = %if config.mesh_key.is_some() { "configured" } else { "none" },
        mesh_peers = config.mesh_with.len(),
        admission = %admission_summary(&config.admission),
        proxy_protocol = config.proxy_protocol,
        trusted_proxies = %config.trusted_proxies,
        derp = %if config.derp_enabled { "on" } else { "off" },
        workers = server.metrics().shards.len(),
        backend = server.metrics().backend,
        "ferry relay running"
    );
    if let Some(name) = &cert_name {
        tracing::info!(cert_name = %name, "self-signed certificate: clients must pin it with this CertName");
    }
    if args.dev {
        print_dev_banner(&server, &config, scheme, cert_name.as_deref());
    }

    loop {
        match ferry_sys::signal::wait_signal().context("waiting for a signal")? {
            Signal::Hangup => {
                reload(reloader.as_ref());
                if let Some(path) = &rate_path {
                    match load_rate_config(path) {
                        Ok(rate) => {
                            server.set_rate_config(rate);
                            *rate_now.lock().expect("rate lock") = rate;
                            tracing::info!(
                                rate = rate.bytes_per_sec,
                                burst = rate.burst_bytes,
                                "SIGHUP: rate config applied"
                            );
                        }
                        Err(e) => tracing::warn!(
                            error = format!("{e:#}"),
                            "SIGHUP: rate config not applied; the previous limits stay"
                        ),
                    }
                }
            }
            sig @ Signal::Terminate(_) => {
                tracing::info!(
                    signal = sig.name(),
                    "shutting down: telling clients, draining queues"
                );
                break;
            }
        }
    }
    server.shutdown();
    server.wait().context("stopping the relay")?;
    if let Some((relay, _)) = session_relay {
        relay.shutdown();
    }
    tracing::info!("stopped");
    Ok(())
}

/// How often manual-mode certificate files are checked for changes.
const CERT_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// SIGHUP: reloads what can change without a restart (the manual-mode
/// certificate files) and says what cannot.
/// When the served certificate stops being valid, for alerts that need no
/// probe from outside (0 while none is served: ACME before its first).
fn certificate_metrics(w: &mut String, setup: &tls::TlsSetup) {
    let not_after = setup
        .served_leaf()
        .and_then(|der| {
            x509_parser::parse_x509_certificate(der.as_ref())
                .ok()
                .map(|(_, c)| c.validity().not_after.timestamp())
        })
        .unwrap_or(0);
    ferry_derp::metrics::write_gauge(
        w,
        "ferry_tls_certificate_expiry_timestamp_seconds",
        "When the certificate the DERP listener serves expires, in Unix seconds (0: none served yet).",
        not_after,
    );
}

fn reload(reloader: Option<&tls::CertReloader>) {
    match reloader {
        Some(r) => {
            tracing::info!(cert = %r.cert_path().display(), "SIGHUP: checking the TLS certificate files");
            // A reload, or a failure (the previous certificate stays), is
            // logged by `check` itself.
            if let Ok(false) = r.check() {
                tracing::info!("SIGHUP: the TLS certificate files are unchanged");
            }
        }
        None => {
            tracing::info!("SIGHUP: nothing to reload (no --certmode manual certificate files)")
        }
    }
    tracing::info!(
        "SIGHUP: other flags and the --config file (listeners, keys, mesh key, timeouts) take effect only on a restart; --rate-config is re-read"
    );
}

/// Logs to standard error as `--log` says, or `FERRY_LOG` when that is set
/// (tracing's filter syntax); colours only on a terminal. A filter that
/// does not parse is an error naming the bad directive: tracing would
/// otherwise drop it and, with it, possibly every message.
fn init_logging(flag: &str, format: &str) -> Result<()> {
    use std::io::IsTerminal;
    let (source, spec) = match std::env::var("FERRY_LOG") {
        Ok(v) if !v.trim().is_empty() => ("FERRY_LOG", v),
        _ => ("--log", flag.to_string()),
    };
    let filter = cli::log_filter(&spec).with_context(|| format!("{source} {spec:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        "text" => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        // One JSON object per line: timestamp, level, the message and
        // every field (client key, address, reason) at the top level.
        "json" => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        other => check_log_format(other)?,
    }
    Ok(())
}

fn check_log_format(format: &str) -> Result<()> {
    match format {
        "text" | "json" => Ok(()),
        other => bail!("--log-format {other:?}: expected text or json"),
    }
}

/// The server key, and whether it still has to be written.
struct Key {
    private: NodePrivate,
    /// Where a freshly generated key goes once the relay runs.
    unsaved: Option<std::path::PathBuf>,
}

impl Key {
    /// Writes a new key to its file (owner-only), creating the directory.
    fn persist(&self) -> Result<()> {
        let Some(path) = &self.unsaved else {
            return Ok(());
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("-c: creating {}", dir.display()))?;
        }
        write_private(path, self.private.to_key_file_json().as_bytes())
            .with_context(|| format!("-c: writing {}", path.display()))?;
        tracing::info!(path = %path.display(), "created a new server key");
        Ok(())
    }
}

/// Loads the server key from `-c` (derper's key-file format), or makes a
/// new one to be written by [`Key::persist`] once the relay runs. In dev
/// mode without `-c`, a fresh key each run, never written.
fn load_key(args: &Args) -> Result<Key> {
    let path = match (&args.config, args.dev) {
        (Some(p), _) => p.clone(),
        (None, true) => {
            return Ok(Key {
                private: NodePrivate::generate(),
                unsaved: None,
            })
        }
        (None, false) => cli::default_key_path(),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Key {
            private: NodePrivate::from_key_file_json(&text)
                .map_err(|e| anyhow::anyhow!("-c {}: {e}", path.display()))?,
            unsaved: None,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Key {
            private: NodePrivate::generate(),
            unsaved: Some(path),
        }),
        Err(e) => Err(e).with_context(|| format!("-c: reading {}", path.display())),
    }
}

/// Writes a new key file, owner-only, never over an existing one.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    ferry_sys::files::write_file(path, bytes, 0o600, ferry_sys::files::Existing::Keep)
}

/// Reads `--rate-config` (derper's JSON).
fn load_rate_config(path: &std::path::Path) -> Result<RateConfig> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("--rate-config: reading {}", path.display()))?;
    RateConfig::parse(&bytes).with_context(|| format!("--rate-config {}", path.display()))
}

/// One line on who may register, for the start-up log.
fn admission_summary(a: &AdmissionConfig) -> String {
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

fn print_dev_banner(server: &Server, config: &DerpConfig, scheme: &str, cert_name: Option<&str>) {
    let addr = server.listen_addrs[0];
    let host = addr.ip().to_string();
    let stun_port = server.stun_addr.map_or(-1, |a| i64::from(a.port()));
    let mut node = serde_json::json!({
        "Name": "900a",
        "RegionID": 900,
        "HostName": host,
        "DERPPort": addr.port(),
        "STUNPort": stun_port,
    });
    if addr.is_ipv4() {
        node["IPv4"] = host.clone().into();
        node["IPv6"] = "none".into();
    } else {
        node["IPv6"] = host.clone().into();
        node["IPv4"] = "none".into();
    }
    if let Some(name) = cert_name {
        node["CertName"] = name.into();
    }
    let map = serde_json::json!({
        "Regions": { "900": { "RegionID": 900, "RegionCode": "ferry", "RegionName": "Ferry (dev)", "Nodes": [node] } },
        "omitDefaultRegions": true,
    });
    let plain_note = if scheme == "http" {
        "\n  plain HTTP: Tailscale clients need TS_DEBUG_USE_DERP_HTTP=1 to use this map"
    } else {
        ""
    };
    println!(
        "Ferry dev relay\n  DERP:    {scheme}://{addr}/derp\n  STUN:    {}\n  key:     {}\n  metrics: {scheme}://{addr}/debug/varz{plain_note}\nDERP map (JSON):\n{}",
        server.stun_addr.map_or("off".to_string(), |a| a.to_string()),
        config.public_key,
        serde_json::to_string_pretty(&map).unwrap_or_default()
    );
}
