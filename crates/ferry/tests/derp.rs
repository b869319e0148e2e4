//! The `ferry` DERP server as an operator meets it: start-up checks,
//! messages, signals and `/healthz`, through the built binary on loopback.

mod support;

use support::{
    derp_server, ferry, field_in, get, run, serving, unprivileged, url_addr, Ferry, TempDir,
};

#[test]
fn a_second_ferry_on_the_same_port_is_refused() {
    let dir = TempDir::new("port");
    let (first, addr) = serving(&mut derp_server(&dir, &[]));
    let (status, log) = run(ferry()
        .args(["-a", &addr.to_string(), "--stun=false"])
        .args(["-c", &dir.path("second.key")]));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("-a {addr}: address already in use")),
        "{log}"
    );
    assert!(!std::path::Path::new(&dir.path("second.key")).exists());
    // The first one still has every connection.
    for _ in 0..4 {
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    }
    first.stop();
}

#[test]
fn a_taken_metrics_or_http_port_names_its_flag() {
    let dir = TempDir::new("flags");
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap();
    let (status, log) = run(&mut derp_server(
        &dir,
        &["--metrics-addr", &taken.to_string()],
    ));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("--metrics-addr {taken}: address already in use")),
        "{log}"
    );
    let (status, log) = run(&mut derp_server(
        &dir,
        &[
            "--certmode",
            "selfsigned",
            "--certdir",
            &dir.path("certs"),
            "--http-port",
            &taken.port().to_string(),
        ],
    ));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("--http-port {taken}: address already in use")),
        "{log}"
    );
    assert!(!log.contains("os error 98"), "{log}");
    // STUN is bound on the -a address, at --stun-port.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let stun = udp.local_addr().unwrap();
    let (status, log) = run(&mut derp_server(
        &dir,
        &["--stun-port", &stun.port().to_string()],
    ));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("--stun-port {stun}: address already in use")),
        "{log}"
    );
}

#[test]
fn a_low_port_without_the_capability_says_which_capability_once() {
    let dir = TempDir::new("lowport");
    let mut c = ferry();
    c.args([
        "-a",
        "127.0.0.1:443",
        "--certmode",
        "selfsigned",
        "--http-port",
        "-1",
    ])
    .args(["--certdir", &dir.path("certs"), "--stun=false"])
    .args(["-c", &dir.path("ferry.key")]);
    let (status, log) = run(unprivileged(&mut c));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("-a 127.0.0.1:443: cannot listen"), "{log}");
    assert!(log.contains("CAP_NET_BIND_SERVICE"), "{log}");
    assert_eq!(log.matches("os error 13").count(), 1, "{log}");
    assert!(!std::path::Path::new(&dir.path("ferry.key")).exists());
}

#[test]
fn sighup_keeps_the_relay_serving() {
    let dir = TempDir::new("hup");
    let (mut f, addr) = serving(&mut derp_server(&dir, &[]));
    f.signal(libc::SIGHUP);
    f.wait_log("SIGHUP: nothing to reload");
    f.signal(libc::SIGHUP);
    f.wait_log_n("SIGHUP: nothing to reload", 2);
    assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    let log = f.stop();
    assert!(log.contains("stopped"), "{log}");
}

#[test]
fn sighup_reloads_manual_certificates_at_once() {
    let dir = TempDir::new("reload");
    let certs = dir.path("certs");
    let port80 = support::free_tcp_port().to_string();
    // An IP hostname without files: a certificate is generated and saved.
    let mut f = Ferry::spawn(&mut derp_server(
        &dir,
        &[
            "--certmode",
            "manual",
            "--hostname",
            "127.0.0.1",
            "--certdir",
            &certs,
            "--http-port",
            &port80,
        ],
    ));
    let first = f.field("generated a self-signed certificate", "cert_name");
    f.wait_log("ferry relay running");
    // A different certificate for the same IP, made by `--certmode
    // selfsigned`, replaces the files.
    let other = TempDir::new("reload-other");
    let mut g = Ferry::spawn(&mut derp_server(
        &other,
        &[
            "--certmode",
            "selfsigned",
            "--hostname",
            "127.0.0.1",
            "--certdir",
            &other.path("certs"),
            "--http-port",
            "-1",
        ],
    ));
    let second = g.field("generated a self-signed TLS certificate", "cert_name");
    g.stop();
    assert_ne!(first, second);
    for ext in ["crt", "key"] {
        let from = format!("{}/127.0.0.1.selfsigned.{ext}", other.path("certs"));
        let to = format!("{certs}/127.0.0.1.{ext}");
        std::fs::copy(from, to).unwrap();
    }
    f.signal(libc::SIGHUP);
    let log = f.wait_log("reloaded TLS certificate");
    let line = log
        .lines()
        .find(|l| l.contains("reloaded TLS certificate"))
        .unwrap();
    assert_eq!(field_in(line, "cert_name").as_deref(), Some(&second[..]));
    // Still serving, on the port-80 companion too.
    let r = get(format!("127.0.0.1:{port80}").parse().unwrap(), "/healthz");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    f.stop();
}

