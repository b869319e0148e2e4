//! Replays the `hub`, `sessions`, `peer_relay_port` and `peer_relay_controls`
//! fuzz corpora through
//! `ferry_udp::fuzzing`, then a bounded number of mutated seeds and random
//! operation sequences (from a fixed seed, so a failure reproduces), so the
//! ordinary test suite catches regressions the fuzzer would.

use ferry_testkit::corpus;

use ferry_udp::fuzzing;

#[test]
fn replay_corpora() {
    corpus::replay("hub", fuzzing::hub);
    corpus::replay("sessions", fuzzing::sessions);
    corpus::replay("peer_relay_port", fuzzing::peer_relay_port);
    corpus::replay("peer_relay_controls", fuzzing::peer_relay_controls);
}

#[test]
fn mutated_and_random_hub_inputs() {
    // A configuration byte, then operations.
    corpus::mutate_ops("hub", fuzzing::hub, 0x4855_4246, 1000, 1);
}

#[test]
fn mutated_and_random_sessions_inputs() {
    corpus::mutate_ops("sessions", fuzzing::sessions, 0x5345_5353, 1000, 0);
}

#[test]
fn mutated_and_random_peer_relay_port_inputs() {
    corpus::mutate_ops(
        "peer_relay_port",
        fuzzing::peer_relay_port,
        0x5052_4c59,
        400,
        0,
    );
}

#[test]
fn mutated_and_random_peer_relay_controls_inputs() {
    corpus::mutate_ops(
        "peer_relay_controls",
        fuzzing::peer_relay_controls,
        0x5052_4354,
        300,
        0,
    );
}
