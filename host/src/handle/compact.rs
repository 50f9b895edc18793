//! Version 2 of the binary form: the same fields as version 1, written
//! compactly, so a handle fits in a couple of hundred bytes (it travels in
//! every RPC message, pickle and AReaL shard id).
//!
//! - integers are LEB128 varints (little-endian base 128), except the id,
//!   the checksum and the boot id, which are random-looking;
//! - a boot id in the canonical UUID text form is 16 raw bytes;
//! - the well-known transports are one byte;
//! - descriptors are packed against what the decoder already knows: the
//!   owner's identity as text (a posix-shm segment name spells the boot id
//!   and the namespaces out), the id and length (an http descriptor repeats
//!   them), the owner's address, and the descriptors before it (the
//!   segment names of one owner share a long stem). A packed descriptor is
//!   a sequence of tokens: `0x00..=0x7f` = the next `b + 1` bytes are
//!   literal; `0x80..=0xff` = copy `(b & 0x7f) + 4` bytes starting `d`
//!   bytes back (a varint `d` follows) in the window of known bytes plus
//!   what this descriptor has produced so far (overlapping copies allowed).
//!
//! ```text
//! "SH" u8:2 u128:id | u8:dtype u8:device_kind v:device_index v:byte_len
//! u8:ndim v*ndim u8:checksum_algo [u64:checksum] | u8:ntags (str8, str8)* |
//! str8:addr u8:boot_form (0: str8 | 1: 16 bytes) v:shm_device v:ipc_ns
//! v:pid_ns v:epoch | u8:nexports (u8:transport code [str8 name if 0]
//! v:descriptor length v:packed length, packed bytes)*
//! ```
//!
//! Decoding checks every length and reference against its bounds; a
//! descriptor never unpacks to more than its declared length
//! (`MAX_DESCRIPTOR` at most).

use shardport_abi::{
    Checksum, ChecksumAlgo, DType, Device, DeviceKind, ROption, RVec, ShardId, ShardMeta,
};
use shardport_kit::lease::liveness;

use super::{Export, Handle, HandleError, Owner, Reader, MAX_DESCRIPTOR, MAX_DIMS, MAX_EXPORTS};
use crate::{identity::NodeIdentity, vocab::TransportName};

pub(super) const MAGIC: &[u8; 2] = b"SH";
pub(super) const VERSION: u8 = 2;

/// One-byte codes of the transports every deployment has.
const KNOWN_TRANSPORTS: [&str; 3] = ["posix-shm", "http", "cuda-ipc"];
/// Shortest copy worth a token (a copy token with its distance is 2-3 bytes).
const MIN_MATCH: usize = 4;
const MAX_MATCH: usize = MIN_MATCH + 0x7f;
const MAX_LITERAL: usize = 0x80;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

pub(super) fn put_str8(out: &mut Vec<u8>, s: &str) {
    debug_assert!(s.len() <= u8::MAX as usize);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// The 16 bytes of a boot id in canonical UUID text form (lowercase hex,
/// dashes at 8-4-4-4-12), or `None`: only that form, so that `uuid_text`
/// gives the text back byte for byte. Parsed by the plugin kit, the one
/// reader of boot ids.
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    liveness::parse_boot_id(s)
        .filter(|&b| liveness::format_boot_id(b) == s)
        .map(u128::to_be_bytes)
}

fn uuid_text(b: &[u8; 16]) -> String {
    liveness::format_boot_id(u128::from_be_bytes(*b))
}

/// Appends `n` in decimal (no allocation: this runs for every decode).
fn push_decimal(d: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    d.extend_from_slice(&digits[i..]);
}

