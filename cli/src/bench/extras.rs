//! Measurements outside the matrix: plugin dispatch, the 1000 x 4 KiB
//! batch, http fetches back to back, 10,000 x 4 KiB shards put and fetched
//! from another process, and a consumer's peak RSS during a large http
//! fetch.

use std::{collections::BTreeMap, hint::black_box, time::Instant};

use super::{
    matrix::{only, put_remote, Runner},
    BenchError, BenchOptions,
};
use crate::worker::{Request, WorkerProcess};
use shardport_host::{
    node::{Node, TensorSpec},
    vocab::FetchMode,
    Handle,
};

/// Shards in the batch measurement.
pub const BATCH_SHARDS: usize = 1000;
/// Bytes per batch shard.
pub const BATCH_SHARD_BYTES: u64 = 4 << 10;
/// Shards in the many-small-shards measurement (an RL step's per-sample
/// tensors: token ids, logprobs, masks, rewards).
pub const MANY_SHARDS: usize = 10_000;
/// The same with `--quick`.
pub const QUICK_MANY_SHARDS: usize = 1_000;

/// One measurement outside the matrix.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Extra {
    /// Stable key (`dispatch_overhead_ns`, `batch_shards_per_s`, ...).
    pub key: String,
    /// What was measured.
    pub name: String,
    /// The value (absent when skipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Its unit.
    pub unit: String,
    /// How it was measured, or what it was compared with.
    pub detail: String,
    /// Why it was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// It was started and failed (`skipped` has the error).
    pub failed: bool,
}

impl Extra {
    fn value(key: &str, name: String, value: f64, unit: &str, detail: String) -> Extra {
        Extra {
            key: key.to_owned(),
            name,
            value: Some(value),
            unit: unit.to_owned(),
            detail,
            skipped: None,
            failed: false,
        }
    }

    /// A measurement that failed: the error in place of the value.
    pub fn failed(key: &str, name: &str, unit: &str, e: &BenchError) -> Extra {
        Extra {
            failed: true,
            ..Extra::skipped(key, name, unit, format!("FAILED: {e}"))
        }
    }

    fn skipped(key: &str, name: &str, unit: &str, why: String) -> Extra {
        Extra {
            key: key.to_owned(),
            name: name.to_owned(),
            value: None,
            unit: unit.to_owned(),
            detail: String::new(),
            skipped: Some(why),
            failed: false,
        }
    }
}

#[inline(never)]
fn direct_echo(x: u64) -> u64 {
    black_box(x)
}

/// `Transport::echo` through a loaded plugin's vtable vs a direct call.
pub fn dispatch(node: &Node, calls: u64) -> Vec<Extra> {
    let Some(plugin) = node
        .plugin("posix-shm")
        .or_else(|| node.plugins().first().cloned())
    else {
        let why = "no plugin loaded".to_owned();
        return vec![Extra::skipped(
            "dispatch_overhead_ns",
            "plugin dispatch overhead",
            "ns",
            why,
        )];
    };
    let mut acc = 0u64;
    let t = Instant::now();
    for i in 0..calls {
        acc = acc.wrapping_add(plugin.transport.echo(black_box(i)));
    }
    let via = t.elapsed().as_nanos() as f64 / calls as f64;
    let t = Instant::now();
    for i in 0..calls {
        acc = acc.wrapping_add(direct_echo(black_box(i)));
    }
    let direct = t.elapsed().as_nanos() as f64 / calls as f64;
    black_box(acc);
    vec![
        Extra::value(
            "dispatch_vtable_ns",
            format!("`{}` Transport::echo through the .so vtable", plugin.name),
            via,
            "ns",
            format!("{calls} calls"),
        ),
        Extra::value(
            "dispatch_direct_ns",
            "direct (non-inlined) call, same loop".into(),
            direct,
            "ns",
            format!("{calls} calls"),
        ),
        Extra::value(
            "dispatch_overhead_ns",
            "plugin dispatch overhead (vtable - direct)".into(),
            via - direct,
            "ns",
            "per call".into(),
        ),
    ]
}

