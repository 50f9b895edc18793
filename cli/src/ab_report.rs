//! `shardport ab report`: reads a metrics [`Snapshot`] (a file, or scraped
//! from a node's `GET /v1/metrics.json`) and compares the arms of its A/B
//! experiments.
//!
//! ## Overview
//! [`load`] / [`parse_str`] / [`scrape`] produce a [`Snapshot`] (refusing an
//! unknown `format`); [`build`] turns it into a [`Report`], a pure function of
//! (snapshot, [`Options`]); the report prints as a table ([`fmt::Display`]),
//! serializes as JSON, and [`Report::plot_svg`] draws the latency CDF per arm
//! ([`plot`]). Nothing here prints or touches the disk except [`load`].
//!
//! ## Definitions
//! - **n**: successful fetches of an arm in the selected size buckets = the
//!   sum of the counts of its merged `[value_ns, count]` histogram.
//! - **pP latency** (p50, p90, p99): nearest rank on the weighted values: the
//!   smallest recorded value `v` such that at least `ceil(P/100 * n)` samples
//!   are `<= v` (rank at least 1). Always a value present in the histogram,
//!   never interpolated.
//! - **throughput**: bytes fetched / summed fetch latency (`bytes /
//!   latency_ns_total`), i.e. bytes per second *of fetch time*, printed in
//!   decimal GB/s or MB/s. It is not wall-clock throughput of the node. The
//!   snapshot keeps bytes and latency totals for all sizes only, so with
//!   `--size` the throughput is left out (`-`), never estimated.
//! - **error rate**: `errors / (fetches + errors)` of the arm, over all sizes
//!   (errors are not split per size bucket either).
//! - **difference**: for each arm other than the control, `arm - control` of
//!   the p50 (and the ratio `arm / control`) and of the error rate, each with
//!   a bootstrap 95% confidence interval.
//!
//! ## Bootstrap
//! Each of `resamples` rounds resamples every arm independently, as if
//! drawing `n` fetches with replacement from its histogram (multinomial), and
//! takes the statistic of the resample; the interval is the 2.5th and 97.5th
//! nearest-rank percentiles of the resampled differences (the percentile
//! bootstrap). No draw expands a histogram into samples:
//! - the p50 of a resample of `n` draws is its `r`-th smallest draw
//!   (`r = ceil(n/2)`); pushing `n` uniform draws through the histogram's
//!   inverse CDF keeps their order, so that draw is the inverse CDF at the
//!   `r`-th smallest of `n` uniforms, which is `Beta(r, n - r + 1)`: one beta
//!   draw and one binary search over the cumulative counts per resample,
//!   whatever `n` is, and exactly the multinomial resample's p50;
//! - an error count is `Binomial(fetches + errors, error rate)`, drawn exactly
//!   by halving the trial count with beta-distributed order statistics.
//!
//! The bootstrap treats fetches as independent. With `unit = "shard"`
//! fetches of one shard share an arm and are correlated, so the intervals
//! can be narrower than the truth; they also cannot resolve differences
//! finer than the histogram's 2 significant digits (1%).
//!
//! The generator is a seeded splitmix64 written here; each comparison gets
//! its own stream derived from `(seed, experiment, arm, statistic)`, so a
//! report restricted to one experiment gives the same intervals as the full
//! one. An arm with fewer than [`MIN_SAMPLES`] samples (or attempts, for the
//! error rate) is reported as "insufficient data" instead of an interval.
//!
//! ## Failure modes
//! Every error is a [`ReportError`] naming the file, node, experiment or
//! option at fault; the snapshot's JSON errors carry `line:column`.

pub mod plot;
mod stats;
mod text;

pub use self::stats::Histogram;
#[allow(clippy::wildcard_imports)]
use self::stats::*;
pub use self::text::{latency_label, throughput_label, utc_label, TimeUnit};

