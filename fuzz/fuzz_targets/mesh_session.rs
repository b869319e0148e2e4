//! Fuzz target: `ferry_proto::fuzzing::mesh_session`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::mesh_session(data));
