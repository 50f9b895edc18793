//! The cost of TLS on the http transport, measured in one run next to plain
//! http and the raw TCP loopback limit (BENCHMARKS.md, "TLS").
//!
//! Two owner processes (`shardport worker`), one serving plain HTTP and
//! one HTTPS with a certificate from a throwaway CA made here (rcgen), put
//! the same shards; this process is the consumer (one node whose http
//! transport trusts that CA, so it reaches both) and fetches them into a
//! warm buffer, alternating between the two owners in blocks so that both
//! see the same machine load. Raw TCP is `shardport bench`'s own limit
//! (an 8-byte request out, the shard back into a warm buffer).
//!
//! ```text
//! cargo build --release -p shardport-cli -p shardport-http
//! cargo run --release --example tls_bench [-- --reps-small 3000 --reps-large 12]
//! ```
//! Prints a markdown table on stdout.

#![allow(clippy::print_stdout)] // the table on stdout is this program's output

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use shardport_cli::{
    bench::{limits, stats::Summary},
    worker::{check_pattern, Request, WorkerProcess},
};
use shardport_host::{config, Handle, Node};

/// Sizes measured: the small-message latency and the bulk bandwidth cases.
const SMALL: u64 = 4 << 10;
const LARGE: u64 = 256 << 20;
/// Fetches per block before switching owners (the alternation that keeps
/// both paths under the same load).
const BLOCK_SMALL: usize = 100;
const BLOCK_LARGE: usize = 1;

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/tls_bench
    exe.parent()
        .and_then(Path::parent)
        .expect("examples dir has a parent")
        .to_path_buf()
}

fn http_so() -> PathBuf {
    let dir = profile_dir();
    let so = dir.join("libshardport_http.so");
    if so.is_file() {
        so
    } else {
        dir.join("deps").join("libshardport_http.so")
    }
}

fn http_table(extra: &str) -> String {
    format!(
        "[[plugin]]\nname = \"http\"\npath = \"{}\"\nrequired = true\n[plugin.config]\nbind = \"127.0.0.1:0\"\n{extra}\n",
        http_so().display()
    )
}

fn owner(dir: &Path, role: &str, extra: &str) -> WorkerProcess {
    let cfg = dir.join(format!("{role}.toml"));
    std::fs::write(&cfg, http_table(extra)).expect("write owner config");
    WorkerProcess::spawn(
        role,
        &profile_dir().join("shardport"),
        &["--config".into(), cfg.into_os_string()],
    )
    .expect("spawn owner (build shardport first: cargo build --release -p shardport-cli)")
}

fn put(w: &mut WorkerProcess, len: u64, seed: u64) -> Handle {
    let r = w
        .call(&Request::Put {
            len,
            seed,
            dtype: None,
            tags: Default::default(),
        })
        .expect("put");
    let hex = r.handle.expect("a handle");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    Handle::from_bytes(&bytes).expect("handle")
}

/// Median and 99th percentile, in microseconds (`shardport bench`'s
/// summary).
fn percentiles(samples: &[Duration]) -> (f64, f64) {
    let s = Summary::of(samples).expect("samples");
    (s.median_us, s.p99_us)
}

fn gbps(bytes: u64, us: f64) -> f64 {
    bytes as f64 / (us * 1e-6) / 1e9
}

struct Measured {
    plain: Vec<Duration>,
    tls: Vec<Duration>,
}

