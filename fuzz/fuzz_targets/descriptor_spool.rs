#![no_main]
//! Fuzz target `descriptor_spool`: see `src/spool.rs` for what it asserts.

// The file holds every target over one plugin; this binary runs one.
#[allow(dead_code)]
#[path = "../src/spool.rs"]
mod spool;

libfuzzer_sys::fuzz_target!(|data: &[u8]| spool::descriptor_spool(data));
