//! The DERP server, `ferry`'s default service (with STUN beside it):
//! flags ([`args`], derper's names; [`derper`] for what derper has and
//! ferry refuses), what they resolve to ([`plan`]), the ACME client
//! ([`acme`]), and the running server here.

pub(crate) mod acme;
pub(crate) mod args;
mod banner;
pub(crate) mod derper;
pub(crate) mod plan;
pub(crate) mod tailnet;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry_derp::certs::{self, CertMode};
use ferry_derp::{ListenerKind, ListenerSpec, Server, ServerOptions};
use ferry_sys::signal::Signal;

use crate::flags::Origins;
use args::DerpArgs;
use plan::{admission_summary, load_rate_config, Prepared};

/// Runs the DERP server until SIGINT or SIGTERM. An error about a flag a
/// file or a variable set names that key or variable.
pub(crate) fn run(args: &DerpArgs, origins: &Origins) -> Result<()> {
    serve(args, origins).map_err(|e| origins.locate(e))
}

/// Runs the DERP server until SIGINT or SIGTERM.
fn serve(args: &DerpArgs, origins: &Origins) -> Result<()> {
    // Listening sockets from a service manager (packaging/systemd's
    // ferry.socket), taken before any other thread exists.
    let inherited: Vec<std::sync::Arc<std::net::TcpListener>> = ferry_sys::activation::listen_fds()
        .context("sockets from the service manager (LISTEN_FDS)")?
        .into_iter()
        .map(|fd| std::sync::Arc::new(std::net::TcpListener::from(fd)))
        .collect();
    let source = origins
        .winner("log")
        .map_or("--log".to_string(), |g| g.place());
    crate::logs::init(&source, &args.log, &args.log_format)?;
    for line in origins.disagreements() {
        tracing::warn!("{line}");
    }

    // Signals are handled by the main thread only: block them before any
    // other thread exists so every thread inherits the mask.
    ferry_sys::signal::block_signals().context("blocking SIGINT/SIGTERM/SIGHUP")?;
    match ferry_sys::raise_nofile_limit() {
        Ok(n) => tracing::debug!(limit = n, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
    // Memory taken by load goes back when the load does.
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
    } = plan::prepare(args)?;
    for warning in &plan.warnings {
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
    let mut cert_setup = None;
    if let Some(mode) = &plan.cert_mode {
        let setup =
            certs::server_config(mode, *config.public_key.as_bytes()).context("setting up TLS")?;
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
        cert_setup = Some(setup);
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
        let bound = sessions.bound().unwrap_or(addr);
        sessions.set_advertised(
            plan.relay_advertise
                .iter()
                .map(|&(ip, port)| std::net::SocketAddr::new(ip, port.unwrap_or(bound.port())))
                .collect(),
        );
        if plan.relay_advertise.is_empty() && bound.ip().is_unspecified() {
            // Offers of pairs split across nodes cannot say "where you
            // reached DERP": they name this host's interface addresses.
            let mut own = tailnet::offered_addrs(bound);
            own.truncate(ferry_proto::relay_session::MAX_ENDPOINTS);
            sessions.set_cross_node_default(own);
        }
        let endpoints = sessions.endpoints().unwrap_or_default();
        let cross_node = sessions.cross_node_endpoints().unwrap_or_default();
        tracing::info!(addr = %bound, ?endpoints, ?cross_node, per_key = limits.per_key, idle = ?limits.idle_lifetime, "relay sessions on");
        if !ferry_proto::relay_session::SessionService::hosts_cross_node(&*sessions) {
            tracing::info!("relay sessions: the session socket is bound to an unspecified address, --relay-advertise is not set and the host has no interface address to offer; this node hosts no session for a pair split across the region's nodes");
        }
        config.relay_sessions = Some(sessions.clone());
        session_relay = Some((relay, sessions));
    }

    // The peer relay's port (its tailnet node starts once the key file,
    // beside which its state lives, is written).
    let peer_port = match &plan.peer_relay {
        Some(p) => Some(tailnet::start_port(p, plan.workers)?),
        None => None,
    };

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
    if let Some(setup) = cert_setup {
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
    match key.persist("-c") {
        Ok(true) => {
            let path = key.unsaved.as_deref().unwrap_or(std::path::Path::new(""));
            tracing::info!(path = %path.display(), "created a new server key");
        }
        Ok(false) => {}
        Err(e) => {
            server.shutdown();
            let _ = server.wait();
            return Err(e);
        }
    }
    let mut tailnet_node = None;
    if let (Some(p), Some(port)) = (&plan.peer_relay, &peer_port) {
        let node = match tailnet::start_node(p, port) {
            Ok(n) => n,
            Err(e) => {
                server.shutdown();
                let _ = server.wait();
                return Err(e);
            }
        };
        // The port's own series (its shards' generic UDP counters would
        // repeat the relay sessions' names) and the node's.
        let (relays, stats) = (port.relays.clone(), node.relay_stats());
        let (observer, key, p) = (node.observer(), node.node_key(), p.clone());
        server.metrics().add_source(Box::new(move |w| {
            tailnet::render_node(&p, &key, &observer.status(), w);
            relays.render(w);
            if let Some(s) = &stats {
                tailnet::render_stats(s, w);
            }
        }));
        tailnet_node = Some(node);
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
        banner::print(&server, &config, scheme, cert_name.as_deref());
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
    drop(tailnet_node);
    if let Some(port) = peer_port {
        port.udp.shutdown();
    }
    tracing::info!("stopped");
    Ok(())
}

/// How often manual-mode certificate files are checked for changes.
const CERT_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// When the served certificate stops being valid, for alerts that need no
/// probe from outside (0 while none is served: ACME before its first).
fn certificate_metrics(w: &mut String, setup: &certs::CertSetup) {
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

/// SIGHUP: reloads what can change without a restart (the manual-mode
/// certificate files) and says what cannot.
fn reload(reloader: Option<&certs::CertReloader>) {
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
