//! The `spool-dir` descriptor and spool file names.
//!
//! A descriptor comes from another process, so [`Descriptor::decode`] checks
//! every byte and [`validate_file_name`] keeps the named file inside the
//! consumer's own spool directory.
//!
//! # Layout (version 1, integers little-endian)
//! ```text
//! | magic "SPDR" (4) | version = 1 (1) | name_len (1) | file name (name_len) | byte_len u64 (8) |
//! ```
//! Nothing may follow `byte_len`: the total length is exactly
//! `14 + name_len`. A new layout gets a new version byte; a consumer refuses
//! versions it does not know (naming both) rather than guessing.

use shardport_abi::{PluginResult, ShardId};
use shardport_kit::codec::{Reader, Writer};

/// First bytes of every `spool-dir` descriptor.
pub const MAGIC: [u8; 4] = *b"SPDR";

/// The descriptor layout this plugin writes and reads.
pub const VERSION: u8 = 1;

/// Longest file name a descriptor may carry. Well under every filesystem's
/// 255-byte limit and the one-byte length field; a host node tag plus the
/// 32 hex digits of a shard id and the suffix fit with room to spare.
pub const MAX_FILE_NAME_LEN: usize = 200;

/// Suffix of a published shard file. Temporary files end in `.tmp` instead,
/// so no descriptor can name a partially written file.
pub const SHARD_SUFFIX: &str = ".shard";

/// Suffix of a shard file while it is being written.
pub const TMP_SUFFIX: &str = ".tmp";

/// Bytes of a descriptor besides the file name.
const FIXED_LEN: usize = MAGIC.len() + 1 + 1 + 8;

/// A decoded descriptor: which file in the spool directory, and how long it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// File name inside the spool directory (validated, no path separators).
    pub file_name: String,
    /// Exact byte length of the shard (and of the file).
    pub byte_len: u64,
}

impl Descriptor {
    /// Encodes the descriptor. `file_name` must pass [`validate_file_name`].
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(validate_file_name(&self.file_name).is_ok());
        Writer::with_capacity(FIXED_LEN + self.file_name.len())
            .bytes(&MAGIC)
            .u8(VERSION)
            .short_str(&self.file_name)
            .u64(self.byte_len)
            .finish()
    }

    /// Decodes and validates a descriptor from another process.
    ///
    /// Fails with `INVALID_DESCRIPTOR` naming the field and its offset.
    pub fn decode(bytes: &[u8]) -> PluginResult<Descriptor> {
        let mut r = Reader::new("spool-dir descriptor", bytes);
        r.magic("magic", &MAGIC)?;
        r.version("version", VERSION)?;
        let name = r.short_str("file name")?;
        let byte_len = r.u64("byte_len")?;
        r.end("byte_len")?;
        validate_file_name(name)
            .map_err(|why| r.invalid("file name", format_args!("{name:?} {why}")))?;
        Ok(Descriptor {
            file_name: name.to_owned(),
            byte_len,
        })
    }
}

