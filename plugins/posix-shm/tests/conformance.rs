//! The shared transport conformance suite (`shardport-abi`, feature
//! `conformance`), run against this plugin in-process in both allocation
//! modes. The end-to-end suite runs the same cases against the built `.so`.

use shardport_abi::plugin::guard_constructor;
use shardport_kit::{conformance::Pair, testing};

fn pair_with(config: &str) -> Pair {
    let make = || {
        guard_constructor(
            testing::context("posix-shm", config),
            shardport_posix_shm::create,
        )
        .into_result()
        .expect("posix-shm constructor failed")
    };
    Pair::new(make(), make())
}

mod pool {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_with("pool-size = \"64MiB\"")
    }
    shardport_kit::conformance_suite!(pair);
}

mod pool_that_spills {
    // Small enough that the larger cases spill to per-shard segments.
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_with("pool-size = \"1MiB\"\non-full = \"spill\"")
    }
    shardport_kit::conformance_suite!(pair);
}

mod segment_per_shard {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_with("allocation = \"segment-per-shard\"")
    }
    shardport_kit::conformance_suite!(pair);
}
