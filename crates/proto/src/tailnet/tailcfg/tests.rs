use super::*;

const NODE_KEY: &str = "nodekey:0101010101010101010101010101010101010101010101010101010101010101";
const DISCO: &str = "discokey:0202020202020202020202020202020202020202020202020202020202020202";

fn full_map() -> String {
    format!(
        r#"{{"KeepAlive":false,"ControlTime":"2026-01-01T00:00:00Z",
        "Node":{{"ID":7,"StableID":"x","Name":"ferry.fe.example.","Key":"{NODE_KEY}",
          "DiscoKey":"{DISCO}","Addresses":["100.64.0.3/32","fd7a:115c:a1e0::3/128"],
          "HomeDERP":0,"DERP":"127.3.3.40:9","Tags":["tag:relay"],
          "CapMap":{{"tailscale.com/cap/x":null,"https://tailscale.com/cap/is-admin":[]}},
          "Hostinfo":{{"Hostname":"ferry","Services":[{{"Proto":"tcp"}}]}}}},
        "peers":[{{"id":1,"key":"{NODE_KEY}","HomeDERP":1,"Cap":142,"Online":true,
          "Addresses":["100.64.0.1/32"],"DiscoKey":"discokey:{zero}"}}],
        "DERPMap":{{"Regions":{{"1":{{"RegionID":1,"RegionCode":"x","Nodes":[
          {{"Name":"1a","RegionID":1,"HostName":"127.0.0.1","DERPPort":3340,"IPv4":"127.0.0.1"}}]}}}}}},
        "PacketFilter":[{{"SrcIPs":["*"],"DstPorts":[{{"IP":"*","Ports":{{"First":0,"Last":65535}}}}]}}],
        "PacketFilters":{{"base":[{{"SrcIPs":["100.64.0.1"],"CapGrant":[{{"Dsts":["100.64.0.3/32"],
          "CapMap":{{"tailscale.com/cap/relay":[{{}}]}}}}]}}],"old":null}},
        "Unknown":{{"deep":[1,2,3]}}}}"#,
        zero = "0".repeat(64)
    )
}

#[test]
fn full_map_response() {
    let m = MapResponse::from_json(full_map().as_bytes()).unwrap();
    let node = m.node.as_ref().unwrap();
    assert_eq!(node.id, 7);
    assert_eq!(node.key.to_string(), NODE_KEY);
    assert_eq!(node.disco_key.unwrap().to_string(), DISCO);
    assert_eq!(node.home_derp, 9, "legacy DERP field");
    assert_eq!(node.tags, ["tag:relay"]);
    assert_eq!(node.addresses[0].to_string(), "100.64.0.3/32");
    assert_eq!(node.addresses[1].bits, 128);
    assert_eq!(node.cap_map.len(), 2);
    let peers = m.peers.as_ref().unwrap();
    assert_eq!(peers.len(), 1);
    assert_eq!((peers[0].id, peers[0].home_derp, peers[0].cap), (1, 1, 142));
    assert_eq!(peers[0].online, Some(true));
    assert_eq!(peers[0].disco_key, None, "zero disco key means none");
    assert_eq!(m.derp_map.as_ref().unwrap().regions.len(), 1);
    assert_eq!(m.packet_filter.as_ref().unwrap()[0].src_ips, ["*"]);
    let f = m.packet_filters.as_ref().unwrap();
    assert_eq!(f["old"], None);
    let grant = &f["base"].as_ref().unwrap()[0].cap_grant[0];
    assert_eq!(grant.cap_map, ["tailscale.com/cap/relay"]);
    assert_eq!(grant.dsts[0].to_string(), "100.64.0.3/32");
}

