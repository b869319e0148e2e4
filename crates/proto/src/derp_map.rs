//! Tailscale's DERP map (`docs/derp-protocol.md` §15): the regions a
//! client may use and the nodes in each, as JSON from a control server, a
//! policy file or a URL.
//!
//! The map is untrusted input, so [`DerpMap::from_json`] bounds it (at most
//! [`MAX_MAP_LEN`] bytes, [`MAX_REGIONS`] regions, [`MAX_NODES`] nodes per
//! region) and reads only what a DERP client needs to pick a home region
//! and dial it: region IDs, codes and names, `NoMeasureNoHome`, the home
//! scores, and per node its name, host name, certificate name, literal
//! addresses, DERP port, `STUNOnly` and `InsecureForTests`. Everything
//! else (STUN ports, coordinates, `CanPort80`, …) is skipped. Keys match
//! case-insensitively and a later duplicate replaces an earlier one, as
//! with Go's `encoding/json`; a value of the wrong type, a port outside
//! 0…65535, a region ID outside 1…2⁵³−1, or a region whose map key and
//! `RegionID` disagree is an error.
//!
//! [`DerpMap::to_json`] writes the same fields back with Go's spellings, so
//! a parsed map round-trips (the fuzz target checks that).

use crate::json::{decode_object, FieldSink, GoObject};
use serde::de::{Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Longest DERP map accepted, in bytes (Tailscale's own is about 20 KiB).
pub const MAX_MAP_LEN: usize = 1 << 20;
/// Most regions accepted in one map.
pub const MAX_REGIONS: usize = 1024;
/// Most nodes accepted in one region.
pub const MAX_NODES: usize = 64;
/// Largest region ID: Go's JSON numbers are exact up to 2⁵³−1.
pub const MAX_REGION_ID: u64 = (1 << 53) - 1;

/// Why a DERP map was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DerpMapError {
    /// The document is longer than [`MAX_MAP_LEN`].
    #[error("DERP map of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Its length.
        len: usize,
        /// [`MAX_MAP_LEN`].
        max: usize,
    },
    /// Not JSON, a value of the wrong type, or a limit or range broken
    /// (the message names the field).
    #[error("invalid DERP map: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// A DERP map: regions by ID.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DerpMap {
    /// The regions, by region ID.
    pub regions: BTreeMap<u64, Region>,
    /// `HomeParams.RegionScore`: a factor applied to a region's measured
    /// latency when choosing a home (below 1 favours it); missing means 1.
    pub region_scores: BTreeMap<u64, f64>,
}

/// One region: a set of interchangeable nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Region {
    /// `RegionID`, equal to its key in the map.
    pub region_id: u64,
    /// `RegionCode`, a short code such as `nyc`.
    pub region_code: String,
    /// `RegionName`, the long name.
    pub region_name: String,
    /// `NoMeasureNoHome`: never measured nor chosen as home.
    pub no_measure_no_home: bool,
    /// `Nodes`, in priority order.
    pub nodes: Vec<Node>,
}

/// One DERP server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Node {
    /// `Name`, unique in the map (sent as `Ideal-Node`).
    pub name: String,
    /// `RegionID` of the owning region, as the node states it.
    pub region_id: u64,
    /// `HostName`: dialled when no literal address is given, sent as TLS
    /// SNI and checked in the certificate.
    pub host_name: String,
    /// `CertName`: the name to check in the certificate instead of
    /// `host_name`, or a `sha256-raw:<hex>` pin; empty when absent.
    pub cert_name: String,
    /// `IPv4`.
    pub ipv4: AddrField<Ipv4Addr>,
    /// `IPv6`.
    pub ipv6: AddrField<Ipv6Addr>,
    /// `DERPPort`; 0 means the default (443).
    pub derp_port: u16,
    /// `STUNOnly`: never dialled for DERP.
    pub stun_only: bool,
    /// `InsecureForTests`: the node's certificate is not verified.
    pub insecure_for_tests: bool,
}

/// A node's `IPv4` or `IPv6` field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AddrField<A> {
    /// Empty or absent: resolve `HostName`.
    #[default]
    Resolve,
    /// A literal address to dial.
    Literal(A),
    /// Any other string (conventionally `none`): this family is not used.
    Disabled,
}

