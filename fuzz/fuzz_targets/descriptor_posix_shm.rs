#![no_main]
//! Fuzz target `descriptor_posix_shm`: see `src/posix_shm.rs` for what it asserts.

// The file holds every target over one plugin; this binary runs one.
#[allow(dead_code)]
#[path = "../src/posix_shm.rs"]
mod posix_shm;

libfuzzer_sys::fuzz_target!(|data: &[u8]| posix_shm::descriptor_posix_shm(data));
