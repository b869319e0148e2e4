//! Fuzz target: `ferry_proto::fuzzing::ts2021_upgrade`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::ts2021_upgrade(data));