impl<A: std::str::FromStr> AddrField<A> {
    fn parse(text: &str) -> Self {
        if text.is_empty() {
            AddrField::Resolve
        } else {
            text.parse().map_or(AddrField::Disabled, AddrField::Literal)
        }
    }
}

impl<A: fmt::Display> AddrField<A> {
    fn to_text(&self) -> String {
        match self {
            AddrField::Resolve => String::new(),
            AddrField::Literal(a) => a.to_string(),
            AddrField::Disabled => "none".to_owned(),
        }
    }
}

impl DerpMap {
    /// Parses a DERP map from untrusted JSON (see the module docs).
    pub fn from_json(bytes: &[u8]) -> Result<DerpMap, DerpMapError> {
        if bytes.len() > MAX_MAP_LEN {
            return Err(DerpMapError::TooLarge {
                len: bytes.len(),
                max: MAX_MAP_LEN,
            });
        }
        Ok(decode_object(bytes)?)
    }

    /// The map as JSON with Go's field names (only the fields parsed).
    pub fn to_json(&self) -> String {
        let regions: Map<String, Value> = self
            .regions
            .iter()
            .map(|(id, r)| (id.to_string(), r.to_value()))
            .collect();
        let mut doc = json!({ "Regions": regions });
        if !self.region_scores.is_empty() {
            let scores: Map<String, Value> = self
                .region_scores
                .iter()
                .map(|(id, s)| (id.to_string(), json!(s)))
                .collect();
            doc["HomeParams"] = json!({ "RegionScore": scores });
        }
        doc.to_string()
    }

    /// The score factor for `region_id` (1 when absent or not positive, as
    /// Go treats it).
    pub fn region_score(&self, region_id: u64) -> f64 {
        match self.region_scores.get(&region_id) {
            Some(&s) if s > 0.0 && s.is_finite() => s,
            _ => 1.0,
        }
    }
}

impl Region {
    fn to_value(&self) -> Value {
        let nodes: Vec<Value> = self.nodes.iter().map(Node::to_value).collect();
        json!({
            "RegionID": self.region_id,
            "RegionCode": self.region_code,
            "RegionName": self.region_name,
            "NoMeasureNoHome": self.no_measure_no_home,
            "Nodes": nodes,
        })
    }

    /// The nodes a DERP client may dial, in priority order (`STUNOnly`
    /// ones skipped).
    pub fn derp_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| !n.stun_only)
    }
}

impl Node {
    fn to_value(&self) -> Value {
        json!({
            "Name": self.name,
            "RegionID": self.region_id,
            "HostName": self.host_name,
            "CertName": self.cert_name,
            "IPv4": self.ipv4.to_text(),
            "IPv6": self.ipv6.to_text(),
            "DERPPort": self.derp_port,
            "STUNOnly": self.stun_only,
            "InsecureForTests": self.insecure_for_tests,
        })
    }

    /// The TCP port to dial: `DERPPort`, or 443 when it is 0.
    pub fn port(&self) -> u16 {
        if self.derp_port == 0 {
            443
        } else {
            self.derp_port
        }
    }
}

// ---------------------------------------------------------------------------
// Decoding

fn next_or_default<'de, A: MapAccess<'de>, T: serde::Deserialize<'de> + Default>(
    map: &mut A,
) -> Result<T, A::Error> {
    Ok(map.next_value::<Option<T>>()?.unwrap_or_default())
}

fn region_id<E: serde::de::Error>(v: i128, what: &str) -> Result<u64, E> {
    u64::try_from(v)
        .ok()
        .filter(|id| (1..=MAX_REGION_ID).contains(id))
        .ok_or_else(|| E::custom(format_args!("{what} {v} is outside 1..={MAX_REGION_ID}")))
}

