//! Replays the `scrape_request` fuzz corpus through
//! `ferry_engine::fuzzing`, then a bounded number of mutated seeds (from a
//! fixed seed, so a failure reproduces), so the ordinary test suite
//! catches regressions the fuzzer would.

use ferry_testkit::corpus;

use ferry_engine::fuzzing;

#[test]
fn replay_corpus() {
    corpus::replay("scrape_request", fuzzing::scrape_request);
}

#[test]
fn mutated_scrape_requests() {
    corpus::mutate_bytes("scrape_request", fuzzing::scrape_request, 0x5343_5250, 2000);
}
