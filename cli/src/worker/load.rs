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
    /// When the loop starts, nanoseconds since the Unix epoch (0: at once).
    /// Every consumer of a point gets the same start, so their loops cover
    /// one window of wall-clock time, `duration_ms` long from it: a loop
    /// started at its own moment would run while others have not started
    /// or have stopped, and the point's rate, the consumers' shares and its
    /// copy limit would count those stretches as if all ran together.
    #[serde(default)]
    pub start_unix_ns: u64,
    /// The pattern seed of each handle (`check_pattern`): when given (one
    /// per handle), every fetched shard's bytes are checked, and a fetch
    /// whose bytes are not the owner's counts in `wrong_fetches`.
    #[serde(default)]
    pub seeds: Vec<u64>,
}

/// The longest a loop waits for its start.
pub const MAX_START_WAIT: Duration = Duration::from_secs(60);

/// The start of a loop scheduled at `start_unix_ns` (0: now): waits (at
/// most [`MAX_START_WAIT`]) for it and returns the instant that stands for
/// it, and how late this loop began (the request arrived after the start:
/// the loop then still ends with the others).
pub(crate) fn scheduled_start(start_unix_ns: u64) -> (Instant, Duration) {
    if start_unix_ns == 0 {
        return (Instant::now(), Duration::ZERO);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let at = Duration::from_nanos(start_unix_ns);
    match at.checked_sub(now) {
        Some(wait) => {
            std::thread::sleep(wait.min(MAX_START_WAIT));
            (Instant::now(), Duration::ZERO)
        }
        None => {
            let late = now - at;
            let here = Instant::now();
            (here.checked_sub(late).unwrap_or(here), late)
        }
    }
}

/// What one loop did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoopResult {
    /// Fetches that succeeded.
    pub fetches: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The bytes of the fetches made as copies through posix-shm (what
    /// the copy limit compares with: views move no bytes, and an http
    /// copy moves them through the kernel's sockets).
    #[serde(default)]
    pub copied_bytes: u64,
    /// The bytes of the fetches made through http.
    #[serde(default)]
    pub http_bytes: u64,
    /// Failed fetches by error kind.
    pub errors: BTreeMap<String, u64>,
    /// The first message of each error kind (what the transports said).
    #[serde(default)]
    pub error_samples: BTreeMap<String, String>,
    /// A uniform sample of the successful fetches' latencies, ns.
    pub latencies_ns: Vec<u64>,
    /// How long the loop ran, ns, from its scheduled start.
    pub elapsed_ns: u64,
    /// How late after its scheduled start the loop began, ns.
    #[serde(default)]
    pub late_ns: u64,
    /// Fetches whose bytes were not the owner's (only counted when the
    /// spec has `seeds`).
    #[serde(default)]
    pub wrong_fetches: u64,
}

/// A small, seeded generator (splitmix64): the same choices for the same seed.
pub(crate) struct Choice(pub(crate) u64);

impl Choice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// The frame of every timed loop of a point (fetches, a copy limit's
/// copies, a TCP limit's round trips): waits for `spec`'s scheduled start,
/// then calls `step` with the loop's generator and result until
/// `spec.duration_ms` has passed or [`MAX_FETCHES_PER_LOOP`] steps were
/// made; records how late it began and how long it ran. A step's error
/// ends the loop with it.
pub(crate) fn timed_loop(
    spec: &LoopSpec,
    mut step: impl FnMut(&mut Choice, &mut LoopResult) -> Result<(), String>,
) -> Result<LoopResult, String> {
    let mut rng = Choice(spec.seed);
    let mut out = LoopResult::default();
    let deadline = Duration::from_millis(spec.duration_ms);
    let (start, late) = scheduled_start(spec.start_unix_ns);
    out.late_ns = late.as_nanos() as u64;
    let mut steps = 0u64;
    while steps < MAX_FETCHES_PER_LOOP && start.elapsed() < deadline {
        step(&mut rng, &mut out)?;
        steps += 1;
    }
    out.elapsed_ns = start.elapsed().as_nanos() as u64;
    Ok(out)
}

/// Runs a loop in this process (a worker's `load` request).
pub fn run_loop(node: &Node, spec: &LoopSpec) -> Result<LoopResult, String> {
    let mut shm = Vec::with_capacity(spec.handles.len());
    let mut http = Vec::with_capacity(spec.handles.len());
    for text in &spec.handles {
        let h = super::decode_handle(text, None)?;
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
    if !spec.seeds.is_empty() && spec.seeds.len() != shm.len() {
        return Err(format!(
            "{} seeds for {} handles: one per handle, or none",
            spec.seeds.len(),
            shm.len()
        ));
    }
    if spec.start_unix_ns != 0 {
        warm_up(node, &shm, &http, spec);
    }
    let mut seen = 0u64;
    timed_loop(spec, |rng, out| {
        let i = rng.below(shm.len() as u64) as usize;
        let through_http = rng.chance(spec.http_share);
        let h = if through_http { &http[i] } else { &shm[i] };
        let mode = if rng.chance(spec.view_share) {
            FetchMode::View
        } else {
            FetchMode::Copy
        };
        let t = Instant::now();
        match node.fetch_mode(h, mode) {
            Ok(f) => {
                let ns = t.elapsed().as_nanos() as u64;
                if let Some(&seed) = spec.seeds.get(i) {
                    // The pattern alone would pass a copy cut short at a
                    // multiple of 8 bytes.
                    if f.data.len() as u64 != h.meta.byte_len
                        || !crate::pattern::check_pattern(&f.data, seed)
                    {
                        out.wrong_fetches += 1;
                    }
                }
                out.fetches += 1;
                out.bytes += h.meta.byte_len;
                if mode == FetchMode::Copy && !through_http {
                    out.copied_bytes += h.meta.byte_len;
                }
                if through_http {
                    out.http_bytes += h.meta.byte_len;
                }
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
            Err(e) => count_error(out, &e),
        }
        Ok(())
    })
}

/// Before a scheduled loop starts, what a consumer that has been running
/// for a while has done already: each shard fetched once as a view and as
/// a copy through posix-shm (its pages of the owner's pool mapped, its
/// copy destinations on the node's shelf), and once through http where the
/// loop fetches through http (a connection to the owner). Not counted:
/// the loop measures a consumer's steady state, not its first contact,
/// which `scripts/bench_first_fetch.py` and the fetch benches measure.
/// Failures here show again, counted, in the loop.
fn warm_up(node: &Node, shm: &[Handle], http: &[Handle], spec: &LoopSpec) {
    for h in shm {
        if spec.view_share > 0.0 {
            drop(node.fetch_mode(h, FetchMode::View));
        }
        if spec.view_share < 1.0 {
            drop(node.fetch_mode(h, FetchMode::Copy));
        }
    }
    if spec.http_share > 0.0 {
        for h in http {
            drop(node.fetch_mode(h, FetchMode::Copy));
        }
    }
}

/// The copy limit of a load point (a worker's `copy_limit` request): the
/// same copies as [`run_loop`]'s, without the fetch. Views of every shard
/// through posix-shm (held for the whole loop), one destination per shard
/// length (as this node's shelf keeps them), then, for `duration_ms`, a
/// shard chosen at random copied from its view into the destination of its
/// length, with one `memcpy` or (`split`) with the product's copy routine
/// (`kit::copy`: pieces of a large copy on several threads). Run by every
/// consumer of a point at once, it is what the machine copies with that
/// many processes copying: the same scheduler, the same caches. `fetches`
/// counts the copies.
pub fn run_copy_limit(node: &Node, spec: &LoopSpec, split: bool) -> Result<LoopResult, String> {
    let mut views = Vec::with_capacity(spec.handles.len());
    for text in &spec.handles {
        let h = super::decode_handle(text, Some("posix-shm"))?;
        let view = node
            .fetch_mode(&h, FetchMode::View)
            .map_err(|e| format!("view of shard {}: {e}", h.id))?;
        views.push(view);
    }
    if views.is_empty() {
        return Err("no handles".into());
    }
    let mut destinations: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    for v in &views {
        destinations
            .entry(v.data.len())
            .or_insert_with(|| vec![1u8; v.data.len()]);
    }
    let out = timed_loop(spec, |rng, out| {
        let src: &[u8] = &views[rng.below(views.len() as u64) as usize].data;
        let dst = destinations
            .get_mut(&src.len())
            .expect("a destination per length");
        if split {
            shardport_kit::copy::copy(src, dst);
        } else {
            dst.copy_from_slice(src);
        }
        out.fetches += 1;
        out.bytes += src.len() as u64;
        out.copied_bytes += src.len() as u64;
        Ok(())
    });
    std::hint::black_box(&destinations);
    out
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
/// shards for `duration_ms` from `start_unix_ns` (as [`LoopSpec`]'s), at
/// most `per_s` a second (0: as fast as it can). A put that fails (a full
/// pool, the shard table at `max-shards`) is counted by its kind and the
/// churn goes on; `fetches` counts the puts that succeeded.
pub fn run_churn(node: &Node, duration_ms: u64, per_s: u64, start_unix_ns: u64) -> LoopResult {
    let bytes = vec![7u8; 64 << 10];
    let spec = shardport_host::TensorSpec {
        dtype: shardport_abi::DType::U8,
        shape: vec![bytes.len() as u64],
        device: shardport_abi::Device::CPU,
    };
    let deadline = Duration::from_millis(duration_ms);
    let (start, _) = scheduled_start(start_unix_ns);
    let mut n = 0u64;
    let mut out = LoopResult::default();
    while start.elapsed() < deadline && n < MAX_FETCHES_PER_LOOP {
        match node.put(&bytes, &spec, BTreeMap::new()) {
            Ok(h) => {
                node.remove(&[h.id]);
                out.fetches += 1;
                out.bytes += bytes.len() as u64;
            }
            Err(e) => count_error(&mut out, &e),
        }
        n += 1;
        if per_s > 0 {
            // Paced: the n-th put is due at n / per_s seconds.
            let due = Duration::from_secs_f64(n as f64 / per_s as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait.min(deadline.saturating_sub(start.elapsed())));
            }
        }
    }
    out.elapsed_ns = start.elapsed().as_nanos() as u64;
    out
}

/// Counts a failed fetch or put by its kind, keeping the first message of
/// each kind.
fn count_error(out: &mut LoopResult, e: &shardport_host::HostError) {
    let kind = error_kind(e);
    out.error_samples
        .entry(kind.clone())
        .or_insert_with(|| e.to_string());
    *out.errors.entry(kind).or_default() += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix_ns_in(d: Duration, later: bool) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        (if later { now + d } else { now - d }).as_nanos() as u64
    }

    #[test]
    fn loops_start_at_their_scheduled_moment_or_count_how_late() {
        // Now: no wait, not late.
        let (_, late) = scheduled_start(0);
        assert_eq!(late, Duration::ZERO);
        // In the future: waits for it.
        let before = Instant::now();
        let (start, late) = scheduled_start(unix_ns_in(Duration::from_millis(30), true));
        assert_eq!(late, Duration::ZERO);
        assert!(start >= before + Duration::from_millis(20), "waited");
        // In the past: begins at once, the start stands back by the delay,
        // so the loop ends when the others do.
        let asked = Instant::now();
        let (start, late) = scheduled_start(unix_ns_in(Duration::from_millis(500), false));
        assert!(late >= Duration::from_millis(500), "{late:?}");
        assert!(
            start <= asked - Duration::from_millis(400),
            "the start stands back"
        );
    }

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
