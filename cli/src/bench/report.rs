//! The report: machine, settings, limits, cells, extras and targets; its
//! table (`Display`) and its JSON form (`Serialize`, [`SCHEMA`]).

use std::fmt;

use shardport_kit::format_byte_size;

use super::{
    cell::{Cell, CellStatus, VIEW_TARGET_US},
    extras::Extra,
    limits::{Limits, SizeLimit, SUSPECT_RATIO},
    spec::{Op, PathId},
};

/// Version of the JSON layout; bumped when a field changes meaning.
pub const SCHEMA: u32 = 1;

// The targets of issue 7: what "fast enough" means on any machine, relative
// to its own limits where bytes move, absolute where latency is the point.
/// Copy fetch, warm-pool put and large http fetch: at least this fraction of
/// the machine's limit for the same work.
pub const MIN_RATIO: f64 = 0.8;
/// http fetch of 4 KiB over a kept-alive connection (issue 16), p50 and
/// p99: a small shard costs a few loopback round trips, not a new
/// connection, and no sleeping thread's wake-up.
pub const HTTP_4K_P50_US: f64 = 20.0;
/// ... its p99.
pub const HTTP_4K_P99_US: f64 = 60.0;
/// A 4 KiB put into a warm pool, p50 (issue 16): no fixed cost a small
/// shard notices.
pub const PUT_4K_P50_US: f64 = 1.0;
/// A 4 KiB put, then its fetch (copy) from another process, p50 (issue 16).
pub const PUT_FETCH_4K_P50_US: f64 = 10.0;
/// 1000 x 4 KiB batch: shards per second (one request per owner, not per shard).
pub const MIN_BATCH_PER_S: f64 = 50_000.0;
/// Calling a plugin through its vtable: at most this much more than a direct call.
pub const MAX_DISPATCH_OVERHEAD_NS: f64 = 10.0;
/// Many small shards (issue 16): an RL step's per-sample tensors must move
/// at least this fast through shared memory (puts, and fetches from another
/// process) ...
pub const MIN_MANY_SHM_PER_S: f64 = 500_000.0;
/// ... and over http batches.
pub const MIN_MANY_HTTP_PER_S: f64 = 200_000.0;

/// Everything one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    /// [`SCHEMA`].
    pub schema: u32,
    /// When the run ended, UTC, RFC 3339.
    pub date: String,
    /// The command line.
    pub command: Vec<String>,
    /// The machine.
    pub machine: Machine,
    /// 1-minute load average before and after: other work skews numbers.
    pub load_average: LoadAverage,
    /// What was asked for.
    pub settings: Settings,
    /// The machine's limits, measured in this run.
    pub limits: Limits,
    /// The matrix, path by path, operation by operation, size by size.
    pub cells: Vec<Cell>,
    /// Measurements outside the matrix.
    pub extras: Vec<Extra>,
    /// The targets, met or missed.
    pub targets: Vec<TargetCheck>,
}

/// The machine the run measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Machine {
    /// Host name.
    pub hostname: String,
    /// CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// Physical memory in bytes (`/proc/meminfo`).
    pub memory_bytes: u64,
    /// Kernel release.
    pub kernel: String,
}

/// Load average around the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadAverage {
    /// 1-minute load average at the start.
    pub before: Option<f64>,
    /// 1-minute load average at the end.
    pub after: Option<f64>,
}

/// What the run was asked to measure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Settings {
    /// Sizes in bytes.
    pub sizes: Vec<u64>,
    /// Paths.
    pub paths: Vec<PathId>,
    /// Operations.
    pub ops: Vec<Op>,
    /// Timed repetitions per cell.
    pub reps: usize,
    /// Warm-up iterations per cell.
    pub warmup: usize,
    /// `--quick`.
    pub quick: bool,
}

/// One target of issue 7.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetCheck {
    /// What is measured.
    pub name: String,
    /// The target, as text.
    pub target: String,
    /// The measured figure, as text.
    pub measured: String,
    /// `true` met, `false` missed, `None` not measured in this run.
    pub met: Option<bool>,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

impl Machine {
    /// Reads what `/proc` says about this machine.
    pub fn probe() -> Machine {
        let cpu_model = read("/proc/cpuinfo")
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let memory_bytes = read("/proc/meminfo")
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kib| kib.parse::<u64>().ok())
            })
            .map_or(0, |kib| kib * 1024);
        Machine {
            hostname: read("/proc/sys/kernel/hostname")
                .map_or_else(|| "unknown".into(), |h| h.trim().to_owned()),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            memory_bytes,
            kernel: read("/proc/sys/kernel/osrelease")
                .map_or_else(|| "unknown".into(), |k| k.trim().to_owned()),
        }
    }
}

