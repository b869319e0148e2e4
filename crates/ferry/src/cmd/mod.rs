//! `ferry`'s services, one module each, and the command line that picks
//! one: the DERP server when no subcommand is given ([`derp`]), then
//! `udp-relay`, `status`, `check-config` and `link`. Flag handling they
//! share (sources, precedence, errors naming their source) is
//! [`crate::flags`].

pub(crate) mod check_config;
pub(crate) mod derp;
pub(crate) mod link;
pub(crate) mod status;
pub(crate) mod udp_relay;

use std::ffi::OsString;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser};

use crate::flags::{self, Origins};

/// Ferry: a DERP relay for Tailscale and WireGuard traffic.
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
// As with Go's flag package, a flag given twice takes the later value.
#[command(args_override_self = true)]
pub(crate) struct Cli {
    /// Another service instead of the DERP server (the default).
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub derp: derp::args::DerpArgs,
}

/// Services other than the DERP server.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum Command {
    /// Relay stock WireGuard over UDP: a static bounce (--target) or a
    /// receiver-index hub (--peer), never decrypting anything.
    UdpRelay(Box<udp_relay::UdpRelayArgs>),
    /// Show what a running relay (DERP or UDP) is doing, from its metrics
    /// endpoint.
    Status(status::StatusArgs),
    /// Check a configuration file (the DERP server's --config or
    /// `ferry udp-relay --config`) without starting anything: exit 0 with a
    /// one-line summary, or 2 with the error.
    CheckConfig(check_config::CheckArgs),
    /// Carry a stock WireGuard interface's datagrams to its peers over
    /// the best path: direct UDP, a relay session or DERP (`ferry link
    /// --config FILE`; `pubkey`, `status`).
    Link(Box<link::LinkArgs>),
}

/// Parses `argv` (Go-style single-dash flags allowed). For the DERP
/// server, the `--config` file's and the environment's flags are layered
/// under the command line's ([`derp::args::layered`]); a subcommand gets
/// its arguments as they are, and [`Origins`] of its command line. Usage
/// errors and `--help` exit here, as clap does.
pub(crate) fn parse(
    argv: impl IntoIterator<Item = OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Cli, Origins)> {
    let argv = flags::normalize_go_flags(argv);
    let subcommand = argv.get(1).and_then(|a| a.to_str()).is_some_and(|a| {
        a == "help" || Cli::command().get_subcommands().any(|c| c.get_name() == a)
    });
    if subcommand {
        let command = Cli::command();
        let matches = command.clone().get_matches_from(argv);
        let origins = matches
            .subcommand()
            .and_then(|(name, sub)| {
                let c = command.find_subcommand(name)?;
                Some(Origins::new(c, flags::from_command_line(c, sub)))
            })
            .unwrap_or_default();
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        return Ok((cli, origins));
    }
    let argv = derp::derper::without_derper_defaults(argv)?;
    let (argv, origins) = derp::args::layered(argv, env)?;
    Ok((Cli::parse_from(argv), origins))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(list: &[&str]) -> Result<Cli, clap::Error> {
        let argv = std::iter::once("ferry")
            .chain(list.iter().copied())
            .map(OsString::from);
        Cli::try_parse_from(flags::normalize_go_flags(argv))
    }

    #[test]
    fn derp_flags_stay_top_level() {
        // The DERP server keeps working without a subcommand, and DERP
        // flags cannot be mixed with a subcommand.
        let a = cli(&["-dev"]).unwrap();
        assert!(a.derp.dev && a.command.is_none());
        assert!(cli(&["--dev", "udp-relay", "--listen", ":1"]).is_err());
    }

    #[test]
    fn a_subcommand_gets_nothing_from_the_environment() {
        let (c, origins) = parse(["ferry", "status"].map(OsString::from), |k| {
            (k == "FERRY_HOSTNAME").then(|| "env.example".to_string())
        })
        .unwrap();
        assert!(matches!(c.command, Some(Command::Status(_))));
        assert!(origins.given().is_empty());
        // Its own command line is known (FERRY_LOG yields to --log).
        let (_, origins) = parse(
            ["ferry", "udp-relay", "--log", "debug"].map(OsString::from),
            |_| None,
        )
        .unwrap();
        assert!(origins.winner("log").is_some());
    }
}
