//! Fuzz target: `ferry_proto::fuzzing::admission_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::admission_response(data));
