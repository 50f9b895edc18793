//! The shared transport conformance suite, instantiated for cuda-ipc. Its
//! data cases move CPU shards, which cuda-ipc does not carry (no `CPU`
//! capability), so with a GPU they check describe/stats/health/garbage
//! descriptors and skip the rest with a printed reason; without a driver the
//! whole suite is skipped with the reason. Two-process GPU checks live in the
//! root package's e2e tests (`cuda`), since a CUDA IPC handle cannot be
//! opened by the process that exported it.

use shardport_abi::plugin::guard_constructor;
use shardport_kit::{conformance::Pair, testing};

fn pair() -> Pair {
    let make = || {
        guard_constructor(testing::context("cuda-ipc", ""), shardport_cuda_ipc::create)
            .into_result()
            .expect("cuda-ipc constructor failed")
    };
    Pair::new(make(), make())
}

fn no_gpu() -> Option<String> {
    shardport_cuda_ipc::testkit::unavailable_reason()
}

shardport_kit::conformance_suite!(pair, skip_if: no_gpu);
