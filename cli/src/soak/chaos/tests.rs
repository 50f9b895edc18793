//! Unit tests of the chaos soak's pieces (the whole soak runs in
//! tests/e2e/chaos.rs).

use super::report::shm_mapped_bytes;
use super::*;

fn opts() -> ChaosOptions {
    ChaosOptions::new("shardport".into(), "/nonexistent".into())
}

#[test]
fn configs_parse_at_every_generation() {
    let o = opts();
    for generation in 0..12 {
        for role in [Role::Owner, Role::Consumer] {
            let text = config_text(&o, "chaos1x0", role, 1, generation, generation % 2 == 0);
            let parsed: toml::Value = toml::from_str(&text).expect("valid TOML");
            assert_eq!(
                parsed["node"]["name"].as_str(),
                Some(&*format!("chaos-{role}-1"))
            );
        }
    }
    // The weights, cache limit and routes change between generations.
    let a = config_text(&o, "p", Role::Consumer, 0, 0, true);
    let b = config_text(&o, "p", Role::Consumer, 0, 1, true);
    assert_ne!(a, b);
}

#[test]
fn rng_is_seeded_and_jitter_bounded() {
    let (mut a, mut b) = (Rng::new(5), Rng::new(5));
    for _ in 0..100 {
        assert_eq!(a.next_u64(), b.next_u64());
        let j = a.jitter(Duration::from_secs(10));
        assert_eq!(j, b.jitter(Duration::from_secs(10)));
        assert!(j >= Duration::from_secs(5) && j <= Duration::from_secs(15));
        assert!(a.below(3) < 3);
        b.below(3);
    }
}

#[test]
fn prefix_is_a_valid_segment_prefix() {
    let p = run_prefix(42);
    assert!(p.len() <= 32, "{p}");
    assert!(p.chars().next().is_some_and(|c| c.is_ascii_alphabetic()));
    assert!(p.chars().all(|c| c.is_ascii_alphanumeric()));
    assert_ne!(p, run_prefix(42));
}

#[test]
fn summary_judges_flatness_after_the_mark() {
    let snap = |t_s: f64, anon: u64, fds: u64| ChaosSnapshot {
        t_s,
        reference: ProcUsage {
            rss: anon * 2,
            anon,
            fds,
            threads: 4,
            ..ProcUsage::default()
        },
        all: ProcUsage::default(),
        driver: ProcUsage::default(),
        workers: 2,
        shm_entries: 4,
        per_worker: BTreeMap::new(),
        fetches: 0,
    };
    let flat = |r: &ChaosReport, what: &str| {
        r.flatness
            .iter()
            .find(|c| c.what == what)
            .map(|c| c.flat)
            .unwrap()
    };
    let mut r = run_report_for_tests();
    // Growth before the mark is warm-up; after it, a plateau that moves up
    // and down (a cache held to a limit the reloads move) is flat.
    r.snapshots = vec![
        snap(0.0, 10, 10),
        snap(300.0, 100, 27),
        snap(600.0, 140, 27),
        snap(900.0, 120, 28),
        snap(1200.0, 145, 27),
        snap(1500.0, 130, 27),
    ];
    summarize(&mut r, Duration::from_secs(300));
    assert_eq!((r.rss_start, r.rss_mark, r.rss_end), (20, 200, 260));
    assert_eq!(r.mark_s, 300.0);
    assert_eq!(r.flatness.len(), 5);
    assert!(r.flat, "{:?}", r.flatness);
    // A steady leak sets its maximum late: not flat, and the check says
    // which resource grew.
    r.snapshots = (0..=10)
        .map(|i: u32| {
            snap(
                f64::from(i) * 300.0,
                100 + 20 * u64::from(i),
                27 + u64::from(i),
            )
        })
        .collect();
    summarize(&mut r, Duration::from_secs(300));
    assert!(!r.flat);
    assert!(!flat(&r, "private") && !flat(&r, "fds"));
    assert!(flat(&r, "threads") && flat(&r, "shm_entries"));
    assert!(r.to_string().contains("private"), "{r}");
    // Flatness is reported; only wrong bytes and leaks fail the run.
    assert!(r.failures().is_empty());
    r.leaked_segments = 1;
    r.wrong_bytes = 4096;
    assert_eq!(r.failures().len(), 2);
}

#[test]
fn shm_mappings_are_summed_from_proc_maps() {
    let maps = "\
7f0000000000-7f0010000000 rw-s 00000000 00:19 12 /dev/shm/spA-pool (deleted)
7f0010000000-7f0010001000 rw-s 00000000 00:19 13 /dev/shm/spA-board
7f0020000000-7f0020002000 rw-p 00000000 00:00 0 
7f0030000000-7f0030001000 r--p 00000000 08:01 99 /usr/lib/libc.so.6
";
    assert_eq!(shm_mapped_bytes(maps), (1 << 28) + 4096);
    assert_eq!(shm_mapped_bytes(""), 0);
}

fn run_report_for_tests() -> ChaosReport {
    ChaosReport::default()
}

#[test]
fn exported_series_carry_the_worker_label() {
    let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 3\nb{t=\"x\"} 1\nc{} 2\n";
    let out = label_series(text, "owner-0");
    assert_eq!(
        out,
        "# HELP a_total A.\n# TYPE a_total counter\na_total{soak_worker=\"owner-0\"} 3\n\
         b{soak_worker=\"owner-0\",t=\"x\"} 1\nc{soak_worker=\"owner-0\"} 2\n"
    );
}
