//! `shardport worker`: a node driven by JSON lines on stdin, answering JSON
//! lines on stdout. The demo, the benchmark and the end-to-end tests start
//! real owner and consumer processes this way and pass handles between them
//! (in their binary form, hex-encoded), exactly as an application would pass
//! them through its own RPC.
//!
//! Requests (`op`): `put {len, seed, dtype?, tags?}`, `fetch {handle, mode?,
//! seed?, hold?}`, `put_buffer {len, seed}`, `fetch_buffer {handle, only?,
//! seed?}`, `fetch_many {handles, seeds?}`, `check {id, seed}`, `release
//! {ids}`, `remove {ids}`, `drain {ids}`, `sweep`, `reload {config_path?}`,
//! `load {..}` and `churn {..}` (the load loop, [`load`]), `stats`,
//! `metrics`, `exit`. Every reply has `ok`; failures carry `error` (and
//! `error_kind`).

use std::{
    collections::{BTreeMap, HashMap},
    io::{self, BufRead, Write},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use shardport_abi::ShardId;
use shardport_host::{
    handle::Handle,
    node::Node,
    vocab::{FetchMode, ShardBytes},
};

pub mod load;
mod ops;
mod process;
mod tcp_limit;
pub mod weights;
pub use process::{WorkerError, WorkerProcess};

/// Largest request line accepted (a handle is < 5 KiB in binary form).
pub const MAX_REQUEST_LINE: usize = 1 << 20;

/// A worker request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Put `len` bytes of the pattern for `seed`.
    Put {
        /// Byte length.
        len: u64,
        /// Pattern seed.
        seed: u64,
        /// Element type (default `u8`); `len` must be a multiple of its size.
        #[serde(default)]
        dtype: Option<String>,
        /// Routing tags.
        #[serde(default)]
        tags: BTreeMap<String, String>,
    },
    /// Fetch a handle; verify the pattern for `seed` when given; keep the
    /// result (and its lease) until `release` when `hold`.
    Fetch {
        /// Hex of the handle's binary form.
        handle: String,
        /// `view` or `copy` (default: the config's).
        #[serde(default)]
        mode: Option<FetchMode>,
        /// Pattern seed to verify against.
        #[serde(default)]
        seed: Option<u64>,
        /// Keep the fetched shard until `release`.
        #[serde(default)]
        hold: bool,
        /// Use only this transport's export (drops the handle's others).
        #[serde(default)]
        only: Option<String>,
    },
    /// Put `len` bytes copied from a buffer this worker keeps (filled with
    /// the pattern for `seed` once, untimed, and reused while `len` and
    /// `seed` stay the same): times a put the way an application whose
    /// bytes are ready sees it (`shardport bench`).
    PutBuffer {
        /// Byte length.
        len: u64,
        /// Pattern seed.
        seed: u64,
        /// Routing tags.
        #[serde(default)]
        tags: BTreeMap<String, String>,
    },
    /// Fetch a copy into a buffer this worker reuses (`Node::fetch_into`;
    /// warm after the first fetch of that size); verify the pattern for
    /// `seed` after timing when given (`shardport bench`).
    FetchBuffer {
        /// Hex of the handle's binary form.
        handle: String,
        /// Use only this transport's export (drops the handle's others).
        #[serde(default)]
        only: Option<String>,
        /// Pattern seed to verify against.
        #[serde(default)]
        seed: Option<u64>,
    },
    /// Put `len` bytes of device memory this worker keeps on `cuda:0`
    /// (filled with the pattern for `seed` once, untimed, and reused while
    /// `len` and `seed` stay the same) with `Node::put_device`: times the
    /// export (`shardport bench`'s GPU cells).
    PutDevice {
        /// Byte length.
        len: u64,
        /// Pattern seed.
        seed: u64,
    },
    /// Fetch a GPU shard: a device view (`Node::fetch_device`), or with
    /// `into` a copy into device memory this worker reuses
    /// (`Node::fetch_device_into`); timed, then, when `seed` is given, the
    /// bytes are read back to the host and checked against its pattern.
    FetchDevice {
        /// Hex of the handle's binary form.
        handle: String,
        /// Copy into this worker's device memory instead of viewing.
        #[serde(default)]
        into: bool,
        /// Use only this transport's export (drops the handle's others).
        #[serde(default)]
        only: Option<String>,
        /// Pattern seed to verify against.
        #[serde(default)]
        seed: Option<u64>,
    },
    /// Fetch copies of several shards at once (`Node::fetch_many`, owners
    /// in parallel); verify each against the pattern for its seed when
    /// `seeds` is given (one per handle).
    FetchMany {
        /// Hex of each handle's binary form.
        handles: Vec<String>,
        /// Pattern seed of each handle.
        #[serde(default)]
        seeds: Option<Vec<u64>>,
    },
    /// Fetch in a loop for a while (`shardport bench load`).
    Load(load::LoopSpec),
    /// Copy the shards' bytes in a loop for a while, without fetching: a
    /// load point's copy limit (`load::run_copy_limit`).
    CopyLimit {
        /// The shards and the loop's duration and seed (its shares unused).
        spec: load::LoopSpec,
        /// Large copies in pieces on several threads, as `kit::copy` does,
        /// rather than one `memcpy`.
        split: bool,
    },
    /// Serve raw TCP on loopback for a load point's TCP limit
    /// (`tcp_limit::serve`); replies at once with the port in `port`.
    TcpServe {
        /// Connections to accept (one per consumer).
        connections: usize,
        /// The consumers' loop, milliseconds.
        duration_ms: u64,
        /// When their loop starts, nanoseconds since the Unix epoch.
        #[serde(default)]
        start_unix_ns: u64,
    },
    /// Ask the raw TCP server on `port` for the shards' sizes in a loop for
    /// a while (`tcp_limit::run`): a load point's TCP limit.
    TcpLimit {
        /// The owner's `tcp_serve` port on loopback.
        port: u16,
        /// The shards (their sizes) and the loop's duration and seed.
        spec: load::LoopSpec,
    },
    /// Put and remove shards in a loop for `duration_ms` (`shardport bench
    /// load`'s owner churn); replies in `load` with the puts that
    /// succeeded (`fetches`) and the failed ones by kind.
    Churn {
        /// How long, milliseconds.
        duration_ms: u64,
        /// At most this many a second (0: as fast as it can).
        #[serde(default)]
        per_s: u64,
        /// When to start, nanoseconds since the Unix epoch (0: at once).
        #[serde(default)]
        start_unix_ns: u64,
    },
    /// Verify a held fetch result against the pattern for `seed`.
    Check {
        /// Shard id (hex).
        id: String,
        /// Pattern seed.
        seed: u64,
    },
    /// Drop held fetch results.
    Release {
        /// Shard ids (hex).
        ids: Vec<String>,
    },
    /// Remove owned shards.
    Remove {
        /// Shard ids (hex).
        ids: Vec<String>,
    },
    /// Drop cached fetched shards (`ids`, or all when empty).
    Drain {
        /// Shard ids (hex); empty drains everything.
        #[serde(default)]
        ids: Vec<String>,
    },
    /// Run every transport's sweep now.
    Sweep,
    /// Size (allocate and write once) the buffer `fetch_buffer` fetches
    /// into, untimed: a bench's destination ready before its clock starts.
    Scratch {
        /// Bytes.
        len: u64,
    },
    /// Reload the node's config through `Node::reload_file` (the path a
    /// running node's control endpoint and SIGHUP take): `config_path`, or
    /// the file the running config came from. A refusal is an error reply
    /// with `error_kind` `reload_refused`; the running config stays.
    Reload {
        /// Config file to apply (default: the one the node started from).
        #[serde(default)]
        config_path: Option<String>,
    },
    /// Publish a synthetic state dict (`weights::publish`): tensors of
    /// `sizes` bytes, each the pattern of its own seed derived from `seed`,
    /// as `version`; replies with the manifest (hex) in `manifest`.
    Publish {
        /// Version to publish.
        version: u64,
        /// Bytes of each tensor.
        sizes: Vec<u64>,
        /// Pattern seed of the state dict.
        seed: u64,
        /// Bucket size (default: the publisher's).
        #[serde(default)]
        bucket_size: Option<u64>,
    },
    /// Take a manifest into this worker's destinations (`weights::update`);
    /// the report in `weights`.
    Update {
        /// Hex of the manifest.
        manifest: String,
        /// Check every tensor against the patterns for this seed, untimed.
        #[serde(default)]
        seed: Option<u64>,
        /// Only make the destinations for this manifest's layout (untimed).
        #[serde(default)]
        prepare: bool,
        /// Also measure a copy of the same bytes with the same threads.
        #[serde(default)]
        memcpy: bool,
        /// Hash every bucket, views of the owner's memory included.
        #[serde(default)]
        verify_always: bool,
    },
    /// Node stats.
    Stats,
    /// The node's metrics in the Prometheus text format (what a control
    /// endpoint's `/metrics` serves).
    Metrics,
    /// Exit cleanly.
    Exit,
}