/// Fetches `plain` and `tls` (the same size) into one warm buffer,
/// alternating in blocks; every first fetch is checked byte for byte.
fn measure(
    consumer: &Node,
    plain: &Handle,
    tls: &Handle,
    seed: u64,
    warmup: usize,
    reps: usize,
    block: usize,
) -> Measured {
    let mut dst = vec![0u8; plain.meta.byte_len as usize];
    for h in [plain, tls] {
        let sel = consumer.fetch_into(h, &mut dst).expect("fetch");
        assert_eq!(sel.transport.as_str(), "http");
        assert!(check_pattern(&dst, seed), "wrong bytes");
        for _ in 0..warmup {
            consumer.fetch_into(h, &mut dst).expect("fetch");
        }
    }
    let mut m = Measured {
        plain: Vec::with_capacity(reps),
        tls: Vec::with_capacity(reps),
    };
    while m.plain.len() < reps {
        let n = block.min(reps - m.plain.len());
        for (h, out) in [(plain, &mut m.plain), (tls, &mut m.tls)] {
            for _ in 0..n {
                let t = Instant::now();
                consumer.fetch_into(h, &mut dst).expect("fetch");
                out.push(t.elapsed());
            }
        }
    }
    m
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let reps_small = arg("--reps-small", 3000);
    let reps_large = arg("--reps-large", 12);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();

    // A throwaway CA and a certificate for 127.0.0.1.
    let ca_key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "bench CA");
    let ca = p.self_signed(&ca_key).expect("CA");
    let key = KeyPair::generate().expect("key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&key, &ca, &ca_key)
        .expect("certificate");
    let (ca_file, cert_file, key_file) =
        (d.join("ca.pem"), d.join("owner.crt"), d.join("owner.key"));
    std::fs::write(&ca_file, ca.pem()).expect("write");
    std::fs::write(&cert_file, leaf.pem()).expect("write");
    std::fs::write(&key_file, key.serialize_pem()).expect("write");

    let mut plain_owner = owner(d, "plain", "");
    let mut tls_owner = owner(
        d,
        "tls",
        &format!(
            "tls-cert = \"{}\"\ntls-key = \"{}\"",
            cert_file.display(),
            key_file.display()
        ),
    );
    let consumer = Node::start(
        config::parse_str(
            &http_table(&format!("tls-ca = \"{}\"", ca_file.display())),
            config::Origin::File(d.join("consumer.toml")),
        )
        .expect("consumer config"),
    )
    .expect("consumer node");

    let mut rows = Vec::new();
    for (size, warmup, reps, block) in [
        (SMALL, 200, reps_small, BLOCK_SMALL),
        (LARGE, 1, reps_large, BLOCK_LARGE),
    ] {
        let seed = size ^ 0x5eed;
        let hp = put(&mut plain_owner, size, seed);
        let ht = put(&mut tls_owner, size, seed);
        eprintln!("fetching {size} bytes: {reps} per path, alternating");
        let m = measure(&consumer, &hp, &ht, seed, warmup, reps, block);
        let tcp = limits::tcp_round_trip(size as usize, warmup.min(20), reps.min(200))
            .expect("raw TCP round trip");
        let (p50, p99) = percentiles(&m.plain);
        let (t50, t99) = percentiles(&m.tls);
        let raw = tcp.samples.median_us;
        rows.push((size, p50, p99, t50, t99, raw));
    }

    println!("| size | path | p50 | p99 | GB/s at p50 | x plain http | raw TCP / path |");
    println!("|---|---|---|---|---|---|---|");
    for (size, p50, p99, t50, t99, raw) in rows {
        let label = if size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else {
            format!("{} KiB", size >> 10)
        };
        let fmt_t = |us: f64| {
            if us >= 10_000.0 {
                format!("{:.1} ms", us / 1000.0)
            } else {
                format!("{us:.1} us")
            }
        };
        println!(
            "| {label} | raw TCP | {} | | {:.2} | | 1.00 |",
            fmt_t(raw),
            gbps(size, raw)
        );
        println!(
            "| {label} | http | {} | {} | {:.2} | 1.00 | {:.2} |",
            fmt_t(p50),
            fmt_t(p99),
            gbps(size, p50),
            raw / p50
        );
        println!(
            "| {label} | http + TLS | {} | {} | {:.2} | {:.2} (time) | {:.2} |",
            fmt_t(t50),
            fmt_t(t99),
            gbps(size, t50),
            t50 / p50,
            raw / t50
        );
    }
}