#[test]
fn healthz_through_the_binary() {
    let dir = TempDir::new("healthz");
    let (mut f, addr) = serving(&mut derp_server(&dir, &["--metrics-addr", "127.0.0.1:0"]));
    let metrics = url_addr(&f.field("ferry relay running", "metrics"));
    for target in [addr, metrics] {
        support::check_healthz(target);
    }
    f.stop();
}

#[test]
fn start_up_line_is_readable() {
    let dir = TempDir::new("startup");
    let (f, _) = serving(&mut derp_server(&dir, &["--stun=false"]));
    let log = f.stop();
    let line = log
        .lines()
        .find(|l| l.contains("ferry relay running"))
        .unwrap();
    assert!(!line.contains("Some(") && !line.contains("None"), "{line}");
    assert_eq!(field_in(line, "stun").as_deref(), Some("off"), "{line}");
    assert_eq!(field_in(line, "metrics").as_deref(), Some("off"), "{line}");
    assert_eq!(
        field_in(line, "http_port").as_deref(),
        Some("off"),
        "{line}"
    );
    assert_eq!(
        field_in(line, "mesh_key").as_deref(),
        Some("none"),
        "{line}"
    );
    assert!(log.contains("created a new server key"), "{log}");
    // Owner-only, and written in one step (no temporary file left beside).
    use std::os::unix::fs::PermissionsExt;
    let key = std::fs::metadata(dir.path("ferry.key")).unwrap();
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
    let names: Vec<_> = std::fs::read_dir(dir.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ferry.key"], "{names:?}");
}

/// `--accept-connection-limit` through the binary: with a burst of 2 and
/// a refill too slow to matter, two connections are served and the third
/// is closed at once, without a response.
#[test]
fn accept_limit_closes_the_excess_at_once() {
    use std::io::{Read, Write};
    let dir = TempDir::new("accept");
    let (mut f, addr) = serving(&mut derp_server(
        &dir,
        &[
            "--stun=false",
            "--metrics-addr",
            "127.0.0.1:0",
            "--accept-connection-limit",
            "0.001",
            "--accept-connection-burst",
            "2",
        ],
    ));
    let metrics_at = url_addr(&f.field("ferry relay running", "metrics"));
    for _ in 0..2 {
        assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    }
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 64];
    let n = c.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf[..n]));
    // The metrics listener is not limited, and counts the refusal.
    let metrics = ferry_testkit::metrics::Scrape::fetch(metrics_at, "/metrics");
    assert_eq!(metrics.value("tls_listener_rejected_connections"), 1.0);
    f.stop();
}

#[test]
fn bootstrap_dns_rollout_entries_are_refused() {
    let dir = TempDir::new("bootstrap");
    let (status, log) = run(&mut derp_server(
        &dir,
        &[
            "-stun=false",
            "--unpublished-bootstrap-dns-names",
            "a.example/pct.example",
        ],
    ));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("--unpublished-bootstrap-dns-names"), "{log}");
    assert!(log.contains("TXT-record rollout"), "{log}");
}

