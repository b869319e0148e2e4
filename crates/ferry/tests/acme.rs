//! `--certmode letsencrypt` against Pebble, Let's Encrypt's test CA, with
//! real challenge validation: Pebble resolves the test name through its
//! DNS test server to 127.0.0.1 and connects to the ports ferry listens
//! on. Pebble and the test server come from `.ci/setup.d/10-pebble.sh`;
//! without them the tests say so and pass only outside CI.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::{ferry, free_tcp_port, Ferry, TempDir};

const NAME: &str = "acme.ferry.test";

fn tools() -> Option<PathBuf> {
    let dir = std::env::var_os("FERRY_PEBBLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ferry-tools/pebble-v2.10.1")
        });
    if dir.join("pebble").exists() && dir.join("pebble-challtestsrv").exists() {
        return Some(dir);
    }
    ferry_testkit::skip!(
        "Pebble is not installed in {} (.ci/setup.d/10-pebble.sh)",
        dir.display()
    );
    None
}

/// Pebble and its DNS server, killed on drop.
struct Ca {
    children: Vec<Child>,
    directory: String,
    management: u16,
    minica: PathBuf,
    _dir: TempDir,
}

impl Drop for Ca {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts a CA that validates on `tls_port` (TLS-ALPN-01) and `http_port`
/// (HTTP-01) and issues certificates valid for `validity` seconds.
fn start_ca(tools: &std::path::Path, tls_port: u16, http_port: u16, validity: u64) -> Ca {
    let dir = TempDir::new("pebble");
    let (api, management, dns) = (free_tcp_port(), free_tcp_port(), free_tcp_port());
    let config = format!(
        r#"{{"pebble": {{"listenAddress": "127.0.0.1:{api}", "managementListenAddress": "127.0.0.1:{management}",
 "certificate": "{cert}", "privateKey": "{key}", "httpPort": {http_port}, "tlsPort": {tls_port},
 "ocspResponderURL": "", "externalAccountBindingRequired": false, "keyAlgorithm": "ecdsa",
 "retryAfter": {{"authz": 1, "order": 1}},
 "profiles": {{"default": {{"description": "test", "validityPeriod": {validity}}}}}}}}}"#,
        cert = tools.join("cert.pem").display(),
        key = tools.join("key.pem").display(),
    );
    let config_path = dir.0.join("pebble.json");
    std::fs::write(&config_path, config).unwrap();
    let log = |name: &str| std::fs::File::create(dir.0.join(name)).unwrap();
    let challtest = Command::new(tools.join("pebble-challtestsrv"))
        .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
        .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
        .args(["-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", ""])
        .args(["-management", &format!("127.0.0.1:{}", free_tcp_port())])
        .stdout(log("challtest.log"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pebble = Command::new(tools.join("pebble"))
        .arg("-config")
        .arg(&config_path)
        .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
        .env("PEBBLE_VA_NOSLEEP", "1")
        .stdout(log("pebble.log"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ca = Ca {
        children: vec![challtest, pebble],
        directory: format!("https://127.0.0.1:{api}/dir"),
        management,
        minica: tools.join("pebble.minica.pem"),
        _dir: dir,
    };
    // Ready once both listen.
    let deadline = Instant::now() + support::T;
    for port in [api, management] {
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "Pebble did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    ca
}

impl Ca {
    /// The root every certificate Pebble issues chains to.
    fn root(&self) -> CertificateDer<'static> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(&self.minica).unwrap())
            .unwrap();
        let pem = https_get(self.management, "localhost", roots, "/roots/0");
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }
}

fn client_config(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS connection to `port` for `name`, verified against `roots`.
fn tls_connect(
    port: u16,
    name: &str,
    roots: rustls::RootCertStore,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(support::T))?;
    let conn = rustls::ClientConnection::new(
        client_config(roots),
        ServerName::try_from(name.to_owned()).unwrap(),
    )
    .map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

fn https_get(port: u16, name: &str, roots: rustls::RootCertStore, path: &str) -> String {
    let mut s = tls_connect(port, name, roots).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

fn roots_of(root: &CertificateDer<'static>) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    roots
}

/// The leaf certificate ferry serves for [`NAME`], verified against
/// `root`.
fn served_leaf(port: u16, root: &CertificateDer<'static>) -> std::io::Result<Vec<u8>> {
    let s = tls_connect(port, NAME, roots_of(root))?;
    Ok(s.conn.peer_certificates().unwrap()[0].to_vec())
}

fn acme_ferry(ca: &Ca, dir: &TempDir, tls_port: u16, http_port: i32, extra: &[&str]) -> Ferry {
    Ferry::spawn(
        ferry()
            .env("SSL_CERT_FILE", &ca.minica)
            .args(["-a", &format!("127.0.0.1:{tls_port}"), "--stun=false"])
            .args(["--http-port", &http_port.to_string()])
            .args(["--certmode", "letsencrypt", "--hostname", NAME])
            .args([
                "--acme-directory",
                &ca.directory,
                "--acme-email",
                "ops@ferry.test",
            ])
            .args([
                "--certdir",
                &dir.path("certs"),
                "-c",
                &dir.path("ferry.key"),
            ])
            .args(extra),
    )
}

#[test]
fn tls_alpn_01_certificate_is_served_and_reused_after_a_restart() {
    let Some(tools) = tools() else { return };
    let tls_port = free_tcp_port();
    let ca = start_ca(&tools, tls_port, free_tcp_port(), 3600);
    let dir = TempDir::new("acme-alpn");
    let mut f = acme_ferry(&ca, &dir, tls_port, -1, &[]);
    f.wait_log("ACME: new certificate in use");
    let root = ca.root();
    let leaf = served_leaf(tls_port, &root).expect("a certificate chaining to Pebble's root");
    // Key and account are the owner's only.
    use std::os::unix::fs::PermissionsExt;
    for file in ["certs/acme-account.json", &format!("certs/{NAME}.acme.key")] {
        let mode = std::fs::metadata(dir.path(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is {mode:o}");
    }
    f.stop();

    // A restart serves the stored certificate without a new order.
    let mut f = acme_ferry(&ca, &dir, tls_port, -1, &[]);
    let log = f.wait_log("ACME: using the stored certificate");
    assert_eq!(served_leaf(tls_port, &root).unwrap(), leaf);
    let log = f.stop() + &log;
    assert!(!log.contains("ordering one"), "{log}");
}

#[test]
fn http_01_certificate_is_served() {
    let Some(tools) = tools() else { return };
    let (tls_port, http_port) = (free_tcp_port(), free_tcp_port());
    let ca = start_ca(&tools, tls_port, http_port, 3600);
    let dir = TempDir::new("acme-http");
    let mut f = acme_ferry(
        &ca,
        &dir,
        tls_port,
        i32::from(http_port),
        &["--acme-challenge", "http-01"],
    );
    let log = f.wait_log("ACME: new certificate in use");
    assert!(log.contains("challenge=Http01"), "{log}");
    served_leaf(tls_port, &ca.root()).expect("a certificate chaining to Pebble's root");
    f.stop();
}

/// Certificates valid for 15 s are renewed at 10 s, while a client that
/// connected before stays connected; new handshakes get the new one.
#[test]
fn short_lived_certificate_is_renewed_under_a_connected_client() {
    let Some(tools) = tools() else { return };
    let tls_port = free_tcp_port();
    let ca = start_ca(&tools, tls_port, free_tcp_port(), 15);
    let dir = TempDir::new("acme-renew");
    let mut f = acme_ferry(&ca, &dir, tls_port, -1, &[]);
    f.wait_log("ACME: new certificate in use");
    let root = ca.root();
    let first = served_leaf(tls_port, &root).unwrap();
    let mut early = tls_connect(tls_port, NAME, roots_of(&root)).unwrap();
    f.wait_log_n("ACME: new certificate in use", 2);
    let second = served_leaf(tls_port, &root).unwrap();
    assert_ne!(first, second, "a new certificate after renewal");
    // The connection made before the renewal still works.
    write!(early, "GET /derp/probe HTTP/1.1\r\nHost: {NAME}\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    early.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    f.stop();
}

/// A CA that cannot be reached, and one whose validation fails: each
/// leaves a log line with the reason (the CA's own words for the latter),
/// and the relay keeps running.
#[test]
fn refusals_are_logged_and_survived() {
    let Some(tools) = tools() else { return };
    let tls_port = free_tcp_port();
    let dir = TempDir::new("acme-refused");
    let ca = start_ca(&tools, tls_port, free_tcp_port(), 3600);
    // Wrong directory URL.
    let mut f = Ferry::spawn(
        ferry()
            .env("SSL_CERT_FILE", &ca.minica)
            .args([
                "-a",
                &format!("127.0.0.1:{tls_port}"),
                "--stun=false",
                "--http-port",
                "-1",
            ])
            .args(["--certmode", "letsencrypt", "--hostname", NAME])
            .args([
                "--acme-directory",
                &format!("{}/nothing-here", ca.directory),
            ])
            .args([
                "--certdir",
                &dir.path("certs"),
                "-c",
                &dir.path("ferry.key"),
            ]),
    );
    let log = f.wait_log("ACME: could not obtain a certificate");
    assert!(log.contains("nothing-here"), "{log}");
    assert!(
        tls_connect(tls_port, NAME, roots_of(&ca.root())).is_err(),
        "no certificate yet"
    );
    assert!(f.wait_exit(Duration::from_millis(100)).is_none());
    f.stop();
    // Validation fails: HTTP-01 where nothing answers on the CA's HTTP port.
    let mut f = acme_ferry(&ca, &dir, tls_port, -1, &["--acme-challenge", "http-01"]);
    let log = f.wait_log("ACME: could not obtain a certificate");
    assert!(
        log.contains("urn:ietf:params:acme:error:"),
        "the CA's problem type: {log}"
    );
    assert!(f.wait_exit(Duration::from_millis(100)).is_none());
    f.stop();
}
