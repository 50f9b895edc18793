//! `shardport bench load` end to end, small and short: real owner and
//! consumer worker processes, posix-shm and http, views and copies, the
//! owner churning meanwhile; then each point's copy and TCP limits. Checks
//! behaviour (every consumer served, no error, the JSON fields the docs
//! name), not speed.

use crate::util;

#[test]
fn bench_load_serves_every_consumer_and_reports_each_point() {
    let out = util::shardport_ok(&[
        "bench",
        "load",
        "--consumers",
        "1,3",
        "--duration",
        "300ms",
        "--churn-rate",
        "200",
        "--json",
        "-",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (row, consumers) in rows.iter().zip([1, 3]) {
        assert_eq!(row["consumers"], consumers);
        for key in [
            "shards_per_s",
            "gbps",
            "p50_us",
            "p99_us",
            "share_min",
            "share_max",
            "owner_cpu_s_per_gb",
        ] {
            assert!(row[key].as_f64().is_some(), "{key} in {row}");
        }
        assert!(row["shards_per_s"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        // Every consumer got fetches served.
        assert!(row["share_min"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["churn_puts"].as_u64().unwrap() > 0, "{row}");
        // Half the fetches are copies, and the same consumers measured the
        // copy limit after the point.
        assert!(row["copy_gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["copy_limit_gbps"].as_f64().unwrap() > 0.0, "{row}");
        // Half go through http, and the same consumers measured the raw
        // TCP limit from the owner process after the point.
        assert!(row["http_gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["tcp_limit_gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["late_start_ms"].as_f64().unwrap() >= 0.0, "{row}");
    }
}

#[test]
fn bench_load_refuses_bad_arguments_naming_them() {
    let out = std::process::Command::new(util::shardport_bin())
        .args(["bench", "load", "--view-share", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("--view-share"), "{text}");
    let out = std::process::Command::new(util::shardport_bin())
        .args(["bench", "load", "--duration", "forever"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("forever"));
}

/// `bench load` with every limit of issue 27 tight, every fetched byte
/// checked: a lease table of one slot for 6 consumers (every view and
/// every copy through posix-shm takes it while it lasts, and two cores run
/// two consumers at once), a pool 32 KiB larger than the load's 16 shards
/// (the owner's 64 KiB churn puts find it full), an http owner with 2
/// connections and one worker thread for 6 consumers. The outcome is what
/// config says: with `fetch.exhausted-wait` unset, fetches that meet the
/// full lease table fail at once naming it, and puts that meet the full
/// pool fail naming it; with a wait of 2 s, fetches wait for the slot and
/// none fails. Never wrong bytes, never a consumer left unserved (the http
/// budget rotates its places), never a hang (the run ends).
#[test]
fn limits_driven_past_their_end_under_load_do_what_config_says() {
    let dir = util::temp_dir("load-limits");
    // SIZES x PER_SIZE: 4 x (4 KiB + 64 KiB + 1 MiB + 4 MiB) = 21250048
    // bytes, page-aligned; 32 KiB more leaves no room for a 64 KiB put.
    let pool = 21_250_048 + (32 << 10);
    let run = |fetch: &str, name: &str| {
        let text = format!(
            "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n[fetch]\n{fetch}\n{}\
             max-connections = 2\nthreads = 1\ndedicated-threads = 0\nheader-timeout = \"200ms\"\n\
             request-timeout = \"10s\"\n",
            util::shm_plugin(&format!(
                "segment-prefix = \"lim{}{name}\"\npool-size = {pool}\nmax-leases = 1",
                std::process::id()
            )) + &util::http_plugin()
        );
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = util::shardport_ok(&[
            "bench".as_ref(),
            "load".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
            "--consumers".as_ref(),
            "6".as_ref(),
            "--duration".as_ref(),
            "800ms".as_ref(),
            "--churn-rate".as_ref(),
            "200".as_ref(),
            "--verify".as_ref(),
            "--no-limits".as_ref(),
            "--json".as_ref(),
            "-".as_ref(),
        ]);
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
        rows[0].clone()
    };
    let at_once = run("", "now");
    let waits = run("exhausted-wait = \"2s\"", "wait");
    for row in [&at_once, &waits] {
        assert_eq!(row["verified"], true, "{row}");
        assert_eq!(row["wrong_fetches"], 0, "{row}");
        // Every consumer was served, http's included.
        assert!(row["share_min"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["http_gbps"].as_f64().unwrap() > 0.0, "{row}");
        // Every failed put met the full pool, and said so.
        let churn = row["churn_errors_by_kind"].as_object().unwrap();
        assert!(!churn.is_empty(), "the churn met the full pool: {row}");
        for message in row["churn_error_samples"].as_object().unwrap().values() {
            let m = message.as_str().unwrap();
            assert!(m.contains("pool is full"), "{m}");
        }
        // Every failed fetch met the lease table, and named its limit.
        for message in row["error_samples"].as_object().unwrap().values() {
            let m = message.as_str().unwrap();
            assert!(m.contains("lease slots") && m.contains("max-leases"), "{m}");
        }
    }
    assert!(
        at_once["errors"].as_u64().unwrap() > 0,
        "6 consumers met one lease slot: {at_once}"
    );
    assert_eq!(
        waits["errors"], 0,
        "every fetch waited for the slot: {waits}"
    );
}
