//! The descriptor: what an owner's `export` returns and a consumer's
//! `import_*` reads. Compact, versioned, little-endian:
//!
//! ```text
//! offset size field
//!      0    4 magic "SPSM"
//!      4    1 version (1)
//!      5    1 mode: 1 pool, 2 segment (one segment per shard, or a spilled shard)
//!      6    2 reserved, zero
//!      8    8 offset of the shard in the data segment (0 in segment mode)
//!     16    8 len, the shard's byte length
//!     24    4 shard slot in the board's shard table (0 in segment mode)
//!     28    8 generation of that slot (0 in segment mode)
//!     36    1 segment name length N, then N bytes of name
//!   37+N    1 board name length M (0 in segment mode), then M bytes
//! ```
//!
//! Nothing may follow. [`Descriptor::decode`] checks the syntax and both
//! names against the consumer's own prefix; the consumer then checks `len`
//! against the shard's metadata and `offset + len` against the segment's real
//! size. Every failure is `INVALID_DESCRIPTOR` with a message naming the field.

use std::borrow::Cow;

use shardport_abi::{AbiError, PluginResult};
use shardport_kit::codec::{self, Reader, Writer};

use crate::names::{self, Kind, MAX_NAME_LEN};

/// Identifies a posix-shm descriptor.
pub(crate) const MAGIC: [u8; 4] = *b"SPSM";
/// Format version this plugin writes and reads.
pub(crate) const VERSION: u8 = 1;
const FIXED_LEN: usize = 36;

/// Where the shard's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// In the owner's pool; leases go through its board.
    Pool,
    /// In a segment of its own.
    Segment,
}

/// A decoded descriptor. The names borrow the descriptor's bytes when
/// decoded (no allocation per import) and the owner's names when encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Descriptor<'a> {
    pub mode: Mode,
    pub segment: Cow<'a, str>,
    /// Empty in segment mode.
    pub board: Cow<'a, str>,
    pub offset: u64,
    pub len: u64,
    pub slot: u32,
    pub generation: u64,
}

/// What errors call this format.
const WHAT: &str = "posix-shm descriptor";

fn bad(field: &str, why: impl std::fmt::Display) -> AbiError {
    codec::invalid(WHAT, field, why)
}

impl<'a> Descriptor<'a> {
    /// Serialises the descriptor.
    pub(crate) fn encode(&self) -> Vec<u8> {
        assert!(self.segment.len() <= MAX_NAME_LEN && self.board.len() <= MAX_NAME_LEN);
        Writer::with_capacity(FIXED_LEN + 2 + self.segment.len() + self.board.len())
            .bytes(&MAGIC)
            .u8(VERSION)
            .u8(match self.mode {
                Mode::Pool => 1,
                Mode::Segment => 2,
            })
            .u16(0)
            .u64(self.offset)
            .u64(self.len)
            .u32(self.slot)
            .u64(self.generation)
            .short_str(&self.segment)
            .short_str(&self.board)
            .finish()
    }

    /// The segment and board names of a descriptor, read without checking
    /// or allocating (the owner-binding check runs on every plan; the
    /// import decodes and checks the whole descriptor); `None` when it does
    /// not even have that shape.
    pub(crate) fn names(bytes: &[u8]) -> Option<(&str, &str)> {
        let mut r = Reader::new(WHAT, bytes);
        r.magic("magic", &MAGIC).ok()?;
        r.version("version", VERSION).ok()?;
        r.u8("mode").ok()?;
        r.zeros(2, "reserved").ok()?;
        r.u64("offset").ok()?;
        r.u64("len").ok()?;
        r.u32("slot").ok()?;
        r.u64("generation").ok()?;
        let segment = r.short_str("segment").ok()?;
        let board = r.short_str("board").ok()?;
        Some((segment, board))
    }

