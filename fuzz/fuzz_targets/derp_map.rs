//! Fuzz target: `ferry_proto::fuzzing::derp_map`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::derp_map(data));
