//! Fuzz entry points for the tailnet control channel: the Noise response
//! and records, the upgrade answer, the early payload, the map stream
//! framing and the JSON responses (see the parent module for how the entry
//! points are used).

use super::{chunks, max_chunk, XorShift};
use crate::key::MachinePrivate;
use crate::tailnet::noise::{self, responder, Initiator, NoiseError, MAX_FRAME};
use crate::tailnet::tailcfg::{self, MapResponse, RegisterResponse};
use crate::tailnet::{early, map_frame, upgrade};

fn initiator() -> (Initiator, MachinePrivate) {
    let server = MachinePrivate::from_bytes([0x42; 32]);
    let client = MachinePrivate::from_bytes([0x24; 32]);
    let init = Initiator::new(&client, &server.public(), 130, [0x11; 32]).expect("valid keys");
    (init, server)
}

/// The client's Noise layer. `data[0] & 1 == 0`: the rest is the server's
/// answer to the initiation, read whole and byte by byte with the same
/// outcome. Otherwise: a real handshake, then the rest is sealed by the
/// server in pieces and fed to the client in random chunks (the plaintext
/// comes back unchanged), and then handed to the client as raw records
/// (never a panic, never more plaintext than bytes given).
pub fn noise_client(data: &[u8]) {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let (init, server) = initiator();
    if ctl & 1 == 0 {
        let whole = init.read_response(rest).map(|r| r.map(|(_, n)| n));
        for n in 0..=rest.len() {
            match init.read_response(&rest[..n]) {
                Ok(None) => {}
                Ok(Some((_, used))) => {
                    assert_eq!(used, noise::RESPONSE_LEN);
                    assert_eq!(whole, Ok(Some(used)));
                    return;
                }
                Err(e) => {
                    assert_eq!(Err(e), whole.map(|_| ()), "prefix {n}");
                    return;
                }
            }
        }
        return;
    }
    let (resp, mut s, _) = responder::respond(&server, init.initiation(), [0x33; 32]).unwrap();
    let (mut c, _) = init.read_response(&resp).unwrap().unwrap();
    let mut rng = XorShift::new(u32::from(ctl));
    let mut wire = Vec::new();
    let mut pos = 0;
    while pos < rest.len() {
        let take = (rng.below(6000) + 1).min(rest.len() - pos);
        s.seal(&rest[pos..pos + take], &mut wire).unwrap();
        pos += take;
    }
    let mut buf = Vec::new();
    let mut plain = Vec::new();
    for piece in chunks(&wire, max_chunk(ctl >> 1, wire.len()), &mut rng) {
        buf.extend_from_slice(piece);
        let used = c.open(&mut buf, &mut plain).unwrap();
        assert!(used <= buf.len());
        buf.drain(..used);
    }
    assert!(buf.is_empty());
    assert_eq!(plain, rest);
    let mut raw = rest.to_vec();
    let mut out = Vec::new();
    match c.open(&mut raw, &mut out) {
        Ok(used) => assert!(used <= rest.len() && out.len() <= used),
        Err(NoiseError::FrameTooLarge(n)) => assert!(n > MAX_FRAME),
        Err(_) => {}
    }
}

/// The answer to the upgrade request: a complete head never claims more
/// bytes than given, and no prefix of a complete head is complete.
pub fn ts2021_upgrade(data: &[u8]) {
    if let Ok(Some(n)) = upgrade::parse_response(data) {
        assert!(n <= data.len());
        assert_eq!(upgrade::parse_response(&data[..n]), Ok(Some(n)));
        if n > 0 {
            assert!(!matches!(
                upgrade::parse_response(&data[..n - 1]),
                Ok(Some(_))
            ));
        }
    }
}

/// The early payload: what is present lies inside the input, within the
/// limit, and every shorter prefix needs more (or is refused the same way).
pub fn early_payload(data: &[u8]) {
    match early::parse(data) {
        Ok(early::Early::Present { len, .. }) => {
            assert!(len <= data.len() && len <= early::HEADER_LEN + early::MAX_PAYLOAD);
            assert_eq!(early::parse(&data[..len - 1]), Ok(early::Early::NeedMore));
        }
        Ok(early::Early::Absent) => {
            assert!(data.len() < 5 || data[..5] != early::MAGIC);
        }
        Ok(early::Early::NeedMore) | Err(_) => {}
    }
}

