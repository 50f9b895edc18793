//! Per-node fetch metrics: per transport and per experiment arm, counters
//! (fetches, bytes, errors, downgrades) and HDR latency histograms by size
//! bucket; node-wide downgrades, fetches without a candidate and leaked
//! bytes. Counters are lock-free; each histogram has its own small lock,
//! created on the first fetch of its size bucket. Transports and arms are
//! registered by name, so their series survive config reloads (a transport
//! or arm a reload removes keeps its totals; one it adds starts at zero).
//! A bounded event log records what changed traffic (reloads, trips, ramps).
//!
//! [`Metrics::snapshot`] gives the JSON [`Snapshot`]; [`prometheus`] renders
//! a snapshot in the Prometheus text exposition format (0.0.4), so the two
//! views always agree.

use std::{
    collections::BTreeMap,
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, RwLock,
    },
    time::Duration,
};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::snapshot::{
    size_bucket, Event, Series, SizeHistogram, Snapshot, MAX_EVENTS, SIZE_BUCKETS,
};

/// Highest latency a histogram tracks (1 hour); longer ones are clamped.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// A size bucket's latency histogram and the exact sum of what it recorded.
type SizeSlot = Mutex<Option<(Histogram<u64>, u64)>>;

/// Counters and histograms of one transport or arm.
#[derive(Default)]
struct SeriesState {
    fetches: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    downgrades: AtomicU64,
    latency_ns: AtomicU64,
    /// One per size bucket (`SIZE_BUCKETS` plus the `inf` bucket).
    hist: [SizeSlot; SIZE_BUCKETS.len() + 1],
}

/// Histograms made when the first node of the process started, handed to
/// the first series that need one.
static SPARE_HISTOGRAMS: Mutex<Vec<Histogram<u64>>> = Mutex::new(Vec::new());
/// How many: one per transport of a typical node (shared memory, http,
/// cuda-ipc) and one more, about 30 KiB each.
const SPARE: usize = 4;

/// A latency histogram as every series makes them (on the first fetch of
/// its size bucket): a spare one when left.
fn new_histogram() -> Histogram<u64> {
    let spare = SPARE_HISTOGRAMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop();
    spare.unwrap_or_else(make_histogram)
}

fn make_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 2).expect("valid histogram bounds")
}

/// Makes the spare histograms, once per process, when the first node
/// starts: a process's first histograms cost tens of microseconds of
/// first-use work (libm's `log2` and its tables faulted in, fresh heap
/// pages allocated and zeroed: 40-55% of a fresh process's first fetch,
/// profiled), which belongs to the node's start, not to the first fetches
/// a caller times.
fn warm_histograms() {
    static WARM: std::sync::Once = std::sync::Once::new();
    WARM.call_once(|| {
        let made: Vec<Histogram<u64>> = (0..SPARE).map(|_| make_histogram()).collect();
        SPARE_HISTOGRAMS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(made);
    });
}

fn bucket_index(len: u64) -> usize {
    SIZE_BUCKETS
        .iter()
        .position(|&b| len <= b)
        .unwrap_or(SIZE_BUCKETS.len())
}

impl SeriesState {
    fn ok(&self, bytes: u64, latency: Duration) {
        let ns = (latency.as_nanos().min(u128::from(MAX_LATENCY_NS)) as u64).max(1);
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.latency_ns.fetch_add(ns, Ordering::Relaxed);
        let mut slot = self.hist[bucket_index(bytes)]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (h, sum) = slot.get_or_insert_with(|| (new_histogram(), 0));
        h.saturating_record(ns);
        *sum += ns;
    }

