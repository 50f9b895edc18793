//! Reports of synthetic snapshots whose numbers are worked out by hand.

use super::*;
use shardport_host::snapshot::{Series, SizeHistogram};

/// An arm whose fetches are its histogram counts, 4 KiB each, with
/// `latency_ns_total` the histogram's sum.
fn arm_with(
    name: &str,
    transport: &str,
    latency: &[(&str, &[(u64, u64)])],
    errors: u64,
) -> ArmSnapshot {
    let latency: Vec<SizeHistogram> = latency
        .iter()
        .map(|(size, counts)| SizeHistogram {
            size: (*size).to_owned(),
            counts: counts.to_vec(),
            sum_ns: counts.iter().map(|&(v, c)| v * c).sum(),
        })
        .collect();
    let fetches: u64 = latency.iter().map(SizeHistogram::n).sum();
    let latency_ns_total = latency
        .iter()
        .flat_map(|h| h.counts.iter())
        .map(|&(v, c)| v * c)
        .sum();
    ArmSnapshot {
        weight: 50,
        state: "enabled".to_owned(),
        share: None,
        assigned: fetches + errors,
        disabled: None,
        guardrail_trips: 0,
        redirected: 0,
        series: Series {
            name: name.to_owned(),
            transport: transport.to_owned(),
            fetches,
            bytes: fetches * 4096,
            errors,
            downgrades: 0,
            latency_ns_total,
            latency,
        },
    }
}

fn arm(name: &str, counts: &[(u64, u64)]) -> ArmSnapshot {
    arm_with(name, name, &[("4KiB", counts)], 0)
}

fn experiment(name: &str, arms: Vec<ArmSnapshot>) -> ExperimentSnapshot {
    ExperimentSnapshot {
        name: name.to_owned(),
        unit: "shard".to_owned(),
        control: arms[0].series.name.clone(),
        arms,
        ramp_step: None,
        ramp_halted: false,
    }
}

fn snap(experiments: Vec<ExperimentSnapshot>) -> Snapshot {
    Snapshot {
        format: snapshot::FORMAT.to_owned(),
        node: "trainer-0".to_owned(),
        taken_at_unix_ms: 1_700_000_000_000,
        window_s: 600.0,
        transports: Vec::new(),
        experiments,
        downgrades: 0,
        no_candidate: 0,
        exhausted_waits: 0,
        leaked_bytes: 0,
        gauges: Vec::new(),
        reloads: 0,
        reloads_refused: 0,
        events: Vec::new(),
    }
}

fn report(s: &Snapshot) -> Report {
    build(s, &Options::default()).unwrap()
}

/// Control: 100 fetches at 10 us; treatment: 100 at 20 us.
fn constant_pair() -> Snapshot {
    snap(vec![experiment(
        "shm-vs-http",
        vec![
            arm("posix-shm", &[(10_000, 100)]),
            arm("http", &[(20_000, 100)]),
        ],
    )])
}

/// 100 values 10.0 us, 10.1 us, ... 19.9 us, 10 fetches each, shifted by `shift` ns.
fn spread(shift: u64) -> Vec<(u64, u64)> {
    (0..100).map(|i| (10_000 + 100 * i + shift, 10)).collect()
}

#[test]
fn constant_arms_differ_exactly_and_the_interval_collapses() {
    let r = report(&constant_pair());
    let e = &r.experiments[0];
    assert_eq!(e.arms[0].n, 100);
    assert_eq!(e.arms[0].p50_ns, Some(10_000));
    assert_eq!(e.arms[1].p99_ns, Some(20_000));
    let d = &e.differences[0];
    assert_eq!((d.arm.as_str(), d.control.as_str()), ("http", "posix-shm"));
    assert_eq!(d.p50.estimate, Some(10_000.0));
    assert_eq!(d.p50.ci95, Some((10_000.0, 10_000.0)));
    assert_eq!(d.p50.ratio, Some(2.0));
    assert_eq!(d.p50.ratio_ci95, Some((2.0, 2.0)));
    assert_eq!(d.p50.verdict, Verdict::Higher);
    assert_eq!(
        d.p50.summary,
        "http is slower than posix-shm by 10.0 us p50 (95% CI 10.0..10.0 us); ratio 2.00x (95% CI 2.00x..2.00x)"
    );
    // No errors on either side: the error-rate interval is [0, 0].
    assert_eq!(d.error_rate.ci95, Some((0.0, 0.0)));
    assert_eq!(d.error_rate.verdict, Verdict::NoSignificantDifference);
}

