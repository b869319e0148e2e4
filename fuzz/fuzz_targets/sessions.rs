//! Fuzz target: `ferry_udp::fuzzing::sessions`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_udp::fuzzing::sessions(data));
