#![no_main]
//! Fuzz target `snapshot_json`: see `shardport_fuzz::snapshot_json` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardport_fuzz::snapshot_json(data));
