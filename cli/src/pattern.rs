//! The deterministic byte pattern the bench, the worker and the GPU
//! helpers write and check: a shard's bytes follow from its seed, so any
//! process can verify what another put without the bytes crossing twice.

/// Fills `buf` with the deterministic pattern for `seed`.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&splitmix(seed ^ (i as u64).wrapping_mul(0x9e37_79b9)).to_le_bytes());
    }
    let rem = chunks.into_remainder();
    let tail = splitmix(!seed).to_le_bytes();
    rem.copy_from_slice(&tail[..rem.len()]);
}

/// True when `buf` holds exactly the pattern for `seed`.
pub fn check_pattern(buf: &[u8], seed: u64) -> bool {
    let mut chunks = buf.chunks_exact(8);
    for (i, c) in (&mut chunks).enumerate() {
        if c != splitmix(seed ^ (i as u64).wrapping_mul(0x9e37_79b9)).to_le_bytes() {
            return false;
        }
    }
    let rem = chunks.remainder();
    rem == &splitmix(!seed).to_le_bytes()[..rem.len()]
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
