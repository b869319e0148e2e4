//! Fuzz target: `ferry_relay::fuzzing::server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_relay::fuzzing::server(data));
