//! A/B experiments with real plugins: an owner exporting every shard through
//! posix-shm and spool-dir (real segments, real files), consumers whose
//! `[[experiment]]` splits fetches between the two, the guardrail tripping
//! on real failures (the spool files vanish), and the metrics read back over
//! a real control endpoint and parsed with a Prometheus text parser.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use shardport_control::ControlServer;
use shardport_host::{FetchMode, Handle, Node, TensorSpec};

use crate::util;

fn owner(spool: &std::path::Path) -> Node {
    Node::start(util::parse(&format!(
        "{}{}",
        util::shm_plugin("pool-size = \"16MiB\""),
        util::spool_plugin(spool)
    )))
    .expect("owner starts")
}

fn consumer(
    spool: &std::path::Path,
    experiment: &str,
    clock: Option<Arc<util::ManualClock>>,
) -> Node {
    let cfg = util::parse(&format!(
        "[fetch]\non-downgrade = \"allow\"\n{experiment}\n{}{}",
        util::shm_plugin("pool-size = \"1MiB\""),
        util::spool_plugin(spool)
    ));
    match clock {
        Some(c) => Node::start_with_clock(cfg, c),
        None => Node::start(cfg),
    }
    .expect("consumer starts")
}

fn put_many(owner: &Node, n: usize) -> Vec<Handle> {
    (0..n)
        .map(|i| {
            owner
                .put(&[i as u8; 4096], &TensorSpec::bytes(4096), BTreeMap::new())
                .unwrap()
        })
        .collect()
}

fn metric(scrape: &prometheus_parse::Scrape, name: &str, pairs: &[(&str, &str)]) -> f64 {
    let s = scrape
        .samples
        .iter()
        .find(|x| x.metric == name && pairs.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name} {pairs:?}"));
    match s.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
        ref other => panic!("{name}: unexpected {other:?}"),
    }
}

const SPLIT: &str = r#"
[[experiment]]
name = "shm-vs-spool"
unit = "shard"
arms = [
  { name = "control", transport = "posix-shm", weight = 70 },
  { name = "spool", transport = "spool-dir", weight = 30 },
]
"#;

