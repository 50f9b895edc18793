//! Checksums of shard bytes: computed at put (in the same pass as the copy
//! into storage) and verified at fetch.

use shardport_abi::{Checksum, ChecksumAlgo, ROption};

use crate::vocab::ChecksumPolicy;

/// The checksum of `data` by `algo`; `None` for an algorithm this host
/// does not know.
pub(super) fn compute(algo: ChecksumAlgo, data: &[u8]) -> Option<u64> {
    match algo {
        ChecksumAlgo::CRC32C => Some(u64::from(crc32c::crc32c(data))),
        ChecksumAlgo::XXH3 => Some(xxhash_rust::xxh3::xxh3_64(data)),
        _ => None,
    }
}

/// Bytes copied per step of [`copy_and_checksum`]: small enough that the
/// hash reads them back from cache, large enough to amortise the loop.
const COPY_CHUNK: usize = 64 << 10;

/// Copies `src` into `dst` (same length) and returns the checksum
/// `policy` asks for, hashing each chunk right after copying it (one pass
/// over memory, not two).
pub(super) fn copy_and_checksum(
    src: &[u8],
    dst: &mut [u8],
    policy: ChecksumPolicy,
) -> ROption<Checksum> {
    let (algo, value) = match policy {
        ChecksumPolicy::None => {
            // Large shards split across cores (a checksum is one pass).
            shardport_kit::copy::copy(src, dst);
            return ROption::RNone;
        }
        ChecksumPolicy::Xxh3 => {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for (s, d) in src.chunks(COPY_CHUNK).zip(dst.chunks_mut(COPY_CHUNK)) {
                d.copy_from_slice(s);
                h.update(d);
            }
            (ChecksumAlgo::XXH3, h.digest())
        }
        ChecksumPolicy::Crc32c => {
            let mut crc = 0u32;
            for (s, d) in src.chunks(COPY_CHUNK).zip(dst.chunks_mut(COPY_CHUNK)) {
                d.copy_from_slice(s);
                crc = crc32c::crc32c_append(crc, d);
            }
            (ChecksumAlgo::CRC32C, u64::from(crc))
        }
    };
    ROption::RSome(Checksum { algo, value })
}

/// The checksum `put.checksum` asks for.
pub(super) fn checksum(policy: ChecksumPolicy, data: &[u8]) -> ROption<Checksum> {
    let algo = match policy {
        ChecksumPolicy::None => return ROption::RNone,
        ChecksumPolicy::Crc32c => ChecksumAlgo::CRC32C,
        ChecksumPolicy::Xxh3 => ChecksumAlgo::XXH3,
    };
    compute(algo, data).map_or(ROption::RNone, |value| {
        ROption::RSome(Checksum { algo, value })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copying_and_hashing_in_one_pass_gives_the_one_shot_checksum() {
        for len in [
            0,
            1,
            COPY_CHUNK - 1,
            COPY_CHUNK,
            COPY_CHUNK + 1,
            3 * COPY_CHUNK + 7,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 3) as u8).collect();
            for policy in [
                ChecksumPolicy::None,
                ChecksumPolicy::Xxh3,
                ChecksumPolicy::Crc32c,
            ] {
                let mut dst = vec![0u8; len];
                let got = copy_and_checksum(&src, &mut dst, policy);
                assert_eq!(dst, src, "{len} bytes, {policy:?}");
                assert_eq!(got, checksum(policy, &src), "{len} bytes, {policy:?}");
            }
        }
    }
}
