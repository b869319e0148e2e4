//! Test support shared by Ferry's crates (not published).
//!
//! - [`derp`]: a blocking DERP client (`ferry_proto::client` over a plain
//!   or TLS socket) with bounded reads, and dialing helpers.
//! - [`tls`]: a certificate verifier for self-signed test servers whose
//!   chain check is the test's (accept any, or match a pin).
//! - [`alloc`]: the counting global allocator for no-allocation tests (it
//!   lives in `ferry-sys`, where unsafe code is allowed; re-exported here).
//! - [`wait`]: waiting for a condition, bounded in time.
//! - [`http`]: plain HTTP requests.
//! - [`metrics`]: reading metrics, where a missing series is an error.
//! - [`skip`](mod@skip): skipping a test visibly, and failing instead under CI.
//! - [`backend`]: the I/O back end of the relays a test starts, per back
//!   end or chosen by `FERRY_TEST_IO`, and the check that they run on it.
//! - [`netns`]: a network namespace the test makes, with the loopback MTU
//!   it needs, and running code inside it.
//! - [`derper`]: Tailscale's `derper` as a child process (the one
//!   launcher), [`certs`]: a test CA and a `localhost` certificate both
//!   DERP servers read, [`tempdir`]: a directory removed on drop.
//! - [`corpus`]: the committed fuzz corpora, replayed and mutated by each
//!   crate's `fuzz_corpus` test.
//! - [`udp`]: sending a burst of datagrams in `sendmmsg` calls, the mix
//!   of sizes that tests a path against its MTU, and a relay session
//!   straight from the session table.

pub mod backend;
pub mod certs;
pub mod corpus;
pub mod derp;
pub mod derper;
pub mod http;
pub mod metrics;
pub mod netns;
pub mod skip;
pub mod tempdir;
pub mod tls;
pub mod udp;
pub mod wait;

pub use ferry_sys::alloc_count as alloc;
pub use tempdir::TempDir;

/// The workspace's root directory (where `docs/`, `fuzz/`, `interop/` and
/// `packaging/` are), for tests that read the repository's own files.
pub fn workspace_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", here.display()))
}

/// The text of the repository file at `rel` (a path from the workspace
/// root); panics naming the file if it cannot be read.
pub fn repo_file(rel: &str) -> String {
    let path = workspace_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
