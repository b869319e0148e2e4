//! Entry point for fuzzing the DERP server's own TLS 1.3 record layer
//! ([`tls_records`]); the DERP protocol state of a connection,
//! `ferry_proto::server`, has its `server` target in `ferry_proto::fuzzing`.
//!
//! The function takes arbitrary bytes, drives the real code with them and
//! panics when an invariant breaks. The `tls_records` target in `fuzz/`
//! calls it, and `tests/fuzz_corpus.rs` replays the committed corpus
//! (`fuzz/corpus/tls_records/`) and a bounded number of mutations of it
//! through the same function, so the ordinary test suite checks what the
//! fuzzer checks.

mod records;

pub use records::tls_records;

use ferry_proto::fuzzing::{chunks, max_chunk, XorShift};
