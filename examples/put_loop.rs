//! The owner's put path alone, in a loop, for profiling (`perf record`) and
//! quick A/B checks of small-shard puts: the embedded default config with
//! `put.export-to` narrowed as `shardport bench`'s put cells do, a pool
//! cycled once, then `put` + `remove` of one size, timed put by put.
//!
//! ```text
//! cargo build --release -p shardport-cli -p shardport-posix-shm -p shardport-http
//! cargo run --release --example put_loop -- [SIZE_BYTES] [ROUNDS] [TRANSPORT,...] [PARTS]
//! perf record --call-graph dwarf ./target/release/examples/put_loop 4096 200000
//! ```
//! Prints p50/p90/p99 of the put and of the remove, in microseconds, the
//! rates of `put_many` and of `remove` of 10,000 shards, then the rate of
//! `fetch_many` (copy mode, batches of `fetch.max-batch`) of 10,000 shards
//! of that size this node owns (the consumer's path without the second
//! process: selection, the transport's lease and copy).
//! PARTS (default `put,many,fetch`) picks which of the three run.

#![allow(clippy::print_stdout)] // the figures on stdout are this program's output

use std::{collections::BTreeMap, time::Instant};

use shardport_host::vocab::TransportName;
use shardport_host::{config, FetchMode, Node, TensorSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(4096), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(100_000), |s| s.parse())?;
    let export_to = args.next().unwrap_or_else(|| "posix-shm".into());
    // Which parts run (for profiling one of them): put, many, fetch.
    let parts = args.next().unwrap_or_else(|| "put,many,fetch".into());
    let part = |name: &str| parts.split(',').any(|p| p == name);
    let mut cfg = config::default_config();
    cfg.put.export_to = Some(
        export_to
            .split(',')
            .map(TransportName::new)
            .collect::<Result<_, _>>()?,
    );
    let node = Node::start(cfg)?;
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let spec = TensorSpec::bytes(size as u64);
    if part("put") {
        put_remove(&node, &src, &spec, rounds)?;
    }
    if part("many") {
        put_many(&node, &src, &spec)?;
    }
    if part("fetch") {
        fetch_many(&node, &src, &spec)?;
    }
    Ok(())
}

/// `put` + `remove` of one shard, `rounds` times; p50/p90/p99 of each.
fn put_remove(
    node: &Node,
    src: &[u8],
    spec: &TensorSpec,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let size = src.len();
    let mut put = Vec::with_capacity(rounds);
    let mut remove = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let h = node.put(src, spec, BTreeMap::new())?;
        let t1 = Instant::now();
        node.remove(&[h.id]);
        remove.push(t1.elapsed().as_secs_f64() * 1e6);
        put.push((t1 - t).as_secs_f64() * 1e6);
    }
    for (name, v) in [("put", &mut put), ("remove", &mut remove)] {
        let warm = &mut v[rounds / 10..];
        warm.sort_by(f64::total_cmp);
        let q = |p: f64| warm[((warm.len() - 1) as f64 * p) as usize];
        println!(
            "{name} {size} B: p50 {:.2} us  p90 {:.2} us  p99 {:.2} us",
            q(0.5),
            q(0.9),
            q(0.99)
        );
    }
    Ok(())
}

/// The bench's "10,000 x 4 KiB put_many" row, in process.
fn put_many(node: &Node, src: &[u8], spec: &TensorSpec) -> Result<(), Box<dyn std::error::Error>> {
    let size = src.len();
    let items: Vec<_> = (0..10_000)
        .map(|_| (src, spec.clone(), BTreeMap::new()))
        .collect();
    let (mut puts, mut removes) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let t = Instant::now();
        let ids = node
            .put_many(&items)
            .into_iter()
            .map(|h| h.map(|h| h.id))
            .collect::<Result<Vec<_>, _>>()?;
        let t1 = Instant::now();
        node.remove(&ids);
        removes.push(ids.len() as f64 / t1.elapsed().as_secs_f64());
        puts.push(ids.len() as f64 / (t1 - t).as_secs_f64());
    }
    for (name, v) in [("put_many", &mut puts), ("remove", &mut removes)] {
        println!(
            "{name} {} x {size} B: median {:.0} shards/s",
            items.len(),
            median(v)
        );
    }
    Ok(())
}

/// `fetch_many` (copy) of 10,000 shards this node owns.
fn fetch_many(
    node: &Node,
    src: &[u8],
    spec: &TensorSpec,
) -> Result<(), Box<dyn std::error::Error>> {
    let size = src.len();
    let many: Vec<_> = (0..10_000)
        .map(|_| node.put(src, spec, BTreeMap::new()))
        .collect::<Result<_, _>>()?;
    let batch = node.config().fetch.max_batch.max(1);
    let mut rates = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        for chunk in many.chunks(batch) {
            for r in node.fetch_many(chunk, FetchMode::Copy)? {
                r?;
            }
        }
        rates.push(many.len() as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "fetch_many {} x {size} B (copy, batches of {batch}): median {:.0} shards/s",
        many.len(),
        median(&mut rates)
    );
    Ok(())
}

/// The median of the rates of some rounds (sorts them).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
