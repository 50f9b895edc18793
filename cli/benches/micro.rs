//! Micro-benchmarks of the host's hot paths (divan): plugin dispatch through
//! the real posix-shm `.so` vs a direct call, transport selection per shard,
//! handle encode/decode, and the checksums.
//!
//! `cargo bench -p shardport-cli --bench micro`. The dispatch group loads
//! `libshardport_posix_shm.so` (built as a dev-dependency next to this
//! binary); without it that group reports the load error and skips.

use std::{hint::black_box, sync::OnceLock};

use divan::{counter::BytesCount, Bencher};
use shardport_host::{
    config,
    handle::Handle,
    identity::NodeIdentity,
    select::{self, Local, PluginFacts},
    vocab::{FetchMode, SameNodeMatch},
    Node, TensorSpec,
};

fn main() {
    divan::main();
}

/// A node with the embedded default config (posix-shm + http), and a 4 KiB
/// shard it owns: a real handle with two exports.
fn node_and_handle() -> &'static (Node, Handle) {
    static CELL: OnceLock<(Node, Handle)> = OnceLock::new();
    CELL.get_or_init(|| {
        let node = Node::start(config::default_config()).expect("the default plugins load");
        let handle = node
            .put(&[7u8; 4096], &TensorSpec::bytes(4096), Default::default())
            .expect("put");
        (node, handle)
    })
}

mod dispatch {
    use super::*;

    #[inline(never)]
    fn direct_echo(x: u64) -> u64 {
        black_box(x)
    }

    /// `Transport::echo` through the loaded `.so`'s abi_stable vtable.
    #[divan::bench]
    fn vtable(b: Bencher<'_, '_>) {
        let (node, _) = node_and_handle();
        let plugin = node.plugin("posix-shm").expect("posix-shm loaded");
        b.counter(divan::counter::ItemsCount::new(1000usize))
            .bench(|| {
                let mut acc = 0u64;
                for i in 0..1000u64 {
                    acc = acc.wrapping_add(plugin.transport.echo(black_box(i)));
                }
                acc
            });
    }

    /// The same loop calling a non-inlined function in this binary.
    #[divan::bench]
    fn direct(b: Bencher<'_, '_>) {
        b.counter(divan::counter::ItemsCount::new(1000usize))
            .bench(|| {
                let mut acc = 0u64;
                for i in 0..1000u64 {
                    acc = acc.wrapping_add(direct_echo(black_box(i)));
                }
                acc
            });
    }
}

mod select_plan {
    use super::*;

    const ROUTES: &str = r#"
[[route]]
name = "large-local"
local = true
min-size = "1MiB"
transports = ["posix-shm", "http"]

[[route]]
name = "tagged"
tags = { kind = "kv" }
transports = ["http"]
"#;

    fn facts() -> Vec<PluginFacts> {
        let (node, _) = node_and_handle();
        node.plugins()
            .iter()
            .map(|p| PluginFacts {
                name: p.name.clone(),
                capabilities: p.capabilities(),
                needs_identity: p.needs_identity(),
            })
            .collect()
    }

    /// `select::plan` alone (pure): no routes, default ordering.
    #[divan::bench(args = [FetchMode::View, FetchMode::Copy])]
    fn pure_no_routes(b: Bencher<'_, '_>, mode: FetchMode) {
        let (_, handle) = node_and_handle();
        let (facts, identity) = (facts(), NodeIdentity::current());
        let local = Local {
            plugins: &facts,
            identity: &identity,
            owner_addr_local: true,
            same_node: SameNodeMatch::Both,
            routes: &[],
            experiments: &[],
            gates: &[],
            fetch_seq: 0,
        };
        b.bench(|| select::plan(black_box(handle), &local, mode));
    }

    /// `select::plan` alone with two routes to evaluate (the first misses).
    #[divan::bench]
    fn pure_two_routes(b: Bencher<'_, '_>) {
        let (_, handle) = node_and_handle();
        let text = format!("{}{ROUTES}", config::DEFAULT_CONFIG);
        let cfg = config::parse_str(&text, config::Origin::embedded()).expect("routes parse");
        let (facts, identity) = (facts(), NodeIdentity::current());
        let local = Local {
            plugins: &facts,
            identity: &identity,
            owner_addr_local: true,
            same_node: cfg.same_node,
            routes: &cfg.routes,
            experiments: &[],
            gates: &[],
            fetch_seq: 0,
        };
        b.bench(|| select::plan(black_box(handle), &local, FetchMode::View));
    }

    /// `select::plan` with an experiment that matches: the arm draw (xxh3 of
    /// salt and shard id) and the reordering on top of the default order.
    #[divan::bench]
    fn pure_with_experiment(b: Bencher<'_, '_>) {
        let (_, handle) = node_and_handle();
        let text = format!(
            "{}\n[[experiment]]\nname = \"e\"\narms = [{{ transport = \"posix-shm\", weight = 9 }}, {{ transport = \"http\", weight = 1 }}]\n",
            config::DEFAULT_CONFIG
        );
        let cfg = config::parse_str(&text, config::Origin::embedded()).expect("experiment parses");
        let (facts, identity) = (facts(), NodeIdentity::current());
        let local = Local {
            plugins: &facts,
            identity: &identity,
            owner_addr_local: true,
            same_node: cfg.same_node,
            routes: &cfg.routes,
            experiments: &cfg.experiments,
            gates: &[Default::default()],
            fetch_seq: 0,
        };
        b.bench(|| select::plan(black_box(handle), &local, FetchMode::View));
    }

    /// `Node::plan`: selection plus the owner-address locality lookup, as
    /// every fetch does it.
    #[divan::bench]
    fn node_plan(b: Bencher<'_, '_>) {
        let (node, handle) = node_and_handle();
        b.bench(|| node.plan(black_box(handle), FetchMode::View));
    }
}

mod handle_codec {
    use super::*;

    #[divan::bench]
    fn encode_binary(b: Bencher<'_, '_>) {
        let (_, h) = node_and_handle();
        b.bench(|| black_box(h).to_bytes());
    }

    #[divan::bench]
    fn decode_binary(b: Bencher<'_, '_>) {
        let (_, h) = node_and_handle();
        let bytes = h.to_bytes();
        b.bench(|| Handle::from_bytes(black_box(&bytes)).expect("valid"));
    }

    #[divan::bench]
    fn encode_json(b: Bencher<'_, '_>) {
        let (_, h) = node_and_handle();
        b.bench(|| black_box(h).to_json());
    }

    #[divan::bench]
    fn decode_json(b: Bencher<'_, '_>) {
        let (_, h) = node_and_handle();
        let text = h.to_json();
        b.bench(|| Handle::from_json(black_box(&text)).expect("valid"));
    }
}

mod checksum {
    use super::*;

    const SIZES: [usize; 2] = [4 << 10, 1 << 20];

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(31) >> 3) as u8).collect()
    }

    #[divan::bench(args = SIZES)]
    fn crc32c(b: Bencher<'_, '_>, len: usize) {
        let d = data(len);
        b.counter(BytesCount::new(len))
            .bench(|| ::crc32c::crc32c(black_box(&d)));
    }

    #[divan::bench(args = SIZES)]
    fn xxh3(b: Bencher<'_, '_>, len: usize) {
        let d = data(len);
        b.counter(BytesCount::new(len))
            .bench(|| xxhash_rust::xxh3::xxh3_64(black_box(&d)));
    }
}