impl FieldSink for DerpMap {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "regions" => {
                if let Some(regions) = map.next_value::<Option<Regions>>()? {
                    self.regions = regions.0;
                }
            }
            "homeparams" => {
                if let Some(GoObject(p)) = map.next_value::<Option<GoObject<HomeParams>>>()? {
                    self.region_scores = p.scores;
                }
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct HomeParams {
    scores: BTreeMap<u64, f64>,
}

impl FieldSink for HomeParams {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        if key == "regionscore" {
            let scores: Option<BTreeMap<String, f64>> = map.next_value()?;
            self.scores.clear();
            for (id, score) in scores.unwrap_or_default() {
                if self.scores.len() == MAX_REGIONS {
                    return Err(A::Error::custom(format_args!(
                        "HomeParams.RegionScore has more than {MAX_REGIONS} entries"
                    )));
                }
                let id = parse_region_key(&id)?;
                self.scores.insert(id, score);
            }
        } else {
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

fn parse_region_key<E: serde::de::Error>(key: &str) -> Result<u64, E> {
    let v: i128 = key
        .parse()
        .map_err(|_| E::custom(format_args!("region key {key:?} is not a decimal integer")))?;
    region_id(v, "region key")
}

/// The `Regions` object, bounded while it is read.
struct Regions(BTreeMap<u64, Region>);

impl<'de> serde::Deserialize<'de> for Regions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Regions;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of regions by ID")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Regions, A::Error> {
                let mut regions = BTreeMap::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let id = parse_region_key(&key)?;
                    let Some(GoObject(mut region)) =
                        map.next_value::<Option<GoObject<Region>>>()?
                    else {
                        regions.remove(&id);
                        continue;
                    };
                    match region.region_id {
                        0 => region.region_id = id,
                        rid if rid != id => {
                            return Err(A::Error::custom(format_args!(
                                "region key {id} holds RegionID {rid}"
                            )))
                        }
                        _ => {}
                    }
                    regions.insert(id, region);
                    if regions.len() > MAX_REGIONS {
                        return Err(A::Error::custom(format_args!(
                            "more than {MAX_REGIONS} regions"
                        )));
                    }
                }
                Ok(Regions(regions))
            }
        }
        d.deserialize_map(V)
    }
}

impl FieldSink for Region {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "regionid" => {
                let v: Option<i128> = map.next_value()?;
                self.region_id = match v {
                    None | Some(0) => 0,
                    Some(v) => region_id(v, "RegionID")?,
                };
            }
            "regioncode" => self.region_code = next_or_default(map)?,
            "regionname" => self.region_name = next_or_default(map)?,
            "nomeasurenohome" => self.no_measure_no_home = next_or_default(map)?,
            "nodes" => self.nodes = map.next_value::<Option<Nodes>>()?.unwrap_or_default().0,
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// A region's `Nodes` array, bounded while it is read.
#[derive(Default)]
struct Nodes(Vec<Node>);

impl<'de> serde::Deserialize<'de> for Nodes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Nodes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of nodes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Nodes, A::Error> {
                let mut nodes = Vec::new();
                while let Some(node) = seq.next_element::<Option<GoObject<Node>>>()? {
                    if nodes.len() == MAX_NODES {
                        return Err(A::Error::custom(format_args!(
                            "a region has more than {MAX_NODES} nodes"
                        )));
                    }
                    // Go keeps a null entry as a nil pointer, which every
                    // user skips; so do we.
                    if let Some(GoObject(node)) = node {
                        nodes.push(node);
                    }
                }
                Ok(Nodes(nodes))
            }
        }
        d.deserialize_seq(V)
    }
}

