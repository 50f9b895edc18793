//! Stats, metrics, sweeps, experiment resets and cache maintenance.

use std::{collections::BTreeMap, sync::Arc};

use shardport_abi::{ErrorKind, StatKind};

use super::{lock, Node, NodeStats, PluginStats, SweepResult};
use crate::{
    cache::CacheStats,
    experiment::{shares, ArmEvent},
    metrics::{ArmInfo, ExperimentInfo},
    snapshot::{Gauge, Snapshot},
};

impl Node {
    /// Re-enables the arms the guardrail disabled in experiment `name`
    /// (every experiment when `None`). Returns `(experiment, arm)` names
    /// re-enabled; an unknown name is an error naming the known ones.
    pub fn reset_experiments(&self, name: Option<&str>) -> Result<Vec<(String, String)>, String> {
        let g = self.inner.live();
        let exps = &g.config.experiments;
        if let Some(n) = name {
            if !exps.iter().any(|e| e.name == n) {
                let known: Vec<&str> = exps.iter().map(|e| e.name.as_str()).collect();
                return Err(format!(
                    "no experiment `{n}` (configured: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        }
        let mut out = Vec::new();
        let now = self.inner.clock.monotonic_nanos();
        for (e, st) in exps.iter().zip(&g.experiments) {
            if name.is_none_or(|n| n == e.name) {
                let (arms, resumed) = st.reset(e, now);
                if resumed {
                    let step = st.ramp().map_or(0, |(s, _)| s);
                    tracing::info!(target: "experiment", experiment = %e.name, step, "ramp resumed");
                    self.inner.event(
                        "reset",
                        Some(&e.name),
                        format!(
                            "ramp resumed by an operator at step {step}: its next step one interval from now"
                        ),
                    );
                }
                for a in arms {
                    tracing::info!(target: "experiment", experiment = %e.name, arm = %e.arms[a].name, "arm re-enabled");
                    self.inner.event(
                        "reset",
                        Some(&e.name),
                        format!("arm {} re-enabled by an operator", e.arms[a].name),
                    );
                    out.push((e.name.clone(), e.arms[a].name.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Shards this node owns and their bytes.
    pub(super) fn owned_totals(&self) -> (usize, u64) {
        let shards = lock(&self.inner.shards);
        (
            shards.len(),
            shards.values().map(|s| s.stored.bytes().len() as u64).sum(),
        )
    }

    /// The node's metrics as a snapshot (the JSON of `/v1/metrics.json`;
    /// [`crate::metrics::prometheus`] renders it for `/metrics`).
    pub fn metrics_snapshot(&self) -> Snapshot {
        let live = self.inner.live();
        let experiments: Vec<ExperimentInfo> = live
            .config
            .experiments
            .iter()
            .zip(&live.experiments)
            .zip(&live.arm_counters)
            .map(|((e, st), counters)| {
                let phases = st.phases();
                let shares = shares(e, &st.gate(e));
                ExperimentInfo {
                    name: e.name.clone(),
                    unit: e.unit.to_string(),
                    arms: e
                        .arms
                        .iter()
                        .enumerate()
                        .map(|(i, a)| ArmInfo {
                            name: a.name.clone(),
                            transport: a.transport.to_string(),
                            weight: a.weight,
                            disabled: st.disabled_reason(i),
                            state: phases[i].name(),
                            share: shares[i],
                            counters: Arc::clone(&counters[i]),
                        })
                        .collect(),
                    ramp: st.ramp(),
                }
            })
            .collect();
        let cache = self.cache_stats();
        let (shards_owned, bytes_owned) = self.owned_totals();
        let g = |name: &str, labels: Vec<(String, String)>, value: f64| Gauge {
            name: name.to_owned(),
            labels,
            value,
        };
        let mut gauges = vec![
            g("cache_entries", vec![], cache.entries as f64),
            g("cache_bytes", vec![], cache.bytes as f64),
            g("cache_held_entries", vec![], cache.held as f64),
            g("cache_evicted_total", vec![], cache.evicted as f64),
            g("cache_hits_total", vec![], cache.hits as f64),
            g("shards_owned", vec![], shards_owned as f64),
            g("bytes_owned", vec![], bytes_owned as f64),
        ];
        for p in &live.plugins {
            for st in p.transport.stats() {
                let name = if st.kind == StatKind::COUNTER {
                    "plugin_events_total"
                } else {
                    "plugin_current"
                };
                gauges.push(g(
                    name,
                    vec![
                        ("transport".to_owned(), p.name.to_string()),
                        ("stat".to_owned(), st.name.to_string()),
                    ],
                    st.value as f64,
                ));
            }
        }
        let window_ns = self
            .inner
            .clock
            .monotonic_nanos()
            .saturating_sub(self.inner.started_ns);
        self.inner.metrics.snapshot(
            &live.config.node.name,
            self.inner.clock.now_unix_nanos() / 1_000_000,
            window_ns as f64 / 1e9,
            &experiments,
            gauges,
        )
    }

    /// Applies the cache policy now (TTL expiry happens here and at each
    /// insert); returns how many entries left.
    pub fn evict_expired(&self) -> usize {
        let now = self.inner.clock.monotonic_nanos();
        let removed = lock(&self.inner.cache).evict(now);
        removed.len()
    }

    /// Cache counters and gauges.
    pub fn cache_stats(&self) -> CacheStats {
        lock(&self.inner.cache).stats(self.inner.clock.monotonic_nanos())
    }

    /// Runs every transport's `sweep` (reclaiming what dead processes left
    /// behind) and the cache's expiry. Returns, per transport, its reclaim
    /// counters, or why it could not sweep; transports with nothing to sweep
    /// are left out.
    pub fn sweep(&self) -> Vec<(String, SweepResult)> {
        self.evict_expired();
        // Drops plugins a reload removed once nothing holds them.
        let _ = self.draining();
        let mut out = Vec::new();
        for p in &self.inner.live().plugins {
            match p.transport.sweep().into_result() {
                Ok(stats) => {
                    let stats: BTreeMap<String, u64> = stats
                        .into_iter()
                        .map(|s| (s.name.to_string(), s.value))
                        .collect();
                    if stats.values().any(|&v| v > 0) {
                        tracing::info!(target: "cleanup", transport = %p.name, ?stats, "swept");
                    }
                    out.push((p.name.to_string(), Ok(stats)));
                }
                Err(e) if e.kind == ErrorKind::UNSUPPORTED => {}
                // A transport that cannot work here (cuda-ipc without a
                // GPU) has nothing to sweep: reported, not warned about.
                Err(e) if e.kind == ErrorKind::UNAVAILABLE => {
                    tracing::debug!(target: "cleanup", transport = %p.name, error = %e, "sweep skipped: transport unavailable here");
                    out.push((p.name.to_string(), Err(e.to_string())));
                }
                Err(e) => {
                    tracing::warn!(target: "cleanup", transport = %p.name, error = %e, "sweep failed");
                    out.push((p.name.to_string(), Err(e.to_string())));
                }
            }
        }
        out
    }

    /// [`sweep`](Self::sweep) as JSON: transport -> its counters, or `{"error": ...}`.
    pub fn sweep_json(&self) -> serde_json::Value {
        let report: serde_json::Map<String, serde_json::Value> = self
            .sweep()
            .into_iter()
            .map(|(t, r)| {
                let v = match r {
                    Ok(stats) => serde_json::json!(stats),
                    Err(e) => serde_json::json!({ "error": e }),
                };
                (t, v)
            })
            .collect();
        serde_json::Value::Object(report)
    }

    /// Drops every cached fetched shard; returns how many.
    pub fn drain_all(&self) -> usize {
        let removed = lock(&self.inner.cache).clear();
        removed.len()
    }

    /// A snapshot of the node's state and its plugins' stats.
    pub fn stats(&self) -> NodeStats {
        let (shards_owned, bytes_owned) = self.owned_totals();
        let cache = self.cache_stats();
        let live = self.inner.live();
        let plugins = live
            .plugins
            .iter()
            .map(|p| {
                let health = p.transport.health();
                PluginStats {
                    name: p.name.to_string(),
                    path: p.path.display().to_string(),
                    version: p.plugin_version.clone(),
                    abi_version: p.abi_version.clone(),
                    capabilities: p.capabilities().names(),
                    healthy: health.ok,
                    health: health.message.to_string(),
                    stats: p
                        .transport
                        .stats()
                        .into_iter()
                        .map(|s| {
                            let suffix = if s.kind == StatKind::COUNTER {
                                "_total"
                            } else {
                                ""
                            };
                            let name = s.name.to_string();
                            let name = if name.ends_with(suffix) {
                                name
                            } else {
                                format!("{name}{suffix}")
                            };
                            (name, s.value)
                        })
                        .collect(),
                }
            })
            .collect();
        NodeStats {
            node: live.config.node.name.clone(),
            tag: self.inner.tag.clone(),
            shards_owned,
            bytes_owned,
            cache_entries: cache.entries,
            cache_bytes: cache.bytes,
            cache,
            copy_buffers: self.inner.copy_buffers.stats(),
            plugins,
            load_failures: live.load_failures.clone(),
            draining: self.draining(),
            generation: live.number,
            transports: self.inner.metrics.transport_totals(),
            downgrades: self.inner.metrics.downgrades(),
            no_candidate: self.inner.metrics.no_candidate(),
            leaked_bytes: self.inner.metrics.leaked_bytes(),
        }
    }

    /// Calls every loaded transport's `describe` and `health` (used by `shardport plugins`).
    pub fn plugin_report(&self) -> Vec<(String, bool, String)> {
        self.inner
            .live()
            .plugins
            .iter()
            .map(|p| {
                let h = p.transport.health();
                (p.name.to_string(), h.ok, h.message.to_string())
            })
            .collect()
    }
}

impl Node {
    /// Logs an experiment's arm event and adds it to the metrics' event log.
    pub(super) fn log_arm_event(&self, exp: &crate::config::Experiment, event: &ArmEvent) {
        let arm_name = |i: usize| exp.arms.get(i).map_or("?", |a| a.name.as_str());
        let (kind, text) = match event {
            ArmEvent::Tripped {
                arm,
                why,
                cooldown_ns,
            } => {
                let until = match cooldown_ns {
                    Some(c) => format!("probed again after a {:.0} s cool-down", *c as f64 / 1e9),
                    None => "until `shardport ab reset` (POST /v1/experiments/reset)".to_owned(),
                };
                (
                    "trip",
                    format!(
                        "guardrail disabled arm `{}`: {why}; its traffic goes to the control arm `{}`, {until}",
                        arm_name(*arm),
                        arm_name(0)
                    ),
                )
            }
            ArmEvent::Probing { arm } => (
                "probe",
                format!(
                    "arm `{}` cool-down over: probing on a {:.1}% share of its draws",
                    arm_name(*arm),
                    exp.guardrail
                        .as_ref()
                        .map_or(0.0, |g| g.probe_share * 100.0)
                ),
            ),
            ArmEvent::Recovered { arm } => (
                "recover",
                format!("arm `{}` passed its probes: re-enabled", arm_name(*arm)),
            ),
            ArmEvent::RampStep { step, share } => (
                "ramp-step",
                format!(
                    "ramp step {step}: arm `{}` now takes {:.1}% of the traffic",
                    exp.ramp.as_ref().map_or("?", |r| arm_name(r.arm)),
                    share * 100.0
                ),
            ),
            ArmEvent::RampHalted { step } => (
                "ramp-halt",
                format!("ramp halted at step {step}: its arm tripped"),
            ),
        };
        if kind == "trip" {
            tracing::warn!(target: "experiment", experiment = %exp.name, "{text}");
        } else {
            tracing::info!(target: "experiment", experiment = %exp.name, "{text}");
        }
        self.inner.event(kind, Some(&exp.name), text);
    }
}