    fn series(&self, name: &str, transport: &str) -> Series {
        let mut latency = Vec::new();
        for (i, slot) in self.hist.iter().enumerate() {
            let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            let Some((h, sum)) = slot.as_ref() else {
                continue;
            };
            let bound = SIZE_BUCKETS.get(i).copied().unwrap_or(u64::MAX);
            latency.push(SizeHistogram {
                size: size_bucket(bound).to_owned(),
                counts: h
                    .iter_recorded()
                    .map(|v| {
                        (
                            h.highest_equivalent(v.value_iterated_to()),
                            v.count_at_value(),
                        )
                    })
                    .collect(),
                sum_ns: *sum,
            });
        }
        Series {
            name: name.to_owned(),
            transport: transport.to_owned(),
            fetches: self.fetches.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            downgrades: self.downgrades.load(Ordering::Relaxed),
            latency_ns_total: self.latency_ns.load(Ordering::Relaxed),
            latency,
        }
    }
}

/// The counters of one experiment arm (shared by every config generation
/// that has an arm of this experiment and name).
#[derive(Default)]
pub struct ArmCounters {
    series: SeriesState,
    assigned: AtomicU64,
    redirected: AtomicU64,
    /// Guardrail trips: kept by experiment and arm name for the node's
    /// life, so the counter never goes back across reloads.
    trips: AtomicU64,
}

