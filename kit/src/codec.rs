//! Descriptor encoding and decoding: a little writer and a bounds-checked
//! reader over bytes.
//!
//! A descriptor comes from another process, so [`Reader`] never indexes
//! past the end and never panics, whatever the input: every read is checked,
//! and every failure is an [`ErrorKind::INVALID_DESCRIPTOR`] error whose
//! message names the descriptor, the field and the byte offset where the
//! field starts:
//!
//! ```text
//! posix-shm descriptor field `len` at byte 16: truncated: the descriptor is 20 bytes, the field needs 8
//! ```
//!
//! Integers are little-endian. Variable-length fields carry a one-byte
//! length prefix ([`Writer::short_bytes`], [`Reader::short_bytes`]). Formats
//! ending in a checksum read it with [`Reader::trailer`] first, then check it
//! over [`Reader::body`].

use std::fmt::Display;

use shardport_abi::error::{AbiError, ErrorKind, PluginResult};

/// An `INVALID_DESCRIPTOR` error for a field of `what` (`"http descriptor"`)
/// that decoded but is not acceptable (a name outside the allowed set, a
/// range outside the segment): `"{what} field `{field}`: {why}"`.
pub fn invalid(what: &str, field: &str, why: impl Display) -> AbiError {
    AbiError::new(
        ErrorKind::INVALID_DESCRIPTOR,
        format!("{what} field `{field}`: {why}"),
    )
}

