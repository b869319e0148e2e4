//! Fuzz target: `ferry_proto::fuzzing::noise_client`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::noise_client(data));
