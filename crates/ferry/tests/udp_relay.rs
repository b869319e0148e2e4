//! `ferry udp-relay` as an operator meets it: a taken port, SIGHUP with a
//! configuration file, buffer warnings, the start and stop lines and
//! `/healthz`, through the built binary on loopback.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{ferry, field_in, get, run, unprivileged, Ferry, TempDir, T};

const A: &str = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I=";
const B: &str = "2U8lQNjeBL0yOxqE5T323qgIdDE7NgTDB370HDIKG0s=";
const C: &str = "+J8YptlHwfXAAv/hvlXWeHdkjXZXvgpFtN8T/nPcWEo=";

fn udp_relay(args: &[&str]) -> Command {
    let mut c = ferry();
    c.arg("udp-relay")
        .args(["--workers", "1", "--recv-buffer", "262144"])
        .args(["--send-buffer", "262144"])
        .args(args);
    c
}

/// A relay on a loopback port bouncing to `target`.
fn bouncing_to(target: &UdpSocket, extra: &[&str]) -> Ferry {
    let to = target.local_addr().unwrap().to_string();
    Ferry::spawn(udp_relay(&["--listen", "127.0.0.1:0", "--target", &to]).args(extra))
}

/// The address the relay reports for listening `field`.
fn bound(f: &mut Ferry, field: &str) -> SocketAddr {
    let log = f.wait_log("UDP relay running");
    let line = log
        .lines()
        .find(|l| l.contains("listening") && field_in(l, "field").as_deref() == Some(field))
        .unwrap_or_else(|| panic!("no listening line for {field}:\n{log}"));
    field_in(line, "addr").unwrap().parse().unwrap()
}

/// Sends `payload` from a client socket to the relay until the target
/// receives it (UDP may lose the first datagram while a session starts).
fn relays(relay: SocketAddr, target: &UdpSocket, payload: &[u8]) -> bool {
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    target
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + T;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        client.send_to(payload, relay).unwrap();
        if let Ok((n, _)) = target.recv_from(&mut buf) {
            if &buf[..n] == payload {
                return true;
            }
        }
    }
    false
}

#[test]
fn a_second_udp_relay_on_the_same_port_is_refused() {
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target_addr = target.local_addr().unwrap().to_string();
    let mut first = Ferry::spawn(&mut udp_relay(&[
        "--listen",
        "127.0.0.1:0",
        "--target",
        &target_addr,
    ]));
    let addr = bound(&mut first, "--listen");
    let (status, log) = run(&mut udp_relay(&[
        "--listen",
        &addr.to_string(),
        "--target",
        &target_addr,
    ]));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("--listen: {addr} is in use")),
        "{log}"
    );
    assert!(relays(addr, &target, b"still the first relay's"));
    first.stop();
}

