//! Fuzz target over the posix-shm transport's descriptor decoder (a file of
//! its own: see the crate docs for why each plugin's targets are apart).

use shardport_abi::{AbiError, ErrorKind};

/// A fuzz target: its name (binary and corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// The targets of this file.
pub const TARGETS: &[Target] = &[("descriptor_posix_shm", descriptor_posix_shm)];

/// The segment prefix the consumer is configured with (the default).
pub const PREFIX: &str = "shardport";

fn assert_invalid_descriptor(e: &AbiError) {
    assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{}", e.message);
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// An accepted descriptor re-encodes to exactly the input (the format is
/// canonical) and its `offset + len` does not overflow; a refusal is
/// `INVALID_DESCRIPTOR`.
pub fn descriptor_posix_shm(data: &[u8]) {
    match shardport_posix_shm::fuzzing::descriptor_roundtrip(data, PREFIX) {
        Ok(bytes) => {
            assert_eq!(bytes, data, "re-encoding differs from the accepted input");
            assert!(le_u64(data, 8).checked_add(le_u64(data, 16)).is_some());
        }
        Err(e) => assert_invalid_descriptor(&e),
    }
}