/// The 1-minute load average (`/proc/loadavg`).
pub fn load_average() -> Option<f64> {
    read("/proc/loadavg")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic
/// Gregorian calendar; days converted through 400-year eras).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Shift the epoch to 0000-03-01 so leap days fall at the end of a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn find(cells: &[Cell], path: PathId, op: Op) -> impl Iterator<Item = &Cell> {
    cells
        .iter()
        .filter(move |c| c.path == path && c.op == op && c.status == CellStatus::Ok)
}

fn extra<'e>(extras: &'e [Extra], key: &str) -> Option<&'e Extra> {
    extras.iter().find(|e| e.key == key && e.value.is_some())
}

fn not_measured(name: &str, target: &str, why: &str) -> TargetCheck {
    TargetCheck {
        name: name.to_owned(),
        target: target.to_owned(),
        measured: format!("not measured ({why})"),
        met: None,
    }
}

/// A ratio target on the largest measured cell of `path` / `op`.
fn ratio_target(cells: &[Cell], path: PathId, op: Op, name: &str, min: f64) -> TargetCheck {
    let target = format!(">= {min}x {}", limit_word(path, op));
    match find(cells, path, op)
        .filter(|c| c.ratio.is_some())
        .max_by_key(|c| c.size)
    {
        Some(c) => {
            let ratio = c.ratio.expect("filtered");
            // Beating the machine's limit means the limit is wrong: no verdict.
            let suspect = ratio > SUSPECT_RATIO;
            TargetCheck {
                name: format!("{name} ({})", format_byte_size(c.size)),
                target,
                measured: format!(
                    "{ratio:.2}x ({:.2} / {:.2} GB/s){}",
                    c.gbps.unwrap_or_default(),
                    c.limit.as_ref().map_or(0.0, |l| l.gbps),
                    if suspect {
                        "; limit suspect: the product beat it"
                    } else {
                        ""
                    }
                ),
                met: (!suspect).then_some(ratio >= min),
            }
        }
        None => not_measured(name, &target, &format!("no {path} {op} cell in this run")),
    }
}

/// A latency target on the 4 KiB cell of `path` / `op`: p50 at most
/// `p50_us`, and p99 at most `p99_us` where given.
fn latency_target(
    cells: &[Cell],
    name: &str,
    (path, op): (PathId, Op),
    p50_us: f64,
    p99_us: Option<f64>,
) -> TargetCheck {
    let target = match p99_us {
        Some(p99) => format!("p50 <= {p50_us} us, p99 <= {p99} us"),
        None => format!("p50 <= {p50_us} us"),
    };
    let Some(s) = find(cells, path, op)
        .find(|c| c.size == 4 << 10)
        .and_then(|c| c.samples)
    else {
        return not_measured(name, &target, &format!("no {path} {op} cell of 4 KiB"));
    };
    TargetCheck {
        name: name.into(),
        target,
        measured: format!("p50 {:.1} us, p99 {:.1} us", s.median_us, s.p99_us),
        met: Some(s.median_us <= p50_us && p99_us.is_none_or(|max| s.p99_us <= max)),
    }
}

fn limit_word(path: PathId, op: Op) -> &'static str {
    match (path, op) {
        (PathId::Http, Op::Fetch) => "TCP loopback",
        (PathId::CudaHttp, _) => "the slowest of pinned D2H, TCP loopback, pinned H2D",
        (PathId::CudaCopy, _) => "cuMemcpyDtoD",
        _ => "memcpy",
    }
}

