//! The subset of the control protocol's JSON messages a Ferry node uses.
//!
//! Requests ([`RegisterRequest`], [`MapRequest`]) are written with Go's
//! field names. Responses ([`RegisterResponse`], [`MapResponse`]) are read
//! as Go's decoder reads them: keys match case-insensitively, `null` leaves
//! a field alone, unknown keys are skipped. Everything a server can grow is
//! bounded (peers, addresses, rules, capabilities); a list over its bound
//! is an error for the whole message. Values of a known field with the
//! wrong type are errors too.

use crate::derp_map::DerpMap;
use crate::json::{decode_object, FieldSink, GoObject};
use crate::key::{DiscoPublic, NodePublic};
use serde::de::{Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::str::FromStr;

/// Most peers in one list of a map response.
pub const MAX_PEERS: usize = 65_536;
/// Most addresses (or allowed IPs, endpoints, tags) of one node.
pub const MAX_NODE_ADDRS: usize = 256;
/// Most filter rules in one filter (or named chunk).
pub const MAX_RULES: usize = 16_384;
/// Most entries in one rule's source or destination list.
pub const MAX_RULE_ENTRIES: usize = 4096;
/// Most named filter chunks, capabilities in a map, or grants in a rule.
pub const MAX_SMALL_MAP: usize = 1024;

/// An IP prefix such as `100.64.0.1/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length.
    pub bits: u8,
}

impl FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once('/')
            .ok_or_else(|| format!("prefix {s:?} lacks /"))?;
        let addr: IpAddr = a.parse().map_err(|_| format!("bad prefix address {s:?}"))?;
        let bits: u8 = b.parse().map_err(|_| format!("bad prefix length {s:?}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if bits > max {
            return Err(format!("prefix length over {max} in {s:?}"));
        }
        Ok(Prefix { addr, bits })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

impl<'de> Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(D::Error::custom)
    }
}

/// A JSON array of at most `N` elements (more is an error).
struct Bounded<T, const N: usize>(Vec<T>);

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = Bounded<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an array of at most {N} elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element()? {
                    if v.len() == N {
                        return Err(A::Error::custom(format!("array over {N} elements")));
                    }
                    v.push(x);
                }
                Ok(Bounded(v))
            }
        }
        d.deserialize_seq(V::<T, N>(PhantomData))
    }
}

/// The keys of a JSON object (at most [`MAX_SMALL_MAP`]), values skipped.
struct Keys(Vec<String>);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Keys;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if keys.len() == MAX_SMALL_MAP {
                        return Err(A::Error::custom("object over the key limit"));
                    }
                    keys.push(k);
                }
                Ok(Keys(keys))
            }
        }
        d.deserialize_map(V)
    }
}

/// Sets `slot` from the next value unless it is `null`.
fn set<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    slot: &mut T,
    map: &mut A,
) -> Result<(), A::Error> {
    if let Some(v) = map.next_value::<Option<T>>()? {
        *slot = v;
    }
    Ok(())
}

/// Sets `slot` to the keys of the next value (an object) unless it is
/// `null`.
fn set_keys<'de, A: MapAccess<'de>>(slot: &mut Vec<String>, map: &mut A) -> Result<(), A::Error> {
    if let Some(Keys(k)) = map.next_value()? {
        *slot = k;
    }
    Ok(())
}

/// Skips the next value (an unknown field).
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(drop)
}

/// Sets a bounded list from the next value unless it is `null`.
fn set_list<'de, A: MapAccess<'de>, T: Deserialize<'de>, const N: usize>(
    slot: &mut Vec<T>,
    map: &mut A,
) -> Result<(), A::Error> {
    if let Some(Bounded::<T, N>(v)) = map.next_value()? {
        *slot = v;
    }
    Ok(())
}

