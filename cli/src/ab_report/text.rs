//! The report as text: time units and labels, aligned tables, and the
//! `Display` of a [`Report`].

#[allow(clippy::wildcard_imports)]
use super::*;

/// A time unit picked for a magnitude, so that a value and its interval
/// print in the same unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Nanoseconds (below 1 us).
    Ns,
    /// Microseconds (below 1 ms).
    Us,
    /// Milliseconds (below 1 s).
    Ms,
    /// Seconds.
    S,
}

impl TimeUnit {
    /// The unit for a magnitude in ns.
    pub fn for_magnitude(ns: f64) -> Self {
        let ns = ns.abs();
        if ns < 1e3 {
            TimeUnit::Ns
        } else if ns < 1e6 {
            TimeUnit::Us
        } else if ns < 1e9 {
            TimeUnit::Ms
        } else {
            TimeUnit::S
        }
    }

    /// The unit's name (`us`).
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Ns => "ns",
            TimeUnit::Us => "us",
            TimeUnit::Ms => "ms",
            TimeUnit::S => "s",
        }
    }

    /// `ns` as a number in this unit (`35.0`; ns as an integer).
    pub fn number(self, ns: f64) -> String {
        match self {
            TimeUnit::Ns => format!("{ns:.0}"),
            TimeUnit::Us => format!("{:.1}", ns / 1e3),
            TimeUnit::Ms => format!("{:.1}", ns / 1e6),
            TimeUnit::S => format!("{:.1}", ns / 1e9),
        }
    }

    /// `ns` in this unit, with its name (`35.0 us`).
    pub fn show(self, ns: f64) -> String {
        format!("{} {}", self.number(ns), self.name())
    }
}

/// A latency in its own unit (`850 ns`, `35.0 us`, `1.2 ms`).
pub fn latency_label(ns: u64) -> String {
    TimeUnit::for_magnitude(ns as f64).show(ns as f64)
}

/// A throughput in decimal GB/s at or above 1 GB/s, else MB/s.
pub fn throughput_label(bytes_per_s: f64) -> String {
    if bytes_per_s >= 1e9 {
        format!("{:.2} GB/s", bytes_per_s / 1e9)
    } else {
        format!("{:.1} MB/s", bytes_per_s / 1e6)
    }
}

/// `YYYY-MM-DD hh:mm:ss UTC` of a Unix time in ms.
pub fn utc_label(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (mut days, rem) = (secs / 86_400, secs % 86_400);
    let leap = |y: u64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mut year = 1970;
    loop {
        let len = if leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let feb = if leap(year) { 29 } else { 28 };
    let mut month = 1;
    for len in [31, feb, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31] {
        if days < len {
            break;
        }
        days -= len;
        month += 1;
    }
    format!(
        "{year:04}-{month:02}-{:02} {:02}:{:02}:{:02} UTC",
        days + 1,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Writes rows as columns two spaces apart, each line indented: the columns
/// whose index is in `left` left-aligned, the others right-aligned.
pub(super) fn table(
    f: &mut fmt::Formatter<'_>,
    indent: &str,
    left: &[usize],
    rows: &[Vec<String>],
) -> fmt::Result {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::from(indent);
        for (c, cell) in r.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let pad = widths[c] - cell.chars().count();
            if left.contains(&c) {
                line.push_str(cell);
                if c + 1 < r.len() {
                    line.push_str(&" ".repeat(pad));
                }
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        writeln!(f, "{}", line.trim_end())?;
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "node {}: snapshot taken {}, covering {:.0} s; sizes: {}",
            self.node,
            utc_label(self.taken_at_unix_ms),
            self.window_s,
            self.size.as_deref().unwrap_or("all")
        )?;
        writeln!(
            f,
            "latency: nearest-rank percentiles of successful fetches; throughput: bytes per second of fetch time"
        )?;
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        for e in &self.experiments {
            writeln!(
                f,
                "\nexperiment {} (unit {}, control {})",
                e.name, e.unit, e.control
            )?;
            let dash = || "-".to_owned();
            let mut rows = vec![[
                "arm",
                "transport",
                "weight",
                "share",
                "assigned",
                "n",
                "p50",
                "p90",
                "p99",
                "throughput",
                "errors",
                "error rate",
                "downgrades",
                "status",
            ]
            .map(str::to_owned)
            .to_vec()];
            for a in &e.arms {
                let status = match (a.state.as_str(), &a.disabled, a.name == e.control) {
                    ("probing", Some(why), _) => format!("probing after: {why}"),
                    (_, Some(why), _) => format!("disabled: {why}"),
                    (_, None, true) => "control".to_owned(),
                    (_, None, false) => "active".to_owned(),
                };
                rows.push(vec![
                    a.name.clone(),
                    a.transport.clone(),
                    a.weight.to_string(),
                    a.share.map_or_else(dash, |x| format!("{:.1}%", x * 100.0)),
                    a.assigned.to_string(),
                    a.n.to_string(),
                    a.p50_ns.map_or_else(dash, latency_label),
                    a.p90_ns.map_or_else(dash, latency_label),
                    a.p99_ns.map_or_else(dash, latency_label),
                    a.throughput_bytes_per_s.map_or_else(dash, throughput_label),
                    a.errors.to_string(),
                    a.error_rate
                        .map_or_else(dash, |r| format!("{:.2}%", r * 100.0)),
                    a.downgrades.to_string(),
                    status,
                ]);
            }
            table(f, "  ", &[0, 1, 13], &rows)?;
            if let Some((step, halted)) = e.ramp {
                let how = if halted { ", halted by a trip" } else { "" };
                writeln!(f, "  ramp at step {step}{how}")?;
            }
            if !e.timeline.is_empty() {
                writeln!(f, "  timeline:")?;
                for x in &e.timeline {
                    writeln!(
                        f,
                        "    {}  {:<14} {}",
                        utc_label(x.at_unix_ms),
                        x.kind,
                        x.text
                    )?;
                }
            }
            if e.differences.is_empty() {
                continue;
            }
            writeln!(
                f,
                "  differences vs control {} (bootstrap 95% CI, {} resamples, seed {}):",
                e.control, self.resamples, self.seed
            )?;
            let mut rows = Vec::new();
            for d in &e.differences {
                rows.push(vec![d.arm.clone(), "p50".to_owned(), d.p50.summary.clone()]);
                rows.push(vec![
                    d.arm.clone(),
                    "error rate".to_owned(),
                    d.error_rate.summary.clone(),
                ]);
            }
            table(f, "    ", &[0, 1, 2], &rows)?;
        }
        Ok(())
    }
}