/// Checks the targets of issues 7 and 16 against what was measured. `stream` is
/// the raw TCP loopback stream limit, shown beside the http target.
pub fn targets(cells: &[Cell], extras: &[Extra], stream: Option<&SizeLimit>) -> Vec<TargetCheck> {
    let mut out = Vec::new();

    let name = "shm zero-copy view fetch p50, every size";
    let target = format!("<= {VIEW_TARGET_US} us");
    let views: Vec<&Cell> = find(cells, PathId::ShmView, Op::Fetch).collect();
    out.push(
        match views
            .iter()
            .filter_map(|c| c.samples.map(|s| (c.size, s.median_us)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
        {
            Some((size, worst)) => TargetCheck {
                name: name.into(),
                target,
                measured: format!(
                    "worst {worst:.2} us (at {}, {} sizes)",
                    format_byte_size(size),
                    views.len()
                ),
                met: Some(worst <= VIEW_TARGET_US),
            },
            None => not_measured(name, &target, "no shm-view fetch cell in this run"),
        },
    );
    out.push(ratio_target(
        cells,
        PathId::ShmCopy,
        Op::Fetch,
        "shm copy fetch",
        MIN_RATIO,
    ));
    out.push(ratio_target(
        cells,
        PathId::ShmCopy,
        Op::Put,
        "warm-pool put",
        MIN_RATIO,
    ));
    let mut http = ratio_target(cells, PathId::Http, Op::Fetch, "http fetch", MIN_RATIO);
    if let (Some(stream), Some(c)) = (
        stream,
        find(cells, PathId::Http, Op::Fetch)
            .filter(|c| c.ratio.is_some())
            .max_by_key(|c| c.size),
    ) {
        // The round trip sends the shard from a shard-sized buffer, like the
        // owner does; the stream resends one cache-resident 1 MiB buffer.
        http.measured.push_str(&format!(
            "; {:.2}x the one-way stream of a cache-resident 1 MiB buffer ({:.2} GB/s)",
            c.gbps.unwrap_or_default() / stream.gbps,
            stream.gbps
        ));
    }
    out.push(http);
    // Issue 23: a GPU shard staged over http, largest size measured.
    out.push(ratio_target(
        cells,
        PathId::CudaHttp,
        Op::Fetch,
        "GPU shard staged over http",
        MIN_RATIO,
    ));

    for (name, path, op, p50, p99) in [
        (
            "http fetch, 4 KiB",
            PathId::Http,
            Op::Fetch,
            HTTP_4K_P50_US,
            Some(HTTP_4K_P99_US),
        ),
        (
            "shm put, 4 KiB",
            PathId::ShmCopy,
            Op::Put,
            PUT_4K_P50_US,
            None,
        ),
        (
            "shm put then fetch from another process, 4 KiB",
            PathId::ShmCopy,
            Op::PutFetch,
            PUT_FETCH_4K_P50_US,
            None,
        ),
    ] {
        out.push(latency_target(cells, name, (path, op), p50, p99));
    }

    out.push(extra_target(
        extras,
        "batch_shards_per_s",
        (("http batch, 1000 x 4 KiB", "batch skipped"), false),
        Bound::AtLeast(MIN_BATCH_PER_S, "shards/s"),
    ));
    for (key, name, min) in [
        (
            "many_small_put_per_s",
            "many small shards, put",
            MIN_MANY_SHM_PER_S,
        ),
        (
            "many_small_fetch_shm_per_s",
            "many small shards, shm fetch",
            MIN_MANY_SHM_PER_S,
        ),
        (
            "many_small_fetch_http_per_s",
            "many small shards, http fetch",
            MIN_MANY_HTTP_PER_S,
        ),
    ] {
        out.push(extra_target(
            extras,
            key,
            ((name, "not measured in this run"), true),
            Bound::AtLeast(min, "shards/s"),
        ));
    }
    out.push(extra_target(
        extras,
        "dispatch_overhead_ns",
        (("plugin dispatch overhead", "no plugin loaded"), false),
        Bound::AtMost(MAX_DISPATCH_OVERHEAD_NS, "ns"),
    ));
    out
}

/// A bound on one of the measurements outside the matrix, with its unit.
enum Bound {
    AtLeast(f64, &'static str),
    AtMost(f64, &'static str),
}

/// The target on the extra `key`, named `names.0`: met when its value is
/// within `bound`; `names.1` says why when the run did not measure it. With
/// `row_name` a measured extra is named by its own row instead.
fn extra_target(
    extras: &[Extra],
    key: &str,
    (names, row_name): ((&str, &str), bool),
    bound: Bound,
) -> TargetCheck {
    let (target, unit, decimals) = match bound {
        Bound::AtLeast(min, unit) => (format!(">= {min} {unit}"), unit, 0),
        Bound::AtMost(max, unit) => (format!("<= {max} {unit}"), unit, 2),
    };
    match extra(extras, key) {
        Some(e) => {
            let v = e.value.expect("filtered");
            TargetCheck {
                name: if row_name {
                    e.name.clone()
                } else {
                    names.0.to_owned()
                },
                target,
                measured: format!("{v:.decimals$} {unit}"),
                met: Some(match bound {
                    Bound::AtLeast(min, _) => v >= min,
                    Bound::AtMost(max, _) => v <= max,
                }),
            }
        }
        None => not_measured(names.0, &target, names.1),
    }
}

fn time(us: f64) -> String {
    if us < 1.0 {
        format!("{:.0} ns", us * 1e3)
    } else if us < 10_000.0 {
        format!("{us:.1} us")
    } else {
        format!("{:.1} ms", us / 1e3)
    }
}

impl BenchReport {
    /// The machine's limits, size by size.
    fn write_limits(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\nlimits (this machine, same run; median)")?;
        writeln!(
            f,
            "  {:<9} {:>10} {:>10}   {:>10} {:>10}",
            "size", "memcpy", "GB/s", "tcp rt", "GB/s"
        )?;
        for m in &self.limits.memcpy {
            let t = self.limits.tcp_at(m.size);
            writeln!(
                f,
                "  {:<9} {:>10} {:>10.2}   {:>10} {:>10}",
                format_byte_size(m.size),
                time(m.samples.median_us),
                m.gbps,
                t.map_or("-".into(), |t| time(t.samples.median_us)),
                t.map_or("-".into(), |t| format!("{:.2}", t.gbps)),
            )?;
        }
        if let Some(s) = &self.limits.tcp_stream {
            writeln!(
                f,
                "  tcp loopback stream, {}: {:.2} GB/s",
                format_byte_size(s.size),
                s.gbps
            )?;
        }
        Ok(())
    }

    /// The matrix, one line per cell (a path skipped whole on one line).
    fn write_matrix(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
        f,
        "\nmatrix (ratio = limit time / median time; each cell's limit is sampled between its repetitions)"
    )?;
        writeln!(
            f,
            "{:<9} {:<9} {:<8} {:>10} {:>10} {:>10} {:>9}  {:<34} {:>7}",
            "path", "op", "size", "p50", "p90", "p99", "GB/s", "limit (same work)", "ratio"
        )?;
        let mut folded: Vec<PathId> = Vec::new();
        for c in &self.cells {
            // A path skipped as a whole (its plugin is absent) takes one line.
            let of_path: Vec<&Cell> = self.cells.iter().filter(|x| x.path == c.path).collect();
            if c.status == CellStatus::Skipped
                && of_path
                    .iter()
                    .all(|x| x.status == CellStatus::Skipped && x.reason == c.reason)
            {
                if !folded.contains(&c.path) {
                    folded.push(c.path);
                    writeln!(
                        f,
                        "{:<9} {:<18} skipped ({} cells): {}",
                        c.path.name(),
                        "every op and size",
                        of_path.len(),
                        c.reason.as_deref().unwrap_or("")
                    )?;
                }
                continue;
            }
            write_cell(f, c)?;
        }
        Ok(())
    }
}

/// One cell's line: its timings beside its limit or target, or why it has none.
fn write_cell(f: &mut fmt::Formatter<'_>, c: &Cell) -> fmt::Result {
    let head = format!(
        "{:<9} {:<9} {:<8}",
        c.path.name(),
        c.op.name(),
        format_byte_size(c.size)
    );
    match (c.status, c.samples) {
        (CellStatus::Ok, Some(s)) => {
            let (limit, ratio) = match (&c.limit, c.ratio, c.target_us) {
                (Some(l), Some(r), _) => (
                    format!("{} {} {:.2} GB/s", l.name, time(l.median_us), l.gbps),
                    if r > SUSPECT_RATIO {
                        format!("{r:.2}x LIMIT SUSPECT")
                    } else {
                        format!("{r:.2}x")
                    },
                ),
                (_, _, Some(t)) => (
                    format!("target p50 <= {t} us"),
                    if s.median_us <= t { "met" } else { "MISSED" }.to_owned(),
                ),
                _ => (String::new(), String::new()),
            };
            writeln!(
                f,
                "{head} {:>10} {:>10} {:>10} {:>9.2}  {:<34} {:>7}",
                time(s.median_us),
                time(s.p90_us),
                time(s.p99_us),
                c.gbps.unwrap_or_default(),
                limit,
                ratio
            )?;
        }
        (status, _) => writeln!(
            f,
            "{head} {}: {}",
            if status == CellStatus::Failed {
                "FAILED"
            } else {
                "skipped"
            },
            c.reason.as_deref().unwrap_or("")
        )?,
    }
    Ok(())
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.machine;
        writeln!(
            f,
            "shardport bench  {}  {}: {}, {} cores, {}, Linux {}",
            self.date,
            m.hostname,
            m.cpu_model,
            m.cores,
            format_byte_size(m.memory_bytes),
            m.kernel
        )?;
        let load = |l: Option<f64>| l.map_or("?".into(), |v| format!("{v:.2}"));
        writeln!(
            f,
            "load average {} -> {}; {} warm-up + {} timed repetitions per cell{}",
            load(self.load_average.before),
            load(self.load_average.after),
            self.settings.warmup,
            self.settings.reps,
            if self.settings.quick {
                " (--quick)"
            } else {
                ""
            }
        )?;

        self.write_limits(f)?;
        self.write_matrix(f)?;
        writeln!(f, "\noutside the matrix")?;
        for e in &self.extras {
            match (e.value, &e.skipped) {
                (Some(v), _) => {
                    writeln!(f, "  {:<52} {:>12.2} {:<9} {}", e.name, v, e.unit, e.detail)?
                }
                (None, why) => writeln!(
                    f,
                    "  {:<52} {}{}",
                    e.name,
                    if e.failed { "" } else { "skipped: " },
                    why.as_deref().unwrap_or("")
                )?,
            }
        }

        writeln!(f, "\ntargets")?;
        for t in &self.targets {
            writeln!(
                f,
                "  {:<7} {:<44} {:<20} {}",
                match t.met {
                    Some(true) => "met",
                    Some(false) => "MISSED",
                    None => "-",
                },
                t.name,
                t.target,
                t.measured
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn a_ratio_over_the_limit_gets_no_verdict_and_says_the_limit_is_suspect() {
        use super::super::{cell::Cell, spec::PathId, stats::Summary};
        let limits = Limits {
            memcpy: vec![SizeLimit {
                size: 4096,
                samples: Summary::of_us(&mut [1.2]).unwrap(),
                gbps: 3.4,
            }],
            ..Limits::default()
        };
        let cell = |us: f64| {
            let samples = Summary::of_us(&mut [us]).unwrap();
            Cell::measured(
                PathId::ShmCopy.spec(),
                Op::Fetch,
                4096,
                1,
                samples,
                None,
                &limits,
            )
        };
        // 1.2 us of limit against 1.0 us of product: 1.20x, the limit is wrong.
        let t = ratio_target(&[cell(1.0)], PathId::ShmCopy, Op::Fetch, "copy", 0.8);
        assert_eq!(t.met, None, "{t:?}");
        assert!(t.measured.contains("limit suspect"), "{t:?}");
        // 1.2 us against 1.4 us: 0.86x, judged as usual.
        let t = ratio_target(&[cell(1.4)], PathId::ShmCopy, Op::Fetch, "copy", 0.8);
        assert_eq!(t.met, Some(true), "{t:?}");
        assert!(!t.measured.contains("suspect"), "{t:?}");
    }

    #[test]
    fn latency_targets_judge_p50_and_p99_of_the_4_kib_cell() {
        use super::super::{cell::Cell, spec::PathId, stats::Summary};
        let limits = Limits::default();
        let cell = |size: u64, us: &[f64]| {
            let samples = Summary::of_us(&mut us.to_vec()).unwrap();
            Cell::measured(
                PathId::Http.spec(),
                Op::Fetch,
                size,
                1,
                samples,
                None,
                &limits,
            )
        };
        let judge = |cells: &[Cell]| {
            latency_target(cells, "http", (PathId::Http, Op::Fetch), 20.0, Some(60.0))
        };
        assert_eq!(judge(&[cell(4096, &[10.0, 12.0, 50.0])]).met, Some(true));
        let t = judge(&[cell(4096, &[10.0, 12.0, 70.0])]);
        assert_eq!(t.met, Some(false), "p99 70 us: {t:?}");
        assert_eq!(t.measured, "p50 12.0 us, p99 70.0 us");
        assert_eq!(judge(&[cell(4096, &[25.0, 26.0, 27.0])]).met, Some(false));
        // Another size does not count.
        assert_eq!(judge(&[cell(8192, &[1.0])]).met, None);
    }

    #[test]
    fn targets_without_cells_are_not_measured() {
        let t = targets(&[], &[], None);
        assert_eq!(t.len(), 13);
        assert!(t.iter().all(|t| t.met.is_none()), "{t:?}");
    }
}