/// `--log` on the command line wins over `FERRY_LOG`, which wins over
/// the default: one order of precedence for every service.
#[test]
fn the_command_line_log_filter_wins_over_ferry_log() {
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // The start stops at the port in use, after logging is up.
    let start = |log_flag: &[&str]| {
        let mut c = udp_relay(&["--listen", &addr, "--target", "127.0.0.1:9"]);
        c.args(log_flag).env("FERRY_LOG", "debu");
        run(&mut c)
    };
    let (status, log) = start(&["--log", "info"]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("is in use") && !log.contains("debu"), "{log}");
    let (status, log) = start(&[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("FERRY_LOG") && log.contains("bad directive \"debu\""),
        "{log}"
    );
}

#[test]
fn file_errors_name_the_file_line_and_key_at_start_and_in_check_config() {
    let dir = TempDir::new("udp-file-errors");
    let cases = [
        (
            "[[bounce]]\nlisten = \":51820\"\ntarget = \"127.0.0.1:9\"\n",
            ":2: bounce[0].listen: invalid type: string \":51820\"",
        ),
        (
            "[[bounce]]\nlisten = [\"127.0.0.1:0\"]\ntarget = \"127.0.0.1:9\"\nmax_sessions = \"x\"\n",
            ":4: bounce[0].max_sessions: invalid type: string \"x\", expected usize",
        ),
        (
            "workers = \"two\"\n[[bounce]]\nlisten = [\"127.0.0.1:0\"]\ntarget = \"127.0.0.1:9\"\n",
            ":1: workers: invalid type: string \"two\"",
        ),
        (
            "[[bounce]]\nlisten = [\"51820\"]\ntarget = \"127.0.0.1:9\"\n",
            ": bounce[0].listen[0]: \"51820\" is not an address",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let file = dir.path(&format!("udp{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let want = format!("{file}{want}");
        let (status, log) = run(ferry().args(["udp-relay", "--config", &file]));
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(log.contains(&want), "start: want {want:?} in {log}");
        let (status, log) = run(ferry().args(["check-config", &file]));
        assert_ne!(status.code(), Some(0), "{log}");
        assert!(log.contains(&want), "check-config: want {want:?} in {log}");
    }
}

/// A WireGuard initiation with sender index `sender`, its MAC1 sealed
/// for the peer whose public key is `to` (the hub routes it by that).
fn initiation(sender: u32, to: &str) -> Vec<u8> {
    use ferry_proto::wireguard::{seal_mac1, Mac1Key, PublicKey, INITIATION_LEN};
    let mut m = vec![0x55u8; INITIATION_LEN];
    m[..4].copy_from_slice(&[1, 0, 0, 0]);
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    assert!(seal_mac1(
        &mut m,
        &Mac1Key::new(&PublicKey::from_base64(to).unwrap())
    ));
    m
}

/// The value of `series`; a series that is not there fails the test.
fn metric(metrics: SocketAddr, series: &str) -> u64 {
    ferry_testkit::metrics::Scrape::fetch(metrics, "/metrics").value(series) as u64
}

/// Sends `datagram` from `from` to the hub until `done` holds (each try
/// waits up to 200 ms for `done`); panics after [`T`].
fn send_until(from: &UdpSocket, hub: SocketAddr, datagram: &[u8], mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        from.send_to(datagram, hub).unwrap();
        let tick = Instant::now() + Duration::from_millis(200);
        while Instant::now() < tick {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    panic!("not done within {T:?}");
}

/// Sender indices of the initiations waiting on `sock` (non-blocking).
fn received(sock: &UdpSocket) -> Vec<u32> {
    sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    let mut out = Vec::new();
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        if n >= 8 && buf[0] == 1 {
            out.push(u32::from_le_bytes(buf[4..8].try_into().unwrap()));
        }
    }
    out
}

#[test]
fn sighup_applies_hub_peers_and_limits_and_names_what_needs_a_restart() {
    let dir = TempDir::new("udp-hup");
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target_addr = target.local_addr().unwrap();
    // The phone's WireGuard, at the fixed endpoint the file gives it.
    let phone = UdpSocket::bind("127.0.0.1:0").unwrap();
    let phone_addr = phone.local_addr().unwrap();
    let spare_port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = |rate: u32, hub_listen: &str, phone: bool| {
        let mut text = format!(
            "handshake_rate = {rate}\nhandshake_burst = {rate}\nmetrics_addr = \"127.0.0.1:0\"\n\
             [[bounce]]\nlisten = [\"127.0.0.1:0\"]\ntarget = \"{target_addr}\"\n\
             [hub]\nlisten = [\"{hub_listen}\"]\n\
             [[hub.peer]]\nname = \"laptop\"\npublic_key = \"{A}\"\n\
             [[hub.peer]]\nname = \"nas\"\npublic_key = \"{B}\"\n"
        );
        if phone {
            text += &format!(
                "[[hub.peer]]\nname = \"phone\"\npublic_key = \"{C}\"\nendpoint = \"{phone_addr}\"\n"
            );
        }
        text
    };
    let path = dir.path("udp.toml");
    std::fs::write(&path, file(40, "127.0.0.1:0", false)).unwrap();
    let mut f = Ferry::spawn(&mut udp_relay(&["--config", &path]));
    let relay = bound(&mut f, "bounce[0].listen[0]");
    let hub = bound(&mut f, "hub.listen[0]");
    let metrics = support::url_addr(&f.field("metrics", "url"));
    let peers = |m| metric(m, "ferry_udp_hub_peers");
    let unknown = |m| metric(m, "ferry_udp_drops_total{reason=\"unknown_recipient\"}");
    let limited = |m| metric(m, "ferry_udp_drops_total{reason=\"rate_limited\"}");
    assert_eq!(peers(metrics), 2);

    f.signal(libc::SIGHUP);
    f.wait_log("SIGHUP: the configuration is unchanged");

    // Nobody has the phone's key yet: its initiation is dropped.
    let laptop = UdpSocket::bind("127.0.0.1:0").unwrap();
    send_until(&laptop, hub, &initiation(1, C), || unknown(metrics) >= 1);

    // The phone is added, the limits drop to 1/s, and the hub's address
    // changes, which needs a restart.
    let moved = format!("127.0.0.1:{spare_port}");
    std::fs::write(&path, file(1, &moved, true)).unwrap();
    f.signal(libc::SIGHUP);
    let log = f.wait_log("SIGHUP: configuration reloaded");
    for applied in [
        r#"hub.peer "phone": added"#,
        "handshake_rate: 40 -> 1",
        "handshake_burst: 40 -> 1",
    ] {
        let line = log.lines().find(|l| l.contains(applied));
        assert!(
            line.is_some_and(|l| l.contains("SIGHUP: applied")),
            "{applied}:\n{log}"
        );
    }
    let restart = log
        .lines()
        .find(|l| l.contains("hub.listen:"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        restart.contains("WARN") && restart.contains("only after a restart"),
        "{restart}"
    );
    assert!(restart.contains(&moved), "{restart}");
    assert_eq!(peers(metrics), 3);
    // Still on the old address, the hub now forwards to the phone.
    send_until(&laptop, hub, &initiation(2, C), || {
        received(&phone).contains(&2)
    });
    // One initiation a second: a burst of them is cut.
    let before = limited(metrics);
    for i in 10..15 {
        laptop.send_to(&initiation(i, C), hub).unwrap();
    }
    send_until(&laptop, hub, &initiation(15, C), || {
        limited(metrics) > before
    });

    // The phone is removed and the limits restored; the address change
    // is still pending and said again.
    std::fs::write(&path, file(40, &moved, false)).unwrap();
    f.signal(libc::SIGHUP);
    let log = f.wait_log_n("SIGHUP: configuration reloaded", 2);
    let last = &log[log.rfind("SIGHUP: re-reading").unwrap()..];
    assert!(last.contains(r#"hub.peer "phone": removed"#), "{last}");
    assert!(
        last.contains("hub.listen:") && last.contains("need_restart=1"),
        "{last}"
    );
    assert_eq!(peers(metrics), 2);
    received(&phone);
    let dropped = unknown(metrics);
    send_until(&laptop, hub, &initiation(3, C), || {
        unknown(metrics) > dropped
    });
    assert!(
        !received(&phone).contains(&3),
        "a removed peer is not forwarded to"
    );

    // An invalid file changes nothing.
    std::fs::write(&path, "this is not toml = = =").unwrap();
    f.signal(libc::SIGHUP);
    f.wait_log("the configuration file is not usable");
    assert_eq!(
        metric(metrics, "ferry_udp_config_reloads_total{result=\"failed\"}"),
        1
    );
    assert_eq!(
        metric(
            metrics,
            "ferry_udp_config_reloads_total{result=\"applied\"}"
        ),
        3
    );
    assert_eq!(peers(metrics), 2);

    assert!(relays(relay, &target, b"after four SIGHUPs"));
    let log = f.stop();
    assert!(log.lines().last().unwrap().contains("stopped"), "{log}");
}

#[test]
fn sighup_without_a_file_keeps_relaying() {
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut f = bouncing_to(&target, &[]);
    let relay = bound(&mut f, "--listen");
    f.signal(libc::SIGHUP);
    f.wait_log("SIGHUP: no --config file");
    assert!(relays(relay, &target, b"after SIGHUP"));
    f.stop();
}

/// `/healthz` on the metrics listener answers as the DERP server's does
/// (the same JSON, 200 while serving); other paths still get the metrics.
#[test]
fn healthz_on_the_metrics_listener() {
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut f = bouncing_to(&target, &["--metrics-addr", "127.0.0.1:0"]);
    let metrics = support::url_addr(&f.field("metrics", "url"));
    assert_eq!(support::check_healthz(metrics), "epoll");
    let page = get(metrics, "/metrics");
    assert!(page.contains("ferry_udp_packets_total"), "{page}");
    // `ferry status` names the version, back end and uptime (from
    // /healthz: the UDP relay's metrics carry none of them).
    let out = ferry()
        .args(["status", &metrics.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let head = format!(
        "ferry udp-relay at {metrics}  version {}  back end epoll  up ",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.starts_with(&head) && !text.contains("up -s"), "{text}");
    f.stop();
}

#[test]
fn capped_buffers_warn_with_the_sysctl_fix() {
    let max = |name: &str| -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // More than the system allows, asked for without CAP_NET_ADMIN.
    let ask = (max("rmem_max").max(max("wmem_max")) * 2).min(1 << 30);
    if ask >= 1 << 30 {
        return ferry_testkit::skip!("net.core.[rw]mem_max is too large to exceed");
    }
    let ask = ask.to_string();
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut c = ferry();
    c.args(["udp-relay", "--workers", "1", "--listen", "127.0.0.1:0"])
        .args(["--target", &target.local_addr().unwrap().to_string()])
        .args(["--recv-buffer", &ask, "--send-buffer", &ask]);
    let mut f = Ferry::spawn(unprivileged(&mut c));
    let log = f.wait_log("UDP socket buffers are smaller than asked");
    let warn = log
        .lines()
        .find(|l| l.contains("smaller than asked"))
        .unwrap();
    assert!(warn.contains("WARN"), "{warn}");
    assert!(
        warn.contains(&format!("sysctl -w net.core.rmem_max={ask}")),
        "{warn}"
    );
    assert!(
        warn.contains(&format!("sysctl -w net.core.wmem_max={ask}")),
        "{warn}"
    );
    assert!(warn.contains("twice"), "{warn}");
    assert!(warn.contains("net.core.rmem_max allows"), "{warn}");
    let log = f.stop();
    assert_eq!(
        log.matches("smaller than asked").count(),
        1,
        "one line: {log}"
    );
}
