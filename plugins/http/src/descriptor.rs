//! The descriptor: what an owner's `export` returns and a consumer's
//! `import_*` reads. Compact, versioned, little-endian:
//!
//! ```text
//! offset  size field
//!      0     4 magic "SPHT"
//!      4     1 version (1: plain HTTP)
//!      5     1 address length N (1..=255)
//!      6     N owner address, "host:port" (UTF-8: IPv4, [IPv6] or a DNS name)
//!    6+N    16 shard id (u128, little-endian)
//!   22+N     8 len, the shard's byte length
//!   30+N     4 CRC-32C of bytes 0..30+N
//! ```
//!
//! An owner that serves HTTPS writes version 2, which has one more byte,
//! `flags`, right after the version (bit 0: the owner serves TLS; every
//! other bit must be zero), so every later field moves by one:
//!
//! ```text
//!      0     4 magic "SPHT"
//!      4     1 version (2)
//!      5     1 flags (1 = TLS)
//!      6     1 address length N
//!      7     N owner address ... (as above, one byte later)
//! ```
//!
//! A plain-HTTP owner still writes version 1 byte for byte, so consumers
//! built before TLS keep reading its descriptors; they refuse version 2
//! (an unknown version), which is right: they could not speak TLS anyway.
//!
//! Nothing may follow. The checksum is there because a descriptor tells the
//! consumer which machine to connect to: a handle damaged on its way through
//! an application's RPC must fail loudly (every 1-bit and 2-bit error is
//! caught), never send the consumer to some other host. Every failure is
//! `INVALID_DESCRIPTOR` with a message naming the field.

use std::net::{Ipv4Addr, Ipv6Addr};

use shardport_abi::{AbiError, PluginResult, ShardId};
use shardport_kit::codec::{self, Reader, Writer};

/// Identifies an http descriptor.
pub(crate) const MAGIC: [u8; 4] = *b"SPHT";
/// Format version of a plain-HTTP owner's descriptors.
pub(crate) const VERSION: u8 = 1;
/// Format version of an HTTPS owner's descriptors (adds `flags`).
pub(crate) const VERSION_FLAGS: u8 = 2;
/// `flags` bit: the owner serves TLS.
pub(crate) const FLAG_TLS: u8 = 1;
/// Longest owner address in a descriptor (the host's handle bounds owner
/// addresses the same way).
pub(crate) const MAX_ADDR_LEN: usize = 255;
/// Bytes of a descriptor besides the address.
const FIXED_LEN: usize = 4 + 1 + 1 + 16 + 8 + 4;
/// Longest DNS name (RFC 1035, without the trailing dot).
const MAX_HOSTNAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// A decoded descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Descriptor {
    /// The owner's advertised `host:port`.
    pub addr: String,
    pub id: ShardId,
    pub len: u64,
    /// The owner serves HTTPS (version 2 with [`FLAG_TLS`]).
    pub tls: bool,
}

/// What errors call this format.
const WHAT: &str = "http descriptor";

fn bad(field: &str, why: impl std::fmt::Display) -> AbiError {
    codec::invalid(WHAT, field, why)
}

impl Descriptor {
    /// Serialises the descriptor. `addr` was validated when the config was.
    pub(crate) fn encode(&self) -> Vec<u8> {
        assert!(
            !self.addr.is_empty() && self.addr.len() <= MAX_ADDR_LEN,
            "advertised address length is checked at construction"
        );
        let mut w = Writer::with_capacity(FIXED_LEN + 1 + self.addr.len());
        w.bytes(&MAGIC);
        if self.tls {
            w.u8(VERSION_FLAGS).u8(FLAG_TLS);
        } else {
            w.u8(VERSION);
        }
        w.short_str(&self.addr)
            .u128(self.id.as_u128())
            .u64(self.len);
        let crc = crc32c::crc32c(w.as_slice());
        w.u32(crc).finish()
    }

