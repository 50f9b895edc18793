//! Behaviour of whole transport instances, driven through the `Transport`
//! trait object exactly as the host drives it. Owner and consumer are two
//! instances (two node tags) in this process; they share `/dev/shm` as two
//! processes on one node would. Every test checks that it leaves nothing in
//! `/dev/shm`.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use shardport_abi::{
    AbiError, AllocationGuard, ErrorKind, ExportRequest, LeasedView, PluginContext, RSlice,
    RSliceMut, ShardId, ShardMeta, SharedBytes, SharedTransport, StatKind,
};
use shardport_kit::testing;

use crate::{
    descriptor::{Descriptor, Mode},
    liveness::Here,
    names::{Kind, NameGen},
    sys::OwnedSegment,
};

// Hostile descriptors, bad tokens and arguments, config errors.
mod hostile;

/// One transport instance, its segment prefix and its node tag.
/// On drop, asserts that the instance left nothing in /dev/shm.
pub(crate) struct Node {
    t: Option<SharedTransport>,
    pub(crate) prefix: String,
    pub(crate) tag: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.t.take());
        if !std::thread::panicking() {
            assert_eq!(self.segments(), Vec::<String>::new(), "left in /dev/shm");
        }
    }
}

impl Node {
    pub(crate) fn new(config: &str) -> Node {
        Node::try_new(config).unwrap()
    }

    pub(crate) fn try_new(config: &str) -> Result<Node, AbiError> {
        let tag = testing::unique_node_tag();
        Node::build(config, &tag, Here::current())
    }

    /// An instance with node tag `tag` that believes it is the process `here`.
    pub(crate) fn build(config: &str, tag: &str, here: Here) -> Result<Node, AbiError> {
        let mut ctx = testing::context("shm", config);
        ctx.node_tag = tag.into();
        let prefix = crate::config::Config::parse("shm", config)
            .map_or_else(|_| "shardport".to_owned(), |c| c.segment_prefix);
        let t = crate::create_as(PluginContext::new(ctx), here)?;
        Ok(Node {
            t: Some(Arc::new(t)),
            prefix,
            tag: tag.to_owned(),
        })
    }

    pub(crate) fn t(&self) -> &SharedTransport {
        self.t.as_ref().expect("alive")
    }

    /// Names in /dev/shm that belong to this node.
    pub(crate) fn segments(&self) -> Vec<String> {
        segments_of(&self.prefix, &self.tag)
    }

    /// Exports `bytes` by copy.
    pub(crate) fn put(&self, id: u128, bytes: &[u8]) -> Result<Vec<u8>, AbiError> {
        self.t()
            .export(ExportRequest {
                id: ShardId::from_u128(id),
                meta: ShardMeta::bytes(bytes.len() as u64),
                data: SharedBytes::lend(bytes),
                allocation: 0,
            })
            .into_result()
            .map(|d| d.into_vec())
    }

    /// Writes `bytes` into an allocation and exports it in place. The guard
    /// must outlive the shard's unexport (the host's side of the contract).
    pub(crate) fn put_in_place(
        &self,
        id: u128,
        bytes: &[u8],
    ) -> Result<(Vec<u8>, AllocationGuard), AbiError> {
        let sid = ShardId::from_u128(id);
        let mut g = AllocationGuard::allocate(self.t(), sid, bytes.len() as u64)?;
        g.as_mut_slice().copy_from_slice(bytes);
        let desc = self
            .t()
            .export(ExportRequest {
                id: sid,
                meta: ShardMeta::bytes(bytes.len() as u64),
                data: SharedBytes::lend(g.as_slice()),
                allocation: g.token(),
            })
            .into_result()?
            .into_vec();
        g.mark_exported();
        Ok((desc, g))
    }

    pub(crate) fn unexport(&self, id: u128) -> Result<(), AbiError> {
        self.t().unexport(ShardId::from_u128(id)).into_result()
    }