/// What the decoder knows before the descriptors: the bytes packed
/// descriptors may copy from.
fn dictionary(id: ShardId, meta: &ShardMeta, owner: &Owner) -> Vec<u8> {
    let ident = &owner.identity;
    let mut d = Vec::with_capacity(160);
    d.extend_from_slice(ident.boot_id.as_bytes());
    d.extend(ident.boot_id.bytes().filter(|&c| c != b'-'));
    for n in [ident.ipc_ns, ident.pid_ns, ident.shm_device] {
        push_decimal(&mut d, n);
        d.push(b'_');
    }
    d.extend_from_slice(&id.as_u128().to_le_bytes());
    d.extend_from_slice(&id.as_u128().to_be_bytes());
    d.extend_from_slice(&meta.byte_len.to_le_bytes());
    d.extend_from_slice(&meta.byte_len.to_be_bytes());
    d.extend_from_slice(owner.addr.as_bytes());
    d
}

/// Candidate positions a copy may start at: per first byte, the latest
/// position, each linked to the previous one with that byte (a chain, as
/// in DEFLATE's matchers, keyed on one byte: windows are a few hundred
/// bytes).
struct Chains {
    head: [u32; 256],
    prev: Vec<u32>,
}

const NONE: u32 = u32::MAX;
/// Candidates tried per position: bounds the encoder's time on adversarial
/// (long, repetitive) descriptors.
const MAX_CANDIDATES: usize = 64;

impl Chains {
    fn new(window: &[u8]) -> Chains {
        let mut c = Chains {
            head: [NONE; 256],
            prev: Vec::with_capacity(window.len() + 256),
        };
        for (i, &b) in window.iter().enumerate() {
            c.insert(i, b);
        }
        c
    }

    fn insert(&mut self, pos: usize, byte: u8) {
        debug_assert_eq!(pos, self.prev.len());
        self.prev.push(self.head[byte as usize]);
        self.head[byte as usize] = pos as u32;
    }
}

/// Packs `desc` against `window` (what precedes it), appending the tokens
/// to `out`; `window` grows by `desc`.
fn pack(desc: &[u8], window: &mut Vec<u8>, chains: &mut Chains, out: &mut Vec<u8>) {
    let base = window.len();
    let mut literal_start = 0usize;
    let mut i = 0usize;
    let flush = |out: &mut Vec<u8>, lit: &[u8]| {
        for chunk in lit.chunks(MAX_LITERAL) {
            out.push((chunk.len() - 1) as u8);
            out.extend_from_slice(chunk);
        }
    };
    window.extend_from_slice(desc);
    while i < desc.len() {
        // The longest earlier occurrence of what starts at `i` (greedy).
        let here = base + i;
        let want = (desc.len() - i).min(MAX_MATCH);
        let mut best = (0usize, 0usize);
        if want >= MIN_MATCH {
            let mut cand = chains.head[window[here] as usize];
            let mut tried = 0;
            while cand != NONE && tried < MAX_CANDIDATES {
                let start = cand as usize;
                tried += 1;
                let mut n = 1;
                // Overlap allowed: `start + n` may reach into `here..`.
                while n < want && window[start + n] == window[here + n] {
                    n += 1;
                }
                if n > best.0 {
                    best = (n, here - start);
                    if n == want {
                        break;
                    }
                }
                cand = chains.prev[start];
            }
        }
        let step = if best.0 >= MIN_MATCH {
            flush(out, &desc[literal_start..i]);
            out.push(0x80 | (best.0 - MIN_MATCH) as u8);
            put_varint(out, best.1 as u64);
            literal_start = i + best.0;
            best.0
        } else {
            1
        };
        for (k, &b) in window.iter().enumerate().skip(here).take(step) {
            chains.insert(k, b);
        }
        i += step;
    }
    flush(out, &desc[literal_start..]);
}

