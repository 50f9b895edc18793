#![no_main]
//! Fuzz target `descriptor_http`: see `src/http.rs` for what it asserts.

// The file holds every target over one plugin; this binary runs one.
#[allow(dead_code)]
#[path = "../src/http.rs"]
mod http;

libfuzzer_sys::fuzz_target!(|data: &[u8]| http::descriptor_http(data));
