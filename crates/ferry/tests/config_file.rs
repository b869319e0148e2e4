//! `ferry --config FILE` and `ferry check-config` through the built
//! binary: the example file, the order of precedence, and mistakes named
//! by key and line.

mod support;

use std::collections::BTreeSet;

use support::{ferry, run, Ferry, TempDir};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/ferry.toml");

/// `ferry check-config` on `file`: exit code, standard output and error.
fn check(file: &str) -> (Option<i32>, String, String) {
    let out = ferry().args(["check-config", file]).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The file key of every long flag `ferry --help` lists.
fn keys_from_help() -> BTreeSet<String> {
    let out = ferry().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-a, ")
                .or(l.strip_prefix("-c, "))
                .unwrap_or(l);
            let long = l.strip_prefix("--")?;
            let long = long.split([' ', '\t']).next()?;
            Some(match long {
                "a" => "addr".to_string(),
                "c" => "key_file".to_string(),
                other => other.replace('-', "_"),
            })
        })
        .filter(|k| !matches!(k.as_str(), "config" | "help" | "version"))
        .collect()
}

#[test]
fn the_example_file_checks_and_has_a_key_for_every_flag() {
    // At its defaults (port 443, letsencrypt, localhost) it names what is
    // missing; with a real name it checks.
    let (code, _, stderr) = check(EXAMPLE);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(": hostname: --hostname localhost: --certmode letsencrypt"),
        "{stderr}"
    );
    let dir = TempDir::new("cfg-example");
    let named = dir.path("ferry.toml");
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    assert!(text.contains("\nhostname = \"localhost\"\n"));
    std::fs::write(
        &named,
        text.replace(
            "\nhostname = \"localhost\"\n",
            "\nhostname = \"derp.example.com\"\n",
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = check(&named);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.contains("DERP server configuration OK") && stdout.contains("listens on [::]:443"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let keys = keys_from_help();
    assert!(keys.len() > 30, "too few flags read from --help: {keys:?}");
    for key in &keys {
        let shown = text.lines().any(|l| {
            l.trim_start_matches("# ")
                .strip_prefix(key.as_str())
                .is_some_and(|rest| rest.starts_with(" = "))
        });
        assert!(shown, "flag for `{key}` has no key in packaging/ferry.toml");
    }
}

#[test]
fn command_line_beats_environment_beats_file() {
    let dir = TempDir::new("cfg-order");
    let file = dir.path("ferry.toml");
    std::fs::write(
        &file,
        format!(
            "addr = \"127.0.0.1:0\"\nstun = false\nstun_port = 0\nworkers = 1\n\
             derp = false\ntrusted_proxies = \"10.0.0.0/8\"\n\
             verify_client_url = \"http://127.0.0.1:9/verify\"\n\
             key_file = \"{}\"\n",
            dir.path("ferry.key")
        ),
    )
    .unwrap();
    let mut f = Ferry::spawn(
        ferry()
            .args(["--config", &file, "--derp"])
            // DERP_* and FERRY_* over the file; the command line over both.
            .env("DERP_STUN", "true")
            .env("FERRY_TRUSTED_PROXIES", "192.0.2.0/24")
            .env("FERRY_DERP", "false"),
    );
    let field = |f: &mut Ferry, k| f.field("ferry relay running", k);
    assert_eq!(field(&mut f, "trusted_proxies"), "192.0.2.0/24");
    assert_eq!(field(&mut f, "derp"), "on");
    assert_eq!(field(&mut f, "workers"), "1");
    assert_ne!(field(&mut f, "stun"), "off");
    assert!(field(&mut f, "url").starts_with("http://127.0.0.1:"));
    assert!(field(&mut f, "admission").contains("http://127.0.0.1:9/verify"));
    assert!(std::path::Path::new(&dir.path("ferry.key")).exists());
    // Where two sources disagree, the start-up log names the winner and
    // what it overrode.
    let log = f.log();
    assert!(
        log.contains("--trusted-proxies: FERRY_TRUSTED_PROXIES=\"192.0.2.0/24\" wins over ")
            && log.contains(":6: trusted_proxies = \"10.0.0.0/8\""),
        "{log}"
    );
    assert!(log.contains("--derp: --derp "), "{log}");
    f.stop();

    // FERRY_CONFIG names the file as --config does.
    let (status, log) = run(ferry()
        .env("FERRY_CONFIG", &file)
        .env("FERRY_SEND_QUEUE_BYTES", "0"));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("--send-queue-bytes 0: must be between"),
        "{log}"
    );
    assert!(
        !log.contains("ferry.toml:"),
        "the value came from FERRY_*: {log}"
    );
}

/// The shipped systemd unit (the one step 45 checks with `systemd-analyze
/// verify`) passes no flag of its own, so a configuration file's settings
/// hold. Run as the unit runs it (its ExecStart, `$FERRY_ARGS` naming the
/// file, and the state directory systemd's `StateDirectory=` gives it,
/// here one of the test's), the file's `certdir` is where the certificate
/// goes, and the key goes to the state directory.
#[test]
fn the_systemd_unit_leaves_the_file_its_settings() {
    let dir = TempDir::new("cfg-unit");
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/systemd/ferry.service"
    ))
    .unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart");
    let (state, certs) = (dir.path("state"), dir.path("from-file"));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&certs).unwrap();
    let file = dir.path("ferry.toml");
    std::fs::write(
        &file,
        format!(
            "addr = \"127.0.0.1:0\"\nstun = false\nworkers = 1\nhttp_port = -1\n\
             certmode = \"selfsigned\"\ncertdir = \"{certs}\"\n"
        ),
    )
    .unwrap();
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/bin/ferry"), "{exec}");
    let args: Vec<String> = words
        .flat_map(|w| match w {
            "$FERRY_ARGS" => vec!["--config".to_string(), file.clone()],
            w => vec![w.replace("/var/lib/ferry", &state)],
        })
        .collect();
    let mut f = Ferry::spawn(ferry().args(&args).env("STATE_DIRECTORY", &state));
    f.wait_log("ferry relay running");
    f.stop();
    let cert = std::path::Path::new(&certs).join("localhost.selfsigned.crt");
    assert!(cert.exists(), "{exec}: the file's certdir was overridden");
    assert!(std::path::Path::new(&state).join("ferry.key").exists());
}

