# Formatting, lints, docs, and every Rust test: unit, integration, fuzz-corpus
# replay; the fuzz targets type-checked; the doorbell's loom model.
set -euo pipefail
. scripts/lib/expect.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# API docs build without broken links.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# The SDK's public API against its last release tag (cargo-semver-checks,
# .ci/setup.d/10-semver-checks.sh); skipped, saying so, until one exists.
tag=$(git tag -l 'ferry-client-v*' --sort=-v:refname | head -n 1); if [ -n "$tag" ]; then cargo semver-checks -p ferry-client --baseline-rev "$tag"; else echo "cargo semver-checks: skipped: no ferry-client release tag yet (the first release is the baseline)"; fi
# derper, the reference server of the SDK's, `ferry link`'s and the relay
# sessions' tests (interop/bin/derper): set-up builds it
# (.ci/setup.d/10-derper.sh); so does this step when it is missing or
# stale and Go is here (the script does nothing when derper is up to
# date), rather than leave those tests to skip until a later step builds
# it. Without Go they skip, each listed after the step.
if command -v go >/dev/null; then
  bash .ci/setup.d/10-derper.sh
else
  echo "no Go here: derper is not built, and the tests against it skip"
fi
# Every test, on the default I/O back end (io_uring where the kernel allows
# it). The engine's and the relay's tests are compiled once per back end,
# so this runs them on both; the binary's and the SDK's, whose relays are
# `ferry` processes or started deep in shared helpers, run again on epoll
# in 15-uring.sh (FERRY_TEST_IO=epoll). Each relay they start checks the
# back end it got; FERRY_BACKEND_LOG collects them (shown after the step).
cargo test --workspace --locked
# The fuzz targets (their own workspace under fuzz/, built by cargo fuzz on
# nightly) must keep compiling: type-check and lint them on stable, without
# building libFuzzer itself (about 25 s cold).
cargo clippy --manifest-path fuzz/Cargo.toml --bins --locked --no-default-features -- -D warnings
# The cross-shard doorbell's loom model. --cfg loom rebuilds every crate, so
# it gets its own target directory and leaves the main build alone (about
# 70 s cold, 10 s warm). Selected by target name: at least one model must
# pass (a model compiled out would pass with 0).
expect_run_libtest 1 env RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p ferry-engine --release --locked --test loom_doorbell
