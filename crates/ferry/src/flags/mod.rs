//! Flag handling shared by every subcommand: where a setting comes from,
//! the one order in which sources win, and errors that name their source.
//!
//! A setting can come from four places. Each later one wins:
//!
//! 1. the defaults (clap's, and a few computed at start: the key file's
//!    place, the certificate directory),
//! 2. a configuration file (`--config`; [`file`]),
//! 3. the environment (`FERRY_<FLAG>` and, below those, derper images'
//!    `DERP_*` names; [`env`]),
//! 4. the command line.
//!
//! The DERP server reads all four; `ferry udp-relay` and `ferry link` read
//! a file and the command line, and `FERRY_LOG` for their log filter
//! (between the two, as everywhere: a `--log` given wins over it).
//!
//! The file's keys and the variables are turned into flags (`--long=value`)
//! and each is checked alone, so a bad one is reported as the key and line
//! or the variable, never as a flag nobody typed. They go in front of the
//! command line's own flags, file first; clap takes the later of two values
//! for a flag, which gives the order above. [`Origins`] keeps who set what,
//! for errors found later (a value out of range: [`Origins::locate`]) and for the start-up
//! log, which names both sources wherever two of them disagree
//! ([`Origins::disagreements`]).

pub(crate) mod env;
pub(crate) mod file;
pub(crate) mod values;

use std::ffi::OsString;
use std::fmt;

/// Where a flag's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A configuration file's key.
    File {
        /// The file, as named on the command line.
        path: String,
        /// The key's line (1-based).
        line: usize,
        /// The key.
        key: String,
    },
    /// An environment variable.
    Env {
        /// Its name.
        var: String,
    },
    /// The command line.
    CommandLine,
}

/// One value a source gave a flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Given {
    /// The flag's long name (`stun-port`).
    pub long: String,
    /// The value, as written.
    pub value: String,
    /// Who gave it.
    pub source: Source,
}

impl Given {
    /// Where it was written, without the value: `f.toml:3: log`,
    /// `FERRY_LOG`, `--log`.
    pub(crate) fn place(&self) -> String {
        match &self.source {
            Source::File { path, line, key } => format!("{path}:{line}: {key}"),
            Source::Env { var } => var.clone(),
            Source::CommandLine => format!("--{}", self.long),
        }
    }

    /// The flag as clap takes it.
    pub(crate) fn flag(&self) -> OsString {
        OsString::from(format!("--{}={}", self.long, self.value))
    }
}

impl fmt::Display for Given {
    /// The value where the operator wrote it: `f.toml:3: certdir =
    /// "/etc/ferry/certs"`, `FERRY_CERTDIR="/srv/certs"`, `--certdir
    /// "/var/lib/ferry/certs" on the command line`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::File { path, line, key } => {
                write!(f, "{path}:{line}: {key} = {:?}", self.value)
            }
            Source::Env { var } => write!(f, "{var}={:?}", self.value),
            Source::CommandLine => {
                write!(f, "--{} {:?} on the command line", self.long, self.value)
            }
        }
    }
}

/// The values every source gave, lowest precedence first, and the names
/// each flag answers to (for errors that name a flag by its short form or
/// an alias).
#[derive(Clone, Debug, Default)]
pub(crate) struct Origins {
    given: Vec<Given>,
    names: Vec<(String, String)>,
}

impl Origins {
    /// `given` in precedence order (file, environment, command line);
    /// `command` is whose flags they are.
    pub(crate) fn new(command: &clap::Command, given: Vec<Given>) -> Origins {
        let mut names = Vec::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            names.push((format!("--{long}"), long.to_string()));
            if let Some(short) = arg.get_short() {
                names.push((format!("-{short}"), long.to_string()));
            }
            for alias in arg.get_all_aliases().into_iter().flatten() {
                names.push((format!("--{alias}"), long.to_string()));
            }
        }
        Origins { given, names }
    }

    /// Everything given, lowest precedence first.
    #[cfg(test)]
    pub(crate) fn given(&self) -> &[Given] {
        &self.given
    }

    /// The value that won for flag `long`, if any source gave one (else
    /// the default holds).
    pub(crate) fn winner(&self, long: &str) -> Option<&Given> {
        self.given.iter().rev().find(|g| g.long == long)
    }

    /// The long name of a flag as an error message starts with it
    /// (`-c`, `--c`, `--key-file`).
    fn long_of(&self, name: &str) -> Option<&str> {
        self.names
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, long)| long.as_str())
    }

    /// `error` with the source of its value in front, when it starts by
    /// naming a flag (`--send-queue-bytes 0: …`, `-c: …`) whose value a
    /// file or a variable gave: `f.toml:2: send_queue_bytes: --send-queue-
    /// bytes 0: …`, `FERRY_SEND_QUEUE_BYTES: …`.
    pub(crate) fn locate(&self, error: anyhow::Error) -> anyhow::Error {
        let text = error.to_string();
        let Some(word) = text.split([' ', ':', '=']).next() else {
            return error;
        };
        let Some(long) = self.long_of(word) else {
            return error;
        };
        match self.winner(long).map(|g| &g.source) {
            Some(Source::File { path, line, key }) => {
                error.context(format!("{path}:{line}: {key}"))
            }
            Some(Source::Env { var }) => error.context(var.clone()),
            Some(Source::CommandLine) | None => error,
        }
    }

    /// One line per flag that two sources gave different values, naming
    /// the winner and what it overrode, for the start-up log.
    pub(crate) fn disagreements(&self) -> Vec<String> {
        let mut longs: Vec<&str> = Vec::new();
        for g in &self.given {
            if !longs.contains(&g.long.as_str()) {
                longs.push(&g.long);
            }
        }
        longs
            .into_iter()
            .filter_map(|long| {
                let won = self.winner(long)?;
                let lost: Vec<String> = self
                    .given
                    .iter()
                    .filter(|g| g.long == long && g.value != won.value)
                    .map(|g| g.to_string())
                    .collect();
                (!lost.is_empty())
                    .then(|| format!("--{long}: {won} wins over {}", lost.join(" and ")))
            })
            .collect()
    }
}

