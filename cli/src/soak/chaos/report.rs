//! What the chaos soak reports: per-process resource use, snapshots,
//! reload counts, the report and its table, and the flatness summary.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Resource use of one process, from `/proc/<pid>`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ProcUsage {
    /// Resident set, bytes (VmRSS).
    pub rss: u64,
    /// Private (anonymous) resident bytes (RssAnon): heap growth shows here.
    pub anon: u64,
    /// Resident shared-memory bytes (RssShmem): pool pages touched, bounded
    /// by the pools mapped, not a per-fetch cost.
    pub shmem: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
}

impl ProcUsage {
    /// Reads `/proc/<pid>/status` and counts `/proc/<pid>/fd`; `None` when
    /// the process is gone.
    pub fn of(pid: u32) -> Option<ProcUsage> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(ProcUsage {
            rss: field("VmRSS:") * 1024,
            anon: field("RssAnon:") * 1024,
            shmem: field("RssShmem:") * 1024,
            fds,
            threads: field("Threads:"),
        })
    }

    pub(super) fn add(&mut self, o: ProcUsage) {
        self.rss += o.rss;
        self.anon += o.anon;
        self.shmem += o.shmem;
        self.fds += o.fds;
        self.threads += o.threads;
    }
}

/// One resource snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosSnapshot {
    /// Seconds since the traffic started.
    pub t_s: f64,
    /// The never-killed owner and consumer, summed (the flatness reference).
    pub reference: ProcUsage,
    /// Every worker alive at that moment, summed.
    pub all: ProcUsage,
    /// The driver process itself.
    pub driver: ProcUsage,
    /// Worker processes alive.
    pub workers: usize,
    /// `/dev/shm` entries with this run's prefix.
    pub shm_entries: usize,
    /// Per worker (`owner-0`...): its usage.
    pub per_worker: BTreeMap<String, ProcUsage>,
    /// Fetches so far.
    pub fetches: u64,
}

/// Reloads over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadCounts {
    /// Reload rounds (every worker reloaded).
    pub rounds: u64,
    /// Reloads applied.
    pub applied: u64,
    /// Reloads of a valid config refused (unexpected; samples below).
    pub refused: u64,
    /// Probes with a config that must be refused (a changed `node.name`).
    pub probes: u64,
    /// Probes refused, as they must be.
    pub probes_refused: u64,
    /// Reloads cut short by a kill.
    pub interrupted: u64,
    /// Some refusal messages.
    pub samples: Vec<String>,
}

/// The chaos soak's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Seconds of traffic.
    pub duration_s: f64,
    /// The seed.
    pub seed: u64,
    /// Owner processes.
    pub owners: usize,
    /// Consumer processes.
    pub consumers: usize,
    /// This run's `segment-prefix`.
    pub segment_prefix: String,
    /// Puts done.
    pub puts: u64,
    /// Fetches that returned bytes (every one checked).
    pub fetches: u64,
    /// Bytes those fetches returned.
    pub fetched_bytes: u64,
    /// Bytes of fetches that did not match the owner's pattern (all bytes
    /// of such a fetch count): must be 0.
    pub wrong_bytes: u64,
    /// Fetches that did not match.
    pub bad_fetches: u64,
    /// Fetches by the transport that served them.
    pub served_by: BTreeMap<String, u64>,
    /// Fetches by kind (`view`, `copy`, `copy_into`).
    pub fetch_kinds: BTreeMap<String, u64>,
    /// Failed fetches by what had happened to the shard (`live`: the owner
    /// was alive and the shard not removed; `owner_killed`; `removed`), then
    /// by error kind.
    pub fetch_errors: BTreeMap<String, BTreeMap<String, u64>>,
    /// Failed puts by error kind (an owner's kill during a put is not one).
    pub put_errors: BTreeMap<String, u64>,
    /// Some error messages of failed fetches of live shards and failed puts.
    pub error_samples: Vec<String>,
    /// SIGKILLs by role.
    pub kills: BTreeMap<String, u64>,
    /// Workers restarted after a kill.
    pub restarts: u64,
    /// Requests cut short by a kill of the worker serving them.
    pub interrupted_calls: u64,
    /// Workers that exited without being killed (crashes): must be 0.
    pub unexpected_exits: u64,
    /// Reloads.
    pub reloads: ReloadCounts,
    /// Drain-and-sweep rounds during the run.
    pub sweeps: u64,
    /// What those sweeps reclaimed, summed over workers and transports.
    pub swept_during_run: BTreeMap<String, u64>,
    /// What the final sweep (a fresh process, after every worker was
    /// killed) reclaimed, summed over transports.
    pub final_sweep: BTreeMap<String, u64>,
    /// `/dev/shm` entries with this run's prefix just before the final sweep.
    pub segments_before_final_sweep: usize,
    /// This run's `/dev/shm` entries left after the final sweep: must be 0.
    pub leaked_segments: usize,
    /// Their names.
    pub leaked_names: Vec<String>,
    /// Reference RSS (never-killed owner + consumer), bytes, at the start.
    pub rss_start: u64,
    /// ... at the mark (the 5-minute snapshot in a long run).
    pub rss_mark: u64,
    /// ... at the end.
    pub rss_end: u64,
    /// Reference private memory, bytes, at the start, the mark and the end.
    pub anon_start: u64,
    /// See `anon_start`.
    pub anon_mark: u64,
    /// See `anon_start`.
    pub anon_end: u64,
    /// Reference open fds at the start.
    pub fds_start: u64,
    /// ... at the mark.
    pub fds_mark: u64,
    /// ... at the end.
    pub fds_end: u64,
    /// Reference threads at the start, the mark and the end.
    pub threads_start: u64,
    /// See `threads_start`.
    pub threads_mark: u64,
    /// See `threads_start`.
    pub threads_end: u64,
    /// When the mark snapshot was taken, seconds.
    pub mark_s: f64,
    /// RSS and fds at the end within 10% of the mark.
    pub flat: bool,
    /// Every snapshot.
    pub snapshots: Vec<ChaosSnapshot>,
}

