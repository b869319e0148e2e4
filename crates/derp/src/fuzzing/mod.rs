//! Entry points for fuzzing the relay's sans-IO parts: the DERP server
//! session of one connection ([`server`]) and Ferry's own TLS 1.3 record
//! layer ([`tls_records`]).
//!
//! Each function takes arbitrary bytes, drives the real code with them and
//! panics when an invariant breaks. The `server` and `tls_records` targets
//! in `fuzz/` call them, and `tests/fuzz_corpus.rs` replays the committed
//! corpora (`fuzz/corpus/<target>/`) and a bounded number of mutations of
//! them through the same functions, so the ordinary test suite checks what
//! the fuzzer checks.

mod records;
mod server;

pub use records::tls_records;
pub use server::server;

use ferry_proto::fuzzing::{chunks, max_chunk, XorShift};