use std::{fmt, path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use shardport_host::snapshot::{self, ArmSnapshot, ExperimentSnapshot, Snapshot};

/// Bootstrap resamples by default: the 2.5%/97.5% tails then rest on 50
/// resampled values each, enough for stable two-digit interval bounds.
pub const DEFAULT_RESAMPLES: usize = 2000;
/// Fewest resamples accepted: below this the interval bounds are a handful
/// of values and change from seed to seed.
pub const MIN_RESAMPLES: usize = 100;
/// Most resamples accepted: each costs a few microseconds whatever `n` is,
/// so this bounds a report to seconds.
pub const MAX_RESAMPLES: usize = 1_000_000;
/// Default seed: a fixed seed makes two reports of the same snapshot
/// identical.
pub const DEFAULT_SEED: u64 = 1;
/// Fewest samples (successful fetches for latency, attempts for the error
/// rate) an arm needs before its difference from the control is estimated;
/// below this a bootstrap interval is mostly noise.
pub const MIN_SAMPLES: u64 = 20;
/// Path of the metrics snapshot on a node's control endpoint.
pub const METRICS_PATH: &str = "/v1/metrics.json";
/// How long a scrape may take: a snapshot is a few hundred KiB at most.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Lower bound of the 95% interval, per mille.
const CI_LOW_PER_MILLE: u64 = 25;
/// Upper bound of the 95% interval, per mille.
const CI_HIGH_PER_MILLE: u64 = 975;

/// Reading a snapshot or building a report failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The snapshot file could not be read (missing, no permission).
    #[error("cannot read snapshot {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The snapshot is not valid JSON or does not have the snapshot's shape.
    #[error("snapshot {origin}{}: {message}", location(*line, *column))]
    Parse {
        /// The file or node.
        origin: String,
        /// Line (1-based; 0 when unknown, e.g. for a scraped body).
        line: usize,
        /// Column (1-based; 0 when unknown).
        column: usize,
        /// What serde found wrong.
        message: String,
    },
    /// The snapshot's `format` tag is not the one this build reads. Likely a
    /// newer or older node, or not a shardport metrics snapshot at all.
    #[error("snapshot {origin}: format is {found}, expected \"{expected}\"")]
    Format {
        /// The file or node.
        origin: String,
        /// [`snapshot::FORMAT`].
        expected: &'static str,
        /// The tag found, quoted, or `missing`.
        found: String,
    },
    /// Scraping the node failed (not running, wrong address, bad token, or a
    /// node without the metrics endpoint).
    #[error("cannot scrape metrics: {0}")]
    Scrape(#[from] shardport_control::client::ClientError),
    /// The snapshot has no experiments: the node has no `[[experiment]]`.
    #[error(
        "snapshot of node `{node}` has no experiments (configure an [[experiment]] on the node)"
    )]
    NoExperiments {
        /// The node's name.
        node: String,
    },
    /// `--experiment` names an experiment the snapshot does not have.
    #[error("no experiment `{name}` in the snapshot of node `{node}`; available: {}", available.join(", "))]
    UnknownExperiment {
        /// The name asked for.
        name: String,
        /// The node's name.
        node: String,
        /// The experiments the snapshot has.
        available: Vec<String>,
    },
    /// `--size` is not a size bucket label.
    #[error("--size `{size}` is not a size bucket; expected one of {}", expected.join(", "))]
    UnknownSize {
        /// The label given.
        size: String,
        /// The bucket labels.
        expected: Vec<&'static str>,
    },
    /// An experiment's control arm is not among its arms (a hand-edited or
    /// corrupt snapshot).
    #[error("experiment `{experiment}`: control arm `{control}` is not among its arms ({})", arms.join(", "))]
    NoControlArm {
        /// Experiment.
        experiment: String,
        /// The control arm named.
        control: String,
        /// Its arms.
        arms: Vec<String>,
    },
    /// An option is out of range.
    #[error("{0}")]
    InvalidOption(String),
}

/// `:line:column`, or nothing when unknown (0).
fn location(line: usize, column: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}:{column}")
    }
}

/// Reads a snapshot file.
pub fn load(path: &Path) -> Result<Snapshot, ReportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_str(&text, &path.display().to_string())
}

/// Parses a snapshot from JSON text; `origin` names it in errors.
pub fn parse_str(text: &str, origin: &str) -> Result<Snapshot, ReportError> {
    /// Just the tag, read first so that another version of the format is
    /// refused as such rather than for a field it lacks.
    #[derive(Deserialize)]
    #[serde(expecting = "a shardport metrics snapshot (a JSON object)")]
    struct Tag {
        format: Option<String>,
    }
    let tag: Tag = serde_json::from_str(text).map_err(|e| parse_error(origin, &e))?;
    check_format(tag.format.as_deref(), origin)?;
    serde_json::from_str(text).map_err(|e| parse_error(origin, &e))
}