    pub(crate) fn copy(&self, desc: &[u8], len: u64) -> Result<Vec<u8>, AbiError> {
        let mut buf = vec![0u8; len as usize];
        self.t()
            .import_into(
                RSlice::from_slice(desc),
                &ShardMeta::bytes(len),
                RSliceMut::from_mut_slice(&mut buf),
            )
            .into_result()?;
        Ok(buf)
    }

    pub(crate) fn view(&self, desc: &[u8], len: u64) -> Result<LeasedView, AbiError> {
        LeasedView::import(self.t(), desc, &ShardMeta::bytes(len))
    }

    pub(crate) fn private_view(&self, desc: &[u8], len: u64) -> Result<LeasedView, AbiError> {
        LeasedView::import_private(self.t(), desc, &ShardMeta::bytes(len))
    }

    pub(crate) fn stat(&self, name: &str) -> u64 {
        self.t()
            .stats()
            .iter()
            .find(|s| s.name.as_str() == name)
            .unwrap_or_else(|| panic!("no stat {name}"))
            .value
    }
}

/// Names in /dev/shm with `prefix` whose node tag is `tag`.
pub(crate) fn segments_of(prefix: &str, tag: &str) -> Vec<String> {
    let start = format!("{prefix}-");
    let tag = format!("-{tag}-");
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&start) && n.contains(&tag))
        .collect();
    v.sort();
    v
}

/// An owner and a consumer instance.
struct Pair {
    owner: Node,
    consumer: Node,
}

impl Pair {
    fn new(owner_config: &str) -> Pair {
        Pair {
            owner: Node::new(owner_config),
            consumer: Node::new(""),
        }
    }
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub(crate) fn decode(desc: &[u8]) -> Descriptor<'static> {
    Descriptor::decode(desc, "shardport").unwrap().into_owned()
}

const SMALL_POOL: &str = "pool-size = \"64KiB\"";

#[test]
fn describe_reports_capabilities() {
    let n = Node::new("");
    let info = n.t().describe();
    assert_eq!(info.name.as_str(), "posix-shm");
    assert_eq!(
        info.capabilities.names(),
        ["cpu", "same-node-only", "zero-copy", "allocator"]
    );
    assert_eq!(
        info.needs_identity,
        shardport_abi::IdentityParts::BOOT_ID.with(shardport_abi::IdentityParts::SHM_DEVICE)
    );
    let h = n.t().health();
    assert!(h.ok, "{}", h.message);
}

#[test]
fn pool_roundtrip_copy_and_view() {
    let p = Pair::new(SMALL_POOL);
    let a = pattern(1000, 1);
    let b = pattern(5000, 2);
    let da = p.owner.put(1, &a).unwrap();
    let (db, _guard) = p.owner.put_in_place(2, &b).unwrap();
    assert_eq!(decode(&da).mode, Mode::Pool);
    assert_eq!(decode(&db).offset % 64, 0);

    assert_eq!(p.consumer.copy(&da, 1000).unwrap(), a);
    assert_eq!(p.consumer.copy(&db, 5000).unwrap(), b);
    {
        let va = p.consumer.view(&da, 1000).unwrap();
        let vb = p.consumer.view(&db, 5000).unwrap();
        assert_eq!(&*va, &a[..]);
        assert_eq!(&*vb, &b[..]);
        assert_eq!(p.consumer.stat("leases_active"), 2);
        assert_eq!(p.owner.stat("leases_held_on_owner"), 2);
        assert_eq!(p.consumer.stat("segments_mapped"), 2);
    }
    assert_eq!(p.consumer.stat("leases_active"), 0);
    assert_eq!(p.owner.stat("leases_held_on_owner"), 0);
    assert_eq!(p.consumer.stat("imports_copy"), 2);
    assert_eq!(p.consumer.stat("imports_view"), 2);
    assert_eq!(p.consumer.stat("leases_granted"), 4);
    assert_eq!(p.owner.stat("shards_live"), 2);
    assert_eq!(p.owner.stat("bytes_exported"), 6000);
    assert_eq!(p.owner.stat("pool_bytes_total"), 64 << 10);
    assert_eq!(p.owner.stat("pool_bytes_used"), 6000);
    assert_eq!(p.owner.stat("segments_owned"), 2);

    p.owner.unexport(1).unwrap();
    p.owner.unexport(2).unwrap();
    assert_eq!(p.owner.stat("pool_bytes_used"), 0);
    assert_eq!(p.owner.stat("shards_live"), 0);
}

