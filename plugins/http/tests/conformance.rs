//! The shared transport conformance suite (`shardport-abi`, feature
//! `conformance`), run against this plugin in-process: owner and consumer
//! are two instances, each with its own server on an ephemeral loopback
//! port, as two processes would be. The end-to-end suite runs the same
//! cases against the built `.so`.

use shardport_abi::plugin::guard_constructor;
use shardport_kit::{conformance::Pair, testing};

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
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_with("", "")
    }
    shardport_kit::conformance_suite!(pair);
}

/// Both sides share a bearer token; every request carries it.
mod with_auth_token {
    const CONFIG: &str = "auth-token = \"conformance-7f3a9c\"";
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_with(CONFIG, CONFIG)
    }
    shardport_kit::conformance_suite!(pair);
}

/// Small limits: one pooled connection per owner, a tiny batch size and
/// short (but generous for loopback) timeouts.
mod tight_limits {
    const CONFIG: &str = "max-connections-per-owner = 1\nmax-batch = 2\nthreads = 1\n\
                          idle-timeout = \"2s\"\nheader-timeout = \"2s\"";
    fn pair() -> shardport_kit::conformance::Pair {
        super::pair_with(CONFIG, CONFIG)
    }
    shardport_kit::conformance_suite!(pair);
}

/// Mutual TLS: the owner serves HTTPS and requires a client certificate;
/// the consumer trusts the owner's CA and presents one (a throwaway CA
/// made once per run, files under cargo's per-test temp dir).
mod mutual_tls {
    use std::{path::Path, sync::OnceLock};

    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    /// Owner and consumer config tables.
    fn configs() -> &'static (String, String) {
        static CONFIGS: OnceLock<(String, String)> = OnceLock::new();
        CONFIGS.get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("http-conformance-mtls");
            std::fs::create_dir_all(&dir).unwrap();
            let ca_key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let ca = p.self_signed(&ca_key).unwrap();
            let write = |name: &str, text: String| {
                let path = dir.join(name);
                std::fs::write(&path, text).unwrap();
                path.display().to_string()
            };
            let ca_file = write("ca.pem", ca.pem());
            let issue = |name: &str| {
                let key = KeyPair::generate().unwrap();
                let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
                    .unwrap()
                    .signed_by(&key, &ca, &ca_key)
                    .unwrap();
                (
                    write(&format!("{name}.crt"), cert.pem()),
                    write(&format!("{name}.key"), key.serialize_pem()),
                )
            };
            let (oc, ok) = issue("owner");
            let (cc, ck) = issue("consumer");
            (
                format!(
                    "tls-cert = \"{oc}\"\ntls-key = \"{ok}\"\ntls-client-auth = \"required\"\n\
                     tls-client-ca = \"{ca_file}\""
                ),
                format!(
                    "tls-ca = \"{ca_file}\"\ntls-client-cert = \"{cc}\"\ntls-client-key = \"{ck}\""
                ),
            )
        })
    }

    fn pair() -> shardport_kit::conformance::Pair {
        let (owner, consumer) = configs();
        super::pair_with(owner, consumer)
    }
    shardport_kit::conformance_suite!(pair);
}
