//! A hasher for keys this process makes itself: shard ids, lease tokens.
//!
//! `std`'s default (SipHash) resists keys chosen to collide, which costs
//! ~20 ns per lookup of a 16-byte key; an owner looks up its own shard ids
//! several times per put and remove. [`IdHasher`] is one rotate, xor and
//! widening multiply per word, the product's halves folded together. Use
//! it only where no peer picks the keys (ids from a remote handle are a
//! peer's choice: keep SipHash there).
//!
//! ```
//! use shardport_abi::ShardId;
//! use shardport_kit::hash::IdHashMap;
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

/// Odd, with bits spread over the whole word (2^64 / golden ratio).
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Folded-multiply hashing of whole words (see the module docs).
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
        // A 64 x 64 -> 128-bit multiply, its halves folded together: every
        // input bit reaches every output bit, low (the table's bucket
        // index) and high (its tags) alike.
        let full = u128::from(self.0.rotate_left(26) ^ x) * u128::from(K);
        self.0 = (full as u64) ^ ((full >> 64) as u64);
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
    use shardport_abi::ShardId;

    fn hash(x: impl Hash) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(x)
    }

    /// How many of 4096 keys share their bucket of a 4096-bucket table
    /// with another, the most keys in one bucket, and how many 7-bit tags
    /// (hashbrown's top bits) occur.
    fn spread(keys: impl Iterator<Item = ShardId>) -> (usize, u32, usize) {
        let mut buckets = vec![0u32; 4096];
        let mut tags = std::collections::HashSet::new();
        for k in keys {
            let h = hash(k);
            buckets[(h & 4095) as usize] += 1;
            tags.insert(h >> 57);
        }
        let crowded = buckets
            .iter()
            .filter(|&&n| n > 1)
            .map(|&n| n as usize)
            .sum();
        (
            crowded,
            buckets.iter().copied().max().unwrap_or(0),
            tags.len(),
        )
    }

    #[test]
    fn ids_spread_over_buckets_and_tags() {
        // A node's ids share `hi` and count up in `lo`; other shapes of
        // key (steps of 2^32, only `hi` varying) must spread as well. A
        // uniform random hash leaves ~37% of keys alone in their bucket
        // (63% share one) and rarely puts more than 7 in one.
        let hi = 0xabcd_ef01;
        let shapes: [(&str, Vec<ShardId>); 3] = [
            (
                "sequential",
                (0..4096).map(|lo| ShardId { hi, lo }).collect(),
            ),
            (
                "2^32 steps",
                (0..4096).map(|n| ShardId { hi, lo: n << 32 }).collect(),
            ),
            (
                "hi only",
                (0..4096).map(|n| ShardId { hi: n, lo: 7 }).collect(),
            ),
        ];
        for (what, keys) in shapes {
            let (crowded, most, tags) = spread(keys.into_iter());
            assert!(
                crowded < 4096 * 70 / 100,
                "{what}: {crowded} keys share buckets"
            );
            assert!(most <= 9, "{what}: {most} keys in one bucket");
            assert!(tags > 120, "{what}: only {tags} tags of 128");
        }
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