/// `fetch_many` of 1000 x 4 KiB shards owned by another process, over http
/// (one request for the batch). Shards per second, median of `reps`.
pub fn batch(
    runner: &mut Runner<'_>,
    node: &Node,
    reps: usize,
    http_ok: Result<(), String>,
) -> Result<Extra, BenchError> {
    const KEY: &str = "batch_shards_per_s";
    let name = format!("http batch fetch_many, {BATCH_SHARDS} x 4 KiB");
    if let Err(why) = http_ok {
        return Ok(Extra::skipped(KEY, &name, "shards/s", why));
    }
    let owner = runner.owner()?;
    let mut ids = Vec::with_capacity(BATCH_SHARDS);
    let mut handles = Vec::with_capacity(BATCH_SHARDS);
    for i in 0..BATCH_SHARDS {
        let (id, h) = put_remote(owner, BATCH_SHARD_BYTES, 100 + i as u64)?;
        ids.push(id);
        handles.push(only(h, "http")?);
    }
    let rates = rate(BATCH_SHARDS, reps.max(3), || fetch_all(node, &handles));
    runner.owner()?.call(&Request::Remove { ids })?;
    let s = rates?;
    Ok(Extra::value(
        KEY,
        name,
        s.median_us,
        "shards/s",
        format!(
            "median of {} rounds (min {:.0}, max {:.0})",
            s.n, s.min_us, s.max_us
        ),
    ))
}

/// Sizes of [`back_to_back`].
pub const BACK_TO_BACK_SIZES: [u64; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// One http shard of `size` from the owner process fetched `n` times in a
/// row into one buffer (after 20 untimed fetches), the way a consumer that
/// reads many pieces one after another does; the matrix's http cell is an
/// isolated fetch instead (its owner has slept since the last one). Value:
/// p50 microseconds; the detail has p99 and the same-run TCP limit at that
/// size ([`tcp_round_trip`](super::limits::tcp_round_trip), taken once the
/// owner's poll after the last response is over), and their ratio.
pub fn back_to_back(
    runner: &mut Runner<'_>,
    node: &Node,
    size: u64,
    n: usize,
    http_ok: &Result<(), String>,
) -> Extra {
    let key = format!("http_back_to_back_{}_p50_us", size >> 10);
    let name = format!(
        "http fetch back to back, {}",
        shardport_kit::format_byte_size(size)
    );
    if let Err(why) = http_ok {
        return Extra::skipped(&key, &name, "us", why.clone());
    }
    match back_to_back_samples(runner, node, size, n) {
        Ok((fetches, limit, [polls, hits])) => Extra::value(
            &key,
            name,
            fetches.median_us,
            "us",
            format!(
                "p50 of {} fetches in a row, p99 {:.1} us ({:.1}x p50); TCP limit {:.1} us: \
                 {:.2}x; the owner polled after {polls} responses, {hits} found the next request",
                fetches.n,
                fetches.p99_us,
                fetches.p99_us / fetches.median_us,
                limit.samples.median_us,
                limit.samples.median_us / fetches.median_us
            ),
        ),
        Err(e) => Extra::failed(&key, &name, "us", &e),
    }
}

/// The fetches' times, the TCP limit, and the owner's `owner_polls` and
/// `owner_poll_hits` during the fetches.
fn back_to_back_samples(
    runner: &mut Runner<'_>,
    node: &Node,
    size: u64,
    n: usize,
) -> Result<(super::stats::Summary, super::limits::SizeLimit, [u64; 2]), BenchError> {
    const WARMUP: usize = 20;
    let polls = |runner: &mut Runner<'_>| -> Result<[u64; 2], BenchError> {
        let stats = runner
            .owner()?
            .call(&Request::Stats)?
            .stats
            .unwrap_or_default();
        Ok(["owner_polls_total", "owner_poll_hits_total"]
            .map(|k| crate::worker::plugin_stat(&stats, "http", k)))
    };
    let before = polls(runner)?;
    let (id, h) = put_remote(runner.owner()?, size, 31)?;
    let h = only(h, "http")?;
    let mut dst = vec![0u8; size as usize];
    let mut times = Vec::with_capacity(n);
    let fetched = (0..WARMUP + n.max(1)).try_for_each(|i| {
        let t = Instant::now();
        node.fetch_into(&h, &mut dst)?;
        if i >= WARMUP {
            times.push(t.elapsed());
        }
        Ok::<(), BenchError>(())
    });
    let after = polls(runner);
    runner.owner()?.call(&Request::Remove { ids: vec![id] })?;
    fetched?;
    let after = after?;
    std::thread::sleep(runner.owner_poll_ends());
    let limit = super::limits::tcp_round_trip(size as usize, 2, 20)
        .map_err(|e| BenchError::Other(format!("raw TCP loopback: {e}")))?;
    let fetches = super::stats::Summary::of(&times).expect("at least one fetch");
    Ok((
        fetches,
        limit,
        [0, 1].map(|i| after[i].saturating_sub(before[i])),
    ))
}

