//! The descriptor: what an owner's `export` returns and a consumer's
//! `import_*` reads. Versioned, little-endian, ends in a CRC-32C:
//!
//! ```text
//! offset size field
//!      0    4 magic "SPCU"
//!      4    1 version (1)
//!      5    3 reserved, zero
//!      8   16 owner boot id (the UUID in /proc/sys/kernel/random/boot_id)
//!     24    4 owner pid (non-zero)
//!     28    4 reserved, zero
//!     32    8 owner epoch: a value unique to the owner transport instance
//!     40    8 allocation generation: the owner's CUDA buffer id of the
//!             allocation (never reused within the owner process, non-zero)
//!     48   16 device UUID (non-zero)
//!     64   64 IPC memory handle of the WHOLE allocation
//!    128    8 allocation size (non-zero)
//!    136    8 offset of the shard in the allocation
//!    144    8 shard size (offset + size <= allocation size)
//!    152   64 IPC event handle, recorded after the producer's writes
//!    216    4 lease slot on the owner's board
//!    220    8 lease slot generation (non-zero)
//!    228    1 board name length N (1..=MAX_BOARD_NAME), then N bytes of
//!             name: `/shardport-cuda-` followed by [a-z0-9-]
//!  229+N    4 CRC-32C of every byte before it
//! ```
//!
//! Version 2 describes VMM memory (shared as file descriptors, see
//! `fdpass`): the same fields, with a zero memory handle, the allocation
//! size the sum of the chunks, the offset from the first chunk's base and
//! the generation a serial unique in the owner process; after the board
//! name:
//!
//! ```text
//!    229+N    4 chunk count C (1..=MAX_CHUNKS)
//!    233+N  8*C size of each chunk, in address order (non-zero)
//! ```
//!
//! then the CRC-32C. Memory legacy IPC can share is always described by a
//! version-1 descriptor, so consumers of either version read it.
//!
//! Nothing may follow. Every failure is `INVALID_DESCRIPTOR` with a message
//! naming the field (the checksum is checked first, so a damaged descriptor
//! is reported as damaged rather than as a strange field).

use shardport_abi::{AbiError, PluginResult};
use shardport_kit::codec::{self, Reader, Writer};

use crate::sys::{IPC_HANDLE_LEN, MAX_CHUNKS};

/// Identifies a cuda-ipc descriptor.
pub const MAGIC: [u8; 4] = *b"SPCU";
/// Format version of legacy-IPC descriptors.
pub const VERSION: u8 = 1;
/// Format version of VMM descriptors (chunk sizes after the board name).
pub const VERSION_VMM: u8 = 2;
/// Prefix of every lease board name.
pub const BOARD_PREFIX: &str = "/shardport-cuda-";
/// Longest board name (NAME_MAX-safe, and small enough for a handle).
pub const MAX_BOARD_NAME: usize = 96;
const FIXED_LEN: usize = 229;
const CRC_LEN: usize = 4;

/// A decoded descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Owner's boot id.
    pub boot_id: [u8; 16],
    /// Owner's pid.
    pub pid: u32,
    /// Owner transport instance epoch.
    pub epoch: u64,
    /// Owner's buffer id of the allocation (allocation generation).
    pub generation: u64,
    /// GPU UUID of the allocation's device.
    pub device_uuid: [u8; 16],
    /// IPC handle of the whole allocation.
    pub mem_handle: [u8; IPC_HANDLE_LEN],
    /// Size of the whole allocation.
    pub alloc_size: u64,
    /// Shard offset in the allocation.
    pub offset: u64,
    /// Shard size.
    pub size: u64,
    /// IPC handle of the event recorded after the producer's writes.
    pub event_handle: [u8; IPC_HANDLE_LEN],
    /// Lease slot on the owner's board.
    pub slot: u32,
    /// Generation of that slot.
    pub slot_generation: u64,
    /// The owner's lease board name.
    pub board: String,
    /// VMM memory: the size of each physical chunk, in address order (their
    /// descriptors come from the owner's socket). Empty for legacy IPC.
    pub chunks: Vec<u64>,
}

impl Descriptor {
    /// True for VMM memory (version 2).
    pub fn is_vmm(&self) -> bool {
        !self.chunks.is_empty()
    }
}

