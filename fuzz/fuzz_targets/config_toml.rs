#![no_main]
//! Fuzz target `config_toml`: see `shardport_fuzz::config_toml` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardport_fuzz::config_toml(data));
