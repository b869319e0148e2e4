//! `ferry --config FILE`: the DERP server's flags as a TOML file, and
//! `ferry check-config FILE` for it and for `ferry udp-relay --config`.
//!
//! The file is flat: one key per flag of the DERP server, named after the
//! flag with `_` for `-` (`stun_port = 3478`, `verify_client_url = "…"`),
//! except `-a`, which is `addr`, and `-c`, which is `key_file`. The keys
//! are derived from the command line's own definition ([`keys`]), so every
//! flag has one and a new flag gets one without anyone remembering to.
//!
//! Each key is checked where it stands: an unknown key, a value of the
//! wrong TOML type, or a value the flag's parser refuses is an error that
//! names the key and its line. The values then become flags placed in
//! front of everything else on the command line ([`with_file`]); since a
//! flag given twice takes the later value, the order of precedence is
//!
//! 1. the command line,
//! 2. `FERRY_<FLAG>` variables, then the `DERP_*` names of derper images
//!    ([`crate::cli::flags_from_env`]),
//! 3. the file,
//! 4. the defaults.
//!
//! Environment over file is the usual order for services (a container or
//! a unit's `Environment=` adjusts one instance of a shared file), and it
//! keeps the order `flags_from_env` already had with the command line.
//!
//! Checks that involve several flags or a range (`send_queue_bytes = 0`)
//! run later, on the merged flags, and speak of the flag; when the value
//! came from the file, [`Origins::locate`] puts the key and line in front.

use std::any::TypeId;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{CommandFactory, Parser};
use toml::de::{DeTable, DeValue};

use crate::cli::Args;

/// The file key of a DERP-server flag (its long name).
pub(crate) fn key_of(long: &str) -> String {
    match long {
        "a" => "addr".into(),
        "c" => "key_file".into(),
        other => other.replace('-', "_"),
    }
}

/// Every key of the DERP server's file with the argument it sets: each
/// long flag but `--config` itself (and clap's --help, --version).
pub(crate) fn keys() -> Vec<(String, clap::Arg)> {
    Args::command()
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            (!matches!(long, "config" | "help" | "version")).then(|| (key_of(long), a.clone()))
        })
        .collect()
}

/// What TOML type a flag's value has in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bool,
    Integer,
    Number,
    Text,
}

impl Kind {
    fn of(arg: &clap::Arg) -> Kind {
        let t = arg.get_value_parser().type_id();
        let integers = [
            TypeId::of::<u16>(),
            TypeId::of::<i32>(),
            TypeId::of::<i64>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<usize>(),
        ];
        if t == TypeId::of::<bool>() {
            Kind::Bool
        } else if integers.iter().any(|i| t == *i) {
            Kind::Integer
        } else if t == TypeId::of::<f64>() {
            Kind::Number
        } else {
            Kind::Text
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Kind::Bool => "a boolean (true or false)",
            Kind::Integer => "an integer",
            Kind::Number => "a number (inf for no limit)",
            Kind::Text => "a string",
        }
    }
}

/// One key of a file, turned into a flag.
#[derive(Clone, Debug)]
pub(crate) struct Setting {
    /// The key.
    pub key: String,
    /// Its line (1-based).
    pub line: usize,
    /// The flag's long name.
    pub long: String,
    /// The flag as clap takes it: `--long=value`.
    pub flag: OsString,
}

/// A DERP-server file's keys, checked one by one.
#[derive(Clone, Debug)]
pub(crate) struct FileFlags {
    /// The file, as named on the command line.
    pub path: String,
    /// Its keys in the order they appear.
    pub settings: Vec<Setting>,
}

fn line_of(text: &str, at: usize) -> usize {
    1 + text[..at.min(text.len())].matches('\n').count()
}

/// Keys of `ferry udp-relay --config` files that the DERP server does not
/// have: a file holding one of them is a UDP relay's.
const UDP_ONLY_KEYS: &[&str] = &[
    "bounce",
    "hub",
    "gro",
    "gso",
    "recv_buffer",
    "send_buffer",
    "handshake_rate",
    "handshake_burst",
];