/// Version 2 of `Handle::to_bytes`.
pub(super) fn encode(h: &Handle) -> Vec<u8> {
    let m = &h.meta;
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&h.id.as_u128().to_le_bytes());
    out.push(m.dtype.0);
    out.push(m.device.kind.0);
    put_varint(&mut out, u64::from(m.device.index));
    put_varint(&mut out, m.byte_len);
    out.push(m.shape.len() as u8);
    for d in m.shape.iter() {
        put_varint(&mut out, *d);
    }
    match m.checksum {
        ROption::RSome(c) => {
            out.push(c.algo.0);
            out.extend_from_slice(&c.value.to_le_bytes());
        }
        ROption::RNone => out.push(0),
    }
    out.push(h.tags.len() as u8);
    for (k, v) in &h.tags {
        put_str8(&mut out, k);
        put_str8(&mut out, v);
    }
    let o = &h.owner;
    put_str8(&mut out, &o.addr);
    match uuid_bytes(&o.identity.boot_id) {
        Some(b) => {
            out.push(1);
            out.extend_from_slice(&b);
        }
        None => {
            out.push(0);
            put_str8(&mut out, &o.identity.boot_id);
        }
    }
    for v in [
        o.identity.shm_device,
        o.identity.ipc_ns,
        o.identity.pid_ns,
        o.epoch,
    ] {
        put_varint(&mut out, v);
    }
    out.push(h.exports.len() as u8);
    let mut window = dictionary(h.id, m, o);
    let mut chains = Chains::new(&window);
    let mut packed = Vec::with_capacity(256);
    for e in &h.exports {
        match KNOWN_TRANSPORTS
            .iter()
            .position(|t| *t == e.transport.as_str())
        {
            Some(i) => out.push(i as u8 + 1),
            None => {
                out.push(0);
                put_str8(&mut out, e.transport.as_str());
            }
        }
        packed.clear();
        pack(&e.descriptor, &mut window, &mut chains, &mut packed);
        put_varint(&mut out, e.descriptor.len() as u64);
        put_varint(&mut out, packed.len() as u64);
        out.extend_from_slice(&packed);
    }
    out
}

/// Version 2's readers, on version 1's cursor.
impl Reader<'_> {
    fn varint(&mut self, what: &str) -> Result<u64, HandleError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            let bits = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                return Err(self.err(format!("{what} overflows 64 bits")));
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(self.err(format!("{what} is not in its shortest form")));
                }
                return Ok(v);
            }
        }
        Err(self.err(format!("{what} overflows 64 bits")))
    }

    /// Unpacks a descriptor of `len` bytes from `packed` against `window`,
    /// which grows by it.
    fn unpack(
        &self,
        packed: &[u8],
        len: usize,
        window: &mut Vec<u8>,
    ) -> Result<Vec<u8>, HandleError> {
        let base = window.len();
        let mut p = Reader {
            buf: packed,
            pos: 0,
        };
        let bad = |what: String| self.err(format!("packed descriptor: {what}"));
        while window.len() - base < len {
            let t = p.u8("token").map_err(|e| bad(e.what))?;
            let left = len - (window.len() - base);
            if t < 0x80 {
                let n = t as usize + 1;
                if n > left {
                    return Err(bad(format!(
                        "a literal of {n} bytes overruns the declared length"
                    )));
                }
                window.extend_from_slice(p.take(n, "literal").map_err(|e| bad(e.what))?);
            } else {
                let n = (t & 0x7f) as usize + MIN_MATCH;
                let d = p.varint("distance").map_err(|e| bad(e.what))?;
                if n > left {
                    return Err(bad(format!(
                        "a copy of {n} bytes overruns the declared length"
                    )));
                }
                let start = (window.len() as u64)
                    .checked_sub(d)
                    .filter(|_| d > 0)
                    .ok_or_else(|| bad(format!("distance {d} reaches before the window")))?
                    as usize;
                if start + n <= window.len() {
                    window.extend_from_within(start..start + n);
                } else {
                    // Overlapping: the copy reads bytes it writes.
                    for k in 0..n {
                        let b = window[start + k];
                        window.push(b);
                    }
                }
            }
        }
        if p.pos != packed.len() {
            return Err(bad(format!(
                "{} bytes after the last token",
                packed.len() - p.pos
            )));
        }
        Ok(window[base..].to_vec())
    }
}

