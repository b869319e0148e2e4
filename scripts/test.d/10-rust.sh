# Formatting, lints, docs, and every Rust test: unit, integration, fuzz-corpus
# replay; the fuzz targets type-checked; the doorbell's loom model.
set -euo pipefail
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# API docs build without broken links.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# On epoll: 15-uring.sh reruns the engine and relay tests on io_uring.
FERRY_IO=epoll cargo test --workspace --locked
# The fuzz targets (their own workspace under fuzz/, built by cargo fuzz on
# nightly) must keep compiling: type-check and lint them on stable, without
# building libFuzzer itself (about 25 s cold).
cargo clippy --manifest-path fuzz/Cargo.toml --bins --locked --no-default-features -- -D warnings
# The cross-shard doorbell's loom model. --cfg loom rebuilds every crate, so
# it gets its own target directory and leaves the main build alone (about
# 70 s cold, 10 s warm).
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p ferry-engine --release --locked --test loom_doorbell