impl FieldSink for Node {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "name" => self.name = next_or_default(map)?,
            "regionid" => {
                let v: Option<i128> = map.next_value()?;
                self.region_id = match v {
                    None | Some(0) => 0,
                    Some(v) => region_id(v, "node RegionID")?,
                };
            }
            "hostname" => self.host_name = next_or_default(map)?,
            "certname" => self.cert_name = next_or_default(map)?,
            "ipv4" => self.ipv4 = AddrField::parse(&next_or_default::<_, String>(map)?),
            "ipv6" => self.ipv6 = AddrField::parse(&next_or_default::<_, String>(map)?),
            "derpport" => {
                let v: i128 = next_or_default(map)?;
                self.derp_port = u16::try_from(v).map_err(|_| {
                    A::Error::custom(format_args!("DERPPort {v} is outside 0..=65535"))
                })?;
            }
            "stunonly" => self.stun_only = next_or_default(map)?,
            "insecurefortests" => self.insecure_for_tests = next_or_default(map)?,
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
      "Regions": {
        "900": {
          "RegionID": 900, "RegionCode": "home", "RegionName": "Home DERP",
          "Latitude": 1.5,
          "Nodes": [
            {"Name": "900a", "RegionID": 900, "HostName": "derp.example.com",
             "IPv4": "203.0.113.10", "IPv6": "2001:db8::10",
             "STUNPort": 3478, "DERPPort": 8443, "CanPort80": true},
            {"Name": "900b", "HostName": "b.example.com", "IPv6": "none",
             "STUNOnly": true},
            null
          ]
        },
        "901": {"regioncode": "x", "NoMeasureNoHome": true,
                "Nodes": [{"name": "901a", "hostname": "127.0.0.1",
                           "insecurefortests": true, "CertName": "sha256-raw:00"}]}
      },
      "HomeParams": {"RegionScore": {"900": 0.5, "901": -1}},
      "omitDefaultRegions": true
    }"#;

    #[test]
    fn reads_the_fields_a_client_needs() {
        let m = DerpMap::from_json(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(m.regions.len(), 2);
        let r = &m.regions[&900];
        assert_eq!((r.region_id, &*r.region_code), (900, "home"));
        assert_eq!(r.nodes.len(), 2, "the null node is skipped");
        let a = &r.nodes[0];
        assert_eq!(a.name, "900a");
        assert_eq!(a.ipv4, AddrField::Literal(Ipv4Addr::new(203, 0, 113, 10)));
        assert_eq!(a.ipv6, AddrField::Literal("2001:db8::10".parse().unwrap()));
        assert_eq!(a.port(), 8443);
        let b = &r.nodes[1];
        assert_eq!((b.ipv4, b.ipv6), (AddrField::Resolve, AddrField::Disabled));
        assert_eq!(b.port(), 443);
        assert_eq!(r.derp_nodes().count(), 1);
        let x = &m.regions[&901];
        assert_eq!(x.region_id, 901, "taken from the key when absent");
        assert!(x.no_measure_no_home && x.nodes[0].insecure_for_tests);
        assert_eq!(x.nodes[0].cert_name, "sha256-raw:00");
        assert_eq!(m.region_score(900), 0.5);
        assert_eq!(m.region_score(901), 1.0, "a negative score is ignored");
        assert_eq!(m.region_score(5), 1.0);
    }

    #[test]
    fn round_trips() {
        let m = DerpMap::from_json(EXAMPLE.as_bytes()).unwrap();
        let again = DerpMap::from_json(m.to_json().as_bytes()).unwrap();
        assert_eq!(again, m);
    }

    #[test]
    fn refuses_bad_maps() {
        let bad = [
            r#"{"Regions": {"x": {}}}"#,
            r#"{"Regions": {"0": {}}}"#,
            r#"{"Regions": {"9007199254740992": {}}}"#,
            r#"{"Regions": {"1": {"RegionID": 2}}}"#,
            r#"{"Regions": {"1": {"Nodes": [{"DERPPort": 65536}]}}}"#,
            r#"{"Regions": {"1": {"Nodes": [{"DERPPort": -1}]}}}"#,
            r#"{"Regions": {"1": {"Nodes": [{"HostName": 5}]}}}"#,
            r#"{"Regions": []}"#,
            r#"[]"#,
            r#"{"Regions": {}} trailing"#,
        ];
        for text in bad {
            assert!(DerpMap::from_json(text.as_bytes()).is_err(), "{text}");
        }
        let nodes = vec!["{}"; MAX_NODES + 1].join(",");
        let many = format!(r#"{{"Regions": {{"1": {{"Nodes": [{nodes}]}}}}}}"#);
        assert!(DerpMap::from_json(many.as_bytes()).is_err());
        let regions: Vec<String> = (1..=MAX_REGIONS + 1)
            .map(|i| format!("\"{i}\":{{}}"))
            .collect();
        let many = format!(r#"{{"Regions": {{{}}}}}"#, regions.join(","));
        assert!(DerpMap::from_json(many.as_bytes()).is_err());
        let huge = vec![b' '; MAX_MAP_LEN + 1];
        assert!(matches!(
            DerpMap::from_json(&huge),
            Err(DerpMapError::TooLarge { .. })
        ));
    }

    #[test]
    fn go_leniency() {
        // null document, null fields, a later duplicate key wins.
        assert_eq!(DerpMap::from_json(b"null").unwrap(), DerpMap::default());
        let m = DerpMap::from_json(
            br#"{"Regions": {"1": {"Nodes": null}, "1": {"RegionCode": "b"}}, "regions": null}"#,
        )
        .unwrap();
        assert_eq!(m.regions[&1].region_code, "b");
    }
}
