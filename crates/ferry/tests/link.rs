//! `ferry link` through the built binary: two links on loopback, plain UDP
//! sockets standing in for each side's WireGuard, carried over an
//! in-process Ferry relay and over Tailscale's `derper` (TLS with a test
//! CA given as `ca_file`, and plain HTTP). Checks the datagrams arrive
//! from the socket that stands for the sender, every datagram is carried
//! or counted as dropped, strangers are dropped, a relay restart is
//! survived, and `ferry link pubkey` / `status`. Over a 1,500-byte MTU (a
//! namespace the test makes), datagrams of every size both ways arrive
//! whole through the links' GSO sends.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ferry_proto::key::NodePrivate;
use ferry_testkit_servers as derp;
use support::{ferry, free_tcp_port, run, Ferry, TempDir, T};

/// A loopback UDP address that was free a moment ago.
fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A socket standing in for one side's WireGuard.
fn wireguard() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s
}

/// One side: its key, its WireGuard stand-in, its metrics address, and the
/// address standing for the other side.
struct Side {
    key: NodePrivate,
    wg: UdpSocket,
    metrics: SocketAddr,
    peer_endpoint: SocketAddr,
}

impl Side {
    fn new() -> Side {
        Side {
            key: NodePrivate::generate(),
            wg: wireguard(),
            metrics: SocketAddr::from(([127, 0, 0, 1], free_tcp_port())),
            peer_endpoint: free_udp(),
        }
    }

