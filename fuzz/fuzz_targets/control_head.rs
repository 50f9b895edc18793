#![no_main]
//! Fuzz target `control_head`: see `shardport_fuzz::control_head` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardport_fuzz::control_head(data));
