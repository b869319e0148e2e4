//! Flags from the environment, for containers and service units: every
//! long flag (and visible alias) of a command as `FERRY_<NAME>` (upper
//! case, `-` as `_`: `FERRY_STUN_PORT`, `FERRY_KEY_FILE`), plus extra names
//! a caller maps to flags (derper images' `DERP_*`), which come first so
//! that a `FERRY_*` variable wins over them.
//!
//! Each value is checked by the flag's own parser on its own, so a bad
//! one is reported with the variable's name, not the flag's.

use anyhow::Result;

use super::{Given, Source};

/// The variable for a flag's long name or alias.
fn var_of(name: &str) -> String {
    format!("FERRY_{}", name.to_uppercase().replace('-', "_"))
}

/// The flags `env` sets for `command`: `extra` names first (each mapped
/// to a long flag name), then `FERRY_<NAME>` for each long flag and
/// visible alias but `--help` and `--version`.
pub(crate) fn given(
    command: &clap::Command,
    extra: &[(&str, &str)],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Given>> {
    let mut out = Vec::new();
    for (var, long) in extra {
        if let Some(value) = env(var) {
            out.push(Given {
                long: (*long).to_string(),
                value,
                source: Source::Env {
                    var: (*var).to_string(),
                },
            });
        }
    }
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let names = std::iter::once(long).chain(arg.get_visible_aliases().into_iter().flatten());
        for name in names {
            let var = var_of(name);
            if let Some(value) = env(&var) {
                out.push(Given {
                    long: long.to_string(),
                    value,
                    source: Source::Env { var },
                });
            }
        }
    }
    for g in &out {
        super::check_value(command, g)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> clap::Command {
        clap::Command::new("t")
            .arg(
                clap::Arg::new("stun-port")
                    .long("stun-port")
                    .value_parser(clap::value_parser!(u16)),
            )
            .arg(
                clap::Arg::new("key-file")
                    .long("key-file")
                    .short('c')
                    .visible_alias("c"),
            )
            .arg(clap::Arg::new("hostname").long("hostname"))
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn variables_become_flags_extra_names_first() {
        let g = given(
            &command(),
            &[("DERP_DOMAIN", "hostname")],
            env(&[
                ("FERRY_HOSTNAME", "a.example"),
                ("DERP_DOMAIN", "b.example"),
                ("FERRY_C", "/k"),
                ("FERRY_STUN_PORT", "3479"),
            ]),
        )
        .unwrap();
        let flags: Vec<String> = g.iter().map(|g| g.flag().into_string().unwrap()).collect();
        assert_eq!(
            flags,
            [
                "--hostname=b.example",
                "--stun-port=3479",
                "--key-file=/k",
                "--hostname=a.example"
            ]
        );
        assert_eq!(
            g[2].source,
            Source::Env {
                var: "FERRY_C".into()
            }
        );
    }

    #[test]
    fn a_bad_value_names_the_variable() {
        let e = given(&command(), &[], env(&[("FERRY_STUN_PORT", "abc")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("FERRY_STUN_PORT=\"abc\": invalid value 'abc'"),
            "{e}"
        );
    }
}