    /// Writes the key file and the configuration; returns the config path.
    fn write_config(
        &self,
        dir: &TempDir,
        me: &str,
        peer: &str,
        peer_key: &NodePrivate,
        relay: &str,
        peer_extra: &str,
    ) -> String {
        let key_file = dir.path(&format!("{me}.key"));
        std::fs::write(&key_file, self.key.to_key_file_json()).unwrap();
        let text = format!(
            "key_file = \"{key_file}\"\nwireguard = \"{}\"\nmetrics_addr = \"{}\"\n\n{relay}\n[[peer]]\nname = \"{peer}\"\nlink_key = \"{}\"\nendpoint = \"{}\"\n{peer_extra}",
            self.wg.local_addr().unwrap(),
            self.metrics,
            peer_key.public(),
            self.peer_endpoint,
        );
        let path = dir.path(&format!("{me}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Waits until `sample` is there and at least `want`; panics naming
    /// `what` after [`T`].
    fn wait_metric(&self, sample: &str, want: u64, what: &str) {
        ferry_testkit::metrics::wait_metric(self.metrics, "/metrics", sample, T, what, |v| {
            v >= want as f64
        });
    }

    /// One metric sample's value; a missing sample fails the test.
    fn metric(&self, sample: &str) -> u64 {
        ferry_testkit::metrics::Scrape::fetch(self.metrics, "/metrics").value(sample) as u64
    }
}

fn link(config: &str) -> Ferry {
    let mut c = ferry();
    c.args(["link", "--config", config]);
    Ferry::spawn(&mut c)
}

/// Sends `payload` from `from` to `to` until `at` receives it (datagrams
/// are dropped, and counted, until both links are connected); returns the
/// address it came from. Bounded by [`T`].
fn carried(from: &UdpSocket, to: SocketAddr, at: &UdpSocket, payload: &[u8]) -> SocketAddr {
    let deadline = Instant::now() + T;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        from.send_to(payload, to).unwrap();
        while let Ok((n, src)) = at.recv_from(&mut buf) {
            if &buf[..n] == payload {
                return src;
            }
        }
    }
    panic!(
        "{} bytes sent to {to} never arrived within {T:?}",
        payload.len()
    );
}

/// Two sides with each other as their peer, configured for `relay` in
/// `dir`, DERP only (on loopback the direct path would always win);
/// returns them and their configuration files.
fn pair(dir: &TempDir, relay: &str) -> (Side, Side, String, String) {
    pair_with(dir, relay, "only = \"derp\"\n")
}

/// [`pair`] with `peer_extra` in each side's `[[peer]]` table.
fn pair_with(dir: &TempDir, relay: &str, peer_extra: &str) -> (Side, Side, String, String) {
    let (a, b) = (Side::new(), Side::new());
    let a_cfg = a.write_config(dir, "a", "b", &b.key, relay, peer_extra);
    let b_cfg = b.write_config(dir, "b", "a", &a.key, relay, peer_extra);
    (a, b, a_cfg, b_cfg)
}

fn relay_block(url: &str, ca_file: Option<&str>) -> String {
    let ca = ca_file.map_or(String::new(), |f| format!("ca_file = \"{f}\"\n"));
    format!("[[relay]]\nname = \"r\"\nurl = \"{url}\"\n{ca}")
}

/// The whole plumbing over one server.
fn two_links(mut server: derp::TestServer, ca_file: Option<&str>) {
    let what = format!("{:?} at {}", server.kind, server.url());
    let dir = TempDir::new("link");
    let (a, b, a_cfg, b_cfg) = pair(&dir, &relay_block(&server.url(), ca_file));
    let mut la = link(&a_cfg);
    let mut lb = link(&b_cfg);
    la.wait_log("relay connected");
    lb.wait_log("relay connected");
    // The peer's settings in the log read as in the file, not as Rust's
    // debug text (`Some(Derp)`, `None`).
    let intro = "peer: its WireGuard endpoint here is";
    let log = la.wait_log(intro);
    let line = log.lines().find(|l| l.contains(intro)).unwrap();
    assert!(
        line.contains("prefer=none only=derp") && !line.contains("Some("),
        "{what}: {line}"
    );

    // Both ways; each side hears the other from the address standing for it.
    let src = carried(&a.wg, a.peer_endpoint, &b.wg, b"a to b");
    assert_eq!(
        src, b.peer_endpoint,
        "{what}: B's WireGuard hears A from A's endpoint at B"
    );
    let src = carried(&b.wg, b.peer_endpoint, &a.wg, b"b to a");
    assert_eq!(
        src, a.peer_endpoint,
        "{what}: A's WireGuard hears B from B's endpoint at A"
    );
    lb.wait_log("peer reachable");

    // A burst: every datagram is carried or counted as dropped. (50 fit
    // in the kernel's default socket buffer, so none is lost before the
    // link reads it.)
    let sent_before = a
        .metric("ferry_link_peer_packets_total{peer=\"b\",direction=\"to_peer\",path=\"derp\"}")
        + a.metric("ferry_link_peer_drops_total{peer=\"b\",reason=\"relay_down\"}")
        + a.metric("ferry_link_peer_drops_total{peer=\"b\",reason=\"queue_full\"}");
    let burst = 50u64;
    let payload = vec![0x5a; 1400];
    for _ in 0..burst {
        a.wg.send_to(&payload, a.peer_endpoint).unwrap();
    }
    let mut got = 0u64;
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(5);
    while got < burst && Instant::now() < deadline {
        if let Ok((1400, _)) = b.wg.recv_from(&mut buf) {
            got += 1;
        }
    }
    let accounted = || {
        a.metric("ferry_link_peer_packets_total{peer=\"b\",direction=\"to_peer\",path=\"derp\"}")
            + a.metric("ferry_link_peer_drops_total{peer=\"b\",reason=\"relay_down\"}")
            + a.metric("ferry_link_peer_drops_total{peer=\"b\",reason=\"queue_full\"}")
            - sent_before
    };
    let deadline = Instant::now() + T;
    while accounted() < burst && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        accounted(),
        burst,
        "{what}: every datagram of the burst carried or counted"
    );
    assert!(got > 0, "{what}: none of the burst arrived");
    let b_from =
        b.metric("ferry_link_peer_packets_total{peer=\"a\",direction=\"from_peer\",path=\"derp\"}");
    assert!(
        b_from > got,
        "{what}: B counted {b_from} from A, its WireGuard got {got} + 1"
    );

    // A datagram to the endpoint from anywhere but the local WireGuard.
    let stranger = wireguard();
    stranger.send_to(b"not wireguard", a.peer_endpoint).unwrap();
    a.wait_metric(
        "ferry_link_peer_drops_total{peer=\"b\",reason=\"not_wireguard\"}",
        1,
        &format!("{what}: the stranger's datagram"),
    );

    // A DERP client whose key is not a peer of A's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut options = ferry_client::Options::default();
        if let Some(ca_file) = ca_file {
            let pem = std::fs::read(ca_file).unwrap();
            let mut store = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                store.add(c.unwrap()).unwrap();
            }
            options.tls_roots = ferry_client::TlsRoots::Custom(std::sync::Arc::new(store));
        }
        let c = ferry_client::DerpClient::connect(&server.url(), NodePrivate::generate(), options)
            .await
            .unwrap();
        let deadline = Instant::now() + T;
        while a.metric("ferry_link_rejected_total") < 1 {
            assert!(
                Instant::now() < deadline,
                "{what}: the stranger's packet was not counted"
            );
            c.send(&a.key.public(), b"who am I".to_vec()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c.close().await;
    });
    la.wait_log("dropped datagrams that were not from a configured peer");

