//! Which I/O back end the relays a test starts run on, and the check that
//! they did (a silent fallback from io_uring to epoll fails the test).
//!
//! Two ways to choose it:
//!
//! - **Compiled per back end**: a test file lists its cases in
//!   [`per_backend!`](crate::per_backend), which makes one test per case
//!   and back end (`epoll::case`, `uring::case`); a bare `cargo test` runs
//!   both, and a name filter (`uring::`) selects one. The relay's tests do
//!   this (the engine's driver tests have their own such list).
//! - **By the harness's own variable**, [`TEST_IO`] (`FERRY_TEST_IO=uring`
//!   or `epoll`; unset for the default, `--io auto`), for the tests of the
//!   binary and of the SDK, whose relays are `ferry` processes or started
//!   deep in shared helpers. CI runs those tests once with the variable
//!   unset (the shipped default, io_uring here) and once with
//!   `FERRY_TEST_IO=epoll`. The binary never reads this variable (it maps
//!   `FERRY_<FLAG>` variables to flags, so a test harness variable named
//!   `FERRY_IO` would turn into `--io` in every `ferry` a test starts); the
//!   binary's test support also removes every `FERRY_*` and `DERP_*`
//!   variable from the processes it starts unless the test sets it.
//!
//! Every relay a helper starts is checked: the back end it reports (its
//! `I/O back end backend=…` log line, or `Metrics::backend` in-process)
//! must be the one asked for, and for the default, io_uring wherever this
//! machine has it. Each check is also appended to the file named by
//! [`BACKEND_LOG`], when set, as `<test>\t<relay>\t<back end>`, so a CI
//! step can show which back end its relays ran on.

use std::cell::Cell;

pub use ferry_engine::{Backend, IoMode};

/// The variable that selects the back end of the relays the binary's and
/// the SDK's tests start: `uring`, `epoll`, or unset (or `auto`) for the
/// default.
pub const TEST_IO: &str = "FERRY_TEST_IO";

/// The variable naming the file every back-end check is appended to.
pub const BACKEND_LOG: &str = "FERRY_BACKEND_LOG";

thread_local! {
    static CURRENT: Cell<Option<Backend>> = const { Cell::new(None) };
}

/// Both back ends.
pub const ALL: [Backend; 2] = [Backend::Epoll, Backend::Uring];

/// The back end asked for relays started on this thread: the one of the
/// per-back-end case running on it ([`run_on`]), else [`TEST_IO`]'s, else
/// `None` (the default).
pub fn requested() -> Option<Backend> {
    CURRENT.with(Cell::get).or_else(from_env)
}

/// [`TEST_IO`]'s back end; panics on a value that names none.
pub fn from_env() -> Option<Backend> {
    match std::env::var(TEST_IO).as_deref() {
        Err(_) | Ok("") | Ok("auto") => None,
        Ok("uring") => Some(Backend::Uring),
        Ok("epoll") => Some(Backend::Epoll),
        Ok(other) => panic!("{TEST_IO}={other:?}: expected uring, epoll or auto"),
    }
}

/// The mode to start an in-process relay with: [`requested`] or `auto`.
pub fn mode() -> IoMode {
    match requested() {
        None => IoMode::Auto,
        Some(Backend::Uring) => IoMode::Uring,
        Some(Backend::Epoll) => IoMode::Epoll,
    }
}

/// The back end a relay started with `mode` must run on: the one
/// demanded, or for `auto` io_uring where this machine has it (under
/// `CI=true` it must have it) and epoll elsewhere.
pub fn expected(mode: IoMode) -> Backend {
    match mode {
        IoMode::Uring => Backend::Uring,
        IoMode::Epoll => Backend::Epoll,
        IoMode::Auto => match ferry_engine::uring::probe() {
            Ok(()) => Backend::Uring,
            Err(why) if crate::skip::under_ci() => {
                panic!("CI=true: io_uring must be usable here, for the default back end: {why}")
            }
            Err(_) => Backend::Epoll,
        },
    }
}

/// Checks that `relay`, started by `test` with `mode`, runs on the back
/// end it reports (`got`, a [`Backend::name`]); panics otherwise, and
/// records the check in [`BACKEND_LOG`].
pub fn check(test: &str, relay: &str, mode: IoMode, got: &str) {
    let want = expected(mode);
    assert_eq!(
        got,
        want.name(),
        "{test}: {relay} runs on {got}, but {mode:?} must give {want} here"
    );
    if let Some(path) = std::env::var_os(BACKEND_LOG) {
        crate::skip::append_line(BACKEND_LOG, &path, &format!("{test}\t{relay}\t{got}"));
    }
}

/// Runs `case` with relays on `backend` (the thread's [`requested`] back
/// end while it runs). Where io_uring is not usable, its cases skip
/// ([`crate::skip!`]: a failure under `CI=true`).
pub fn run_on(package: &str, module_path: &str, backend: Backend, case: fn()) {
    if backend == Backend::Uring {
        if let Err(why) = ferry_engine::uring::probe() {
            let test = crate::skip::test_name(package, module_path);
            return crate::skip::skip(&test, &format!("io_uring is not usable here: {why}"));
        }
    }
    struct Reset(Option<Backend>);
    impl Drop for Reset {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(CURRENT.with(|c| c.replace(Some(backend))));
    case();
}

/// Runs `$case` on each back end in turn, in one test: for tests that
/// measure the whole process (a counting allocator, the heap in use), where
/// two cases at once would count each other.
#[macro_export]
macro_rules! on_each_backend {
    ($case:expr) => {
        for backend in $crate::backend::ALL {
            $crate::backend::run_on(env!("CARGO_PKG_NAME"), module_path!(), backend, $case);
        }
    };
}

/// One test per case and back end: `epoll::<case>` and `uring::<case>`,
/// each running the function `<case>` (no `#[test]` on it) with relays
/// on that back end ([`run_on`]).
#[macro_export]
macro_rules! per_backend {
    ($($case:ident),* $(,)?) => {
        $crate::per_backend!(@module epoll, Epoll, $($case),*);
        $crate::per_backend!(@module uring, Uring, $($case),*);
    };
    (@module $module:ident, $backend:ident, $($case:ident),*) => {
        mod $module {
            $(
                #[test]
                fn $case() {
                    $crate::backend::run_on(
                        env!("CARGO_PKG_NAME"),
                        module_path!(),
                        $crate::backend::Backend::$backend,
                        super::$case,
                    )
                }
            )*
        }
    };
}
