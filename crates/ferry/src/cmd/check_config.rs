//! `ferry check-config FILE`: a configuration file checked without
//! starting anything, by the checks its service runs at start.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use toml::de::DeTable;

use super::derp;
use crate::flags::{self, Given, Origins};

/// `ferry check-config` flags.
#[derive(clap::Args, Debug)]
pub(crate) struct CheckArgs {
    /// The file to check.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Which service's file it is: auto (a file with [[bounce]], [hub] or
    /// another key only the UDP relay has is a udp-relay file, one with
    /// [[peer]], [[relay]] or `wireguard` a link file; any other is the
    /// DERP server's), derp, udp-relay or link.
    #[arg(long, default_value = "auto")]
    pub kind: FileKind,
}

/// Whose configuration file.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// Decide from the keys.
    Auto,
    /// `ferry --config`.
    Derp,
    /// `ferry udp-relay --config`.
    UdpRelay,
    /// `ferry link --config`.
    Link,
}

/// Top-level keys only a `ferry link` file has.
const LINK_ONLY_KEYS: &[&str] = &["peer", "relay", "wireguard", "queue", "bind"];

/// Decides whose file `text` is: a UDP relay's or a link's when a
/// top-level key only that service has is in it (a file that does not
/// parse is the DERP server's, whose parser then reports the error).
fn detect(text: &str) -> FileKind {
    let Ok(doc) = DeTable::parse(text) else {
        return FileKind::Derp;
    };
    let has = |keys: &[&str]| {
        doc.get_ref()
            .iter()
            .any(|(k, _)| keys.contains(&k.get_ref().as_ref()))
    };
    if has(derp::args::UDP_ONLY_KEYS) {
        FileKind::UdpRelay
    } else if has(LINK_ONLY_KEYS) {
        FileKind::Link
    } else {
        FileKind::Derp
    }
}

/// Runs `ferry check-config`: prints a one-line summary and returns, or
/// prints the error and exits with status 2.
pub(crate) fn run(args: &CheckArgs) -> Result<()> {
    match check_file(args) {
        Ok(summary) => {
            println!("{summary}");
            Ok(())
        }
        Err(e) => {
            eprintln!("ferry: check-config: {}", crate::flags::error_text(&e));
            std::process::exit(2);
        }
    }
}

fn check_file(args: &CheckArgs) -> Result<String> {
    check_file_with(args, &ferry_udp::SystemResolver, &mut |w| {
        eprintln!("ferry: check-config: warning: {w}")
    })
}

/// [`check_file`] with the resolver of the UDP relay's bounce targets, and
/// where warnings (a target that does not resolve now) go.
fn check_file_with(
    args: &CheckArgs,
    resolver: &dyn ferry_udp::Resolve,
    warn: &mut dyn FnMut(String),
) -> Result<String> {
    let path = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {path}"))?;
    let kind = match args.kind {
        FileKind::Auto => detect(&text),
        k => k,
    };
    match kind {
        FileKind::Link => Ok(format!(
            "{path}: ferry link configuration OK: {}",
            super::link::check(&path, &text)?
        )),
        FileKind::UdpRelay => {
            let cfg = super::udp_relay::from_file(&path, &text)?;
            for b in &cfg.bounce {
                if let Err(why) = resolves(resolver, &b.target) {
                    warn(format!(
                        "{path}: {} = {:?} does not resolve now ({why}); the relay starts \
                         anyway, drops that route's datagrams and tries again (after 1 s, \
                         doubling up to a minute) until it resolves",
                        b.target_field, b.target,
                    ));
                }
            }
            Ok(format!(
                "{path}: ferry udp-relay configuration OK: {}",
                udp_summary(&cfg)
            ))
        }
        _ => {
            let command = derp::args::command();
            let given = flags::file::parse(&path, &text, &command, derp::args::file_hint)?;
            let argv =
                std::iter::once(OsString::from("ferry")).chain(given.iter().map(Given::flag));
            let args = derp::args::parse(argv).map_err(|e| anyhow!("{path}: {e}"))?;
            let keys = given.len();
            let origins = Origins::new(&command, given);
            let summary = derp::plan::check(&args).map_err(|e| origins.locate(e))?;
            Ok(format!(
                "{path}: DERP server configuration OK ({keys} keys): {summary}"
            ))
        }
    }
}

/// Whether `target` resolves to at least one address now.
fn resolves(resolver: &dyn ferry_udp::Resolve, target: &str) -> Result<(), String> {
    match resolver.resolve(target) {
        Ok(addrs) if !addrs.is_empty() => Ok(()),
        Ok(_) => Err("no addresses".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn udp_summary(cfg: &ferry_udp::config::Config) -> String {
    let addrs = |l: &[ferry_udp::config::Listen]| {
        l.iter()
            .map(|l| l.addr.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut parts: Vec<String> = cfg
        .bounce
        .iter()
        .map(|b| format!("bounce {} -> {}", addrs(&b.listen), b.target))
        .collect();
    if let Some(h) = &cfg.hub {
        parts.push(format!(
            "hub {} with {} peers",
            addrs(&h.listen),
            h.peers.len()
        ));
    }
    let metrics = cfg
        .metrics_addr
        .map_or("metrics off".to_string(), |a: SocketAddr| {
            format!("metrics on {a}")
        });
    parts.push(metrics);
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// Resolves only numeric addresses and `home.example:51820`.
    struct Fake;

    impl ferry_udp::Resolve for Fake {
        fn resolve(&self, target: &str) -> std::io::Result<Vec<SocketAddr>> {
            if target == "home.example:51820" {
                return Ok(vec!["192.0.2.1:51820".parse().unwrap()]);
            }
            target
                .parse()
                .map(|a| vec![a])
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::NotFound, "no such host"))
        }
    }

    fn check(toml: &str) -> (Result<String>, Vec<String>) {
        let dir = ferry_testkit::TempDir::new("check-config");
        let file = dir.path().join("udp.toml");
        std::fs::write(&file, toml).unwrap();
        let args = CheckArgs {
            file,
            kind: FileKind::Auto,
        };
        let mut warnings = Vec::new();
        let out = check_file_with(&args, &Fake, &mut |w| warnings.push(w));
        (out, warnings)
    }

    #[test]
    fn a_bounce_target_that_does_not_resolve_is_a_warning_not_an_error() {
        let (out, warnings) =
            check("[[bounce]]\nlisten = [\":51820\"]\ntarget = \"nowhere.example:51820\"\n");
        assert!(out.unwrap().contains("configuration OK"));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(
                "bounce[0].target = \"nowhere.example:51820\" does not resolve now (no such host)"
            ),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn bounce_targets_that_resolve_give_no_warning() {
        let (out, warnings) = check(
            "[[bounce]]\nlisten = [\":51820\"]\ntarget = \"home.example:51820\"\n\n\
             [[bounce]]\nlisten = [\":51821\"]\ntarget = \"192.0.2.2:51820\"\n",
        );
        assert!(out.unwrap().contains("configuration OK"));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn udp_relay_files_are_told_apart() {
        assert_eq!(detect("[hub]\nlisten = [\":1\"]\n"), FileKind::UdpRelay);
        assert_eq!(detect("gro = false\n"), FileKind::UdpRelay);
        assert_eq!(detect("workers = 1\nstun = false\n"), FileKind::Derp);
        assert_eq!(detect("not toml = = ="), FileKind::Derp);
        assert_eq!(detect("key_file = \"k\"\n[[peer]]\n"), FileKind::Link);
        assert_eq!(detect("key_file = \"k\"\n"), FileKind::Derp);
    }
}
