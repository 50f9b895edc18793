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
