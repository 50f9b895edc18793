//! An SVG bar chart of the report: for each size, one bar per path and
//! operation, its height the fraction of the machine's limit it reached
//! (limit time / median time). Hand-written SVG: no font or drawing library.

use std::fmt::Write as _;

use shardport_kit::format_byte_size;

use super::{
    cell::CellStatus,
    report::BenchReport,
    spec::{Op, PathId},
};

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 80.0;
/// One color per series, in order (colorblind-safe palette).
const COLORS: &[&str] = &[
    "#0072b2", "#56b4e9", "#009e73", "#e69f00", "#d55e00", "#cc79a7", "#f0e442", "#000000",
    "#999999",
];

/// Escapes text for SVG.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A `w` x `h` SVG document on white: `title` at the top left (`left` from
/// the edge), then `body` (SVG elements, one per line). The frame of the
/// line charts of `bench cluster`, `bench load` and the chaos soak.
pub(crate) fn page(w: f64, h: f64, left: f64, title: &str, body: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-family=\"sans-serif\" font-size=\"13\">{}</text>\n\
         {body}</svg>\n",
        esc(title)
    )
}

/// A 2-pixel `color` polyline through `points` (SVG coordinates), one line.
pub(crate) fn polyline(color: &str, points: impl IntoIterator<Item = (f64, f64)>) -> String {
    let points: Vec<String> = points
        .into_iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    format!(
        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
        points.join(" ")
    )
}

/// Renders the report as an SVG document.
pub fn svg(report: &BenchReport) -> String {
    let mut series: Vec<(PathId, Op)> = Vec::new();
    for c in &report.cells {
        if c.ratio.is_some() && !series.contains(&(c.path, c.op)) {
            series.push((c.path, c.op));
        }
    }
    let sizes = &report.settings.sizes;
    let max_ratio = report
        .cells
        .iter()
        .filter_map(|c| c.ratio)
        .fold(1.2f64, f64::max);
    let y_max = (max_ratio * 10.0).ceil() / 10.0;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let y = |r: f64| TOP + plot_h * (1.0 - (r / y_max).clamp(0.0, 1.0));

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let title = format!(
        "shardport bench: fraction of this machine's limit reached, {} ({}, {})",
        report.date, report.machine.hostname, report.machine.cpu_model
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="14" font-weight="bold">{}</text>"#,
        esc(&title)
    );

    axes(&mut s, y_max, &y);

    // Bars.
    let group_w = plot_w / sizes.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (gi, &size) in sizes.iter().enumerate() {
        let gx = LEFT + gi as f64 * group_w + group_w * 0.1;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + group_w * 0.4,
            TOP + plot_h + 18.0,
            esc(&format_byte_size(size))
        );
        for (si, &(path, op)) in series.iter().enumerate() {
            let Some(c) = report
                .cells
                .iter()
                .find(|c| c.path == path && c.op == op && c.size == size)
            else {
                continue;
            };
            let Some(r) = c.ratio.filter(|_| c.status == CellStatus::Ok) else {
                continue;
            };
            let x = gx + si as f64 * bar_w;
            let top = y(r);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {} {}: {r:.2}x of {}</title></rect>"#,
                (bar_w - 1.0).max(1.0),
                (TOP + plot_h - top).max(0.0),
                COLORS[si % COLORS.len()],
                path,
                op,
                esc(&format_byte_size(size)),
                esc(c.limit.as_ref().map_or("", |l| l.name.as_str()))
            );
        }
    }

    // Legend.
    let lx = LEFT + plot_w + 90.0;
    for (si, &(path, op)) in series.iter().enumerate() {
        let ly = TOP + 10.0 + si as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{path} {op}</text>"#,
            ly - 10.0,
            COLORS[si % COLORS.len()],
            lx + 16.0,
            ly
        );
    }

    // What is not drawn, and why.
    let notes = notes(report);
    for (i, n) in notes.iter().take(3).enumerate() {
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{:.1}" fill="#555">{}</text>"##,
            TOP + plot_h + 38.0 + i as f64 * 14.0,
            esc(n)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The grid, the limit and target lines, and the axes with their labels;
/// `y` maps a ratio to its height.
fn axes(s: &mut String, y_max: f64, y: &dyn Fn(f64) -> f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let steps = (y_max / 0.2).round() as usize;
    for i in 0..=steps {
        let r = i as f64 * 0.2;
        let yy = y(r);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{r:.1}x</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    for (r, dash, label) in [
        (1.0, "", "limit"),
        (0.8, r#" stroke-dasharray="6,4""#, "0.8x target"),
    ] {
        let yy = y(r);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#c00000"{dash}/><text x="{:.1}" y="{:.1}" fill="#c00000">{label}</text>"##,
            LEFT + plot_w,
            LEFT + plot_w + 4.0,
            yy + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"##,
        TOP + plot_h,
        TOP + plot_h,
        LEFT + plot_w,
        TOP + plot_h
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">limit time / median time</text>"#,
        TOP + plot_h / 2.0
    );
}

/// What the chart does not draw, and why: the view target, and each path
/// skipped or failed (its first reason).
fn notes(report: &BenchReport) -> Vec<String> {
    let mut notes = vec![
        "shm-view fetch moves no bytes: its latency is judged against the 20 us target (table)."
            .to_owned(),
    ];
    let mut skipped: Vec<String> = Vec::new();
    for c in &report.cells {
        if c.status != CellStatus::Ok {
            let line = format!(
                "{} {}: {}",
                c.path,
                if c.status == CellStatus::Failed {
                    "failed"
                } else {
                    "skipped"
                },
                c.reason.as_deref().unwrap_or("")
            );
            if !skipped
                .iter()
                .any(|l| l.starts_with(&format!("{} ", c.path)))
            {
                skipped.push(line);
            }
        }
    }
    notes.extend(skipped);
    notes
}
