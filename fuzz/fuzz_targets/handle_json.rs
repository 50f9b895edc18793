#![no_main]
//! Fuzz target `handle_json`: see `shardport_fuzz::handle_json` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardport_fuzz::handle_json(data));