#[test]
fn arms_follow_weights_stick_per_shard_across_consumers_and_show_in_metrics() {
    let dir = util::temp_dir("ab-split");
    let o = owner(dir.path());
    let handles = put_many(&o, 400);
    let a = consumer(dir.path(), SPLIT, None);
    let b = consumer(dir.path(), SPLIT, None);
    let mut spool = 0usize;
    for h in &handles {
        let mut used = Vec::new();
        for n in [&a, &b, &a] {
            let f = n.fetch_mode(h, FetchMode::Copy).unwrap();
            assert!(f.data.iter().all(|&x| x == f.data[0]));
            assert!(
                f.selection
                    .reason
                    .starts_with("experiment `shm-vs-spool` arm"),
                "{}",
                f.selection.reason
            );
            assert!(!f.selection.downgraded);
            used.push(f.selection.transport);
        }
        assert!(
            used.iter().all(|t| *t == used[0]),
            "shard {} moved between arms: {used:?}",
            h.id
        );
        spool += usize::from(used[0] == "spool-dir");
    }
    // 400 shards at 30%: standard deviation 2.3 points; 10 points is > 4 sigma.
    let share = spool as f64 / handles.len() as f64;
    assert!((share - 0.30).abs() < 0.10, "spool-dir share {share}");

    // The node's own metrics agree with what the fetches reported.
    let snap = a.metrics_snapshot();
    let e = &snap.experiments[0];
    assert_eq!(
        (e.name.as_str(), e.control.as_str()),
        ("shm-vs-spool", "control")
    );
    let (ctl, arm) = (&e.arms[0], &e.arms[1]);
    assert_eq!(arm.series.fetches as usize, 2 * spool);
    assert_eq!(ctl.series.fetches as usize, 2 * (handles.len() - spool));
    assert_eq!(ctl.assigned + arm.assigned, 2 * handles.len() as u64);
    assert_eq!(
        arm.series.latency.iter().map(|h| h.n()).sum::<u64>(),
        arm.series.fetches
    );
    assert!(arm.series.latency.iter().all(|h| h.size == "4KiB"));

    // Over a real control endpoint: token enforced, text parses, same numbers.
    let server = ControlServer::start(&a, "127.0.0.1:0", Some("tok".into())).unwrap();
    let addr = server.addr().to_string();
    let t = Duration::from_secs(10);
    let denied = shardport_control::client::get_text(&addr, "/metrics", None, t).unwrap_err();
    assert!(denied.to_string().contains("401"), "{denied}");
    let text = shardport_control::client::get_text(&addr, "/metrics", Some("tok"), t).unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let arm_labels = [("experiment", "shm-vs-spool"), ("arm", "spool")];
    assert_eq!(
        metric(&scrape, "shardport_experiment_fetches_total", &arm_labels),
        (2 * spool) as f64
    );
    assert_eq!(
        metric(&scrape, "shardport_experiment_arm_enabled", &arm_labels),
        1.0
    );
    assert_eq!(
        metric(
            &scrape,
            "shardport_fetches_total",
            &[("transport", "spool-dir")]
        ),
        (2 * spool) as f64
    );
    let json =
        shardport_control::client::call(&addr, "GET", "/v1/metrics.json", Some("tok"), &[], t)
            .unwrap();
    let parsed: shardport_host::snapshot::Snapshot = serde_json::from_value(json).unwrap();
    assert_eq!(
        parsed.experiments[0].arms[1].series.fetches as usize,
        2 * spool
    );

    // `shardport ab report` scrapes the live node and compares the arms.
    let svg = dir.path().join("cdf.svg");
    let svg_arg = svg.display().to_string();
    let stdout = util::shardport_ok(&[
        "ab", "report", "--node", &addr, "--token", "tok", "--json", "--plot", &svg_arg,
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let text = report.to_string();
    assert!(
        text.contains("shm-vs-spool") && text.contains("\"spool\""),
        "{text}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.trim_end().ends_with("</svg>"));
    assert_eq!(plot.matches("<polyline").count(), 2, "one CDF line per arm");
}

#[test]
fn guardrail_disables_a_failing_arm_and_its_traffic_moves_to_control() {
    let dir = util::temp_dir("ab-guardrail");
    let o = owner(dir.path());
    let handles = put_many(&o, 200);
    let clock = Arc::new(util::ManualClock::default());
    let c = consumer(
        dir.path(),
        r#"
[[experiment]]
name = "canary"
arms = [
  { name = "control", transport = "posix-shm", weight = 50 },
  { name = "spool", transport = "spool-dir", weight = 50 },
]
guardrail = { max-error-rate = 0.2, window = "60s", min-samples = 10 }
"#,
        Some(clock.clone()),
    );
    // The spool medium fails: every file the owner wrote disappears.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "shard") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let spool_errors = |n: &Node| n.stats().transports["spool-dir"].errors;
    let mut tripped_after = None;
    for (i, h) in handles.iter().enumerate() {
        // Every fetch still succeeds: the spool arm falls back to posix-shm.
        let f = c.fetch_mode(h, FetchMode::Copy).unwrap();
        assert_eq!(f.selection.transport, "posix-shm");
        assert!(f.data.iter().all(|&x| x == i as u8));
        clock.advance(Duration::from_millis(10));
        if tripped_after.is_none()
            && c.metrics_snapshot().experiments[0].arms[1]
                .disabled
                .is_some()
        {
            tripped_after = Some((i, spool_errors(&c)));
        }
    }
    let (at, errors_at_trip) = tripped_after.expect("the guardrail tripped");
    // It needed min-samples attempts and tripped on the first judgement.
    assert_eq!(errors_at_trip, 10, "tripped at fetch {at}");
    // After the trip nothing more went to spool-dir.
    assert_eq!(spool_errors(&c), errors_at_trip);
    let snap = c.metrics_snapshot();
    let arm = &snap.experiments[0].arms[1];
    assert_eq!(arm.guardrail_trips, 1);
    assert!(
        arm.disabled.as_deref().unwrap().contains("max-error-rate"),
        "{:?}",
        arm.disabled
    );
    assert_eq!((arm.series.errors, arm.series.downgrades), (10, 10));
    assert!(arm.redirected > 0, "drawn-for-spool fetches after the trip");
    assert_eq!(
        snap.experiments[0].arms[0].assigned,
        handles.len() as u64 - 10,
        "all but the 10 failed spool fetches ran as control"
    );
    // A redirected fetch says why.
    let redirected = handles
        .iter()
        .map(|h| c.fetch_mode(h, FetchMode::Copy).unwrap().selection.reason)
        .find(|r| r.contains("disabled by its guardrail"))
        .expect("a redirected fetch");
    assert!(redirected.contains("arm `control`"), "{redirected}");

    // An operator re-enables the arm over the control endpoint.
    let server = ControlServer::start(&c, "127.0.0.1:0", None).unwrap();
    let addr = server.addr().to_string();
    let t = Duration::from_secs(10);
    let bad = shardport_control::client::call(
        &addr,
        "POST",
        "/v1/experiments/reset",
        None,
        br#"{"experiment": "nope"}"#,
        t,
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("no experiment `nope` (configured: canary)"),
        "{bad}"
    );
    let stdout = util::shardport_ok(&["ab", "reset", "--node", &addr, "--experiment", "canary"]);
    assert!(stdout.contains("re-enabled canary/spool"), "{stdout}");
    assert!(c.metrics_snapshot().experiments[0].arms[1]
        .disabled
        .is_none());
    // The spool files are still gone: the arm fails again and trips again.
    for h in &handles {
        c.fetch_mode(h, FetchMode::Copy).unwrap();
    }
    assert_eq!(
        c.metrics_snapshot().experiments[0].arms[1].guardrail_trips,
        2
    );
}

#[test]
fn a_tripped_arm_is_probed_after_its_cooldown_and_recovers_once_its_transport_works() {
    let dir = util::temp_dir("ab-half-open");
    let o = owner(dir.path());
    let clock = Arc::new(util::ManualClock::default());
    let c = consumer(
        dir.path(),
        r#"
[[experiment]]
name = "canary"
arms = [
  { name = "control", transport = "posix-shm", weight = 50 },
  { name = "spool", transport = "spool-dir", weight = 50 },
]
guardrail = { max-error-rate = 0.2, window = "10s", min-samples = 10, cooldown = "30s", probe-share = 0.5 }
"#,
        Some(clock.clone()),
    );
    let state = |c: &Node| c.metrics_snapshot().experiments[0].arms[1].state.clone();
    // The spool medium fails: the arm trips.
    let broken = put_many(&o, 100);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    for h in &broken {
        c.fetch_mode(h, FetchMode::Copy).unwrap();
    }
    assert_eq!(state(&c), "tripped");
    // The medium is back (new shards, new files), but the cool-down holds.
    let fresh = put_many(&o, 400);
    clock.advance(Duration::from_secs(29));
    for h in &fresh[..50] {
        assert_eq!(
            c.fetch_mode(h, FetchMode::Copy)
                .unwrap()
                .selection
                .transport,
            "posix-shm"
        );
    }
    assert_eq!(state(&c), "tripped");
    // After it, probes (half of the arm's draws) go to spool-dir, pass,
    // and the arm takes its whole share again.
    clock.advance(Duration::from_secs(2));
    let mut via_spool = 0;
    for h in &fresh {
        let f = c.fetch_mode(h, FetchMode::Copy).unwrap();
        if f.selection.transport == "spool-dir" {
            via_spool += 1;
            assert!(
                f.selection.reason.contains("probe") || state(&c) == "enabled",
                "{}",
                f.selection.reason
            );
        }
    }
    assert!(
        via_spool >= 10,
        "{via_spool} probes and fetches via spool-dir"
    );
    assert_eq!(state(&c), "enabled");
    let snap = c.metrics_snapshot();
    let kinds: Vec<&str> = snap.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["trip", "probe", "recover"], "{:?}", snap.events);
    assert_eq!(snap.experiments[0].arms[1].guardrail_trips, 1);
}