#[test]
fn the_faster_arm_is_called_faster_with_a_positive_difference() {
    let s = snap(vec![experiment(
        "e",
        vec![
            arm("http", &[(20_000, 100)]),
            arm("posix-shm", &[(10_000, 100)]),
        ],
    )]);
    let d = &report(&s).experiments[0].differences[0];
    assert_eq!(d.p50.verdict, Verdict::Lower);
    assert_eq!(
        d.p50.summary,
        "posix-shm is faster than http by 10.0 us p50 (95% CI 10.0..10.0 us); ratio 0.50x (95% CI 0.50x..0.50x)"
    );
}

#[test]
fn percentiles_are_nearest_rank_on_the_weighted_values() {
    // n = 100: ranks 50, 90, 99 fall in the 1st, 2nd and 3rd values.
    let h = Histogram::merge([&[(100, 50), (200, 40), (300, 9), (400, 1)][..]]);
    assert_eq!(h.n(), 100);
    assert_eq!(h.percentile(500), Some(100));
    assert_eq!(h.percentile(900), Some(200));
    assert_eq!(h.percentile(990), Some(300));
    assert_eq!(h.percentile(1000), Some(400));
    // n = 7: p50 is rank ceil(3.5) = 4, p90 rank ceil(6.3) = 7, p10 rank 1.
    let h = Histogram::merge([&[(1, 3), (2, 3), (3, 1)][..]]);
    assert_eq!(h.percentile(500), Some(2));
    assert_eq!(h.percentile(900), Some(3));
    assert_eq!(h.percentile(100), Some(1));
    assert_eq!(h.percentile(428), Some(1)); // ceil(2.996) = 3
    assert_eq!(h.percentile(429), Some(2)); // ceil(3.003) = 4
                                            // Buckets merge in any order, repeated values add, zero counts vanish.
    let h = Histogram::merge([&[(300, 1), (100, 2)][..], &[(100, 1), (200, 0)][..]]);
    assert_eq!(h.cumulative().collect::<Vec<_>>(), [(100, 3), (300, 4)]);
    assert_eq!(Histogram::default().percentile(500), None);
}

#[test]
fn arm_percentiles_merge_every_size_bucket_by_default() {
    let a = arm_with(
        "shm",
        "posix-shm",
        &[("4KiB", &[(1_000, 60)]), ("1MiB", &[(100_000, 40)])],
        0,
    );
    let s = snap(vec![experiment("e", vec![a])]);
    let r = report(&s);
    let a = &r.experiments[0].arms[0];
    assert_eq!(a.n, 100);
    assert_eq!(a.p50_ns, Some(1_000));
    assert_eq!(a.p90_ns, Some(100_000));
    let only = build(
        &s,
        &Options {
            size: Some("1mib".to_owned()),
            ..Options::default()
        },
    )
    .unwrap();
    let a = &only.experiments[0].arms[0];
    assert_eq!(only.size.as_deref(), Some("1MiB"));
    assert_eq!((a.n, a.p50_ns), (40, Some(100_000)));
    assert_eq!(
        a.throughput_bytes_per_s, None,
        "bytes are not split per size"
    );
    assert!(
        only.notes[0].contains("throughput is left out"),
        "{:?}",
        only.notes
    );
    assert!(only
        .to_string()
        .contains("note: latency is for size bucket 1MiB only"));
}