/// A list of Go objects of at most `N`.
fn set_objects<'de, A: MapAccess<'de>, T: FieldSink, const N: usize>(
    slot: &mut Option<Vec<T>>,
    map: &mut A,
) -> Result<(), A::Error> {
    if let Some(Bounded::<GoObject<T>, N>(v)) = map.next_value()? {
        *slot = Some(v.into_iter().map(|o| o.0).collect());
    }
    Ok(())
}

// ---- requests ----

/// `NetInfo`: what a node reports about its network (only the home DERP).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct NetInfo {
    /// The home DERP region (0: none yet).
    #[serde(rename = "PreferredDERP")]
    pub preferred_derp: u32,
}

/// `Hostinfo`: what a node says about itself.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Hostinfo {
    /// Host name (the node's name in the tailnet derives from it).
    #[serde(rename = "Hostname")]
    pub hostname: String,
    /// Operating system, `linux`.
    #[serde(rename = "OS")]
    pub os: String,
    /// Software version, `ferry-<version>`.
    #[serde(rename = "IPNVersion")]
    pub ipn_version: String,
    /// Network facts; the home DERP region.
    #[serde(rename = "NetInfo", skip_serializing_if = "Option::is_none")]
    pub net_info: Option<NetInfo>,
}

/// `Auth` of a register request.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RegisterAuth {
    /// The pre-authentication key.
    #[serde(rename = "AuthKey")]
    pub auth_key: String,
}

/// `POST /machine/register`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RegisterRequest {
    /// Capability version.
    #[serde(rename = "Version")]
    pub version: u32,
    /// The node key to register.
    #[serde(rename = "NodeKey")]
    pub node_key: NodePublic,
    /// The auth key, when registering anew.
    #[serde(rename = "Auth", skip_serializing_if = "Option::is_none")]
    pub auth: Option<RegisterAuth>,
    /// What the node says about itself.
    #[serde(rename = "Hostinfo")]
    pub hostinfo: Hostinfo,
}

/// `POST /machine/map`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MapRequest {
    /// Capability version.
    #[serde(rename = "Version")]
    pub version: u32,
    /// Ask for keep-alive messages in the stream.
    #[serde(rename = "KeepAlive")]
    pub keep_alive: bool,
    /// The registered node key.
    #[serde(rename = "NodeKey")]
    pub node_key: NodePublic,
    /// The node's disco key.
    #[serde(rename = "DiscoKey")]
    pub disco_key: DiscoPublic,
    /// Stream responses (the long poll) or answer once.
    #[serde(rename = "Stream")]
    pub stream: bool,
    /// Leave out peers (a Hostinfo-only update).
    #[serde(rename = "OmitPeers", skip_serializing_if = "std::ops::Not::not")]
    pub omit_peers: bool,
    /// What the node says about itself.
    #[serde(rename = "Hostinfo")]
    pub hostinfo: Hostinfo,
    /// The node's UDP endpoints (`ip:port`).
    #[serde(rename = "Endpoints")]
    pub endpoints: Vec<String>,
}

impl RegisterRequest {
    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serialises")
    }
}

impl MapRequest {
    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain struct serialises")
    }
}

// ---- responses ----

/// The answer to a register request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegisterResponse {
    /// The node key has expired: register a new one.
    pub node_key_expired: bool,
    /// The machine is authorised to join.
    pub machine_authorized: bool,
    /// An interactive login URL (a pre-auth key never needs one).
    pub auth_url: String,
    /// An error text from the server.
    pub error: String,
}

impl FieldSink for RegisterResponse {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "nodekeyexpired" => set(&mut self.node_key_expired, map),
            "machineauthorized" => set(&mut self.machine_authorized, map),
            "authurl" => set(&mut self.auth_url, map),
            "error" => set(&mut self.error, map),
            _ => skip(map),
        }
    }
}

impl RegisterResponse {
    /// Parses the JSON body.
    pub fn from_json(bytes: &[u8]) -> Result<RegisterResponse, serde_json::Error> {
        decode_object(bytes)
    }
}