impl std::fmt::Debug for ArmCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArmCounters")
            .field("assigned", &self.assigned.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ArmCounters {
    /// A fetch was assigned to this arm.
    pub fn assigned(&self) {
        self.assigned.fetch_add(1, Ordering::Relaxed);
    }

    /// A fetch drawn for this arm went to the control arm instead.
    pub fn redirected(&self) {
        self.redirected.fetch_add(1, Ordering::Relaxed);
    }

    /// The guardrail switched this arm off.
    pub fn tripped(&self) {
        self.trips.fetch_add(1, Ordering::Relaxed);
    }

    /// Guardrail trips of this arm since the node started.
    pub fn trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    /// The arm's transport served the fetch.
    pub fn ok(&self, bytes: u64, latency: Duration) {
        self.series.ok(bytes, latency);
    }

    /// The arm's transport failed the fetch (`then_served`: another
    /// transport served it afterwards, a downgrade).
    pub fn error(&self, then_served: bool) {
        self.series.errors.fetch_add(1, Ordering::Relaxed);
        if then_served {
            self.series.downgrades.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Metrics of one node.
pub struct Metrics {
    per_transport: RwLock<BTreeMap<String, Arc<SeriesState>>>,
    /// Per (experiment, arm) name.
    arms: Mutex<BTreeMap<(String, String), Arc<ArmCounters>>>,
    no_candidate: AtomicU64,
    exhausted_waits: AtomicU64,
    downgrades: AtomicU64,
    leaked_bytes: AtomicU64,
    reloads: AtomicU64,
    reloads_refused: AtomicU64,
    events: Mutex<VecDeque<Event>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("transports", &self.transport_totals())
            .finish()
    }
}

/// One transport's counters at a point in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TransportSnapshot {
    /// Successful fetches.
    pub fetches: u64,
    /// Bytes fetched.
    pub bytes: u64,
    /// Failed attempts.
    pub errors: u64,
    /// Sum of fetch latencies in ns.
    pub latency_ns_total: u64,
}

/// What an experiment arm is, for a snapshot (names and live state come
/// from the node).
#[derive(Debug, Clone)]
pub struct ArmInfo {
    /// Arm name.
    pub name: String,
    /// Its transport.
    pub transport: String,
    /// Its weight.
    pub weight: u32,
    /// Why the guardrail disabled it, if it did.
    pub disabled: Option<String>,
    /// `enabled`, `tripped` or `probing`.
    pub state: &'static str,
    /// Its share of traffic now.
    pub share: f64,
    /// Its counters.
    pub counters: Arc<ArmCounters>,
}

/// What an experiment is, for a snapshot.
#[derive(Debug, Clone)]
pub struct ExperimentInfo {
    /// Name.
    pub name: String,
    /// Unit (`shard` / `fetch`).
    pub unit: String,
    /// Arms in config order; the first is the control.
    pub arms: Vec<ArmInfo>,
    /// The ramp's step and whether it halted.
    pub ramp: Option<(usize, bool)>,
}

impl Metrics {
    /// Metrics for these transports (more are added by [`add_transport`](Self::add_transport)).
    pub fn new(transports: impl IntoIterator<Item = String>) -> Self {
        warm_histograms();
        Metrics {
            per_transport: RwLock::new(
                transports
                    .into_iter()
                    .map(|t| (t, Arc::default()))
                    .collect(),
            ),
            arms: Mutex::default(),
            no_candidate: AtomicU64::new(0),
            exhausted_waits: AtomicU64::new(0),
            downgrades: AtomicU64::new(0),
            leaked_bytes: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            reloads_refused: AtomicU64::new(0),
            events: Mutex::default(),
        }
    }

    /// Starts counting `transport` (no-op when it is counted already).
    pub fn add_transport(&self, transport: &str) {
        let mut map = self
            .per_transport
            .write()
            .unwrap_or_else(|p| p.into_inner());
        map.entry(transport.to_owned()).or_default();
    }

    fn transport(&self, transport: &str) -> Option<Arc<SeriesState>> {
        let map = self.per_transport.read().unwrap_or_else(|p| p.into_inner());
        map.get(transport).cloned()
    }

    /// The counters of arm `arm` of experiment `experiment` (created on
    /// first use; the same ones across reloads).
    pub fn arm_counters(&self, experiment: &str, arm: &str) -> Arc<ArmCounters> {
        let mut map = self.arms.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            map.entry((experiment.to_owned(), arm.to_owned()))
                .or_default(),
        )
    }

    /// A reload was applied (`true`) or refused.
    pub fn reload(&self, applied: bool) {
        let c = if applied {
            &self.reloads
        } else {
            &self.reloads_refused
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends to the event log (the oldest event goes past [`MAX_EVENTS`]).
    pub fn event(&self, at_unix_ms: u64, kind: &str, experiment: Option<&str>, text: String) {
        let mut log = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() == MAX_EVENTS {
            log.pop_front();
        }
        log.push_back(Event {
            at_unix_ms,
            kind: kind.to_owned(),
            experiment: experiment.map(str::to_owned),
            text,
        });
    }

    /// A successful fetch.
    pub fn fetch_ok(&self, transport: &str, bytes: u64, latency: Duration) {
        if let Some(c) = self.transport(transport) {
            c.ok(bytes, latency);
        }
    }

    /// A failed attempt (`None`: no candidate at all).
    pub fn fetch_error(&self, transport: Option<&str>) {
        match transport.and_then(|t| self.transport(t)) {
            Some(c) => c.errors.fetch_add(1, Ordering::Relaxed),
            None => self.no_candidate.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// A downgrade: `served_by` served a fetch after a faster candidate failed.
    pub fn downgrade(&self, served_by: &str) {
        self.downgrades.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.transport(served_by) {
            c.downgrades.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Owned bytes leaked because a transport failed to unexport them.
    pub fn leaked_storage(&self, bytes: u64) {
        self.leaked_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes leaked so far (see [`leaked_storage`](Self::leaked_storage)).
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked_bytes.load(Ordering::Relaxed)
    }

    /// Fetches that found no candidate transport.
    pub fn no_candidate(&self) -> u64 {
        self.no_candidate.load(Ordering::Relaxed)
    }

    /// A fetch attempt retried after its transport said a limit was
    /// exhausted.
    pub fn exhausted_wait(&self) {
        self.exhausted_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Downgrades so far.
    pub fn downgrades(&self) -> u64 {
        self.downgrades.load(Ordering::Relaxed)
    }

    /// Per-transport totals.
    pub fn transport_totals(&self) -> BTreeMap<String, TransportSnapshot> {
        self.per_transport
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(t, c)| {
                (
                    t.clone(),
                    TransportSnapshot {
                        fetches: c.fetches.load(Ordering::Relaxed),
                        bytes: c.bytes.load(Ordering::Relaxed),
                        errors: c.errors.load(Ordering::Relaxed),
                        latency_ns_total: c.latency_ns.load(Ordering::Relaxed),
                    },
                )
            })
            .collect()
    }

    /// The full snapshot; `experiments` names what the arm indices mean.
    pub fn snapshot(
        &self,
        node: &str,
        taken_at_unix_ms: u64,
        window_s: f64,
        experiments: &[ExperimentInfo],
        gauges: Vec<crate::snapshot::Gauge>,
    ) -> Snapshot {
        Snapshot {
            format: crate::snapshot::FORMAT.to_owned(),
            node: node.to_owned(),
            taken_at_unix_ms,
            window_s,
            transports: self
                .per_transport
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(t, c)| c.series(t, t))
                .collect(),
            experiments: experiments
                .iter()
                .map(|e| crate::snapshot::ExperimentSnapshot {
                    name: e.name.clone(),
                    unit: e.unit.clone(),
                    control: e.arms.first().map(|a| a.name.clone()).unwrap_or_default(),
                    arms: e
                        .arms
                        .iter()
                        .map(|a| crate::snapshot::ArmSnapshot {
                            weight: a.weight,
                            state: a.state.to_owned(),
                            share: Some(a.share),
                            assigned: a.counters.assigned.load(Ordering::Relaxed),
                            disabled: a.disabled.clone(),
                            guardrail_trips: a.counters.trips(),
                            redirected: a.counters.redirected.load(Ordering::Relaxed),
                            series: a.counters.series.series(&a.name, &a.transport),
                        })
                        .collect(),
                    ramp_step: e.ramp.map(|(s, _)| s),
                    ramp_halted: e.ramp.is_some_and(|(_, h)| h),
                })
                .collect(),
            downgrades: self.downgrades(),
            no_candidate: self.no_candidate(),
            exhausted_waits: self.exhausted_waits.load(Ordering::Relaxed),
            leaked_bytes: self.leaked_bytes(),
            gauges,
            reloads: self.reloads.load(Ordering::Relaxed),
            reloads_refused: self.reloads_refused.load(Ordering::Relaxed),
            events: self
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned()
                .collect(),
        }
    }
}

mod exposition;

pub use exposition::prometheus;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Gauge;

    fn sample_snapshot() -> Snapshot {
        let m = Metrics::new(["posix-shm".to_owned(), "http".to_owned()]);
        let (c0, c1) = (
            m.arm_counters("shm-vs-http", "control"),
            m.arm_counters("shm-vs-http", "canary"),
        );
        m.fetch_ok("posix-shm", 4096, Duration::from_micros(3));
        m.fetch_ok("posix-shm", 4096, Duration::from_micros(5));
        m.fetch_ok("posix-shm", 8 << 20, Duration::from_millis(2));
        m.fetch_ok("http", 4096, Duration::from_micros(45));
        m.fetch_error(Some("posix-shm"));
        m.downgrade("http");
        c0.assigned();
        c1.assigned();
        c0.assigned();
        c1.redirected();
        c0.ok(4096, Duration::from_micros(3));
        c1.error(true);
        c1.tripped();
        let exps = [ExperimentInfo {
            name: "shm-vs-http".into(),
            unit: "shard".into(),
            arms: vec![
                ArmInfo {
                    name: "control".into(),
                    transport: "posix-shm".into(),
                    weight: 90,
                    disabled: None,
                    state: "enabled",
                    share: 1.0,
                    counters: Arc::clone(&c0),
                },
                ArmInfo {
                    name: "canary".into(),
                    transport: "http".into(),
                    weight: 10,
                    disabled: Some("error rate".into()),
                    state: "tripped",
                    share: 0.0,
                    counters: c1,
                },
            ],
            ramp: None,
        }];
        let gauges = vec![
            Gauge {
                name: "cache_bytes".into(),
                labels: vec![],
                value: 4096.0,
            },
            Gauge {
                name: "plugin_current".into(),
                labels: vec![
                    ("transport".into(), "posix-shm".into()),
                    ("stat".into(), "pool_bytes_used".into()),
                ],
                value: 123.0,
            },
        ];
        m.snapshot("n1", 1, 2.0, &exps, gauges)
    }

    #[test]
    fn snapshot_counts_and_histograms() {
        let s = sample_snapshot();
        let shm = s.transports.iter().find(|t| t.name == "posix-shm").unwrap();
        assert_eq!(
            (shm.fetches, shm.errors, shm.bytes),
            (3, 1, 8192 + (8 << 20))
        );
        let small = shm.latency.iter().find(|h| h.size == "4KiB").unwrap();
        assert_eq!(small.n(), 2);
        assert_eq!(small.sum_ns, 8_000);
        // 2 significant digits: each value within 1% of what was recorded.
        let values: Vec<u64> = small.counts.iter().map(|&(v, _)| v).collect();
        assert!(
            (2_970..=3_030).contains(&values[0]) && (4_950..=5_050).contains(&values[1]),
            "{values:?}"
        );
        assert!(shm.latency.iter().any(|h| h.size == "16MiB" && h.n() == 1));
        let http = s.transports.iter().find(|t| t.name == "http").unwrap();
        assert_eq!(http.downgrades, 1);
        let e = &s.experiments[0];
        assert_eq!(e.control, "control");
        assert_eq!((e.arms[0].assigned, e.arms[0].series.fetches), (2, 1));
        assert_eq!((e.arms[1].assigned, e.arms[1].redirected), (1, 1));
        assert_eq!(
            (e.arms[1].series.errors, e.arms[1].series.downgrades),
            (1, 1)
        );
        let back: Snapshot = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s, "JSON round trip");
    }

    #[test]
    fn prometheus_text_parses_with_a_real_parser() {
        let s = sample_snapshot();
        let text = prometheus(&s);
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        let find = |metric: &str, pairs: &[(&str, &str)]| {
            scrape
                .samples
                .iter()
                .find(|x| {
                    x.metric == metric && pairs.iter().all(|(k, v)| x.labels.get(k) == Some(*v))
                })
                .unwrap_or_else(|| panic!("no {metric} {pairs:?} in\n{text}"))
        };
        match find("shardport_fetches_total", &[("transport", "posix-shm")]).value {
            prometheus_parse::Value::Counter(v) => assert_eq!(v, 3.0),
            ref other => panic!("{other:?}"),
        }
        match &find(
            "shardport_fetch_latency_seconds",
            &[("transport", "posix-shm"), ("size", "4KiB")],
        )
        .value
        {
            prometheus_parse::Value::Histogram(buckets) => {
                let at = |le: f64| buckets.iter().find(|b| b.less_than == le).unwrap().count;
                assert_eq!(at(2e-6), 0.0);
                assert_eq!(at(5e-6), 1.0, "3 us is under 5 us; 5 us (+1%) is not");
                assert_eq!(at(1e-5), 2.0);
                assert_eq!(at(f64::INFINITY), 2.0);
            }
            other => panic!("{other:?}"),
        }
        match find(
            "shardport_experiment_arm_enabled",
            &[("experiment", "shm-vs-http"), ("arm", "canary")],
        )
        .value
        {
            prometheus_parse::Value::Gauge(v) => assert_eq!(v, 0.0),
            ref other => panic!("{other:?}"),
        }
        match find(
            "shardport_plugin_current",
            &[("transport", "posix-shm"), ("stat", "pool_bytes_used")],
        )
        .value
        {
            prometheus_parse::Value::Gauge(v) => assert_eq!(v, 123.0),
            ref other => panic!("{other:?}"),
        }
        // Every family has exactly one TYPE line.
        let mut types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let n = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), n, "duplicate TYPE lines");
    }
}
