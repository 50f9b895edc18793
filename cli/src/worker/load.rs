//! A consumer's load loop, run inside its `shardport worker` (request
//! `load`): fetches for a fixed time with no request round trip per fetch,
//! so the rate measured is the node's, not the harness's; and the owner's
//! churn (request `churn`). `shardport bench load` drives both.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use shardport_host::{FetchMode, Handle, Node};

/// Most fetches one loop makes, whatever its duration.
pub const MAX_FETCHES_PER_LOOP: u64 = 50_000_000;
/// Latencies a loop keeps (a uniform sample of all of them).
const RESERVOIR: usize = 20_000;
/// Shard sizes of the workload.
pub const SIZES: [u64; 4] = [4 << 10, 64 << 10, 1 << 20, 4 << 20];
/// Shards of each size the owner puts.
pub(crate) const PER_SIZE: usize = 4;

/// One consumer's loop, sent to its worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoopSpec {
    /// Hex of each handle's binary form.
    pub handles: Vec<String>,
    /// How long to fetch, milliseconds.
    pub duration_ms: u64,
    /// Share of fetches made as views (the rest copies).
    pub view_share: f64,
    /// Share of fetches made through http (the rest posix-shm).
    pub http_share: f64,
    /// Seed of this loop's choices.
    pub seed: u64,
}

/// What one loop did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoopResult {
    /// Fetches that succeeded.
    pub fetches: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Failed fetches by error kind.
    pub errors: BTreeMap<String, u64>,
    /// The first message of each error kind (what the transports said).
    #[serde(default)]
    pub error_samples: BTreeMap<String, String>,
    /// A uniform sample of the successful fetches' latencies, ns.
    pub latencies_ns: Vec<u64>,
    /// How long the loop ran, ns.
    pub elapsed_ns: u64,
}

/// A small, seeded generator (splitmix64): the same choices for the same seed.
struct Choice(u64);

impl Choice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Runs a loop in this process (a worker's `load` request).
pub fn run_loop(node: &Node, spec: &LoopSpec) -> Result<LoopResult, String> {
    let mut shm = Vec::with_capacity(spec.handles.len());
    let mut http = Vec::with_capacity(spec.handles.len());
    for text in &spec.handles {
        let bytes = hex::decode(text).map_err(|e| format!("bad handle: {e}"))?;
        let h = Handle::from_bytes(&bytes).map_err(|e| format!("bad handle: {e}"))?;
        let mut a = h.clone();
        let mut b = h;
        if !a.keep_only("posix-shm") || !b.keep_only("http") {
            return Err("every handle needs a posix-shm and an http export".into());
        }
        shm.push(a);
        http.push(b);
    }
    if shm.is_empty() {
        return Err("no handles".into());
    }
    let mut rng = Choice(spec.seed);
    let mut out = LoopResult::default();
    let deadline = Duration::from_millis(spec.duration_ms);
    let start = Instant::now();
    let mut seen = 0u64;
    while out.fetches + out.errors.values().sum::<u64>() < MAX_FETCHES_PER_LOOP
        && start.elapsed() < deadline
    {
        let i = rng.below(shm.len() as u64) as usize;
        let h = if rng.chance(spec.http_share) {
            &http[i]
        } else {
            &shm[i]
        };
        let mode = if rng.chance(spec.view_share) {
            FetchMode::View
        } else {
            FetchMode::Copy
        };
        let t = Instant::now();
        match node.fetch_mode(h, mode) {
            Ok(f) => {
                let ns = t.elapsed().as_nanos() as u64;
                out.fetches += 1;
                out.bytes += h.meta.byte_len;
                drop(f);
                seen += 1;
                // Reservoir sampling: every latency equally likely kept.
                if out.latencies_ns.len() < RESERVOIR {
                    out.latencies_ns.push(ns);
                } else {
                    let j = rng.below(seen);
                    if (j as usize) < RESERVOIR {
                        out.latencies_ns[j as usize] = ns;
                    }
                }
            }
            Err(e) => {
                let kind = error_kind(&e);
                out.error_samples
                    .entry(kind.clone())
                    .or_insert_with(|| e.to_string());
                *out.errors.entry(kind).or_default() += 1;
            }
        }
    }
    out.elapsed_ns = start.elapsed().as_nanos() as u64;
    Ok(out)
}

/// The kind of a fetch error, for counting.
fn error_kind(e: &shardport_host::HostError) -> String {
    let text = format!("{e:?}");
    text.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Other")
        .to_owned()
}

/// The owner's churn (a worker's `churn` request): put and remove 64 KiB
/// shards for `duration_ms`, at most `per_s` a second (0: as fast as it
/// can); returns how many it put.
pub fn run_churn(node: &Node, duration_ms: u64, per_s: u64) -> Result<u64, String> {
    let bytes = vec![7u8; 64 << 10];
    let spec = shardport_host::TensorSpec {
        dtype: shardport_abi::DType::U8,
        shape: vec![bytes.len() as u64],
        device: shardport_abi::Device::CPU,
    };
    let deadline = Duration::from_millis(duration_ms);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < deadline && n < MAX_FETCHES_PER_LOOP {
        let h = node
            .put(&bytes, &spec, BTreeMap::new())
            .map_err(|e| e.to_string())?;
        node.remove(&[h.id]);
        n += 1;
        if per_s > 0 {
            // Paced: the n-th put is due at n / per_s seconds.
            let due = Duration::from_secs_f64(n as f64 / per_s as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait.min(deadline.saturating_sub(start.elapsed())));
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_seeded_and_shares_hold() {
        let mut a = Choice(7);
        let mut b = Choice(7);
        assert_eq!(
            (0..5).map(|_| a.next()).collect::<Vec<_>>(),
            (0..5).map(|_| b.next()).collect::<Vec<_>>()
        );
        let mut r = Choice(1);
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((23_000..27_000).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| r.chance(1.0)));
        assert!((0..1000).all(|_| !r.chance(0.0)));
    }
}
