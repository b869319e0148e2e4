//! Entry points for fuzzing the DERP server's own TLS 1.3 record layer
//! ([`tls_records`]) and the `/debug/clients/` query parser
//! ([`debug_clients_query`]); the DERP protocol state of a connection,
//! `ferry_proto::server`, has its `server` target in `ferry_proto::fuzzing`.
//!
//! Each function takes arbitrary bytes, drives the real code with them
//! and panics when an invariant breaks. The targets of the same names in
//! `fuzz/` call them, and `tests/fuzz_corpus.rs` replays the committed
//! corpora (`fuzz/corpus/<target>/`) and a bounded number of mutations of
//! them through the same functions, so the ordinary test suite checks
//! what the fuzzer checks.

mod records;

pub use records::tls_records;

/// Parses `data` (as text, lossily) as a `/debug/clients/` query: never a
/// panic, the limit within 1 ..= 1000, a tie-break only with a cursor and
/// not for the conn sort, and the same answer twice.
pub fn debug_clients_query(data: &[u8]) {
    use crate::debug_clients::query::{self, SortBy, MAX_LIMIT};
    let raw = String::from_utf8_lossy(data);
    let got = query::parse(&raw, 1_700_000_000_000_000_000);
    if let Ok(Some(q)) = &got {
        assert!((1..=MAX_LIMIT).contains(&q.limit), "limit {}", q.limit);
        if q.after_conn.is_some() {
            assert!(q.after.is_some() && q.sort != SortBy::Conn, "{q:?}");
        }
    }
    assert_eq!(query::parse(&raw, 1_700_000_000_000_000_000), got);
}

use ferry_proto::fuzzing::{chunks, max_chunk, XorShift};
