#![no_main]
//! Fuzz target `descriptor_cuda_ipc`: see `src/cuda_ipc.rs` for what it asserts.

// The file holds every target over one plugin; this binary runs one.
#[allow(dead_code)]
#[path = "../src/cuda_ipc.rs"]
mod cuda_ipc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| cuda_ipc::descriptor_cuda_ipc(data));
