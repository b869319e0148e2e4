//! Fuzz target: `ferry_proto::fuzzing::peer_relay_bind`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_proto::fuzzing::peer_relay_bind(data));
