//! Fuzz target: `ferry_client::fuzzing::paths`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_client::fuzzing::paths(data));
