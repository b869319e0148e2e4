//! Replays the `paths` fuzz corpus through `ferry_client::fuzzing`, then
//! a bounded number of mutated seeds and random operation sequences (from a
//! fixed seed, so a failure reproduces), so the ordinary test suite catches
//! regressions the fuzzer would.

use ferry_testkit::corpus;

use ferry_client::fuzzing;

#[test]
fn replay_corpus() {
    corpus::replay("paths", fuzzing::paths);
}

#[test]
fn mutated_and_random_paths_inputs() {
    corpus::mutate_ops("paths", fuzzing::paths, 0x5041_5448, 600, 1);
}