/// A variable's bad value is reported as the variable, not as a flag
/// nobody typed; `-c` has a long name, `--key-file`, and its variable is
/// `FERRY_KEY_FILE`.
#[test]
fn variables_are_named_and_the_key_file_has_a_long_name() {
    let dir = TempDir::new("cfg-env");
    let (status, log) = run(ferry()
        .args(["-a", "127.0.0.1:0", "-c", &dir.path("ferry.key")])
        .env("FERRY_STUN_PORT", "abc"));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("FERRY_STUN_PORT=\"abc\": invalid value 'abc'"),
        "{log}"
    );

    let out = ferry().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("-c, --key-file <KEY_FILE>"), "{help}");
    assert!(help.contains("-a, --addr <ADDR>"), "{help}");

    let key = dir.path("from-env.key");
    let mut f = Ferry::spawn(
        ferry()
            .args(["-a", "127.0.0.1:0", "--stun=false", "--workers", "1"])
            .env("FERRY_KEY_FILE", &key),
    );
    f.wait_log("ferry relay running");
    assert!(std::path::Path::new(&key).exists());
    f.stop();
}

#[test]
fn mistakes_in_the_file_name_the_key_and_line() {
    let dir = TempDir::new("cfg-bad");
    let key = dir.path("ferry.key");
    let start = |name: &str, text: &str| {
        let file = dir.path(name);
        std::fs::write(
            &file,
            format!("addr = \"127.0.0.1:0\"\nkey_file = \"{key}\"\n{text}"),
        )
        .unwrap();
        let (status, log) = run(ferry().args(["--config", &file]));
        assert_eq!(status.code(), Some(1), "{log}");
        (file, log)
    };
    let (file, log) = start("unknown.toml", "stun_prot = 1\n");
    assert!(
        log.contains(&format!("{file}:3: unknown key `stun_prot`")),
        "{log}"
    );
    let (file, log) = start("type.toml", "\nstun = \"no\"\n");
    assert!(
        log.contains(&format!(
            "{file}:4: stun: expected a boolean (true or false), got string"
        )),
        "{log}"
    );
    let (file, log) = start("range.toml", "send_queue_bytes = 0\n");
    assert!(
        log.contains(&format!(
            "{file}:3: send_queue_bytes: --send-queue-bytes 0: must be between"
        )),
        "{log}"
    );
    let (file, log) = start("value.toml", "io = \"fast\"\n");
    assert!(
        log.contains(&format!("{file}:3: io = \"fast\": invalid value")),
        "{log}"
    );
    // A refused start writes nothing.
    assert!(!std::path::Path::new(&key).exists());
    // A flag on the command line replaces the file's bad value.
    let (_, log) = run(ferry().args([
        "--config",
        &dir.path("range.toml"),
        "--send-queue-bytes",
        "1",
    ]));
    // (The start-up log says the command line won over the file.)
    let error = log
        .lines()
        .find(|l| l.starts_with("ferry: "))
        .unwrap_or_default();
    assert!(
        error.contains("--send-queue-bytes 1: must be between") && !error.contains("range.toml"),
        "{log}"
    );
    // derper's key file given as the configuration.
    let json = dir.path("derper.key");
    std::fs::write(&json, "{\"PrivateKey\":\"privkey:00\"}").unwrap();
    let (_, log) = run(ferry().args(["--config", &json]));
    assert!(log.contains("give that with -c"), "{log}");
}