/// A worker reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    /// Success.
    pub ok: bool,
    /// Error text when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Put: hex of the handle's binary form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// Put/fetch: shard id (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Put/fetch duration in ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns: Option<u64>,
    /// Fetch: transport used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// Fetch: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Fetch: downgraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downgraded: Option<bool>,
    /// Fetch: mode served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FetchMode>,
    /// Fetch: pattern verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    /// Remove/release: ids not found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<Vec<String>>,
    /// Stats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<serde_json::Value>,
    /// Metrics, Prometheus text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Load: what the loop did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<load::LoopResult>,
    /// TCP serve: the loopback port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Stats: this process's peak resident set size in bytes (VmHWM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss: Option<u64>,
    /// Stats: this process's resident set size in bytes (VmRSS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<u64>,
    /// Stats: private (anonymous) resident bytes (RssAnon): heap growth shows here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_anon: Option<u64>,
    /// Stats: resident shared-memory bytes (RssShmem): mapped pool pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_shmem: Option<u64>,
    /// Drain: entries dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<usize>,
    /// Sweep: per transport, what was reclaimed (or the error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swept: Option<serde_json::Value>,
    /// Failed fetch or reload: a short class of the error (`not_found`,
    /// `unavailable`, `reload_refused`...), for counting errors by kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// Publish: the manifest (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Update: what it did (`weights::UpdateReport`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<serde_json::Value>,
    /// Reload: what the reload changed (`ReloadReport`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reloaded: Option<serde_json::Value>,
}

