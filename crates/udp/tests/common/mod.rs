//! Helpers shared by the UDP relay's in-process tests.

use std::net::SocketAddr;

use ferry_proto::wireguard::PublicKey;
use ferry_udp::config::HubPeer;

/// The hub's peers for `keys`, named `p0`, `p1`, … and allowed to reach
/// every other; `fixed` gives peer `i` a fixed endpoint (the others' are
/// learned from their handshakes).
pub(crate) fn hub_peers(keys: &[PublicKey], fixed: Option<(usize, SocketAddr)>) -> Vec<HubPeer> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| HubPeer {
            name: format!("p{i}"),
            public_key: *k,
            allow: None,
            endpoint: fixed.filter(|&(at, _)| at == i).map(|(_, addr)| addr),
            field: format!("--peer {i}"),
        })
        .collect()
}
