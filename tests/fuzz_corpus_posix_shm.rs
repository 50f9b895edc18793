//! Replays the checked-in fuzz corpus of the posix-shm targets on stable
//! (see `fuzz_corpus.rs`; this plugin links alone into this binary).
//!
//! The seeds are written by `regenerate_seed_corpus` (ignored; run
//! `cargo test -p shardport --test 'fuzz_corpus*' -- --ignored` after a
//! format changes). Inputs the fuzzer found are kept as `finding-*` files
//! next to the seeds and never regenerated.

#[path = "../fuzz/src/posix_shm.rs"]
mod posix_shm;
#[path = "../fuzz/src/replay.rs"]
mod replay;

#[test]
fn every_target_replays_its_corpus() {
    for &(name, run) in posix_shm::TARGETS {
        replay::replay(name, run);
    }
}

/// The seeds reach both outcomes, so the target's assertions are exercised.
#[test]
fn the_seeds_reach_acceptance_and_refusal() {
    use shardport_posix_shm::fuzzing::descriptor_roundtrip;
    let seeds = posix_shm_seeds();
    let accepted: Vec<&str> = seeds
        .iter()
        .filter(|(_, d)| descriptor_roundtrip(d, posix_shm::PREFIX).is_ok())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(accepted, ["pool", "segment"]);
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by hand after a format changes"]
fn regenerate_seed_corpus() {
    replay::write_seeds("descriptor_posix_shm", &posix_shm_seeds());
}

fn posix_shm_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use shardport_kit::codec::Writer;
    let desc =
        |mode: u8, offset: u64, len: u64, slot: u32, generation: u64, seg: &str, board: &str| {
            Writer::new()
                .bytes(b"SPSM")
                .u8(1)
                .u8(mode)
                .u16(0)
                .u64(offset)
                .u64(len)
                .u32(slot)
                .u64(generation)
                .short_str(seg)
                .short_str(board)
                .finish()
        };
    let tag = "shardport-40265_40265_0123456789abcdef0123456789abcdef-1234-5678-ab";
    let pool = desc(
        1,
        4096,
        1000,
        3,
        9,
        &format!("/{tag}-p0"),
        &format!("/{tag}-b1"),
    );
    let segment = desc(2, 0, 1 << 20, 0, 0, &format!("/{tag}-s42"), "");
    let traversal = desc(2, 0, 16, 0, 0, "/shardport-../../etc-s1", "");
    let overflow = desc(
        1,
        u64::MAX,
        2,
        1,
        1,
        &format!("/{tag}-p0"),
        &format!("/{tag}-b1"),
    );
    vec![
        ("pool", pool),
        ("segment", segment),
        ("traversal-name", traversal),
        ("offset-overflow", overflow),
        ("truncated", b"SPSM\x01\x01\x00".to_vec()),
    ]
}
