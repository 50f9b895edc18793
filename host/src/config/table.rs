//! The effective routing table `shardport config check` prints.

use std::fmt::Write as _;

use super::{Config, DeviceSel, RouteWhen, TransportName};

/// The effective routing table, one line per route in match order, then the
/// default order (what `shardport config check` prints).
pub fn routing_table(cfg: &Config) -> String {
    let mut out = String::new();
    if !cfg.experiments.is_empty() {
        out.push_str("  experiments (first match wins, before routes):\n");
        for (i, e) in cfg.experiments.iter().enumerate() {
            // A ramped arm starts at its first step; the others split the rest.
            let shares = e.shares_at(e.ramp.as_ref().map(|r| (r.arm, r.steps[0])));
            let arms: Vec<String> = e
                .arms
                .iter()
                .enumerate()
                .map(|(j, a)| {
                    format!(
                        "{}{} via {} {:.1}%",
                        a.name,
                        if j == 0 { " (control)" } else { "" },
                        a.transport,
                        shares[j] * 100.0
                    )
                })
                .collect();
            let ramp = match &e.ramp {
                Some(r) if e.arms[r.arm].weight > 0 => {
                    let steps: Vec<String> = r
                        .steps
                        .iter()
                        .map(|p| format!("{}%", (p * 1000.0).round() / 10.0))
                        .collect();
                    format!(
                        "; ramp: {} takes {} of the traffic, one step per {:?} while its guardrail holds",
                        e.arms[r.arm].name,
                        steps.join(" -> "),
                        r.interval
                    )
                }
                Some(r) => format!("; ramp: {} has weight 0, drained", e.arms[r.arm].name),
                None => String::new(),
            };
            let guard = match &e.guardrail {
                None => String::new(),
                Some(g) => {
                    let mut parts = Vec::new();
                    if let Some(r) = g.max_error_rate {
                        parts.push(format!("error rate > {:.1}%", r * 100.0));
                    }
                    if let Some(r) = g.max_p99_ratio {
                        parts.push(format!("p99 > {r}x control"));
                    }
                    format!(
                        "; guardrail: {} over {:?} (>= {} samples) disables an arm",
                        parts.join(" or "),
                        g.window,
                        g.min_samples
                    )
                }
            };
            let _ = writeln!(
                out,
                "    {}. {:<14} {:<40} -> per {}: {}{ramp}{guard}",
                i + 1,
                e.name,
                describe_when(&e.when),
                e.unit,
                arms.join(", ")
            );
        }
    }
    out.push_str("  routing (first match wins):\n");
    for (i, r) in cfg.routes.iter().enumerate() {
        let via: Vec<&str> = r.transports.iter().map(TransportName::as_str).collect();
        let _ = writeln!(
            out,
            "    {}. {:<14} {:<40} -> {}",
            i + 1,
            r.name,
            describe_when(&r.when),
            via.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "    {}. {:<14} {:<40} -> same-node transports first (per locality.same-node), zero-copy first for views, then the owner's export order",
        cfg.routes.len() + 1,
        "default",
        "no route matched"
    );
    out
}

/// The conditions of a route or experiment in one line.
fn describe_when(w: &RouteWhen) -> String {
    let mut conds = Vec::new();
    if let Some(l) = w.local {
        conds.push(if l { "local" } else { "remote" }.to_owned());
    }
    if let Some(d) = w.device {
        conds.push(format!(
            "device={}",
            if d == DeviceSel::Cpu { "cpu" } else { "cuda" }
        ));
    }
    let size = shardport_kit::format_byte_size;
    match (w.min_size, w.max_size) {
        (Some(lo), Some(hi)) => conds.push(format!("size {}..={}", size(lo), size(hi))),
        (Some(lo), None) => conds.push(format!("size >= {}", size(lo))),
        (None, Some(hi)) => conds.push(format!("size <= {}", size(hi))),
        (None, None) => {}
    }
    for (k, v) in &w.tags {
        conds.push(format!("tag {k}={v}"));
    }
    if let Some(p) = &w.owner {
        conds.push(format!("owner ~ {}", p.as_str()));
    }
    if conds.is_empty() {
        "any shard".to_owned()
    } else {
        conds.join(", ")
    }
}