/// What errors call this format.
const WHAT: &str = "cuda-ipc descriptor";

fn bad(field: &str, why: impl std::fmt::Display) -> AbiError {
    codec::invalid(WHAT, field, why)
}

/// Checks a board name: the prefix, then `[a-z0-9-]`, at most [`MAX_BOARD_NAME`].
pub fn check_board_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_BOARD_NAME {
        return Err(format!("{} bytes, at most {MAX_BOARD_NAME}", name.len()));
    }
    let Some(rest) = name.strip_prefix(BOARD_PREFIX) else {
        return Err(format!("{name:?} does not start with {BOARD_PREFIX:?}"));
    };
    if rest.is_empty()
        || !rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "{name:?}: after the prefix, expected one or more of [a-z0-9-]"
        ));
    }
    Ok(())
}

impl Descriptor {
    /// Serialises the descriptor.
    ///
    /// # Panics
    /// When `board` is not a valid board name (a bug in the owner).
    pub fn encode(&self) -> Vec<u8> {
        check_board_name(&self.board).expect("owner board names are valid");
        let mut w = Writer::with_capacity(
            FIXED_LEN + self.board.len() + 4 + 8 * self.chunks.len() + CRC_LEN,
        );
        let version = if self.is_vmm() { VERSION_VMM } else { VERSION };
        w.bytes(&MAGIC)
            .u8(version)
            .zeros(3)
            .bytes(&self.boot_id)
            .u32(self.pid)
            .zeros(4)
            .u64(self.epoch)
            .u64(self.generation)
            .bytes(&self.device_uuid)
            .bytes(&self.mem_handle)
            .u64(self.alloc_size)
            .u64(self.offset)
            .u64(self.size)
            .bytes(&self.event_handle)
            .u32(self.slot)
            .u64(self.slot_generation);
        debug_assert_eq!(w.len(), FIXED_LEN - 1);
        w.short_str(&self.board);
        if self.is_vmm() {
            w.u32(self.chunks.len() as u32);
            for c in &self.chunks {
                w.u64(*c);
            }
        }
        let crc = crc32c::crc32c(w.as_slice());
        w.u32(crc).finish()
    }