/// Scrapes `GET /v1/metrics.json` from the node's control endpoint at
/// `addr` (`host:port`).
pub fn scrape(addr: &str, token: Option<&str>, timeout: Duration) -> Result<Snapshot, ReportError> {
    let value = shardport_control::client::call(addr, "GET", METRICS_PATH, token, &[], timeout)?;
    let origin = format!("http://{addr}{METRICS_PATH}");
    check_format(value.get("format").and_then(|f| f.as_str()), &origin)?;
    serde_json::from_value(value).map_err(|e| parse_error(&origin, &e))
}

fn check_format(found: Option<&str>, origin: &str) -> Result<(), ReportError> {
    match found {
        Some(f) if f == snapshot::FORMAT => Ok(()),
        other => Err(ReportError::Format {
            origin: origin.to_owned(),
            expected: snapshot::FORMAT,
            found: other.map_or_else(|| "missing".to_owned(), |f| format!("\"{f}\"")),
        }),
    }
}

fn parse_error(origin: &str, e: &serde_json::Error) -> ReportError {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    ReportError::Parse {
        origin: origin.to_owned(),
        line: e.line(),
        column: e.column(),
        message: text.strip_suffix(&suffix).unwrap_or(&text).to_owned(),
    }
}

/// The size bucket labels, smallest first (`4KiB` .. `inf`).
pub fn size_labels() -> Vec<&'static str> {
    snapshot::SIZE_BUCKETS
        .iter()
        .map(|&b| snapshot::size_bucket(b))
        .chain([snapshot::size_bucket(u64::MAX)])
        .collect()
}

/// What to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Only this experiment (default: all).
    pub experiment: Option<String>,
    /// Only this size bucket label (default: all buckets merged).
    pub size: Option<String>,
    /// Bootstrap seed.
    pub seed: u64,
    /// Bootstrap resamples.
    pub resamples: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            experiment: None,
            size: None,
            seed: DEFAULT_SEED,
            resamples: DEFAULT_RESAMPLES,
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The node the snapshot came from.
    pub node: String,
    /// When the snapshot was taken, ms since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// Seconds the metrics cover.
    pub window_s: f64,
    /// The size bucket reported, `None` for all buckets merged.
    pub size: Option<String>,
    /// Bootstrap seed.
    pub seed: u64,
    /// Bootstrap resamples.
    pub resamples: usize,
    /// Experiments in snapshot order.
    pub experiments: Vec<ExperimentReport>,
    /// Caveats that apply to the whole report.
    pub notes: Vec<String>,
}

/// One experiment.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentReport {
    /// Name.
    pub name: String,
    /// `shard` or `fetch`.
    pub unit: String,
    /// The control arm's name.
    pub control: String,
    /// Arms in config order.
    pub arms: Vec<ArmReport>,
    /// The ramp's step, and whether it halted.
    pub ramp: Option<(usize, bool)>,
    /// What changed this experiment's traffic, oldest first: config
    /// reloads (weights, arms), guardrail trips, probes, recoveries, ramp
    /// steps and operator resets (from the snapshot's event log).
    pub timeline: Vec<shardport_host::snapshot::Event>,
    /// Each non-control arm against the control.
    pub differences: Vec<ArmDiff>,
}

/// One arm's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    /// Arm name.
    pub name: String,
    /// Its transport.
    pub transport: String,
    /// Configured weight.
    pub weight: u32,
    /// Fetches assigned to it.
    pub assigned: u64,
    /// Why the guardrail disabled it, if it did.
    pub disabled: Option<String>,
    /// `enabled`, `tripped` or `probing`.
    pub state: String,
    /// Its share of the experiment's traffic now, when the snapshot says.
    pub share: Option<f64>,
    /// Successful fetches in the selected size buckets.
    pub n: u64,
    /// Nearest-rank p50 latency, ns.
    pub p50_ns: Option<u64>,
    /// Nearest-rank p90 latency, ns.
    pub p90_ns: Option<u64>,
    /// Nearest-rank p99 latency, ns.
    pub p99_ns: Option<u64>,
    /// Successful fetches, all sizes.
    pub fetches: u64,
    /// Failed attempts, all sizes.
    pub errors: u64,
    /// `errors / (fetches + errors)`, all sizes.
    pub error_rate: Option<f64>,
    /// Bytes fetched, all sizes.
    pub bytes: u64,
    /// Bytes per second of fetch time, all sizes; `None` with a size filter
    /// or without latency.
    pub throughput_bytes_per_s: Option<f64>,
    /// Fetches assigned to it that ended on another transport.
    pub downgrades: u64,
    #[serde(skip)]
    histogram: Histogram,
}

