//! The node's view of the tailnet, rebuilt from the map stream.

use ferry_proto::derp_map::DerpMap;
use ferry_proto::key::DiscoPublic;
use ferry_proto::key::NodePublic;
use ferry_proto::tailnet::tailcfg::{FilterRule, MapResponse, Node};
use std::collections::{BTreeMap, HashMap};

/// A snapshot of the netmap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Netmap {
    /// Grows by one with every change published.
    pub version: u64,
    /// This node as the control server sees it (addresses, tags, keys).
    pub self_node: Option<Node>,
    /// Peers by node ID (changed by [`Netmap::apply`]; by hand, call
    /// [`Netmap::reindex`] after).
    pub peers: BTreeMap<u64, Node>,
    /// The DERP map, once sent.
    pub derp_map: Option<DerpMap>,
    /// Packet filter chunks by name (the legacy whole filter is `base`).
    pub filters: BTreeMap<String, Vec<FilterRule>>,
    /// Peer IDs by node key, rebuilt by [`Netmap::apply`] (every packet
    /// that arrives over DERP is looked up by its sender).
    pub(crate) by_key: HashMap<NodePublic, u64>,
}

impl Netmap {
    /// All filter rules, chunk by chunk.
    pub fn filter_rules(&self) -> impl Iterator<Item = &FilterRule> {
        self.filters.values().flatten()
    }

    /// The peer with node key `key` (one hash lookup: the index follows
    /// [`Netmap::apply`]; after changing `peers` by hand, call
    /// [`Netmap::reindex`]).
    pub fn peer_by_node_key(&self, key: &NodePublic) -> Option<&Node> {
        self.by_key
            .get(key)
            .and_then(|id| self.peers.get(id))
            .filter(|p| p.key == *key)
    }

    /// Rebuilds the node-key index from `peers`. Two peers with one key
    /// (a key not sent yet): the lowest ID.
    pub fn reindex(&mut self) {
        self.by_key.clear();
        for (id, p) in &self.peers {
            self.by_key.entry(p.key).or_insert(*id);
        }
    }

    /// The peer whose disco key is `key`.
    pub fn peer_by_disco_key(&self, key: &DiscoPublic) -> Option<&Node> {
        self.peers.values().find(|p| p.disco_key == Some(*key))
    }

    /// Applies one map response; whether anything changed (keep-alives
    /// change nothing).
    pub fn apply(&mut self, m: MapResponse) -> bool {
        let before = self.clone();
        if let Some(n) = m.node {
            self.self_node = Some(n);
        }
        if let Some(peers) = m.peers {
            self.peers = peers.into_iter().map(|p| (p.id, p)).collect();
        }
        for p in m.peers_changed.into_iter().flatten() {
            self.peers.insert(p.id, p);
        }
        for id in m.peers_removed.into_iter().flatten() {
            self.peers.remove(&id);
        }
        for c in m.peers_changed_patch.into_iter().flatten() {
            let Some(p) = self.peers.get_mut(&c.node_id) else {
                continue;
            };
            if let Some(r) = c.derp_region {
                p.home_derp = r;
            }
            if let Some(k) = c.disco_key {
                p.disco_key = (k.0 != [0; 32]).then_some(k);
            }
            if let Some(k) = c.key {
                p.key = k;
            }
            if let Some(v) = c.cap {
                p.cap = v;
            }
            if c.online.is_some() {
                p.online = c.online;
            }
        }
        if let Some(d) = m.derp_map {
            self.derp_map = Some(d);
        }
        if let Some(f) = m.packet_filter {
            self.filters.insert("base".to_owned(), f);
        }
        for (name, chunk) in m.packet_filters.into_iter().flatten() {
            match chunk {
                None if name == "*" => self.filters.clear(),
                None => {
                    self.filters.remove(&name);
                }
                Some(rules) => {
                    self.filters.insert(name, rules);
                }
            }
        }
        self.reindex();
        let changed = *self != before;
        if changed {
            self.version = before.version + 1;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(n: &mut Netmap, json: &str) -> bool {
        n.apply(MapResponse::from_json(json.as_bytes()).unwrap())
    }

    #[test]
    fn full_delta_patch_filters() {
        let mut n = Netmap::default();
        assert!(!apply(&mut n, r#"{"KeepAlive":true}"#));
        assert_eq!(n.version, 0);
        assert!(apply(
            &mut n,
            r#"{"Node":{"ID":9,"Tags":["tag:relay"]},"Peers":[{"ID":1},{"ID":2}],
               "PacketFilter":[{"SrcIPs":["*"]}],"PacketFilters":{"x":[{"SrcIPs":["1.2.3.4"]}]}}"#
        ));
        assert_eq!(n.version, 1);
        assert_eq!(n.self_node.as_ref().unwrap().tags, ["tag:relay"]);
        assert_eq!(n.peers.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(n.filter_rules().count(), 2);
        assert!(apply(
            &mut n,
            r#"{"PeersChanged":[{"ID":3,"DiscoKey":"discokey:0101010101010101010101010101010101010101010101010101010101010101"}],"PeersRemoved":[1],
               "PeersChangedPatch":[{"NodeID":2,"DERPRegion":5},{"NodeID":77,"DERPRegion":1}],
               "PacketFilters":{"x":null}}"#
        ));
        assert_eq!(n.peers.keys().copied().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(n.peers[&2].home_derp, 5);
        let key = NodePublic::from_bytes([0; 32]);
        assert_eq!(n.peer_by_node_key(&key).map(|p| p.id), Some(2));
        assert_eq!(
            n.peer_by_disco_key(&DiscoPublic([1; 32])).map(|p| p.id),
            Some(3)
        );
        assert!(n.peer_by_disco_key(&DiscoPublic([2; 32])).is_none());
        let one = NodePublic::from_bytes([1; 32]);
        assert!(n.peer_by_node_key(&one).is_none());
        assert!(apply(
            &mut n,
            r#"{"PeersChangedPatch":[{"NodeID":3,"Key":"nodekey:0101010101010101010101010101010101010101010101010101010101010101"}]}"#
        ));
        assert_eq!(n.peer_by_node_key(&one).map(|p| p.id), Some(3));
        assert_eq!(n.peer_by_node_key(&key).map(|p| p.id), Some(2));
        // Peers changed by hand are found once reindexed.
        n.peers.remove(&3);
        let mut moved = n.peers[&2].clone();
        moved.id = 4;
        moved.key = one;
        n.peers.insert(4, moved);
        n.reindex();
        assert_eq!(n.peer_by_node_key(&one).map(|p| p.id), Some(4));
        assert_eq!(n.filter_rules().count(), 1);
        assert!(apply(&mut n, r#"{"PacketFilters":{"*":null}}"#));
        assert_eq!(n.filter_rules().count(), 0);
        assert!(!apply(&mut n, r#"{"PacketFilters":{"*":null}}"#));
        assert_eq!(n.version, 4);
    }
}
