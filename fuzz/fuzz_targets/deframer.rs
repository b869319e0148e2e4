//! Fuzz target: `ferry_proto::fuzzing::deframer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::deframer(data));