/// Writes `byte` over the whole of a private view, as a library that
/// ignores read-only flags (torch) would.
#[allow(unsafe_code)]
fn scribble(v: &LeasedView, byte: u8) {
    // SAFETY: a private view is a copy-on-write mapping lent for writing
    // (`Transport::import_view_private`); no reference to its bytes is
    // alive during the write.
    unsafe { std::ptr::write_bytes(v.as_ptr().cast_mut(), byte, v.len()) };
}

#[test]
fn a_private_view_is_written_in_this_view_alone() {
    for config in [SMALL_POOL, "allocation = \"segment-per-shard\""] {
        let p = Pair::new(config);
        // Two shards in one page of the pool: writes to one must not show
        // in the other, nor reach the owner.
        let a = pattern(1000, 5);
        let b = pattern(3000, 6);
        let da = p.owner.put(1, &a).unwrap();
        let db = p.owner.put(2, &b).unwrap();
        let shared = p.consumer.view(&da, 1000).unwrap();
        let private = p.consumer.private_view(&da, 1000).unwrap();
        assert!(private.is_private() && !shared.is_private());
        assert_eq!(&*private, &a[..], "{config}: reads the owner's bytes");
        assert_ne!(
            private.as_ptr(),
            shared.as_ptr(),
            "{config}: a mapping of its own"
        );
        scribble(&private, 0xEE);
        assert!(private.iter().all(|&x| x == 0xEE), "{config}");
        assert_eq!(&*shared, &a[..], "{config}: another view is untouched");
        assert_eq!(
            p.consumer.copy(&da, 1000).unwrap(),
            a,
            "{config}: a copy is the owner's"
        );
        assert_eq!(
            p.consumer.copy(&db, 3000).unwrap(),
            b,
            "{config}: the neighbour too"
        );
        let again = p.consumer.private_view(&da, 1000).unwrap();
        assert_eq!(&*again, &a[..], "{config}: a new private view starts clean");
        assert_eq!(p.consumer.stat("leases_active"), 3);
        assert_eq!(p.consumer.stat("imports_view_private"), 2);
        drop((shared, private, again));
        assert_eq!(p.consumer.stat("leases_active"), 0);
        assert_eq!(p.owner.stat("leases_held_on_owner"), 0);
        // The owner's bytes never changed.
        let fresh = Node::new("");
        assert_eq!(fresh.copy(&da, 1000).unwrap(), a, "{config}");
        // An empty shard has an empty private view.
        let de = p.owner.put(3, &[]).unwrap();
        assert_eq!(p.consumer.private_view(&de, 0).unwrap().len(), 0);
    }
}

#[test]
fn segment_per_shard_roundtrip_copy_and_view() {
    let p = Pair::new("allocation = \"segment-per-shard\"");
    let a = pattern(3000, 3);
    let b = pattern(70_000, 4);
    let da = p.owner.put(1, &a).unwrap();
    let (db, _guard) = p.owner.put_in_place(2, &b).unwrap();
    assert_eq!(decode(&da).mode, Mode::Segment);
    assert_eq!(p.owner.stat("segments_owned"), 2);
    assert_eq!(p.owner.segments().len(), 2);
    assert_eq!(p.owner.stat("pool_bytes_total"), 0);

    assert_eq!(p.consumer.copy(&da, 3000).unwrap(), a);
    let vb = p.consumer.view(&db, 70_000).unwrap();
    assert_eq!(&*vb, &b[..]);
    assert_eq!(p.consumer.stat("segments_mapped"), 1);

    // Unexport unlinks the name; the consumer's mapping stays valid.
    p.owner.unexport(2).unwrap();
    assert_eq!(p.owner.segments().len(), 1);
    assert_eq!(&*vb, &b[..]);
    drop(vb);
    assert_eq!(p.consumer.stat("segments_mapped"), 0);
    let e = p.consumer.copy(&db, 70_000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NOT_FOUND);
    assert!(e.message.contains("removed by its owner"), "{}", e.message);
    p.owner.unexport(1).unwrap();
    assert_eq!(p.owner.segments(), Vec::<String>::new());
}