/// This process's peak resident set size in bytes (`VmHWM`), if readable.
pub fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// This process's resident set size in bytes (`VmRSS`), if readable.
pub fn rss() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// A `/proc/self/status` size field (`VmRSS:`, `RssAnon:`...) in bytes.
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl Reply {
    fn ok() -> Self {
        Reply {
            ok: true,
            ..Reply::default()
        }
    }

    fn err(e: impl ToString) -> Self {
        Reply {
            ok: false,
            error: Some(e.to_string()),
            ..Reply::default()
        }
    }

    /// A failed fetch or reload, with the class of its error.
    fn host_err(e: &shardport_host::HostError) -> Self {
        Reply {
            error_kind: Some(error_kind(e)),
            ..Reply::err(e)
        }
    }
}

/// A short class of a host error: for a fetch every transport failed, the
/// transports' error kinds (`not_found`, `unavailable`...), deduplicated and
/// joined by `+`; otherwise the error's variant in snake case
/// (`reload_refused`, `checksum_mismatch`...).
pub fn error_kind(e: &shardport_host::HostError) -> String {
    if let shardport_host::HostError::FetchFailed { failures, .. } = e {
        let mut kinds: Vec<String> = failures.iter().map(|(_, f)| f.kind.to_string()).collect();
        kinds.sort();
        kinds.dedup();
        if !kinds.is_empty() {
            return kinds.join("+");
        }
    }
    let debug = format!("{e:?}");
    let variant = debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("Other");
    let mut out = String::new();
    for (i, c) in variant.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

// The bench's byte pattern lives in its own module (the GPU helpers
// need it too); kept here under its old path for callers of `worker`.
pub use crate::pattern::{check_pattern, fill_pattern};

// A shard id from its 32 hex digits: the control endpoint's own parser.
use shardport_control::parse_id;

/// What a worker keeps between requests.
#[derive(Default)]
struct State {
    /// Fetch results kept until `release`.
    held: HashMap<ShardId, Arc<ShardBytes>>,
    /// `put_buffer`'s source: `(seed, bytes)`.
    source: Option<(u64, Vec<u8>)>,
    /// `fetch_buffer`'s destination.
    scratch: Vec<u8>,
    /// `put_device`'s source: `(seed, device memory)`, and the shards put
    /// from it (removed before the memory is freed).
    device_source: Option<(u64, crate::gpu::DeviceMem)>,
    device_puts: Vec<ShardId>,
    /// `fetch_device`'s destination when it copies.
    device_scratch: Option<crate::gpu::DeviceMem>,
    /// `publish` and `update`.
    weights: weights::Weights,
}

/// Serves requests until `exit` or end of input.
pub fn serve(node: &Node, input: impl BufRead, mut output: impl Write) -> io::Result<()> {
    let mut state = State::default();
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let (reply, exit) = if line.len() > MAX_REQUEST_LINE {
            (
                Reply::err(format!(
                    "request line of {} bytes exceeds {MAX_REQUEST_LINE}",
                    line.len()
                )),
                false,
            )
        } else {
            match serde_json::from_str::<Request>(&line) {
                Err(e) => (Reply::err(format!("bad request: {e}")), false),
                Ok(Request::Exit) => (Reply::ok(), true),
                Ok(req) => (handle(node, req, &mut state), false),
            }
        };
        serde_json::to_writer(&mut output, &reply)?;
        output.write_all(b"\n")?;
        output.flush()?;
        if exit {
            break;
        }
    }
    // The device memory goes with `state`: nothing may still export it.
    if let Err(e) = ops::free_device_source(node, &mut state) {
        tracing::warn!(error = %e, "the worker's device memory is still leased; leaving it allocated");
        std::mem::forget(state.device_source.take());
    }
    Ok(())
}

