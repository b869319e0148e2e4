//! Fuzz target: `ferry_proto::fuzzing::register_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::register_response(data));
