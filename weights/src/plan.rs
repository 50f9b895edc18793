//! The packing plan: which bucket each tensor goes into, at which offset.
//!
//! Pure and deterministic from the tensors' byte lengths and the bucket
//! size. Tensors larger than a bucket get a bucket of their own; the others
//! are packed in publish order, each at an offset aligned to [`ALIGN`],
//! into buckets of near-equal size no larger than the bucket size (so the
//! last bucket is not a small remainder that a relay would not carry).

/// Alignment of every tensor in its bucket: a cache line, and a multiple of
/// every dtype's element size, so a receiver may view a tensor in place.
pub const ALIGN: u64 = 64;

/// Where every tensor goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Byte length of each bucket (at least 1: a shard is never empty).
    pub buckets: Vec<u64>,
    /// `(bucket, offset)` of each tensor, in input order.
    pub places: Vec<(u32, u64)>,
}

/// Plans buckets of at most `bucket_size` bytes for tensors of `lens` bytes.
pub fn pack(lens: &[u64], bucket_size: u64) -> Plan {
    let bucket_size = bucket_size.max(ALIGN);
    let small: u64 = lens
        .iter()
        .filter(|&&l| l <= bucket_size)
        .map(|&l| align_up(l))
        .sum();
    // Near-equal buckets: as many as the small tensors need, each filled to
    // about the mean before the next opens.
    let target = match small.div_ceil(bucket_size) {
        0 => bucket_size,
        k => small.div_ceil(k),
    };
    let mut buckets: Vec<u64> = Vec::new();
    let mut places = Vec::with_capacity(lens.len());
    let mut open: Option<usize> = None;
    for &len in lens {
        if len > bucket_size {
            places.push((buckets.len() as u32, 0));
            buckets.push(len);
            continue;
        }
        let b = match open {
            Some(b) if buckets[b] < target && align_up(buckets[b]) + len <= bucket_size => b,
            _ => {
                buckets.push(0);
                buckets.len() - 1
            }
        };
        open = Some(b);
        let offset = align_up(buckets[b]);
        places.push((b as u32, offset));
        buckets[b] = offset + len;
    }
    for b in &mut buckets {
        *b = (*b).max(1);
    }
    Plan { buckets, places }
}

/// [`pack`] for tensors in groups: each group's tensors are packed into
/// buckets of their own (a receiver that needs one group fetches only its
/// buckets), groups in ascending order; `groups[i]` is tensor `i`'s group.
pub fn pack_groups(lens: &[u64], groups: &[u32], bucket_size: u64) -> Plan {
    let mut ids: Vec<u32> = groups.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut plan = Plan {
        buckets: Vec::new(),
        places: vec![(0, 0); lens.len()],
    };
    for g in ids {
        let members: Vec<usize> = (0..lens.len()).filter(|&i| groups[i] == g).collect();
        let sub: Vec<u64> = members.iter().map(|&i| lens[i]).collect();
        let p = pack(&sub, bucket_size);
        let base = plan.buckets.len() as u32;
        for (&i, &(b, off)) in members.iter().zip(&p.places) {
            plan.places[i] = (base + b, off);
        }
        plan.buckets.extend(p.buckets);
    }
    plan
}

fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn small_tensors_share_near_equal_buckets_and_large_ones_have_their_own() {
        let mut lens = vec![4 << 20; 3];
        lens.extend(std::iter::repeat_n(100_000, 100));
        lens.push(40 << 20);
        let p = pack(&lens, 16 << 20);
        // 12 MiB + ~9.6 MiB of small tensors: two buckets of about 11 MiB.
        assert_eq!(p.buckets.len(), 3);
        assert_eq!(p.places[103], (2, 0));
        assert_eq!(p.buckets[2], 40 << 20);
        let (a, b) = (p.buckets[0], p.buckets[1]);
        assert!(a.abs_diff(b) < 4 << 20, "{a} vs {b}");
    }

    #[test]
    fn an_empty_state_dict_and_zero_length_tensors_plan_valid_buckets() {
        assert_eq!(pack(&[], 1 << 20).buckets, Vec::<u64>::new());
        let p = pack(&[0, 0], 1 << 20);
        assert_eq!(p.buckets, vec![1]);
        assert_eq!(p.places, vec![(0, 0), (0, 0)]);
    }

    #[test]
    fn groups_never_share_a_bucket() {
        let lens = [100, 200, 300, 400, 500];
        let p = pack_groups(&lens, &[0, 1, 0, 2, 1], 1 << 20);
        assert_eq!(p.buckets.len(), 3);
        let bucket = |i: usize| p.places[i].0;
        assert_eq!(bucket(0), bucket(2));
        assert_eq!(bucket(1), bucket(4));
        assert!(bucket(0) != bucket(1) && bucket(1) != bucket(3) && bucket(0) != bucket(3));
        assert_eq!(pack_groups(&lens, &[0; 5], 1 << 20), pack(&lens, 1 << 20));
    }

    proptest! {
        #[test]
        fn every_tensor_fits_its_bucket_aligned_and_apart(
            lens in proptest::collection::vec(0u64..3_000_000, 0..200),
            size in 64u64..4_000_000,
        ) {
            let p = pack(&lens, size);
            prop_assert_eq!(p.places.len(), lens.len());
            let mut spans: Vec<(u32, u64, u64)> = Vec::new();
            for (&len, &(b, off)) in lens.iter().zip(&p.places) {
                let blen = p.buckets[b as usize];
                prop_assert_eq!(off % ALIGN, 0);
                prop_assert!(off + len <= blen);
                // Only a tensor too large for a bucket makes one larger.
                prop_assert!(blen <= size.max(ALIGN) || (len == blen && off == 0));
                spans.push((b, off, len));
            }
            spans.sort_unstable();
            for w in spans.windows(2) {
                prop_assert!(w[0].0 != w[1].0 || w[0].1 + w[0].2 <= w[1].1);
            }
            prop_assert_eq!(pack(&lens, size), p);
        }
    }
}
