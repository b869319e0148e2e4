//! The control client against a real Headscale (the version the test bed
//! pins, built by `.ci/setup.d/50-e2e.sh` into `interop/bin`), on
//! loopback: a tagged pre-auth key registers the node, the map poll gives
//! it its tag and a 100.64/10 address, Headscale lists it online; then a
//! restart with the saved state polls as the same node without
//! registering again (even with a useless auth key), and a real
//! tailscaled (userspace networking, no root) logged in to the same
//! tailnet sees it online with its tag and its home DERP region, and
//! then the new home region set while the poll runs; when Headscale
//! restarts, the client reconnects as the same node. Over `https://`
//! (Headscale serving TLS with a test CA's `localhost` certificate) the
//! node registers when it trusts that CA and never when it does not.
//!
//! Needs the Headscale binary, so it is ignored in the plain workspace
//! run and run by scripts/test.d/50-e2e.sh, after the set-up that builds
//! it (`--ignored`); without the binary it skips, which fails under
//! `CI=true`.

use ferry_client::TlsRoots;
use ferry_tailnet::{start, Config, Netmap, Status};
use ferry_testkit::certs::TestCa;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HEADSCALE: &str = "headscale-v0.29.3";
const TAILSCALED: &str = "tailscaled-v1.104.7";
const TAILSCALE: &str = "tailscale-v1.104.7";

struct Headscale {
    child: Child,
    bin: PathBuf,
    config: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Serving TLS (with the test CA's `localhost` certificate).
    tls: bool,
}

impl Drop for Headscale {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "headscale's files (log: headscale.log): {}",
                self.dir.display()
            );
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const POLICY: &str = r#"{
  "tagOwners": {"tag:relay": ["fe@"]},
  "grants": [
    {"src": ["*"], "dst": ["*"], "ip": ["*"]},
    {"src": ["fe@"], "dst": ["tag:relay"], "app": {"tailscale.com/cap/relay": [{}]}}
  ]
}
"#;

const DERP_MAP: &str = "regions:
  900:
    regionid: 900
    regioncode: fe
    regionname: Ferry test
    nodes:
      - name: 900a
        regionid: 900
        hostname: 127.0.0.1
        ipv4: 127.0.0.1
        ipv6: none
        stunport: -1
        derpport: 3340
  901:
    regionid: 901
    regioncode: fe2
    regionname: Ferry test 2
    nodes:
      - name: 901a
        regionid: 901
        hostname: 127.0.0.1
        ipv4: 127.0.0.1
        ipv6: none
        stunport: -1
        derpport: 3341
";

impl Headscale {
    fn start(bin: PathBuf) -> Headscale {
        Headscale::start_with(bin, None)
    }

