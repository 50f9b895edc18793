#![no_main]
//! Fuzz target `weights_manifest`: see `shardport_fuzz::weights_manifest` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| shardport_fuzz::weights_manifest(data));