#[test]
fn an_unknown_size_bucket_lists_the_buckets() {
    let e = build(
        &constant_pair(),
        &Options {
            size: Some("2MiB".to_owned()),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--size `2MiB` is not a size bucket; expected one of 4KiB, 64KiB, 1MiB, 16MiB, 256MiB, inf"
    );
}

#[test]
fn error_rate_and_throughput_follow_their_definitions() {
    // 100 fetches of 4096 bytes at 10 us each, 25 errors.
    let s = snap(vec![experiment(
        "e",
        vec![arm_with(
            "shm",
            "posix-shm",
            &[("4KiB", &[(10_000, 100)])],
            25,
        )],
    )]);
    let r = report(&s);
    let a = &r.experiments[0].arms[0];
    assert_eq!(a.error_rate, Some(0.2)); // 25 / (100 + 25)
                                         // 409 600 bytes in 1 ms of fetch time.
    assert_eq!(a.throughput_bytes_per_s, Some(409_600_000.0));
    assert_eq!(throughput_label(409_600_000.0), "409.6 MB/s");
    assert_eq!(throughput_label(3.21e9), "3.21 GB/s");
    let table = r.to_string();
    assert!(table.contains("409.6 MB/s"), "{table}");
    assert!(table.contains("20.00%"), "{table}");
}

#[test]
fn a_higher_error_rate_is_significant_and_its_interval_holds_the_difference() {
    let s = snap(vec![experiment(
        "e",
        vec![
            arm_with("shm", "posix-shm", &[("4KiB", &[(10_000, 1000)])], 0),
            arm_with("http", "http", &[("4KiB", &[(10_000, 900)])], 100),
        ],
    )]);
    let d = &report(&s).experiments[0].differences[0];
    assert_eq!(d.error_rate.estimate, Some(0.1));
    let (lo, hi) = d.error_rate.ci95.unwrap();
    assert!(lo > 0.0 && lo < 0.1 && hi > 0.1 && hi < 0.2, "{lo}..{hi}");
    assert_eq!(d.error_rate.verdict, Verdict::Higher);
    assert!(
        d.error_rate
            .summary
            .starts_with("http has a higher error rate than shm by 10.00 pp (95% CI "),
        "{}",
        d.error_rate.summary
    );
}

#[test]
fn a_disabled_arm_is_shown_as_disabled() {
    let mut treatment = arm("http", &[(20_000, 100)]);
    treatment.disabled = Some("error rate 12% above 5%".to_owned());
    let s = snap(vec![experiment(
        "e",
        vec![arm("posix-shm", &[(10_000, 100)]), treatment],
    )]);
    let r = report(&s);
    assert_eq!(
        r.experiments[0].arms[1].disabled.as_deref(),
        Some("error rate 12% above 5%")
    );
    let table = r.to_string();
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with("http "))
        .unwrap();
    assert!(
        line.ends_with("disabled: error rate 12% above 5%"),
        "{table}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        json["experiments"][0]["arms"][1]["disabled"],
        "error rate 12% above 5%"
    );
    assert!(r.plot_svg().contains("http (disabled) (n=100)"));
}