/// Checks that `name` is a published shard file name that stays inside the
/// spool directory: 1 to [`MAX_FILE_NAME_LEN`] bytes of `[A-Za-z0-9._-]`, not
/// starting with `.`, no `..`, ending in [`SHARD_SUFFIX`]. Returns why not.
pub fn validate_file_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_FILE_NAME_LEN {
        return Err(format!(
            "{} bytes long, longer than {MAX_FILE_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("contains {c:?} (allowed: A-Z a-z 0-9 . _ -)"));
    }
    if name.starts_with('.') {
        return Err("starts with `.`".to_owned());
    }
    if name.contains("..") {
        return Err("contains `..`".to_owned());
    }
    if !name.ends_with(SHARD_SUFFIX) || name.len() == SHARD_SUFFIX.len() {
        return Err(format!("is not a `<name>{SHARD_SUFFIX}` file"));
    }
    Ok(())
}

/// The file an owner node publishes shard `id` under: `<node_tag>-<id hex>.shard`.
pub fn shard_file_name(node_tag: &str, id: ShardId) -> String {
    format!("{node_tag}-{:032x}{SHARD_SUFFIX}", id.as_u128())
}

#[cfg(test)]
mod tests {
    use shardport_abi::ErrorKind;

    use super::*;

    fn sample() -> Descriptor {
        Descriptor {
            file_name: shard_file_name("t42-0-abc", ShardId::from_u128(0xfeed)),
            byte_len: (1 << 20) + 3,
        }
    }

    #[test]
    fn roundtrips() {
        let d = sample();
        let bytes = d.encode();
        assert_eq!(&bytes[..4], b"SPDR");
        assert_eq!(bytes.len(), 14 + d.file_name.len());
        assert_eq!(Descriptor::decode(&bytes).unwrap(), d);
    }

    /// The layout in the module doc, byte for byte: descriptors already in
    /// flight keep decoding.
    #[test]
    fn wire_format_is_unchanged() {
        let d = sample();
        let mut want = b"SPDR\x01".to_vec();
        want.push(d.file_name.len() as u8);
        want.extend_from_slice(d.file_name.as_bytes());
        want.extend_from_slice(&d.byte_len.to_le_bytes());
        assert_eq!(d.encode(), want);
        assert_eq!(Descriptor::decode(&want).unwrap(), d);
    }

    #[test]
    fn file_names() {
        assert_eq!(
            shard_file_name("t1-2-3", ShardId::from_u128(255)),
            "t1-2-3-000000000000000000000000000000ff.shard"
        );
        assert!(validate_file_name("node-1_a.b.shard").is_ok());
        for (bad, why) in [
            ("../x.shard", "contains '/'"),
            ("a/b.shard", "contains '/'"),
            ("x..y.shard", "contains `..`"),
            (".hidden.shard", "starts with `.`"),
            ("x.shard.tmp", "is not a `<name>.shard` file"),
            (".shard", "starts with `.`"),
            ("x.sh", "is not a `<name>.shard` file"),
            ("caf\u{e9}.shard", "contains 'é'"),
            ("a b.shard", "contains ' '"),
            ("x\0.shard", "contains '\\0'"),
        ] {
            let got = validate_file_name(bad).unwrap_err();
            assert!(got.starts_with(why), "{bad:?}: {got}");
        }
        let long = format!("{}.shard", "a".repeat(MAX_FILE_NAME_LEN));
        assert!(validate_file_name(&long)
            .unwrap_err()
            .contains("longer than 200"));
    }

    #[test]
    fn rejects_malformed_descriptors() {
        let good = sample().encode();
        let n = good.len();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "field `magic` at byte 0: truncated"),
            (good[..n - 1].to_vec(), "field `byte_len` at byte"),
            (
                [good.as_slice(), &[0]].concat(),
                "1 unexpected bytes after the last field",
            ),
            (
                [b"XPDR", &good[4..]].concat(),
                "field `magic` at byte 0: expected",
            ),
            (
                [&good[..4], &[2], &good[5..]].concat(),
                "field `version` at byte 4: this plugin reads version 1, found 2",
            ),
            (
                {
                    let mut d = Descriptor {
                        file_name: "ab.shard".into(),
                        byte_len: 1,
                    }
                    .encode();
                    d[6] = b'/';
                    d
                },
                "field `file name`: \"/b.shard\" contains '/'",
            ),
            (
                {
                    let mut d = Descriptor {
                        file_name: "ab.shard".into(),
                        byte_len: 1,
                    }
                    .encode();
                    d[6] = 0xff;
                    d
                },
                "field `file name` at byte 5: not UTF-8",
            ),
        ];
        for (bytes, needle) in cases {
            let e = Descriptor::decode(&bytes).unwrap_err();
            assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
            assert!(e.message.starts_with("spool-dir descriptor "), "{e}");
            assert!(e.message.contains(needle), "{needle:?} not in {e}");
        }
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let good = sample().encode();
        for n in 0..good.len() {
            assert!(Descriptor::decode(&good[..n]).is_err(), "{n}");
        }
        for i in 0..good.len() {
            for byte in [0u8, 1, 0x7f, 0xff] {
                let mut b = good.clone();
                b[i] = byte;
                if let Ok(d) = Descriptor::decode(&b) {
                    assert_eq!(d.encode(), b, "decoded values re-encode exactly");
                }
            }
        }
    }
}
