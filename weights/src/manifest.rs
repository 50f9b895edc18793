//! The manifest: what a receiver needs to take one version of a state dict,
//! as a small binary value the caller's own RPC carries.
//!
//! A manifest names the buckets of one version (each a shard handle and the
//! BLAKE3 hash of its bytes, computed by the publisher) and, for every
//! tensor, its name, dtype, shape and place in a bucket. It is the one thing
//! a receiver trusts: it comes from the publisher through the caller's
//! channel, and every bucket's bytes are checked against its hash before a
//! single byte lands in the receiver's tensors, whatever path (the owner, a
//! relay, a cache) the bytes took.
//!
//! Binary layout (little-endian, varints are LEB128), format version 2:
//! `"SPWM" u8:format | varint:version | varint:nbuckets (varint:len handle,
//! [u8;32]:blake3)* | varint:ntensors (varint:len name, u8:dtype, u8:ndim,
//! varint:dim*, varint:bucket, varint:offset, u8:flags [varint:part-dim
//! varint:part-index varint:part-count when flags & 1])*`, and nothing
//! after. A tensor costs its name, its dims and about 7 bytes more; a
//! bucket its handle (about 190 bytes) and 32.
//!
//! A tensor published in parts (the slices of a tensor-parallel layout) is
//! one entry per part, each with the part's shape: part `i` of `n` along
//! dimension `d` holds indices `i * size / n .. (i + 1) * size / n` of it.
//!
//! Decoding checks everything a forged or truncated manifest could get
//! wrong and names where: the framing, each handle, known dtypes, a byte
//! length for every shape, tensors inside their bucket and not overlapping
//! each other, names unique and not empty.

use std::collections::HashSet;

use shardport_abi::DType;
use shardport_host::{vocab::MAX_DIMS, Handle};

use crate::error::WeightsError;

const MAGIC: &[u8; 4] = b"SPWM";
/// The manifest format this version writes and reads.
pub const FORMAT: u8 = 2;
/// Most buckets one version has (a 1 TiB state dict in 16 MiB buckets).
pub const MAX_BUCKETS: usize = 1 << 16;
/// Most tensors one version has.
pub const MAX_TENSORS: usize = 1 << 20;
/// Longest tensor name, in bytes (torch's dotted paths are far shorter).
pub const MAX_NAME: usize = 1024;
/// Longest handle a bucket may carry (a handle's own bound is far lower).
const MAX_HANDLE: usize = 64 * 1024;

/// One version of a state dict, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The version the publisher gave it: receivers only move forward.
    pub version: u64,
    /// The buckets carrying the bytes, in order.
    pub buckets: Vec<Bucket>,
    /// The tensors, in the order they were published.
    pub tensors: Vec<Entry>,
}

/// One bucket: a shard holding one or more tensors, and the hash of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The shard (any transport the owner exported it through).
    pub handle: Handle,
    /// BLAKE3 of the shard's bytes, computed by the publisher.
    pub hash: [u8; 32],
}

/// One tensor of the state dict and where its bytes lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The state-dict key (`layers.0.attn.qkv.weight`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Index into [`Manifest::buckets`].
    pub bucket: u32,
    /// Byte offset of the tensor in its bucket.
    pub offset: u64,
    /// Which part of a tensor published in parts this entry is.
    pub part: Option<Part>,
}

/// Part `index` of `count` of a tensor split along dimension `dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Part {
    /// The dimension split.
    pub dim: u8,
    /// Which part.
    pub index: u32,
    /// How many parts.
    pub count: u32,
}

impl Entry {
    /// The tensor's bytes (dtype and shape), `None` when they imply none.
    pub fn byte_len(&self) -> Option<u64> {
        byte_len(self.dtype, &self.shape)
    }
}

/// Bytes of a dense tensor of `dtype` and `shape`, `None` for an unknown
/// dtype or an overflow.
pub fn byte_len(dtype: DType, shape: &[u64]) -> Option<u64> {
    let bits = u64::from(dtype.bits()?);
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))?
        .checked_mul(bits)?
        .checked_add(7)
        .map(|b| b / 8)
}

impl Manifest {
    /// Bytes the update moves (every bucket).
    pub fn total_bytes(&self) -> u64 {
        self.buckets.iter().map(|b| b.handle.meta.byte_len).sum()
    }

