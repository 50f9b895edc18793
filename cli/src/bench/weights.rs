//! `shardport bench weights`: weight updates of a synthetic state dict,
//! beside their floors from the same run.
//!
//! A state dict is a preset ([`Dict`]): the tensors of a GPT-like model
//! (per layer a QKV, a projection and two MLP matrices, their biases and
//! two layer norms; an embedding), or many small tensors. Every tensor
//! holds the pattern of its own seed, and every receiver checks every
//! tensor after each update (untimed), so a figure is of right bytes.
//!
//! - **Across nodes** (`--nodes N`): a testbed of N + 1 nodes
//!   ([`crate::cluster`]), each a real `shardport worker` in its own
//!   namespace with an http transport configured as the docs' broadcast
//!   recipe says (`relay = "on"`, every other key at its default). Node 0
//!   publishes; the N receivers update at once. The time is from the first
//!   update request to the last receiver's commit. Floor: the state dict's
//!   bytes through one receiver's link, S / B, with TCP/IP framing and less
//!   a full tbf bucket, as every floor of `bench cluster`.
//! - **One node** (`--local`): an owner and a receiver process on this
//!   machine with the embedded default config (posix-shm, http); the
//!   update beside a copy of the same bytes between two resident buffers
//!   with the receiver's threads, measured by the receiver in the same run.
//!
//! Each configuration runs `--steps` measured versions after warm-up ones:
//! one across nodes (new destinations and connections), and on one node
//! as many as it takes the owner's pool to be used once (its pool holds
//! three versions), so that the figure is of a training loop's steady
//! state, where the receiver's mapping of the pool has every page already
//! (the first pass over a pool faults every page in: that cold update is
//! in `steps_s`).

use std::{path::PathBuf, time::Instant};

use serde::Serialize;

use crate::{
    cluster::{burst_bytes, wire_bytes, Cluster},
    worker::{weights::UpdateReport, Request, WorkerProcess},
};

/// A synthetic state dict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dict {
    /// GPT-like, d = 320, 12 layers, vocabulary 8000: 148 tensors, 67 MB.
    Gpt64,
    /// GPT-like, d = 640, 48 layers, vocabulary 32000: 580 tensors, 1.03 GB.
    Gpt1g,
    /// 1,000 tensors of 4 KiB.
    Small,
}

impl Dict {
    /// The preset's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Dict::Gpt64 => "gpt-64MiB",
            Dict::Gpt1g => "gpt-1GiB",
            Dict::Small => "small-1000x4KiB",
        }
    }

    /// Parses a preset name.
    pub fn parse(s: &str) -> Result<Dict, String> {
        [Dict::Gpt64, Dict::Gpt1g, Dict::Small]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                format!("unknown state dict {s:?}: gpt-64MiB, gpt-1GiB or small-1000x4KiB")
            })
    }

    /// Bytes of every tensor, in state-dict order.
    pub fn sizes(self) -> Vec<u64> {
        match self {
            Dict::Gpt64 => gpt(320, 12, 8000),
            Dict::Gpt1g => gpt(640, 48, 32000),
            Dict::Small => vec![4096; 1000],
        }
    }
}

/// float32 tensors of a GPT-like model of width `d`.
fn gpt(d: u64, layers: u64, vocab: u64) -> Vec<u64> {
    let f = |n: u64| n * 4;
    let mut out = vec![f(vocab * d), f(1024 * d)];
    for _ in 0..layers {
        out.extend([
            f(d),
            f(d),
            f(3 * d * d),
            f(3 * d),
            f(d * d),
            f(d),
            f(d),
            f(d),
            f(4 * d * d),
            f(4 * d),
            f(4 * d * d),
            f(d),
        ]);
    }
    out.extend([f(d), f(d)]);
    out
}

