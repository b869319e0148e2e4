//! `ferry`: the DERP server (the default), the UDP relay, `ferry link`,
//! and the tools beside them. This file only dispatches: each service is a
//! module of [`cmd`], and the flag handling they share is [`flags`].
//!
//! Flags follow Tailscale's `derper` wherever the meaning is shared, and,
//! like Go's flag package, accept a single dash (`-a`, `-dev`,
//! `-stun-port=3478`) as well as two.

// The doc comments on the flag structs are clap's --help text, written for
// a terminal: `[ipv6]:port` and `<certdir>` there are not rustdoc links or
// HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod cmd;
mod flags;
mod key_file;
mod logs;

use anyhow::Result;

use cmd::Command;

fn main() {
    if let Err(e) = run() {
        eprintln!("ferry: {}", flags::error_text(&e));
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let (cli, origins) = cmd::parse(std::env::args_os(), |k| std::env::var(k).ok())?;
    match &cli.command {
        None => cmd::derp::run(&cli.derp, &origins),
        Some(Command::UdpRelay(args)) => cmd::udp_relay::run(args, &origins),
        Some(Command::Status(args)) => cmd::status::run(args),
        Some(Command::CheckConfig(args)) => cmd::check_config::run(args),
        Some(Command::Link(args)) => cmd::link::run(args, &origins),
    }
}
