//! A hasher for keys this process makes itself: shard ids, lease tokens.
//!
//! `std`'s default (SipHash) resists keys chosen to collide, which costs
//! ~20 ns per lookup of a 16-byte key; an owner looks up its own shard ids
//! several times per put and remove. [`IdHasher`] is one rotate, xor and
//! multiply per word. Use it only where no peer picks the keys (ids from a
//! remote handle are a peer's choice: keep SipHash there).
//!
//! ```
//! use shardport_abi::{kit::hash::IdHashMap, ShardId};
//!
//! let mut live: IdHashMap<ShardId, &str> = IdHashMap::default();
//! live.insert(ShardId { hi: 7, lo: 1 }, "first");
//! assert_eq!(live.get(&ShardId { hi: 7, lo: 1 }), Some(&"first"));
//! ```

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
};

/// A `HashMap` keyed by ids this process makes (see the module docs).
pub type IdHashMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Odd, with bits spread over the whole word (2^64 / golden ratio): a
/// multiply by it moves every input bit into the high bits the table's
/// tags read, and permutes the low bits its bucket index reads.
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Multiplicative hashing of whole words (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(26) ^ x).wrapping_mul(K);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hash};

    use super::*;
    use crate::ShardId;

    fn hash(x: impl Hash) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(x)
    }

    #[test]
    fn sequential_ids_spread_over_buckets_and_tags() {
        // A node's ids share `hi` and count up in `lo`: 4096 of them must
        // fill a 4096-bucket table's index bits evenly (a permutation of
        // the low 12 bits) and use many 7-bit tags.
        let mut buckets = vec![0u32; 4096];
        let mut tags = std::collections::HashSet::new();
        for lo in 0..4096u64 {
            let h = hash(ShardId {
                hi: 0xabcd_ef01,
                lo,
            });
            buckets[(h & 4095) as usize] += 1;
            tags.insert(h >> 57);
        }
        assert!(buckets.iter().all(|&n| n == 1), "low bits collide");
        assert!(tags.len() > 100, "only {} tags of 128", tags.len());
    }

    #[test]
    fn every_field_and_byte_counts() {
        assert_ne!(
            hash(ShardId { hi: 1, lo: 2 }),
            hash(ShardId { hi: 2, lo: 1 })
        );
        assert_ne!(
            hash(ShardId { hi: 1, lo: 0 }),
            hash(ShardId { hi: 0, lo: 0 })
        );
        assert_ne!(hash([1u8, 2, 3].as_slice()), hash([1u8, 2, 4].as_slice()));
        assert_ne!(hash(*b"123456789"), hash(*b"123456788"));
    }
}
