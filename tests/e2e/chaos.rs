//! `shardport soak --chaos` in its CI form: about a minute of real owner and
//! consumer processes killed at random, with reloads, drains and sweeps on
//! short intervals. Checks behaviour only (no byte wrong, no segment left
//! after the final sweep, the chaos actually happened), never speed or
//! memory figures, which depend on the machine.

use crate::util;

#[test]
fn chaos_soak_kills_reloads_and_loses_nothing() {
    let dir = util::temp_dir("chaos");
    let json = dir.path().join("chaos.json");
    let plot = dir.path().join("chaos.svg");
    let metrics = dir.path().join("metrics");
    std::fs::create_dir_all(&metrics).unwrap();
    let out = std::process::Command::new(util::shardport_bin())
        .args([
            "soak",
            "--chaos",
            "--duration",
            "60s",
            "--owners",
            "2",
            "--consumers",
            "3",
            "--seed",
            "7",
            "--kill-every",
            "3s",
            "--reload-every",
            "10s",
            "--sweep-every",
            "5s",
            "--snapshot-every",
            "10s",
            "--shards-per-owner",
            "16",
            "--pool-mib",
            "64",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&plot)
        .arg("--metrics-dir")
        .arg(&metrics)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the chaos soak failed:\n{stdout}\n{stderr}"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let n = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("`{k}` missing in the report: {r}"))
    };
    assert_eq!(n("wrong_bytes"), 0, "{stdout}");
    assert_eq!(n("leaked_segments"), 0, "{stdout}");
    assert!(n("fetches") > 0, "{stdout}");
    for key in ["rss_start", "rss_end", "fds_start", "fds_end"] {
        assert!(n(key) > 0, "{key}: {stdout}");
    }
    let kills: u64 = r["kills"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(kills >= 1, "no kill happened: {stdout}");
    assert!(n("restarts") >= 1, "{stdout}");
    assert_eq!(n("unexpected_exits"), 0, "{stdout}");
    let reloads = &r["reloads"];
    assert!(reloads["applied"].as_u64().unwrap() >= 1, "{stdout}");
    assert_eq!(reloads["refused"], 0, "{stdout}");
    assert!(reloads["probes"].as_u64().unwrap() >= 1, "{stdout}");
    assert_eq!(reloads["probes"], reloads["probes_refused"], "{stdout}");
    assert!(n("sweeps") >= 1, "{stdout}");
    // Views and copies both ran, through shared memory and http.
    for kind in ["view", "copy"] {
        assert!(r["fetch_kinds"][kind].as_u64().unwrap_or(0) > 0, "{stdout}");
    }
    for transport in ["posix-shm", "http"] {
        assert!(
            r["served_by"][transport].as_u64().unwrap_or(0) > 0,
            "{stdout}"
        );
    }
    // The snapshots, and the run cleaned up after itself: nothing with its
    // prefix is left in /dev/shm.
    assert!(r["snapshots"].as_array().unwrap().len() >= 2, "{stdout}");
    let prefix = r["segment_prefix"].as_str().unwrap();
    assert!(util::shm_segments(prefix).is_empty());
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"), "{svg}");
    // Each worker's metrics, labelled, for a textfile collector.
    let owner = std::fs::read_to_string(metrics.join("shardport-soak-owner-0.prom")).unwrap();
    assert!(
        owner.contains("shardport_shards_owned{soak_worker=\"owner-0\","),
        "{owner}"
    );
    let consumer = std::fs::read_to_string(metrics.join("shardport-soak-consumer-0.prom")).unwrap();
    assert!(
        consumer.contains("shardport_fetches_total{soak_worker=\"consumer-0\","),
        "{consumer}"
    );
}

#[test]
fn chaos_soak_refuses_bad_arguments() {
    let out = std::process::Command::new(util::shardport_bin())
        .args(["soak", "--chaos", "--owners", "0", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--owners"));
    let out = std::process::Command::new(util::shardport_bin())
        .args(["soak", "--chaos", "--duration", "forever"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("forever"));
}