#[test]
fn zero_length_shards_work_in_both_modes() {
    for config in [SMALL_POOL, "allocation = \"segment-per-shard\""] {
        let p = Pair::new(config);
        let d1 = p.owner.put(1, &[]).unwrap();
        let (d2, _g) = p.owner.put_in_place(2, &[]).unwrap();
        for d in [&d1, &d2] {
            assert_eq!(p.consumer.copy(d, 0).unwrap(), Vec::<u8>::new());
            let v = p.consumer.view(d, 0).unwrap();
            assert!(v.is_empty());
        }
        p.owner.unexport(1).unwrap();
        assert_eq!(
            p.consumer.copy(&d1, 0).unwrap_err().kind,
            ErrorKind::NOT_FOUND,
            "{config}"
        );
        p.owner.unexport(2).unwrap();
    }
}

#[test]
fn a_lease_protects_space_until_released() {
    let p = Pair::new(SMALL_POOL);
    let shard = 4096usize;
    let a = pattern(shard, 9);
    let da = p.owner.put(1, &a).unwrap();
    let a_range = {
        let d = decode(&da);
        (d.offset, d.offset + d.len)
    };
    let view = p.consumer.view(&da, shard as u64).unwrap();
    p.owner.unexport(1).unwrap();
    assert_eq!(p.owner.stat("shards_retired_leased"), 1);
    assert_eq!(p.owner.stat("pool_bytes_used"), shard as u64);

    // Put and remove many shards, each written with 0xEE: the allocator
    // reuses the warm space right beside A's leased bytes again and again,
    // and must never hand out A's own.
    let fill = vec![0xEE; shard];
    let mut beside = 0;
    for i in 0..64u128 {
        let (d, g) = p.owner.put_in_place(100 + i, &fill).unwrap();
        let d = decode(&d);
        if d.offset == a_range.1.next_multiple_of(64) || d.offset + d.len == a_range.0 {
            beside += 1;
        }
        assert!(
            d.offset + d.len <= a_range.0 || d.offset >= a_range.1,
            "shard at {}..{} overlaps leased {a_range:?}",
            d.offset,
            d.offset + d.len
        );
        assert_eq!(&*view, &a[..], "leased bytes changed");
        p.owner.unexport(100 + i).unwrap();
        drop(g);
    }
    assert!(
        beside >= 3,
        "the allocator reused the space beside the leased bytes only {beside} times"
    );

    // Released: the space comes back and is reused.
    drop(view);
    assert_eq!(p.owner.stat("shards_retired_leased"), 0);
    assert_eq!(p.owner.stat("pool_bytes_used"), 0);
    let mut reused = false;
    for i in 0..32u128 {
        let d = decode(&p.owner.put(200 + i, &fill).unwrap());
        reused |= d.offset == a_range.0;
        p.owner.unexport(200 + i).unwrap();
    }
    assert!(reused, "A's space was never reused after release");
}

#[test]
fn owner_and_consumer_race_without_losing_a_lease() {
    // Owner threads export and unexport shards whose bytes all equal a
    // per-shard value while consumer threads view them: a view either fails
    // with NOT_FOUND or shows exactly that value for as long as it lives.
    let p = Pair::new("pool-size = \"256KiB\"\nmax-leases = 64");
    let shard = 8192usize;
    let stop = AtomicBool::new(false);
    let published = std::sync::Mutex::new(Vec::<(Vec<u8>, u8)>::new());
    std::thread::scope(|s| {
        let owner = s.spawn(|| {
            for i in 0..400u32 {
                let value = (i % 250) as u8 + 1;
                let d = p.owner.put(u128::from(i), &vec![value; shard]).unwrap();
                published.lock().unwrap().push((d, value));
                if i >= 4 {
                    p.owner.unexport(u128::from(i - 4)).unwrap();
                }
            }
            stop.store(true, Ordering::SeqCst);
        });
        for _ in 0..2 {
            s.spawn(|| {
                let mut k = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let item = {
                        let v = published.lock().unwrap();
                        v.len().checked_sub(1 + k % 3).map(|i| v[i].clone())
                    };
                    k += 1;
                    let Some((d, value)) = item else { continue };
                    match p.consumer.view(&d, shard as u64) {
                        Ok(view) => {
                            for _ in 0..3 {
                                assert!(view.iter().all(|&b| b == value), "torn shard");
                                std::thread::yield_now();
                            }
                        }
                        Err(e) => assert_eq!(e.kind, ErrorKind::NOT_FOUND, "{e}"),
                    }
                }
            });
        }
        owner.join().unwrap();
    });
    for i in 396..400u128 {
        p.owner.unexport(i).unwrap();
    }
    assert_eq!(p.owner.stat("pool_bytes_used"), 0);
}

