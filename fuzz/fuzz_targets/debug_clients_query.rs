//! Fuzz target: `ferry_derp::fuzzing::debug_clients_query`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_derp::fuzzing::debug_clients_query(data));
