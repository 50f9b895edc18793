//! The chaos soak's plot: RSS and open fds over time, for the never-killed
//! reference workers and for all workers, drawn with the benchmark plots'
//! frame and polylines (`bench::plot`), so no drawing library is needed.

use std::fmt::Write as _;

use super::chaos::ChaosReport;
use crate::bench::plot::{esc, page, polyline};

const W: f64 = 760.0;
const H: f64 = 400.0;
const PAD: f64 = 60.0;

/// The report's snapshots as an SVG document: four lines, each scaled to
/// its own maximum (written in the legend), against seconds.
pub fn svg(r: &ChaosReport) -> String {
    let snaps = &r.snapshots;
    let max_t = snaps.iter().map(|s| s.t_s).fold(1.0, f64::max);
    let x = |t: f64| PAD + t / max_t * (W - 2.0 * PAD);
    let y = |v: f64, max: f64| H - PAD - v / max.max(1.0) * (H - 2.0 * PAD);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    type Series<'a> = (&'a str, &'a str, Box<dyn Fn(usize) -> f64 + 'a>, &'a str);
    let series: Vec<Series<'_>> = vec![
        (
            "#0072b2",
            "reference RSS",
            Box::new(|i| mib(snaps[i].reference.rss)),
            "MiB",
        ),
        (
            "#d55e00",
            "reference fds",
            Box::new(|i| snaps[i].reference.fds as f64),
            "",
        ),
        (
            "#56b4e9",
            "all workers RSS",
            Box::new(|i| mib(snaps[i].all.rss)),
            "MiB",
        ),
        (
            "#e69f00",
            "all workers fds",
            Box::new(|i| snaps[i].all.fds as f64),
            "",
        ),
    ];
    let mut body = String::new();
    // Axes and a tick at every tenth of the run.
    let _ = writeln!(
        body,
        "<line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" stroke=\"black\"/>",
        b = H - PAD,
        r = W - PAD
    );
    for k in 0..=10 {
        let t = max_t * f64::from(k) / 10.0;
        let _ = writeln!(
            body,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-family=\"sans-serif\" font-size=\"10\" text-anchor=\"middle\">{t:.0}</text>",
            x(t),
            H - PAD + 14.0
        );
    }
    let _ = writeln!(
        body,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-family=\"sans-serif\" font-size=\"11\" text-anchor=\"middle\">seconds</text>",
        W / 2.0,
        H - PAD + 30.0
    );
    if r.mark_s > 0.0 {
        let _ = writeln!(
            body,
            "<line x1=\"{m:.1}\" y1=\"{PAD}\" x2=\"{m:.1}\" y2=\"{b}\" stroke=\"#999999\" stroke-dasharray=\"4 4\"/>",
            m = x(r.mark_s),
            b = H - PAD
        );
    }
    for (n, (color, name, value, unit)) in series.iter().enumerate() {
        let max = (0..snaps.len()).map(value).fold(0.0, f64::max);
        body.push_str(&polyline(
            color,
            (0..snaps.len()).map(|i| (x(snaps[i].t_s), y(value(i), max))),
        ));
        let ly = H - 18.0;
        let lx = PAD + n as f64 * 170.0;
        let _ = writeln!(
            body,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{ly:.1}\" font-family=\"sans-serif\" font-size=\"11\">{} (max {max:.0}{})</text>",
            ly - 6.0,
            lx + 16.0,
            esc(name),
            if unit.is_empty() {
                String::new()
            } else {
                format!(" {unit}")
            }
        );
    }
    let title = format!(
        "shardport soak --chaos: {:.0} s, {} fetches, {} wrong bytes, {} leaked segments; each line scaled to its maximum; dashed: the mark",
        r.duration_s, r.fetches, r.wrong_bytes, r.leaked_segments
    );
    page(W, H, PAD, &title, &body)
}
