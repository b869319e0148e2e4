//! Fuzz target: `ferry_proto::fuzzing::early_payload`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::early_payload(data));
