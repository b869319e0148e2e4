//! Configuration that changes while the relay runs (SIGHUP): the hub's
//! peers and limits, and the per-source handshake limits.
//!
//! The control thread builds the new settings and publishes them in a
//! [`Published`](crate::published::Published) cell, then wakes the shards;
//! each shard notices the new generation at the start of its next turn (one
//! atomic load per turn, none per packet) and takes the new value. What a shard builds once at start
//! (its sockets, the listening addresses, the number of shards, buffers,
//! offloads, bounce routes) is not changed here: those need a restart.
//!
//! Peer ids stay stable across changes, because the hub's replicas refer to
//! peers by id in their tables and in the events they exchange, and the
//! shards switch to new settings one after another: a peer keeps its id for
//! as long as its public key stays configured, a new key gets a new id at
//! the end, and a removed peer's id stays as an inactive entry (so an event
//! about it from a shard that has not switched yet is recognised and
//! ignored). A key configured again gets its old id back.

use ferry_proto::wireguard::Mac1Key;

use crate::config::{ConfigError, Hub, Tuning};
use crate::hub::{Endpoint, HubSettings, PeerId, PeerInfo};

/// Per source IP: handshake messages (and new bounce clients) per second,
/// and the burst.
pub type SourceRate = (f64, f64);

/// The per-source limits a configuration asks for.
pub fn source_rate(t: &Tuning) -> SourceRate {
    (f64::from(t.handshake_rate), f64::from(t.handshake_burst))
}

/// The hub's settings for configuration `h`, keeping the ids `previous`
/// gave each public key (module doc).
pub fn hub_settings(
    h: &Hub,
    t: &Tuning,
    previous: Option<&HubSettings>,
) -> Result<HubSettings, ConfigError> {
    let mut peers: Vec<PeerInfo> = previous
        .map(|s| {
            s.peers
                .iter()
                .map(|p| PeerInfo {
                    active: false,
                    allow: None,
                    fixed: None,
                    ..p.clone()
                })
                .collect()
        })
        .unwrap_or_default();
    let mut ids = Vec::with_capacity(h.peers.len());
    for p in &h.peers {
        let id = match peers.iter().position(|q| q.key == p.public_key) {
            Some(id) => id,
            None => {
                peers.push(PeerInfo {
                    name: p.name.clone(),
                    key: p.public_key,
                    mac1: Mac1Key::new(&p.public_key),
                    allow: None,
                    fixed: None,
                    active: false,
                });
                peers.len() - 1
            }
        };
        ids.push(id);
    }
    if peers.len() > usize::from(PeerId::MAX) {
        return Err(ConfigError::OutOfRange {
            field: "hub.peer".into(),
            why: format!(
                "more than {} different peers since the relay started; restart it",
                PeerId::MAX
            ),
        });
    }
    let id_of = |name: &str| {
        h.peers
            .iter()
            .position(|p| p.name == name)
            .map(|i| ids[i] as PeerId)
    };
    for (p, &id) in h.peers.iter().zip(&ids) {
        let entry = &mut peers[id];
        entry.name = p.name.clone();
        entry.active = true;
        entry.allow = p.allow.as_ref().map(|names| {
            let mut allowed: Vec<PeerId> = names.iter().filter_map(|n| id_of(n)).collect();
            allowed.sort_unstable();
            allowed
        });
        entry.fixed = p.endpoint.map(|addr| Endpoint { addr, via: 0 });
    }
    let (handshake_rate, handshake_burst) = source_rate(t);
    Ok(HubSettings {
        peers,
        max_indices: h.max_indices,
        handshake_rate,
        handshake_burst,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const A: &str = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I=";
    const B: &str = "2U8lQNjeBL0yOxqE5T323qgIdDE7NgTDB370HDIKG0s=";
    const C: &str = "+J8YptlHwfXAAv/hvlXWeHdkjXZXvgpFtN8T/nPcWEo=";

    fn hub(peers: &[(&str, &str, &str)]) -> Config {
        let mut text = "[hub]\nlisten = [\":1\"]\n".to_string();
        for (name, key, extra) in peers {
            text += &format!("[[hub.peer]]\nname = \"{name}\"\npublic_key = \"{key}\"\n{extra}\n");
        }
        Config::from_toml("f", &text).unwrap()
    }

    fn settings(c: &Config, previous: Option<&HubSettings>) -> HubSettings {
        hub_settings(c.hub.as_ref().unwrap(), &c.tuning, previous).unwrap()
    }

    #[test]
    fn peers_keep_their_ids_across_changes() {
        let one = settings(&hub(&[("a", A, ""), ("b", B, "")]), None);
        assert_eq!(one.peers.len(), 2);
        // b goes, c comes (allowed to reach a only), a is renamed.
        let two = settings(
            &hub(&[("c", C, "allow = [\"x\"]"), ("x", A, "")]),
            Some(&one),
        );
        let names: Vec<(&str, bool)> = two
            .peers
            .iter()
            .map(|p| (p.name.as_str(), p.active))
            .collect();
        assert_eq!(names, [("x", true), ("b", false), ("c", true)]);
        assert_eq!(two.peers[2].allow.as_deref(), Some(&[0][..]));
        assert!(two.allowed(0, 2) && !two.allowed(0, 1), "b is gone");
        // b again: its old id.
        let three = settings(&hub(&[("a", A, ""), ("b", B, "")]), Some(&two));
        let active: Vec<bool> = three.peers.iter().map(|p| p.active).collect();
        assert_eq!(active, [true, true, false]);
        assert_eq!(three.peers[1].key.to_base64(), B);
    }
}
