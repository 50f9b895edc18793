//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/`) through
//! the fuzz targets over the host and the CLI on stable, so `cargo test
//! --workspace` checks every seed and past finding without nightly or
//! cargo-fuzz. Each transport's targets replay in `fuzz_corpus_<plugin>.rs`
//! (two plugins cannot link into one binary).
//!
//! The seeds are written by `regenerate_seed_corpus` (ignored; run
//! `cargo test -p shardport --test 'fuzz_corpus*' -- --ignored` after a
//! format changes). Inputs the fuzzer found are kept as `finding-*` files
//! next to the seeds and never regenerated.

#[path = "../fuzz/src/replay.rs"]
mod replay;
#[path = "../fuzz/src/lib.rs"]
mod targets;

use std::{fs, path::Path};

#[test]
fn every_target_replays_its_corpus() {
    for &(name, run) in targets::TARGETS {
        replay::replay(name, run);
    }
}

#[test]
fn the_checked_in_corpus_stays_small() {
    let root = replay::corpus_dir("");
    let mut total = 0;
    for dir in fs::read_dir(&root).expect("fuzz/corpus") {
        for file in fs::read_dir(dir.expect("a corpus").path()).expect("a corpus") {
            total += file.expect("an input").metadata().expect("metadata").len();
        }
    }
    assert!(total < 200 * 1024, "fuzz/corpus holds {total} bytes");
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by hand after a format changes"]
fn regenerate_seed_corpus() {
    replay::write_seeds("handle_bytes", &handle_seeds(true));
    replay::write_seeds("handle_json", &handle_seeds(false));
    replay::write_seeds("control_head", &control_seeds());
    replay::write_seeds("config_toml", &config_seeds());
    replay::write_seeds("snapshot_json", &snapshot_seeds());
    replay::write_seeds("weights_manifest", &manifest_seeds());
}

/// Manifests of one and of two buckets, with the handles' seeds inside.
fn manifest_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use shardport_abi::DType;
    use shardport_host::handle::Handle;
    use shardport_weights::manifest::{Bucket, Entry, Manifest};
    let handles: Vec<Handle> = handle_seeds(true)
        .into_iter()
        .filter_map(|(_, b)| Handle::from_bytes(&b).ok())
        .collect();
    let entry = |name: &str, shape: &[u64], bucket: u32, offset: u64| Entry {
        name: name.to_owned(),
        dtype: DType::F32,
        shape: shape.to_vec(),
        bucket,
        offset,
        part: None,
    };
    // Every seed handle is a 2x3 f32 shard (24 bytes) or larger.
    let one = Manifest {
        version: 3,
        buckets: vec![Bucket {
            handle: handles[0].clone(),
            hash: [7; 32],
        }],
        tensors: vec![entry("w", &[2, 3], 0, 0)],
    };
    let two = Manifest {
        version: 1 << 40,
        buckets: handles
            .iter()
            .take(2)
            .map(|h| Bucket {
                handle: h.clone(),
                hash: [9; 32],
            })
            .collect(),
        tensors: vec![
            entry("layers.0.bias", &[2], 0, 0),
            entry("layers.0.weight", &[1, 2], 1, 0),
            entry("scalar", &[], 1, 8),
        ],
    };
    // A tensor in two parts (a tensor-parallel split along dimension 1).
    let mut parts = one.clone();
    parts.tensors = (0..2)
        .map(|index| Entry {
            part: Some(shardport_weights::manifest::Part {
                dim: 1,
                index,
                count: 2,
            }),
            ..entry("w", &[2, 1], 0, 8 * u64::from(index))
        })
        .collect();
    let two = two.to_bytes();
    let cut = two[..two.len() / 2].to_vec();
    vec![
        ("one-bucket", one.to_bytes()),
        ("two-buckets", two),
        ("truncated", cut),
        ("parts", parts.to_bytes()),
    ]
}

