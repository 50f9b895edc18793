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
    time::Instant,
};

use serde::{Deserialize, Serialize};

pub mod load;
use shardport_abi::{DType, ShardId};

use shardport_host::{
    config::FetchMode,
    handle::Handle,
    node::{Node, ShardBytes, TensorSpec},
};

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
    /// Put and remove shards in a loop for `duration_ms` (`shardport bench
    /// load`'s owner churn); replies with how many it put in `count`.
    Churn {
        /// How long, milliseconds.
        duration_ms: u64,
        /// At most this many a second (0: as fast as it can).
        #[serde(default)]
        per_s: u64,
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
    /// Reload the node's config through `Node::reload_file` (the path a
    /// running node's control endpoint and SIGHUP take): `config_path`, or
    /// the file the running config came from. A refusal is an error reply
    /// with `error_kind` `reload_refused`; the running config stays.
    Reload {
        /// Config file to apply (default: the one the node started from).
        #[serde(default)]
        config_path: Option<String>,
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
    /// Churn: shards put.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
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

/// Fills `buf` with the deterministic pattern for `seed`.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&splitmix(seed ^ (i as u64).wrapping_mul(0x9e37_79b9)).to_le_bytes());
    }
    let rem = chunks.into_remainder();
    let tail = splitmix(!seed).to_le_bytes();
    rem.copy_from_slice(&tail[..rem.len()]);
}