/// Version 2 of `Handle::from_bytes`, before validation; `buf` starts with
/// [`MAGIC`] and [`VERSION`].
pub(super) fn decode(buf: &[u8]) -> Result<Handle, HandleError> {
    let mut r = Reader { buf, pos: 3 };
    let id = ShardId::from_u128(u128::from_le_bytes(
        r.take(16, "id")?.try_into().expect("16 bytes"),
    ));
    let dtype = DType(r.u8("dtype")?);
    let kind = DeviceKind(r.u8("device kind")?);
    let index =
        u32::try_from(r.varint("device index")?).map_err(|_| r.err("device index over 32 bits"))?;
    let byte_len = r.varint("byte_len")?;
    let ndim = r.u8("ndim")? as usize;
    if ndim > MAX_DIMS {
        return Err(r.err(format!("shape has {ndim} dimensions, limit {MAX_DIMS}")));
    }
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        shape.push(r.varint("shape")?);
    }
    let algo = r.u8("checksum algorithm")?;
    let checksum = if algo == 0 {
        ROption::RNone
    } else {
        ROption::RSome(Checksum {
            algo: ChecksumAlgo(algo),
            value: u64::from_le_bytes(r.take(8, "checksum")?.try_into().expect("8 bytes")),
        })
    };
    let meta = ShardMeta {
        dtype,
        shape: RVec::from(shape),
        device: Device { kind, index },
        byte_len,
        checksum,
    };
    let tags = r.tags()?;
    let addr = r.str8("owner address", crate::vocab::MAX_ADDR)?;
    let boot_id = match r.u8("boot id form")? {
        0 => r.str8("owner boot id", crate::identity::MAX_BOOT_ID)?,
        1 => uuid_text(&r.take(16, "owner boot id")?.try_into().expect("16 bytes")),
        f => return Err(r.err(format!("unknown boot id form {f}"))),
    };
    let identity = NodeIdentity {
        boot_id,
        shm_device: r.varint("owner shm device")?,
        ipc_ns: r.varint("owner ipc namespace")?,
        pid_ns: r.varint("owner pid namespace")?,
    };
    let owner = Owner {
        addr,
        identity,
        epoch: r.varint("owner epoch")?,
    };
    let nexports = r.u8("export count")? as usize;
    if nexports > MAX_EXPORTS {
        return Err(r.err(format!("{nexports} exports, limit {MAX_EXPORTS}")));
    }
    let mut window = dictionary(id, &meta, &owner);
    let mut exports = Vec::with_capacity(nexports);
    for _ in 0..nexports {
        let name = match r.u8("transport code")? {
            0 => r.str8("transport name", crate::vocab::MAX_TRANSPORT_NAME)?,
            c => KNOWN_TRANSPORTS
                .get(c as usize - 1)
                .map(|s| (*s).to_owned())
                .ok_or_else(|| r.err(format!("unknown transport code {c}")))?,
        };
        let transport = TransportName::new(&name).map_err(|m| r.err(m))?;
        let len = r.varint("descriptor length")?;
        if len == 0 || len > MAX_DESCRIPTOR as u64 {
            return Err(r.err(format!("descriptor is {len} bytes (1..={MAX_DESCRIPTOR})")));
        }
        let plen = r.varint("packed descriptor length")?;
        let packed = r.take(
            usize::try_from(plen).unwrap_or(usize::MAX),
            "packed descriptor",
        )?;
        let descriptor = r.unpack(packed, len as usize, &mut window)?;
        exports.push(Export {
            transport,
            descriptor,
        });
    }
    if r.pos != buf.len() {
        return Err(r.err(format!("{} trailing bytes", buf.len() - r.pos)));
    }
    Ok(Handle {
        id,
        meta,
        tags,
        owner,
        exports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(desc: &[u8], window: &[u8]) {
        let mut w = window.to_vec();
        let mut chains = Chains::new(&w);
        let mut packed = Vec::new();
        pack(desc, &mut w, &mut chains, &mut packed);
        let mut w2 = window.to_vec();
        let c = Reader { buf: &[], pos: 0 };
        assert_eq!(c.unpack(&packed, desc.len(), &mut w2).unwrap(), desc);
        assert_eq!(w, w2, "both sides' windows agree");
    }

    #[test]
    fn packing_round_trips_and_finds_repeats() {
        roundtrip(b"x", b"");
        roundtrip(&[7u8; 1000], b"");
        roundtrip(b"abcabcabcabcabcabc", b"zz");
        let stem = b"/shardport-4026531836_4026531834_e83e7c8083c240a6adc96fcb075ee481-32699";
        let mut desc = stem.to_vec();
        desc.extend_from_slice(b"-p0");
        desc.extend_from_slice(stem);
        desc.extend_from_slice(b"-b1");
        let mut w = b"e83e7c8083c240a6adc96fcb075ee4814026531836_".to_vec();
        let mut chains = Chains::new(&w);
        let mut packed = Vec::new();
        pack(&desc, &mut w, &mut chains, &mut packed);
        assert!(
            packed.len() < desc.len() / 3,
            "{} of {}",
            packed.len(),
            desc.len()
        );
        roundtrip(&desc, b"e83e7c8083c240a6adc96fcb075ee4814026531836_");
    }

    #[test]
    fn long_repetitive_descriptors_pack_in_bounded_time() {
        // 4 KiB of a short period: every position has many candidates.
        let desc: Vec<u8> = (0..4096u32).map(|i| b"ab-"[i as usize % 3]).collect();
        roundtrip(&desc, b"ab-ab-ab-");
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        roundtrip(&noise, &noise[..100]);
    }

    #[test]
    fn varints_refuse_overflow_and_overlong_forms() {
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(Reader { buf: &b, pos: 0 }.varint("v").unwrap(), v);
        }
        let over = [0xff; 11];
        assert!(Reader { buf: &over, pos: 0 }.varint("v").is_err());
        let overlong = [0x80, 0x00];
        assert!(Reader {
            buf: &overlong,
            pos: 0
        }
        .varint("v")
        .unwrap_err()
        .what
        .contains("shortest"));
    }

    #[test]
    fn bad_packing_is_refused() {
        let c = Reader { buf: &[], pos: 0 };
        let mut w = b"abcd".to_vec();
        // A copy reaching before the window.
        assert!(c.unpack(&[0x80, 9], 4, &mut w).is_err());
        // A literal longer than the declared length.
        assert!(c.unpack(&[0x03, 1, 2, 3, 4], 2, &mut w).is_err());
        // Tokens after the end.
        assert!(c.unpack(&[0x00, 1, 0x00, 2], 1, &mut w).is_err());
        // Distance 0 (would copy itself).
        assert!(c.unpack(&[0x80, 0], 4, &mut w).is_err());
        // Cut short.
        assert!(c.unpack(&[0x05, 1], 6, &mut w).is_err());
    }

    #[test]
    fn decimals_are_written_like_display() {
        for n in [0u64, 7, 10, 4_026_531_839, u64::MAX] {
            let mut d = Vec::new();
            push_decimal(&mut d, n);
            assert_eq!(d, n.to_string().into_bytes());
        }
    }

    #[test]
    fn boot_ids_as_uuids_and_otherwise() {
        let u = "e83e7c80-83c2-40a6-adc9-6fcb075ee481";
        assert_eq!(uuid_text(&uuid_bytes(u).unwrap()), u);
        assert!(uuid_bytes("E83E7C80-83C2-40A6-ADC9-6FCB075EE481").is_none());
        assert!(uuid_bytes("b").is_none());
        assert!(uuid_bytes("e83e7c80x83c2-40a6-adc9-6fcb075ee481").is_none());
        // Only the canonical text: no surrounding space, dashes in place.
        assert!(uuid_bytes("e83e7c80-83c2-40a6-adc9-6fcb075ee481\n").is_none());
        assert!(uuid_bytes("e83e7c8083c2-40a6-adc9-6fcb075ee481-").is_none());
        assert!(uuid_bytes("e83e7c8083c240a6adc96fcb075ee481").is_none());
        assert_eq!(uuid_bytes(u).unwrap()[0], 0xe8);
    }
}