    /// Parses and checks a descriptor from another process. Names must carry
    /// `prefix`, the consumer's own configured segment prefix.
    pub(crate) fn decode(bytes: &'a [u8], prefix: &str) -> PluginResult<Descriptor<'a>> {
        Descriptor::decode_unless_known(bytes, prefix, |_| false)
    }

    /// [`decode`](Self::decode), skipping the names' checks when `known`
    /// says they passed before (a consumer's mapped pool: the same bytes).
    pub(crate) fn decode_unless_known(
        bytes: &'a [u8],
        prefix: &str,
        known: impl FnOnce(&Descriptor<'_>) -> bool,
    ) -> PluginResult<Descriptor<'a>> {
        // Names before the segment-mode rules: a pool name in a segment
        // descriptor is reported as the wrong name.
        let d = Descriptor::fields(bytes)?;
        if !known(&d) {
            d.check_names(prefix)?;
        }
        d.check_mode()?;
        Ok(d)
    }

    /// Checks both names against `prefix` (see [`names::check_name`]).
    pub(crate) fn check_names(&self, prefix: &str) -> PluginResult<()> {
        match self.mode {
            Mode::Pool => {
                names::check_name(&self.segment, prefix, Kind::PoolData)
                    .map_err(|why| bad("segment", why))?;
                names::check_name(&self.board, prefix, Kind::Board).map_err(|why| bad("board", why))
            }
            Mode::Segment => names::check_name(&self.segment, prefix, Kind::Shard)
                .map_err(|why| bad("segment", why)),
        }
    }

    /// Reads every field; checks the syntax and that `offset + len` does
    /// not overflow.
    fn fields(bytes: &'a [u8]) -> PluginResult<Descriptor<'a>> {
        let mut r = Reader::new(WHAT, bytes);
        r.magic("magic", &MAGIC)?;
        r.version("version", VERSION)?;
        let at = r.pos();
        let mode = match r.u8("mode")? {
            1 => Mode::Pool,
            2 => Mode::Segment,
            m => {
                return Err(r.error_at(
                    "mode",
                    at,
                    format_args!("expected 1 (pool) or 2 (segment), found {m}"),
                ))
            }
        };
        r.zeros(2, "reserved")?;
        let offset = r.u64("offset")?;
        let len = r.u64("len")?;
        let slot = r.u32("slot")?;
        let generation = r.u64("generation")?;
        let segment = r.short_str("segment")?;
        let board = r.short_str("board")?;
        r.end("board")?;
        if offset.checked_add(len).is_none() {
            return Err(bad("len", format!("offset {offset} + len {len} overflows")));
        }
        Ok(Descriptor {
            mode,
            segment: Cow::Borrowed(segment),
            board: Cow::Borrowed(board),
            offset,
            len,
            slot,
            generation,
        })
    }

    /// The same descriptor owning its names (tests keep decoded descriptors
    /// beyond the bytes they came from).
    #[cfg(test)]
    pub(crate) fn into_owned(self) -> Descriptor<'static> {
        Descriptor {
            segment: Cow::Owned(self.segment.into_owned()),
            board: Cow::Owned(self.board.into_owned()),
            ..self
        }
    }

    /// Segment mode: no board, offset, slot or generation.
    fn check_mode(&self) -> PluginResult<()> {
        if self.mode == Mode::Segment {
            if !self.board.is_empty() {
                return Err(bad("board", "must be empty in segment mode"));
            }
            if self.offset != 0 {
                return Err(bad(
                    "offset",
                    format!("must be 0 in segment mode, found {}", self.offset),
                ));
            }
            if self.slot != 0 || self.generation != 0 {
                return Err(bad("slot", "slot and generation must be 0 in segment mode"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::ErrorKind;

    fn pool() -> Descriptor<'static> {
        Descriptor {
            mode: Mode::Pool,
            segment: "/shardport-t1-2-ab-p0".into(),
            board: "/shardport-t1-2-ab-b1".into(),
            offset: 128,
            len: 1000,
            slot: 3,
            generation: 9,
        }
    }

    fn err(bytes: &[u8]) -> String {
        let e = Descriptor::decode(bytes, "shardport").unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
        e.message.to_string()
    }

    #[test]
    fn roundtrip() {
        let d = pool();
        assert_eq!(Descriptor::decode(&d.encode(), "shardport").unwrap(), d);
        let s = Descriptor {
            mode: Mode::Segment,
            segment: "/shardport-t1-s5".into(),
            board: "".into(),
            offset: 0,
            len: 0,
            slot: 0,
            generation: 0,
        };
        assert_eq!(Descriptor::decode(&s.encode(), "shardport").unwrap(), s);
    }

    /// The layout in the module doc, byte for byte: descriptors already in
    /// flight keep decoding.
    #[test]
    fn wire_format_is_unchanged() {
        let d = pool();
        let mut want = b"SPSM".to_vec();
        want.extend_from_slice(&[1, 1, 0, 0]);
        want.extend_from_slice(&128u64.to_le_bytes());
        want.extend_from_slice(&1000u64.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&9u64.to_le_bytes());
        want.push(d.segment.len() as u8);
        want.extend_from_slice(d.segment.as_bytes());
        want.push(d.board.len() as u8);
        want.extend_from_slice(d.board.as_bytes());
        assert_eq!(d.encode(), want);
        assert_eq!(Descriptor::decode(&want, "shardport").unwrap(), d);
    }

    #[test]
    fn every_truncation_and_extension_fails() {
        let bytes = pool().encode();
        for n in 0..bytes.len() {
            let m = err(&bytes[..n]);
            assert!(m.contains("truncated"), "{n}: {m}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(err(&long).contains("unexpected bytes"));
    }

    #[test]
    fn fields_are_named() {
        let mut b = pool().encode();
        b[0] = b'X';
        assert!(err(&b).contains("`magic`"));
        let mut b = pool().encode();
        b[4] = 2;
        assert!(err(&b).contains("`version`"));
        let mut b = pool().encode();
        b[5] = 7;
        assert!(err(&b).contains("`mode`"));
        let mut b = pool().encode();
        b[6] = 1;
        assert!(err(&b).contains("`reserved`"));
        let d = Descriptor {
            offset: u64::MAX,
            ..pool()
        };
        assert!(err(&d.encode()).contains("overflows"));
        let d = Descriptor {
            segment: "/../../etc/passwd".into(),
            ..pool()
        };
        assert!(err(&d.encode()).contains("`segment`"));
        let d = Descriptor {
            board: "/shardport-t1-p0".into(),
            ..pool()
        };
        assert!(err(&d.encode()).contains("`board`"));
        let d = Descriptor {
            mode: Mode::Segment,
            ..pool()
        };
        assert!(err(&d.encode()).contains("`segment`"));
        let mut b = pool().encode();
        b[37] = 0xff;
        assert!(err(&b).contains("UTF-8"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_fail_cleanly_or_roundtrip(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            if let Ok(d) = Descriptor::decode(&bytes, "shardport") {
                proptest::prop_assert_eq!(d.encode(), bytes);
            }
        }

        #[test]
        fn mutated_descriptors_fail_cleanly_or_roundtrip(
            at in proptest::num::usize::ANY,
            byte in proptest::num::u8::ANY,
        ) {
            let mut bytes = pool().encode();
            let i = at % bytes.len();
            bytes[i] = byte;
            match Descriptor::decode(&bytes, "shardport") {
                Ok(d) => proptest::prop_assert_eq!(d.encode(), bytes),
                Err(e) => proptest::prop_assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR),
            }
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert!(Descriptor::decode(&bytes, "shardport").is_err());
        }
    }
}
