//! Fuzz target: `ferry_proto::fuzzing::http_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::http_request(data));