/// Runs `g`'s value through its flag's own parser (ports, addresses,
/// enums, numbers' ranges) on its own; the error names where the value
/// was written (`f.toml:3: stun_port = "x": …`, `FERRY_STUN_PORT="x": …`).
pub(crate) fn check_value(command: &clap::Command, g: &Given) -> anyhow::Result<()> {
    if let Err(e) = command
        .clone()
        .try_get_matches_from([OsString::from("ferry"), g.flag()])
    {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        anyhow::bail!("{g}: {}", first.trim_start_matches("error: "));
    }
    Ok(())
}

/// The flags `matches` holds from the command line itself (not from
/// defaults), as [`Given`]s.
pub(crate) fn from_command_line(command: &clap::Command, matches: &clap::ArgMatches) -> Vec<Given> {
    let mut out = Vec::new();
    for arg in command.get_arguments() {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else {
            continue;
        };
        if matches.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let value = matches
            .get_raw(id)
            .and_then(|mut v| v.next_back())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(Given {
            long: long.to_string(),
            value,
            source: Source::CommandLine,
        });
    }
    out
}

/// An error and its causes, each once: a cause whose text its context
/// already quotes (as `thiserror` messages with `{source}` do) is not
/// repeated.
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Rewrites Go-style single-dash long flags (`-dev`, `-stun-port=1`) to
/// clap's double-dash form, as derper's users type them. Short flags
/// (`-a`, `-c`) and negative numbers are left alone.
pub(crate) fn normalize_go_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest_are_values = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || rest_are_values {
            out.push(arg);
            continue;
        }
        let Some(s) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            rest_are_values = true;
            out.push(arg);
            continue;
        }
        let bytes = s.as_bytes();
        let single_dash_long = bytes.len() > 2
            && bytes[0] == b'-'
            && bytes[1] != b'-'
            && bytes[1].is_ascii_alphabetic()
            && !(bytes[2] == b'=' && (bytes[1] == b'a' || bytes[1] == b'c'));
        if single_dash_long {
            let name_end = s.find('=').unwrap_or(s.len());
            // "-a" and "-c" with an attached value ("-a:443") stay short.
            if name_end > 2 || s.contains('=') {
                out.push(OsString::from(format!("-{s}")));
                continue;
            }
        }
        out.push(arg);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    fn command() -> clap::Command {
        clap::Command::new("t")
            .arg(
                clap::Arg::new("key-file")
                    .long("key-file")
                    .short('c')
                    .visible_alias("c"),
            )
            .arg(clap::Arg::new("certdir").long("certdir"))
            .arg(clap::Arg::new("send-queue-bytes").long("send-queue-bytes"))
    }

    fn given(long: &str, value: &str, source: Source) -> Given {
        Given {
            long: long.into(),
            value: value.into(),
            source,
        }
    }

    fn file(line: usize, key: &str) -> Source {
        Source::File {
            path: "f.toml".into(),
            line,
            key: key.into(),
        }
    }

    #[test]
    fn errors_get_the_source_of_their_flag_in_front() {
        let o = Origins::new(
            &command(),
            vec![
                given("send-queue-bytes", "0", file(2, "send_queue_bytes")),
                given("key-file", "/k", file(3, "key_file")),
                given(
                    "key-file",
                    "/e",
                    Source::Env {
                        var: "FERRY_KEY_FILE".into(),
                    },
                ),
            ],
        );
        let e = o.locate(anyhow!("--send-queue-bytes 0: must be between"));
        assert_eq!(
            error_text(&e),
            "f.toml:2: send_queue_bytes: --send-queue-bytes 0: must be between"
        );
        // Short forms and aliases are the same flag; the variable won.
        let e = o.locate(anyhow!("-c: reading /e"));
        assert_eq!(error_text(&e), "FERRY_KEY_FILE: -c: reading /e");
        let e = o.locate(anyhow!("--certdir: x"));
        assert_eq!(error_text(&e), "--certdir: x", "nobody set it");
        let e = o.locate(anyhow!("no flag here"));
        assert_eq!(error_text(&e), "no flag here");
    }

    #[test]
    fn disagreements_name_both_sources() {
        let o = Origins::new(
            &command(),
            vec![
                given("certdir", "/etc/ferry/certs", file(4, "certdir")),
                given("certdir", "/var/lib/ferry/certs", Source::CommandLine),
                given("key-file", "/k", file(5, "key_file")),
                given("key-file", "/k", Source::CommandLine),
            ],
        );
        assert_eq!(
            o.disagreements(),
            ["--certdir: --certdir \"/var/lib/ferry/certs\" on the command line wins over f.toml:4: certdir = \"/etc/ferry/certs\""]
        );
    }

    #[test]
    fn go_style_flags_become_clap_flags() {
        let v: Vec<OsString> = [
            "ferry",
            "-dev",
            "-a",
            ":1",
            "-stun-port=5",
            "-c",
            "k",
            "-http-port",
            "-1",
            "--",
            "-x",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let out: Vec<String> = normalize_go_flags(v)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            out,
            [
                "ferry",
                "--dev",
                "-a",
                ":1",
                "--stun-port=5",
                "-c",
                "k",
                "--http-port",
                "-1",
                "--",
                "-x"
            ]
        );
    }
}
