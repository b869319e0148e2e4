//! The tailnet section of `ferry status`, for a relay that is also a
//! tailnet node serving a Tailscale peer relay: the node's registration
//! (`ferry_tailnet_node`, `ferry_tailnet_home_region`) and the peer
//! relay's endpoints, allocations and drops.

use std::collections::BTreeMap;

use super::{count, counts, human_rate, rate, Scrape};

/// The tailnet node and its peer relay, as the metrics say.
#[derive(Debug, serde::Serialize)]
pub(super) struct Tailnet {
    login_server: String,
    hostname: String,
    /// `nodekey:` and the first 8 hex digits.
    node_key: String,
    /// registered, connecting, retrying or stopped.
    state: String,
    /// Why the last attempt ended, when retrying.
    error: Option<String>,
    /// The home DERP region reported (0: none yet).
    home_region: Option<u64>,
    /// Peer-relay endpoints by state (connecting, open).
    endpoints: BTreeMap<String, u64>,
    /// Allocation requests answered, by result (new, existing).
    allocations: BTreeMap<String, u64>,
    /// Disco packets that got no answer, by reason (non-zero only).
    disco_dropped: BTreeMap<String, u64>,
    /// Datagrams dropped on the peer-relay port, by reason (non-zero only).
    port_dropped: BTreeMap<String, u64>,
    forwarded_bytes_per_second: Option<f64>,
}

/// The section, or `None` when the relay is no tailnet node.
pub(super) fn view(a: &Scrape, b: &Scrape) -> Option<Tailnet> {
    let (_, node, _) = b
        .series
        .iter()
        .find(|(n, _, _)| n == "ferry_tailnet_node")?;
    let get = |k: &str| node.get(k).cloned().unwrap_or_default();
    let non_zero = |name: &str| {
        counts(b.by(name, "reason"))
            .into_iter()
            .filter(|(why, n)| *n > 0 && !why.is_empty())
            .collect()
    };
    let error = get("error");
    Some(Tailnet {
        login_server: get("login_server"),
        hostname: get("hostname"),
        node_key: get("node_key"),
        state: get("state"),
        error: (!error.is_empty()).then_some(error),
        home_region: b.sum("ferry_tailnet_home_region", &[]).map(count),
        endpoints: counts(b.by("ferry_udp_peer_relay_endpoints", "state")),
        allocations: counts(b.by("ferry_peer_relay_allocations_total", "result")),
        disco_dropped: non_zero("ferry_peer_relay_disco_dropped_total"),
        port_dropped: non_zero("ferry_udp_peer_relay_drops_total"),
        forwarded_bytes_per_second: rate(a, b, "ferry_udp_peer_relay_forwarded_bytes_total", &[]),
    })
}

fn list(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".to_owned();
    }
    let parts: Vec<String> = m.iter().map(|(k, n)| format!("{k} {n}")).collect();
    parts.join(", ")
}

/// The section's lines.
pub(super) fn text(t: &Tailnet, out: &mut String) {
    let state = if t.state == "registered" {
        "registered".to_owned()
    } else {
        match &t.error {
            Some(e) => format!("NOT registered: {} ({e})", t.state),
            None => format!("NOT registered: {}", t.state),
        }
    };
    let home = match t.home_region {
        Some(0) => "none yet".to_owned(),
        Some(r) => r.to_string(),
        None => "-".to_owned(),
    };
    out.push_str(&format!(
        "tailnet      {state}  {} ({})  login server {}  home region {home}\n",
        t.hostname, t.node_key, t.login_server,
    ));
    out.push_str(&format!(
        "peer relay   endpoints {}  allocations {}  forwarded {}\n",
        list(&t.endpoints),
        list(&t.allocations),
        human_rate(t.forwarded_bytes_per_second.map(|b| b * 8.0), "bit"),
    ));
    if !t.disco_dropped.is_empty() || !t.port_dropped.is_empty() {
        out.push_str(&format!(
            "             dropped disco {}  port {}\n",
            list(&t.disco_dropped),
            list(&t.port_dropped),
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{text as page, view as full_view};
    use super::*;

    const NODE: &str = "ferry_tailnet_node{login_server=\"http://10.78.0.1:8080\",hostname=\"fe-relay\",node_key=\"nodekey:abababab\",state=\"registered\",error=\"\"} 1\nferry_tailnet_home_region 900\nferry_udp_peer_relay_endpoints{state=\"connecting\"} 1\nferry_udp_peer_relay_endpoints{state=\"open\"} 2\nferry_peer_relay_allocations_total{result=\"new\"} 3\nferry_peer_relay_allocations_total{result=\"existing\"} 1\nferry_peer_relay_disco_dropped_total{reason=\"no_grant\"} 2\nferry_peer_relay_disco_dropped_total{reason=\"stale_disco\"} 0\nferry_udp_peer_relay_drops_total{reason=\"unbound\"} 0\nferry_udp_peer_relay_forwarded_bytes_total 1000\nderp_bytes_received 0\n";

    #[test]
    fn the_tailnet_section_shows_registration_endpoints_and_allocations() {
        let t0 = Instant::now();
        let a = Scrape::parse(NODE, t0);
        let later = NODE.replace("forwarded_bytes_total 1000", "forwarded_bytes_total 251000");
        let b = Scrape::parse(&later, t0 + Duration::from_secs(1));
        let v = full_view(&a, &b);
        let t = v.tailnet.as_ref().expect("a tailnet section");
        assert_eq!(t.state, "registered");
        assert_eq!(t.home_region, Some(900));
        assert_eq!(t.endpoints.get("open"), Some(&2));
        assert_eq!(t.allocations.get("new"), Some(&3));
        assert_eq!(t.disco_dropped.len(), 1);
        let text = page("x", &v);
        assert!(
            text.contains("tailnet      registered  fe-relay (nodekey:abababab)  login server http://10.78.0.1:8080  home region 900\n"),
            "{text}"
        );
        assert!(
            text.contains("peer relay   endpoints connecting 1, open 2  allocations existing 1, new 3  forwarded 2.0 Mbit/s\n"),
            "{text}"
        );
        assert!(
            text.contains("dropped disco no_grant 2  port none\n"),
            "{text}"
        );
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["tailnet"]["node_key"], "nodekey:abababab");
    }

    #[test]
    fn a_node_not_registered_says_why() {
        let retrying = NODE.replace(
            "state=\"registered\",error=\"\"",
            "state=\"retrying\",error=\"/machine/register answered 401: bad key\"",
        );
        let s = Scrape::parse(&retrying, Instant::now());
        let text = page("x", &full_view(&s, &s));
        assert!(
            text.contains("tailnet      NOT registered: retrying (/machine/register answered 401: bad key)  fe-relay"),
            "{text}"
        );
    }

    #[test]
    fn a_relay_without_the_tailnet_has_no_section() {
        let s = Scrape::parse("derp_bytes_received 0\n", Instant::now());
        let v = full_view(&s, &s);
        assert!(v.tailnet.is_none());
        assert!(!page("x", &v).contains("tailnet"));
    }
}
