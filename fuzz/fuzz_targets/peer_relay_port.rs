//! Fuzz target: `ferry_udp::fuzzing::peer_relay_port`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_udp::fuzzing::peer_relay_port(data));
