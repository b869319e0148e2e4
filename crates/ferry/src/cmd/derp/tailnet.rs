//! Ferry as a tailnet node serving a Tailscale peer relay: the flags that
//! turn it on (they go together), and starting the peer-relay port and
//! the control client.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferry_engine::stat::exposition::{Exposition, Family};
use ferry_proto::key::DiscoPrivate;
use ferry_tailnet::relay::answer::Drop;
use ferry_tailnet::relay::Stats;
use ferry_udp::peer_relay::{Limits, PeerRelays};

use super::args::DerpArgs;

/// The state file's name, in the directory of the `-c` key file.
pub(crate) const STATE_FILE: &str = "ferry-tailnet.json";

/// What the tailnet flags resolve to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerRelayPlan {
    /// The control server.
    pub login_server: String,
    /// The pre-auth key's file.
    pub auth_key_file: PathBuf,
    /// The peer-relay socket's address.
    pub addr: SocketAddr,
    /// The node's host name.
    pub hostname: String,
    /// The state file (beside the key file).
    pub state_path: PathBuf,
    /// `--peer-relay-endpoints`: the addresses to offer (empty: the
    /// socket's own, see [`offered_addrs`]).
    pub endpoints: Vec<SocketAddr>,
}

/// The flags that must be given together, as the operator writes them.
const TOGETHER: &str = "--tailnet-login-server, --tailnet-auth-key-file and --peer-relay-port";

impl PeerRelayPlan {
    /// `None` without any of the tailnet flags; an error naming the
    /// missing one when only some are given. `ip` is the `-a` address.
    pub(crate) fn from_args(args: &DerpArgs, ip: IpAddr) -> Result<Option<PeerRelayPlan>> {
        let (server, key, port) = (
            &args.tailnet_login_server,
            &args.tailnet_auth_key_file,
            args.peer_relay_port,
        );
        if server.is_none() && key.is_none() && port.is_none() {
            if args.tailnet_hostname.is_some() {
                bail!("--tailnet-hostname: needs {TOGETHER}");
            }
            if args.peer_relay_endpoints.is_some() {
                bail!("--peer-relay-endpoints: needs {TOGETHER}");
            }
            return Ok(None);
        }
        let missing = [
            (server.is_none(), "--tailnet-login-server"),
            (key.is_none(), "--tailnet-auth-key-file"),
            (port.is_none(), "--peer-relay-port"),
        ];
        if let Some((_, name)) = missing.iter().find(|(m, _)| *m) {
            bail!("{name} is missing: {TOGETHER} go together");
        }
        let (Some(server), Some(key), Some(port)) = (server, key, port) else {
            unreachable!("each was checked above");
        };
        ferry_tailnet::LoginServer::parse(server)
            .map_err(|e| anyhow::anyhow!("--tailnet-login-server: {e}"))?;
        let hostname = match &args.tailnet_hostname {
            Some(h) if h.trim().is_empty() => bail!("--tailnet-hostname: empty"),
            Some(h) => h.clone(),
            None => host_name(),
        };
        Ok(Some(PeerRelayPlan {
            login_server: server.clone(),
            auth_key_file: key.clone(),
            addr: SocketAddr::new(ip, port),
            hostname,
            state_path: state_path(args.key_path().as_deref())?,
            endpoints: match &args.peer_relay_endpoints {
                Some(list) => parse_endpoints(list)?,
                None => Vec::new(),
            },
        }))
    }
}

/// `--peer-relay-endpoints`: comma-separated `ADDR:PORT` (IPv6 in
/// brackets), at least one, each a unicast address with a port, no
/// repeats.
fn parse_endpoints(list: &str) -> Result<Vec<SocketAddr>> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for item in list.split(',').map(str::trim) {
        let a: SocketAddr = item
            .parse()
            .map_err(|_| anyhow::anyhow!("--peer-relay-endpoints: {item:?} is not ADDR:PORT"))?;
        if a.port() == 0 || a.ip().is_unspecified() || a.ip().is_multicast() {
            bail!("--peer-relay-endpoints: {item}: needs a unicast address and a port");
        }
        if out.contains(&a) {
            bail!("--peer-relay-endpoints: {item} twice");
        }
        out.push(a);
    }
    Ok(out)
}