#[test]
fn copy_import_takes_and_returns_a_lease() {
    let p = Pair::new(SMALL_POOL);
    let d = p.owner.put(1, &pattern(100, 5)).unwrap();
    assert_eq!(p.consumer.copy(&d, 100).unwrap(), pattern(100, 5));
    assert_eq!(p.consumer.stat("leases_granted"), 1);
    assert_eq!(p.owner.stat("leases_held_on_owner"), 0);
    p.owner.unexport(1).unwrap();
}

#[test]
fn full_pool_error_names_the_key_and_sizes() {
    let p = Pair::new("pool-size = 4096");
    let (_d, _g) = p.owner.put_in_place(1, &[7u8; 4000]).unwrap();
    let e = p
        .owner
        .t()
        .allocate(ShardId::from_u128(2), 200)
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED);
    assert_eq!(
        e.message.as_str(),
        "posix-shm pool is full: the shard needs 200 B (200 bytes) but the pool of 4 KiB has \
         at most 64 B in one free gap (3.9 KiB in use, 0 B of it retired but still leased by \
         consumers); raise `plugin.shm.config.pool-size` or set \
         `plugin.shm.config.on-full = \"spill\"` to give such shards their own segment"
    );
    // Freeing makes room again.
    p.owner.unexport(1).unwrap();
    let g = AllocationGuard::allocate(p.owner.t(), ShardId::from_u128(2), 4096).unwrap();
    drop(g);
    assert_eq!(p.owner.stat("allocations_pending"), 0);
    assert_eq!(p.owner.stat("pool_bytes_used"), 0);
}

#[test]
fn full_pool_spills_to_a_segment() {
    let p = Pair::new("pool-size = 4096\non-full = \"spill\"");
    let a = pattern(4096, 1);
    let b = pattern(300, 2);
    let da = p.owner.put(1, &a).unwrap();
    let db = p.owner.put(2, &b).unwrap();
    assert_eq!(decode(&da).mode, Mode::Pool);
    assert_eq!(decode(&db).mode, Mode::Segment);
    assert_eq!(p.owner.stat("spills"), 1);
    assert_eq!(p.owner.stat("segments_owned"), 3);
    assert_eq!(p.consumer.copy(&db, 300).unwrap(), b);
    assert_eq!(&*p.consumer.view(&db, 300).unwrap(), &b[..]);
    p.owner.unexport(2).unwrap();
    assert_eq!(p.owner.segments().len(), 2, "spilled segment unlinked");
    p.owner.unexport(1).unwrap();
}

#[test]
fn lease_table_full_names_max_leases() {
    let p = Pair::new("pool-size = 4096\nmax-leases = 2");
    let d = p.owner.put(1, &[1, 2, 3]).unwrap();
    let _v1 = p.consumer.view(&d, 3).unwrap();
    let _v2 = p.consumer.view(&d, 3).unwrap();
    let e = p.consumer.view(&d, 3).unwrap_err();
    assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED);
    assert!(e.message.contains("`max-leases`"), "{}", e.message);
    let e = p.consumer.copy(&d, 3).unwrap_err();
    assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED);
    p.owner.unexport(1).unwrap();
}

