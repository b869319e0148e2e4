//! `--peer-url` across a two-node region: two in-process Ferry relays
//! meshed both ways over TLS with a throw-away CA, senders on the first,
//! receivers on the second. Every packet must cross the mesh, and the
//! report must say so (forwarded counters on both nodes) along with the
//! second server. One test in its own binary: it sets `SSL_CERT_FILE`,
//! which the relays' mesh links read to verify each other.

mod support;

use ferry_bench::report::{ModeResult, Report};
use ferry_bench::varz::parse_prometheus;
use ferry_derp::certs::{self, CertMode};
use ferry_derp::config::MeshPeer;
use ferry_proto::key::{MeshKey, NodePrivate};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::Scratch;

/// Writes `ca.pem` and, for both nodes, `localhost.crt`/`.key` signed by
/// it into `dir`.
fn write_ca_and_leaf(dir: &Path) -> PathBuf {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ferry-bench test CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.join("localhost.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("localhost.key"), key.serialize_pem()).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    ca_file
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TLS node on `port` meshed with every node in `region`.
fn node(port: u16, region: &str, mesh_key: &MeshKey, certdir: &Path) -> ferry_derp::Server {
    let mut config = ferry_derp::DerpConfig::new(NodePrivate::generate());
    let setup = certs::server_config(
        &CertMode::Manual {
            certdir: certdir.to_owned(),
            hostname: "localhost".to_owned(),
        },
        *config.public_key.as_bytes(),
    )
    .expect("TLS configuration");
    config.tls = Some(setup.config);
    config.mesh_key = Some(mesh_key.clone());
    config.mesh_with = MeshPeer::parse_list(region).unwrap();
    support::relay(config, &format!("127.0.0.1:{port}"))
}

/// Waits (at most 20 s) until every node has its link to the other up.
fn wait_for_mesh(nodes: &[&ferry_derp::Server]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..400 {
        let up = nodes.iter().all(|n| {
            parse_prometheus(&n.metrics().render())
                .get("ferry_mesh_links_up")
                .copied()
                == Some(1.0)
        });
        if up {
            return;
        }
        assert!(Instant::now() < deadline, "the mesh links did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the mesh links did not come up");
}

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
    let dir = Scratch::new("region");
    let ca = write_ca_and_leaf(&dir.0);
    // The relays verify each other against the system roots, which this
    // variable replaces; set before any thread of the test starts.
    std::env::set_var("SSL_CERT_FILE", &ca);
    let (pa, pb) = (free_port(), free_port());
    let region = format!("localhost:{pa}/127.0.0.1,localhost:{pb}/127.0.0.1");
    let mesh_key = MeshKey::parse(&"5e".repeat(32)).unwrap();
    let a = node(pa, &region, &mesh_key, &dir.0);
    let b = node(pb, &region, &mesh_key, &dir.0);
    wait_for_mesh(&[&a, &b]);

    let (url_a, url_b) = (
        format!("https://localhost:{pa}"),
        format!("https://localhost:{pb}"),
    );
    let pid = std::process::id().to_string();
    let common = [
        "-q",
        "-s",
        &url_a,
        "--peer-url",
        &url_b,
        "--ca",
        ca.to_str().unwrap(),
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
    assert_eq!(peer.target.url, format!("https://localhost:{pb}/derp"));
    assert_eq!(r.target.url, format!("https://localhost:{pa}/derp"));
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

    a.shutdown();
    b.shutdown();
    a.wait().expect("node A stops cleanly");
    b.wait().expect("node B stops cleanly");
}
