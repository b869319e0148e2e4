//! One disco packet that arrived over DERP, answered or dropped: the
//! node's side of a peer-relay allocation, without I/O.
//!
//! A packet counts only when it comes from a netmap peer (by the node key
//! DERP names), sealed by that peer's current disco key to this node's
//! disco key, and holds an allocation request naming the sender in its
//! pair. Each peer (by its tailnet IPv4 address, else its IPv6 one) may
//! send [`REQUEST_BURST`] packets at once and [`REQUEST_RATE`] a second
//! after that; the limit is taken before any crypto. The peer must hold `tailscale.com/cap/relay` on this node in the
//! packet filter (source = the peer's address, destination = this node's),
//! and this node must not carry the `disable-relay-server` attribute.
//! Anything else is dropped silently (Tailscale has no refusal message);
//! the caller counts the reason.
//!
//! After a netmap change, [`revoke_ungranted`] frees the endpoints of
//! requesters that no longer hold the grant (or are no longer peers, or
//! the relay was turned off): a withdrawn grant takes effect at once
//! rather than when the endpoints expire.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Instant;

use ferry_proto::disco::{self, Message};
use ferry_proto::key::{DiscoPrivate, DiscoPublic, NodePublic};
use ferry_proto::nacl::NONCE_LEN;
use ferry_proto::tailnet::filter;
use ferry_proto::tailnet::tailcfg::{Node, Prefix};
use ferry_udp::peer_relay::{PeerRelays, Refusal};
use ferry_udp::ratelimit::SourceLimiter;

use crate::Netmap;

/// The capability a requester must hold on this node.
pub const RELAY_CAP: &str = "tailscale.com/cap/relay";
/// The node attribute that turns the relay off.
pub const DISABLE_RELAY: &str = "disable-relay-server";
/// Largest disco packet read from DERP (an allocation request is 148
/// bytes).
pub const MAX_DISCO: usize = 1024;

/// Disco packets one peer may send at once ...
pub const REQUEST_BURST: f64 = 32.0;
/// ... and per second after that (a client asks once per peer it cannot
/// reach directly, and again every 30 s or so while it cannot).
pub const REQUEST_RATE: f64 = 4.0;

/// The per-peer limiter [`answer`] takes: [`REQUEST_RATE`] and
/// [`REQUEST_BURST`] in a fixed-size table.
pub fn limiter() -> SourceLimiter {
    SourceLimiter::new(4096, REQUEST_RATE, REQUEST_BURST)
}

/// Why a packet got no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// Not a disco packet (no magic, too short for a box).
    NotDisco,
    /// Longer than [`MAX_DISCO`].
    Oversize,
    /// The DERP sender is not a netmap peer.
    UnknownPeer,
    /// The sender's disco key is not the peer's current one.
    StaleDisco,
    /// The peer sent more than its rate.
    RateLimited,
    /// The box did not open, or its message did not parse.
    BadBox,
    /// A message other than an allocation request.
    UnexpectedType,
    /// The sender is not one of the pair it asks for.
    NotInPair,
    /// The filter does not grant the requester the relay capability.
    NoGrant,
    /// This node carries `disable-relay-server`.
    Disabled,
    /// The table refused (limits, no address yet, a bad pair).
    Refused(Refusal),
}

impl Drop {
    /// Every reason, for counters.
    pub const ALL: [Drop; 16] = [
        Drop::NotDisco,
        Drop::Oversize,
        Drop::UnknownPeer,
        Drop::StaleDisco,
        Drop::RateLimited,
        Drop::BadBox,
        Drop::UnexpectedType,
        Drop::NotInPair,
        Drop::NoGrant,
        Drop::Disabled,
        Drop::Refused(Refusal::ServerDisco),
        Drop::Refused(Refusal::SamePair),
        Drop::Refused(Refusal::NotReady),
        Drop::Refused(Refusal::RequesterLimit),
        Drop::Refused(Refusal::DiscoLimit),
        Drop::Refused(Refusal::TotalLimit),
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Drop::NotDisco => "not_disco",
            Drop::Oversize => "oversize",
            Drop::UnknownPeer => "unknown_peer",
            Drop::StaleDisco => "stale_disco",
            Drop::RateLimited => "rate_limited",
            Drop::BadBox => "bad_box",
            Drop::UnexpectedType => "unexpected_type",
            Drop::NotInPair => "not_in_pair",
            Drop::NoGrant => "no_grant",
            Drop::Disabled => "disabled",
            Drop::Refused(Refusal::ServerDisco) => "server_disco",
            Drop::Refused(Refusal::SamePair) => "same_pair",
            Drop::Refused(Refusal::NotReady) => "not_ready",
            Drop::Refused(Refusal::RequesterLimit) => "requester_limit",
            Drop::Refused(Refusal::DiscoLimit) => "disco_limit",
            Drop::Refused(Refusal::TotalLimit) => "total_limit",
        }
    }

    /// Its index in [`Drop::ALL`].
    pub fn index(self) -> usize {
        Drop::ALL
            .iter()
            .position(|d| *d == self)
            .expect("every reason is listed")
    }
}

