//! Logs to standard error for every service: the `--log` filter
//! (tracing's syntax, checked so a typo cannot silence everything) and the
//! `--log-format`.

use anyhow::{bail, Context, Result};

/// The filter a service logs with, and where it came from (for errors):
/// `--log` given on the command line, else a non-empty `FERRY_LOG`, else
/// `flag` (its default or, for the DERP server, what a file or variable
/// set). The DERP server reads `FERRY_LOG` as it reads every `FERRY_*`
/// variable, so it passes `env` as `None`.
pub(crate) fn filter_spec(
    flag: &str,
    on_command_line: bool,
    env: Option<String>,
) -> (&'static str, String) {
    match env {
        Some(v) if !on_command_line && !v.trim().is_empty() => ("FERRY_LOG", v),
        _ => ("--log", flag.to_string()),
    }
}

/// Starts logging for `ferry udp-relay` or `ferry link`: `--log` given on
/// their command line (`origins`), else `FERRY_LOG`, else `log`'s default.
pub(crate) fn init_subcommand(
    log: &str,
    format: &str,
    origins: &crate::flags::Origins,
) -> Result<()> {
    let (source, spec) = filter_spec(
        log,
        origins.winner("log").is_some(),
        std::env::var("FERRY_LOG").ok(),
    );
    init(source, &spec, format)
}

/// Starts logging with filter `spec` (named `source` in errors) and
/// `format` (`text` or `json`); colours only on a terminal.
pub(crate) fn init(source: &str, spec: &str, format: &str) -> Result<()> {
    use std::io::IsTerminal;
    let filter = log_filter(spec).with_context(|| format!("{source} {spec:?}"))?;
    check_format(format)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    if format == "json" {
        // One JSON object per line: timestamp, level, the message and
        // every field (client key, address, reason) at the top level.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
    Ok(())
}

/// Refuses a `--log-format` other than `text` and `json`.
pub(crate) fn check_format(format: &str) -> Result<()> {
    match format {
        "text" | "json" => Ok(()),
        other => bail!("--log-format {other:?}: expected text or json"),
    }
}

/// Builds the log filter from `spec` (tracing's `EnvFilter` syntax),
/// refusing what tracing would silently drop or misread: a directive that
/// does not parse, and a bare word that is not a level (`verbose`,
/// `debu`), which tracing takes as a target name and thereby turns every
/// other message off. Errors name the directive.
pub(crate) fn log_filter(spec: &str) -> Result<tracing_subscriber::EnvFilter> {
    use tracing_subscriber::filter::{Directive, LevelFilter};
    let mut directives = 0;
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        if let Err(e) = d.parse::<Directive>() {
            bail!("bad directive {d:?}: {e}");
        }
        let bare = !d.contains(['=', '[', '{']);
        if bare && d.parse::<LevelFilter>().is_err() {
            bail!(
                "bad directive {d:?}: not a level (error, warn, info, debug, trace, off); \
                 for one module's logs write target=level, e.g. ferry_derp=debug"
            );
        }
    }
    if directives == 0 {
        bail!("empty filter; give a level such as info");
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(spec)
        .with_context(|| format!("bad filter {spec:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_name_the_bad_directive() {
        assert!(log_filter("info").is_ok());
        assert!(log_filter("warn,ferry_derp=debug").is_ok());
        let e = log_filter("info,verbose").unwrap_err().to_string();
        assert!(e.starts_with("bad directive \"verbose\""), "{e}");
        let e = log_filter("ferry=loud").unwrap_err().to_string();
        assert!(e.starts_with("bad directive \"ferry=loud\""), "{e}");
        assert!(log_filter(" , ").is_err());
    }

    #[test]
    fn the_command_line_wins_over_ferry_log() {
        let env = || Some("debug".to_string());
        assert_eq!(filter_spec("warn", true, env()), ("--log", "warn".into()));
        assert_eq!(
            filter_spec("info", false, env()),
            ("FERRY_LOG", "debug".into())
        );
        assert_eq!(
            filter_spec("info", false, Some(" ".into())),
            ("--log", "info".into())
        );
        assert_eq!(filter_spec("info", false, None), ("--log", "info".into()));
    }
}
