//! Replays the `tls_records` fuzz corpus through `ferry_derp::fuzzing`,
//! then a bounded number of mutated seeds (from a fixed seed, so a failure
//! reproduces), so the ordinary test suite catches regressions the fuzzer
//! would. (The `server` target drives `ferry_proto::server` and is
//! replayed by ferry-proto's tests.)

use ferry_testkit::corpus;

use ferry_derp::fuzzing;

#[test]
fn replay_corpora() {
    corpus::replay("tls_records", fuzzing::tls_records);
}

#[test]
fn mutated_tls_records_inputs() {
    corpus::mutate_bytes("tls_records", fuzzing::tls_records, 0x544c_5352, 400);
}