#[test]
fn derper_flags_ferry_lacks_are_refused_before_anything_is_written() {
    let dir = TempDir::new("derper");
    for flags in [
        &["--certmode=gcp"][..],
        &["--secrets-url", "https://secrets.example.com"],
        &["--ace"],
    ] {
        let (status, log) = run(derp_server(&dir, &["-stun=false"]).args(flags));
        assert_eq!(status.code(), Some(1), "{flags:?}: {log}");
        let name = flags[0]
            .trim_start_matches('-')
            .split('=')
            .next()
            .unwrap()
            .to_string();
        assert!(log.contains(&format!("--{name}")), "{flags:?}: {log}");
        assert!(
            log.contains("not supported by ferry yet"),
            "{flags:?}: {log}"
        );
        assert!(
            !std::path::Path::new(&dir.path("ferry.key")).exists(),
            "{flags:?} wrote the key"
        );
    }
    // --mesh-with is supported, and like derper needs the mesh key.
    let (status, log) = run(&mut derp_server(
        &dir,
        &["-stun=false", "--mesh-with", "b.example.com"],
    ));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("--mesh-with requires --mesh-psk-file"),
        "{log}"
    );
    // derper's own defaults change nothing and are accepted.
    let (f, _) = serving(&mut derp_server(
        &dir,
        &["--verify-clients=false", "--mesh-with", "", "--stun=false"],
    ));
    f.stop();
}

/// derper's default: on port 443 without --certmode, certificates come
/// from ACME. With a CA that cannot be reached, the relay runs, says what
/// it waits for, and retries; it does not exit.
#[test]
fn port_443_without_certmode_uses_acme_as_derper() {
    let dir = TempDir::new("443");
    let mut f = Ferry::spawn(
        ferry()
            .args(["-a", "127.0.0.1:443", "--hostname", "derp.example.com"])
            .args(["--stun=false", "--http-port", "-1"])
            .args(["--acme-directory", "https://127.0.0.1:1/directory"])
            .args([
                "--certdir",
                &dir.path("certs"),
                "-c",
                &dir.path("ferry.key"),
            ]),
    );
    f.wait_log("ACME: no certificate yet; ordering one");
    let log = f.wait_log("ACME: could not obtain a certificate");
    assert!(
        log.contains("TLS handshakes fail until a certificate is obtained"),
        "{log}"
    );
    assert!(log.contains("https://127.0.0.1:1/directory"), "{log}");
    assert!(
        f.wait_exit(std::time::Duration::from_millis(200)).is_none(),
        "still running"
    );
    f.stop();
}

/// --verify-clients without tailscaled's socket: the relay starts (it may
/// come up before tailscaled) and says at once that every client is
/// refused until the socket answers.
#[test]
fn verify_clients_without_the_socket_warns_at_start() {
    let dir = TempDir::new("verify");
    let socket = dir.path("tailscaled.sock");
    let (f, _) = serving(&mut derp_server(
        &dir,
        &["--verify-clients", "--socket", &socket],
    ));
    let log = f.log();
    assert!(
        log.contains(&format!("LocalAPI socket {socket} cannot be used"))
            && log.contains("every client is refused"),
        "{log}"
    );
    f.stop();
}

#[test]
fn a_bad_log_filter_is_a_start_up_error() {
    let dir = TempDir::new("log");
    // FERRY_LOG is --log's variable: it counts where no --log is given.
    for (env, flag, bad) in [
        (None, Some("verbose"), "verbose"),
        (None, Some("info,ferry_derp=loud"), "ferry_derp=loud"),
        (Some("debu"), None, "debu"),
    ] {
        let log_flag: Vec<&str> = flag.map_or(Vec::new(), |f| vec!["--log", f]);
        let mut c = derp_server(&dir, &log_flag);
        if let Some(v) = env {
            c.env("FERRY_LOG", v);
        }
        let (status, log) = run(&mut c);
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(log.contains(&format!("bad directive {bad:?}")), "{log}");
        assert!(
            log.contains(if env.is_some() { "FERRY_LOG" } else { "--log" }),
            "{log}"
        );
    }
    let (f, _) = serving(&mut derp_server(&dir, &["--log", "warn,ferry=info"]));
    f.stop();
}

