//! The latency CDF plot of `shardport ab report --plot FILE.svg`.
//!
//! A small SVG writer, by hand, so the plot needs no font, image or system
//! library: one panel per experiment, x = latency on a log scale (decade
//! ticks labelled, 2..9 minor ticks), y = cumulative fraction of successful
//! fetches 0..1, one step polyline per arm with data, a legend with each
//! arm's n, axis labels and a title. Text is XML-escaped, so the document is
//! well-formed whatever the arm names are.

use std::fmt::Write as _;

use super::Histogram;

/// Width of the document, px.
const WIDTH: f64 = 900.0;
/// Height of one panel, px.
const PANEL_HEIGHT: f64 = 420.0;
/// Plot area inside a panel: left, right, top, bottom edges, px.
const LEFT: f64 = 80.0;
const RIGHT: f64 = 660.0;
const TOP: f64 = 45.0;
const BOTTOM: f64 = 360.0;
/// Line colours (Okabe and Ito's palette, distinguishable with the common
/// colour-vision deficiencies), reused in order past eight arms.
const COLOURS: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

/// One line of a panel.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    /// Legend text.
    pub label: String,
    /// Its latency histogram.
    pub histogram: &'a Histogram,
}

/// One chart.
#[derive(Debug, Clone)]
pub struct Panel<'a> {
    /// Title above the chart.
    pub title: String,
    /// Lines, in legend order.
    pub series: Vec<Series<'a>>,
}

/// Escapes text for XML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The SVG document with the panels stacked vertically.
pub fn svg(panels: &[Panel<'_>]) -> String {
    let height = PANEL_HEIGHT * panels.len().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, PANEL_HEIGHT * i as f64);
    }
    out.push_str("</svg>\n");
    out
}

/// `10^d` ns as a round label: `100 ns`, `10 us`, `1 ms`, `10 s`.
pub(super) fn decade_label(d: i32) -> String {
    let (unit, shift) = match d {
        ..=2 => ("ns", 0),
        3..=5 => ("us", 3),
        6..=8 => ("ms", 6),
        _ => ("s", 9),
    };
    format!("{} {unit}", 10u64.pow((d.max(0) - shift) as u32))
}

/// log10 of the x range, whole decades around every arm's values.
fn decades(panel: &Panel<'_>) -> (i32, i32) {
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for s in &panel.series {
        for (v, _) in s.histogram.cumulative() {
            lo = lo.min(v.max(1));
            hi = hi.max(v.max(1));
        }
    }
    if hi == 0 {
        return (3, 6); // no data: 1 us .. 1 ms, an empty frame
    }
    let lo = (lo as f64).log10().floor() as i32;
    let hi = (hi as f64).log10().ceil() as i32;
    (lo, hi.max(lo + 1))
}

fn panel(out: &mut String, p: &Panel<'_>, dy: f64) {
    let (d0, d1) = decades(p);
    let x = |ns: f64| {
        LEFT + (ns.max(1.0).log10() - f64::from(d0)) / f64::from(d1 - d0) * (RIGHT - LEFT)
    };
    let y = |frac: f64| dy + BOTTOM - frac * (BOTTOM - TOP);
    let _ = writeln!(out, "<g>");
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{:.1}" font-size="15" text-anchor="middle">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        dy + 25.0,
        escape(&p.title)
    );
    // Grid and ticks: x decades (labelled) and minor ticks, y quarters.
    for d in d0..=d1 {
        let base = 10f64.powi(d);
        let xd = x(base);
        let _ = writeln!(
            out,
            r##"<line x1="{xd:.1}" y1="{:.1}" x2="{xd:.1}" y2="{:.1}" stroke="#dddddd"/>"##,
            y(1.0),
            y(0.0)
        );
        let _ = writeln!(
            out,
            r##"<line x1="{xd:.1}" y1="{:.1}" x2="{xd:.1}" y2="{:.1}" stroke="#000000"/>"##,
            y(0.0),
            y(0.0) + 6.0
        );
        let _ = writeln!(
            out,
            r#"<text x="{xd:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            y(0.0) + 20.0,
            decade_label(d)
        );
        if d < d1 {
            for m in 2..10 {
                let xm = x(base * f64::from(m));
                let _ = writeln!(
                    out,
                    r##"<line x1="{xm:.1}" y1="{:.1}" x2="{xm:.1}" y2="{:.1}" stroke="#000000"/>"##,
                    y(0.0),
                    y(0.0) + 3.0
                );
            }
        }
    }
    for q in 0..=4 {
        let frac = f64::from(q) / 4.0;
        let yq = y(frac);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yq:.1}" x2="{RIGHT}" y2="{yq:.1}" stroke="#dddddd"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{frac:.2}</text>"#,
            LEFT - 8.0,
            yq + 4.0
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{:.1}" width="{}" height="{}" fill="none" stroke="#000000"/>"##,
        y(1.0),
        RIGHT - LEFT,
        BOTTOM - TOP
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{:.1}" text-anchor="middle">fetch latency (log scale)</text>"#,
        (LEFT + RIGHT) / 2.0,
        y(0.0) + 42.0
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">cumulative fraction of fetches</text>"#,
        LEFT - 50.0,
        (y(0.0) + y(1.0)) / 2.0,
        LEFT - 50.0,
        (y(0.0) + y(1.0)) / 2.0
    );
    // One step line per arm, and the legend.
    for (i, s) in p.series.iter().enumerate() {
        arm_line(out, i, s, dy, (&x, &y));
    }
    let _ = writeln!(out, "</g>");
}

/// One arm's cumulative step line and its legend entry (the `i`-th); `x`
/// and `y` map a latency and a fraction to the panel.
fn arm_line(
    out: &mut String,
    i: usize,
    s: &Series<'_>,
    dy: f64,
    (x, y): (&dyn Fn(f64) -> f64, &dyn Fn(f64) -> f64),
) {
    let colour = COLOURS[i % COLOURS.len()];
    let n = s.histogram.n();
    if n > 0 {
        let mut pts: Vec<(f64, f64)> = Vec::new();
        let mut push = |px: f64, py: f64| {
            let pt = ((px * 10.0).round() / 10.0, (py * 10.0).round() / 10.0);
            if pts.last() != Some(&pt) {
                pts.push(pt);
            }
        };
        let mut prev = 0.0;
        push(LEFT, y(0.0));
        for (v, cum) in s.histogram.cumulative() {
            let frac = cum as f64 / n as f64;
            push(x(v as f64), y(prev));
            push(x(v as f64), y(frac));
            prev = frac;
        }
        push(RIGHT, y(1.0));
        let points: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
    }
    let ly = dy + TOP + 10.0 + 22.0 * i as f64;
    let _ = writeln!(
        out,
        r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/>"#,
        RIGHT + 20.0,
        RIGHT + 45.0
    );
    let label = if n > 0 {
        format!("{} (n={n})", s.label)
    } else {
        format!("{} (no data)", s.label)
    };
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
        RIGHT + 52.0,
        ly + 4.0,
        escape(&label)
    );
}