/// What to run.
#[derive(Debug, Clone)]
pub struct WeightsOptions {
    /// State dicts.
    pub dicts: Vec<Dict>,
    /// Receiver counts across nodes (empty: none).
    pub nodes: Vec<usize>,
    /// Link rate of every node, bits per second.
    pub rate_bps: u64,
    /// Also the one-node update.
    pub local: bool,
    /// Measured versions per configuration (after the warm-up ones).
    pub steps: usize,
    /// The publisher's bucket size, if not the default.
    pub bucket_size: Option<u64>,
    /// The `shardport` executable the workers run.
    pub exe: PathBuf,
    /// Where the plugin libraries are.
    pub plugin_dir: PathBuf,
}

/// One configuration's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WeightsRow {
    /// The preset.
    pub dict: String,
    /// Tensors.
    pub tensors: usize,
    /// Bytes of the tensors.
    pub bytes: u64,
    /// Buckets of a version.
    pub buckets: usize,
    /// Receivers (0 for the one-node row).
    pub receivers: usize,
    /// Link rate, bits per second (0 for the one-node row).
    pub rate_bps: u64,
    /// Median update, seconds: the last commit of all receivers.
    pub update_s: f64,
    /// Every update's time, seconds, warm-up ones first.
    pub steps_s: Vec<f64>,
    /// How many of `steps_s` were warm-up.
    pub warmup: usize,
    /// Median publish, seconds.
    pub publish_s: f64,
    /// The floor: S / B with framing, less a bucket (across nodes); the
    /// same-run copy of the same bytes (one node), seconds.
    pub floor_s: f64,
    /// What the floor is.
    pub floor: String,
    /// Buckets per transport, of the last update of the first receiver.
    pub transports: String,
    /// Every receiver held every tensor's bytes after every update.
    pub correct: bool,
}