#[test]
fn odd_values_are_refused_naming_the_flag() {
    let dir = TempDir::new("values");
    for (flags, expect) in [
        (
            &["--send-queue-bytes", "0"][..],
            "--send-queue-bytes 0: must be between",
        ),
        (&["--send-queue-bytes", "100"], "--send-queue-bytes 100:"),
        (&["--workers", "0"], "--workers 0:"),
        (&["--workers", "100000"], "--workers 100000: at most 1024"),
        (
            &["--handshake-timeout", "0"],
            "--handshake-timeout 0: must be more than 0",
        ),
        (
            &["--handshake-timeout", "3h"],
            "--handshake-timeout 3h: must be between",
        ),
        (
            &["--tcp-write-timeout", "1ns"],
            "--tcp-write-timeout 1ns: must be between",
        ),
        (
            &["--tcp-keepalive-time", "100h"],
            "--tcp-keepalive-time 100h:",
        ),
        (&["--tcp-user-timeout", "1ms"], "--tcp-user-timeout 1ms:"),
    ] {
        // `relay` passes `--workers 1`; a later one wins.
        let (status, log) = run(&mut derp_server(&dir, flags));
        assert_eq!(status.code(), Some(1), "{flags:?}: {log}");
        assert!(log.contains(expect), "{flags:?}: {log}");
    }
    // More shards than CPUs runs, with a warning.
    let cpus = ferry_sys::available_cpus().len().max(1);
    let many = (cpus + 1).to_string();
    let (mut f, _) = serving(&mut derp_server(&dir, &["--workers", &many, "--pin=false"]));
    f.wait_log(&format!(
        "--workers {many} is more than the {cpus} usable CPU(s)"
    ));
    f.stop();
}

#[test]
fn selfsigned_certificate_survives_a_restart() {
    let dir = TempDir::new("selfsigned");
    let certs = dir.path("certs");
    let start = |host: &str| {
        let (f, _) = serving(&mut derp_server(
            &dir,
            &[
                "--certmode",
                "selfsigned",
                "--hostname",
                host,
                "--certdir",
                &certs,
                "--http-port",
                "-1",
            ],
        ));
        let log = f.stop();
        let line = log
            .lines()
            .find(|l| l.contains("clients must pin it"))
            .unwrap()
            .to_string();
        field_in(&line, "cert_name").unwrap()
    };
    let first = start("relay.test");
    assert_eq!(
        start("relay.test"),
        first,
        "same certificate after a restart"
    );
    let other = start("other.test");
    assert_ne!(other, first, "another hostname gets its own certificate");
    assert_eq!(start("other.test"), other);
}

#[test]
fn help_matches_the_behaviour() {
    let out = ferry().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    // The flag's own entry: up to the next line that starts a flag.
    let after = help.split("--send-queue-bytes").nth(1).unwrap();
    let end = after
        .match_indices('\n')
        .map(|(i, _)| i)
        .find(|&i| after[i + 1..].trim_start().starts_with('-'))
        .unwrap_or(after.len());
    let queue = &after[..end];
    assert!(queue.contains("pauses the senders"), "{queue}");
    assert!(!queue.contains("are dropped"), "{queue}");
}