    /// Tensor names of bucket `b`, for error messages (the first few).
    pub fn names_in(&self, b: usize) -> String {
        let names: Vec<&str> = self
            .tensors
            .iter()
            .filter(|e| e.bucket as usize == b)
            .map(|e| e.name.as_str())
            .collect();
        match names.len() {
            0 => "no tensor".to_owned(),
            1..=3 => names.join(", "),
            n => format!("{} and {} more", names[..3].join(", "), n - 3),
        }
    }

    /// The binary form (format [`FORMAT`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.buckets.len() * 230 + self.tensors.len() * 48);
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        put_varint(&mut out, self.version);
        put_varint(&mut out, self.buckets.len() as u64);
        for b in &self.buckets {
            let h = b.handle.to_bytes();
            put_varint(&mut out, h.len() as u64);
            out.extend_from_slice(&h);
            out.extend_from_slice(&b.hash);
        }
        put_varint(&mut out, self.tensors.len() as u64);
        for e in &self.tensors {
            put_varint(&mut out, e.name.len() as u64);
            out.extend_from_slice(e.name.as_bytes());
            out.push(e.dtype.0);
            out.push(e.shape.len() as u8);
            for &d in &e.shape {
                put_varint(&mut out, d);
            }
            put_varint(&mut out, u64::from(e.bucket));
            put_varint(&mut out, e.offset);
            match e.part {
                None => out.push(0),
                Some(p) => {
                    out.push(1);
                    put_varint(&mut out, u64::from(p.dim));
                    put_varint(&mut out, u64::from(p.index));
                    put_varint(&mut out, u64::from(p.count));
                }
            }
        }
        out
    }

    /// Decodes and checks a manifest (see the module docs for what is checked).
    pub fn from_bytes(buf: &[u8]) -> Result<Manifest, WeightsError> {
        let mut r = Reader { buf, at: 0 };
        if r.take(4, "the magic \"SPWM\"")? != MAGIC {
            return Err(r.err(0, "not a weights manifest (no \"SPWM\" magic)"));
        }
        let format = r.byte("the format version")?;
        if format != FORMAT {
            return Err(r.err(
                4,
                format!("manifest format {format}; this version reads format {FORMAT}"),
            ));
        }
        let version = r.varint("the version")?;
        let nbuckets = r.count("the bucket count", MAX_BUCKETS)?;
        let mut buckets = Vec::with_capacity(nbuckets);
        for i in 0..nbuckets {
            let at = r.at;
            let len = r.count("a handle's length", MAX_HANDLE)?;
            let bytes = r.take(len, "a bucket's handle")?;
            let handle = Handle::from_bytes(bytes)
                .map_err(|e| r.err(at, format!("bucket {i}: bad handle: {e}")))?;
            let hash: [u8; 32] = r
                .take(32, "a bucket's hash")?
                .try_into()
                .expect("took 32 bytes");
            buckets.push(Bucket { handle, hash });
        }
        let ntensors = r.count("the tensor count", MAX_TENSORS)?;
        let mut tensors = Vec::with_capacity(ntensors.min(1 << 16));
        for _ in 0..ntensors {
            tensors.push(r.entry()?);
        }
        if r.at != buf.len() {
            return Err(r.err(
                r.at,
                format!("{} bytes after the last tensor", buf.len() - r.at),
            ));
        }
        let m = Manifest {
            version,
            buckets,
            tensors,
        };
        m.check()?;
        Ok(m)
    }

    /// The checks that span entries: known dtypes, byte lengths, tensors
    /// inside their bucket, no overlaps, unique names.
    pub fn check(&self) -> Result<(), WeightsError> {
        let bad = |name: &str, what: String| WeightsError::Manifest {
            what: format!("tensor {name:?}: {what}"),
            offset: None,
        };
        let mut names: HashSet<(&str, Option<u32>)> = HashSet::with_capacity(self.tensors.len());
        let mut spans = Vec::with_capacity(self.tensors.len());
        for e in &self.tensors {
            if e.name.is_empty() {
                return Err(bad("", "empty name".into()));
            }
            if let Some(p) = e.part {
                if p.count == 0 || p.index >= p.count || usize::from(p.dim) >= e.shape.len() {
                    return Err(bad(
                        &e.name,
                        format!(
                            "part {} of {} along dimension {} of a {}-dimensional part",
                            p.index,
                            p.count,
                            p.dim,
                            e.shape.len()
                        ),
                    ));
                }
            }
            if !names.insert((e.name.as_str(), e.part.map(|p| p.index))) {
                return Err(bad(&e.name, "named twice".into()));
            }
            if e.dtype.bits().is_none() {
                return Err(bad(&e.name, format!("unknown dtype code {}", e.dtype.0)));
            }
            let len = e
                .byte_len()
                .ok_or_else(|| bad(&e.name, format!("shape {:?} has no byte length", e.shape)))?;
            let Some(b) = self.buckets.get(e.bucket as usize) else {
                return Err(bad(
                    &e.name,
                    format!("bucket {} of {}", e.bucket, self.buckets.len()),
                ));
            };
            let size = b.handle.meta.byte_len;
            if e.offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(bad(
                    &e.name,
                    format!(
                        "bytes {}..+{len} lie outside bucket {} of {size} bytes",
                        e.offset, e.bucket
                    ),
                ));
            }
            spans.push((e.bucket, e.offset, len, e.name.as_str()));
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            let (b0, o0, l0, n0) = w[0];
            let (b1, o1, _, n1) = w[1];
            if b0 == b1 && o0 + l0 > o1 {
                return Err(bad(n1, format!("overlaps tensor {n0:?} in bucket {b1}")));
            }
        }
        Ok(())
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, offset: usize, what: impl Into<String>) -> WeightsError {
        WeightsError::Manifest {
            what: what.into(),
            offset: Some(offset),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WeightsError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(self.err(self.at, format!("truncated: {what} needs {n} bytes")));
        };
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn byte(&mut self, what: &str) -> Result<u8, WeightsError> {
        Ok(self.take(1, what)?[0])
    }

    fn varint(&mut self, what: &str) -> Result<u64, WeightsError> {
        let start = self.at;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte(what)?;
            let low = u64::from(b & 0x7f);
            if shift == 63 && low > 1 {
                break;
            }
            v |= low << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err(start, format!("{what}: varint longer than 64 bits")))
    }

    fn count(&mut self, what: &str, max: usize) -> Result<usize, WeightsError> {
        let at = self.at;
        let n = self.varint(what)?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| self.err(at, format!("{what} {n} is over the limit of {max}")))
    }

    fn entry(&mut self) -> Result<Entry, WeightsError> {
        let at = self.at;
        let len = self.count("a tensor name's length", MAX_NAME)?;
        let name = std::str::from_utf8(self.take(len, "a tensor name")?)
            .map_err(|_| self.err(at, "a tensor name is not UTF-8"))?
            .to_owned();
        let dtype = DType(self.byte("a dtype")?);
        let ndim = usize::from(self.byte("a rank")?);
        if ndim > MAX_DIMS {
            return Err(self.err(
                at,
                format!("tensor {name:?}: {ndim} dimensions, at most {MAX_DIMS}"),
            ));
        }
        let mut shape = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            shape.push(self.varint("a dimension")?);
        }
        let bucket = self.varint("a bucket index")?;
        let bucket = u32::try_from(bucket)
            .map_err(|_| self.err(at, format!("tensor {name:?}: bucket {bucket}")))?;
        let offset = self.varint("an offset")?;
        let flags = self.byte("a tensor's flags")?;
        let part = match flags {
            0 => None,
            1 => {
                let small = |r: &mut Self, what: &str| -> Result<u32, WeightsError> {
                    let at = r.at;
                    let v = r.varint(what)?;
                    u32::try_from(v).map_err(|_| r.err(at, format!("tensor {name:?}: {what} {v}")))
                };
                let dim = small(self, "a part's dimension")?;
                Some(Part {
                    dim: u8::try_from(dim).unwrap_or(u8::MAX),
                    index: small(self, "a part's index")?,
                    count: small(self, "a part count")?,
                })
            }
            f => return Err(self.err(at, format!("tensor {name:?}: unknown flags {f:#x}"))),
        };
        Ok(Entry {
            name,
            dtype,
            shape,
            bucket,
            offset,
            part,
        })
    }
}

#[cfg(test)]
mod tests;
