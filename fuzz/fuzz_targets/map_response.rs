//! Fuzz target: `ferry_proto::fuzzing::map_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::map_response(data));