impl ArmReport {
    /// The merged latency histogram of the selected size buckets.
    pub fn histogram(&self) -> &Histogram {
        &self.histogram
    }
}

/// One arm against the control.
#[derive(Debug, Clone, Serialize)]
pub struct ArmDiff {
    /// The arm.
    pub arm: String,
    /// The control arm.
    pub control: String,
    /// p50 latency, ns: `arm - control`; ratio `arm / control`.
    pub p50: Difference,
    /// Error rate (a fraction): `arm - control`.
    pub error_rate: Difference,
}

/// What a difference's interval says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole interval is above zero: the arm is higher (slower, more errors).
    Higher,
    /// The whole interval is below zero.
    Lower,
    /// The interval contains zero.
    NoSignificantDifference,
    /// An arm has fewer than [`MIN_SAMPLES`].
    InsufficientData,
}

/// A difference with its bootstrap interval.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    /// What the interval says.
    pub verdict: Verdict,
    /// `arm - control` from the snapshot's own numbers.
    pub estimate: Option<f64>,
    /// Bootstrap 95% interval of `arm - control`.
    pub ci95: Option<(f64, f64)>,
    /// `arm / control` (p50 only, control above zero).
    pub ratio: Option<f64>,
    /// Bootstrap 95% interval of the ratio.
    pub ratio_ci95: Option<(f64, f64)>,
    /// The verdict in words.
    pub summary: String,
}

/// Builds the report: a pure function of the snapshot and the options.
pub fn build(snap: &Snapshot, opts: &Options) -> Result<Report, ReportError> {
    if !(MIN_RESAMPLES..=MAX_RESAMPLES).contains(&opts.resamples) {
        return Err(ReportError::InvalidOption(format!(
            "--resamples {}: expected {MIN_RESAMPLES}..={MAX_RESAMPLES}",
            opts.resamples
        )));
    }
    let size = match &opts.size {
        None => None,
        Some(s) => Some(
            size_labels()
                .into_iter()
                .find(|l| l.eq_ignore_ascii_case(s))
                .ok_or_else(|| ReportError::UnknownSize {
                    size: s.clone(),
                    expected: size_labels(),
                })?,
        ),
    };
    if snap.experiments.is_empty() {
        return Err(ReportError::NoExperiments {
            node: snap.node.clone(),
        });
    }
    let selected: Vec<&ExperimentSnapshot> = match &opts.experiment {
        None => snap.experiments.iter().collect(),
        Some(name) => vec![snap
            .experiments
            .iter()
            .find(|e| &e.name == name)
            .ok_or_else(|| ReportError::UnknownExperiment {
                name: name.clone(),
                node: snap.node.clone(),
                available: snap.experiments.iter().map(|e| e.name.clone()).collect(),
            })?],
    };
    let experiments = selected
        .into_iter()
        .map(|e| experiment(snap, e, size, opts))
        .collect::<Result<Vec<_>, _>>()?;
    let mut notes = Vec::new();
    if let Some(s) = size {
        notes.push(format!(
            "latency is for size bucket {s} only; the snapshot does not split bytes, \
             fetch time or errors by size, so throughput is left out and error rates cover all sizes"
        ));
    }
    Ok(Report {
        node: snap.node.clone(),
        taken_at_unix_ms: snap.taken_at_unix_ms,
        window_s: snap.window_s,
        size: size.map(str::to_owned),
        seed: opts.seed,
        resamples: opts.resamples,
        experiments,
        notes,
    })
}

fn experiment(
    snap: &Snapshot,
    e: &ExperimentSnapshot,
    size: Option<&str>,
    opts: &Options,
) -> Result<ExperimentReport, ReportError> {
    let arms: Vec<ArmReport> = e.arms.iter().map(|a| arm(a, size)).collect();
    let control =
        arms.iter()
            .find(|a| a.name == e.control)
            .ok_or_else(|| ReportError::NoControlArm {
                experiment: e.name.clone(),
                control: e.control.clone(),
                arms: arms.iter().map(|a| a.name.clone()).collect(),
            })?;
    let differences = arms
        .iter()
        .filter(|a| a.name != e.control)
        .map(|a| compare(&e.name, a, control, opts))
        .collect();
    let timeline = snap
        .events
        .iter()
        .filter(|x| {
            // Reload events name no single experiment; their change lines
            // start `experiment NAME:` or `experiment NAME added/removed`.
            let line = |sep: &str| format!("experiment {}{sep}", e.name);
            x.experiment.as_deref() == Some(e.name.as_str())
                || (x.experiment.is_none()
                    && (x.text.contains(&line(":")) || x.text.contains(&line(" "))))
        })
        .cloned()
        .collect();
    Ok(ExperimentReport {
        name: e.name.clone(),
        unit: e.unit.clone(),
        control: e.control.clone(),
        arms,
        ramp: e.ramp_step.map(|s| (s, e.ramp_halted)),
        timeline,
        differences,
    })
}