/// Shards per second of `round` moving `shards` shards: one untimed round
/// (connections, buffers, pool pages warm), then `reps`; the summary's
/// "microseconds" are shards per second.
fn rate(
    shards: usize,
    reps: usize,
    mut round: impl FnMut() -> Result<(), BenchError>,
) -> Result<super::stats::Summary, BenchError> {
    let mut rates = Vec::with_capacity(reps);
    for i in 0..=reps {
        let t = Instant::now();
        round()?;
        if i > 0 {
            rates.push(shards as f64 / t.elapsed().as_secs_f64());
        }
    }
    Ok(super::stats::Summary::of_us(&mut rates).expect("at least one round"))
}

/// Copies of every shard in `handles` into this process, in batches of the
/// node's `fetch.max-batch`; the first failure is the error.
fn fetch_all(node: &Node, handles: &[Handle]) -> Result<(), BenchError> {
    for chunk in handles.chunks(node.config().fetch.max_batch.max(1)) {
        if let Some(Err(e)) = node
            .fetch_many(chunk, FetchMode::Copy)?
            .into_iter()
            .find(Result::is_err)
        {
            return Err(e.into());
        }
    }
    Ok(())
}

/// `shards` x 4 KiB ([`MANY_SHARDS`]; fewer with `--quick`): puts into this process's posix-shm pool, and
/// copies of shards another process owns, through posix-shm and through
/// http (`fetch_many`). Shards per second, median of `reps` rounds.
pub fn many_small(
    runner: &mut Runner<'_>,
    node: &Node,
    (shards, reps): (usize, usize),
    shm_ok: Result<(), String>,
    http_ok: Result<(), String>,
) -> Vec<Extra> {
    let label = |what: &str| format!("{shards} x 4 KiB {what}");
    let summary = |key: &str, name: String, r: Result<super::stats::Summary, BenchError>| match r {
        Ok(s) => Extra::value(
            key,
            name,
            s.median_us,
            "shards/s",
            format!(
                "median of {} rounds (min {:.0}, max {:.0})",
                s.n, s.min_us, s.max_us
            ),
        ),
        Err(e) => Extra::failed(key, &name, "shards/s", &e),
    };
    let mut out = Vec::new();
    let put_name = label("put_many, posix-shm pool");
    match &shm_ok {
        Ok(()) => out.push(match many_puts(runner, shards, reps) {
            Ok((put, removed)) => Extra::value(
                "many_small_put_per_s",
                put_name,
                put.median_us,
                "shards/s",
                format!(
                    "median of {} rounds (min {:.0}, max {:.0}); removing them after each \
                     round, not in this rate: median {:.0} shards/s",
                    put.n, put.min_us, put.max_us, removed.median_us
                ),
            ),
            Err(e) => Extra::failed("many_small_put_per_s", &put_name, "shards/s", &e),
        }),
        Err(why) => out.push(Extra::skipped(
            "many_small_put_per_s",
            &put_name,
            "shards/s",
            why.clone(),
        )),
    }
    let fetched = remote_shards(runner, shards);
    for (transport, ok, key) in [
        ("posix-shm", &shm_ok, "many_small_fetch_shm_per_s"),
        ("http", &http_ok, "many_small_fetch_http_per_s"),
    ] {
        let name = label(&format!("fetch_many from another process, {transport}"));
        out.push(match (ok, &fetched) {
            (Err(why), _) => Extra::skipped(key, &name, "shards/s", why.clone()),
            (Ok(()), Err(e)) => Extra::failed(key, &name, "shards/s", e),
            (Ok(()), Ok((_, handles))) => {
                let only_t: Result<Vec<Handle>, BenchError> =
                    handles.iter().map(|h| only(h.clone(), transport)).collect();
                summary(
                    key,
                    name,
                    only_t.and_then(|hs| rate(shards, reps, || fetch_all(node, &hs))),
                )
            }
        });
    }
    if let (Ok((ids, _)), Ok(owner)) = (fetched, runner.owner()) {
        let _ = owner.call(&Request::Remove { ids });
    }
    out
}