    // `ferry link status` reads the running link.
    let (status, out) = run(ferry()
        .args(["link", "status", "--config", &a_cfg])
        .stderr(std::process::Stdio::piped()));
    assert!(status.success(), "{what}: status failed: {out}");
    let text = link_stdout("status", &a_cfg);
    assert!(text.contains("relay r ("), "{what}: {text}");
    let url = server.url();
    assert!(
        text.contains(&format!("relay r ({url}): connected to {url};")),
        "{what}: {text}"
    );
    assert!(text.contains("peer b (endpoint"), "{what}: {text}");
    assert!(text.contains("path DERP via r"), "{what}: {text}");
    assert!(text.contains("not_wireguard 1"), "{what}: {text}");
    // The same as JSON, for scripts.
    let json: serde_json::Value =
        serde_json::from_str(&link_stdout("status --json", &a_cfg)).unwrap();
    assert_eq!(json["relays"][0]["name"], "r", "{what}: {json}");
    assert_eq!(json["relays"][0]["connected"], true, "{what}: {json}");
    assert_eq!(json["relays"][0]["node"], url.as_str(), "{what}: {json}");
    let peer = &json["peers"][0];
    assert_eq!(peer["name"], "b", "{what}: {json}");
    assert_eq!(peer["path"], "derp", "{what}: {json}");
    assert_eq!(peer["relay"], "r", "{what}: {json}");
    assert_eq!(peer["drops"]["not_wireguard"], 1, "{what}: {json}");
    let derp = &peer["paths"]["derp"];
    assert!(
        derp["to_peer"]["packets"].as_u64().unwrap() >= 1,
        "{what}: {json}"
    );
    assert!(
        derp["from_peer"]["bytes"].as_u64().unwrap() >= 1,
        "{what}: {json}"
    );
    assert_eq!(peer["only"], "derp", "{what}: {json}");
    assert!(json["rejected"].as_u64().unwrap() >= 1, "{what}: {json}");

    // The relay goes away: datagrams are dropped as relay_down, and after
    // it comes back (the SDK reconnects) they are carried again.
    server.stop();
    la.wait_log("relay connection lost");
    let down_before = a.metric("ferry_link_peer_drops_total{peer=\"b\",reason=\"relay_down\"}");
    for _ in 0..10 {
        a.wg.send_to(b"while down", a.peer_endpoint).unwrap();
    }
    a.wait_metric(
        "ferry_link_peer_drops_total{peer=\"b\",reason=\"relay_down\"}",
        down_before + 10,
        &format!("{what}: datagrams while the relay is down"),
    );
    server.restart();
    la.wait_log_n("relay connected", 2);
    lb.wait_log_n("relay connected", 2);
    carried(&a.wg, a.peer_endpoint, &b.wg, b"after the restart");
    carried(&b.wg, b.peer_endpoint, &a.wg, b"and back");

