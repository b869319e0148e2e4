//! The `--dev` banner: what a client needs, and a DERP map that works.

use ferry_derp::{DerpConfig, Server};

/// Prints the dev relay's URL, STUN address, key and a DERP map for it.
pub(crate) fn print(server: &Server, config: &DerpConfig, scheme: &str, cert_name: Option<&str>) {
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