#[test]
fn a_batch_larger_than_the_lease_table_is_taken_in_smaller_groups() {
    use shardport_abi::{ImportItem, RSlice, RSliceMut};
    // 2 lease slots, one held by a view: each group gets one slot at most,
    // and every shard of a 10-shard batch still arrives.
    let p = Pair::new("pool-size = 65536\nmax-leases = 2");
    let descs: Vec<Vec<u8>> = (0..10u8)
        .map(|k| p.owner.put(u128::from(k) + 1, &pattern(100, k)).unwrap())
        .collect();
    let _view = p.consumer.view(&descs[0], 100).unwrap();
    let metas: Vec<_> = descs.iter().map(|_| ShardMeta::bytes(100)).collect();
    let mut dsts = vec![vec![0u8; 100]; descs.len()];
    let mut items: Vec<ImportItem<'_>> = descs
        .iter()
        .zip(&metas)
        .zip(dsts.iter_mut())
        .map(|((d, m), dst)| ImportItem {
            desc: RSlice::from_slice(d),
            meta: m,
            dst: RSliceMut::from_mut_slice(dst),
        })
        .collect();
    let results = p
        .consumer
        .t()
        .import_many(RSliceMut::from_mut_slice(&mut items));
    drop(items);
    for (k, r) in results.into_iter().enumerate() {
        r.into_result().unwrap_or_else(|e| panic!("shard {k}: {e}"));
        assert_eq!(dsts[k], pattern(100, k as u8), "shard {k}");
    }
    drop(_view);
    for k in 0..10u128 {
        p.owner.unexport(k + 1).unwrap();
    }
}

#[test]
fn max_shards_is_enforced() {
    for config in [
        "pool-size = 4096\nmax-shards = 2",
        "allocation = \"segment-per-shard\"\nmax-shards = 2",
    ] {
        let p = Pair::new(config);
        p.owner.put(1, &[1]).unwrap();
        p.owner.put(2, &[2]).unwrap();
        let e = p.owner.put(3, &[3]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED);
        assert!(
            e.message.contains("`plugin.shm.config.max-shards`"),
            "{}",
            e.message
        );
        p.owner.unexport(1).unwrap();
        let d = p.owner.put(3, &[3]).unwrap();
        assert_eq!(p.consumer.copy(&d, 1).unwrap(), [3]);
        p.owner.unexport(2).unwrap();
        p.owner.unexport(3).unwrap();
    }
}

#[test]
fn removed_shards_are_not_found() {
    let p = Pair::new(SMALL_POOL);
    let d = p.owner.put(1, &[1; 10]).unwrap();
    p.owner.unexport(1).unwrap();
    for e in [
        p.consumer.copy(&d, 10).unwrap_err(),
        p.consumer.view(&d, 10).unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::NOT_FOUND);
        assert!(
            e.message.contains("was removed by its owner"),
            "{}",
            e.message
        );
    }
    // The slot is reused with a new generation: the old descriptor stays dead.
    let d2 = p.owner.put(2, &[2; 10]).unwrap();
    assert_eq!(decode(&d2).slot, decode(&d).slot);
    assert_eq!(
        p.consumer.copy(&d, 10).unwrap_err().kind,
        ErrorKind::NOT_FOUND
    );
    assert_eq!(p.consumer.copy(&d2, 10).unwrap(), [2; 10]);
    p.owner.unexport(2).unwrap();
    assert_eq!(p.owner.unexport(2).unwrap_err().kind, ErrorKind::NOT_FOUND);
}

#[test]
fn a_dropped_owner_leaves_views_valid_and_shards_not_found() {
    let owner = Node::new(SMALL_POOL);
    let consumer = Node::new("");
    let a = pattern(2000, 7);
    let da = owner.put(1, &a).unwrap();
    let db = owner.put(2, &a).unwrap();
    let view = consumer.view(&da, 2000).unwrap();
    let tag = owner.tag.clone();
    drop(owner);
    assert_eq!(segments_of("shardport", &tag), Vec::<String>::new());
    assert_eq!(&*view, &a[..], "a view outlives its owner");
    let e = consumer.copy(&db, 2000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NOT_FOUND, "{e}");
    drop(view);
    assert_eq!(consumer.stat("segments_mapped"), 0);
}