#[test]
fn check_config_exit_codes_and_summaries() {
    let dir = TempDir::new("cfg-check");
    let write = |name: &str, text: &str| {
        let p = dir.path(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    const A: &str = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I=";
    const B: &str = "2U8lQNjeBL0yOxqE5T323qgIdDE7NgTDB370HDIKG0s=";
    let udp = write(
        "udp.toml",
        &format!(
            "[hub]\nlisten = [\"127.0.0.1:51830\"]\n[[hub.peer]]\npublic_key = \"{A}\"\n\
             [[hub.peer]]\npublic_key = \"{B}\"\n"
        ),
    );
    let (code, out, err) = check(&udp);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!("{udp}: ferry udp-relay configuration OK: hub 127.0.0.1:51830 with 2 peers; metrics off\n")
    );
    let bad_udp = write("bad-udp.toml", "[hub]\nlisten = [\":1\"]\nmtu = 1\n");
    let (code, out, err) = check(&bad_udp);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        err.contains(&format!("{bad_udp}:3: hub.mtu: unknown field `mtu`")),
        "{err}"
    );
    let derp = write("derp.toml", "addr = \"127.0.0.1:3340\"\nstun = false\n");
    let (code, out, err) = check(&derp);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with(&format!(
            "{derp}: DERP server configuration OK (2 keys): listens on 127.0.0.1:3340 (plain HTTP)"
        )),
        "{out}"
    );
    let bad = write(
        "bad.toml",
        "addr = \"127.0.0.1:3340\"\nhandshake_timeout = \"1h\"\n",
    );
    let (code, _, err) = check(&bad);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{bad}:2: handshake_timeout: --handshake-timeout 1h"
        )),
        "{err}"
    );
    // A manual certificate's files are read as the start reads them.
    let manual = write(
        "manual.toml",
        &format!(
            "addr = \"127.0.0.1:8443\"\ncertmode = \"manual\"\nhostname = \"derp.example.com\"\n\
             certdir = \"{}\"\nkey_file = \"{}\"\n",
            dir.path("no-certs"),
            dir.path("k.key")
        ),
    );
    let (code, out, err) = check(&manual);
    assert_eq!(code, Some(2), "{out}");
    assert!(err.contains("derp.example.com.crt"), "{err}");
    // The default key, where it exists, is named as the key (not --dev's).
    let state = dir.path("state");
    std::fs::create_dir_all(&state).unwrap();
    let key = ferry_proto::key::NodePrivate::generate().to_key_file_json();
    std::fs::write(format!("{state}/ferry.key"), key).unwrap();
    let out = ferry()
        .env("STATE_DIRECTORY", &state)
        .args(["check-config", &derp])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.trim_end().ends_with(&format!("key {state}/ferry.key")),
        "{out}"
    );
    // A link file is a link file.
    let link = write(
        "link.toml",
        &format!(
            "key_file = \"{}\"\nwireguard = \"127.0.0.1:51820\"\n\
             [[relay]]\nname = \"home\"\nurl = \"https://derp.example.com/derp\"\n\
             [[peer]]\nname = \"nas\"\nlink_key = \"nodekey:{}\"\nendpoint = \"127.0.0.1:51001\"\n",
            dir.path("link.key"),
            "11".repeat(32)
        ),
    );
    let (code, out, err) = check(&link);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with(&format!(
            "{link}: ferry link configuration OK: 1 relays, 1 peers (nas)"
        )),
        "{out}"
    );
    assert!(
        !std::path::Path::new(&dir.path("link.key")).exists(),
        "nothing written"
    );
    // --kind overrides the guess.
    let out = ferry()
        .args(["check-config", "--kind", "udp-relay", &derp])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `addr`"));
}
