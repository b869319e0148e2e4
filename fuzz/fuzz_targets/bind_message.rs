//! Fuzz target: `ferry_proto::fuzzing::bind_message`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::bind_message(data));