/// The addresses the peer relay offers clients: the configured ones, or
/// else the bound socket's ([`offered_addrs`]).
pub(crate) fn addrs_to_offer(plan: &PeerRelayPlan, bound: SocketAddr) -> Vec<SocketAddr> {
    if plan.endpoints.is_empty() {
        offered_addrs(bound)
    } else {
        plan.endpoints.clone()
    }
}

/// This host's name (the kernel's), or `ferry` when it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "ferry".to_owned())
}

/// Reads the pre-auth key (trimmed; an empty file is an error).
pub(crate) fn read_auth_key(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--tailnet-auth-key-file: reading {}", path.display()))?;
    let key = text.trim();
    if key.is_empty() {
        bail!("--tailnet-auth-key-file {}: empty", path.display());
    }
    Ok(key.to_owned())
}

/// The state file beside the key file `key_path` (`None` in dev mode
/// without `-c`: the node would get a fresh identity each run).
pub(crate) fn state_path(key_path: Option<&Path>) -> Result<PathBuf> {
    let Some(key) = key_path else {
        bail!("--tailnet-login-server needs a key file (-c): the tailnet node's keys are kept beside it in {STATE_FILE}");
    };
    let dir = key.parent().filter(|d| !d.as_os_str().is_empty());
    Ok(dir.unwrap_or(Path::new(".")).join(STATE_FILE))
}

/// The addresses offered to clients: the socket's own address when it is
/// bound to one, else every non-loopback address of the host's
/// interfaces (point-to-point ones included: a tunnel address is a
/// reachable address for some clients), with the bound port.
pub(crate) fn offered_addrs(bound: SocketAddr) -> Vec<SocketAddr> {
    if !bound.ip().is_unspecified() {
        return vec![bound];
    }
    let all = match ferry_sys::ifaddrs::interface_addrs() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "peer relay: cannot list the interface addresses");
            return Vec::new();
        }
    };
    let mut out: Vec<SocketAddr> = all
        .into_iter()
        .filter(|a| !a.loopback && !a.addr.is_loopback() && !a.addr.is_unspecified())
        .filter(|a| match a.addr {
            IpAddr::V4(_) => true,
            // Link-local IPv6 needs a scope no answer can carry.
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
        })
        .filter(|a| bound.is_ipv6() || a.addr.is_ipv4())
        .map(|a| SocketAddr::new(a.addr, bound.port()))
        .collect();
    out.dedup();
    out
}

const ALLOCATIONS: Family<'static> = Family::counter(
    "ferry_peer_relay_allocations_total",
    "Allocation requests from tailnet peers answered, by result (new endpoint, or the pair's existing one).",
)
.labels(&["result"]);
const DISCO_DROPPED: Family<'static> = Family::counter(
    "ferry_peer_relay_disco_dropped_total",
    "Disco packets over DERP to the tailnet node that got no answer, by reason.",
)
.labels(&["reason"]);
const HOME_REGION: Family<'static> = Family::gauge(
    "ferry_tailnet_home_region",
    "The DERP region the tailnet node is connected to and reports as its home (0: none yet).",
);

const NODE: Family<'static> = Family::gauge(
    "ferry_tailnet_node",
    "The tailnet node (always 1): its login server, host name, node key (short), state (registered, connecting, retrying, stopped) and, when retrying, the error that ended the last attempt.",
)
.labels(&["login_server", "hostname", "node_key", "state", "error"]);

/// The longest error text put in a label.
const ERROR_LABEL_MAX: usize = 200;

/// A node key's short form: `nodekey:` and its first 8 hex digits.
pub(crate) fn short_key(key: &ferry_proto::key::NodePublic) -> String {
    let full = key.to_string();
    full.get(..16).unwrap_or(&full).to_owned()
}

/// The state label and the error text for a driver status.
fn state_label(status: &ferry_tailnet::Status) -> (&'static str, String) {
    use ferry_tailnet::Status;
    match status {
        Status::Connecting => ("connecting", String::new()),
        Status::Polling => ("registered", String::new()),
        Status::Backoff { error } => {
            let mut e = error.replace(['\n', '\r'], " ");
            if e.len() > ERROR_LABEL_MAX {
                let mut end = ERROR_LABEL_MAX;
                while !e.is_char_boundary(end) {
                    end -= 1;
                }
                e.truncate(end);
            }
            ("retrying", e)
        }
        Status::Stopped => ("stopped", String::new()),
    }
}

