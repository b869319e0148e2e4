//! Skipping a test, visibly and never silently under CI.
//!
//! libtest has no "skipped" outcome: a test that returns early shows as
//! `ok`, and what it printed with `println!`/`eprintln!` is captured and
//! thrown away. So every skip goes through here, which
//!
//! - writes `SKIP <test>: <reason>` straight to the process's standard
//!   error (past libtest's capture, so it shows in the run's output);
//! - appends `<test>\t<reason>` to the file named by [`SKIP_LOG`] when that
//!   variable is set, one line per skip, for a CI step to count and show;
//! - fails the test where the thing it lacks must be there: under
//!   `CI=true` for [`skip`] (CI's machines have root, namespaces, UDP
//!   GSO/GRO, IPv6 loopback, io_uring, two CPUs, derper), where a named
//!   variable is `1` for [`skip_unless_required`] (kernel TLS, which only
//!   the kernel test VM has), never for [`skip_expected`] (a test of a
//!   fallback on a machine that has the real thing).
//!
//! `<test>` is `<package>/<test binary or library>::<test path>`, e.g.
//! `ferry-derp/relay::ipv6_listener_relays`; the test path is the name
//! libtest gives the test's thread.
//!
//! Use the macros, so that the package is the caller's:
//!
//! ```no_run
//! fn ipv6_listener_relays() {
//!     if std::net::TcpListener::bind("[::1]:0").is_err() {
//!         return ferry_testkit::skip!("this machine has no IPv6 loopback");
//!     }
//!     // ...
//! }
//! ```

use std::ffi::OsString;
use std::fmt::Display;
use std::io::Write;

/// The variable naming the file that skips are appended to.
pub const SKIP_LOG: &str = "FERRY_SKIP_LOG";

/// Whether this run is CI's (`CI=true`), where a skip of something CI's
/// machines have is a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips the calling test for `$reason` (format arguments allowed); a
/// failure under `CI=true`. Returns `()`, so `return skip!(...)` reads.
#[macro_export]
macro_rules! skip {
    ($($reason:tt)+) => { $crate::skip_as!(skip, [], $($reason)+) };
}

/// Skips the calling test for `$reason`; a failure where the variable
/// `$var` is `1` (e.g. `FERRY_REQUIRE_KTLS`, which the kernel test VM sets).
#[macro_export]
macro_rules! skip_unless_required {
    ($var:expr, $($reason:tt)+) => {
        $crate::skip_as!(skip_unless_required, [$var], $($reason)+)
    };
}

/// Skips the calling test for `$reason` where skipping is the point on
/// this machine (it tests a fallback, and the machine has the real thing);
/// never a failure, still shown and logged.
#[macro_export]
macro_rules! skip_expected {
    ($($reason:tt)+) => { $crate::skip_as!(skip_expected, [], $($reason)+) };
}

/// The skip macros' body: calls [`skip`](fn@skip) or its siblings with the
/// caller's test name, `$extra` arguments and the formatted reason.
#[doc(hidden)]
#[macro_export]
macro_rules! skip_as {
    ($f:ident, [$($extra:expr),*], $($reason:tt)+) => {
        $crate::skip::$f(
            &$crate::skip::test_name(env!("CARGO_PKG_NAME"), module_path!()),
            $($extra,)*
            &format!($($reason)+),
        )
    };
}

/// `<package>/<binary>::<test>`: the binary from the caller's module path
/// (its first segment), the test from the thread's name (libtest names a
/// test's thread after the test).
pub fn test_name(package: &str, module_path: &str) -> String {
    let binary = module_path.split("::").next().unwrap_or(module_path);
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => module_path.to_owned(),
    };
    format!("{package}/{binary}::{test}")
}

/// Records the skip of `test`; panics under `CI=true`.
pub fn skip(test: &str, reason: &str) {
    report(test, reason, under_ci().then(|| "CI=true".to_owned()));
}

/// Records the skip of `test`; panics when `var` is `1`.
pub fn skip_unless_required(test: &str, var: &str, reason: &str) {
    let required = std::env::var(var).as_deref() == Ok("1");
    report(test, reason, required.then(|| format!("{var}=1")));
}

/// Records the skip of `test`, never a failure.
pub fn skip_expected(test: &str, reason: &str) {
    report(test, reason, None);
}

/// [`record`] to standard error and the file [`SKIP_LOG`] names.
fn report(test: &str, reason: &str, fails: Option<String>) {
    record(
        test,
        reason,
        fails,
        std::env::var_os(SKIP_LOG),
        &mut stderr(),
    );
}

/// The process's standard error itself: `eprintln!` would be captured by
/// libtest and shown only if the test failed.
fn stderr() -> std::io::StderrLock<'static> {
    std::io::stderr().lock()
}

/// Says so on `out`; then panics when `fails` names why this skip is a
/// failure, or else appends it to the file `log` (a skip that fails the
/// test is a failure, not a skip).
fn record(
    test: &str,
    reason: impl Display,
    fails: Option<String>,
    log: Option<OsString>,
    out: &mut dyn Write,
) {
    let reason = reason.to_string().replace(['\n', '\t'], " ");
    let _ = writeln!(out, "SKIP {test}: {reason}");
    if let Some(why) = fails {
        panic!("{why}: {test} must not skip here: {reason}");
    }
    if let Some(path) = log {
        append_line(SKIP_LOG, &path, &format!("{test}\t{reason}"));
    }
}

/// Appends `line` and a newline to the file `path` (named by the variable
/// `var`), created if need be; panics when it cannot. One write of one
/// short line to a file opened for appending: lines from tests running at
/// once do not interleave.
pub(crate) fn append_line(var: &str, path: &std::ffi::OsStr, line: &str) {
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        panic!("{var}={}: cannot append to it: {e}", path.to_string_lossy());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_file(tag: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("ferry-skip-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn a_skip_is_logged_as_test_tab_reason() {
        let path = log_file("logged");
        let test = test_name("ferry-testkit", "ferry_testkit::skip::tests");
        assert_eq!(
            test, "ferry-testkit/ferry_testkit::skip::tests::a_skip_is_logged_as_test_tab_reason",
            "the thread is named after the test"
        );
        let mut out = Vec::new();
        record(
            &test,
            "no\tGSO\nhere",
            None,
            Some(path.clone().into()),
            &mut out,
        );
        record("other", "why", None, Some(path.clone().into()), &mut out);
        let logged = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(logged, format!("{test}\tno GSO here\nother\twhy\n"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("SKIP {test}: no GSO here\nSKIP other: why\n")
        );
    }

    #[test]
    fn a_skip_that_must_not_happen_fails_and_is_not_logged() {
        let path = log_file("fails");
        let log = Some(path.clone().into());
        let failed = std::panic::catch_unwind(|| {
            record("t", "no GSO", Some("CI=true".into()), log, &mut Vec::new())
        });
        let msg = *failed.unwrap_err().downcast::<String>().unwrap();
        assert_eq!(msg, "CI=true: t must not skip here: no GSO");
        assert!(!path.exists(), "a failure is not counted as a skip");
    }
}
