//! A board's first word: a magic that names the transport in its first
//! seven bytes and the board's layout version in its eighth, so one load
//! tells a consumer both whether this is a board of its transport and
//! whether it speaks its layout. An owner and its consumers must run the
//! same layout: a consumer refuses a board of another version, naming both
//! versions ([`HeaderError::Version`]), and the owner's board carries its
//! version, so consumers of another build refuse it too. Bump the version
//! on any change to a board's layout (this module's record layout
//! included).

use std::fmt;

/// Word 0 of a board: `stem` then `version`, little-endian (so a hex dump
/// of the segment starts with the stem's text).
pub const fn magic(stem: &[u8; 7], version: u8) -> u64 {
    u64::from_le_bytes([
        stem[0], stem[1], stem[2], stem[3], stem[4], stem[5], stem[6], version,
    ])
}

/// Why a board's first word is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// The stem is another: not a board of this transport.
    Magic,
    /// A board of this transport in another layout version.
    Version {
        /// The version byte found.
        found: u8,
        /// The version this build writes and reads.
        expected: u8,
    },
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Magic => f.write_str("board magic is wrong"),
            HeaderError::Version { found, expected } => write!(
                f,
                "board layout version is {}, this plugin uses version {}",
                char::from(*found).escape_default(),
                char::from(*expected).escape_default()
            ),
        }
    }
}

impl std::error::Error for HeaderError {}

/// Checks word 0 of a board against `stem` and `version`.
pub fn check(word: u64, stem: &[u8; 7], version: u8) -> Result<(), HeaderError> {
    let bytes = word.to_le_bytes();
    if bytes[..7] != stem[..] {
        return Err(HeaderError::Magic);
    }
    if bytes[7] != version {
        return Err(HeaderError::Version {
            found: bytes[7],
            expected: version,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_names_transport_and_version() {
        const M: u64 = magic(b"SPEXBRD", b'3');
        assert_eq!(M, u64::from_le_bytes(*b"SPEXBRD3"));
        assert_eq!(check(M, b"SPEXBRD", b'3'), Ok(()));
        let old = u64::from_le_bytes(*b"SPEXBRD2");
        let e = check(old, b"SPEXBRD", b'3').unwrap_err();
        assert_eq!(
            e,
            HeaderError::Version {
                found: b'2',
                expected: b'3'
            }
        );
        assert_eq!(
            e.to_string(),
            "board layout version is 2, this plugin uses version 3"
        );
        let binary = check(u64::from_le_bytes(*b"SPEXBRD\x01"), b"SPEXBRD", b'3');
        assert_eq!(
            binary.unwrap_err().to_string(),
            "board layout version is \\u{1}, this plugin uses version 3"
        );
        assert_eq!(
            check(u64::from_le_bytes(*b"SPOTHER3"), b"SPEXBRD", b'3'),
            Err(HeaderError::Magic)
        );
        assert_eq!(check(0, b"SPEXBRD", b'3'), Err(HeaderError::Magic));
    }
}
