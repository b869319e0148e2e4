//! Flags from a TOML file (`ferry --config FILE`): one key per long flag,
//! named after the flag with `_` for `-` (`stun_port = 3478`,
//! `key_file = "…"`). The keys come from the command's own definition, so
//! every flag has one and a new flag gets one without anyone remembering
//! to.
//!
//! Each key is checked where it stands: an unknown key, a value of the
//! wrong TOML type, or a value the flag's parser refuses is an error that
//! names the key and its line. Checks that involve several flags or a
//! range run later on the merged flags and speak of the flag;
//! [`super::Origins::locate`] then puts the key and line in front.

use std::any::TypeId;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use toml::de::{DeTable, DeValue};

use super::{Given, Source};

/// The file key of a long flag.
fn key_of(long: &str) -> String {
    long.replace('-', "_")
}

/// Every key of `command`'s file with the argument it sets: each long
/// flag but `--config` itself, `--help` and `--version`.
pub(crate) fn keys(command: &clap::Command) -> Vec<(String, clap::Arg)> {
    command
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

/// The line (1-based) of byte `at` in `text`.
pub(crate) fn line_of(text: &str, at: usize) -> usize {
    1 + text[..at.min(text.len())].matches('\n').count()
}

/// Parses and checks a file's text as flags of `command`; `path` names
/// it in errors. `hint` may explain an unknown key (a key of another
/// service's file).
pub(crate) fn parse(
    path: &str,
    text: &str,
    command: &clap::Command,
    hint: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Given>> {
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
    let known = keys(command);
    let mut out = Vec::new();
    for (k, v) in doc.get_ref().iter() {
        let key: &str = k.get_ref();
        let line = line_of(text, k.span().start);
        let at = format!("{path}:{line}");
        let Some((_, arg)) = known.iter().find(|(name, _)| name == key) else {
            bail!(
                "{at}: unknown key `{key}`{}",
                unknown_hint(&known, key, &hint)
            );
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
        let given = Given {
            long: arg.get_long().expect("keys have long flags").to_string(),
            value,
            source: Source::File {
                path: path.to_string(),
                line,
                key: key.to_string(),
            },
        };
        super::check_value(command, &given)?;
        out.push(given);
    }
    out.sort_by_key(|g| match g.source {
        Source::File { line, .. } => line,
        _ => 0,
    });
    Ok(out)
}

/// Why a key may be unknown: dashes for underscores, a flag's short name
/// or alias, or the caller's reason.
fn unknown_hint(
    known: &[(String, clap::Arg)],
    key: &str,
    hint: &impl Fn(&str) -> Option<String>,
) -> String {
    let underscored = key.replace('-', "_");
    if underscored != key && known.iter().any(|(name, _)| *name == underscored) {
        return format!(" (keys use _ where flags have -: `{underscored}`)");
    }
    let by_other_name = known.iter().find(|(_, a)| {
        a.get_short()
            .is_some_and(|s| key.len() == 1 && key.starts_with(s))
            || a.get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&key))
    });
    if let Some((name, _)) = by_other_name {
        return format!(" (the key for -{key} is `{name}`)");
    }
    hint(key).map_or_else(String::new, |h| format!(" ({h})"))
}

/// Reads and checks a file of `command`'s flags.
pub(crate) fn read(
    path: &Path,
    command: &clap::Command,
    hint: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Given>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config: reading {}", path.display()))?;
    parse(&path.display().to_string(), &text, command, hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        clap::Command::new("t")
            .args_override_self(true)
            .arg(
                clap::Arg::new("addr")
                    .long("addr")
                    .short('a')
                    .visible_alias("a"),
            )
            .arg(
                clap::Arg::new("stun-port")
                    .long("stun-port")
                    .value_parser(clap::value_parser!(u16)),
            )
            .arg(
                clap::Arg::new("stun")
                    .long("stun")
                    .value_parser(clap::value_parser!(bool)),
            )
            .arg(
                clap::Arg::new("limit")
                    .long("limit")
                    .value_parser(clap::value_parser!(f64)),
            )
            .arg(clap::Arg::new("config").long("config"))
    }

    fn flags(text: &str) -> Vec<String> {
        parse("f.toml", text, &command(), |_| None)
            .unwrap()
            .iter()
            .map(|g| g.flag().into_string().unwrap())
            .collect()
    }

    fn err(text: &str) -> String {
        parse("f.toml", text, &command(), |k| {
            (k == "bounce").then(|| "another file's key".to_string())
        })
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn values_become_flags_in_file_order() {
        assert_eq!(
            flags("stun_port = 0x10\naddr = \":8443\"\nstun = false\nlimit = inf\n"),
            [
                "--stun-port=16",
                "--addr=:8443",
                "--stun=false",
                "--limit=inf"
            ]
        );
    }

    #[test]
    fn mistakes_name_the_key_and_line() {
        assert_eq!(
            err("addr = \":1\"\ncolour = 1\n"),
            "f.toml:2: unknown key `colour`"
        );
        assert!(err("stun-port = 1\n").starts_with("f.toml:1: unknown key `stun-port` (keys use _"));
        assert_eq!(
            err("a = \":1\"\n"),
            "f.toml:1: unknown key `a` (the key for -a is `addr`)"
        );
        assert_eq!(err("config = \"x\"\n"), "f.toml:1: unknown key `config`");
        assert_eq!(
            err("bounce = 1\n"),
            "f.toml:1: unknown key `bounce` (another file's key)"
        );
        assert_eq!(
            err("\n\nstun_port = \"x\"\n"),
            "f.toml:3: stun_port: expected an integer, got string"
        );
        assert_eq!(
            err("stun = 1\n"),
            "f.toml:1: stun: expected a boolean (true or false), got integer"
        );
        assert!(err("stun_port = 70000\n")
            .starts_with("f.toml:1: stun_port = \"70000\": invalid value"));
        assert!(err("addr = \n").starts_with("f.toml:1: "));
        assert!(err("{\"PrivateKey\": \"privkey:00\"}\n").contains("give that with -c"));
    }
}