fn arm(a: &ArmSnapshot, size: Option<&str>) -> ArmReport {
    let s = &a.series;
    let histogram = Histogram::merge(
        s.latency
            .iter()
            .filter(|h| size.is_none_or(|want| h.size == want))
            .map(|h| h.counts.as_slice()),
    );
    let attempts = s.fetches.saturating_add(s.errors);
    ArmReport {
        name: s.name.clone(),
        transport: s.transport.clone(),
        weight: a.weight,
        assigned: a.assigned,
        disabled: a.disabled.clone(),
        state: a.state.clone(),
        share: a.share,
        n: histogram.n(),
        p50_ns: histogram.percentile(500),
        p90_ns: histogram.percentile(900),
        p99_ns: histogram.percentile(990),
        fetches: s.fetches,
        errors: s.errors,
        error_rate: (attempts > 0).then(|| s.errors as f64 / attempts as f64),
        bytes: s.bytes,
        throughput_bytes_per_s: (size.is_none() && s.latency_ns_total > 0)
            .then(|| s.bytes as f64 * 1e9 / s.latency_ns_total as f64),
        downgrades: s.downgrades,
        histogram,
    }
}

/// The 95% interval of bootstrap values (sorts them).
fn interval(values: &mut [f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    Some((
        percentile_f64(values, CI_LOW_PER_MILLE),
        percentile_f64(values, CI_HIGH_PER_MILLE),
    ))
}

fn verdict_of(ci: (f64, f64)) -> Verdict {
    if ci.0 > 0.0 {
        Verdict::Higher
    } else if ci.1 < 0.0 {
        Verdict::Lower
    } else {
        Verdict::NoSignificantDifference
    }
}

fn compare(experiment: &str, arm: &ArmReport, control: &ArmReport, opts: &Options) -> ArmDiff {
    ArmDiff {
        arm: arm.name.clone(),
        control: control.name.clone(),
        p50: compare_p50(experiment, arm, control, opts),
        error_rate: compare_errors(experiment, arm, control, opts),
    }
}

fn insufficient(
    arm: &ArmReport,
    control: &ArmReport,
    what: &str,
    n: fn(&ArmReport) -> u64,
) -> Difference {
    let short: Vec<String> = [arm, control]
        .iter()
        .filter(|a| n(a) < MIN_SAMPLES)
        .map(|a| format!("{} has {} {what}", a.name, n(a)))
        .collect();
    Difference {
        verdict: Verdict::InsufficientData,
        estimate: None,
        ci95: None,
        ratio: None,
        ratio_ci95: None,
        summary: format!(
            "insufficient data: {} (fewer than {MIN_SAMPLES})",
            short.join(", ")
        ),
    }
}

fn compare_p50(
    experiment: &str,
    arm: &ArmReport,
    control: &ArmReport,
    opts: &Options,
) -> Difference {
    let (Some(a50), Some(c50)) = (arm.p50_ns, control.p50_ns) else {
        return insufficient(arm, control, "samples", |a| a.n);
    };
    if arm.n < MIN_SAMPLES || control.n < MIN_SAMPLES {
        return insufficient(arm, control, "samples", |a| a.n);
    }
    let mut rng = Rng::stream(opts.seed, &[experiment, &arm.name, "p50"]);
    let mut diffs = Vec::with_capacity(opts.resamples);
    let mut ratios = Vec::with_capacity(opts.resamples);
    for _ in 0..opts.resamples {
        let c = rng
            .resampled_percentile(&control.histogram, 500)
            .unwrap_or(0) as f64;
        let a = rng.resampled_percentile(&arm.histogram, 500).unwrap_or(0) as f64;
        diffs.push(a - c);
        if c > 0.0 {
            ratios.push(a / c);
        }
    }
    let estimate = a50 as f64 - c50 as f64;
    let ci = interval(&mut diffs).unwrap_or((estimate, estimate));
    let ratio = (c50 > 0).then(|| a50 as f64 / c50 as f64);
    let ratio_ci = interval(&mut ratios);
    let verdict = verdict_of(ci);
    let (a, c) = (&arm.name, &control.name);
    let unit = TimeUnit::for_magnitude(estimate.abs().max(ci.0.abs()).max(ci.1.abs()));
    let u = unit.name();
    let ratio_text = match (ratio, ratio_ci) {
        (Some(r), Some((lo, hi))) => format!("; ratio {r:.2}x (95% CI {lo:.2}x..{hi:.2}x)"),
        _ => String::new(),
    };
    let summary = match verdict {
        Verdict::Higher => format!(
            "{a} is slower than {c} by {} p50 (95% CI {}..{} {u}){ratio_text}",
            unit.show(estimate),
            unit.number(ci.0),
            unit.number(ci.1)
        ),
        Verdict::Lower => format!(
            "{a} is faster than {c} by {} p50 (95% CI {}..{} {u}){ratio_text}",
            unit.show(-estimate),
            unit.number(-ci.1),
            unit.number(-ci.0)
        ),
        _ => format!(
            "no significant difference in p50 between {a} and {c} ({}{}, 95% CI {}..{} {u}){ratio_text}",
            if estimate >= 0.0 { "+" } else { "" },
            unit.show(estimate),
            unit.number(ci.0),
            unit.number(ci.1)
        ),
    };
    Difference {
        verdict,
        estimate: Some(estimate),
        ci95: Some(ci),
        ratio,
        ratio_ci95: ratio_ci,
        summary,
    }
}

fn compare_errors(
    experiment: &str,
    arm: &ArmReport,
    control: &ArmReport,
    opts: &Options,
) -> Difference {
    fn attempts(a: &ArmReport) -> u64 {
        a.fetches.saturating_add(a.errors)
    }
    let (Some(ar), Some(cr)) = (arm.error_rate, control.error_rate) else {
        return insufficient(arm, control, "attempts", attempts);
    };
    if attempts(arm) < MIN_SAMPLES || attempts(control) < MIN_SAMPLES {
        return insufficient(arm, control, "attempts", attempts);
    }
    let mut rng = Rng::stream(opts.seed, &[experiment, &arm.name, "errors"]);
    let (an, cn) = (attempts(arm), attempts(control));
    let mut diffs: Vec<f64> = (0..opts.resamples)
        .map(|_| {
            let c = rng.binomial(cn, cr) as f64 / cn as f64;
            let a = rng.binomial(an, ar) as f64 / an as f64;
            a - c
        })
        .collect();
    let estimate = ar - cr;
    let ci = interval(&mut diffs).unwrap_or((estimate, estimate));
    let verdict = verdict_of(ci);
    let pp = |x: f64| format!("{:.2}", x * 100.0);
    let (a, c) = (&arm.name, &control.name);
    let summary = match verdict {
        Verdict::Higher => format!(
            "{a} has a higher error rate than {c} by {} pp (95% CI {}..{} pp)",
            pp(estimate),
            pp(ci.0),
            pp(ci.1)
        ),
        Verdict::Lower => format!(
            "{a} has a lower error rate than {c} by {} pp (95% CI {}..{} pp)",
            pp(-estimate),
            pp(-ci.1),
            pp(-ci.0)
        ),
        _ => format!(
            "no significant difference in error rate between {a} and {c} ({}{} pp, 95% CI {}..{} pp)",
            if estimate >= 0.0 { "+" } else { "" },
            pp(estimate),
            pp(ci.0),
            pp(ci.1)
        ),
    };
    Difference {
        verdict,
        estimate: Some(estimate),
        ci95: Some(ci),
        ratio: None,
        ratio_ci95: None,
        summary,
    }
}

impl Report {
    /// The latency CDF per arm as an SVG document, one panel per experiment.
    pub fn plot_svg(&self) -> String {
        let sizes = self.size.as_deref().unwrap_or("all sizes");
        let panels: Vec<plot::Panel<'_>> = self
            .experiments
            .iter()
            .map(|e| plot::Panel {
                title: format!(
                    "latency CDF, experiment {} ({sizes}, node {})",
                    e.name, self.node
                ),
                series: e
                    .arms
                    .iter()
                    .map(|a| plot::Series {
                        label: if a.disabled.is_some() {
                            format!("{} (disabled)", a.name)
                        } else {
                            a.name.clone()
                        },
                        histogram: &a.histogram,
                    })
                    .collect(),
            })
            .collect();
        plot::svg(&panels)
    }
}

#[cfg(test)]
mod tests;