    let log = la.stop();
    assert!(log.contains("stopped"), "{what}: {log}");
    lb.stop();
}

/// Standard output of `ferry link ACTION... --config CONFIG`, which must
/// succeed.
fn link_stdout(action: &str, config: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("link")
        .args(action.split(' '))
        .args(["--config", config])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn over_ferry_and_derper_plain() {
    for kind in derp::kinds() {
        two_links(derp::TestServer::start(kind, None), None);
    }
}

#[test]
fn over_ferry_and_derper_tls_with_a_ca_file() {
    let ca = derp::TestCa::new();
    let dir = TempDir::new("link-ca");
    let ca_file = dir.path("ca.pem");
    std::fs::write(&ca_file, pem(&ca.root)).unwrap();
    for kind in derp::kinds() {
        two_links(
            derp::TestServer::start(kind, Some(ca.clone())),
            Some(&ca_file),
        );
    }
}

fn pem(der: &[u8]) -> String {
    use std::fmt::Write as _;
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(char::from(B64[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        let _ = writeln!(out, "{}", std::str::from_utf8(line).unwrap());
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// `ferry link --config CONFIG` fails, saying `why`.
fn refused(config: &str, why: &str) {
    let (status, log) = run(ferry().args(["link", "--config", config]));
    assert!(!status.success(), "{log}");
    assert!(log.contains(why), "{log}");
}

#[test]
fn pubkey_creates_the_key_once() {
    let dir = TempDir::new("link-pubkey");
    let key_file = dir.path("link.key");
    let cfg = dir.path("link.toml");
    // Only key_file: a new side prints its key before it knows its peers.
    std::fs::write(&cfg, format!("key_file = \"{key_file}\"\n")).unwrap();
    let print = || link_stdout("pubkey", &cfg).trim().to_owned();
    let first = print();
    assert!(
        first.starts_with("nodekey:") && first.len() == 8 + 64,
        "{first}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key file is private");
    assert_eq!(print(), first, "the same key on the second run");
    // Running with that file alone is refused, naming what is missing.
    refused(&cfg, "link.toml: relay: at least one [[relay]]");
}

#[test]
fn an_unreachable_relay_is_retried_and_a_bad_file_names_the_key() {
    let dir = TempDir::new("link-unreachable");
    let (a, b) = (Side::new(), Side::new());
    let url = format!("http://127.0.0.1:{}/derp", free_tcp_port());
    let cfg = a.write_config(&dir, "a", "b", &b.key, &relay_block(&url, None), "");
    let mut la = link(&cfg);
    la.wait_log_n("relay unreachable; retrying", 2);
    a.wg.send_to(b"nowhere", a.peer_endpoint).unwrap();
    a.wait_metric(
        "ferry_link_peer_drops_total{peer=\"b\",reason=\"relay_down\"}",
        1,
        "a datagram with no relay",
    );
    assert_eq!(a.metric("ferry_link_relay_connected{relay=\"r\"}"), 0);
    la.stop();

    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("endpoint = \"", "endpoint = \"nowhere");
    std::fs::write(&cfg, text).unwrap();
    refused(&cfg, "a.toml:12: peer[0].endpoint: \"nowhere127.0.0.1:");
}

#[test]
fn a_peer_leaving_and_coming_back_is_carried_again() {
    let server = derp::TestServer::start(derp::Kind::Ferry, None);
    let dir = TempDir::new("link-away");
    let (a, b, a_cfg, b_cfg) = pair(&dir, &relay_block(&server.url(), None));
    let mut la = link(&a_cfg);
    let lb = link(&b_cfg);
    la.wait_log("relay connected");
    carried(&a.wg, a.peer_endpoint, &b.wg, b"hello b");
    carried(&b.wg, b.peer_endpoint, &a.wg, b"hello a");
    la.wait_log("peer reachable");
    // B's link goes away and comes back with the same key.
    lb.stop();
    let lb = link(&b_cfg);
    carried(&b.wg, b.peer_endpoint, &a.wg, b"back again");
    carried(&a.wg, a.peer_endpoint, &b.wg, b"welcome back");
    let log = la.stop();
    assert_eq!(log.matches("peer reachable").count(), 1, "{log}");
    lb.stop();
}

/// Without `only`, two links on one machine find the direct path: the
/// switch is logged with its reason, the status and metrics show it, and
/// datagrams still arrive from the address standing for the sender.
#[test]
fn two_links_go_direct_and_say_so() {
    let server = derp::TestServer::start(derp::Kind::Ferry, None);
    let dir = TempDir::new("link-direct");
    let (a, b, a_cfg, b_cfg) = pair_with(&dir, &relay_block(&server.url(), None), "");
    let mut la = link(&a_cfg);
    let mut lb = link(&b_cfg);
    la.wait_log("relay connected");
    lb.wait_log("relay connected");
    la.wait_log("path switch: derp -> direct (a better path answered)");
    let reason = la.field("path switch: derp -> direct", "reason");
    assert_eq!(reason.trim_matches('"'), "better");
    lb.wait_log("path switch: derp -> direct");
    let src = carried(&a.wg, a.peer_endpoint, &b.wg, b"direct a to b");
    assert_eq!(src, b.peer_endpoint);
    let src = carried(&b.wg, b.peer_endpoint, &a.wg, b"direct b to a");
    assert_eq!(src, a.peer_endpoint);
    a.wait_metric(
        "ferry_link_peer_packets_total{peer=\"b\",direction=\"to_peer\",path=\"direct\"}",
        1,
        "datagrams on the direct path",
    );
    let json: serde_json::Value =
        serde_json::from_str(&link_stdout("status --json", &a_cfg)).unwrap();
    let peer = &json["peers"][0];
    assert_eq!(peer["path"], "direct", "{json}");
    assert_eq!(peer["paths"]["direct"]["working"], true, "{json}");
    assert!(
        peer["paths"]["direct"]["rtt_ms"].as_f64().is_some(),
        "{json}"
    );
    assert_eq!(peer["last_switch"]["from"], "derp", "{json}");
    assert_eq!(peer["last_switch"]["to"], "direct", "{json}");
    assert_eq!(peer["last_switch"]["reason"], "better", "{json}");
    assert!(peer["switches"]["better"].as_u64().unwrap() >= 1, "{json}");
    let text = link_stdout("status", &a_cfg);
    assert!(text.contains("path direct via r"), "{text}");
    assert!(text.contains("  direct: working, RTT "), "{text}");
    assert!(
        text.contains("  last switch: derp -> direct (better)"),
        "{text}"
    );
    la.stop();
    lb.stop();
}

/// A relay that is down when the links start: each failed attempt is one
/// log line naming the relay, the error and the next try, spaced by the
/// backoff; once the relay starts, the links connect by themselves and
/// carry datagrams, with no restart.
#[test]
fn a_relay_down_at_start_is_retried_then_used() {
    let mut server = derp::TestServer::start(derp::Kind::Ferry, None);
    server.stop();
    let dir = TempDir::new("link-late");
    let (a, b, a_cfg, b_cfg) = pair(&dir, &relay_block(&server.url(), None));
    let mut la = link(&a_cfg);
    let mut lb = link(&b_cfg);
    let log = la.wait_log_n("relay unreachable; retrying in", 2);
    let line = log
        .lines()
        .find(|l| l.contains("relay unreachable; retrying in"))
        .unwrap();
    assert_eq!(
        support::field_in(line, "relay").as_deref(),
        Some("r"),
        "{line}"
    );
    assert!(support::field_in(line, "error").is_some(), "{line}");
    assert!(support::field_in(line, "retry_in").is_some(), "{line}");
    assert_eq!(a.metric("ferry_link_relay_connected{relay=\"r\"}"), 0);
    assert!(a.metric("ferry_link_relay_disconnects_total{relay=\"r\"}") >= 2);
    server.restart();
    la.wait_log("relay connected");
    lb.wait_log("relay connected");
    a.wait_metric("ferry_link_relay_connected{relay=\"r\"}", 1, "the relay up");
    carried(&a.wg, a.peer_endpoint, &b.wg, b"late a to b");
    carried(&b.wg, b.peer_endpoint, &a.wg, b"late b to a");
    assert_eq!(a.metric("ferry_link_relay_connects_total{relay=\"r\"}"), 1);
    la.stop();
    lb.stop();
}

/// A peer whose link key nobody uses (a wrong key, or a peer never
/// started) never answers: after 10 s that is logged once with the
/// peer's name; datagrams for it are sent (and counted) while the link
/// keeps running and serving its status.
#[test]
fn a_peer_that_never_answers_is_logged_and_nothing_crashes() {
    let server = derp::TestServer::start(derp::Kind::Ferry, None);
    let dir = TempDir::new("link-nobody");
    let (a, nobody) = (Side::new(), Side::new());
    let cfg = a.write_config(
        &dir,
        "a",
        "b",
        &nobody.key,
        &relay_block(&server.url(), None),
        "",
    );
    let mut la = link(&cfg);
    la.wait_log("relay connected");
    for i in 0..5u8 {
        a.wg.send_to(&[i; 32], a.peer_endpoint).unwrap();
    }
    let line = la.field("peer not answering after 10 s", "peer");
    assert_eq!(line.trim_matches('"'), "b");
    a.wait_metric(
        "ferry_link_peer_packets_total{peer=\"b\",direction=\"to_peer\",path=\"derp\"}",
        5,
        "datagrams sent towards the absent peer",
    );
    let json: serde_json::Value =
        serde_json::from_str(&link_stdout("status --json", &cfg)).unwrap();
    assert_eq!(json["peers"][0]["path"], "derp", "{json}");
    assert_eq!(json["relays"][0]["connected"], true, "{json}");
    let log = la.stop();
    assert_eq!(
        log.matches("peer not answering").count(),
        1,
        "logged once while it stays away:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// Two running links, one with the other's link key wrong: neither is
/// answered, and each says so once after 10 s; the one with the wrong key
/// also says, once and naming it, which key its messages come from (no
/// line every second). Neither crashes.
#[test]
fn a_wrong_link_key_on_one_side_is_logged_on_both() {
    let server = derp::TestServer::start(derp::Kind::Ferry, None);
    let dir = TempDir::new("link-wrongkey");
    let relay = relay_block(&server.url(), None);
    let (a, b) = (Side::new(), Side::new());
    let wrong = NodePrivate::generate();
    let a_cfg = a.write_config(&dir, "a", "b", &b.key, &relay, "");
    // B has a key for "a" that is not A's.
    let b_cfg = b.write_config(&dir, "b", "a", &wrong, &relay, "");
    let mut la = link(&a_cfg);
    let mut lb = link(&b_cfg);
    assert_eq!(la.field("peer not answering after 10 s", "peer"), "b");
    assert_eq!(lb.field("peer not answering after 10 s", "peer"), "a");
    let unknown = lb.field("from a link key that is no configured peer", "link_key");
    assert_eq!(unknown.trim_matches('"'), a.key.public().to_string());
    a.wg.send_to(b"lost", a.peer_endpoint).unwrap();
    assert!(b.wg.recv_from(&mut [0u8; 16]).is_err(), "nothing crosses");
    let (la, lb) = (la.stop(), lb.stop());
    assert_eq!(la.matches("peer not answering").count(), 1, "{la}");
    assert_eq!(lb.matches("peer not answering").count(), 1, "{lb}");
    assert_eq!(
        lb.matches("not a configured peer").count() + lb.matches("no configured peer").count(),
        1,
        "said once, then counted:\n{lb}"
    );
}

/// Sends `count` datagrams of `size` bytes and one of `last` bytes from
/// `from` to `to` as one UDP GSO train, as wireguard-go sends a TCP window;
/// returns them. The caller checked that the kernel has GSO.
fn send_train(
    from: &UdpSocket,
    to: SocketAddr,
    count: usize,
    size: usize,
    last: usize,
) -> Vec<Vec<u8>> {
    use ferry_sys::mmsg::{OutMsg, SendBatch, Span};
    use std::os::fd::AsFd;
    let datagrams: Vec<Vec<u8>> = (0..=count)
        .map(|i| {
            let len = if i == count { last } else { size };
            (0..len).map(|j| (i * 7 + j) as u8).collect()
        })
        .collect();
    let bytes = datagrams.concat();
    let mut spans = Vec::new();
    let mut at = 0;
    for d in &datagrams {
        spans.push(Span {
            start: at,
            len: d.len(),
        });
        at += d.len();
    }
    let msgs = [OutMsg {
        dst: Some(to),
        first: 0,
        count: spans.len(),
        segment: size as u16,
    }];
    let sent = SendBatch::new()
        .send(from.as_fd(), &bytes, &spans, &msgs)
        .unwrap();
    assert_eq!(sent, 1, "the train went out as one GSO message");
    datagrams
}

/// WireGuard hands over a burst as one GSO train (wireguard-go does, on
/// Linux): the link reads it whole (GRO on its socket), carries each
/// datagram, and the other side's WireGuard receives them one by one, cut
/// at the segment size, in order, from the endpoint standing for the
/// sender; both ways, on the direct path and over DERP. Where the kernel
/// has no UDP GSO there is no train to send: a skip, which fails under CI.
#[test]
fn a_gso_train_from_wireguard_arrives_as_its_datagrams() {
    use std::os::fd::AsFd;
    let offloads = ferry_sys::gso::probe(wireguard().as_fd());
    if !(offloads.gso && offloads.gro) {
        return ferry_testkit::skip!("this kernel lacks UDP GSO or GRO ({offloads:?})");
    }
    let server = derp::TestServer::start(derp::Kind::Ferry, None);
    for (extra, path) in [("", "direct"), ("only = \"derp\"\n", "derp")] {
        let dir = TempDir::new("link-train");
        let (a, b, a_cfg, b_cfg) = pair_with(&dir, &relay_block(&server.url(), None), extra);
        let mut la = link(&a_cfg);
        let mut lb = link(&b_cfg);
        if path == "direct" {
            la.wait_log("path switch: derp -> direct");
            lb.wait_log("path switch: derp -> direct");
        }
        carried(&a.wg, a.peer_endpoint, &b.wg, b"first a to b");
        carried(&b.wg, b.peer_endpoint, &a.wg, b"first b to a");
        let sample = format!(
            "ferry_link_peer_packets_total{{peer=\"b\",direction=\"to_peer\",path=\"{path}\"}}"
        );
        let mut before = None;
        for (round, (from, to, at, src)) in [
            (&a.wg, a.peer_endpoint, &b.wg, b.peer_endpoint),
            (&b.wg, b.peer_endpoint, &a.wg, a.peer_endpoint),
        ]
        .into_iter()
        .enumerate()
        {
            // Anything still on its way from `carried` goes first (and is
            // counted by then: A's link counts before B's socket gets it).
            let mut buf = [0u8; 2048];
            while at.recv_from(&mut buf).is_ok() {}
            if round == 0 {
                before = Some(a.metric(&sample));
            }
            let sent = send_train(from, to, 30, 1000, 300);
            let mut got = Vec::new();
            let deadline = Instant::now() + T;
            while got.len() < sent.len() && Instant::now() < deadline {
                if let Ok((n, s)) = at.recv_from(&mut buf) {
                    assert_eq!(s, src, "{path} round {round}");
                    got.push(buf[..n].to_vec());
                }
            }
            assert_eq!(got, sent, "{path} round {round}: every datagram, in order");
        }
        // A's side of the train: its 31 datagrams, all on this path.
        let want = before.expect("round 0 ran") + 31;
        a.wait_metric(&sample, want, "the train counted on its path");
        assert_eq!(
            a.metric(&sample),
            want,
            "{path}: the train, on {path} alone"
        );
        la.stop();
        lb.stop();
    }
}

/// Over a path whose MTU is 1,500 bytes (a namespace whose loopback has
/// that MTU), WireGuard bursts of every size from 1 byte to the largest a
/// UDP path carries, over-MTU datagrams with shorter ones right after
/// them and runs of equal ones, cross two links on the direct path both
/// ways: each arrives whole, once, and neither link counts a drop or a
/// refused GSO train.
#[test]
fn every_size_crosses_a_1500_byte_mtu_between_links() {
    let Some(ns) = ferry_testkit::netns::Netns::new("link-mtu", 1500) else {
        return;
    };
    ns.run(|| {
        let server = derp::TestServer::start(derp::Kind::Ferry, None);
        let dir = TempDir::new("link-mtu");
        // The namespace has loopback alone, which is no candidate unless
        // bound to.
        let relay = format!(
            "bind = \"127.0.0.1:0\"\n{}",
            relay_block(&server.url(), None)
        );
        let (a, b, a_cfg, b_cfg) = pair_with(&dir, &relay, "");
        for side in [&a, &b] {
            socket2::SockRef::from(&side.wg)
                .set_recv_buffer_size(4 << 20)
                .unwrap();
        }
        let mut la = link(&a_cfg);
        let mut lb = link(&b_cfg);
        la.wait_log("path switch: derp -> direct");
        lb.wait_log("path switch: derp -> direct");
        carried(&a.wg, a.peer_endpoint, &b.wg, b"first a to b");
        carried(&b.wg, b.peer_endpoint, &a.wg, b"first b to a");
        let sizes = ferry_testkit::udp::mixed_sizes(1, 65_507 - 8);
        for (round, (from, to, at)) in [
            (&a.wg, a.peer_endpoint, &b.wg),
            (&b.wg, b.peer_endpoint, &a.wg),
        ]
        .into_iter()
        .enumerate()
        {
            let mut buf = vec![0u8; 1 << 16];
            while at.recv_from(&mut buf).is_ok() {}
            let sent: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    (0..n)
                        .map(|j| (round * 31 + i * 7 + j * 13) as u8)
                        .collect()
                })
                .collect();
            ferry_testkit::udp::send_burst(from, to, &sent);
            let mut got = Vec::new();
            let deadline = Instant::now() + T;
            while got.len() < sent.len() && Instant::now() < deadline {
                if let Ok((n, _)) = at.recv_from(&mut buf) {
                    got.push(buf[..n].to_vec());
                }
            }
            let mut want = sent.clone();
            want.sort();
            got.sort();
            let lens = |v: &[Vec<u8>]| v.iter().map(Vec::len).collect::<Vec<_>>();
            assert!(
                got == want,
                "round {round}: sent sizes {:?}, got {:?}",
                lens(&want),
                lens(&got)
            );
        }
        for (side, peer) in [(&a, "b"), (&b, "a")] {
            for why in DROP_REASONS {
                let sample =
                    format!("ferry_link_peer_drops_total{{peer=\"{peer}\",reason=\"{why}\"}}");
                assert_eq!(side.metric(&sample), 0, "{sample}");
            }
            for dir in ["to_peer", "from_peer"] {
                let sample = format!("ferry_link_gso_fallbacks_total{{direction=\"{dir}\"}}");
                assert_eq!(side.metric(&sample), 0, "{sample}");
            }
        }
        la.stop();
        lb.stop();
    });
}

/// Every reason a link counts a dropped datagram for.
const DROP_REASONS: [&str; 7] = [
    "queue_full",
    "relay_down",
    "not_wireguard",
    "too_large",
    "no_path",
    "deliver_failed",
    "local_socket_full",
];
