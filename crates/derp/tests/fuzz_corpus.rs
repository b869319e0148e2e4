//! Replays the `tls_records` and `debug_clients_query` fuzz corpora through `ferry_derp::fuzzing`,
//! then a bounded number of mutated seeds (from a fixed seed, so a failure
//! reproduces), so the ordinary test suite catches regressions the fuzzer
//! would. (The `server` target drives `ferry_proto::server` and is
//! replayed by ferry-proto's tests.)

use ferry_testkit::corpus;

use ferry_derp::fuzzing;

#[test]
fn replay_corpora() {
    corpus::replay("tls_records", fuzzing::tls_records);
    corpus::replay("debug_clients_query", fuzzing::debug_clients_query);
}

#[test]
fn mutated_debug_clients_queries() {
    corpus::mutate_bytes(
        "debug_clients_query",
        fuzzing::debug_clients_query,
        0x4443_4c51,
        400,
    );
}

#[test]
fn mutated_tls_records_inputs() {
    corpus::mutate_bytes("tls_records", fuzzing::tls_records, 0x544c_5352, 400);
}