/// An answer to send back over DERP to the requester.
#[derive(Debug)]
pub struct Answer {
    /// The sealed allocation response.
    pub packet: Vec<u8>,
    /// Whether the pair already had this endpoint.
    pub existing: bool,
    /// The endpoint's VNI.
    pub vni: u32,
    /// The pair of disco keys the endpoint serves.
    pub client_disco: [DiscoPublic; 2],
}

/// Disco keys of netmap peers that allocations have named, so that the
/// first allocation naming a peer's key (a new node, or a node restarted
/// with a new disco key) is logged once. A key counts only while it is a
/// peer's current disco key in the netmap (which the control server
/// vouches for), and the set is cleared when full: a requester naming
/// keys of its own choosing cannot make lines.
#[derive(Debug, Default)]
pub struct FirstSeen {
    seen: HashSet<DiscoPublic>,
}

impl FirstSeen {
    /// Keys remembered before the set starts over.
    pub const CAP: usize = 4096;

    /// The peers (node key, disco key) among `answer`'s pair whose
    /// current disco key no allocation named before.
    pub fn note(&mut self, netmap: &Netmap, answer: &Answer) -> Vec<(NodePublic, DiscoPublic)> {
        let mut new = Vec::new();
        for key in answer.client_disco {
            let Some(peer) = netmap.peer_by_disco_key(&key) else {
                continue;
            };
            if self.seen.contains(&key) {
                continue;
            }
            if self.seen.len() >= Self::CAP {
                self.seen.clear();
            }
            self.seen.insert(key);
            new.push((peer.key, key));
        }
        new
    }
}

/// The node's own address of one family (a /32 or /128 prefix).
fn single_addr(addrs: &[Prefix], v4: bool) -> Option<IpAddr> {
    let full = if v4 { 32 } else { 128 };
    addrs
        .iter()
        .find(|p| p.addr.is_ipv4() == v4 && p.bits == full)
        .map(|p| p.addr)
}

/// Whether `peer` holds the relay capability on `me` under `netmap`'s
/// filter (its IPv4 address first, then its IPv6 one).
pub fn granted(netmap: &Netmap, me: &Node, peer: &Node) -> bool {
    [true, false].into_iter().any(|v4| {
        single_addr(&peer.addresses, v4).is_some_and(|src| {
            filter::has_cap(netmap.filter_rules(), src, &me.addresses, RELAY_CAP)
        })
    })
}

/// Frees the endpoints in `relays` whose requester may no longer have
/// them under `netmap`; how many. A netmap without this node (none yet)
/// frees nothing.
pub fn revoke_ungranted(netmap: &Netmap, relays: &PeerRelays) -> usize {
    let Some(me) = netmap.self_node.as_ref() else {
        return 0;
    };
    let keep: HashSet<NodePublic> = if me.cap_map.iter().any(|c| c == DISABLE_RELAY) {
        HashSet::new()
    } else {
        netmap
            .peers
            .values()
            .filter(|p| granted(netmap, me, p))
            .map(|p| p.key)
            .collect()
    };
    relays.revoke(|requester| keep.contains(requester))
}

/// Answers `packet`, which DERP delivered from `src`: an allocation in
/// `relays` and the sealed response, or why not.
#[allow(clippy::too_many_arguments)]
pub fn answer(
    netmap: &Netmap,
    limiter: &mut SourceLimiter,
    disco_key: &DiscoPrivate,
    relays: &PeerRelays,
    src: &NodePublic,
    packet: &[u8],
    now: Instant,
    nonce: &[u8; NONCE_LEN],
) -> Result<Answer, Drop> {
    if packet.len() > MAX_DISCO {
        return Err(Drop::Oversize);
    }
    let sender = disco::sender(packet).ok_or(Drop::NotDisco)?;
    let peer = netmap.peer_by_node_key(src).ok_or(Drop::UnknownPeer)?;
    if peer.disco_key != Some(sender) {
        return Err(Drop::StaleDisco);
    }
    let ip = single_addr(&peer.addresses, true)
        .or_else(|| single_addr(&peer.addresses, false))
        .ok_or(Drop::NoGrant)?;
    if !limiter.allow(ip, now) {
        return Err(Drop::RateLimited);
    }
    let shared = disco_key.shared(&sender);
    let Message::AllocateRequest(request) =
        disco::open(&shared, packet).map_err(|_| Drop::BadBox)?
    else {
        return Err(Drop::UnexpectedType);
    };
    if !request.client_disco.contains(&sender) {
        return Err(Drop::NotInPair);
    }
    let me = netmap.self_node.as_ref().ok_or(Drop::NoGrant)?;
    if me.cap_map.iter().any(|c| c == DISABLE_RELAY) {
        return Err(Drop::Disabled);
    }
    if !granted(netmap, me, peer) {
        return Err(Drop::NoGrant);
    }
    let allocated = relays.allocate(src, &request, now).map_err(Drop::Refused)?;
    let (vni, client_disco) = (
        allocated.response.endpoint.vni,
        allocated.response.endpoint.client_disco,
    );
    let mut out = Vec::with_capacity(256);
    disco::seal(
        &mut out,
        &shared,
        &disco_key.public(),
        nonce,
        &Message::AllocateResponse(allocated.response),
    );
    Ok(Answer {
        packet: out,
        existing: allocated.existing,
        vni,
        client_disco,
    })
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
