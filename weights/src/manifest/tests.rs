use std::collections::BTreeMap;

use proptest::prelude::*;
use shardport_abi::{Device, ROption, RVec, ShardId, ShardMeta};
use shardport_host::{
    handle::{Export, Owner},
    identity::NodeIdentity,
    vocab::TransportName,
};

use super::*;

fn handle(id: u128, len: u64) -> Handle {
    Handle {
        id: ShardId::from_u128(id),
        meta: ShardMeta {
            dtype: DType::U8,
            shape: RVec::from(vec![len]),
            device: Device::CPU,
            byte_len: len,
            checksum: ROption::RNone,
        },
        tags: BTreeMap::new(),
        owner: Owner {
            addr: "10.0.0.1:7070".into(),
            identity: NodeIdentity {
                boot_id: "0123456789abcdef0123456789abcdef".into(),
                shm_device: 7,
                ipc_ns: 8,
                pid_ns: 9,
            },
            epoch: 42,
        },
        exports: vec![Export {
            transport: TransportName::new("http").unwrap(),
            descriptor: vec![1, 2, 3, 4],
        }],
    }
}

fn entry(name: &str, shape: &[u64], bucket: u32, offset: u64) -> Entry {
    Entry {
        name: name.into(),
        dtype: DType::F32,
        shape: shape.to_vec(),
        bucket,
        offset,
        part: None,
    }
}

fn sample() -> Manifest {
    Manifest {
        version: 7,
        buckets: vec![
            Bucket {
                handle: handle(1, 4096),
                hash: [3; 32],
            },
            Bucket {
                handle: handle(2, 1 << 20),
                hash: [4; 32],
            },
        ],
        tensors: vec![
            entry("embed.weight", &[16, 32], 0, 0),
            entry("ln.bias", &[32], 0, 2048),
            entry("layers.0.mlp.weight", &[512, 512], 1, 0),
        ],
    }
}

#[test]
fn a_manifest_roundtrips_and_costs_a_few_bytes_per_tensor_beyond_name_and_shape() {
    let m = sample();
    let bytes = m.to_bytes();
    assert_eq!(Manifest::from_bytes(&bytes).unwrap(), m);
    // Per tensor beyond the name: dtype, rank, dims, bucket, offset.
    let handles: usize = m
        .buckets
        .iter()
        .map(|b| b.handle.to_bytes().len() + 2 + 32)
        .sum();
    let names: usize = m.tensors.iter().map(|e| e.name.len() + 1).sum();
    let per_tensor = (bytes.len() - 5 - 2 - handles - names) / m.tensors.len();
    assert!(per_tensor <= 12, "{per_tensor} bytes per tensor");
}

#[test]
fn every_truncation_is_refused_naming_what_was_cut() {
    let bytes = sample().to_bytes();
    for n in 0..bytes.len() {
        let e = Manifest::from_bytes(&bytes[..n]).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("bad manifest"), "{n}: {text}");
        assert!(matches!(e, WeightsError::Manifest { .. }), "{n}: {text}");
    }
    let mut long = bytes.clone();
    long.push(0);
    let e = Manifest::from_bytes(&long).unwrap_err().to_string();
    assert!(e.contains("1 bytes after the last tensor"), "{e}");
}

#[test]
fn contradictory_entries_are_refused_naming_the_tensor() {
    type Edit = Box<dyn Fn(&mut Manifest)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|m| m.tensors[1].name = "embed.weight".into()),
            "\"embed.weight\": named twice",
        ),
        (
            Box::new(|m| m.tensors[1].offset = 2047),
            "\"ln.bias\": overlaps tensor \"embed.weight\"",
        ),
        (
            Box::new(|m| m.tensors[1].offset = 4000),
            "\"ln.bias\": bytes 4000..+128 lie outside bucket 0 of 4096",
        ),
        (
            Box::new(|m| m.tensors[2].bucket = 9),
            "\"layers.0.mlp.weight\": bucket 9 of 2",
        ),
        (
            Box::new(|m| m.tensors[0].dtype = DType(250)),
            "unknown dtype code 250",
        ),
        (
            Box::new(|m| m.tensors[0].shape = vec![u64::MAX, 4]),
            "has no byte length",
        ),
        (Box::new(|m| m.tensors[0].name.clear()), "empty name"),
    ];
    for (edit, want) in cases {
        let mut m = sample();
        edit(&mut m);
        let e = Manifest::from_bytes(&m.to_bytes()).unwrap_err().to_string();
        assert!(e.contains(want), "want {want:?} in {e}");
    }
}

#[test]
fn parts_roundtrip_and_impossible_parts_are_refused() {
    let mut m = sample();
    let part = |index, count| {
        Some(Part {
            dim: 1,
            index,
            count,
        })
    };
    m.tensors[0].part = part(0, 2);
    m.tensors.push(Entry {
        offset: 1024,
        ..m.tensors[0].clone()
    });
    m.tensors[3].part = part(1, 2);
    m.tensors[0].shape = vec![16, 16];
    m.tensors[3].shape = vec![16, 16];
    assert_eq!(Manifest::from_bytes(&m.to_bytes()).unwrap(), m);
    let mut twice = m.clone();
    twice.tensors[3].part = part(0, 2);
    let e = Manifest::from_bytes(&twice.to_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"embed.weight\": named twice"), "{e}");
    let mut outside = m.clone();
    outside.tensors[3].part = part(2, 2);
    let e = Manifest::from_bytes(&outside.to_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("part 2 of 2 along dimension 1"), "{e}");
}

#[test]
fn another_format_and_another_magic_are_refused() {
    let mut bytes = sample().to_bytes();
    bytes[4] = 1;
    let e = Manifest::from_bytes(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("manifest format 1; this version reads format 2"),
        "{e}"
    );
    let e = Manifest::from_bytes(b"SPHD\x02....")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a weights manifest"), "{e}");
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Manifest::from_bytes(&bytes);
    }

    #[test]
    fn a_flipped_byte_is_refused_or_decodes_to_a_checked_manifest(at in 0usize..2000, bit in 0u8..8) {
        let mut bytes = sample().to_bytes();
        let at = at % bytes.len();
        bytes[at] ^= 1 << bit;
        if let Ok(m) = Manifest::from_bytes(&bytes) {
            prop_assert!(m.check().is_ok());
        }
    }
}
