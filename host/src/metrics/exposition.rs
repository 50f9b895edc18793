//! The Prometheus text exposition format (0.0.4) of a metrics snapshot:
//! one family per metric name, its HELP/TYPE header once, then its samples.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::snapshot::{Series, SizeHistogram, Snapshot};

/// Upper bounds (seconds) of the Prometheus latency histogram buckets.
const LE_SECONDS: [f64; 22] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1,
    0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Escapes a label value per the exposition format.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// Accumulates one metric family: its HELP/TYPE header once, then samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels_: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.out, "{name}{labels_} {value}");
    }

    fn histogram(&mut self, name: &str, base: &[(&str, &str)], h: &SizeHistogram) {
        let mut pairs: Vec<(&str, &str)> = base.to_vec();
        pairs.push(("size", &h.size));
        let mut cumulative = 0u64;
        let mut it = h.counts.iter().peekable();
        for le in LE_SECONDS {
            let le_ns = (le * 1e9).round() as u64;
            while let Some(&&(v, c)) = it.peek() {
                if v > le_ns {
                    break;
                }
                cumulative += c;
                it.next();
            }
            let le_s = format!("{le}");
            let mut with_le = pairs.clone();
            with_le.push(("le", &le_s));
            self.sample(&format!("{name}_bucket"), &labels(&with_le), cumulative);
        }
        let mut with_le = pairs.clone();
        with_le.push(("le", "+Inf"));
        self.sample(&format!("{name}_bucket"), &labels(&with_le), h.n());
        self.sample(
            &format!("{name}_sum"),
            &labels(&pairs),
            h.sum_ns as f64 / 1e9,
        );
        self.sample(&format!("{name}_count"), &labels(&pairs), h.n());
    }
}

/// Renders a snapshot in the Prometheus text exposition format (0.0.4).
pub fn prometheus(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };
    transport_families(&mut f, s);
    node_families(&mut f, s);
    if !s.experiments.is_empty() {
        arm_counter_families(&mut f, s);
        arm_state_families(&mut f, s);
    }
    gauge_families(&mut f, s);
    out
}

/// Per-transport fetch counters and latency histograms.
fn transport_families(f: &mut Family<'_>, s: &Snapshot) {
    let node = s.node.as_str();
    type Pick = fn(&Series) -> u64;
    let counters: [(&str, &str, Pick); 4] = [
        (
            "shardport_fetches_total",
            "Successful fetches per transport.",
            |x| x.fetches,
        ),
        (
            "shardport_fetch_bytes_total",
            "Bytes fetched per transport.",
            |x| x.bytes,
        ),
        (
            "shardport_fetch_errors_total",
            "Failed fetch attempts per transport.",
            |x| x.errors,
        ),
        (
            "shardport_fetch_downgrades_total",
            "Fetches a transport served after a faster candidate failed.",
            |x| x.downgrades,
        ),
    ];
    for (name, help, pick) in counters {
        f.header(name, "counter", help);
        for t in &s.transports {
            f.sample(
                name,
                &labels(&[("node", node), ("transport", &t.transport)]),
                pick(t),
            );
        }
    }
    let name = "shardport_fetch_latency_seconds";
    f.header(
        name,
        "histogram",
        "Latency of successful fetches per transport and shard size bucket.",
    );
    for t in &s.transports {
        for h in &t.latency {
            f.histogram(name, &[("node", node), ("transport", &t.transport)], h);
        }
    }
}

/// Node-wide counters: downgrades, fetches without a candidate, leaked bytes.
fn node_families(f: &mut Family<'_>, s: &Snapshot) {
    let node = s.node.as_str();
    for (name, help, value) in [
        (
            "shardport_downgrades_total",
            "Fetches served after a faster candidate failed.",
            s.downgrades,
        ),
        (
            "shardport_no_candidate_total",
            "Fetches no loaded transport could serve.",
            s.no_candidate,
        ),
        (
            "shardport_fetch_exhausted_waits_total",
            "Retries of fetch attempts whose transport said a limit was exhausted.",
            s.exhausted_waits,
        ),
    ] {
        f.header(name, "counter", help);
        f.sample(name, &labels(&[("node", node)]), value);
    }
    f.header(
        "shardport_leaked_bytes",
        "gauge",
        "Owned bytes leaked because a transport could not unexport them.",
    );
    f.sample(
        "shardport_leaked_bytes",
        &labels(&[("node", node)]),
        s.leaked_bytes,
    );
    let name = "shardport_reloads_total";
    f.header(name, "counter", "Config reloads, applied or refused.");
    for (result, n) in [("applied", s.reloads), ("refused", s.reloads_refused)] {
        f.sample(name, &labels(&[("node", node), ("result", result)]), n);
    }
}