    /// Parses and checks a descriptor from another process: the syntax
    /// first, then the checksum, then the address (so a damaged descriptor
    /// is reported as damaged, not as a strange address).
    pub(crate) fn decode(bytes: &[u8]) -> PluginResult<Descriptor> {
        let mut r = Reader::new(WHAT, bytes);
        r.magic("magic", &MAGIC)?;
        let tls = match r.u8("version")? {
            VERSION => false,
            VERSION_FLAGS => match r.u8("flags")? {
                FLAG_TLS => true,
                f => {
                    return Err(bad(
                        "flags",
                        format!(
                        "{f:#04x} is not a flag set this plugin knows (expected {FLAG_TLS:#04x}, \
                             TLS; a plain owner writes version {VERSION})"
                    ),
                    ))
                }
            },
            v => {
                return Err(bad(
                    "version",
                    format!(
                        "version {v} is not one this plugin reads ({VERSION} or {VERSION_FLAGS}): \
                         the owner runs another build of the http transport"
                    ),
                ))
            }
        };
        let addr = r.short_bytes("address")?;
        let id = r.u128("shard id")?;
        let len = r.u64("len")?;
        let body_len = r.pos();
        let stored = r.u32("checksum")?;
        r.end("checksum")?;
        let computed = crc32c::crc32c(&bytes[..body_len]);
        if stored != computed {
            return Err(bad(
                "checksum",
                format!(
                    "CRC-32C {stored:#010x} does not match the content ({computed:#010x}): \
                     the descriptor was damaged in transit"
                ),
            ));
        }
        if addr.is_empty() {
            return Err(bad("address", "empty"));
        }
        let addr = std::str::from_utf8(addr).map_err(|_| bad("address", "not UTF-8"))?;
        match parse_host_port(addr) {
            Ok((_, 0)) => return Err(bad("address", format!("port 0 in {addr:?}"))),
            Ok(_) => {}
            Err(why) => return Err(bad("address", format!("{addr:?}: {why}"))),
        }
        Ok(Descriptor {
            addr: addr.to_owned(),
            id: ShardId::from_u128(id),
            len,
            tls,
        })
    }
}

/// Splits `host:port` and checks both parts: the host is an IPv4 address, a
/// bracketed IPv6 address or a DNS name; the port is decimal, at most 65535.
pub(crate) fn parse_host_port(text: &str) -> Result<(&str, u16), String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("expected host:port".to_owned());
    };
    check_host(host)?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {port:?} is not a decimal number"));
    }
    let port: u32 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a number"))?;
    let port = u16::try_from(port).map_err(|_| format!("port {port} is above 65535"))?;
    Ok((host, port))
}

