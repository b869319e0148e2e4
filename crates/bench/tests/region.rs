//! `--peer-url` across a two-node region: two in-process Ferry relays
//! meshed both ways over TLS with a throw-away CA, senders on the first,
//! receivers on the second. Every packet must cross the mesh, and the
//! report must say so (forwarded counters on both nodes) along with the
//! second server. One test in its own binary: it sets `SSL_CERT_FILE`,
//! which the relays' mesh links read to verify each other.

use ferry_bench::report::{ModeResult, Report};
use ferry_testkit_servers::region::SessionRegion;
use ferry_testkit_servers::TestCa;
use std::process::Command;

fn report(args: &[&str]) -> Report {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry-bench"))
        .args(args)
        .output()
        .expect("run ferry-bench");
    assert!(
        out.status.success(),
        "ferry-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

#[test]
fn senders_and_receivers_on_two_nodes_of_a_region() {
    let ca = TestCa::new();
    // The relays verify each other against the system roots, which
    // SSL_CERT_FILE replaces; set before any thread of the test starts.
    SessionRegion::trust(&ca);
    let region = SessionRegion::start(&ca);
    let [a, b] = region.nodes;
    let (url_a, url_b) = (a.url.clone(), b.url.clone());
    let ca_file = ca.dir.path().join("ca.pem");
    let pid = std::process::id().to_string();
    let common = [
        "-q",
        "-s",
        &url_a,
        "--peer-url",
        &url_b,
        "--ca",
        ca_file.to_str().unwrap(),
        "--metrics",
        "--server-pid",
        &pid,
        "--peer-server-pid",
        &pid,
        "--warmup",
        "300ms",
        "-d",
        "700ms",
        "--drain",
        "1s",
    ];
    let mut args = vec!["throughput", "-n", "4", "--total-rate", "20M"];
    args.extend(common);
    let r = report(&args);
    let ModeResult::Throughput(t) = &r.result else {
        panic!("not a throughput result")
    };
    assert!(t.packets_delivered > 0, "{t:?}");
    assert_eq!(t.disconnects, 0, "{t:?}");
    let peer = r.peer.as_ref().expect("the report names the peer server");
    assert_eq!(peer.target.url, url_b);
    assert_eq!(r.target.url, url_a);
    assert!(peer.server.is_some() && r.server.is_some());
    // The packets went out on A's mesh link and came in on B's.
    let out = r.metrics_delta.get("derp_packets_forwarded_out").copied();
    let inb = peer.metrics_delta.get("derp_packets_forwarded_in").copied();
    assert!(out.unwrap_or(0.0) > 0.0, "A forwarded {out:?}");
    assert!(inb.unwrap_or(0.0) > 0.0, "B took in {inb:?}");

    // Latency: pings cross A→B, pongs B→A.
    let mut args = vec!["latency", "--ping-rate", "200"];
    args.extend(common);
    let r = report(&args);
    let ModeResult::Latency(l) = &r.result else {
        panic!("not a latency result")
    };
    assert!(l.pongs_received > 0 && l.rtt_us.is_ordered(), "{l:?}");
    let peer = r.peer.as_ref().expect("the report names the peer server");
    for (node, delta) in [("A", &r.metrics_delta), ("B", &peer.metrics_delta)] {
        for dir in ["out", "in"] {
            let k = format!("derp_packets_forwarded_{dir}");
            assert!(
                delta.get(&k).copied().unwrap_or(0.0) > 0.0,
                "node {node}: {k} {delta:?}"
            );
        }
    }

    a.stop();
    b.stop();
}