/// The map stream: frames split with a small limit always lie inside the
/// input, and each body goes through the map response parser.
pub fn map_frames(data: &[u8]) {
    let mut rest = data;
    for _ in 0..data.len() + 1 {
        match map_frame::next_frame(rest, 4096) {
            Ok(Some((body, used))) => {
                assert_eq!(used, body.len() + 4);
                map_response(body);
                rest = &rest[used..];
            }
            Ok(None) => return,
            Err(e) => {
                assert!(e.len > 4096);
                return;
            }
        }
    }
    panic!("map frames did not advance");
}

/// One map response: whatever parses respects every bound.
pub fn map_response(data: &[u8]) {
    let Ok(m) = MapResponse::from_json(data) else {
        return;
    };
    let nodes = m
        .node
        .iter()
        .chain(m.peers.iter().flatten())
        .chain(m.peers_changed.iter().flatten());
    for n in nodes {
        assert!(n.addresses.len() <= tailcfg::MAX_NODE_ADDRS);
        assert!(n.tags.len() <= tailcfg::MAX_NODE_ADDRS);
        assert!(n.cap_map.len() <= tailcfg::MAX_SMALL_MAP);
        assert!(n.disco_key.is_none_or(|k| k.0 != [0; 32]));
    }
    for list in [&m.peers, &m.peers_changed] {
        assert!(list.as_ref().is_none_or(|l| l.len() <= tailcfg::MAX_PEERS));
    }
    let rules = m
        .packet_filter
        .iter()
        .chain(m.packet_filters.iter().flat_map(|f| f.values().flatten()));
    for r in rules {
        assert!(r.len() <= tailcfg::MAX_RULES);
        for rule in r {
            assert!(rule.src_ips.len() <= tailcfg::MAX_RULE_ENTRIES);
            assert!(rule.cap_grant.len() <= tailcfg::MAX_SMALL_MAP);
        }
    }
}

/// The register response: parses or not, never panics.
pub fn register_response(data: &[u8]) {
    let _ = RegisterResponse::from_json(data);
}

/// The capability check over a packet filter: the first byte picks the
/// requester's address, the rest is a map response whose filter is
/// checked. A grant is only ever found for a requester some rule lists as
/// a source, and every prefix holds its own address.
pub fn filter_caps(data: &[u8]) {
    use crate::tailnet::filter::{has_cap, source_matches};
    use std::net::IpAddr;
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(m) = MapResponse::from_json(rest) else {
        return;
    };
    let src: IpAddr = match sel % 4 {
        0 => [100, 64, 0, 1].into(),
        1 => [100, 64, 0, sel].into(),
        2 => "fd7a:115c:a1e0::1".parse().expect("literal"),
        _ => [10, 0, 0, sel].into(),
    };
    let me: Vec<tailcfg::Prefix> = ["100.64.0.3/32", "fd7a:115c:a1e0::3/128"]
        .iter()
        .map(|p| p.parse().expect("literal"))
        .collect();
    let rules: Vec<&tailcfg::FilterRule> = m
        .packet_filter
        .iter()
        .flatten()
        .chain(
            m.packet_filters
                .iter()
                .flat_map(|f| f.values().flatten().flatten()),
        )
        .collect();
    for r in &rules {
        for g in &r.cap_grant {
            assert!(g.dsts.iter().all(|d| d.contains(d.addr)));
            for cap in g.cap_map.iter().chain(&g.caps) {
                if has_cap(rules.iter().copied(), src, &me, cap) {
                    assert!(rules
                        .iter()
                        .any(|r| r.src_ips.iter().any(|s| source_matches(s, src))));
                }
            }
        }
    }
    assert!(source_matches("*", src));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `noise_client` seed `response_valid` is the server's real
    /// answer for the target's fixed keys, so mutations start from a
    /// response that authenticates.
    #[test]
    fn noise_seed_is_a_valid_response() {
        let (init, server) = initiator();
        let (resp, _, _) = responder::respond(&server, init.initiation(), [0x33; 32]).unwrap();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/noise_client/response_valid"
        );
        let mut want = vec![0u8];
        want.extend_from_slice(&resp);
        if std::env::var_os("FERRY_WRITE_SEEDS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        assert_eq!(std::fs::read(path).unwrap(), want);
        assert!(init.read_response(&resp).unwrap().is_some());
        noise_client(&want);
    }
}