#[test]
fn the_timeline_shows_weight_changes_trips_and_ramp_steps_of_its_experiment() {
    let mut treatment = arm("http", &[(20_000, 100)]);
    treatment.state = "probing".to_owned();
    treatment.share = Some(0.005);
    treatment.disabled = Some("error rate 12% above 5%".to_owned());
    let mut e = experiment(
        "canary",
        vec![arm("posix-shm", &[(10_000, 100)]), treatment],
    );
    e.ramp_step = Some(1);
    e.ramp_halted = true;
    let other = experiment("other", vec![arm("a", &[(1, 1)]), arm("b", &[(1, 1)])]);
    let mut s = snap(vec![e, other]);
    let ev = |ms: u64, kind: &str, exp: Option<&str>, text: &str| snapshot::Event {
        at_unix_ms: 1_700_000_000_000 + ms,
        kind: kind.to_owned(),
        experiment: exp.map(str::to_owned),
        text: text.to_owned(),
    };
    s.events = vec![
        ev(
            0,
            "reload",
            None,
            "generation 1: experiment canary: weights control=95 http=5 -> control=90 http=10",
        ),
        ev(
            1000,
            "ramp-step",
            Some("canary"),
            "ramp step 1: arm `http` now takes 5.0% of the traffic",
        ),
        ev(
            2000,
            "trip",
            Some("canary"),
            "guardrail disabled arm `http`: error rate 12%",
        ),
        ev(2500, "trip", Some("other"), "guardrail disabled arm `b`"),
        ev(
            3000,
            "probe",
            Some("canary"),
            "arm `http` cool-down over: probing",
        ),
    ];
    let r = report(&s);
    let kinds: Vec<&str> = r.experiments[0]
        .timeline
        .iter()
        .map(|x| x.kind.as_str())
        .collect();
    assert_eq!(kinds, ["reload", "ramp-step", "trip", "probe"]);
    assert_eq!(r.experiments[1].timeline.len(), 1, "only its own trip");
    let text = r.to_string();
    assert!(text.contains("ramp at step 1, halted by a trip"), "{text}");
    assert!(
        text.contains("weights control=95 http=5 -> control=90 http=10"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("http "))
        .unwrap();
    assert!(
        line.contains("0.5%") && line.ends_with("probing after: error rate 12% above 5%"),
        "{line}"
    );
}

#[test]
fn an_unknown_experiment_names_the_available_ones() {
    let s = snap(vec![
        experiment("shm-vs-http", vec![arm("a", &[(1, 1)])]),
        experiment("canary", vec![arm("b", &[(1, 1)])]),
    ]);
    let e = build(
        &s,
        &Options {
            experiment: Some("nope".to_owned()),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "no experiment `nope` in the snapshot of node `trainer-0`; available: shm-vs-http, canary"
    );
    let one = build(
        &s,
        &Options {
            experiment: Some("canary".to_owned()),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(one.experiments.len(), 1);
    assert_eq!(one.experiments[0].name, "canary");
    assert_eq!(
        build(&snap(Vec::new()), &Options::default())
            .unwrap_err()
            .to_string(),
        "snapshot of node `trainer-0` has no experiments (configure an [[experiment]] on the node)"
    );
}

#[test]
fn a_missing_control_arm_is_named() {
    let mut e = experiment("e", vec![arm("a", &[(1, 1)]), arm("b", &[(1, 1)])]);
    e.control = "c".to_owned();
    assert_eq!(
        build(&snap(vec![e]), &Options::default())
            .unwrap_err()
            .to_string(),
        "experiment `e`: control arm `c` is not among its arms (a, b)"
    );
}

#[test]
fn a_wrong_format_tag_is_refused_naming_the_file_and_both_tags() {
    let e = parse_str(
        r#"{"format": "shardport-metrics/2", "node": "x"}"#,
        "snap.json",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "snapshot snap.json: format is \"shardport-metrics/2\", expected \"shardport-metrics/1\""
    );
    let e = parse_str(r#"{"node": "x"}"#, "snap.json").unwrap_err();
    assert_eq!(
        e.to_string(),
        "snapshot snap.json: format is missing, expected \"shardport-metrics/1\""
    );
}

#[test]
fn json_errors_point_at_line_and_column() {
    let text = format!(
        "{{\n  \"format\": \"{}\",\n  \"node\": 7\n}}",
        snapshot::FORMAT
    );
    let e = parse_str(&text, "snap.json").unwrap_err();
    assert_eq!(
        e.to_string(),
        "snapshot snap.json:3:11: invalid type: integer `7`, expected a string"
    );
    let e = parse_str("\"x\"", "snap.json").unwrap_err();
    assert_eq!(
        e.to_string(),
        "snapshot snap.json:1:3: invalid type: string \"x\", expected a shardport metrics snapshot (a JSON object)"
    );
    // A scraped body has no lines to point at.
    let e = ReportError::Parse {
        origin: "http://n:1/v1/metrics.json".to_owned(),
        line: 0,
        column: 0,
        message: "missing field `node`".to_owned(),
    };
    assert_eq!(
        e.to_string(),
        "snapshot http://n:1/v1/metrics.json: missing field `node`"
    );
    let e = parse_str("{\n  \"format\": ", "snap.json").unwrap_err();
    assert!(e.to_string().starts_with("snapshot snap.json:2:"), "{e}");
}

#[test]
fn a_snapshot_round_trips_through_json() {
    let s = constant_pair();
    let text = serde_json::to_string_pretty(&s).unwrap();
    assert_eq!(parse_str(&text, "mem").unwrap(), s);
}

#[test]
fn the_bootstrap_is_deterministic_for_a_seed() {
    let s = snap(vec![experiment(
        "e",
        vec![arm("a", &spread(0)), arm("b", &spread(300))],
    )]);
    let ci = |seed| {
        build(
            &s,
            &Options {
                seed,
                ..Options::default()
            },
        )
        .unwrap()
        .experiments[0]
            .differences[0]
            .p50
            .ci95
            .unwrap()
    };
    assert_eq!(ci(7), ci(7));
    assert_ne!(ci(7), ci(8));
    // Selecting the experiment does not change its stream.
    let mut two = s.clone();
    two.experiments.insert(
        0,
        experiment("other", vec![arm("x", &spread(0)), arm("y", &spread(0))]),
    );
    let full = build(&two, &Options::default()).unwrap();
    assert_eq!(
        full.experiments[1].differences[0].p50.ci95,
        report(&s).experiments[0].differences[0].p50.ci95
    );
}

#[test]
fn the_interval_contains_a_known_shift() {
    // The treatment is the control shifted by 5 us: p50 (rank 500 of 1000,
    // the 50th value) goes from 14.9 us to 19.9 us.
    let s = snap(vec![experiment(
        "e",
        vec![arm("a", &spread(0)), arm("b", &spread(5_000))],
    )]);
    let d = &report(&s).experiments[0].differences[0];
    assert_eq!(d.p50.estimate, Some(5_000.0));
    let (lo, hi) = d.p50.ci95.unwrap();
    assert!(lo <= 5_000.0 && 5_000.0 <= hi, "{lo}..{hi}");
    assert!(
        lo > 0.0,
        "a 5 us shift over a 10 us spread is significant: {lo}..{hi}"
    );
    assert!(hi - lo < 2_000.0, "{lo}..{hi}");
    assert_eq!(d.p50.verdict, Verdict::Higher);

    // The same distribution on both sides: the interval holds 0.
    let s = snap(vec![experiment(
        "e",
        vec![arm("a", &spread(0)), arm("b", &spread(0))],
    )]);
    let d = &report(&s).experiments[0].differences[0];
    let (lo, hi) = d.p50.ci95.unwrap();
    assert!(lo < 0.0 && hi > 0.0, "{lo}..{hi}");
    assert_eq!(d.p50.verdict, Verdict::NoSignificantDifference);
    assert!(
        d.p50
            .summary
            .starts_with("no significant difference in p50 between b and a (+0 ns, 95% CI "),
        "{}",
        d.p50.summary
    );
}

#[test]
fn few_samples_are_insufficient_data() {
    let s = snap(vec![experiment(
        "e",
        vec![arm("a", &[(10_000, 100)]), arm("b", &[(20_000, 5)])],
    )]);
    let d = &report(&s).experiments[0].differences[0];
    assert_eq!(d.p50.verdict, Verdict::InsufficientData);
    assert_eq!(d.p50.ci95, None);
    assert_eq!(
        d.p50.summary,
        "insufficient data: b has 5 samples (fewer than 20)"
    );
    assert_eq!(d.error_rate.verdict, Verdict::InsufficientData);
    // An arm without any fetch has no percentiles and prints dashes.
    let s = snap(vec![experiment(
        "e",
        vec![arm("a", &[(10_000, 100)]), arm("b", &[])],
    )]);
    let r = report(&s);
    assert_eq!(r.experiments[0].arms[1].p50_ns, None);
    assert_eq!(
        r.experiments[0].differences[0].p50.verdict,
        Verdict::InsufficientData
    );
    assert!(r.plot_svg().contains("b (no data)"));
}

#[test]
fn resamples_out_of_range_are_refused() {
    let e = build(
        &constant_pair(),
        &Options {
            resamples: 10,
            ..Options::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "--resamples 10: expected 100..=1000000");
}

/// The one-beta-draw p50 of a resample has the distribution of the p50 of
/// `n` draws with replacement, done the slow way.
#[test]
fn the_order_statistic_shortcut_matches_direct_resampling() {
    let counts = [
        (1, 5),
        (2, 3),
        (3, 8),
        (4, 2),
        (5, 7),
        (6, 1),
        (7, 4),
        (8, 6),
        (9, 2),
        (10, 2),
    ];
    let h = Histogram::merge([&counts[..]]);
    let n = h.n();
    let rounds = 20_000;
    let mut fast = [0u32; 11];
    let mut slow = [0u32; 11];
    let mut rng = Rng::stream(1, &["shortcut"]);
    for _ in 0..rounds {
        fast[rng.resampled_percentile(&h, 500).unwrap() as usize] += 1;
        let mut draws: Vec<u64> = (0..n)
            .map(|_| h.value_at_rank(rng.next_u64() % n + 1).unwrap())
            .collect();
        draws.sort_unstable();
        slow[draws[(nearest_rank(n, 500) - 1) as usize] as usize] += 1;
    }
    for v in 1..=10 {
        let (f, s) = (
            f64::from(fast[v]) / f64::from(rounds),
            f64::from(slow[v]) / f64::from(rounds),
        );
        assert!((f - s).abs() < 0.015, "value {v}: shortcut {f}, direct {s}");
    }
}

#[test]
fn binomial_draws_have_the_binomial_mean_and_variance() {
    let mut rng = Rng::stream(3, &["binomial"]);
    for (n, p) in [(1_000u64, 0.3), (1_000_000_000, 0.01), (50, 0.5)] {
        let rounds = 4_000;
        let draws: Vec<f64> = (0..rounds).map(|_| rng.binomial(n, p) as f64).collect();
        let mean = draws.iter().sum::<f64>() / rounds as f64;
        let var = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (rounds - 1) as f64;
        let (m, v) = (n as f64 * p, n as f64 * p * (1.0 - p));
        assert!(
            (mean - m).abs() < 4.0 * (v / rounds as f64).sqrt(),
            "n {n}: mean {mean} vs {m}"
        );
        assert!((var / v - 1.0).abs() < 0.1, "n {n}: variance {var} vs {v}");
    }
    assert_eq!(rng.binomial(1_000, 0.0), 0);
    assert_eq!(rng.binomial(1_000, 1.0), 1_000);
}

#[test]
fn the_table_lines_up_and_reads_plainly() {
    let mut s = constant_pair();
    s.experiments[0].arms[0].weight = 90;
    s.experiments[0].arms[1].weight = 10;
    s.experiments[0].arms[0].share = Some(0.9);
    s.experiments[0].arms[1].share = Some(0.1);
    let table = report(&s).to_string();
    let expected = "\
node trainer-0: snapshot taken 2023-11-14 22:13:20 UTC, covering 600 s; sizes: all
latency: nearest-rank percentiles of successful fetches; throughput: bytes per second of fetch time

experiment shm-vs-http (unit shard, control posix-shm)
  arm        transport  weight  share  assigned    n      p50      p90      p99  throughput  errors  error rate  downgrades  status
  posix-shm  posix-shm      90  90.0%       100  100  10.0 us  10.0 us  10.0 us  409.6 MB/s       0       0.00%           0  control
  http       http           10  10.0%       100  100  20.0 us  20.0 us  20.0 us  204.8 MB/s       0       0.00%           0  active
  differences vs control posix-shm (bootstrap 95% CI, 2000 resamples, seed 1):
    http  p50         http is slower than posix-shm by 10.0 us p50 (95% CI 10.0..10.0 us); ratio 2.00x (95% CI 2.00x..2.00x)
    http  error rate  no significant difference in error rate between http and posix-shm (+0.00 pp, 95% CI 0.00..0.00 pp)
";
    assert_eq!(table, expected);
}

#[test]
fn labels_pick_their_units() {
    assert_eq!(latency_label(850), "850 ns");
    assert_eq!(latency_label(35_049), "35.0 us");
    assert_eq!(latency_label(1_250_000), "1.2 ms");
    assert_eq!(latency_label(2_000_000_000), "2.0 s");
    assert_eq!(utc_label(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(utc_label(1_700_000_000_000), "2023-11-14 22:13:20 UTC");
    assert_eq!(utc_label(951_782_400_000), "2000-02-29 00:00:00 UTC");
}

/// A minimal well-formedness check: tags nest and close, attribute values
/// are quoted, text holds no raw `<` and only known entities.
fn assert_well_formed(doc: &str) {
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = doc.trim();
    assert!(rest.starts_with("<?xml"), "no XML declaration");
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        for (i, _) in text.match_indices('&') {
            let ent = &text[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| ent.starts_with(e)),
                "bare & in {text:?}"
            );
        }
        let close = rest[open..].find('>').expect("unclosed tag") + open;
        let tag = &rest[open + 1..close];
        assert_eq!(
            tag.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        assert!(!tag.contains('<'), "< inside <{tag}>");
        if tag.starts_with('?') {
            assert!(tag.ends_with('?'));
        } else if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().unwrap());
        }
        rest = &rest[close + 1..];
    }
    assert!(rest.trim().is_empty(), "text after the root: {rest:?}");
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn decade_ticks_have_round_labels() {
    let labels: Vec<String> = (0..=10).map(plot::decade_label).collect();
    assert_eq!(
        labels,
        [
            "1 ns", "10 ns", "100 ns", "1 us", "10 us", "100 us", "1 ms", "10 ms", "100 ms", "1 s",
            "10 s"
        ]
    );
}

#[test]
fn the_plot_is_well_formed_svg_with_one_line_per_arm() {
    let s = snap(vec![
        experiment(
            "shm-vs-http",
            vec![
                arm("posix-shm", &spread(0)),
                arm("http <&> \"q\"", &spread(40_000)),
            ],
        ),
        experiment(
            "one",
            vec![
                arm("a", &[(10_000, 100)]),
                arm("b", &[(20_000, 1)]),
                arm("c", &[(7, 3)]),
            ],
        ),
    ]);
    let svg = report(&s).plot_svg();
    assert_well_formed(&svg);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 5);
    assert!(svg.contains("http &lt;&amp;&gt; &quot;q&quot; (n=1000)"));
    assert!(svg.contains("latency CDF, experiment shm-vs-http"));
    assert!(svg.contains(">fetch latency (log scale)<"));
    assert!(svg.contains(">cumulative fraction of fetches<"));
    // Decade ticks of the first panel: 10 us .. 100 us.
    assert!(svg.contains(">10 us<") && svg.contains(">100 us<"), "{svg}");
    // Each CDF ends at fraction 1 (the top edge of the plot area).
    for line in svg.lines().filter(|l| l.starts_with("<polyline")) {
        assert!(
            line.ends_with(" 660.0,45.0\"/>") || line.ends_with(" 660.0,465.0\"/>"),
            "{line}"
        );
    }
}

proptest::proptest! {
    /// The weighted nearest-rank percentile equals the nearest-rank
    /// percentile of the histogram expanded into its samples.
    #[test]
    fn percentiles_match_the_expanded_samples(
        pairs in proptest::collection::vec((0u64..5_000, 0u64..20), 1..12),
        per_mille in 1u64..=1000,
    ) {
        let h = Histogram::merge([&pairs[..]]);
        let mut samples: Vec<u64> = pairs
            .iter()
            .flat_map(|&(v, c)| std::iter::repeat_n(v, c as usize))
            .collect();
        samples.sort_unstable();
        proptest::prop_assert_eq!(h.n(), samples.len() as u64);
        let expected = (!samples.is_empty()).then(|| {
            let rank = (samples.len() as u64 * per_mille).div_ceil(1000).max(1);
            samples[(rank - 1) as usize]
        });
        proptest::prop_assert_eq!(h.percentile(per_mille), expected);
    }
}
