//! The shared transport conformance suite (`shardport-abi`, feature
//! `conformance`), run against this plugin in-process: owner and consumer
//! are two instances, each with its own server on an ephemeral loopback
//! port, as two processes would be. The end-to-end suite runs the same
//! cases against the built `.so`.

use shardport_abi::{conformance::Pair, plugin::guard_constructor, testing};

fn pair_with(owner_config: &str, consumer_config: &str) -> Pair {
    let make = |config: &str| {
        guard_constructor(testing::context("http", config), shardport_http::create)
            .into_result()
            .expect("http constructor failed")
    };
    Pair::new(make(owner_config), make(consumer_config))
}

/// Defaults: loopback, ephemeral port, no token.
mod defaults {
    fn pair() -> shardport_abi::conformance::Pair {
        super::pair_with("", "")
    }
    shardport_abi::conformance_suite!(pair);
}

/// Both sides share a bearer token; every request carries it.
mod with_auth_token {
    const CONFIG: &str = "auth-token = \"conformance-7f3a9c\"";
    fn pair() -> shardport_abi::conformance::Pair {
        super::pair_with(CONFIG, CONFIG)
    }
    shardport_abi::conformance_suite!(pair);
}

/// Small limits: one pooled connection per owner, a tiny batch size and
/// short (but generous for loopback) timeouts.
mod tight_limits {
    const CONFIG: &str = "max-connections-per-owner = 1\nmax-batch = 2\nthreads = 1\n\
                          idle-timeout = \"2s\"\nheader-timeout = \"2s\"";
    fn pair() -> shardport_abi::conformance::Pair {
        super::pair_with(CONFIG, CONFIG)
    }
    shardport_abi::conformance_suite!(pair);
}