/// Parses and checks a DERP-server file's text; `path` names it in errors.
pub(crate) fn parse(path: &str, text: &str) -> Result<FileFlags> {
    let doc = DeTable::parse(text).map_err(|e| {
        let at = e
            .span()
            .map_or(String::new(), |s| format!(":{}", line_of(text, s.start)));
        let hint = if text.trim_start().starts_with('{') {
            " (this looks like derper's JSON key file: give that with -c)"
        } else {
            ""
        };
        anyhow!("{path}{at}: {}{hint}", e.message().trim_end())
    })?;
    let known = keys();
    let cmd = Args::command();
    let mut settings = Vec::new();
    for (k, v) in doc.get_ref().iter() {
        let key: &str = k.get_ref();
        let line = line_of(text, k.span().start);
        let at = format!("{path}:{line}");
        let Some((_, arg)) = known.iter().find(|(name, _)| name == key) else {
            let dashes = key.replace('-', "_");
            let hint = if known.iter().any(|(name, _)| *name == dashes) {
                format!(" (keys use _ where flags have -: `{dashes}`)")
            } else if UDP_ONLY_KEYS.contains(&key) {
                " (a `ferry udp-relay --config` key: this file is for the DERP server)".into()
            } else if let Some((name, _)) = known
                .iter()
                .find(|(_, a)| a.get_long().is_some_and(|l| l == key))
            {
                format!(" (the key for -{key} is `{name}`)")
            } else {
                String::new()
            };
            bail!("{at}: unknown key `{key}`{hint}");
        };
        let kind = Kind::of(arg);
        let value = match (kind, v.get_ref()) {
            (Kind::Bool, DeValue::Boolean(b)) => b.to_string(),
            (Kind::Integer | Kind::Number, DeValue::Integer(i)) => {
                i128::from_str_radix(i.as_str(), i.radix())
                    .map_err(|e| anyhow!("{at}: {key}: {e}"))?
                    .to_string()
            }
            (Kind::Number, DeValue::Float(f)) => f.as_str().to_string(),
            (Kind::Text, DeValue::String(s)) => s.to_string(),
            (_, other) => bail!(
                "{at}: {key}: expected {}, got {}",
                kind.expected(),
                other.type_str()
            ),
        };
        let long = arg.get_long().expect("keys have long flags").to_string();
        let flag = OsString::from(format!("--{long}={value}"));
        // The flag's own parser (ports, addresses, enums, numbers' ranges).
        if let Err(e) = cmd
            .clone()
            .try_get_matches_from(["ferry".into(), flag.clone()])
        {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            bail!(
                "{at}: {key} = {value:?}: {}",
                first.trim_start_matches("error: ")
            );
        }
        settings.push(Setting {
            key: key.to_string(),
            line,
            long,
            flag,
        });
    }
    settings.sort_by_key(|s| s.line);
    Ok(FileFlags {
        path: path.to_string(),
        settings,
    })
}

/// Reads and checks a DERP-server file.
pub(crate) fn read(path: &Path) -> Result<FileFlags> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config: reading {}", path.display()))?;
    parse(&path.display().to_string(), &text)
}

/// Where the flags of the final command line came from, for errors.
#[derive(Debug, Default)]
pub(crate) struct Origins {
    file: Option<FileFlags>,
    /// Flags (long names) given after the file's: environment, command line.
    overridden: Vec<String>,
}

impl Origins {
    /// `error`, with the file's key and line in front when the flag it
    /// starts with (`--send-queue-bytes 0: …`, `-a …`) was set by the file.
    pub(crate) fn locate(&self, error: anyhow::Error) -> anyhow::Error {
        let Some(file) = &self.file else {
            return error;
        };
        let text = error.to_string();
        let Some(word) = text.split([' ', ':', '=']).next() else {
            return error;
        };
        let long = match word {
            "-a" => "a",
            "-c" => "c",
            w => match w.strip_prefix("--") {
                Some(l) => l,
                None => return error,
            },
        };
        if self.overridden.iter().any(|o| o == long) {
            return error;
        }
        match file.settings.iter().find(|s| s.long == long) {
            Some(s) => error.context(format!("{}:{}: {}", file.path, s.line, s.key)),
            None => error,
        }
    }
}

