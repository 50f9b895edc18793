//! Replays the checked-in fuzz corpus of the spool-dir targets on stable
//! (see `fuzz_corpus.rs`; this plugin links alone into this binary).
//!
//! The seeds are written by `regenerate_seed_corpus` (ignored; run
//! `cargo test -p shardport --test 'fuzz_corpus*' -- --ignored` after a
//! format changes). Inputs the fuzzer found are kept as `finding-*` files
//! next to the seeds and never regenerated.

#[path = "../fuzz/src/replay.rs"]
mod replay;
#[path = "../fuzz/src/spool.rs"]
mod spool;

#[test]
fn every_target_replays_its_corpus() {
    for &(name, run) in spool::TARGETS {
        replay::replay(name, run);
    }
}

/// The seeds reach both outcomes.
#[test]
fn the_seeds_reach_acceptance_and_refusal() {
    use shardport_spool_transport::descriptor::Descriptor;
    let accepted: Vec<&str> = spool_seeds()
        .iter()
        .filter(|(_, d)| Descriptor::decode(d).is_ok())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(accepted, ["valid"]);
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by hand after a format changes"]
fn regenerate_seed_corpus() {
    replay::write_seeds("descriptor_spool", &spool_seeds());
}

fn spool_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use shardport_kit::codec::Writer;
    use shardport_spool_transport::descriptor::Descriptor;
    let raw = |name: &str, len: u64| {
        Writer::new()
            .bytes(b"SPDR")
            .u8(1)
            .short_str(name)
            .u64(len)
            .finish()
    };
    let ok = Descriptor {
        file_name: "node-1-0000000000000000000000000000002a.shard".to_owned(),
        byte_len: 4096,
    };
    vec![
        ("valid", ok.encode()),
        ("dotdot", raw("../../etc/passwd.shard", 1)),
        ("tmp-file", raw("node-1-2a.tmp", 1)),
        ("trailing", {
            let mut b = ok.encode();
            b.push(0);
            b
        }),
    ]
}