fn handle_seeds(binary: bool) -> Vec<(&'static str, Vec<u8>)> {
    use shardport_abi::{Checksum, ChecksumAlgo, DType, Device, ROption, RVec, ShardId, ShardMeta};
    use shardport_host::{
        handle::{Export, Handle, Owner},
        identity::NodeIdentity,
        vocab::TransportName,
    };
    let handle = |shape: Vec<u64>, tags: &[(&str, &str)], exports: &[(&str, Vec<u8>)]| {
        let dtype = DType::from_name("f32").expect("f32");
        let meta = ShardMeta {
            dtype,
            byte_len: shape.iter().product::<u64>() * 4,
            shape: RVec::from(shape),
            device: Device::parse("cpu").expect("cpu"),
            checksum: ROption::RSome(Checksum {
                algo: ChecksumAlgo::CRC32C,
                value: 0xdead_beef,
            }),
        };
        Handle {
            id: ShardId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
            meta,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            owner: Owner {
                addr: "127.0.0.1:7000".to_owned(),
                identity: NodeIdentity {
                    boot_id: "6c1f2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b".to_owned(),
                    shm_device: 38,
                    ipc_ns: 4026531839,
                    pid_ns: 4026531836,
                },
                epoch: 1_764_000_000_000_000_000,
            },
            exports: exports
                .iter()
                .map(|(t, d)| Export {
                    transport: TransportName::new(t).expect("a transport name"),
                    descriptor: d.clone(),
                })
                .collect(),
        }
    };
    // Descriptors are opaque to a handle: any non-empty bytes do.
    let shm = b"SPSM\x01\x01".to_vec();
    let http = b"SPHT\x01".to_vec();
    let handles = [
        (
            "one-export",
            handle(vec![2, 3], &[], &[("posix-shm", shm.clone())]),
        ),
        (
            "two-exports-tags",
            handle(
                vec![4],
                &[("layer", "3"), ("role", "actor")],
                &[("posix-shm", shm), ("http", http)],
            ),
        ),
        (
            "scalar",
            handle(vec![], &[], &[("spool-dir", b"x".to_vec())]),
        ),
        (
            "zero-dim",
            handle(vec![0, 7], &[], &[("http", vec![1; 40])]),
        ),
    ];
    let mut out: Vec<(&'static str, Vec<u8>)> = handles
        .iter()
        .map(|(name, h)| {
            assert!(h.validate().is_ok(), "seed {name} is valid");
            (
                *name,
                if binary {
                    h.to_bytes()
                } else {
                    h.to_json().into_bytes()
                },
            )
        })
        .collect();
    if binary {
        let mut trailing = handles[0].1.to_bytes();
        trailing.push(0);
        out.push(("trailing-byte", trailing));
        out.push(("magic-only", b"SPHD\x01".to_vec()));
    } else {
        out.push(("not-an-object", b"[1,2,3]".to_vec()));
        let j = handles[0]
            .1
            .to_json()
            .replace("\"version\":1", "\"version\":2");
        out.push(("version-2", j.into_bytes()));
    }
    out
}

fn control_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let req = |s: &str| s.as_bytes().to_vec();
    vec![
        ("get-metrics", req("GET /v1/metrics.json HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer t0k\r\n\r\n")),
        ("post-body", req("POST /v1/reload HTTP/1.1\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}")),
        ("two-lengths", req("POST /v1/reload HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n{}")),
        ("te-and-cl", req("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n")),
        ("obs-fold", req("GET / HTTP/1.1\r\nx: a\r\n  b\r\n\r\n")),
        ("bare-cr", req("GET / HTTP/1.1\r\nx: a\rb\r\n\r\n")),
        ("lf-only", req("GET / HTTP/1.1\nhost: x\n\n")),
    ]
}

fn config_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = |name: &str| fs::read(root.join("configs").join(name)).expect("a config");
    vec![
        ("default.toml", file("default.toml")),
        ("single-node.toml", file("single-node.toml")),
        ("multi-node.toml", file("multi-node.toml")),
        ("ab-test.toml", file("ab-test.toml")),
        (
            "unknown-key",
            b"[node]\nname = \"a\"\nnmae = \"b\"\n".to_vec(),
        ),
        (
            "bad-size",
            b"[cache]\nmax-bytes = \"12 parsecs\"\n".to_vec(),
        ),
        ("not-toml", b"[node\nname = = 1\n".to_vec()),
    ]
}

fn snapshot_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let series = |name: &str, counts: &str| {
        format!(
            "{{\"name\":\"{name}\",\"transport\":\"{name}\",\"fetches\":30,\"bytes\":122880,\
             \"errors\":1,\"downgrades\":0,\"latency_ns_total\":900000,\
             \"latency\":[{{\"size\":\"4KiB\",\"counts\":{counts},\"sum_ns\":900000}}]}}"
        )
    };
    let arm = |name: &str, counts: &str| {
        format!(
            "{{\"weight\":50,\"state\":\"enabled\",\"share\":0.5,\"assigned\":31,\
             \"guardrail_trips\":0,\"redirected\":0,\"series\":{}}}",
            series(name, counts)
        )
    };
    let full = format!(
        "{{\"format\":\"shardport-metrics/1\",\"node\":\"n1\",\"taken_at_unix_ms\":1764000000000,\
         \"window_s\":12.5,\"transports\":[{}],\"experiments\":[{{\"name\":\"e\",\"unit\":\"shard\",\
         \"control\":\"a\",\"arms\":[{},{}],\"ramp_step\":1,\"ramp_halted\":false}}],\
         \"downgrades\":2,\"no_candidate\":0,\"leaked_bytes\":0,\
         \"gauges\":[{{\"name\":\"cache_bytes\",\"labels\":[[\"t\",\"x\"]],\"value\":1.5e3}}],\
         \"reloads\":1,\"reloads_refused\":0,\"events\":[{{\"at_unix_ms\":1764000000001,\
         \"kind\":\"trip\",\"experiment\":\"e\",\"text\":\"arm b tripped\"}}]}}",
        series("posix-shm", "[[1000,10],[30000,20]]"),
        arm("a", "[[1000,10],[30000,20]]"),
        arm("b", "[[2000,15],[40000,15]]"),
    );
    let minimal = "{\"format\":\"shardport-metrics/1\",\"node\":\"n\",\"taken_at_unix_ms\":0,\
                   \"window_s\":0,\"transports\":[],\"downgrades\":0,\"no_candidate\":0}";
    vec![
        ("full", full.into_bytes()),
        ("minimal", minimal.as_bytes().to_vec()),
        (
            "other-format",
            minimal.replace("metrics/1", "metrics/2").into_bytes(),
        ),
        (
            "not-json",
            b"{\"format\": \"shardport-metrics/1\",".to_vec(),
        ),
    ]
}