impl ChaosReport {
    /// What makes the run fail, in words (empty: it passed).
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.wrong_bytes > 0 {
            out.push(format!(
                "{} wrong bytes in {} fetches",
                self.wrong_bytes, self.bad_fetches
            ));
        }
        if self.leaked_segments > 0 {
            out.push(format!(
                "{} segments leaked after the final sweep: {}",
                self.leaked_segments,
                self.leaked_names.join(", ")
            ));
        }
        if self.unexpected_exits > 0 {
            out.push(format!(
                "{} workers exited without being killed",
                self.unexpected_exits
            ));
        }
        if self.reloads.probes_refused < self.reloads.probes {
            out.push(format!(
                "{} reloads that must be refused were applied",
                self.reloads.probes - self.reloads.probes_refused
            ));
        }
        out
    }

    /// SVG plot of the reference RSS and fds (and all workers') over time.
    pub fn svg(&self) -> String {
        crate::soak::plot::svg(self)
    }
}

pub(super) fn within_10pct(mark: u64, end: u64) -> bool {
    (end as f64) <= (mark as f64) * 1.1 && (end as f64) >= (mark as f64) * 0.9
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "chaos soak: {:.0} s, {} owners, {} consumers, seed {}, segment prefix {}",
            self.duration_s, self.owners, self.consumers, self.seed, self.segment_prefix
        )?;
        writeln!(
            f,
            "{:>8} {:>9} {:>26} {:>17} {:>17} {:>8} {:>8}",
            "t (s)",
            "workers",
            "ref RSS (anon/shm) MiB",
            "ref fds/threads",
            "all RSS MiB/fds",
            "shm",
            "fetches"
        )?;
        for s in &self.snapshots {
            writeln!(
                f,
                "{:>8.0} {:>9} {:>26} {:>17} {:>17} {:>8} {:>8}",
                s.t_s,
                s.workers,
                format!(
                    "{:.1} ({:.1}/{:.1})",
                    mib(s.reference.rss),
                    mib(s.reference.anon),
                    mib(s.reference.shmem)
                ),
                format!("{}/{}", s.reference.fds, s.reference.threads),
                format!("{:.1}/{}", mib(s.all.rss), s.all.fds),
                s.shm_entries,
                s.fetches
            )?;
        }
        writeln!(
            f,
            "fetches {} ({:.1} MiB), wrong bytes {}, puts {}; served by {:?}; kinds {:?}",
            self.fetches,
            mib(self.fetched_bytes),
            self.wrong_bytes,
            self.puts,
            self.served_by,
            self.fetch_kinds
        )?;
        writeln!(
            f,
            "fetch errors {:?}; put errors {:?}",
            self.fetch_errors, self.put_errors
        )?;
        writeln!(
            f,
            "kills {:?}, restarts {}, calls cut short {}, unexpected exits {}",
            self.kills, self.restarts, self.interrupted_calls, self.unexpected_exits
        )?;
        writeln!(
            f,
            "reloads: {} rounds, {} applied, {} refused, {}/{} bad-config probes refused, {} cut short by a kill",
            self.reloads.rounds,
            self.reloads.applied,
            self.reloads.refused,
            self.reloads.probes_refused,
            self.reloads.probes,
            self.reloads.interrupted
        )?;
        writeln!(
            f,
            "sweeps {}: reclaimed {:?}; final sweep ({} segments before): {:?}; leaked segments {}",
            self.sweeps,
            self.swept_during_run,
            self.segments_before_final_sweep,
            self.final_sweep,
            self.leaked_segments
        )?;
        writeln!(
            f,
            "reference (owner-0 + consumer-0, never killed): RSS {:.1} / {:.1} / {:.1} MiB, \
             private {:.1} / {:.1} / {:.1} MiB, fds {} / {} / {}, threads {} / {} / {} \
             (start / mark at {:.0} s / end): {}",
            mib(self.rss_start),
            mib(self.rss_mark),
            mib(self.rss_end),
            mib(self.anon_start),
            mib(self.anon_mark),
            mib(self.anon_end),
            self.fds_start,
            self.fds_mark,
            self.fds_end,
            self.threads_start,
            self.threads_mark,
            self.threads_end,
            self.mark_s,
            if self.flat {
                "flat (end within 10% of the mark)"
            } else {
                "NOT FLAT (end beyond 10% of the mark)"
            }
        )?;
        let failures = self.failures();
        if failures.is_empty() {
            writeln!(f, "PASS: 0 wrong bytes, 0 leaked segments")
        } else {
            writeln!(f, "FAIL: {}", failures.join("; "))
        }
    }
}

