//! Replays the checked-in fuzz corpus of the cuda-ipc targets on stable
//! (see `fuzz_corpus.rs`; this plugin links alone into this binary).
//!
//! The seeds are written by `regenerate_seed_corpus` (ignored; run
//! `cargo test -p shardport --test 'fuzz_corpus*' -- --ignored` after a
//! format changes). Inputs the fuzzer found are kept as `finding-*` files
//! next to the seeds and never regenerated.

#[path = "../fuzz/src/cuda_ipc.rs"]
mod cuda_ipc;
#[path = "../fuzz/src/replay.rs"]
mod replay;

#[test]
fn every_target_replays_its_corpus() {
    for &(name, run) in cuda_ipc::TARGETS {
        replay::replay(name, run);
    }
}

/// The seeds reach both outcomes, and the target's own CRC-32C agrees with
/// the plugin's.
#[test]
fn the_seeds_reach_acceptance_and_refusal() {
    use shardport_cuda_ipc::descriptor::Descriptor;
    let seeds = cuda_seeds();
    let accepted: Vec<&str> = seeds
        .iter()
        .filter(|(_, d)| Descriptor::decode(d).is_ok())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(accepted, ["valid", "whole-allocation", "vmm-chunks"]);
    assert_eq!(cuda_ipc::crc32c(b"123456789"), 0xE306_9283);
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by hand after a format changes"]
fn regenerate_seed_corpus() {
    replay::write_seeds("descriptor_cuda_ipc", &cuda_seeds());
}

fn cuda_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use shardport_cuda_ipc::descriptor::Descriptor;
    let d = Descriptor {
        boot_id: [7; 16],
        pid: 4242,
        epoch: 99,
        generation: 1,
        device_uuid: [9; 16],
        mem_handle: [3; 64],
        alloc_size: 1 << 20,
        offset: 4096,
        size: 8192,
        event_handle: [5; 64],
        slot: 2,
        slot_generation: 1,
        board: "/shardport-cuda-4242-99".to_owned(),
        chunks: Vec::new(),
    };
    // VMM memory (version 2): three chunks, the shard across two of them.
    let vmm = Descriptor {
        mem_handle: [0; 64],
        alloc_size: 3 << 20,
        offset: (1 << 20) - 100,
        size: 200,
        chunks: vec![1 << 20, 1 << 20, 1 << 20],
        ..d.clone()
    };
    let whole = Descriptor {
        offset: 0,
        size: 1 << 20,
        board: "/shardport-cuda-a".to_owned(),
        ..d.clone()
    };
    let mut outside = d.encode();
    // offset (byte 136) past the allocation, checksum redone.
    outside[136..144].copy_from_slice(&(2u64 << 20).to_le_bytes());
    cuda_ipc::seal(&mut outside);
    assert!(
        Descriptor::decode(&d.encode()).is_ok(),
        "the valid seed decodes"
    );
    vec![
        ("valid", d.encode()),
        ("whole-allocation", whole.encode()),
        ("vmm-chunks", vmm.encode()),
        ("outside-allocation", outside),
        ("short", b"SPCU\x01".to_vec()),
    ]
}
