# Formatting, lints, docs, and every Rust test: unit, integration, fuzz-corpus replay.
set -euo pipefail
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# API docs build without broken links.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
# On epoll: 15-uring.sh reruns the engine and relay tests on io_uring.
FERRY_IO=epoll cargo test --workspace --locked