/// Puts of `shards` 4 KiB shards into the in-process posix-shm node with
/// `put_many` (the batch API: one call, one config generation), removed
/// after each round. Shards per second of the puts, and of the removals
/// (timed apart), over one untimed round then `reps`.
fn many_puts(
    runner: &mut Runner<'_>,
    shards: usize,
    reps: usize,
) -> Result<(super::stats::Summary, super::stats::Summary), BenchError> {
    let node = runner.put_node("posix-shm")?;
    let src = vec![7u8; BATCH_SHARD_BYTES as usize];
    let spec = TensorSpec::bytes(BATCH_SHARD_BYTES);
    let items: Vec<_> = (0..shards)
        .map(|_| (src.as_slice(), spec.clone(), BTreeMap::new()))
        .collect();
    let (mut puts, mut removes) = (Vec::new(), Vec::new());
    let mut ids = Vec::with_capacity(shards);
    for i in 0..=reps {
        let t = Instant::now();
        for h in node.put_many(&items) {
            ids.push(h?.id);
        }
        let put = t.elapsed();
        let t = Instant::now();
        node.remove(&ids);
        let removed = t.elapsed();
        ids.clear();
        if i > 0 {
            puts.push(shards as f64 / put.as_secs_f64());
            removes.push(shards as f64 / removed.as_secs_f64());
        }
    }
    let summary = |v: &mut Vec<f64>| super::stats::Summary::of_us(v).expect("at least one round");
    Ok((summary(&mut puts), summary(&mut removes)))
}

/// `n` 4 KiB shards put by the owner process: their ids and handles.
fn remote_shards(
    runner: &mut Runner<'_>,
    n: usize,
) -> Result<(Vec<String>, Vec<Handle>), BenchError> {
    let owner = runner.owner()?;
    let mut ids = Vec::with_capacity(n);
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let (id, h) = put_remote(owner, BATCH_SHARD_BYTES, 5000 + i as u64)?;
        ids.push(id);
        handles.push(h);
    }
    Ok((ids, handles))
}

/// Peak RSS of a fresh consumer process fetching a `size` shard over http.
pub fn consumer_rss(
    runner: &mut Runner<'_>,
    opts: &BenchOptions,
    size: u64,
    http_ok: Result<(), String>,
) -> Result<Extra, BenchError> {
    const KEY: &str = "http_consumer_peak_rss_x";
    let name = format!(
        "http consumer peak RSS, {} fetch",
        shardport_kit::format_byte_size(size)
    );
    if let Err(why) = http_ok {
        return Ok(Extra::skipped(KEY, &name, "x size", why));
    }
    let (id, h) = put_remote(runner.owner()?, size, 21)?;
    let h = only(h, "http")?;
    let mut consumer = WorkerProcess::spawn("consumer", &opts.exe, &opts.config_args)?;
    let before = consumer.call(&Request::Stats)?.rss.unwrap_or(0);
    let fetched = consumer.call(&Request::Fetch {
        handle: hex::encode(h.to_bytes()),
        mode: Some(FetchMode::Copy),
        seed: Some(21),
        hold: false,
        only: Some("http".into()),
    });
    let peak = consumer.call(&Request::Stats)?.peak_rss.unwrap_or(0);
    consumer.exit()?;
    runner.owner()?.call(&Request::Remove { ids: vec![id] })?;
    if fetched?.verified != Some(true) {
        return Err(BenchError::Other(
            "http fetch for the RSS measurement returned wrong bytes".into(),
        ));
    }
    Ok(Extra::value(
        KEY,
        name,
        peak as f64 / size as f64,
        "x size",
        format!(
            "peak {:.1} MiB, {:.1} MiB before the fetch (the shard is fetched into a fresh buffer)",
            peak as f64 / (1u64 << 20) as f64,
            before as f64 / (1u64 << 20) as f64
        ),
    ))
}
