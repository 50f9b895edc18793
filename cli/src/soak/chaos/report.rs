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
    /// Bytes of `/dev/shm` files mapped (from `/proc/<pid>/maps`): the
    /// bound on `shmem`; grows only if mappings of dead owners' pools leak.
    pub shm_mapped: u64,
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
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        Some(ProcUsage {
            rss: field("VmRSS:") * 1024,
            anon: field("RssAnon:") * 1024,
            shmem: field("RssShmem:") * 1024,
            shm_mapped: shm_mapped_bytes(&maps),
            fds,
            threads: field("Threads:"),
        })
    }

    pub(super) fn add(&mut self, o: ProcUsage) {
        self.rss += o.rss;
        self.anon += o.anon;
        self.shmem += o.shmem;
        self.shm_mapped += o.shm_mapped;
        self.fds += o.fds;
        self.threads += o.threads;
    }
}

/// Bytes of the mappings of `/dev/shm` files in a `/proc/<pid>/maps` text
/// (`start-end perms offset dev inode path`).
pub(super) fn shm_mapped_bytes(maps: &str) -> u64 {
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let path = f.nth(4)?;
            if !path.starts_with("/dev/shm/") {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let a = u64::from_str_radix(a, 16).ok()?;
            let b = u64::from_str_radix(b, 16).ok()?;
            Some(b.saturating_sub(a))
        })
        .sum()
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

/// One resource judged flat or not: the snapshots after the mark are split
/// in two halves in time, and the resource is flat when the largest value of
/// the second half is within 10% of the largest of the first. A leak grows
/// with time and sets a new maximum late; a bounded resource (a cache held
/// to its limit, pool pages touched once) reaches its maximum early.
/// Resident shared memory (pool pages a view touched) is not judged itself:
/// it is bounded by `shm_mapped`, which is.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FlatCheck {
    /// What (`private`, `shm_mapped`, `fds`, `threads`, `shm_entries`).
    pub what: String,
    /// Largest value from the mark to the middle of the rest of the run.
    pub first_half_max: u64,
    /// Largest value after that.
    pub second_half_max: u64,
    /// `second_half_max <= 1.1 x first_half_max`.
    pub flat: bool,
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
    /// The flatness checks (see [`FlatCheck`]): private memory, `/dev/shm`
    /// mapped, open fds, threads and this run's `/dev/shm` entries.
    pub flatness: Vec<FlatCheck>,
    /// Every flatness check passed.
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
             (start / mark at {:.0} s / end)",
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
        )?;
        let checks: Vec<String> = self
            .flatness
            .iter()
            .map(|c| {
                let (a, b) = if c.what == "private" || c.what == "shm_mapped" {
                    (
                        format!("{:.1} MiB", mib(c.first_half_max)),
                        format!("{:.1} MiB", mib(c.second_half_max)),
                    )
                } else {
                    (c.first_half_max.to_string(), c.second_half_max.to_string())
                };
                format!(
                    "{} {a} -> {b}{}",
                    c.what,
                    if c.flat { "" } else { " GROWS" }
                )
            })
            .collect();
        writeln!(
            f,
            "after the mark, largest value of the first half -> of the second: {}: {}",
            checks.join(", "),
            if self.flat {
                "flat (second half within 10% of the first)"
            } else {
                "NOT FLAT"
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

/// Fills the start / mark / end fields and the flatness checks from the
/// snapshots.
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
    let middle = (r.mark_s + last.t_s) / 2.0;
    let after_mark: Vec<&ChaosSnapshot> =
        r.snapshots.iter().filter(|s| s.t_s >= r.mark_s).collect();
    let check = |what: &str, value: &dyn Fn(&ChaosSnapshot) -> u64| {
        let max_of = |second: bool| {
            after_mark
                .iter()
                .filter(|s| (s.t_s > middle) == second)
                .map(|s| value(s))
                .max()
                .unwrap_or(0)
        };
        let (first_half_max, second_half_max) = (max_of(false), max_of(true));
        FlatCheck {
            what: what.to_owned(),
            first_half_max,
            second_half_max,
            flat: second_half_max as f64 <= first_half_max as f64 * 1.1,
        }
    };
    r.flatness = vec![
        check("private", &|s| s.reference.anon),
        check("shm_mapped", &|s| s.reference.shm_mapped),
        check("fds", &|s| s.reference.fds),
        check("threads", &|s| s.reference.threads),
        check("shm_entries", &|s| s.shm_entries as u64),
    ];
    r.flat = r.flatness.iter().all(|c| c.flat);
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