#[test]
fn cached_pools_of_a_vanished_owner_are_dropped() {
    let owner = Node::new(SMALL_POOL);
    let consumer = Node::new("");
    let d = decode(&owner.put(1, &[1; 64]).unwrap());
    assert_eq!(consumer.copy(&d.encode(), 64).unwrap(), [1; 64]);
    assert_eq!(consumer.stat("segments_mapped"), 2);
    // As if the owner had been killed: its names vanish, its board stays open.
    rustix::shm::unlink(&*d.segment).unwrap();
    rustix::shm::unlink(&*d.board).unwrap();
    assert_eq!(consumer.stat("segments_mapped"), 0);
    let e = consumer.copy(&d.encode(), 64).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NOT_FOUND);
    assert!(e.message.contains("removed by its owner"), "{}", e.message);
    owner.unexport(1).unwrap();
}

#[test]
fn a_board_of_another_layout_version_is_refused() {
    let p = Pair::new(SMALL_POOL);
    let d = decode(&p.owner.put(1, &[1; 64]).unwrap());
    // As if the owner ran the plugin version that wrote board layout 3 (or
    // 1 or 2): the whole magic "SPSHMBRD", the version in word 1.
    let board = OwnedSegment::open(&d.board).unwrap();
    let magic = board
        .atomic_u64(0)
        .load(std::sync::atomic::Ordering::SeqCst);
    board.atomic_u64(0).store(
        u64::from_le_bytes(*b"SPSHMBRD"),
        std::sync::atomic::Ordering::SeqCst,
    );
    for e in [
        p.consumer.copy(&d.encode(), 64).unwrap_err(),
        p.consumer.view(&d.encode(), 64).unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::UNAVAILABLE, "{e}");
        assert!(
            e.message.contains(&format!(
                "lease board {} has layout version 3 or older but this posix-shm plugin uses \
                 version 4",
                d.board
            )),
            "{}",
            e.message
        );
    }
    assert_eq!(magic, crate::board::MAGIC);
    board
        .atomic_u64(0)
        .store(magic, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(p.consumer.copy(&d.encode(), 64).unwrap(), [1; 64]);
    drop(board);
    p.owner.unexport(1).unwrap();
}

#[test]
fn drop_removes_every_segment() {
    for config in [
        "pool-size = 4096\non-full = \"spill\"",
        "allocation = \"segment-per-shard\"",
    ] {
        let n = Node::new(config);
        n.put(1, &[1; 4096]).unwrap();
        n.put(2, &[2; 100]).unwrap();
        let _pending = n
            .t()
            .allocate(ShardId::from_u128(3), 10)
            .into_result()
            .unwrap();
        assert!(n.segments().len() >= 3, "{:?}", n.segments());
        let tag = n.tag.clone();
        drop(n);
        assert_eq!(
            segments_of("shardport", &tag),
            Vec::<String>::new(),
            "{config}"
        );
    }
}

#[test]
fn two_instances_never_collide() {
    let a = Node::new(SMALL_POOL);
    let b = Node::new(SMALL_POOL);
    let da = a.put(1, &[1; 64]).unwrap();
    let db = b.put(1, &[2; 64]).unwrap();
    assert_ne!(decode(&da).segment, decode(&db).segment);
    assert_eq!(a.copy(&db, 64).unwrap(), [2; 64]);
    assert_eq!(b.copy(&da, 64).unwrap(), [1; 64]);
    // One process as owner and consumer of its own shard.
    assert_eq!(a.copy(&da, 64).unwrap(), [1; 64]);
    assert_eq!(a.segments().len(), 2);
    assert_eq!(b.segments().len(), 2);
    let (ta, tb) = (a.tag.clone(), b.tag.clone());
    drop((a, b));
    assert!(segments_of("shardport", &ta).is_empty());
    assert!(segments_of("shardport", &tb).is_empty());
}

