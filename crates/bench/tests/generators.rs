//! The crate's other load generators, briefly, on loopback: `udp_gen`
//! into its own sink, and `endpoint_bench` over DERP through an in-process
//! Ferry relay. Sane results only, never a speed. (`session_pps` needs a
//! relay-session port; `scripts/test.d/30-udp.sh` runs it in namespaces.)
//! Also: the generators link no test support.

mod support;

use std::net::UdpSocket;
use std::process::{Command, Stdio};

use ferry_proto::key::NodePrivate;

/// A loopback UDP port nobody holds (bound, then released).
fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The last line of `text` as JSON.
fn last_json(text: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(text);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn udp_gen_sends_to_its_sink() {
    let port = free_udp_port();
    let to = format!("127.0.0.1:{port}");
    // The sink stops a second after the last datagram, or after 10 s.
    let sink = Command::new(env!("CARGO_BIN_EXE_udp_gen"))
        .args(["sink", "--listen", &to, "--ports", "1", "--seconds", "10"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start udp_gen sink");
    // Until the sink holds its port: binding it ourselves then fails.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while UdpSocket::bind(&to).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sink never bound {to}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let send = Command::new(env!("CARGO_BIN_EXE_udp_gen"))
        .args(["send", "--to", &to, "--flows", "2", "--size", "200"])
        .args(["--seconds", "0.3", "--pps", "2000"])
        .output()
        .expect("run udp_gen send");
    assert!(send.status.success(), "{send:?}");
    let sent = last_json(&send.stdout);
    let sink = sink.wait_with_output().expect("the sink ends");
    assert!(sink.status.success(), "{sink:?}");
    let got = last_json(&sink.stdout);
    let packets = got["packets"].as_u64().expect("packets");
    assert!(packets > 0, "sink: {got}, sender: {sent}");
    assert!(got["pps"].as_f64().expect("pps") > 0.0, "{got}");
}

#[test]
fn endpoint_bench_measures_the_derp_path() {
    let relay = support::relay(
        ferry_derp::DerpConfig::new(NodePrivate::generate()),
        "127.0.0.1:0",
    );
    let url = format!("http://{}/derp", relay.listen_addrs[0]);
    let out = Command::new(env!("CARGO_BIN_EXE_endpoint_bench"))
        .args(["--url", &url, "--path", "derp", "--seconds", "0.3"])
        .args(["--rtt", "20", "--json"])
        .output()
        .expect("run endpoint_bench");
    assert!(out.status.success(), "{out:?}");
    let r = last_json(&out.stdout);
    assert_eq!(r["path"], "derp", "{r}");
    let (offered, delivered) = (r["offered"].as_u64(), r["delivered"].as_u64());
    assert!(
        matches!((offered, delivered), (Some(o), Some(d)) if d > 0 && d <= o),
        "{r}"
    );
    let (p50, p99) = (r["rtt_p50_us"].as_f64(), r["rtt_p99_us"].as_f64());
    assert!(
        matches!((p50, p99), (Some(a), Some(b)) if a > 0.0 && a <= b),
        "{r}"
    );
    relay.shutdown();
    relay.wait().expect("relay stops cleanly");
}

/// The generators are shipped binaries: the test kit (support for tests,
/// not published) is a dev-dependency of this crate and nothing more.
#[test]
fn testkit_is_for_the_tests_only() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("read Cargo.toml");
    let mut section = "";
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
        } else if line.starts_with("ferry-testkit") {
            assert_eq!(
                section, "[dev-dependencies]",
                "ferry-testkit in {section} of crates/bench/Cargo.toml"
            );
        }
    }
}