/// Adds every numeric field of a sweep reply (`{transport: {counter: n}}`)
/// to `into`.
pub(super) fn add_swept(into: &mut BTreeMap<String, u64>, swept: Option<&serde_json::Value>) {
    let Some(serde_json::Value::Object(per_transport)) = swept else {
        return;
    };
    for v in per_transport.values() {
        if let serde_json::Value::Object(counters) = v {
            for (k, n) in counters {
                if let Some(n) = n.as_u64() {
                    *into.entry(k.clone()).or_default() += n;
                }
            }
        }
    }
}

/// Fills the start / mark / end fields from the snapshots.
pub(super) fn summarize(r: &mut ChaosReport, mark: Duration) {
    let (Some(first), Some(last)) = (r.snapshots.first(), r.snapshots.last()) else {
        return;
    };
    let at_mark = r
        .snapshots
        .iter()
        .find(|s| s.t_s >= mark.as_secs_f64())
        .unwrap_or(last);
    let (a, m, e) = (first.reference, at_mark.reference, last.reference);
    r.mark_s = at_mark.t_s;
    (r.rss_start, r.rss_mark, r.rss_end) = (a.rss, m.rss, e.rss);
    (r.anon_start, r.anon_mark, r.anon_end) = (a.anon, m.anon, e.anon);
    (r.fds_start, r.fds_mark, r.fds_end) = (a.fds, m.fds, e.fds);
    (r.threads_start, r.threads_mark, r.threads_end) = (a.threads, m.threads, e.threads);
    r.flat = within_10pct(m.rss, e.rss) && within_10pct(m.fds, e.fds);
}

/// Prometheus text with `soak_worker="<worker>"` added to every series, so
/// the files of several workers can be scraped side by side.
pub(super) fn label_series(text: &str, worker: &str) -> String {
    let label = format!("soak_worker=\"{worker}\"");
    let mut out = String::with_capacity(text.len() + 64 * 32);
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            out.push_str(line);
        } else {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let (name, rest) = line.split_at(name_end);
            out.push_str(name);
            match rest.strip_prefix('{') {
                Some(labels) if labels.starts_with('}') => {
                    out.push('{');
                    out.push_str(&label);
                    out.push_str(labels);
                }
                Some(labels) => {
                    out.push('{');
                    out.push_str(&label);
                    out.push(',');
                    out.push_str(labels);
                }
                None => {
                    out.push('{');
                    out.push_str(&label);
                    out.push('}');
                    out.push_str(rest);
                }
            }
        }
        out.push('\n');
    }
    out
}