/// Checks a host: IPv4, `[IPv6]`, or a DNS name (letters, digits, `-`, dots
/// between labels of at most 63 bytes, at most 253 bytes in all).
pub(crate) fn check_host(host: &str) -> Result<(), String> {
    if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(format!("unclosed `[` in host {host:?}"));
        };
        return inner
            .parse::<Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| format!("{inner:?} is not an IPv6 address"));
    }
    if host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    if host.is_empty() {
        return Err("empty host".to_owned());
    }
    if host.len() > MAX_HOSTNAME_LEN {
        return Err(format!("host name longer than {MAX_HOSTNAME_LEN} bytes"));
    }
    for label in host.split('.') {
        let ok = !label.is_empty()
            && label.len() <= MAX_LABEL_LEN
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "host {host:?} is not an IP address or a DNS name (letters, digits, `-`, \
                 dots between labels; IPv6 in brackets)"
            ));
        }
    }
    // A name made of digits and dots that did not parse as IPv4 (`1.2.3`,
    // `999.1.1.1`) is a typo, not a host name.
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("{host:?} is not a valid IPv4 address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::ErrorKind;

    fn sample() -> Descriptor {
        Descriptor {
            addr: "127.0.0.1:7071".into(),
            id: ShardId::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            len: 4096,
            tls: false,
        }
    }

    fn err(bytes: &[u8]) -> String {
        let e = Descriptor::decode(bytes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
        e.message.to_string()
    }

    /// Re-seals a hand-edited descriptor so a test reaches the fields after
    /// the checksum check.
    fn reseal(mut b: Vec<u8>) -> Vec<u8> {
        let n = b.len() - 4;
        let crc = crc32c::crc32c(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn roundtrip() {
        for addr in [
            "127.0.0.1:7071",
            "[::1]:1",
            "[fe80::1:2]:65535",
            "node7.cluster.internal:80",
            "localhost:9",
            &format!("{}:1", "a".repeat(63)),
        ] {
            let d = Descriptor {
                addr: addr.to_owned(),
                ..sample()
            };
            let b = d.encode();
            assert_eq!(b.len(), FIXED_LEN + addr.len());
            assert_eq!(Descriptor::decode(&b).unwrap(), d);
        }
        // The id travels little-endian right after the address.
        let b = sample().encode();
        assert_eq!(&b[..6], b"SPHT\x01\x0e");
        assert_eq!(b[20], 0x77);
    }

    /// The layout in the module doc, byte for byte: descriptors already in
    /// flight keep decoding.
    #[test]
    fn wire_format_is_unchanged() {
        let d = sample();
        let mut want = b"SPHT\x01".to_vec();
        want.push(d.addr.len() as u8);
        want.extend_from_slice(d.addr.as_bytes());
        want.extend_from_slice(&d.id.as_u128().to_le_bytes());
        want.extend_from_slice(&4096u64.to_le_bytes());
        let crc = crc32c::crc32c(&want);
        want.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(d.encode(), want);
        assert_eq!(Descriptor::decode(&want).unwrap(), d);
    }

    /// An HTTPS owner's descriptor: version 2, flags, then the v1 fields.
    #[test]
    fn tls_descriptors_carry_a_flag_and_plain_ones_stay_version_1() {
        let d = Descriptor {
            tls: true,
            ..sample()
        };
        let b = d.encode();
        assert_eq!(&b[..7], b"SPHT\x02\x01\x0e");
        assert_eq!(b.len(), FIXED_LEN + 1 + d.addr.len());
        assert_eq!(Descriptor::decode(&b).unwrap(), d);
        assert_eq!(sample().encode()[4], VERSION);
        // Unknown flags (and version 2 without the TLS flag, which a plain
        // owner would have written as version 1) are refused by name.
        for flags in [0u8, 2, 3, 0x80] {
            let mut b = b.clone();
            b[5] = flags;
            let m = err(&reseal(b));
            assert!(m.contains("`flags`"), "{flags}: {m}");
        }
        for n in 0..b.len() {
            assert!(Descriptor::decode(&b[..n]).is_err());
        }
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Descriptor::decode(&c).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn every_truncation_and_extension_fails() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            let m = err(&bytes[..n]);
            assert!(m.contains("truncated"), "{n}: {m}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(err(&long).contains("unexpected bytes"));
    }

    #[test]
    fn every_bit_flip_fails() {
        let bytes = sample().encode();
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Descriptor::decode(&b).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn fields_are_named() {
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(err(&b).contains("`magic`"));
        let mut b = sample().encode();
        b[4] = 3;
        assert!(err(&b).contains("`version`"));
        let mut b = sample().encode();
        b[10] ^= 1;
        assert!(err(&b).contains("`checksum`"));
        for (addr, needle) in [
            ("127.0.0.1:0", "port 0"),
            ("127.0.0.1", "expected host:port"),
            ("a b:1", "not an IP address or a DNS name"),
            ("999.1.1.1:1", "not a valid IPv4 address"),
            ("[::1:1", "unclosed"),
            ("[zz]:1", "not an IPv6 address"),
            ("::1:80", "not an IP address or a DNS name"),
            ("host:99999", "above 65535"),
            ("host:+80", "not a decimal number"),
            ("-bad.example:1", "not an IP address or a DNS name"),
            ("x..y:1", "not an IP address or a DNS name"),
        ] {
            let mut b = sample().encode();
            b.truncate(6);
            b[5] = addr.len() as u8;
            b.extend_from_slice(addr.as_bytes());
            b.extend_from_slice(&[0u8; 28]);
            let m = err(&reseal(b));
            assert!(m.contains("`address`"), "{addr}: {m}");
            assert!(m.contains(needle), "{addr}: {m}");
        }
        let mut b = sample().encode();
        b[6] = 0xff;
        assert!(err(&reseal(b)).contains("UTF-8"));
        let mut b = sample().encode();
        b.truncate(6);
        b[5] = 0;
        b.extend_from_slice(&[0u8; 28]);
        assert!(err(&reseal(b)).contains("empty"));
    }

    #[test]
    fn hosts() {
        for ok in ["10.0.0.1", "[::]", "a", "a-b.c9", "node7.example"] {
            check_host(ok).unwrap();
        }
        for bad in ["", "a_b", "a.", ".a", "1.2.3", "[::1", "a/b", "é.example"] {
            assert!(check_host(bad).is_err(), "{bad:?}");
        }
        assert!(check_host(&"a".repeat(64)).is_err());
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(63),
        ]
        .join(".");
        assert!(check_host(&long).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_fail_cleanly_or_roundtrip(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            if let Ok(d) = Descriptor::decode(&bytes) {
                proptest::prop_assert_eq!(d.encode(), bytes);
            }
        }

        #[test]
        fn mutated_descriptors_fail_cleanly_or_roundtrip(
            at in proptest::num::usize::ANY,
            byte in proptest::num::u8::ANY,
        ) {
            let mut bytes = sample().encode();
            let i = at % bytes.len();
            bytes[i] = byte;
            match Descriptor::decode(&bytes) {
                Ok(d) => proptest::prop_assert_eq!(d.encode(), bytes),
                Err(e) => proptest::prop_assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR),
            }
        }
    }
}
