//! Shared helpers and the `docs/derp-protocol.md` §17 test keys for unit tests.

use crate::key::{NodePrivate, NodePublic};

/// Decodes hex, ignoring whitespace and `|` separators as written in
/// `docs/derp-protocol.md` §17.
pub(crate) fn unhex(s: &str) -> Vec<u8> {
    let s: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '|')
        .collect();
    assert_eq!(s.len() & 1, 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The bytes of the vector line `name: <hex>` of
/// `docs/relay-sessions.md` (spaces within the hex ignored).
pub(crate) fn relay_sessions_vector(name: &str) -> Vec<u8> {
    let doc = include_str!("../../../docs/relay-sessions.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no `{name}:` vector in docs/relay-sessions.md"));
    unhex(line.split_once(": ").expect("checked").1)
}

fn private(hex: &str) -> NodePrivate {
    format!("privkey:{hex}").parse().unwrap()
}

/// `docs/derp-protocol.md` §17.1 server private key.
pub(crate) fn server_private() -> NodePrivate {
    private("0002030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f60")
}

/// `docs/derp-protocol.md` §17.1 client private key.
pub(crate) fn client_private() -> NodePrivate {
    private("2022232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f40")
}

/// `docs/derp-protocol.md` §17.1 server public key `S`.
pub(crate) fn key_s() -> NodePublic {
    NodePublic::from_hex("07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c")
        .unwrap()
}

/// `docs/derp-protocol.md` §17.1 client public key `C`.
pub(crate) fn key_c() -> NodePublic {
    NodePublic::from_hex("5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b")
        .unwrap()
}

/// `docs/derp-protocol.md` §17.1 peer public key `P`.
pub(crate) fn key_p() -> NodePublic {
    NodePublic::from_hex("64b101b1d0be5a8704bd078f9895001fc03e8e9f9522f188dd128d9846d48466")
        .unwrap()
}

/// `docs/derp-protocol.md` §17.3 clientInfo frame:
/// `{"version":2,"CanAckPings":true}` sealed from the client to `S` with nonce
/// `00..17`.
pub(crate) const CLIENT_INFO_FRAME: &str = "0200000068 |
    5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b
    000102030405060708090a0b0c0d0e0f1011121314151617
    176bdffac6239dc06abd2678210731e1
    69d7ad3c284e14bd97d07b31d36052dc1b4b776d33dac1529db871ecd021683e";

/// `docs/derp-protocol.md` §17.3 serverInfo frame: `{"version":2}` sealed from
/// the server to `C` with nonce `a0..b7`.
pub(crate) const SERVER_INFO_FRAME: &str = "0300000035 |
    a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7
    72af1f39b485ad626eebed2deb909582
    358210dd5f19ea382d6c234826";

/// `docs/derp-protocol.md` §17.5 fast-start request head, as Go writes it for a
/// non-default port.
pub(crate) const FAST_START_REQUEST: &[u8] = b"GET /derp HTTP/1.1\r\n\
    Host: derp.example.com:8443\r\n\
    User-Agent: Go-http-client/1.1\r\n\
    Connection: Upgrade\r\n\
    Derp-Fast-Start: 1\r\n\
    Ideal-Node: 900a\r\n\
    Upgrade: DERP\r\n\
    \r\n";
