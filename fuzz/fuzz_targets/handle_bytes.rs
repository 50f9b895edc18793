#![no_main]
//! Fuzz target `handle_bytes`: see `shardport_fuzz::handle_bytes` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardport_fuzz::handle_bytes(data));
