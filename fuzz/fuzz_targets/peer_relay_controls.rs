//! Fuzz target: `ferry_udp::fuzzing::peer_relay_controls`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_udp::fuzzing::peer_relay_controls(data));
