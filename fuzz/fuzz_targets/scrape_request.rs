//! Fuzz target: `ferry_engine::fuzzing::scrape_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_engine::fuzzing::scrape_request(data));