/// `--log-format json`: every line is one JSON object with the message and
/// its fields at the top level; connection lines carry the client address.
#[test]
fn json_logs_are_one_object_per_line_with_fields() {
    use std::io::Write;
    let dir = TempDir::new("json");
    let mut f = Ferry::spawn(&mut derp_server(
        &dir,
        &["--stun=false", "--log-format", "json"],
    ));
    let log = f.wait_log("ferry relay running");
    let running = log
        .lines()
        .find(|l| l.contains("ferry relay running"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(running).expect(running);
    let addr = url_addr(v["url"].as_str().expect("url field"));
    assert_eq!(v["level"], "INFO");
    // A connection that sends garbage: its line names its address.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"\x16\x03\x01 not http\r\n\r\n").unwrap();
    let log = f.wait_log("malformed HTTP request");
    let local = c.local_addr().unwrap().to_string();
    let line = log
        .lines()
        .find(|l| l.contains("malformed HTTP request"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(line).expect(line);
    assert_eq!(v["peer"], local.as_str(), "{line}");
    let log = f.stop();
    for line in log.lines().filter(|l| l.starts_with('{')) {
        serde_json::from_str::<serde_json::Value>(line).expect(line);
    }
    let (status, log) = run(&mut derp_server(&dir, &["--log-format", "xml"]));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("--log-format \"xml\": expected text or json"),
        "{log}"
    );
}

/// `ferry status` against a running relay's metrics listener: the text
/// view and `--json`.
/// `ferry status https://…`: the metrics and the health check over TLS,
/// the certificate checked against the system's roots (`SSL_CERT_FILE`
/// here names the relay's self-signed one); without that root it fails.
#[test]
fn status_reads_a_relay_over_https() {
    let dir = TempDir::new("status-tls");
    let certs = dir.path("certs");
    let (f, addr) = serving(&mut derp_server(
        &dir,
        &[
            "--stun=false",
            "--certmode",
            "manual",
            "--hostname",
            "127.0.0.1",
            "--certdir",
            &certs,
            "--http-port",
            "-1",
        ],
    ));
    let ca = format!("{certs}/127.0.0.1.crt");
    let status = |url: &str, ca: Option<&str>| {
        let mut c = ferry();
        c.args(["status", url]).env_remove("SSL_CERT_DIR");
        match ca {
            Some(ca) => c.env("SSL_CERT_FILE", ca),
            None => c.env("SSL_CERT_FILE", dir.path("no-such-roots.pem")),
        };
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), text, err)
    };
    let varz = format!("https://{addr}/debug/varz");
    let (ok, text, err) = status(&varz, Some(&ca));
    assert!(ok, "{text}{err}");
    assert!(
        text.starts_with(&format!("ferry derp at {varz}  version ")),
        "{text}"
    );
    let healthz = format!("https://{addr}/healthz");
    let (ok, text, err) = status(&healthz, Some(&ca));
    assert!(ok, "{text}{err}");
    assert!(
        text.starts_with(&format!("ferry at {healthz}: ok  version ")),
        "{text}"
    );
    let (ok, text, err) = status(&healthz, None);
    assert!(!ok, "trusted without its root: {text}");
    assert!(err.contains("TLS for 127.0.0.1"), "{err}");
    f.stop();
}

#[test]
fn status_reads_a_running_relay() {
    let dir = TempDir::new("status");
    let (mut f, addr) = serving(&mut derp_server(
        &dir,
        &["--stun=false", "--metrics-addr", "127.0.0.1:0"],
    ));
    let metrics = url_addr(&f.field("ferry relay running", "metrics"));
    // Some traffic to count: a plain HTTP request.
    assert!(get(addr, "/healthz").starts_with("HTTP/1.1 200"));
    let out = ferry()
        .args(["status", &metrics.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!("ferry derp at {metrics}  version ")),
        "{text}"
    );
    assert!(text.contains("\nconnections  "), "{text}");
    assert!(text.contains("\ndrops        none"), "{text}");
    let out = ferry()
        .args(["status", "--json", &format!("http://{addr}/debug/varz")])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["kind"], "derp");
    assert!(v["bytes_in_per_second"].is_number(), "{v}");
    // Counts are integers, and the scrape's own connection is not one.
    assert_eq!(v["connections"]["plain"].as_u64(), Some(0), "{v}");
    // A /healthz URL is a health check: one line, exit 0 when healthy.
    for at in [addr, metrics] {
        let url = format!("http://{at}/healthz");
        let out = ferry().args(["status", &url]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let head = format!(
            "ferry at {url}: ok  version {}  back end ",
            env!("CARGO_PKG_VERSION")
        );
        assert!(
            text.starts_with(&head) && text.lines().count() == 1,
            "{text}"
        );
    }
    // A wrong address is an error, not a hang.
    let out = ferry().args(["status", "127.0.0.1:1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to 127.0.0.1:1"));
    f.stop();
}

/// Flags from the environment, as container images set them: `FERRY_*`
/// for every flag and derper images' `DERP_*` names; a flag on the command
/// line wins.
#[test]
fn environment_variables_set_flags() {
    let dir = TempDir::new("env");
    let mut f = Ferry::spawn(
        ferry()
            .env("DERP_ADDR", "127.0.0.1:1")
            .env("FERRY_ADDR", "127.0.0.1:0")
            .env("DERP_STUN", "false")
            .env("FERRY_WORKERS", "1")
            .args(["-c", &dir.path("ferry.key")]),
    );
    let log = f.wait_log("ferry relay running");
    let line = log
        .lines()
        .find(|l| l.contains("ferry relay running"))
        .unwrap();
    assert!(line.contains("url=http://127.0.0.1:"), "{line}");
    assert!(
        !line.contains("url=http://127.0.0.1:1/"),
        "FERRY_ADDR wins over DERP_ADDR: {line}"
    );
    assert!(line.contains("stun=off"), "{line}");
    assert!(line.contains("workers=1"), "{line}");
    f.stop();
    // The command line wins over both.
    let (status, log) = run(ferry()
        .env("FERRY_HTTP_PORT", "80")
        .args(["-a", "127.0.0.1:0", "--stun=false", "--http-port", "banana"])
        .args(["-c", &dir.path("ferry.key")]));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("banana"), "{log}");
}
