//! The shardport transport conformance suite, run against `spool-dir`.
//!
//! Each case gets a fresh owner and consumer: two separate instances with
//! their own node tags, sharing one spool directory under cargo's
//! `CARGO_TARGET_TMPDIR`, as two processes on one node would. Instances
//! delete their files when dropped, so the directory is left empty.

use shardport_abi::plugin::guard_constructor;
use shardport_kit::{conformance::Pair, testing};

fn pair() -> Pair {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("spool-conformance");
    let config = format!("dir = '{}'", dir.display());
    let make = || {
        guard_constructor(
            testing::context("spool", &config),
            shardport_spool_transport::create,
        )
        .into_result()
        .expect("spool-dir constructor failed")
    };
    Pair::new(make(), make())
}

shardport_kit::conformance_suite!(pair);
