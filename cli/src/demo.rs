//! `shardport demo`: the main job on a config (the embedded default unless
//! told otherwise). It starts a real owner process and a real consumer
//! process (`shardport worker`), puts shards of several sizes in the owner,
//! passes each handle to the consumer, fetches it as a zero-copy view and as
//! a copy, verifies every byte, removes the shards and checks the owner's
//! storage came back.

use std::{ffi::OsString, fmt, path::PathBuf};

use crate::worker::{Reply, Request, WorkerError, WorkerProcess};

/// Shard sizes the demo puts, smallest first.
pub const DEMO_SIZES: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20];

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The `shardport` executable to start workers from.
    pub exe: PathBuf,
    /// Arguments selecting the config for the workers (`--config FILE`, or none).
    pub config_args: Vec<OsString>,
    /// Largest shard size to put.
    pub max_size: u64,
}

/// One line of the demo table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DemoRow {
    /// Shard size in bytes.
    pub size: u64,
    /// `put`, `view` or `copy`.
    pub op: String,
    /// Transport that served it (storage policy for `put`).
    pub transport: String,
    /// Why.
    pub reason: String,
    /// Duration in ns (put: owner side; fetch: consumer side, handle -> bytes).
    pub ns: u64,
    /// Bytes verified against the owner's pattern (fetch rows).
    pub verified: Option<bool>,
    /// Downgraded.
    pub downgraded: bool,
}

/// What the demo did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoReport {
    /// Owner pid.
    pub owner_pid: u32,
    /// Consumer pid.
    pub consumer_pid: u32,
    /// Table rows.
    pub rows: Vec<DemoRow>,
    /// Owner's plugin gauges after every shard was removed (e.g. pool bytes in use).
    pub owner_after_remove: serde_json::Value,
}

impl DemoReport {
    /// True when every fetch verified and nothing was downgraded.
    pub fn all_verified(&self) -> bool {
        self.rows
            .iter()
            .filter(|r| r.op != "put")
            .all(|r| r.verified == Some(true) && !r.downgraded)
    }

    /// Bytes the owner's transports still report in use after every shard
    /// was removed (`pool_bytes_used` gauges); 0 when storage came back.
    pub fn bytes_still_used(&self) -> u64 {
        self.owner_after_remove
            .as_array()
            .map(|plugins| {
                plugins
                    .iter()
                    .filter_map(|p| p["stats"]["pool_bytes_used"].as_u64())
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// Demo failure.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A worker failed.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The owner no longer had shards the demo put.
    #[error("the owner lost shards it was never asked to remove: {0:?}")]
    Lost(Vec<String>),
    /// A reply lacked a field.
    #[error("the {0} process sent an incomplete reply")]
    Incomplete(&'static str),
}

/// Runs the demo.
pub fn run_demo(opts: &DemoOptions) -> Result<DemoReport, DemoError> {
    let mut owner = WorkerProcess::spawn("owner", &opts.exe, &opts.config_args)?;
    let mut consumer = WorkerProcess::spawn("consumer", &opts.exe, &opts.config_args)?;
    let mut rows = Vec::new();
    let mut ids = Vec::new();
    for (i, &size) in DEMO_SIZES
        .iter()
        .filter(|&&s| s <= opts.max_size)
        .enumerate()
    {
        let seed = 0x5eed_0000 + i as u64;
        let put = owner.call(&Request::Put {
            len: size,
            seed,
            dtype: Some("bf16".to_owned()),
            tags: Default::default(),
        })?;
        let handle = put.handle.clone().ok_or(DemoError::Incomplete("owner"))?;
        ids.push(put.id.clone().ok_or(DemoError::Incomplete("owner"))?);
        rows.push(DemoRow {
            size,
            op: "put".to_owned(),
            transport: "owner".to_owned(),
            reason: "pattern generated once, straight into storage (timed), then exported"
                .to_owned(),
            ns: put.ns.unwrap_or(0),
            verified: None,
            downgraded: false,
        });
        for mode in [
            shardport_host::FetchMode::View,
            shardport_host::FetchMode::Copy,
        ] {
            let r = consumer.call(&Request::Fetch {
                handle: handle.clone(),
                mode: Some(mode),
                seed: Some(seed),
                hold: false,
                only: None,
            })?;
            rows.push(row(size, &mode.to_string(), &r)?);
        }
    }
    let missing = owner
        .call(&Request::Remove { ids })?
        .missing
        .unwrap_or_default();
    if !missing.is_empty() {
        return Err(DemoError::Lost(missing));
    }
    let stats = owner.call(&Request::Stats)?.stats.unwrap_or_default();
    let owner_after_remove = stats
        .get("plugins")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let report = DemoReport {
        owner_pid: owner.pid(),
        consumer_pid: consumer.pid(),
        rows,
        owner_after_remove,
    };
    consumer.exit()?;
    owner.exit()?;
    Ok(report)
}

fn row(size: u64, op: &str, r: &Reply) -> Result<DemoRow, DemoError> {
    Ok(DemoRow {
        size,
        op: op.to_owned(),
        transport: r
            .transport
            .clone()
            .ok_or(DemoError::Incomplete("consumer"))?,
        reason: r.reason.clone().unwrap_or_default(),
        ns: r.ns.unwrap_or(0),
        verified: r.verified,
        downgraded: r.downgraded.unwrap_or(false),
    })
}

/// Human size (`256 MiB`).
pub fn size_label(n: u64) -> String {
    shardport_abi::format_byte_size(n)
}

/// Human duration from ns.
pub fn time_label(ns: u64) -> String {
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "owner pid {}, consumer pid {} (separate processes; shards move through POSIX shared memory)\n",
            self.owner_pid, self.consumer_pid
        )?;
        writeln!(
            f,
            "{:>9}  {:<5} {:<10} {:>10} {:>10}  {:<6} reason",
            "size", "op", "transport", "time", "GB/s", "bytes"
        )?;
        for r in &self.rows {
            let gbps = if r.ns > 0 {
                format!("{:.2}", r.size as f64 / r.ns as f64)
            } else {
                "-".to_owned()
            };
            let gbps = if r.op == "view" {
                "zero-copy".to_owned()
            } else {
                gbps
            };
            let check = match r.verified {
                Some(true) => "ok",
                Some(false) => "BAD",
                None => "",
            };
            let reason = if r.downgraded {
                format!("DOWNGRADED: {}", r.reason)
            } else {
                r.reason.clone()
            };
            writeln!(
                f,
                "{:>9}  {:<5} {:<10} {:>10} {:>10}  {:<6} {}",
                size_label(r.size),
                r.op,
                r.transport,
                time_label(r.ns),
                gbps,
                check,
                reason
            )?;
        }
        Ok(())
    }
}
