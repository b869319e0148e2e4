# Formatting, lints, and every Rust test: unit, integration, fuzz-corpus replay.
set -euo pipefail
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
