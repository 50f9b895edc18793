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

use shardport_abi::{AbiError, PluginResult, ShardId};

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
        let name = self.file_name.as_bytes();
        let mut out = Vec::with_capacity(FIXED_LEN + name.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&self.byte_len.to_le_bytes());
        out
    }

    /// Decodes and validates a descriptor from another process.
    ///
    /// Fails with `INVALID_DESCRIPTOR` saying what was wrong.
    pub fn decode(bytes: &[u8]) -> PluginResult<Descriptor> {
        let bad = |why: String| AbiError::invalid_descriptor(format!("spool-dir descriptor {why}"));
        if bytes.len() < FIXED_LEN + 1 {
            return Err(bad(format!(
                "of {} bytes is shorter than the {} bytes of the smallest one",
                bytes.len(),
                FIXED_LEN + 1
            )));
        }
        if bytes[..4] != MAGIC {
            return Err(bad("does not start with the `SPDR` magic".to_owned()));
        }
        if bytes[4] != VERSION {
            return Err(bad(format!(
                "has layout version {}, this plugin reads version {VERSION}",
                bytes[4]
            )));
        }
        let name_len = usize::from(bytes[5]);
        if bytes.len() != FIXED_LEN + name_len {
            return Err(bad(format!(
                "is {} bytes long, its {name_len}-byte file name implies {}",
                bytes.len(),
                FIXED_LEN + name_len
            )));
        }
        let name = std::str::from_utf8(&bytes[6..6 + name_len])
            .map_err(|_| bad("carries a file name that is not UTF-8".to_owned()))?;
        validate_file_name(name).map_err(|why| bad(format!("names file {name:?}: {why}")))?;
        let len_bytes: [u8; 8] = bytes[6 + name_len..]
            .try_into()
            .map_err(|_| bad("has a truncated length field".to_owned()))?;
        Ok(Descriptor {
            file_name: name.to_owned(),
            byte_len: u64::from_le_bytes(len_bytes),
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
        let truncated = format!(
            "is {} bytes long, its {}-byte file name implies {n}",
            n - 1,
            n - 14
        );
        let extended = format!("is {} bytes long", n + 1);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "of 0 bytes is shorter than the 15 bytes"),
            (good[..n - 1].to_vec(), &truncated),
            ([good.as_slice(), &[0]].concat(), &extended),
            (
                [b"XPDR", &good[4..]].concat(),
                "does not start with the `SPDR` magic",
            ),
            (
                [&good[..4], &[2], &good[5..]].concat(),
                "has layout version 2, this plugin reads version 1",
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
                "names file \"/b.shard\": contains '/'",
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
                "not UTF-8",
            ),
        ];
        for (bytes, needle) in cases {
            let e = Descriptor::decode(&bytes).unwrap_err();
            assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
            assert!(e.message.contains(needle), "{needle:?} not in {e}");
        }
    }
}
