//! Which node of a region hosts a relay session (the anchor rule of
//! `docs/relay-sessions.md` §9): a pure function of what the deciding
//! node knows about the pair, so that every node that knows the same
//! decides the same, and both peers asking at once land on one node's
//! table with no coordination round.
//!
//! For a pair {X, Y}, `where(K)` is this node if K has an active local
//! connection, else the mesh peer that announced K. Then:
//!
//! 1. both here: this node hosts (version 1 exactly);
//! 2. a key on no node of the region: no session (version 1's "peer not
//!    here");
//! 3. a pair split across nodes whose clients do not both speak version 2:
//!    no session (version-1 clients keep version 1's refusal);
//! 4. else the candidates are `[where(anchor), where(other)]`, the anchor
//!    being the lower key bytewise; the first that can host does (this
//!    node: sessions on, endpoints to advertise, not draining; a mesh
//!    peer: its connection speaks the Ferry mesh extension, is up, and
//!    last said "sessions on, not draining"); none can: refused, no host.
//!
//! The shards call it (`shard/cross_node.rs`) when a version-2 client
//! asks for a peer that a mesh link announced; the allocation then goes
//! over the mesh as meshSession frames (`ferry_proto::mesh_session`).

use ferry_proto::key::NodePublic;

/// Where a key of the pair is connected, as the deciding node sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location<N> {
    /// On this node (an active local connection).
    Here,
    /// On the mesh peer `N` (its connection announced the key).
    Node(N),
    /// On no node of the region this node knows of.
    Nowhere,
}

/// What the deciding node knows about a pair.
#[derive(Clone, Copy, Debug)]
pub struct PairView<N> {
    /// One key and where it is.
    pub a: (NodePublic, Location<N>),
    /// The other key and where it is.
    pub b: (NodePublic, Location<N>),
    /// Both clients asked for version 2 (checked each on its own node).
    pub both_v2: bool,
    /// This node can host a session whose other key is elsewhere.
    pub here_can_host: bool,
}

/// The decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Host<N> {
    /// This node hosts.
    Here,
    /// Mesh peer `N` hosts.
    Node(N),
    /// A key is on no node of the region.
    NotInRegion,
    /// Split across nodes, but a client speaks only version 1.
    NotCapable,
    /// Split across nodes and no candidate can host now.
    NoHost,
}

/// Who hosts the pair's session; `can_host(n)` says whether mesh peer
/// `n` can.
pub fn host<N: Copy>(view: &PairView<N>, can_host: impl Fn(N) -> bool) -> Host<N> {
    let (a, b) = (view.a.1, view.b.1);
    match (a, b) {
        (Location::Here, Location::Here) => return Host::Here,
        (Location::Nowhere, _) | (_, Location::Nowhere) => return Host::NotInRegion,
        _ if !view.both_v2 => return Host::NotCapable,
        _ => {}
    }
    let (anchor, other) = if view.a.0 <= view.b.0 { (a, b) } else { (b, a) };
    for candidate in [anchor, other] {
        match candidate {
            Location::Here if view.here_can_host => return Host::Here,
            Location::Node(n) if can_host(n) => return Host::Node(n),
            _ => {}
        }
    }
    Host::NoHost
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node names in the tests.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Name {
        A,
        B,
    }

    fn key(b: u8) -> NodePublic {
        NodePublic::from_bytes([b; 32])
    }

    /// The region's truth: where each key is, which nodes can host.
    struct Region {
        x: Name,
        y: Name,
        a_hosts: bool,
        b_hosts: bool,
    }

    impl Region {
        fn hosts(&self, n: Name) -> bool {
            match n {
                Name::A => self.a_hosts,
                Name::B => self.b_hosts,
            }
        }

        /// The decision on `node` for the pair (x = key 1, y = key 2, or
        /// swapped), in absolute node names.
        fn decide(&self, node: Name, swapped: bool) -> Host<Name> {
            let loc = |at: Name| {
                if at == node {
                    Location::Here
                } else {
                    Location::Node(at)
                }
            };
            let (x, y) = ((key(1), loc(self.x)), (key(2), loc(self.y)));
            let view = PairView {
                a: if swapped { y } else { x },
                b: if swapped { x } else { y },
                both_v2: true,
                here_can_host: self.hosts(node),
            };
            match host(&view, |n| self.hosts(n)) {
                Host::Here => Host::Node(node),
                other => other,
            }
        }
    }

    #[test]
    fn every_node_with_one_view_picks_one_host() {
        let names = [Name::A, Name::B];
        for x in names {
            for y in names {
                for a_hosts in [false, true] {
                    for b_hosts in [false, true] {
                        let r = Region {
                            x,
                            y,
                            a_hosts,
                            b_hosts,
                        };
                        let mut seen = Vec::new();
                        for node in [r.x, r.y] {
                            for swapped in [false, true] {
                                seen.push(r.decide(node, swapped));
                            }
                        }
                        seen.dedup();
                        assert_eq!(
                            seen.len(),
                            1,
                            "x on {x:?}, y on {y:?}, hosts {a_hosts}/{b_hosts}: {seen:?}"
                        );
                        let want = if x == y {
                            Host::Node(x)
                        } else if r.hosts(x) {
                            // key 1 (x) is the anchor.
                            Host::Node(x)
                        } else if r.hosts(y) {
                            Host::Node(y)
                        } else {
                            Host::NoHost
                        };
                        assert_eq!(
                            seen[0], want,
                            "x on {x:?}, y on {y:?}, hosts {a_hosts}/{b_hosts}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_pair_on_one_node_is_version_1_whatever_else_holds() {
        let view = PairView::<Name> {
            a: (key(9), Location::Here),
            b: (key(1), Location::Here),
            both_v2: false,
            here_can_host: false,
        };
        assert_eq!(host(&view, |_| true), Host::Here);
    }

    #[test]
    fn a_key_elsewhere_needs_both_clients_at_version_2_and_a_region_node() {
        let mut view = PairView {
            a: (key(1), Location::Here),
            b: (key(2), Location::Node(Name::B)),
            both_v2: false,
            here_can_host: true,
        };
        assert_eq!(host(&view, |_| true), Host::NotCapable);
        view.both_v2 = true;
        assert_eq!(host(&view, |_| true), Host::Here);
        view.b.1 = Location::Nowhere;
        assert_eq!(host(&view, |_| true), Host::NotInRegion);
        // The anchor's node cannot: the other one hosts.
        view.a.1 = Location::Node(Name::A);
        view.b.1 = Location::Here;
        assert_eq!(host(&view, |n| n != Name::A), Host::Here);
        view.here_can_host = false;
        assert_eq!(host(&view, |n| n != Name::A), Host::NoHost);
    }
}