/// A node of the netmap (self or a peer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    /// The control server's node ID.
    pub id: u64,
    /// Full name in the tailnet (`host.user.example.`).
    pub name: String,
    /// The node (WireGuard and DERP) key.
    pub key: NodePublic,
    /// The disco key, if the node has one.
    pub disco_key: Option<DiscoPublic>,
    /// Tailnet addresses (`100.64.0.1/32`, `fd7a:…/128`).
    pub addresses: Vec<Prefix>,
    /// Home DERP region (0: none).
    pub home_derp: u32,
    /// Capability version the server reports for the node.
    pub cap: u32,
    /// Online, when the server says.
    pub online: Option<bool>,
    /// ACL tags (`tag:relay`).
    pub tags: Vec<String>,
    /// Node capabilities by name (values skipped).
    pub cap_map: Vec<String>,
}

/// The legacy `DERP` field: `127.3.3.40:<region>`.
fn legacy_derp_region(s: &str) -> u32 {
    s.strip_prefix("127.3.3.40:")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl FieldSink for Node {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "id" => set(&mut self.id, map),
            "name" => set(&mut self.name, map),
            "key" => set(&mut self.key, map),
            "discokey" => {
                if let Some(k) = map.next_value::<Option<DiscoPublic>>()? {
                    self.disco_key = (k.0 != [0; 32]).then_some(k);
                }
                Ok(())
            }
            "addresses" => set_list::<_, _, MAX_NODE_ADDRS>(&mut self.addresses, map),
            "homederp" => set(&mut self.home_derp, map),
            "derp" => {
                if let Some(s) = map.next_value::<Option<String>>()? {
                    if self.home_derp == 0 {
                        self.home_derp = legacy_derp_region(&s);
                    }
                }
                Ok(())
            }
            "cap" => set(&mut self.cap, map),
            "online" => {
                self.online = map.next_value::<Option<bool>>()?.or(self.online);
                Ok(())
            }
            "tags" => set_list::<_, _, MAX_NODE_ADDRS>(&mut self.tags, map),
            "capmap" => set_keys(&mut self.cap_map, map),
            _ => skip(map),
        }
    }
}

/// One capability grant of a filter rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapGrant {
    /// Destination prefixes (the nodes granted to).
    pub dsts: Vec<Prefix>,
    /// Capability names (legacy list).
    pub caps: Vec<String>,
    /// Capability names with values (values skipped).
    pub cap_map: Vec<String>,
}

impl FieldSink for CapGrant {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "dsts" => set_list::<_, _, MAX_RULE_ENTRIES>(&mut self.dsts, map),
            "caps" => set_list::<_, _, MAX_SMALL_MAP>(&mut self.caps, map),
            "capmap" => set_keys(&mut self.cap_map, map),
            _ => skip(map),
        }
    }
}

/// A packet filter rule (only what the capability check needs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterRule {
    /// Sources: `*`, an IP, a CIDR or a range `a-b`.
    pub src_ips: Vec<String>,
    /// Capability grants.
    pub cap_grant: Vec<CapGrant>,
}

impl FieldSink for FilterRule {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "srcips" => set_list::<_, _, MAX_RULE_ENTRIES>(&mut self.src_ips, map),
            "capgrant" => {
                let mut v = None;
                set_objects::<_, CapGrant, MAX_SMALL_MAP>(&mut v, map)?;
                if let Some(v) = v {
                    self.cap_grant = v;
                }
                Ok(())
            }
            _ => skip(map),
        }
    }
}

/// A change to one peer without resending it (`PeersChangedPatch`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerChange {
    /// The peer's node ID.
    pub node_id: u64,
    /// New home DERP region.
    pub derp_region: Option<u32>,
    /// New disco key.
    pub disco_key: Option<DiscoPublic>,
    /// New node key.
    pub key: Option<NodePublic>,
    /// New capability version.
    pub cap: Option<u32>,
    /// New online state.
    pub online: Option<bool>,
}

