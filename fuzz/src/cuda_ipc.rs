//! Fuzz target over the cuda-ipc transport's descriptor decoder (a file of
//! its own: see the crate docs for why each plugin's targets are apart).
//! Decoding needs no GPU.

use shardport_abi::ErrorKind;
use shardport_cuda_ipc::descriptor::{check_board_name, Descriptor};

/// A fuzz target: its name (binary and corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// The targets of this file.
pub const TARGETS: &[Target] = &[("descriptor_cuda_ipc", descriptor_cuda_ipc)];

/// CRC-32C (Castagnoli, reflected), bit by bit: slow, short, and
/// independent of the plugin's own checksum code.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Overwrites the last 4 bytes with the CRC-32C of the others.
pub fn seal(bytes: &mut [u8]) {
    if let Some(body) = bytes.len().checked_sub(4) {
        let crc = crc32c(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Once as given and once with the checksum recomputed (so the field
/// checks see fuzzed fields): an accepted descriptor's shard lies inside
/// its allocation, its board name is valid, and it re-encodes to exactly
/// the input; a refusal is `INVALID_DESCRIPTOR`.
pub fn descriptor_cuda_ipc(data: &[u8]) {
    let mut sealed = data.to_vec();
    seal(&mut sealed);
    for input in [data, &sealed[..]] {
        match Descriptor::decode(input) {
            Ok(d) => {
                let end = d
                    .offset
                    .checked_add(d.size)
                    .expect("offset + size overflows");
                assert!(end <= d.alloc_size, "shard outside its allocation");
                assert!(check_board_name(&d.board).is_ok());
                assert_eq!(
                    d.encode(),
                    input,
                    "re-encoding differs from the accepted input"
                );
            }
            Err(e) => assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{}", e.message),
        }
    }
}
