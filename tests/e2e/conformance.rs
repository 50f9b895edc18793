//! The transport conformance suite, instantiated for every transport built
//! here, each loaded from its `.so` through the host's loader (the same path
//! a deployment takes), owner and consumer as two separate instances.

use shardport_kit::conformance::Pair;

use crate::util;

fn pair_from(plugin_table: &str) -> Pair {
    let cfg = util::parse(plugin_table);
    let load = || {
        let (mut loaded, failures) = util::load(&cfg);
        assert!(failures.is_empty(), "plugin failed to load: {failures:?}");
        loaded.remove(0).transport
    };
    Pair {
        owner: load(),
        consumer: load(),
    }
}

mod posix_shm_pool {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_from(&crate::util::shm_plugin("pool-size = \"64MiB\""))
    }
    shardport_kit::conformance_suite!(pair);
}

mod posix_shm_segment_per_shard {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_from(&crate::util::shm_plugin(
            "allocation = \"segment-per-shard\"",
        ))
    }
    shardport_kit::conformance_suite!(pair);
}

mod spool_dir {
    use std::sync::OnceLock;

    fn pair() -> shardport_kit::conformance::Pair {
        // One spool directory for the whole test binary: owner and consumer
        // instances must share it, as two processes on one node would.
        static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
        let dir = DIR.get_or_init(|| crate::util::temp_dir("spool"));
        super::pair_from(&format!(
            "[[plugin]]\nname = \"spool-dir\"\npath = \"{}\"\n[plugin.config]\ndir = \"{}\"\n",
            crate::util::plugin_lib("shardport-spool-transport").display(),
            dir.path().display()
        ))
    }
    shardport_kit::conformance_suite!(pair);
}

mod http {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_from(&format!(
            "[[plugin]]\nname = \"http\"\npath = \"{}\"\n[plugin.config]\nbind = \"127.0.0.1:0\"\n",
            crate::util::plugin_lib("shardport-http").display()
        ))
    }
    shardport_kit::conformance_suite!(pair);
}

mod http_with_token {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_from(&format!(
            "[[plugin]]\nname = \"http\"\npath = \"{}\"\n[plugin.config]\nbind = \"127.0.0.1:0\"\nauth-token = \"e2e-token\"\n",
            crate::util::plugin_lib("shardport-http").display()
        ))
    }
    shardport_kit::conformance_suite!(pair);
}

mod cuda_ipc {
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_from(&crate::util::cuda_plugin())
    }
    // Without a driver every case is skipped with the reason; with one, the
    // CPU data cases skip themselves (cuda-ipc moves cuda shards only) and
    // the two-process GPU checks live in `crate::cuda`.
    shardport_kit::conformance_suite!(pair, skip_if: shardport_cuda_ipc::testkit::unavailable_reason);
}
