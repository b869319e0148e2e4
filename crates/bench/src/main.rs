//! The `ferry-bench` command. See the library docs.

use clap::Parser;

fn main() {
    let cli = ferry_bench::cli::Cli::parse();
    if let Err(e) = ferry_bench::runs::run(cli.command) {
        eprintln!("ferry-bench: error: {e:#}");
        std::process::exit(1);
    }
}
