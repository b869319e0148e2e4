//! Replays the `server` and `tls_records` fuzz corpora through
//! `ferry_derp::fuzzing`, then a bounded number of mutated seeds (from a
//! fixed seed, so a failure reproduces), so the ordinary test suite
//! catches regressions the fuzzer would.

use ferry_testkit::corpus;

use ferry_derp::fuzzing;

#[test]
fn replay_corpora() {
    corpus::replay("server", fuzzing::server);
    corpus::replay("tls_records", fuzzing::tls_records);
}

#[test]
fn mutated_server_inputs() {
    corpus::mutate_bytes("server", fuzzing::server, 0x5345_5256, 400);
}

#[test]
fn mutated_tls_records_inputs() {
    corpus::mutate_bytes("tls_records", fuzzing::tls_records, 0x544c_5352, 400);
}
