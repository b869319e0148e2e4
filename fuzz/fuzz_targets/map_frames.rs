//! Fuzz target: `ferry_proto::fuzzing::map_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::map_frames(data));