    /// Parses and checks a descriptor from another process.
    pub fn decode(bytes: &[u8]) -> PluginResult<Descriptor> {
        if bytes.len() < FIXED_LEN + 1 + CRC_LEN {
            return Err(bad(
                "length",
                format!(
                    "truncated: {} bytes, a descriptor has at least {}",
                    bytes.len(),
                    FIXED_LEN + 1 + CRC_LEN
                ),
            ));
        }
        let mut r = Reader::new(WHAT, bytes);
        r.magic("magic", &MAGIC)?;
        let version = r.u8("version")?;
        if version != VERSION && version != VERSION_VMM {
            return Err(r.error_at(
                "version",
                MAGIC.len(),
                format_args!(
                    "this plugin reads versions {VERSION} and {VERSION_VMM}, found {version}"
                ),
            ));
        }
        let vmm = version == VERSION_VMM;
        let stored = r.trailer(CRC_LEN, "checksum")?;
        let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
        let computed = crc32c::crc32c(r.body());
        if stored != computed {
            return Err(bad(
                "checksum",
                format!("damaged: stored CRC-32C {stored:#010x}, computed {computed:#010x}"),
            ));
        }
        r.zeros(3, "reserved")?;
        let boot_id = r.array::<16>("owner boot id")?;
        if boot_id == [0; 16] {
            return Err(bad("owner boot id", "zero (unknown)"));
        }
        let pid = r.u32("owner pid")?;
        if pid == 0 {
            return Err(bad("owner pid", "zero"));
        }
        r.zeros(4, "reserved")?;
        let epoch = r.u64("owner epoch")?;
        let generation = r.u64("allocation generation")?;
        if generation == 0 {
            return Err(bad("allocation generation", "zero"));
        }
        let device_uuid = r.array::<16>("device uuid")?;
        if device_uuid == [0; 16] {
            return Err(bad("device uuid", "zero"));
        }
        let mem_handle = r.array::<IPC_HANDLE_LEN>("memory handle")?;
        if vmm && mem_handle != [0; IPC_HANDLE_LEN] {
            return Err(bad("memory handle", "not zero in a VMM descriptor"));
        }
        let alloc_size = r.u64("allocation size")?;
        if alloc_size == 0 {
            return Err(bad("allocation size", "zero"));
        }
        let offset = r.u64("offset")?;
        let size = r.u64("size")?;
        match offset.checked_add(size) {
            Some(end) if end <= alloc_size => {}
            _ => {
                return Err(bad(
                    "size",
                    format!(
                    "offset {offset} + size {size} is outside the allocation of {alloc_size} bytes"
                ),
                ))
            }
        }
        let event_handle = r.array::<IPC_HANDLE_LEN>("event handle")?;
        let slot = r.u32("lease slot")?;
        let slot_generation = r.u64("lease slot generation")?;
        if slot_generation == 0 {
            return Err(bad("lease slot generation", "zero"));
        }
        let n = r.u8("board name length")? as usize;
        if n == 0 || n > MAX_BOARD_NAME {
            return Err(bad(
                "board name length",
                format!("{n}, expected 1..={MAX_BOARD_NAME}"),
            ));
        }
        let name = r.take(n, "board name")?;
        let board = std::str::from_utf8(name)
            .map_err(|_| bad("board name", "not UTF-8"))?
            .to_owned();
        check_board_name(&board).map_err(|why| bad("board name", why))?;
        let chunks = if vmm {
            read_chunks(&mut r, alloc_size)?
        } else {
            Vec::new()
        };
        if r.remaining() != 0 {
            return Err(bad(
                "length",
                format!("{} unexpected bytes after the board name", r.remaining()),
            ));
        }
        Ok(Descriptor {
            boot_id,
            pid,
            epoch,
            generation,
            device_uuid,
            mem_handle,
            alloc_size,
            offset,
            size,
            event_handle,
            slot,
            slot_generation,
            board,
            chunks,
        })
    }
}

/// The chunk list of a VMM descriptor: a count, then that many non-zero
/// sizes summing to the allocation size.
fn read_chunks(r: &mut Reader<'_>, alloc_size: u64) -> PluginResult<Vec<u64>> {
    let n = r.u32("chunk count")? as usize;
    if n == 0 || n > MAX_CHUNKS {
        return Err(bad(
            "chunk count",
            format!("{n}, expected 1..={MAX_CHUNKS}"),
        ));
    }
    if r.remaining() < n * 8 {
        return Err(bad(
            "chunk sizes",
            format!(
                "truncated: {n} chunks need {} bytes, {} left",
                n * 8,
                r.remaining()
            ),
        ));
    }
    let mut chunks = Vec::with_capacity(n);
    let mut total: u64 = 0;
    for _ in 0..n {
        let c = r.u64("chunk size")?;
        if c == 0 {
            return Err(bad("chunk size", "zero"));
        }
        total = total
            .checked_add(c)
            .ok_or_else(|| bad("chunk sizes", "their sum overflows"))?;
        chunks.push(c);
    }
    if total != alloc_size {
        return Err(bad(
            "chunk sizes",
            format!("they sum to {total} bytes, the allocation size says {alloc_size}"),
        ));
    }
    Ok(chunks)
}