/// Decodes a hex handle and keeps only `only`'s export when given.
fn decode_handle(hex_text: &str, only: Option<&str>) -> Result<Handle, String> {
    let mut h = hex::decode(hex_text)
        .map_err(|e| e.to_string())
        .and_then(|b| Handle::from_bytes(&b).map_err(|e| e.to_string()))
        .map_err(|e| format!("bad handle: {e}"))?;
    if let Some(only) = only {
        if !h.keep_only(only) {
            return Err(format!("the handle has no `{only}` export"));
        }
    }
    Ok(h)
}

/// Answers one request.
fn handle(node: &Node, req: Request, state: &mut State) -> Reply {
    match req {
        Request::PutBuffer { len, seed, tags } => ops::put_buffer(node, state, len, seed, tags),
        Request::FetchBuffer { handle, only, seed } => {
            ops::fetch_buffer(node, state, &handle, only.as_deref(), seed)
        }
        Request::Load(spec) => match load::run_loop(node, &spec) {
            Ok(r) => Reply {
                load: Some(r),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::CopyLimit { spec, split } => match load::run_copy_limit(node, &spec, split) {
            Ok(r) => Reply {
                load: Some(r),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::TcpServe {
            connections,
            duration_ms,
            start_unix_ns,
        } => match tcp_limit::serve(connections, duration_ms, start_unix_ns) {
            Ok(port) => Reply {
                port: Some(port),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::TcpLimit { port, spec } => match tcp_limit::run(port, &spec) {
            Ok(r) => Reply {
                load: Some(r),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::Churn {
            duration_ms,
            per_s,
            start_unix_ns,
        } => {
            let r = load::run_churn(node, duration_ms, per_s, start_unix_ns);
            Reply {
                load: Some(r),
                ..Reply::ok()
            }
        }
        Request::PutDevice { len, seed } => ops::put_device(node, state, len, seed),
        Request::FetchDevice {
            handle,
            into,
            only,
            seed,
        } => ops::fetch_device(node, state, &handle, into, only.as_deref(), seed),
        Request::FetchMany { handles, seeds } => ops::fetch_many(node, &handles, seeds),
        Request::Put {
            len,
            seed,
            dtype,
            tags,
        } => ops::put(node, len, seed, dtype, tags),
        Request::Fetch {
            handle,
            mode,
            seed,
            hold,
            only,
        } => ops::fetch(node, state, &handle, mode, seed, hold, only.as_deref()),
        Request::Check { id, seed } => match parse_id(&id) {
            Ok(id) => match state.held.get(&id) {
                Some(data) => Reply {
                    verified: Some(check_pattern(data, seed)),
                    ..Reply::ok()
                },
                None => Reply::err(format!("shard {id} is not held")),
            },
            Err(e) => Reply::err(e),
        },
        Request::Release { ids } => {
            let mut missing = Vec::new();
            for s in ids {
                match parse_id(&s) {
                    Ok(id) if state.held.remove(&id).is_some() => {}
                    _ => missing.push(s),
                }
            }
            Reply {
                missing: Some(missing),
                ..Reply::ok()
            }
        }
        Request::Remove { ids } => {
            let reply = ops::remove(node, &ids);
            // Removed: no longer exported from the device source.
            let gone: Vec<ShardId> = ids.iter().filter_map(|s| parse_id(s).ok()).collect();
            state.device_puts.retain(|id| !gone.contains(id));
            reply
        }
        Request::Drain { ids } => ops::drain(node, &ids),
        Request::Scratch { len } => match ops::scratch(state, len) {
            Ok(()) => Reply::ok(),
            Err(e) => Reply::err(e),
        },
        Request::Sweep => Reply {
            swept: Some(node.sweep_json()),
            ..Reply::ok()
        },
        Request::Reload { config_path } => {
            match node.reload_file(config_path.as_deref().map(std::path::Path::new)) {
                Ok(r) => Reply {
                    reloaded: serde_json::to_value(r).ok(),
                    ..Reply::ok()
                },
                Err(e) => Reply::host_err(&e),
            }
        }
        Request::Publish {
            version,
            sizes,
            seed,
            bucket_size,
        } => weights::publish(node, &mut state.weights, version, sizes, seed, bucket_size),
        Request::Update {
            manifest,
            seed,
            prepare,
            memcpy,
            verify_always,
        } => weights::update(
            node,
            &mut state.weights,
            &manifest,
            seed,
            prepare,
            memcpy,
            verify_always,
        ),
        Request::Stats => match serde_json::to_value(node.stats()) {
            Ok(v) => Reply {
                stats: Some(v),
                peak_rss: peak_rss(),
                rss: rss(),
                rss_anon: status_bytes("RssAnon:"),
                rss_shmem: status_bytes("RssShmem:"),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::Metrics => Reply {
            metrics: Some(shardport_host::metrics::prometheus(
                &node.metrics_snapshot(),
            )),
            ..Reply::ok()
        },
        Request::Exit => Reply::ok(),
    }
}

/// A counter or gauge of the `plugin` transport in a [`Request::Stats`]
/// reply's `stats` (0 if absent).
pub fn plugin_stat(stats: &serde_json::Value, plugin: &str, key: &str) -> u64 {
    stats["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == plugin)
        .and_then(|p| p["stats"][key].as_u64())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_roundtrip_and_detects_corruption() {
        for len in [0usize, 1, 7, 8, 9, 4096, 4099] {
            let mut b = vec![0u8; len];
            fill_pattern(&mut b, 42);
            assert!(check_pattern(&b, 42), "len {len}");
            if len > 0 {
                assert!(!check_pattern(&b, 43) || len < 8 && b == vec![0; len]);
                b[len / 2] ^= 1;
                assert!(!check_pattern(&b, 42), "len {len} corrupted");
            }
        }
    }
}
