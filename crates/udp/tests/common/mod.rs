//! Helpers shared by the UDP relay's in-process tests.

use std::net::SocketAddr;

use ferry_proto::wireguard::{self as wg, Mac1Key, PublicKey};
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

/// A WireGuard handshake message of `kind` (1: initiation, 2: response)
/// from index `sender` (a response to `receiver`), MAC1 sealed for `to`.
#[allow(dead_code)] // not every test binary calls it
pub(crate) fn handshake(kind: u8, sender: u32, receiver: u32, to: &PublicKey) -> Vec<u8> {
    let mut m = vec![
        0x5a;
        if kind == 1 {
            wg::INITIATION_LEN
        } else {
            wg::RESPONSE_LEN
        }
    ];
    m[..4].copy_from_slice(&[kind, 0, 0, 0]);
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    if kind == 2 {
        m[8..12].copy_from_slice(&receiver.to_le_bytes());
    }
    assert!(wg::seal_mac1(&mut m, &Mac1Key::new(to)));
    m
}

/// A WireGuard transport message of `len` bytes to index `receiver`, with
/// `counter`.
#[allow(dead_code)] // not every test binary calls it
pub(crate) fn data(receiver: u32, counter: u64, len: usize) -> Vec<u8> {
    let mut m = vec![0xd0; len];
    m[..4].copy_from_slice(&[4, 0, 0, 0]);
    m[4..8].copy_from_slice(&receiver.to_le_bytes());
    m[8..16].copy_from_slice(&counter.to_le_bytes());
    m
}