/// The tailnet node's registration, for /metrics (what `ferry status`
/// shows).
pub(crate) fn render_node(
    plan: &PeerRelayPlan,
    key: &ferry_proto::key::NodePublic,
    status: &ferry_tailnet::Status,
    o: &mut String,
) {
    let (state, error) = state_label(status);
    Exposition::new(o).family(&NODE).sample(
        &[
            &plan.login_server,
            &plan.hostname,
            &short_key(key),
            state,
            &error,
        ],
        1,
    );
}

/// The tailnet node's peer-relay counters, for /metrics.
pub(crate) fn render_stats(stats: &Stats, o: &mut String) {
    let mut w = Exposition::new(o);
    w.family(&ALLOCATIONS)
        .sample(&["new"], stats.allocated())
        .sample(&["existing"], stats.existing());
    let mut f = w.family(&DISCO_DROPPED);
    for why in Drop::ALL {
        f.sample(&[why.label()], stats.dropped(why));
    }
    w.single(&HOME_REGION, u64::from(stats.home_region()));
}

/// The environment variable that shortens the peer relay's steady-state
/// lifetime (whole seconds), for end-to-end tests of idle expiry only: the
/// lifetime is also what allocation answers tell clients. Not a flag, so
/// that no configuration file or `--help` offers it.
pub(crate) const STEADY_STATE_TEST_KNOB: &str = "FERRY_TEST_PEER_RELAY_STEADY_STATE_SECS";

/// The peer relay's limits: the defaults, but for the test knob's
/// steady-state lifetime when `env` has it (a bad value is an error).
fn peer_relay_limits(env: impl Fn(&str) -> Option<String>) -> Result<Limits> {
    let mut limits = Limits::default();
    if let Some(v) = env(STEADY_STATE_TEST_KNOB) {
        let secs: u64 = v
            .trim()
            .parse()
            .ok()
            .filter(|s| (1..=limits.steady_state_lifetime.as_secs()).contains(s))
            .with_context(|| {
                format!(
                    "{STEADY_STATE_TEST_KNOB}={v:?}: want whole seconds, 1 to {}",
                    limits.steady_state_lifetime.as_secs()
                )
            })?;
        limits.steady_state_lifetime = std::time::Duration::from_secs(secs);
    }
    Ok(limits)
}

/// The peer relay's port and its endpoint table.
pub(crate) struct PeerRelayPort {
    /// The UDP port.
    pub udp: ferry_udp::Relay,
    /// The endpoints.
    pub relays: Arc<PeerRelays>,
}

/// Starts the peer-relay port (before the DERP server, like the relay
/// sessions' port), offering its addresses.
pub(crate) fn start_port(plan: &PeerRelayPlan, workers: usize) -> Result<PeerRelayPort> {
    // ServerDisco is fresh per process, as Tailscale's relay server's.
    let limits = peer_relay_limits(|k| std::env::var(k).ok())?;
    if limits.steady_state_lifetime != Limits::default().steady_state_lifetime {
        tracing::warn!(
            lifetime = ?limits.steady_state_lifetime,
            "peer relay: steady-state lifetime shortened by {STEADY_STATE_TEST_KNOB} (for tests only)"
        );
    }
    let relays = Arc::new(PeerRelays::new(DiscoPrivate::generate(), limits));
    let tuning = ferry_udp::config::Tuning {
        workers,
        pin: false,
        ..Default::default()
    };
    let udp =
        ferry_udp::Relay::start_peer_relay("--peer-relay-port", plan.addr, relays.clone(), tuning)
            .context("starting the peer relay")?;
    let bound = relays.bound().unwrap_or(plan.addr);
    let addrs = addrs_to_offer(plan, bound);
    if addrs.is_empty() {
        tracing::warn!(%bound, "peer relay: no address to offer: allocations are refused");
    }
    relays.set_addrs(addrs);
    if plan.endpoints.is_empty() {
        // No public address configured: ask the home region's STUN
        // server too (the tailnet node does, from this port).
        relays.stun().enable();
    }
    Ok(PeerRelayPort { udp, relays })
}