impl FieldSink for PeerChange {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "nodeid" => set(&mut self.node_id, map),
            "derpregion" => set(&mut self.derp_region, map),
            "discokey" => set(&mut self.disco_key, map),
            "key" => set(&mut self.key, map),
            "cap" => set(&mut self.cap, map),
            "online" => set(&mut self.online, map),
            _ => skip(map),
        }
    }
}

/// Named packet filter chunks: `None` deletes a chunk; the name `*` with
/// `None` deletes them all.
pub type PacketFilters = BTreeMap<String, Option<Vec<FilterRule>>>;

/// One message of the map stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MapResponse {
    /// A keep-alive only.
    pub keep_alive: bool,
    /// This node.
    pub node: Option<Node>,
    /// The complete peer list (replaces all peers).
    pub peers: Option<Vec<Node>>,
    /// Peers added or changed.
    pub peers_changed: Option<Vec<Node>>,
    /// IDs of peers removed.
    pub peers_removed: Option<Vec<u64>>,
    /// Small changes to peers.
    pub peers_changed_patch: Option<Vec<PeerChange>>,
    /// The DERP map.
    pub derp_map: Option<DerpMap>,
    /// The legacy whole filter (the chunk named `base`).
    pub packet_filter: Option<Vec<FilterRule>>,
    /// Named filter chunks.
    pub packet_filters: Option<PacketFilters>,
}

struct Filters(PacketFilters);

impl<'de> Deserialize<'de> for Filters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Filters;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of filter chunks")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Filters, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(k) = map.next_key::<String>()? {
                    let v: Option<Bounded<GoObject<FilterRule>, MAX_RULES>> = map.next_value()?;
                    if out.len() == MAX_SMALL_MAP && !out.contains_key(&k) {
                        return Err(A::Error::custom("too many filter chunks"));
                    }
                    out.insert(k, v.map(|b| b.0.into_iter().map(|o| o.0).collect()));
                }
                Ok(Filters(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl FieldSink for MapResponse {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "keepalive" => set(&mut self.keep_alive, map),
            "node" => {
                if let Some(GoObject(n)) = map.next_value::<Option<GoObject<Node>>>()? {
                    self.node = Some(n);
                }
                Ok(())
            }
            "peers" => set_objects::<_, Node, MAX_PEERS>(&mut self.peers, map),
            "peerschanged" => set_objects::<_, Node, MAX_PEERS>(&mut self.peers_changed, map),
            "peerschangedpatch" => {
                set_objects::<_, PeerChange, MAX_PEERS>(&mut self.peers_changed_patch, map)
            }
            "peersremoved" => {
                if let Some(Bounded::<u64, MAX_PEERS>(v)) = map.next_value()? {
                    self.peers_removed = Some(v);
                }
                Ok(())
            }
            "derpmap" => {
                if let Some(v) = map.next_value::<Option<serde_json::Value>>()? {
                    let text = serde_json::to_vec(&v).map_err(A::Error::custom)?;
                    let m = DerpMap::from_json(&text).map_err(A::Error::custom)?;
                    self.derp_map = Some(m);
                }
                Ok(())
            }
            "packetfilter" => {
                if let Some(Bounded::<GoObject<FilterRule>, MAX_RULES>(v)) = map.next_value()? {
                    self.packet_filter = Some(v.into_iter().map(|o| o.0).collect());
                }
                Ok(())
            }
            "packetfilters" => {
                if let Some(Filters(f)) = map.next_value()? {
                    self.packet_filters = Some(f);
                }
                Ok(())
            }
            _ => skip(map),
        }
    }
}

impl MapResponse {
    /// Parses one map response body.
    pub fn from_json(bytes: &[u8]) -> Result<MapResponse, serde_json::Error> {
        decode_object(bytes)
    }
}

#[cfg(test)]
mod tests;
