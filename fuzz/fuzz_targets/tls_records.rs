//! Fuzz target: `ferry_derp::fuzzing::tls_records`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_derp::fuzzing::tls_records(data));