/// Starts the tailnet node that hands out the port's endpoints (once the
/// key file, beside which its state file lives, exists).
pub(crate) fn start_node(
    plan: &PeerRelayPlan,
    port: &PeerRelayPort,
) -> Result<ferry_tailnet::Handle> {
    let auth_key = read_auth_key(&plan.auth_key_file)?;
    if let Some(dir) = plan.state_path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating {} for the tailnet state", dir.display()))?;
    }
    let tailnet = ferry_tailnet::start(ferry_tailnet::Config {
        login_server: plan.login_server.clone(),
        tls_roots: ferry_client::TlsRoots::System,
        auth_key,
        state_path: plan.state_path.clone(),
        hostname: plan.hostname.clone(),
        preferred_derp: 0,
        peer_relay: Some(ferry_tailnet::PeerRelay {
            relays: port.relays.clone(),
            // tailscaled's switch for plain-HTTP DERP servers (test beds).
            derp_plain_http: std::env::var_os("TS_DEBUG_USE_DERP_HTTP")
                .is_some_and(|v| !v.is_empty() && v != "0" && v != "false"),
        }),
    })
    .context("starting the tailnet node")?;
    tracing::info!(
        login_server = %plan.login_server,
        hostname = %plan.hostname,
        node_key = %tailnet.node_key(),
        state = %plan.state_path.display(),
        port = %port.relays.bound().unwrap_or(plan.addr),
        offered = ?port.relays.addrs(),
        "peer relay on: tailnet node starting"
    );
    Ok(tailnet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn args(list: &[&str]) -> DerpArgs {
        let argv: Vec<OsString> = std::iter::once("ferry")
            .chain(list.iter().copied())
            .map(OsString::from)
            .collect();
        super::super::args::parse(argv).unwrap()
    }

    fn plan(list: &[&str]) -> Result<Option<PeerRelayPlan>> {
        PeerRelayPlan::from_args(&args(list), "10.0.0.1".parse().unwrap())
    }

    /// The three flags that go together.
    const ALL: [&str; 6] = [
        "--tailnet-login-server",
        "http://10.0.0.1:8080",
        "--tailnet-auth-key-file",
        "/k",
        "--peer-relay-port",
        "40000",
    ];

    /// The three flags with a host name and a key file.
    fn full_plan() -> PeerRelayPlan {
        let with_key = [&ALL[..], &["--tailnet-hostname", "relay", "-c", "/s/k"]].concat();
        plan(&with_key).unwrap().unwrap()
    }

    #[test]
    fn without_the_flags_nothing_changes() {
        assert_eq!(plan(&[]).unwrap(), None);
    }

    #[test]
    fn the_three_flags_go_together_and_an_error_names_the_missing_one() {
        let all = ALL;
        let p = full_plan();
        assert_eq!(p.state_path, Path::new("/s").join(STATE_FILE));
        assert_eq!(p.addr, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(p.hostname, "relay");
        assert_eq!(p.login_server, "http://10.0.0.1:8080");
        for (i, name) in [
            (0, "--tailnet-login-server"),
            (2, "--tailnet-auth-key-file"),
            (4, "--peer-relay-port"),
        ] {
            let mut some = all.to_vec();
            some.drain(i..i + 2);
            let e = plan(&some).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{name} is missing")), "{e}");
        }
        let e = plan(&["--tailnet-hostname", "x"]).unwrap_err().to_string();
        assert!(e.starts_with("--tailnet-hostname: needs"), "{e}");
        let mut bad = all.to_vec();
        bad[1] = "ftp://x";
        let e = plan(&bad).unwrap_err().to_string();
        assert!(
            e.starts_with("--tailnet-login-server: login server \"ftp://x\""),
            "{e}"
        );
    }

    #[test]
    fn the_state_file_lives_beside_the_key_file() {
        assert_eq!(
            state_path(Some(Path::new("/var/lib/ferry/ferry.key"))).unwrap(),
            Path::new("/var/lib/ferry").join(STATE_FILE)
        );
        assert_eq!(
            state_path(Some(Path::new("ferry.key"))).unwrap(),
            Path::new(".").join(STATE_FILE)
        );
        assert!(state_path(None).is_err());
    }

    #[test]
    fn the_counters_render_as_a_valid_page() {
        let mut page = String::new();
        render_stats(&Stats::default(), &mut page);
        assert_eq!(
            ferry_engine::stat::exposition::check(&page),
            Vec::<String>::new()
        );
        assert!(page.contains("ferry_peer_relay_allocations_total{result=\"new\"} 0"));
        assert!(page.contains("ferry_peer_relay_disco_dropped_total{reason=\"no_grant\"} 0"));
        assert!(page.contains("ferry_tailnet_home_region 0"));
    }

    #[test]
    fn the_node_renders_its_registration() {
        let p = full_plan();
        let key = ferry_proto::key::NodePublic([0xab; 32]);
        let mut page = String::new();
        render_node(&p, &key, &ferry_tailnet::Status::Polling, &mut page);
        assert_eq!(
            ferry_engine::stat::exposition::check(&page),
            Vec::<String>::new()
        );
        assert!(
            page.contains("ferry_tailnet_node{login_server=\"http://10.0.0.1:8080\",hostname=\"relay\",node_key=\"nodekey:abababab\",state=\"registered\",error=\"\"} 1"),
            "{page}"
        );
        let mut page = String::new();
        let error = format!(
            "/machine/register answered 401: \"bad key\"\n{}",
            "x".repeat(500)
        );
        render_node(
            &p,
            &key,
            &ferry_tailnet::Status::Backoff { error },
            &mut page,
        );
        assert_eq!(
            ferry_engine::stat::exposition::check(&page),
            Vec::<String>::new()
        );
        assert!(
            page.contains(
                "state=\"retrying\",error=\"/machine/register answered 401: \\\"bad key\\\" xxx"
            ),
            "{page}"
        );
        assert!(page.len() < 600, "the error is cut: {page}");
    }

    #[test]
    fn the_test_knob_alone_shortens_the_steady_state_lifetime() {
        let with = |v: Option<&str>| {
            peer_relay_limits(|k| {
                assert_eq!(k, STEADY_STATE_TEST_KNOB);
                v.map(str::to_owned)
            })
        };
        assert_eq!(with(None).unwrap(), Limits::default());
        let l = with(Some("5")).unwrap();
        assert_eq!(l.steady_state_lifetime, std::time::Duration::from_secs(5));
        assert_eq!(
            Limits {
                steady_state_lifetime: Limits::default().steady_state_lifetime,
                ..l
            },
            Limits::default()
        );
        for bad in ["", "0", "5s", "-1", "301"] {
            let e = with(Some(bad)).unwrap_err().to_string();
            assert!(e.starts_with(STEADY_STATE_TEST_KNOB), "{bad:?}: {e}");
        }
    }

    #[test]
    fn configured_endpoints_are_offered_instead_of_the_socket() {
        let with = |list: &str| {
            let argv = [&ALL[..], &["-c", "/s/k", "--peer-relay-endpoints", list]].concat();
            plan(&argv)
        };
        let p = with("203.0.113.7:41000, [2001:db8::1]:40000")
            .unwrap()
            .unwrap();
        let want: Vec<SocketAddr> = vec![
            "203.0.113.7:41000".parse().unwrap(),
            "[2001:db8::1]:40000".parse().unwrap(),
        ];
        assert_eq!(p.endpoints, want);
        let bound: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        assert_eq!(addrs_to_offer(&p, bound), want);
        // What a client's allocation answer carries.
        let relays = PeerRelays::new(DiscoPrivate::generate(), Limits::default());
        relays.set_addrs(addrs_to_offer(&p, bound));
        let req = ferry_proto::disco::AllocateRequest {
            client_disco: [
                DiscoPrivate::generate().public(),
                DiscoPrivate::generate().public(),
            ],
            generation: 1,
        };
        let a = relays
            .allocate(
                &ferry_proto::key::NodePublic([1; 32]),
                &req,
                std::time::Instant::now(),
            )
            .unwrap();
        assert_eq!(a.response.endpoint.endpoints, want);
        // Without the flag: the socket's address.
        assert_eq!(addrs_to_offer(&full_plan(), bound), [bound]);
        for bad in [
            "",
            "203.0.113.7",
            "203.0.113.7:0",
            "0.0.0.0:1",
            "a:1",
            "1.2.3.4:1,1.2.3.4:1",
        ] {
            assert!(with(bad).is_err(), "{bad:?} accepted");
        }
        let e = plan(&["--peer-relay-endpoints", "1.2.3.4:5"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--peer-relay-endpoints: needs"), "{e}");
    }

    #[test]
    fn a_bound_address_is_offered_as_it_is() {
        let a: SocketAddr = "10.78.0.1:40000".parse().unwrap();
        assert_eq!(offered_addrs(a), [a]);
        let any: SocketAddr = "0.0.0.0:40000".parse().unwrap();
        for o in offered_addrs(any) {
            assert!(
                o.is_ipv4() && !o.ip().is_loopback() && o.port() == 40000,
                "{o}"
            );
        }
    }
}