    /// Headscale serving TLS with `ca`'s `localhost` certificate when
    /// given.
    fn start_with(bin: PathBuf, ca: Option<&TestCa>) -> Headscale {
        let dir = std::env::temp_dir().join(format!(
            "ferry-tailnet-hs-{}{}",
            std::process::id(),
            if ca.is_some() { "-tls" } else { "" }
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let d = dir.display();
        let tls = match ca {
            Some(ca) => {
                let c = ca.dir.path().display();
                format!("tls_cert_path: {c}/localhost.crt\ntls_key_path: {c}/localhost.key\n")
            }
            None => String::new(),
        };
        let server_url = match ca {
            Some(_) => format!("https://localhost:{port}"),
            None => format!("http://127.0.0.1:{port}"),
        };
        let config = format!(
            "server_url: {server_url}
{tls}listen_addr: 127.0.0.1:{port}
metrics_listen_addr: 127.0.0.1:{metrics}
grpc_listen_addr: 127.0.0.1:{grpc}
grpc_allow_insecure: false
noise:
  private_key_path: {d}/noise_private.key
prefixes:
  v4: 100.64.0.0/10
  v6: fd7a:115c:a1e0::/48
  allocation: sequential
derp:
  server:
    enabled: false
  urls: []
  paths:
    - {d}/derp.yaml
  auto_update_enabled: false
  update_frequency: 24h
disable_check_updates: true
database:
  type: sqlite
  sqlite:
    path: {d}/db.sqlite
    write_ahead_log: true
log:
  level: info
  format: text
policy:
  mode: file
  path: {d}/policy.json
dns:
  magic_dns: false
  override_local_dns: false
  nameservers:
    global: []
unix_socket: {d}/headscale.sock
unix_socket_permission: \"0770\"
logtail:
  enabled: false
taildrop:
  enabled: false
",
            metrics = free_port(),
            grpc = free_port(),
        );
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config).unwrap();
        std::fs::write(dir.join("derp.yaml"), DERP_MAP).unwrap();
        std::fs::write(dir.join("policy.json"), POLICY).unwrap();
        let log = std::fs::File::create(dir.join("headscale.log")).unwrap();
        let child = Command::new(&bin)
            .args(["-c"])
            .arg(&config_path)
            .arg("serve")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start headscale");
        let mut h = Headscale {
            child,
            bin,
            config: config_path,
            dir,
            port,
            tls: ca.is_some(),
        };
        h.wait_healthy();
        h
    }

    /// Stops Headscale and starts it again on the same port and database.
    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("headscale.log"))
            .unwrap();
        self.child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config)
            .arg("serve")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("restart headscale");
        self.wait_healthy();
    }

    fn login_server(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.port)
        } else {
            format!("http://127.0.0.1:{}", self.port)
        }
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("headscale exited during start-up: {status}; {}", self.log());
            }
            if health(self.port, self.tls) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "headscale not healthy: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("headscale.log")).unwrap_or_default()
    }

    fn cli(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .args(["-o", "json"])
            .stdin(Stdio::null())
            .output()
            .expect("run headscale");
        assert!(
            out.status.success(),
            "headscale {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "headscale {args:?}: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    fn nodes(&self) -> Vec<serde_json::Value> {
        match self.cli(&["nodes", "list"]) {
            serde_json::Value::Array(v) => v,
            serde_json::Value::Null => Vec::new(),
            other => panic!("nodes list: {other}"),
        }
    }

    /// Waits until Headscale lists exactly one node and it is online.
    /// Waits until Headscale lists the node `id` online.
    fn wait_node_online(&self, id: &serde_json::Value) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let nodes = self.nodes();
            if nodes.iter().any(|n| n["id"] == *id && n["online"] == true) {
                return;
            }
            assert!(Instant::now() < deadline, "nodes: {nodes:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_one_online(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let nodes = self.nodes();
            if nodes.len() == 1 && nodes[0]["online"] == true {
                return nodes[0].clone();
            }
            assert!(Instant::now() < deadline, "nodes: {nodes:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Headscale answers /health (over TLS: accepts TCP connections).
fn health(port: u16, tls: bool) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    if tls {
        return true;
    }
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = Vec::new();
    let _ = s.take(64 * 1024).read_to_end(&mut out);
    out.starts_with(b"HTTP/1.1 200")
}

fn interop_bin(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../interop/bin")
        .join(name);
    p.exists().then_some(p)
}

/// A real tailscaled in userspace-networking mode (no root, no TUN),
/// logged in to the same Headscale with a user's (untagged) key.
struct Tailscaled {
    child: Child,
    cli: PathBuf,
    socket: PathBuf,
}

impl Drop for Tailscaled {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tailscaled {
    fn start(hs: &Headscale, daemon: PathBuf, cli: PathBuf, auth_key: &str) -> Tailscaled {
        let dir = hs.dir.join("tailscaled");
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("tailscaled.sock");
        let log = std::fs::File::create(dir.join("tailscaled.log")).unwrap();
        let child = Command::new(daemon)
            .arg("--tun=userspace-networking")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--statedir={}", dir.display()))
            .args(["--port=0", "--no-logs-no-support"])
            .env("TS_NO_LOGS_NO_SUPPORT", "true")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start tailscaled");
        let ts = Tailscaled { child, cli, socket };
        let out = ts.run(&[
            "up",
            &format!("--login-server={}", hs.login_server()),
            &format!("--authkey={auth_key}"),
            "--hostname=ts-a",
            "--timeout=60s",
        ]);
        assert!(
            out.status.success(),
            "tailscale up: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ts
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new(&self.cli)
                .arg(format!("--socket={}", self.socket.display()))
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("run tailscale");
            // The daemon's socket appears a moment after start.
            let starting = String::from_utf8_lossy(&out.stderr).contains("failed to connect");
            if !starting || Instant::now() > deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until `tailscale status --json` shows a peer named `host`
    /// online with `tag`; the peer's entry.
    fn wait_peer_online(&self, host: &str, tag: &str) -> serde_json::Value {
        self.wait_peer(
            |p| {
                p["HostName"] == host
                    && p["Online"] == true
                    && p["Tags"]
                        .as_array()
                        .is_some_and(|t| t.iter().any(|t| t == tag))
            },
            &format!("{host} online with {tag}"),
        )
    }

    /// Waits (at most 60 s) until `tailscale status --json` lists a peer
    /// matching `pred`; the peer's entry.
    fn wait_peer(
        &self,
        pred: impl Fn(&serde_json::Value) -> bool,
        what: &str,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = serde_json::Value::Null;
        while Instant::now() < deadline {
            let out = self.run(&["status", "--json"]);
            if let Ok(status) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
                let found = status["Peer"]
                    .as_object()
                    .and_then(|peers| peers.values().find(|p| pred(p)).cloned());
                if let Some(p) = found {
                    return p;
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("tailscaled never saw {what}: {last}");
    }
}

fn has_tag_and_address(n: &Netmap) -> bool {
    n.self_node.as_ref().is_some_and(|s| {
        s.tags.iter().any(|t| t == "tag:relay")
            && s.addresses.iter().any(|a| match a.addr {
                IpAddr::V4(v4) => in_cgnat(v4) && a.bits == 32,
                IpAddr::V6(_) => false,
            })
    })
}

fn in_cgnat(a: Ipv4Addr) -> bool {
    let o = a.octets();
    o[0] == 100 && (64..128).contains(&o[1])
}

fn node_json_has_tag(node: &serde_json::Value) -> bool {
    node["tags"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t == "tag:relay"))
}

/// Creates the user fe and a reusable pre-auth key of it tagged
/// tag:relay: the user's ID and the key.
fn tagged_key(hs: &Headscale) -> (String, String) {
    let user = hs.cli(&["users", "create", "fe"]);
    let user_id = user["id"].to_string().trim_matches('"').to_owned();
    let key = hs.cli(&[
        "preauthkeys",
        "create",
        "--user",
        &user_id,
        "--reusable",
        "--expiration",
        "1h",
        "--tags",
        "tag:relay",
    ]);
    let auth_key = key["key"].as_str().expect("key in the answer").to_owned();
    (user_id, auth_key)
}

#[test]
#[ignore = "needs interop/bin/headscale-v0.29.3: run by scripts/test.d/50-e2e.sh with --ignored"]
fn registers_over_https_only_when_the_certificate_is_trusted() {
    let Some(bin) = interop_bin(HEADSCALE) else {
        return ferry_testkit::skip!(
            "interop/bin lacks {HEADSCALE} (built by .ci/setup.d/50-e2e.sh)"
        );
    };
    let ca = TestCa::new();
    let hs = Headscale::start_with(bin, Some(&ca));
    let (_, auth_key) = tagged_key(&hs);
    assert!(hs.login_server().starts_with("https://"));
    // A CA the client does not trust: the TLS handshake fails, the node
    // never registers and says why.
    let stranger = start(Config {
        login_server: hs.login_server(),
        tls_roots: TlsRoots::Custom(Arc::new(TestCa::new().root_store())),
        auth_key: auth_key.clone(),
        state_path: hs.dir.join("stranger.json"),
        hostname: "ferry-stranger".into(),
        preferred_derp: 900,
        peer_relay: None,
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match stranger.status() {
            Status::Backoff { error } if error.contains("TLS") => break,
            other => assert!(Instant::now() < deadline, "untrusted CA: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(stranger.registrations(), 0);
    drop(stranger);

    let client = start(Config {
        login_server: hs.login_server(),
        tls_roots: TlsRoots::Custom(Arc::new(ca.root_store())),
        auth_key,
        state_path: hs.dir.join("ferry-tailnet.json"),
        hostname: "ferry-test".into(),
        preferred_derp: 900,
        peer_relay: None,
    })
    .unwrap();
    client
        .wait_for(Duration::from_secs(60), has_tag_and_address)
        .unwrap_or_else(|| {
            panic!(
                "over https: no netmap with tag:relay and an address: status {:?}; {}",
                client.status(),
                hs.log()
            )
        });
    assert_eq!(client.registrations(), 1);
    let listed = hs.wait_one_online();
    assert!(node_json_has_tag(&listed), "{listed}");
}

#[test]
#[ignore = "needs interop/bin/headscale-v0.29.3: run by scripts/test.d/50-e2e.sh with --ignored"]
fn registers_with_tagged_key_and_restarts_without_registering() {
    let (Some(bin), Some(daemon), Some(cli)) = (
        interop_bin(HEADSCALE),
        interop_bin(TAILSCALED),
        interop_bin(TAILSCALE),
    ) else {
        return ferry_testkit::skip!(
            "interop/bin lacks {HEADSCALE}, {TAILSCALED} or {TAILSCALE} (built by .ci/setup.d/50-e2e.sh)"
        );
    };
    let mut hs = Headscale::start(bin);
    let (user_id, auth_key) = tagged_key(&hs);
    let state_path = hs.dir.join("ferry-tailnet.json");
    let config = Config {
        login_server: hs.login_server(),
        tls_roots: Default::default(),
        auth_key,
        state_path: state_path.clone(),
        hostname: "ferry-test".into(),
        preferred_derp: 900,
        peer_relay: None,
    };

    let client = start(config.clone()).unwrap();
    let netmap = client
        .wait_for(Duration::from_secs(60), has_tag_and_address)
        .unwrap_or_else(|| {
            panic!(
                "no netmap with tag:relay and a 100.64/10 address: {:?}, status {:?}; {}",
                client.netmap(),
                client.status(),
                hs.log()
            )
        });
    assert_eq!(client.registrations(), 1);
    let me = netmap.self_node.clone().unwrap();
    assert_eq!(me.key, client.node_key());
    assert!(netmap
        .derp_map
        .as_ref()
        .is_some_and(|m| m.regions.contains_key(&900)));
    let listed = hs.wait_one_online();
    assert!(node_json_has_tag(&listed), "{listed}");
    let id = listed["id"].clone();
    drop(client);

    // Restart with the saved keys and an auth key that would not work:
    // the node polls as itself and never registers.
    let again = start(Config {
        auth_key: "not-a-key".into(),
        ..config
    })
    .unwrap();
    assert_eq!(again.node_key(), me.key);
    let netmap = again
        .wait_for(Duration::from_secs(60), has_tag_and_address)
        .unwrap_or_else(|| panic!("after restart: {:?}; {}", again.status(), hs.log()));
    assert_eq!(netmap.self_node.as_ref().unwrap().id, me.id);
    assert_eq!(again.registrations(), 0, "the saved node key was reused");
    let listed = hs.wait_one_online();
    assert_eq!(listed["id"], id, "the same node");

    // A real tailscaled on the same tailnet sees Ferry online with its tag.
    let user_key = hs.cli(&[
        "preauthkeys",
        "create",
        "--user",
        &user_id,
        "--expiration",
        "1h",
    ]);
    let user_key = user_key["key"].as_str().expect("key in the answer");
    let ts = Tailscaled::start(&hs, daemon, cli, user_key);
    let peer = ts.wait_peer_online("ferry-test", "tag:relay");
    assert_eq!(
        peer["Relay"], "fe",
        "home region 900 from the poll's Hostinfo"
    );
    // A new home region reaches the server while the poll runs.
    again.set_preferred_derp(901);
    ts.wait_peer(|p| p["Relay"] == "fe2", "ferry-test with home region fe2");
    let ip = me.addresses[0].addr.to_string();
    assert!(
        peer["TailscaleIPs"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| *x == ip.as_str())),
        "{peer}"
    );

    // The control server goes away and comes back: the client notices,
    // backs off, reconnects as the same node and publishes a newer
    // netmap, still without registering.
    let before = again.netmap().version;
    hs.restart();
    let netmap = again
        .wait_changed(before, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no netmap after the restart: {:?}", again.status()));
    assert!(has_tag_and_address(&netmap), "{netmap:?}");
    assert_eq!(netmap.self_node.as_ref().unwrap().id, me.id);
    assert_eq!(again.registrations(), 0);
    hs.wait_node_online(&id);
}