/// Per-arm counters of every experiment.
fn arm_counter_families(f: &mut Family<'_>, s: &Snapshot) {
    let node = s.node.as_str();
    type ArmPick = fn(&crate::snapshot::ArmSnapshot) -> u64;
    let arm_counters: [(&str, &str, ArmPick); 7] = [
        (
            "shardport_experiment_assigned_total",
            "Fetches assigned to an experiment arm.",
            |a| a.assigned,
        ),
        (
            "shardport_experiment_fetches_total",
            "Fetches an arm's transport served.",
            |a| a.series.fetches,
        ),
        (
            "shardport_experiment_fetch_bytes_total",
            "Bytes an arm's transport served.",
            |a| a.series.bytes,
        ),
        (
            "shardport_experiment_errors_total",
            "Attempts of an arm's transport that failed.",
            |a| a.series.errors,
        ),
        (
            "shardport_experiment_downgrades_total",
            "Fetches of an arm that another transport served after the arm's failed.",
            |a| a.series.downgrades,
        ),
        (
            "shardport_experiment_redirected_total",
            "Fetches drawn for a disabled arm and sent to the control arm.",
            |a| a.redirected,
        ),
        (
            "shardport_experiment_guardrail_trips_total",
            "Times the guardrail disabled an arm.",
            |a| a.guardrail_trips,
        ),
    ];
    for (name, help, pick) in arm_counters {
        f.header(name, "counter", help);
        for e in &s.experiments {
            for a in &e.arms {
                f.sample(
                    name,
                    &labels(&[
                        ("node", node),
                        ("experiment", &e.name),
                        ("arm", &a.series.name),
                        ("transport", &a.series.transport),
                    ]),
                    pick(a),
                );
            }
        }
    }
}

/// Per-arm state and latency of every experiment.
fn arm_state_families(f: &mut Family<'_>, s: &Snapshot) {
    let node = s.node.as_str();
    type ArmValue = fn(&crate::snapshot::ArmSnapshot) -> f64;
    let gauges: [(&str, &str, ArmValue); 2] = [
        (
            "shardport_experiment_arm_enabled",
            "1 while an arm takes its whole share, 0 while tripped or probing.",
            |a| f64::from(u8::from(a.state == "enabled")),
        ),
        (
            "shardport_experiment_arm_share",
            "An arm's share of its experiment's traffic now.",
            |a| a.share.unwrap_or(0.0),
        ),
    ];
    for (name, help, value) in gauges {
        f.header(name, "gauge", help);
        for e in &s.experiments {
            for a in &e.arms {
                let pairs = [
                    ("node", node),
                    ("experiment", &e.name),
                    ("arm", &a.series.name),
                ];
                f.sample(name, &labels(&pairs), value(a));
            }
        }
    }
    let name = "shardport_experiment_arm_state";
    f.header(
        name,
        "gauge",
        "1 for an arm's phase: enabled, tripped (guardrail) or probing (half-open).",
    );
    for e in &s.experiments {
        for a in &e.arms {
            for state in ["enabled", "tripped", "probing"] {
                let pairs = [
                    ("node", node),
                    ("experiment", &e.name),
                    ("arm", &a.series.name),
                    ("state", state),
                ];
                f.sample(name, &labels(&pairs), u8::from(a.state == state));
            }
        }
    }
    let name = "shardport_experiment_ramp_step";
    f.header(
        name,
        "gauge",
        "The current step (0-based) of an experiment's ramp.",
    );
    for e in &s.experiments {
        if let Some(step) = e.ramp_step {
            f.sample(
                name,
                &labels(&[("node", node), ("experiment", &e.name)]),
                step,
            );
        }
    }
    let name = "shardport_experiment_latency_seconds";
    f.header(
        name,
        "histogram",
        "Latency of fetches an arm's transport served, per shard size bucket.",
    );
    for e in &s.experiments {
        for a in &e.arms {
            for h in &a.series.latency {
                f.histogram(
                    name,
                    &[
                        ("node", node),
                        ("experiment", &e.name),
                        ("arm", &a.series.name),
                        ("transport", &a.series.transport),
                    ],
                    h,
                );
            }
        }
    }
}

/// The node's and plugins' gauges, grouped by name so each family has one header.
fn gauge_families(f: &mut Family<'_>, s: &Snapshot) {
    let node = s.node.as_str();
    let mut by_name: BTreeMap<&str, Vec<&crate::snapshot::Gauge>> = BTreeMap::new();
    for g in &s.gauges {
        by_name.entry(g.name.as_str()).or_default().push(g);
    }
    for (gname, items) in by_name {
        let full = format!("shardport_{gname}");
        let kind = if gname.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        f.header(&full, kind, &gauge_help(gname));
        for g in items {
            let mut pairs: Vec<(&str, &str)> = vec![("node", node)];
            pairs.extend(g.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            f.sample(&full, &labels(&pairs), g.value);
        }
    }
}

fn gauge_help(name: &str) -> String {
    match name {
        "cache_entries" => "Shards in the consumer cache.".to_owned(),
        "cache_bytes" => "Bytes in the consumer cache.".to_owned(),
        "cache_held_entries" => "Cache entries a caller still holds (never evicted).".to_owned(),
        "shards_owned" => "Shards this node owns.".to_owned(),
        "bytes_owned" => "Bytes this node owns.".to_owned(),
        "plugin_current" => "A transport's own gauge (pool occupancy, leases...).".to_owned(),
        "plugin_events_total" => "A transport's own counter.".to_owned(),
        other => format!("{other} (node gauge)."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(labels(&[("node", "a\"b\\c\nd")]), r#"{node="a\"b\\c\nd"}"#);
    }
}