/// Runs every configuration; progress lines go to `progress`.
pub fn run_weights(
    opts: &WeightsOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<WeightsRow>, String> {
    let mut rows = Vec::new();
    if opts.local {
        for &d in &opts.dicts {
            progress(&format!("one node: {}", d.name()));
            rows.push(local(opts, d)?);
        }
    }
    if !opts.nodes.is_empty() {
        if let Some(why) = Cluster::unavailable() {
            return Err(format!("cannot make a simulated cluster here: {why}"));
        }
    }
    for &n in &opts.nodes {
        if n == 0 || n + 1 > crate::cluster::MAX_NODES {
            return Err(format!(
                "--nodes {n}: 1..={}",
                crate::cluster::MAX_NODES - 1
            ));
        }
        progress(&format!("testbed: {} nodes", n + 1));
        let cluster = Cluster::create(&vec![opts.rate_bps; n + 1])?;
        let dir = tempdir()?;
        let mut workers = (0..=n)
            .map(|i| node_worker(&cluster, i, opts, &dir))
            .collect::<Result<Vec<_>, _>>()?;
        for &d in &opts.dicts {
            progress(&format!("N = {n}: {}", d.name()));
            let mut row = steps(&mut workers, d, opts, 1, false)?;
            row.receivers = n;
            row.rate_bps = opts.rate_bps;
            // The bytes through one receiver's link, less what a full tbf
            // bucket lets through at once.
            let bits = wire_bytes(row.bytes).saturating_sub(burst_bytes(opts.rate_bps)) * 8;
            row.floor_s = bits as f64 / opts.rate_bps as f64;
            row.floor = "S/B".into();
            rows.push(row);
        }
        for w in &mut workers {
            let _ = w.call(&Request::Exit);
        }
        drop(workers);
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(rows)
}

fn tempdir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("shardport-bench-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

fn node_worker(
    c: &Cluster,
    i: usize,
    opts: &WeightsOptions,
    dir: &std::path::Path,
) -> Result<WorkerProcess, String> {
    let addr = c.nodes[i].addr;
    let cfg = dir.join(format!("node{i}.toml"));
    // The documented broadcast recipe: relays on, every other key default.
    let text = format!(
        "[node]\nname = \"n{i}\"\nadvertise = \"{addr}:7070\"\n\
         [put]\nstorage = \"heap\"\n\
         [[plugin]]\nname = \"http\"\npath = \"{lib}\"\nrequired = true\n\
         [plugin.config]\nbind = \"{addr}:0\"\nrelay = \"on\"\n",
        lib = opts.plugin_dir.join("libshardport_http.so").display(),
    );
    std::fs::write(&cfg, text).map_err(|e| format!("writing {}: {e}", cfg.display()))?;
    let mut cmd = c.command(i, &opts.exe);
    cmd.arg("worker").arg("--config").arg(&cfg);
    WorkerProcess::spawn_command(&format!("node {i}"), cmd).map_err(|e| e.to_string())
}

fn local(opts: &WeightsOptions, d: Dict) -> Result<WeightsRow, String> {
    let dir = tempdir()?;
    let cfg = dir.join("local.toml");
    // The default config's transports, with a pool that holds three
    // versions: the one receivers read, the next being put, and the one
    // before, retired once the next is put.
    let bytes: u64 = d.sizes().iter().sum();
    let pool = 3 * bytes + (64 << 20);
    let text = format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n\
         [[plugin]]\nname = \"posix-shm\"\npath = \"{shm}\"\nrequired = true\n\
         [plugin.config]\npool-size = {pool}\non-full = \"spill\"\n\
         [[plugin]]\nname = \"http\"\npath = \"{http}\"\n\
         [plugin.config]\nbind = \"127.0.0.1:0\"\n",
        shm = opts.plugin_dir.join("libshardport_posix_shm.so").display(),
        http = opts.plugin_dir.join("libshardport_http.so").display(),
    );
    std::fs::write(&cfg, text).map_err(|e| format!("writing {}: {e}", cfg.display()))?;
    let args = ["--config".into(), cfg.clone().into_os_string()];
    let spawn = |role: &str| {
        WorkerProcess::spawn(role, &opts.exe, &args).map_err(|e| format!("{role}: {e}"))
    };
    let mut workers = vec![spawn("owner")?, spawn("receiver")?];
    // Versions until the pool was used once, and one more.
    let mut row = steps(&mut workers, d, opts, 5, true)?;
    for w in &mut workers {
        let _ = w.call(&Request::Exit);
    }
    row.floor = "memcpy".into();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(row)
}

/// `opts.steps` versions of `d`: worker 0 publishes, the others update at
/// once. With `memcpy`, the floor is the receivers' same-run copy.
fn steps(
    workers: &mut [WorkerProcess],
    d: Dict,
    opts: &WeightsOptions,
    warmup: usize,
    memcpy: bool,
) -> Result<WeightsRow, String> {
    let sizes = d.sizes();
    let mut steps_s = Vec::new();
    let mut publish_s = Vec::new();
    let mut floors = Vec::new();
    let mut correct = true;
    let mut buckets = 0;
    let mut transports = String::new();
    let base = 1000 * (d as u64 + 1);
    for step in 0..(warmup + opts.steps.max(1)) as u64 {
        let version = base + step;
        let p = workers[0]
            .call(&Request::Publish {
                version,
                sizes: sizes.clone(),
                seed: version,
                bucket_size: opts.bucket_size,
            })
            .map_err(|e| format!("publish: {e}"))?;
        publish_s.push(p.ns.unwrap_or(0) as f64 / 1e9);
        let manifest = p.manifest.ok_or("the publish gave no manifest")?;
        let receivers = &mut workers[1..];
        for r in receivers.iter_mut() {
            r.call(&Request::Update {
                manifest: manifest.clone(),
                seed: None,
                prepare: true,
                memcpy: false,
                verify_always: false,
            })
            .map_err(|e| format!("preparing: {e}"))?;
        }
        let start = Instant::now();
        let reports: Vec<Result<(UpdateReport, f64), String>> = std::thread::scope(|s| {
            let joins: Vec<_> = receivers
                .iter_mut()
                .map(|r| {
                    let manifest = &manifest;
                    s.spawn(move || {
                        let reply = r
                            .call(&Request::Update {
                                manifest: manifest.clone(),
                                seed: None,
                                prepare: false,
                                memcpy: false,
                                verify_always: false,
                            })
                            .map_err(|e| e.to_string())?;
                        let done = start.elapsed().as_secs_f64();
                        let rep: UpdateReport =
                            serde_json::from_value(reply.weights.unwrap_or_default())
                                .map_err(|e| format!("update report: {e}"))?;
                        Ok((rep, done))
                    })
                })
                .collect();
            joins
                .into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err("an update thread panicked".into()))
                })
                .collect()
        });
        let mut last = 0f64;
        for (i, r) in reports.into_iter().enumerate() {
            let (rep, done) = r.map_err(|e| format!("receiver {}: {e}", i + 1))?;
            last = last.max(done);
            if i == 0 {
                buckets = rep.buckets;
                transports = rep
                    .transports
                    .iter()
                    .map(|(t, n)| format!("{t}:{n}"))
                    .collect::<Vec<_>>()
                    .join(",");
            }
        }
        steps_s.push(last);
        // Untimed: every tensor's bytes, and (one node) the copy limit.
        for r in receivers.iter_mut() {
            let reply = r
                .call(&Request::Update {
                    manifest: manifest.clone(),
                    seed: Some(version),
                    prepare: false,
                    memcpy,
                    verify_always: false,
                })
                .map_err(|e| format!("checking: {e}"))?;
            let rep: UpdateReport = serde_json::from_value(reply.weights.unwrap_or_default())
                .map_err(|e| format!("update report: {e}"))?;
            correct &= rep.correct == Some(true);
            if let Some(ns) = rep.memcpy_ns.filter(|_| step as usize >= warmup) {
                floors.push(ns as f64 / 1e9);
            }
        }
    }
    Ok(WeightsRow {
        dict: d.name().into(),
        tensors: sizes.len(),
        bytes: sizes.iter().sum(),
        buckets,
        receivers: 0,
        rate_bps: 0,
        update_s: median(&steps_s[warmup..]),
        steps_s,
        warmup,
        publish_s: median(&publish_s[warmup..]),
        floor_s: if floors.is_empty() {
            f64::NAN
        } else {
            median(&floors)
        },
        floor: String::new(),
        transports,
        correct,
    })
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The rows as a table, each update beside its floor.
pub fn table(rows: &[WeightsRow]) -> String {
    let mut out = String::from(
        "| state dict | tensors | bytes | buckets | receivers | link | update (median) | floor | update / floor | publish | transports | correct |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let link = if r.rate_bps == 0 {
            "one node".to_owned()
        } else {
            format!("{} Mbit/s", r.rate_bps / 1_000_000)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} {} | {:.2}x | {} | {} | {} |\n",
            r.dict,
            r.tensors,
            shardport_kit::format_byte_size(r.bytes),
            r.buckets,
            r.receivers,
            link,
            secs(r.update_s),
            r.floor,
            secs(r.floor_s),
            r.update_s / r.floor_s,
            secs(r.publish_s),
            r.transports,
            if r.correct { "yes" } else { "NO" },
        ));
    }
    out
}

fn secs(s: f64) -> String {
    if s < 0.01 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_presets_have_the_sizes_their_names_say() {
        let mb = |d: Dict| d.sizes().iter().sum::<u64>() as f64 / 1e6;
        assert_eq!(Dict::Gpt64.sizes().len(), 148);
        assert!(
            (60.0..75.0).contains(&mb(Dict::Gpt64)),
            "{}",
            mb(Dict::Gpt64)
        );
        assert_eq!(Dict::Gpt1g.sizes().len(), 580);
        assert!(
            (1000.0..1100.0).contains(&mb(Dict::Gpt1g)),
            "{}",
            mb(Dict::Gpt1g)
        );
        assert_eq!(Dict::Small.sizes(), vec![4096; 1000]);
        for d in [Dict::Gpt64, Dict::Gpt1g, Dict::Small] {
            assert_eq!(Dict::parse(d.name()), Ok(d));
        }
        assert!(Dict::parse("gpt").unwrap_err().contains("gpt-64MiB"));
    }

    #[test]
    fn medians_skip_nothing_they_are_given() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