/// Puts the flags of the `--config` file (if `argv` names one, on the
/// command line or as `FERRY_CONFIG`) in front of the rest, so that
/// everything else overrides them. `argv` has been through
/// [`crate::cli::flags_from_env`]. A subcommand's arguments are returned
/// as they are.
pub(crate) fn with_file(argv: Vec<OsString>) -> Result<(Vec<OsString>, Origins)> {
    let Ok(first) = Args::try_parse_from(&argv) else {
        // clap reports the mistake when the caller parses for real.
        return Ok((argv, Origins::default()));
    };
    let Some(path) = first.config_file.filter(|_| first.command.is_none()) else {
        return Ok((argv, Origins::default()));
    };
    let file = read(&path)?;
    let matches = Args::command().get_matches_from(&argv);
    let overridden = keys()
        .into_iter()
        .filter(|(_, arg)| {
            matches.value_source(arg.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
        })
        .filter_map(|(_, arg)| arg.get_long().map(str::to_string))
        .collect();
    let mut out = Vec::with_capacity(argv.len() + file.settings.len());
    let mut rest = argv.into_iter();
    out.extend(rest.next());
    out.extend(file.settings.iter().map(|s| s.flag.clone()));
    out.extend(rest);
    Ok((
        out,
        Origins {
            file: Some(file),
            overridden,
        },
    ))
}

/// `ferry check-config`.
#[derive(clap::Args, Debug)]
pub(crate) struct CheckArgs {
    /// The file to check.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Which service's file it is: auto (a file with [[bounce]], [hub] or
    /// another key only the UDP relay has is a udp-relay file; any other
    /// is the DERP server's), derp or udp-relay.
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
}

/// Decides whose file `text` is: a UDP relay's when a top-level key only
/// the UDP relay has is in it (a file that does not parse is the DERP
/// server's, whose parser then reports the error).
fn detect(text: &str) -> FileKind {
    match DeTable::parse(text) {
        Ok(doc)
            if doc
                .get_ref()
                .iter()
                .any(|(k, _)| UDP_ONLY_KEYS.contains(&k.get_ref().as_ref())) =>
        {
            FileKind::UdpRelay
        }
        _ => FileKind::Derp,
    }
}

/// Runs `ferry check-config`: prints a one-line summary and returns, or
/// prints the error and exits with status 2.
pub(crate) fn check(args: &CheckArgs) -> Result<()> {
    match check_file(args) {
        Ok(summary) => {
            println!("{summary}");
            Ok(())
        }
        Err(e) => {
            eprintln!("ferry: check-config: {}", crate::error_text(&e));
            std::process::exit(2);
        }
    }
}

fn check_file(args: &CheckArgs) -> Result<String> {
    let path = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {path}"))?;
    let kind = match args.kind {
        FileKind::Auto => detect(&text),
        k => k,
    };
    match kind {
        FileKind::UdpRelay => {
            use ferry_udp::config::{Config, ConfigError};
            let cfg = Config::from_toml(&path, &text).map_err(|e| match e {
                // The parser's errors already start with the file and line.
                ConfigError::File { .. } => anyhow!(e),
                e => anyhow!("{path}: {e}"),
            })?;
            Ok(format!(
                "{path}: ferry udp-relay configuration OK: {}",
                udp_summary(&cfg)
            ))
        }
        _ => {
            let file = parse(&path, &text)?;
            let origins = Origins {
                file: Some(file.clone()),
                overridden: Vec::new(),
            };
            let argv = std::iter::once(OsString::from("ferry"))
                .chain(file.settings.iter().map(|s| s.flag.clone()));
            let args = Args::try_parse_from(argv).map_err(|e| anyhow!("{path}: {e}"))?;
            let summary = crate::check_derp(&args).map_err(|e| origins.locate(e))?;
            Ok(format!(
                "{path}: DERP server configuration OK ({} keys): {summary}",
                file.settings.len()
            ))
        }
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

    #[test]
    fn every_flag_has_one_key() {
        let keys = keys();
        let mut names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert!(names.contains(&"addr") && names.contains(&"key_file"));
        assert!(names.contains(&"stun_port") && !names.contains(&"config"));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "two flags share a key");
        let flags = Args::command()
            .get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| l != "config"))
            .count();
        assert_eq!(n, flags);
    }

    fn flags(text: &str) -> Vec<String> {
        parse("f.toml", text)
            .unwrap()
            .settings
            .iter()
            .map(|s| s.flag.to_string_lossy().into_owned())
            .collect()
    }

    fn err(text: &str) -> String {
        parse("f.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn values_become_flags_in_file_order() {
        assert_eq!(
            flags("stun_port = 3479\naddr = \":8443\"\nstun = false\naccept_connection_limit = inf\nworkers = 0x2\n"),
            [
                "--stun-port=3479",
                "--a=:8443",
                "--stun=false",
                "--accept-connection-limit=inf",
                "--workers=2"
            ]
        );
        assert_eq!(flags("key_file = \"/k\"\n# c\n"), ["--c=/k"]);
    }

    #[test]
    fn mistakes_name_the_key_and_line() {
        let e = err("addr = \":1\"\ncolour = 1\n");
        assert_eq!(e, "f.toml:2: unknown key `colour`");
        let e = err("stun-port = 1\n");
        assert!(
            e.starts_with("f.toml:1: unknown key `stun-port` (keys use _"),
            "{e}"
        );
        let e = err("[[bounce]]\nlisten = []\n");
        assert!(e.contains("udp-relay"), "{e}");
        let e = err("\n\nstun_port = \"x\"\n");
        assert_eq!(e, "f.toml:3: stun_port: expected an integer, got string");
        let e = err("stun = 1\n");
        assert_eq!(
            e,
            "f.toml:1: stun: expected a boolean (true or false), got integer"
        );
        let e = err("hostname = 5\n");
        assert_eq!(e, "f.toml:1: hostname: expected a string, got integer");
        let e = err("stun_port = 70000\n");
        assert!(
            e.starts_with("f.toml:1: stun_port = \"70000\": invalid value"),
            "{e}"
        );
        let e = err("io = \"fast\"\n");
        assert!(
            e.starts_with("f.toml:1: io = \"fast\": invalid value"),
            "{e}"
        );
        let e = err("addr = \n");
        assert!(e.starts_with("f.toml:1: "), "{e}");
        let e = err("hostname = \"a\"\nhostname = \"b\"\n");
        assert!(e.starts_with("f.toml:2: "), "{e}");
        let e = err("{\"PrivateKey\": \"privkey:00\"}\n");
        assert!(e.contains("give that with -c"), "{e}");
    }

    #[test]
    fn range_errors_get_the_key_in_front() {
        let origins = Origins {
            file: Some(parse("f.toml", "\nsend_queue_bytes = 0\n").unwrap()),
            overridden: Vec::new(),
        };
        let e = origins.locate(anyhow!("--send-queue-bytes 0: must be between"));
        assert_eq!(
            crate::error_text(&e),
            "f.toml:2: send_queue_bytes: --send-queue-bytes 0: must be between"
        );
        let e = origins.locate(anyhow!("--workers 0: at least one"));
        assert_eq!(crate::error_text(&e), "--workers 0: at least one");
        let overridden = Origins {
            overridden: vec!["send-queue-bytes".into()],
            ..origins
        };
        let e = overridden.locate(anyhow!("--send-queue-bytes 0: must be between"));
        assert_eq!(
            crate::error_text(&e),
            "--send-queue-bytes 0: must be between"
        );
    }

    /// The example file names every key (set or commented out), and what
    /// it sets is the default: it documents the defaults truly.
    #[test]
    fn the_example_file_has_every_key_at_its_default() {
        let text = include_str!("../../../packaging/ferry.toml");
        for (key, _) in keys() {
            let shown = text.lines().any(|l| {
                let l = l.trim_start_matches("# ");
                l.strip_prefix(key.as_str())
                    .is_some_and(|rest| rest.starts_with(" = "))
            });
            assert!(shown, "packaging/ferry.toml has no line for `{key}`");
        }
        let file = parse("ferry.toml", text).unwrap();
        let argv = std::iter::once(OsString::from("ferry"))
            .chain(file.settings.iter().map(|s| s.flag.clone()));
        let from_file = format!("{:?}", Args::parse_from(argv));
        let defaults = format!("{:?}", Args::parse_from(["ferry"]));
        assert_eq!(from_file, defaults);
    }

    #[test]
    fn udp_relay_files_are_told_apart() {
        assert_eq!(detect("[hub]\nlisten = [\":1\"]\n"), FileKind::UdpRelay);
        assert_eq!(detect("gro = false\n"), FileKind::UdpRelay);
        assert_eq!(detect("workers = 1\nstun = false\n"), FileKind::Derp);
        assert_eq!(detect("not toml = = ="), FileKind::Derp);
    }
}
