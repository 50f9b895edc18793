//! `shardport serve --fetch FILE`: a long-lived consumer. The node fetches
//! every handle listed in the file, pass after pass, until it stops, so its
//! control endpoint's metrics (per transport, per experiment arm) and its
//! guardrails see a running consumer's traffic: what an A/B experiment
//! report is read from.
//!
//! The file holds one handle per line (hex of the binary form, or JSON);
//! blank lines and lines starting with `#` are skipped. It is read again
//! whenever its length or modification time changes, so handles can be
//! added while the node runs; a line that does not parse is reported once
//! (file:line) and skipped. Every fetch is checked as the node's config
//! says (`fetch.verify-checksum` against the owner's checksum); failures
//! are counted in the node's metrics, and a summary line is logged at
//! `info` every [`SUMMARY_EVERY`].

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use shardport_host::{Handle, Node};

/// How often the loop logs what it did.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// The longest single sleep, so a stop is seen promptly.
const STOP_TICK: Duration = Duration::from_millis(100);

/// The handles of one read of the file, and what identifies that read.
struct Listed {
    /// Read at least once (a file missing from the start is reported).
    read: bool,
    stamp: Option<(u64, SystemTime)>,
    handles: Vec<Handle>,
}

/// Reads `path` when it changed since `last`; `None` when it did not.
/// Unparsable lines are logged (once per change of the file) and skipped.
fn reread(path: &Path, last: &Listed) -> Option<Listed> {
    let stamp = std::fs::metadata(path)
        .ok()
        .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
    if last.read && stamp == last.stamp {
        return None;
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(target: "fetch_loop", file = %path.display(), error = %e, "cannot read the handle file; fetching nothing until it can be read");
            return Some(Listed {
                read: true,
                stamp,
                handles: Vec::new(),
            });
        }
    };
    let mut handles = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match super::super::fetch::parse_handle(line) {
            Ok(h) => handles.push(h),
            Err(e) => {
                tracing::warn!(target: "fetch_loop", "{}:{}: not a handle, skipped: {e}", path.display(), i + 1);
            }
        }
    }
    tracing::info!(target: "fetch_loop", file = %path.display(), handles = handles.len(), "handle file read");
    Some(Listed {
        read: true,
        stamp,
        handles,
    })
}

/// Counts of one summary period.
#[derive(Default)]
struct Period {
    fetches: u64,
    failures: u64,
    bytes: u64,
    last_error: Option<String>,
}

/// The running loop: [`FetchLoop::stop`] ends it.
pub struct FetchLoop {
    flag: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl FetchLoop {
    /// Ends the loop and waits for its fetch in flight (bounded by the
    /// transports' own timeouts), so a shutdown finds the node released.
    pub fn stop(self) {
        self.flag.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Starts the loop on its own thread; it ends when stopped or when the
/// node is gone.
pub fn spawn(node: &Node, file: PathBuf, every: Duration) -> std::io::Result<FetchLoop> {
    let stop = Arc::new(AtomicBool::new(false));
    let (weak, flag) = (node.downgrade(), Arc::clone(&stop));
    let thread = std::thread::Builder::new()
        .name("shardport-fetch-loop".into())
        .spawn(move || {
            let mut listed = Listed {
                read: false,
                stamp: None,
                handles: Vec::new(),
            };
            let mut period = Period::default();
            let mut since = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                if let Some(next) = reread(&file, &listed) {
                    listed = next;
                }
                let Some(node) = weak.upgrade() else { break };
                let mode = node.config().fetch.mode;
                for h in &listed.handles {
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    match node.fetch_mode(h, mode) {
                        Ok(f) => {
                            period.fetches += 1;
                            period.bytes += f.data.len() as u64;
                        }
                        Err(e) => {
                            period.failures += 1;
                            tracing::debug!(target: "fetch_loop", shard = %h.id, error = %e, "fetch failed");
                            period.last_error = Some(format!("{}: {e}", h.id));
                        }
                    }
                }
                drop(node);
                if since.elapsed() >= SUMMARY_EVERY {
                    let p = std::mem::take(&mut period);
                    tracing::info!(
                        target: "fetch_loop",
                        fetches = p.fetches,
                        failures = p.failures,
                        bytes = p.bytes,
                        last_error = p.last_error.as_deref().unwrap_or("none"),
                        "fetch loop over the last {}",
                        shardport_kit::format_duration(since.elapsed())
                    );
                    since = Instant::now();
                }
                // An empty list still waits, so a missing file is no spin.
                let pause = if listed.handles.is_empty() {
                    every.max(STOP_TICK)
                } else {
                    every
                };
                let end = Instant::now() + pause;
                while !flag.load(Ordering::Relaxed) {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::sleep(left.min(STOP_TICK));
                }
            }
        })?;
    Ok(FetchLoop { flag: stop, thread })
}