/// True when `buf` holds exactly the pattern for `seed`.
pub fn check_pattern(buf: &[u8], seed: u64) -> bool {
    let mut chunks = buf.chunks_exact(8);
    for (i, c) in (&mut chunks).enumerate() {
        if c != splitmix(seed ^ (i as u64).wrapping_mul(0x9e37_79b9)).to_le_bytes() {
            return false;
        }
    }
    let rem = chunks.remainder();
    rem == &splitmix(!seed).to_le_bytes()[..rem.len()]
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A shard id from its 32 hex digits (the control endpoint's own parser).
pub use shardport_control::parse_id;

/// What a worker keeps between requests.
#[derive(Default)]
struct State {
    /// Fetch results kept until `release`.
    held: HashMap<ShardId, Arc<ShardBytes>>,
    /// `put_buffer`'s source: `(seed, bytes)`.
    source: Option<(u64, Vec<u8>)>,
    /// `fetch_buffer`'s destination.
    scratch: Vec<u8>,
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

fn handle(node: &Node, req: Request, state: &mut State) -> Reply {
    let held = &mut state.held;
    match req {
        Request::PutBuffer { len, seed, tags } => {
            let Ok(n) = usize::try_from(len) else {
                return Reply::err(format!("{len} bytes do not fit in memory here"));
            };
            let source = match &mut state.source {
                Some((s, buf)) if *s == seed && buf.len() == n => buf,
                slot => {
                    let mut buf = Vec::new();
                    if buf.try_reserve_exact(n).is_err() {
                        return Reply::err(format!("cannot allocate a {len}-byte source buffer"));
                    }
                    buf.resize(n, 0);
                    fill_pattern(&mut buf, seed);
                    &mut slot.insert((seed, buf)).1
                }
            };
            let start = Instant::now();
            match node.put(source, &TensorSpec::bytes(len), tags) {
                Ok(h) => Reply {
                    ns: Some(start.elapsed().as_nanos() as u64),
                    handle: Some(hex::encode(h.to_bytes())),
                    id: Some(h.id.to_string()),
                    ..Reply::ok()
                },
                Err(e) => Reply::err(e),
            }
        }
        Request::FetchBuffer { handle, only, seed } => {
            let h = match decode_handle(&handle, only.as_deref()) {
                Ok(h) => h,
                Err(e) => return Reply::err(e),
            };
            let Ok(n) = usize::try_from(h.meta.byte_len) else {
                return Reply::err("the shard does not fit in memory here");
            };
            if state.scratch.len() != n {
                state.scratch = Vec::new();
                if state.scratch.try_reserve_exact(n).is_err() {
                    return Reply::err(format!("cannot allocate a {n}-byte buffer"));
                }
                state.scratch.resize(n, 0);
            }
            let start = Instant::now();
            match node.fetch_into(&h, &mut state.scratch) {
                Ok(sel) => {
                    let ns = start.elapsed().as_nanos() as u64;
                    Reply {
                        id: Some(h.id.to_string()),
                        ns: Some(ns),
                        transport: Some(sel.transport),
                        reason: Some(sel.reason),
                        downgraded: Some(sel.downgraded),
                        mode: Some(sel.mode),
                        verified: seed.map(|s| check_pattern(&state.scratch, s)),
                        ..Reply::ok()
                    }
                }
                Err(e) => Reply::host_err(&e),
            }
        }
        Request::Load(spec) => match load::run_loop(node, &spec) {
            Ok(r) => Reply {
                load: Some(r),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::Churn { duration_ms, per_s } => match load::run_churn(node, duration_ms, per_s) {
            Ok(n) => Reply {
                count: Some(n),
                ..Reply::ok()
            },
            Err(e) => Reply::err(e),
        },
        Request::FetchMany { handles, seeds } => {
            let hs: Result<Vec<Handle>, String> = handles
                .iter()
                .map(|h| decode_handle(h, None).map_err(|e| e.to_string()))
                .collect();
            let hs = match hs {
                Ok(h) => h,
                Err(e) => return Reply::err(e),
            };
            if seeds.as_ref().is_some_and(|s| s.len() != hs.len()) {
                return Reply::err("`seeds` must have one seed per handle");
            }
            let start = Instant::now();
            let results = match node.fetch_many(&hs, FetchMode::Copy) {
                Ok(r) => r,
                Err(e) => return Reply::err(e),
            };
            let ns = start.elapsed().as_nanos() as u64;
            let mut verified = true;
            let mut transports = Vec::new();
            for (i, r) in results.into_iter().enumerate() {
                match r {
                    Ok(f) => {
                        if let Some(s) = &seeds {
                            verified &= check_pattern(&f.data, s[i]);
                        }
                        transports.push(f.selection.transport);
                    }
                    Err(e) => return Reply::err(format!("shard {i}: {e}")),
                }
            }
            transports.dedup();
            Reply {
                ns: Some(ns),
                transport: Some(transports.join(",")),
                verified: seeds.as_ref().map(|_| verified),
                ..Reply::ok()
            }
        }
        Request::Put {
            len,
            seed,
            dtype,
            tags,
        } => {
            let dtype = match dtype.as_deref().map(DType::from_name) {
                None => DType::U8,
                Some(Some(d)) => d,
                Some(None) => {
                    return Reply::err(format!("unknown dtype `{}`", dtype.unwrap_or_default()))
                }
            };
            let width = u64::from(dtype.bits().unwrap_or(8).div_ceil(8));
            if len % width != 0 {
                return Reply::err(format!(
                    "{len} bytes is not a whole number of {dtype} elements"
                ));
            }
            let spec = TensorSpec {
                dtype,
                shape: vec![len / width],
                device: shardport_abi::Device::CPU,
            };
            let start = Instant::now();
            match node.put_with(&spec, tags, |dst| fill_pattern(dst, seed)) {
                Ok(h) => Reply {
                    handle: Some(hex::encode(h.to_bytes())),
                    id: Some(h.id.to_string()),
                    ns: Some(start.elapsed().as_nanos() as u64),
                    ..Reply::ok()
                },
                Err(e) => Reply::host_err(&e),
            }
        }
        Request::Fetch {
            handle,
            mode,
            seed,
            hold,
            only,
        } => {
            let h = match decode_handle(&handle, only.as_deref()) {
                Ok(h) => h,
                Err(e) => return Reply::err(e),
            };
            let mode = mode.unwrap_or(node.config().fetch.mode);
            match node.fetch_mode(&h, mode) {
                Ok(f) => {
                    let ns = f.elapsed.as_nanos() as u64;
                    let verified = seed.map(|s| check_pattern(&f.data, s));
                    if hold {
                        held.insert(f.id, Arc::clone(&f.data));
                    }
                    Reply {
                        id: Some(f.id.to_string()),
                        ns: Some(ns),
                        transport: Some(f.selection.transport),
                        reason: Some(f.selection.reason),
                        downgraded: Some(f.selection.downgraded),
                        mode: Some(f.selection.mode),
                        verified,
                        ..Reply::ok()
                    }
                }
                Err(e) => Reply::host_err(&e),
            }
        }
        Request::Check { id, seed } => match parse_id(&id) {
            Ok(id) => match held.get(&id) {
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
                    Ok(id) if held.remove(&id).is_some() => {}
                    _ => missing.push(s),
                }
            }
            Reply {
                missing: Some(missing),
                ..Reply::ok()
            }
        }
        Request::Remove { ids } => {
            let mut parsed = Vec::new();
            for s in &ids {
                match parse_id(s) {
                    Ok(id) => parsed.push(id),
                    Err(e) => return Reply::err(e),
                }
            }
            let missing = node
                .remove(&parsed)
                .iter()
                .map(ToString::to_string)
                .collect();
            Reply {
                missing: Some(missing),
                ..Reply::ok()
            }
        }
        Request::Drain { ids } => {
            if ids.is_empty() {
                return Reply {
                    drained: Some(node.drain_all()),
                    ..Reply::ok()
                };
            }
            match ids
                .iter()
                .map(|s| parse_id(s))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(ids) => Reply {
                    drained: Some(node.drain(&ids)),
                    ..Reply::ok()
                },
                Err(e) => Reply::err(e),
            }
        }
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

    #[test]
    fn ids_parse() {
        let id = ShardId::from_u128(0xabc);
        assert_eq!(parse_id(&id.to_string()), Ok(id));
        assert!(parse_id("xyz").is_err());
    }
}

/// A `shardport worker` child process and its pipes.
#[derive(Debug)]
pub struct WorkerProcess {
    role: String,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: io::BufReader<std::process::ChildStdout>,
}

/// Errors talking to a worker process.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The process could not be started.
    #[error("cannot start the {role} process ({exe}): {source}")]
    Spawn {
        /// Role in messages (`owner`, `consumer`).
        role: String,
        /// Executable.
        exe: String,
        /// OS error.
        source: io::Error,
    },
    /// The process closed its pipes or exited.
    #[error("the {role} process exited before answering ({status}); its error is above")]
    Exited {
        /// Role.
        role: String,
        /// Exit status text.
        status: String,
    },
    /// Pipe I/O failed.
    #[error("talking to the {role} process: {source}")]
    Io {
        /// Role.
        role: String,
        /// OS error.
        source: io::Error,
    },
    /// The reply was not valid JSON.
    #[error("the {role} process sent an invalid reply `{line}`: {source}")]
    BadReply {
        /// Role.
        role: String,
        /// The line.
        line: String,
        /// Parse error.
        source: serde_json::Error,
    },
    /// The worker answered with an error.
    #[error("{role}: {message}")]
    Failed {
        /// Role.
        role: String,
        /// The worker's error text.
        message: String,
    },
}

impl WorkerProcess {
    /// Starts `exe worker <args>` with piped stdin/stdout (stderr inherited).
    pub fn spawn(
        role: &str,
        exe: &std::path::Path,
        args: &[std::ffi::OsString],
    ) -> Result<WorkerProcess, WorkerError> {
        Self::spawn_with_env(role, exe, args, &[])
    }

    /// [`spawn`](Self::spawn) with these environment variables set in the child.
    pub fn spawn_with_env(
        role: &str,
        exe: &std::path::Path,
        args: &[std::ffi::OsString],
        env: &[(String, String)],
    ) -> Result<WorkerProcess, WorkerError> {
        let mut command = std::process::Command::new(exe);
        command
            .arg("worker")
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)));
        Self::spawn_command(role, command)
    }

    /// Starts `command` (which runs `shardport worker ...`, possibly through
    /// a wrapper such as `ip netns exec`) with piped stdin/stdout.
    pub fn spawn_command(
        role: &str,
        mut command: std::process::Command,
    ) -> Result<WorkerProcess, WorkerError> {
        let shown = command.get_program().to_string_lossy().into_owned();
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|source| WorkerError::Spawn {
                role: role.to_owned(),
                exe: shown,
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = io::BufReader::new(child.stdout.take().expect("stdout is piped"));
        Ok(WorkerProcess {
            role: role.to_owned(),
            child,
            stdin,
            stdout,
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User + system CPU seconds the child has used so far (fields 14 and
    /// 15 of `/proc/<pid>/stat`); 0 where the file cannot be read or parsed.
    pub fn cpu_seconds(&self) -> f64 {
        let read = || -> Option<f64> {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
            // The command name may hold spaces and parentheses: fields are
            // counted after its closing one.
            let rest = &stat[stat.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / rustix::param::clock_ticks_per_second() as f64)
        };
        read().unwrap_or(0.0)
    }

    /// Sends one request and reads its reply; a reply with `ok: false` is an error.
    pub fn call(&mut self, req: &Request) -> Result<Reply, WorkerError> {
        let reply = self.call_raw(req)?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(WorkerError::Failed {
                role: self.role.clone(),
                message: reply.error.unwrap_or_default(),
            })
        }
    }

    /// Sends one request and returns the reply whatever its `ok`.
    pub fn call_raw(&mut self, req: &Request) -> Result<Reply, WorkerError> {
        let io_err = |role: &str, source| WorkerError::Io {
            role: role.to_owned(),
            source,
        };
        let mut line = serde_json::to_string(req).expect("requests serialize");
        line.push('\n');
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(line.as_bytes())
                .and_then(|()| stdin.flush()),
            None => Err(io::Error::from(io::ErrorKind::BrokenPipe)),
        };
        if let Err(e) = sent {
            return Err(if e.kind() == io::ErrorKind::BrokenPipe {
                self.exited()
            } else {
                io_err(&self.role, e)
            });
        }
        let mut answer = String::new();
        let n = self
            .stdout
            .read_line(&mut answer)
            .map_err(|e| io_err(&self.role, e))?;
        if n == 0 {
            return Err(self.exited());
        }
        serde_json::from_str(&answer).map_err(|source| WorkerError::BadReply {
            role: self.role.clone(),
            line: answer.trim_end().to_owned(),
            source,
        })
    }

    fn exited(&mut self) -> WorkerError {
        let status = match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("status unknown: {e}"),
        };
        WorkerError::Exited {
            role: self.role.clone(),
            status,
        }
    }

    /// Asks the worker to exit and waits for it.
    pub fn exit(mut self) -> Result<std::process::ExitStatus, WorkerError> {
        let _ = self.call_raw(&Request::Exit);
        self.stdin.take();
        self.child.wait().map_err(|source| WorkerError::Io {
            role: self.role.clone(),
            source,
        })
    }

    /// Kills the worker with SIGKILL (tests of peer death).
    pub fn kill(mut self) -> io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // Closing stdin ends `serve`; a worker that is still alive after that
        // is reaped so no zombie outlives us.
        self.stdin.take();
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.wait();
        }
    }
}
