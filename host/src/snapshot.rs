//! The metrics snapshot: the JSON form of a node's metrics at one moment.
//!
//! `GET /v1/metrics.json` on the control endpoint returns it, `Node::metrics_snapshot`
//! builds it, and `shardport ab report` reads it (from a file or by scraping a
//! node). It is a stable, versioned format (`format = "shardport-metrics/1"`):
//! fields are only ever added.
//!
//! Latency histograms are carried as the recorded values of an HDR histogram
//! (`[value_ns, count]` pairs, values being each bucket's highest equivalent
//! value at 2 significant digits), per size bucket. That keeps the snapshot
//! readable, lets a report merge buckets and resample (bootstrap) without
//! the raw samples, and lets tests write synthetic snapshots by hand.

use serde::{Deserialize, Serialize};

/// Format tag of this version of the snapshot.
pub const FORMAT: &str = "shardport-metrics/1";

/// Upper bounds (inclusive, bytes) of the size buckets latencies are kept
/// in; a shard larger than the last bound goes to the `inf` bucket.
pub const SIZE_BUCKETS: [u64; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];

/// Label of the size bucket a shard of `len` bytes falls in
/// (`4KiB`, `64KiB`, `1MiB`, `16MiB`, `256MiB`, `inf`).
pub fn size_bucket(len: u64) -> &'static str {
    const LABELS: [&str; 6] = ["4KiB", "64KiB", "1MiB", "16MiB", "256MiB", "inf"];
    let i = SIZE_BUCKETS
        .iter()
        .position(|&b| len <= b)
        .unwrap_or(SIZE_BUCKETS.len());
    LABELS[i]
}

/// Upper bound in bytes of a size bucket label (`None` for `inf` or an
/// unknown label).
pub fn size_bucket_bound(label: &str) -> Option<u64> {
    SIZE_BUCKETS
        .iter()
        .copied()
        .find(|&b| size_bucket(b) == label)
}

/// A node's metrics at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Always [`FORMAT`].
    pub format: String,
    /// The node's name (`node.name`).
    pub node: String,
    /// When the snapshot was taken, ms since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// Seconds the metrics cover (since the node started).
    pub window_s: f64,
    /// Per transport, every fetch through it (experiment arms included).
    pub transports: Vec<Series>,
    /// Per experiment, per arm.
    #[serde(default)]
    pub experiments: Vec<ExperimentSnapshot>,
    /// Fetches that fell back from a faster candidate.
    pub downgrades: u64,
    /// Fetches that found no candidate transport at all.
    pub no_candidate: u64,
    /// Retries of attempts whose transport said a limit was exhausted
    /// (`fetch.exhausted-wait`).
    #[serde(default)]
    pub exhausted_waits: u64,
    /// Bytes of owned storage leaked because a transport could not unexport.
    #[serde(default)]
    pub leaked_bytes: u64,
    /// Gauges (cache, store, per-transport plugin stats), by name.
    #[serde(default)]
    pub gauges: Vec<Gauge>,
    /// Config reloads applied since the node started.
    #[serde(default)]
    pub reloads: u64,
    /// Config reloads refused (the running config stayed).
    #[serde(default)]
    pub reloads_refused: u64,
    /// What changed traffic, oldest first (reloads, weight changes, trips,
    /// probes, recoveries, ramp steps; the last [`MAX_EVENTS`]).
    #[serde(default)]
    pub events: Vec<Event>,
}

/// Most events a snapshot carries (older ones are dropped).
pub const MAX_EVENTS: usize = 256;

/// One change of a node's traffic, for the `ab report` timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// `reload`, `reload-refused`, `weights`, `trip`, `probe`, `recover`,
    /// `ramp-step`, `ramp-halt`, `reset`.
    pub kind: String,
    /// The experiment concerned, if one.
    #[serde(default)]
    pub experiment: Option<String>,
    /// What happened, one line.
    pub text: String,
}

/// One named gauge with labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gauge {
    /// snake_case name, e.g. `cache_bytes`, `transport_stat`.
    pub name: String,
    /// Label pairs, e.g. `[["transport", "posix-shm"], ["stat", "pool_bytes_used"]]`.
    #[serde(default)]
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// Counters and latency histograms of one transport or experiment arm.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Series {
    /// The transport name, or for an arm, the arm name.
    pub name: String,
    /// The transport the series measures.
    pub transport: String,
    /// Successful fetches.
    pub fetches: u64,
    /// Bytes fetched successfully.
    pub bytes: u64,
    /// Failed fetch attempts.
    pub errors: u64,
    /// Fetches that used this transport after a faster one failed, or (for an
    /// arm) fetches assigned to this arm that ended on another transport.
    pub downgrades: u64,
    /// Sum of successful fetch latencies, ns.
    pub latency_ns_total: u64,
    /// Latency histograms of successful fetches, per size bucket (only
    /// buckets that saw a fetch).
    #[serde(default)]
    pub latency: Vec<SizeHistogram>,
}

/// The latency histogram of one size bucket.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SizeHistogram {
    /// Size bucket label (see [`size_bucket`]).
    pub size: String,
    /// `[value_ns, count]` pairs, ascending by value.
    pub counts: Vec<(u64, u64)>,
    /// Exact sum of the recorded latencies, ns.
    #[serde(default)]
    pub sum_ns: u64,
}

impl SizeHistogram {
    /// Number of samples.
    pub fn n(&self) -> u64 {
        self.counts.iter().map(|&(_, c)| c).sum()
    }
}

/// An experiment and its arms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentSnapshot {
    /// Experiment name.
    pub name: String,
    /// `shard` (sticky per shard id) or `fetch`.
    pub unit: String,
    /// Name of the control arm (the first arm in the config).
    pub control: String,
    /// Arms in config order.
    pub arms: Vec<ArmSnapshot>,
    /// The ramp's current step (0-based) when the experiment has a ramp.
    #[serde(default)]
    pub ramp_step: Option<usize>,
    /// The ramp stopped because its arm tripped.
    #[serde(default)]
    pub ramp_halted: bool,
}

fn enabled() -> String {
    "enabled".to_owned()
}

/// One arm of an experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmSnapshot {
    /// Configured weight.
    pub weight: u32,
    /// `enabled`, `tripped` or `probing` (half-open).
    #[serde(default = "enabled")]
    pub state: String,
    /// The arm's share of traffic now (weights, ramp step; disabled arms 0).
    #[serde(default)]
    pub share: Option<f64>,
    /// Fetches assigned to this arm (successful or not).
    pub assigned: u64,
    /// `Some(why)` when the guardrail disabled the arm; its traffic goes to
    /// the control arm from then on.
    #[serde(default)]
    pub disabled: Option<String>,
    /// Times the guardrail disabled this arm.
    #[serde(default)]
    pub guardrail_trips: u64,
    /// Fetches drawn for this arm that went to the control arm because this
    /// arm was disabled.
    #[serde(default)]
    pub redirected: u64,
    /// Counters and histograms of the fetches assigned to this arm.
    #[serde(flatten)]
    pub series: Series,
}