/// Appends fields to a descriptor being built.
#[derive(Debug, Default, Clone)]
pub struct Writer(Vec<u8>);

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer(Vec::new())
    }

    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer(Vec::with_capacity(n))
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a little-endian `u128`.
    pub fn u128(&mut self, v: u128) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends `b` as is.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    /// Appends `n` zero bytes (reserved fields).
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }

    /// Appends a one-byte length, then `b`.
    ///
    /// # Panics
    /// When `b` is longer than 255 bytes: the writer encodes the plugin's
    /// own values, which it bounds when it makes them (a longer one is a bug).
    pub fn short_bytes(&mut self, b: &[u8]) -> &mut Self {
        let n = u8::try_from(b.len()).unwrap_or_else(|_| {
            panic!(
                "a length-prefixed field holds at most 255 bytes, got {}",
                b.len()
            )
        });
        self.u8(n).bytes(b)
    }

    /// Appends a one-byte length, then the UTF-8 of `s` (see [`short_bytes`](Self::short_bytes)).
    pub fn short_str(&mut self, s: &str) -> &mut Self {
        self.short_bytes(s.as_bytes())
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The bytes written so far (to checksum them before appending the sum).
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// The descriptor.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Reads fields from a descriptor, failing (never panicking) with an error
/// that names the field and its byte offset.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    what: &'a str,
    bytes: &'a [u8],
    /// End of the readable range (a [`trailer`](Self::trailer) shortens it).
    end: usize,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`; `what` names the format in errors
    /// (`"posix-shm descriptor"`).
    pub fn new(what: &'a str, bytes: &'a [u8]) -> Self {
        Reader {
            what,
            bytes,
            end: bytes.len(),
            pos: 0,
        }
    }

    /// Offset of the next field.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left before the end (or the trailer).
    pub fn remaining(&self) -> usize {
        self.end - self.pos
    }

    /// The readable bytes from offset 0 (without a [`trailer`](Self::trailer)
    /// taken off): what a trailing checksum covers.
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[..self.end]
    }

    /// An error about `field`, which started at byte `at`.
    pub fn error_at(&self, field: &str, at: usize, why: impl Display) -> AbiError {
        AbiError::new(
            ErrorKind::INVALID_DESCRIPTOR,
            format!("{} field `{field}` at byte {at}: {why}", self.what),
        )
    }

    /// An error about a field that decoded but is not acceptable (no offset:
    /// see [`invalid`]).
    pub fn invalid(&self, field: &str, why: impl Display) -> AbiError {
        invalid(self.what, field, why)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, field: &str) -> PluginResult<&'a [u8]> {
        let start = self.pos;
        match start.checked_add(n).filter(|&e| e <= self.end) {
            Some(end) => {
                self.pos = end;
                Ok(&self.bytes[start..end])
            }
            None => Err(self.error_at(
                field,
                start,
                format_args!(
                    "truncated: the {} is {} bytes, the field needs {n}",
                    self.what, self.end
                ),
            )),
        }
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, field: &str) -> PluginResult<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, field: &str) -> PluginResult<u8> {
        Ok(self.array::<1>(field)?[0])
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self, field: &str) -> PluginResult<u16> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, field: &str) -> PluginResult<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, field: &str) -> PluginResult<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A little-endian `u128`.
    pub fn u128(&mut self, field: &str) -> PluginResult<u128> {
        Ok(u128::from_le_bytes(self.array(field)?))
    }

    /// `expected.len()` bytes that must equal `expected`.
    pub fn magic(&mut self, field: &str, expected: &[u8]) -> PluginResult<()> {
        let at = self.pos;
        let found = self.take(expected.len(), field)?;
        if found == expected {
            return Ok(());
        }
        Err(self.error_at(
            field,
            at,
            format_args!(
                "expected {expected:02x?} ({:?}), found {found:02x?}",
                String::from_utf8_lossy(expected)
            ),
        ))
    }

    /// A version byte that must be `expected`.
    pub fn version(&mut self, field: &str, expected: u8) -> PluginResult<()> {
        let at = self.pos;
        let found = self.u8(field)?;
        if found == expected {
            return Ok(());
        }
        Err(self.error_at(
            field,
            at,
            format_args!("this plugin reads version {expected}, found {found}"),
        ))
    }

    /// `n` reserved bytes that must be zero.
    pub fn zeros(&mut self, n: usize, field: &str) -> PluginResult<()> {
        let at = self.pos;
        let b = self.take(n, field)?;
        if b.iter().all(|&x| x == 0) {
            return Ok(());
        }
        Err(self.error_at(
            field,
            at,
            format_args!("reserved bytes must be zero, found {b:02x?}"),
        ))
    }

    /// A one-byte length, then that many bytes.
    pub fn short_bytes(&mut self, field: &str) -> PluginResult<&'a [u8]> {
        let n = self.u8(field)?;
        self.take(usize::from(n), field)
    }

    /// Like [`short_bytes`](Self::short_bytes), as UTF-8.
    pub fn short_str(&mut self, field: &str) -> PluginResult<&'a str> {
        let at = self.pos;
        let b = self.short_bytes(field)?;
        std::str::from_utf8(b).map_err(|_| self.error_at(field, at, "not UTF-8"))
    }

    /// Takes the last `n` readable bytes off the end (a trailing checksum),
    /// so later reads and [`end`](Self::end) stop before them.
    pub fn trailer(&mut self, n: usize, field: &str) -> PluginResult<&'a [u8]> {
        if self.remaining() < n {
            return Err(self.error_at(
                field,
                self.pos,
                format_args!(
                    "truncated: the {} is {} bytes, too short for a {n}-byte {field} after byte {}",
                    self.what, self.end, self.pos
                ),
            ));
        }
        self.end -= n;
        Ok(&self.bytes[self.end..self.end + n])
    }

    /// Succeeds only when every readable byte was read; `after` names the
    /// last field, for the message.
    pub fn end(&self, after: &str) -> PluginResult<()> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.error_at(
                after,
                self.pos,
                format_args!("{n} unexpected bytes after the last field"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        w.bytes(b"SPEX")
            .u8(1)
            .zeros(3)
            .u16(0x0102)
            .u32(7)
            .u64(u64::MAX)
            .u128(5)
            .short_str("name")
            .short_bytes(&[9, 9]);
        let sum = w.as_slice().iter().fold(0u8, |a, b| a.wrapping_add(*b));
        w.u8(sum);
        w.finish()
    }

    fn decode(b: &[u8]) -> PluginResult<(u16, u32, u64, u128, String, Vec<u8>)> {
        let mut r = Reader::new("test descriptor", b);
        r.magic("magic", b"SPEX")?;
        r.version("version", 1)?;
        let sum = r.trailer(1, "checksum")?[0];
        if r.body().iter().fold(0u8, |a, b| a.wrapping_add(*b)) != sum {
            return Err(r.invalid("checksum", "damaged"));
        }
        r.zeros(3, "reserved")?;
        let a = r.u16("a")?;
        let b2 = r.u32("b")?;
        let c = r.u64("c")?;
        let d = r.u128("d")?;
        let name = r.short_str("name")?.to_owned();
        let tail = r.short_bytes("tail")?.to_vec();
        r.end("tail")?;
        Ok((a, b2, c, d, name, tail))
    }

    fn err(b: &[u8]) -> String {
        let e = decode(b).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
        e.message.to_string()
    }

    #[test]
    fn roundtrip() {
        let got = decode(&sample()).unwrap();
        assert_eq!(got, (0x0102, 7, u64::MAX, 5, "name".to_owned(), vec![9, 9]));
        let mut w = Writer::new();
        assert!(w.is_empty());
        w.u16(0x0102);
        assert_eq!(w.len(), 2);
        assert_eq!(w.finish(), [2, 1], "little-endian");
    }

    #[test]
    fn errors_name_field_and_offset() {
        let good = sample();
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(
            err(&b),
            "test descriptor field `magic` at byte 0: expected [53, 50, 45, 58] (\"SPEX\"), \
             found [58, 50, 45, 58]"
        );
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(
            err(&b),
            "test descriptor field `version` at byte 4: this plugin reads version 1, found 2"
        );
        let mut b = good.clone();
        b[6] = 1;
        *b.last_mut().unwrap() = b.last().unwrap().wrapping_add(1);
        assert!(err(&b).starts_with("test descriptor field `reserved` at byte 5: reserved"));
        let mut b = good.clone();
        b[10] ^= 1;
        assert_eq!(err(&b), "test descriptor field `checksum`: damaged");
        assert_eq!(
            err(&good[..3]),
            "test descriptor field `magic` at byte 0: truncated: the test descriptor is 3 bytes, \
             the field needs 4"
        );
        assert!(err(&good[..5]).contains("`checksum`"));
    }

    #[test]
    fn every_truncation_and_extension_fails_cleanly() {
        let good = sample();
        for n in 0..good.len() {
            // Re-seal so the truncation itself is what fails.
            let mut b = good[..n].to_vec();
            if n > 5 {
                let sum = b[..n - 1].iter().fold(0u8, |a, x| a.wrapping_add(*x));
                b[n - 1] = sum;
            }
            let m = err(&b);
            assert!(m.contains("truncated") || m.contains("damaged"), "{n}: {m}");
        }
        let mut long = good[..good.len() - 1].to_vec();
        long.push(0);
        let sum = long.iter().fold(0u8, |a, x| a.wrapping_add(*x));
        long.push(sum);
        assert!(err(&long).contains("1 unexpected bytes after the last field"));
    }

    #[test]
    fn hostile_input_never_panics() {
        // Every length prefix at its maximum, every field at its edge.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode(&bytes);
            let mut prefixed = b"SPEX\x01\0\0\0".to_vec();
            prefixed.extend_from_slice(&bytes);
            let _ = decode(&prefixed);
            let mut r = Reader::new("t", &bytes);
            let _ = r.take(usize::MAX, "huge");
            let _ = r.trailer(usize::MAX, "huge");
            let _ = r.short_str("s");
            let _ = r.array::<64>("a");
        }
        let r = Reader::new("t", &[0xff, 0xfe]);
        let mut r2 = r.clone();
        assert!(r2.short_str("s").unwrap_err().message.contains("truncated"));
        let mut r3 = Reader::new("t", &[2, 0xff, 0xfe]);
        assert_eq!(
            r3.short_str("s").unwrap_err().message.as_str(),
            "t field `s` at byte 0: not UTF-8"
        );
        assert_eq!(r.remaining(), 2);
    }

    #[test]
    #[should_panic(expected = "at most 255 bytes")]
    fn writer_refuses_long_short_fields() {
        Writer::new().short_bytes(&[0; 256]);
    }
}
