//! Several nodes in one process: no process globals, no collisions.

use shardport_host::{FetchMode, Node, TensorSpec};

use crate::util;

fn node(extra: &str) -> Node {
    Node::start(util::parse(&format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\nchecksum = \"xxh3\"\n{}",
        util::shm_plugin(extra)
    )))
    .expect("node starts")
}

#[test]
fn two_nodes_in_one_process_fetch_each_others_shards() {
    let a = node("pool-size = \"8MiB\"");
    let b = node("pool-size = \"8MiB\"");
    assert_ne!(a.tag(), b.tag());
    let ha = a
        .put(&[7u8; 1000], &TensorSpec::bytes(1000), Default::default())
        .unwrap();
    let hb = b
        .put(&[9u8; 1000], &TensorSpec::bytes(1000), Default::default())
        .unwrap();
    assert_ne!(ha.exports[0].descriptor, hb.exports[0].descriptor);
    let fa = b.fetch_mode(&ha, FetchMode::View).unwrap();
    let fb = a.fetch_mode(&hb, FetchMode::Copy).unwrap();
    assert!(fa.data.iter().all(|&x| x == 7));
    assert!(fb.data.iter().all(|&x| x == 9));
    assert!(fa.data.is_view() && !fb.data.is_view());
    // Each node's segments carry its own tag.
    assert!(!util::shm_segments(a.tag()).is_empty());
    assert!(!util::shm_segments(b.tag()).is_empty());
    let tag_a = a.tag().to_owned();
    drop(fa);
    drop(a);
    assert_eq!(util::shm_segments(&tag_a), Vec::<String>::new());
    // b is unaffected.
    let again = b.fetch_mode(&hb, FetchMode::Copy).unwrap();
    assert!(again.data.iter().all(|&x| x == 9));
}

#[test]
fn put_validates_its_arguments() {
    let n = node("pool-size = \"1MiB\"");
    let err = n
        .put(
            &[0u8; 10],
            &TensorSpec {
                dtype: shardport_abi::DType::BF16,
                shape: vec![4],
                device: shardport_abi::Device::CPU,
            },
            Default::default(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid shard: 10 bytes given, dtype bf16 with shape [4] needs 8"
    );
    // A full pool is an error, not a crash, and names the config key.
    let err = n
        .put(
            &vec![0u8; 2 << 20],
            &TensorSpec::bytes(2 << 20),
            Default::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("shard storage in `posix-shm` failed:"),
        "{err}"
    );
    assert!(err.contains("pool-size"), "{err}");
}

#[test]
fn checksums_are_computed_at_put_and_checked_at_fetch() {
    let n = node("pool-size = \"1MiB\"");
    let h = n
        .put(&[5u8; 4096], &TensorSpec::bytes(4096), Default::default())
        .unwrap();
    let c = h.meta.checksum.into_option().expect("checksum set");
    assert_eq!(c.value, xxhash_rust::xxh3::xxh3_64(&[5u8; 4096]));
    assert!(n.fetch(&h).is_ok());
    // A handle whose checksum does not match the bytes is caught.
    let mut bad = h.clone();
    bad.meta.checksum = shardport_abi::ROption::RSome(shardport_abi::Checksum {
        algo: c.algo,
        value: c.value ^ 1,
    });
    let err = n.fetch_mode(&bad, FetchMode::Copy).unwrap_err().to_string();
    assert!(err.contains("checksum mismatch via `posix-shm`"), "{err}");
}