#[test]
fn deltas_and_keepalives() {
    let m = MapResponse::from_json(br#"{"KeepAlive":true}"#).unwrap();
    assert!(m.keep_alive && m.node.is_none() && m.peers.is_none());
    let m = MapResponse::from_json(
        br#"{"PeersRemoved":[3,4],"PeersChangedPatch":[{"NodeID":5,"DERPRegion":2,"Online":false}],"Peers":null}"#,
    )
    .unwrap();
    assert_eq!(m.peers_removed, Some(vec![3, 4]));
    assert_eq!(m.peers, None);
    let p = &m.peers_changed_patch.unwrap()[0];
    assert_eq!(
        (p.node_id, p.derp_region, p.online),
        (5, Some(2), Some(false))
    );
    let m = MapResponse::from_json(br#"{"Peers":[]}"#).unwrap();
    assert_eq!(m.peers, Some(vec![]));
}

#[test]
fn bad_values_and_bounds() {
    for bad in [
        &br#"{"Node":{"Key":"mkey:00"}}"#[..],
        br#"{"Node":{"Addresses":["100.64.0.1"]}}"#,
        br#"{"Node":{"Addresses":["100.64.0.1/33"]}}"#,
        br#"{"Node":{"DiscoKey":"nodekey:00"}}"#,
        br#"{"Node":{"ID":"seven"}}"#,
        br#"{"PeersRemoved":{}}"#,
        br#"{"DERPMap":{"Regions":{"1":{"RegionID":2}}}}"#,
        br#"[]"#,
    ] {
        assert!(
            MapResponse::from_json(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let many = format!(
        "{{\"Node\":{{\"Tags\":[{}]}}}}",
        vec!["\"t\""; MAX_NODE_ADDRS + 1].join(",")
    );
    assert!(MapResponse::from_json(many.as_bytes()).is_err());
    let ok = format!(
        "{{\"Node\":{{\"Tags\":[{}]}}}}",
        vec!["\"t\""; MAX_NODE_ADDRS].join(",")
    );
    assert!(MapResponse::from_json(ok.as_bytes()).is_ok());
}

#[test]
fn register_messages() {
    let req = RegisterRequest {
        version: 130,
        node_key: NODE_KEY.parse().unwrap(),
        auth: Some(RegisterAuth {
            auth_key: "hskey-auth-x".into(),
        }),
        hostinfo: Hostinfo {
            hostname: "ferry".into(),
            os: "linux".into(),
            ipn_version: "ferry-0.1".into(),
            net_info: None,
        },
    };
    let v: serde_json::Value = serde_json::from_slice(&req.to_json()).unwrap();
    assert_eq!(v["Version"], 130);
    assert_eq!(v["NodeKey"], NODE_KEY);
    assert_eq!(v["Auth"]["AuthKey"], "hskey-auth-x");
    assert_eq!(v["Hostinfo"]["OS"], "linux");
    assert!(v["Hostinfo"].get("NetInfo").is_none());
    let r = RegisterResponse::from_json(
        br#"{"User":{"ID":1},"Login":{},"MachineAuthorized":true,"nodekeyexpired":false,"AuthURL":""}"#,
    )
    .unwrap();
    assert!(r.machine_authorized && !r.node_key_expired);
    assert!(RegisterResponse::from_json(br#"{"Error":5}"#).is_err());
}

#[test]
fn map_request_fields() {
    let req = MapRequest {
        version: 130,
        keep_alive: true,
        node_key: NODE_KEY.parse().unwrap(),
        disco_key: DISCO.parse().unwrap(),
        stream: true,
        omit_peers: false,
        hostinfo: Hostinfo {
            net_info: Some(NetInfo { preferred_derp: 9 }),
            ..Hostinfo::default()
        },
        endpoints: vec![],
    };
    let v: serde_json::Value = serde_json::from_slice(&req.to_json()).unwrap();
    assert_eq!(v["DiscoKey"], DISCO);
    assert_eq!(v["Stream"], true);
    assert!(v.get("OmitPeers").is_none());
    assert!(v.get("Compress").is_none(), "never ask for zstd");
    assert_eq!(v["Hostinfo"]["NetInfo"]["PreferredDERP"], 9);
    assert_eq!(v["Endpoints"], serde_json::json!([]));
}
