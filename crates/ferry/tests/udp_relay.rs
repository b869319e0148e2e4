//! `ferry udp-relay` as an operator meets it: a taken port, SIGHUP with a
//! configuration file, buffer warnings and the start and stop lines,
//! through the built binary on loopback.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{ferry, field_in, run, unprivileged, Ferry, TempDir, T};

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

#[test]
fn sighup_rereads_the_file_names_the_changes_and_keeps_relaying() {
    let dir = TempDir::new("udp-hup");
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target_addr = target.local_addr().unwrap();
    let file = |rate: u32, third_peer: bool| {
        let mut text = format!(
            "handshake_rate = {rate}\n\
             [[bounce]]\nlisten = [\"127.0.0.1:0\"]\ntarget = \"{target_addr}\"\n\
             [hub]\nlisten = [\"127.0.0.1:0\"]\n\
             [[hub.peer]]\nname = \"laptop\"\npublic_key = \"{A}\"\n\
             [[hub.peer]]\nname = \"nas\"\npublic_key = \"{B}\"\n"
        );
        if third_peer {
            text += &format!("[[hub.peer]]\nname = \"phone\"\npublic_key = \"{C}\"\n");
        }
        text
    };
    let path = dir.path("udp.toml");
    std::fs::write(&path, file(20, false)).unwrap();
    let mut f = Ferry::spawn(&mut udp_relay(&["--config", &path]));
    let relay = bound(&mut f, "bounce[0].listen[0]");
    let log = f.wait_log("receiver-index hub");
    let hub = log
        .lines()
        .find(|l| l.contains("receiver-index hub"))
        .unwrap();
    assert_eq!(field_in(hub, "peers").as_deref(), Some("2"), "{hub}");
    let bounce = log.lines().find(|l| l.contains("static bounce")).unwrap();
    assert_eq!(
        field_in(bounce, "target"),
        Some(target_addr.to_string()),
        "{bounce}"
    );

    f.signal(libc::SIGHUP);
    f.wait_log("SIGHUP: the configuration is unchanged");

    std::fs::write(&path, file(30, true)).unwrap();
    f.signal(libc::SIGHUP);
    let log = f.wait_log("nothing was applied");
    assert!(log.contains("handshake_rate: 20 -> 30"), "{log}");
    assert!(
        log.contains(r#"hub.peer \"phone\": added"#) || log.contains(r#"hub.peer "phone": added"#),
        "{log}"
    );
    assert!(log.contains("takes effect only after a restart"), "{log}");

    std::fs::write(&path, "this is not toml = = =").unwrap();
    f.signal(libc::SIGHUP);
    f.wait_log("the configuration file is not usable");

    assert!(relays(relay, &target, b"after three SIGHUPs"));
    let log = f.stop();
    assert!(log.lines().last().unwrap().contains("stopped"), "{log}");
}

#[test]
fn sighup_without_a_file_keeps_relaying() {
    let target = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut f = Ferry::spawn(&mut udp_relay(&[
        "--listen",
        "127.0.0.1:0",
        "--target",
        &target.local_addr().unwrap().to_string(),
    ]));
    let relay = bound(&mut f, "--listen");
    f.signal(libc::SIGHUP);
    f.wait_log("SIGHUP: no --config file");
    assert!(relays(relay, &target, b"after SIGHUP"));
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
        eprintln!("skipped: net.core.[rw]mem_max is too large to exceed");
        return;
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
    f.stop();
}
