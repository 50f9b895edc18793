//! Micro-benchmarks of the pool allocator (divan), through the transport's
//! own `allocate` / `free_allocation` (the bump allocator in `alloc.rs`,
//! the lease-board entry, and backing the range with `fallocate`), in an
//! empty pool and in a pool already holding many live shards.
//!
//! `cargo bench -p shardport-posix-shm --bench alloc`.

use std::sync::atomic::{AtomicU64, Ordering};

use divan::Bencher;
use shardport_abi::{PluginContext, ShardId, TransportBox};
use shardport_kit::testing;

fn main() {
    divan::main();
}

const POOL: &str = "pool-size = \"256MiB\"\nsweep-on-start = false\n";

fn transport() -> TransportBox {
    shardport_posix_shm::create(PluginContext::new(testing::context("shm", POOL)))
        .expect("a posix-shm pool")
}

fn next_id() -> ShardId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ShardId::from_u128(u128::from(NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// Allocate and free one shard of `len` bytes in a pool holding `live`
/// other shards (4 KiB each, spread through the pool), after one pass over
/// the whole pool so every page is already backed.
#[divan::bench(args = [(4096, 0), (4096, 1000), (1 << 20, 0), (1 << 20, 1000)])]
fn allocate_free(b: Bencher<'_, '_>, (len, live): (u64, usize)) {
    let t = transport();
    // Back every page once: the steady state of a pool in use.
    let chunk = 64 << 20;
    for _ in 0..5 {
        let a = t.allocate(next_id(), chunk).into_result().expect("chunk");
        t.free_allocation(a.token).into_result().expect("free");
    }
    // Live shards with gaps between them, so next-fit has ranges to walk.
    let mut held = Vec::with_capacity(live);
    for i in 0..live {
        let a = t.allocate(next_id(), 4096).into_result().expect("live");
        if i % 2 == 0 {
            held.push(a.token);
        } else {
            t.free_allocation(a.token).into_result().expect("free");
        }
    }
    b.bench_local(|| {
        let a = t.allocate(next_id(), len).into_result().expect("allocate");
        t.free_allocation(a.token).into_result().expect("free");
    });
    for token in held {
        t.free_allocation(token).into_result().expect("free");
    }
}