#[test]
fn a_consumer_only_node_creates_no_segment() {
    let owner = Node::new(SMALL_POOL);
    let consumer = Node::new(SMALL_POOL);
    assert!(owner.segments().is_empty(), "no pool before the first put");
    let h = owner.t().health();
    assert!(h.ok && h.message.contains("no pool yet"), "{}", h.message);
    assert_eq!(owner.stat("segments_owned"), 0);
    assert_eq!(owner.stat("pool_bytes_total"), 0);

    let d = owner.put(1, &[7; 100]).unwrap();
    assert_eq!(owner.segments().len(), 2, "data segment and lease board");
    assert_eq!(owner.stat("pool_bytes_total"), 64 << 10);
    assert_eq!(consumer.copy(&d, 100).unwrap(), [7; 100]);
    drop(consumer.view(&d, 100).unwrap());
    assert!(
        consumer.segments().is_empty(),
        "fetching (copies and views) creates nothing in /dev/shm"
    );
    assert_eq!(consumer.stat("segments_owned"), 0);
    owner.unexport(1).unwrap();
}

#[test]
fn a_pool_that_cannot_be_created_fails_the_put_that_needed_it() {
    let ctx = testing::context("shm", SMALL_POOL);
    let tag = ctx.node_tag.to_string();
    // Squat every name the pool would try.
    let gen = NameGen::new("shardport", &tag, &Here::current().process);
    let squatters: Vec<OwnedSegment> = (0..16)
        .map(|_| OwnedSegment::create(&gen.next(Kind::PoolData), 8).unwrap())
        .collect();
    let t = Arc::new(crate::create(PluginContext::new(ctx)).unwrap());
    let n = Node {
        t: Some(t),
        prefix: "shardport".to_owned(),
        tag: tag.clone(),
    };
    let e = n.put(1, &[1; 10]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::IO, "{e}");
    assert!(
        e.message
            .starts_with("the posix-shm pool is unavailable: cannot create a pool data segment"),
        "{e}"
    );
    let h = n.t().health();
    assert!(
        !h.ok && h.message.contains("pool unavailable"),
        "{}",
        h.message
    );
    // The next put tries again, and succeeds once there is room.
    drop(squatters);
    let d = n.put(1, &[1; 10]).unwrap();
    assert_eq!(decode(&d).mode, Mode::Pool);
    assert!(n.t().health().ok);
    n.unexport(1).unwrap();
}

#[test]
fn a_name_already_taken_is_skipped() {
    // A leftover segment with the name our pool would get (created now).
    let ctx = testing::context("shm", &format!("{SMALL_POOL}\ncreate-pool = \"eager\""));
    let tag = ctx.node_tag.to_string();
    let first = NameGen::new("shardport", &tag, &Here::current().process).next(Kind::PoolData);
    let squatter = OwnedSegment::create(&first, 8).unwrap();
    let t = crate::create(PluginContext::new(ctx)).unwrap();
    assert!(t.health().ok);
    let names = segments_of("shardport", &tag);
    assert_eq!(names.len(), 3, "{names:?}");
    drop(t);
    assert_eq!(segments_of("shardport", &tag), [first[1..].to_owned()]);
    drop(squatter);
}

#[test]
fn stats_are_snake_case_and_complete() {
    let n = Node::new(SMALL_POOL);
    let stats = n.t().stats();
    let names: Vec<&str> = stats.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "pool_bytes_total",
        "pool_bytes_used",
        "shards_live",
        "shards_retired_leased",
        "leases_held_on_owner",
        "leases_granted",
        "leases_active",
        "segments_owned",
        "segments_mapped",
        "bytes_exported",
        "imports_copy",
        "imports_view",
        "imports_view_private",
        "spills",
        "leases_reclaimed",
        "segments_swept",
        "bytes_swept",
    ] {
        assert!(names.contains(&want), "missing {want}");
    }
    for s in stats.iter() {
        assert!(s.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
    }
    let kind = |n: &str| stats.iter().find(|s| s.name.as_str() == n).unwrap().kind;
    assert_eq!(kind("imports_copy"), StatKind::COUNTER);
    assert_eq!(kind("pool_bytes_used"), StatKind::GAUGE);
}