/// Formats a GPU UUID the way `nvidia-smi` does (`GPU-xxxxxxxx-xxxx-...`).
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    pub(crate) fn sample() -> Descriptor {
        Descriptor {
            boot_id: [7; 16],
            pid: 4242,
            epoch: 99,
            generation: 5,
            device_uuid: [0xab; 16],
            mem_handle: [3; IPC_HANDLE_LEN],
            alloc_size: 1 << 20,
            offset: 4096,
            size: 1000,
            event_handle: [9; IPC_HANDLE_LEN],
            slot: 17,
            slot_generation: 2,
            board: "/shardport-cuda-t1-2-abc".to_owned(),
            chunks: Vec::new(),
        }
    }

    fn vmm_sample() -> Descriptor {
        Descriptor {
            mem_handle: [0; IPC_HANDLE_LEN],
            alloc_size: 3 << 20,
            chunks: vec![1 << 20, 2 << 20],
            ..sample()
        }
    }

    #[test]
    fn vmm_roundtrip_is_version_2_and_legacy_stays_version_1() {
        let d = vmm_sample();
        let bytes = d.encode();
        assert_eq!(bytes[4], VERSION_VMM);
        assert_eq!(Descriptor::decode(&bytes).unwrap(), d);
        assert_eq!(sample().encode()[4], VERSION);
    }

    #[test]
    fn vmm_chunk_fields_are_checked() {
        let d = vmm_sample();
        let base = d.encode().len() - CRC_LEN - 4 - 16;
        // Sizes that do not sum to the allocation size.
        let e = msg(Descriptor::decode(&with_body(&d, |v| v[base + 4] = 1)).unwrap_err());
        assert!(e.contains("chunk sizes") && e.contains("sum"), "{e}");
        // A zero count.
        let e = msg(Descriptor::decode(&with_body(&d, |v| {
            v[base..base + 4].copy_from_slice(&[0; 4])
        }))
        .unwrap_err());
        assert!(e.contains("chunk count"), "{e}");
        // A count larger than what follows.
        let e = msg(Descriptor::decode(&with_body(&d, |v| v[base] = 9)).unwrap_err());
        assert!(e.contains("chunk sizes") && e.contains("truncated"), "{e}");
        // A non-zero memory handle in a VMM descriptor.
        let mut bad = d.clone();
        bad.mem_handle = [1; IPC_HANDLE_LEN];
        let e = msg(Descriptor::decode(&bad.encode()).unwrap_err());
        assert!(e.contains("memory handle"), "{e}");
        // A legacy descriptor with chunks appended is refused as too long.
        let e = msg(Descriptor::decode(&with_body(&sample(), |v| {
            v.extend_from_slice(&[1, 0, 0, 0])
        }))
        .unwrap_err());
        assert!(e.contains("unexpected bytes"), "{e}");
    }

    fn msg(e: AbiError) -> String {
        assert_eq!(
            e.kind,
            shardport_abi::ErrorKind::INVALID_DESCRIPTOR,
            "{e:?}"
        );
        e.message.to_string()
    }

    /// Re-encodes with a fresh CRC after `f` edits the body, so field checks
    /// (not the checksum) are what refuse it.
    fn with_body(d: &Descriptor, f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut v = d.encode();
        v.truncate(v.len() - CRC_LEN);
        f(&mut v);
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    #[test]
    fn roundtrip() {
        let d = sample();
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
    }

    /// The layout in the module doc, byte for byte: descriptors already in
    /// flight keep decoding.
    #[test]
    fn wire_format_is_unchanged() {
        let d = sample();
        let mut want = b"SPCU\x01\0\0\0".to_vec();
        want.extend_from_slice(&d.boot_id);
        want.extend_from_slice(&d.pid.to_le_bytes());
        want.extend_from_slice(&[0; 4]);
        want.extend_from_slice(&d.epoch.to_le_bytes());
        want.extend_from_slice(&d.generation.to_le_bytes());
        want.extend_from_slice(&d.device_uuid);
        want.extend_from_slice(&d.mem_handle);
        want.extend_from_slice(&d.alloc_size.to_le_bytes());
        want.extend_from_slice(&d.offset.to_le_bytes());
        want.extend_from_slice(&d.size.to_le_bytes());
        want.extend_from_slice(&d.event_handle);
        want.extend_from_slice(&d.slot.to_le_bytes());
        want.extend_from_slice(&d.slot_generation.to_le_bytes());
        assert_eq!(want.len(), 228);
        want.push(d.board.len() as u8);
        want.extend_from_slice(d.board.as_bytes());
        let crc = crc32c::crc32c(&want);
        want.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(d.encode(), want);
        assert_eq!(Descriptor::decode(&want).unwrap(), d);
    }

    #[test]
    fn field_errors_name_the_field() {
        let d = sample();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (with_body(&d, |v| v[5] = 1), "`reserved`"),
            (with_body(&d, |v| v[8..24].fill(0)), "`owner boot id`"),
            (with_body(&d, |v| v[24..28].fill(0)), "`owner pid`"),
            (
                with_body(&d, |v| v[40..48].fill(0)),
                "`allocation generation`",
            ),
            (with_body(&d, |v| v[48..64].fill(0)), "`device uuid`"),
            (with_body(&d, |v| v[128..136].fill(0)), "`allocation size`"),
            (
                with_body(&d, |v| {
                    v[136..144].copy_from_slice(&(1u64 << 20).to_le_bytes())
                }),
                "`size`",
            ),
            (
                with_body(&d, |v| v[144..152].copy_from_slice(&u64::MAX.to_le_bytes())),
                "`size`",
            ),
            (
                with_body(&d, |v| v[220..228].fill(0)),
                "`lease slot generation`",
            ),
            (with_body(&d, |v| v[228] = 0), "`board name length`"),
            (with_body(&d, |v| v[229] = b'x'), "`board name`"),
            (with_body(&d, |v| v.push(0)), "`length`"),
            (
                with_body(&d, |v| v.pop().map(|_| ()).unwrap()),
                "`board name`",
            ),
        ];
        for (bytes, field) in cases {
            let m = msg(Descriptor::decode(&bytes).unwrap_err());
            assert!(m.contains(field), "expected {field} in {m:?}");
        }
    }

    #[test]
    fn damage_is_reported_as_checksum() {
        let mut v = sample().encode();
        v[100] ^= 1;
        assert!(msg(Descriptor::decode(&v).unwrap_err()).contains("`checksum`"));
        let mut v = sample().encode();
        v[0] = b'X';
        assert!(msg(Descriptor::decode(&v).unwrap_err()).contains("`magic`"));
        let mut v = sample().encode();
        v[4] = 3;
        assert!(msg(Descriptor::decode(&v).unwrap_err())
            .contains("this plugin reads versions 1 and 2, found 3"));
    }

    #[test]
    fn board_names() {
        assert!(check_board_name("/shardport-cuda-abc-1").is_ok());
        assert!(check_board_name("/shardport-cuda-").is_err());
        assert!(check_board_name("/shardport-cuda-A").is_err());
        assert!(check_board_name("/shardport-cuda-../x").is_err());
        assert!(check_board_name("/other-abc").is_err());
    }

    #[test]
    fn boot_ids_and_uuids() {
        // Boot ids travel as the kit's number, in text order.
        let b =
            shardport_kit::lease::liveness::parse_boot_id("0123abcd-0000-1111-2222-333344445555\n")
                .unwrap()
                .to_be_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[15], 0x55);
        assert_eq!(
            format_uuid(&[0xab; 16]),
            "GPU-abababab-abab-abab-abab-abababababab"
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_and_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let e = Descriptor::decode(&bytes).unwrap_err();
            prop_assert_eq!(e.kind, shardport_abi::ErrorKind::INVALID_DESCRIPTOR);
            prop_assert!(e.message.starts_with("cuda-ipc descriptor field `"));
        }

        #[test]
        fn truncations_are_refused(cut in 0usize..260) {
            let v = sample().encode();
            let cut = cut.min(v.len() - 1);
            let e = Descriptor::decode(&v[..cut]).unwrap_err();
            prop_assert_eq!(e.kind, shardport_abi::ErrorKind::INVALID_DESCRIPTOR);
        }

        #[test]
        fn mutations_are_refused_or_exact(pos in 0usize..260, xor in 1u8..=255) {
            let d = sample();
            let mut v = d.encode();
            let pos = pos % v.len();
            v[pos] ^= xor;
            // Any change to a byte is caught (CRC-32C detects every error
            // burst of up to 32 bits); the decoder never panics.
            prop_assert!(Descriptor::decode(&v).is_err());
        }

        #[test]
        fn valid_field_values_roundtrip(
            offset in 0u64..1 << 30, size in 0u64..1 << 30, pid in 1u32.., slot in any::<u32>(),
            generation in 1u64.., tag in "[a-z0-9-]{1,60}",
        ) {
            let d = Descriptor {
                alloc_size: offset + size + 1,
                offset, size, pid, slot, generation,
                board: format!("{BOARD_PREFIX}{tag}"),
                ..sample()
            };
            prop_assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        }
    }
}
