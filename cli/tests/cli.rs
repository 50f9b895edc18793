//! The `shardport` binary's config and plugin commands, run as a user would.
//! (Also makes `cargo test --workspace` build the binary the end-to-end tests start.)

use std::process::Command;

fn shardport() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardport"))
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn config_check_points_at_the_bad_value() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "bad.toml", "[fetch]\nmode = \"fast\"\n");
    let out = shardport()
        .args(["config", "check"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "error: `fetch.mode`: expected \"view\" or \"copy\", found \"fast\"\n --> {}:2:8\n  |\n2 | mode = \"fast\"\n  |        ^^^^^^\n  = help: example: mode = \"view\"\n",
        f.display()
    );
    assert_eq!(err, expected);
}

#[test]
fn config_check_warns_about_unknown_keys_and_reports_missing_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "node.toml",
        "[fetch]\nmod = \"view\"\n[[plugin]]\nname = \"posix-shm\"\npath = \"nowhere/libx.so\"\n",
    );
    let out = shardport()
        .args(["config", "check"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("warning: unknown config key `fetch.mod` (ignored)"),
        "{text}"
    );
    assert!(text.contains("(file not found)"), "{text}");
}

#[test]
fn a_missing_config_file_is_named() {
    let out = shardport()
        .args(["config", "check", "/nonexistent/x.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: cannot read config file /nonexistent/x.toml:"),
        "{err}"
    );
}

#[test]
fn plugins_reports_a_required_plugin_that_does_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "node.toml",
        "[[plugin]]\nname = \"posix-shm\"\npath = \"libnothere.so\"\nrequired = true\n",
    );
    let out = shardport()
        .args(["plugins", "--config"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("posix-shm    NOT LOADED"), "{text}");
    assert!(text.contains("library `libnothere.so` not found"), "{text}");
}

#[test]
fn bench_quick_writes_every_cell_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let svg = dir.path().join("bench.svg");
    let out = shardport()
        .args([
            "bench",
            "--quick",
            "--sizes",
            "4KiB,64KiB",
            "--paths",
            "shm-view,shm-copy,http,cuda-ipc,cuda-copy,cuda-http",
            "--json",
        ])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Progress goes to stderr, the table to stdout.
    assert!(stderr.contains("http fetch 64 KiB"), "{stderr}");
    assert!(stdout.contains("targets"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["schema"], 1);
    for key in ["cpu_model", "cores", "memory_bytes", "kernel", "hostname"] {
        assert!(!report["machine"][key].is_null(), "machine.{key} missing");
    }
    assert!(report["date"].as_str().unwrap().ends_with('Z'));
    assert_eq!(report["command"][1], "bench");
    assert_eq!(report["limits"]["memcpy"].as_array().unwrap().len(), 2);
    assert_eq!(
        report["limits"]["tcp_round_trip"].as_array().unwrap().len(),
        2
    );

    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 6 * 3 * 2, "{cells:?}");
    let gpu_paths = ["cuda-ipc", "cuda-copy", "cuda-http"];
    for path in ["shm-view", "shm-copy", "http"].iter().chain(&gpu_paths) {
        for op in ["put", "fetch", "put-fetch"] {
            for size in [4096u64, 65536] {
                let c = cells
                    .iter()
                    .find(|c| c["path"] == *path && c["op"] == op && c["size"] == size)
                    .unwrap_or_else(|| panic!("no cell {path} {op} {size}"));
                match c["status"].as_str().unwrap() {
                    "ok" => {
                        let s = &c["samples"];
                        assert_eq!(s["n"], 3, "{c}");
                        for k in ["median_us", "p90_us", "min_us", "max_us"] {
                            assert!(s[k].as_f64().unwrap() > 0.0, "{c}");
                        }
                        assert!(s["min_us"].as_f64() <= s["median_us"].as_f64());
                        assert!(s["median_us"].as_f64() <= s["max_us"].as_f64());
                        // What moves no bytes (a view, a device put) is
                        // judged by the latency target, the rest by a limit.
                        let view = matches!(*path, "shm-view" | "cuda-ipc") && op == "fetch";
                        let device_put = gpu_paths.contains(path) && op == "put";
                        let device_view = *path == "cuda-ipc" && op == "put-fetch";
                        if view || device_put || device_view {
                            assert_eq!(c["target_us"], 20.0, "{c}");
                        } else {
                            assert!(c["ratio"].as_f64().unwrap() > 0.0, "{c}");
                            assert!(c["limit"]["name"].is_string(), "{c}");
                        }
                    }
                    "skipped" => {
                        // Only the GPU paths, each naming why: no cuda-ipc,
                        // or no CUDA driver in the bench process.
                        assert!(gpu_paths.contains(path), "{c}");
                        let why = c["reason"].as_str().unwrap();
                        assert!(
                            why.contains("cuda-ipc") || why.contains("CUDA driver"),
                            "{c}"
                        );
                    }
                    other => panic!("cell {path} {op} {size} is {other}: {c}"),
                }
            }
        }
    }
    // The skip reason is shown in the table too, not only in the JSON.
    assert!(
        stdout.contains("cuda-ipc  every op and size  skipped (6 cells): plugin `cuda-ipc`"),
        "{stdout}"
    );
    let extras = report["extras"].as_array().unwrap();
    for key in [
        "dispatch_overhead_ns",
        "batch_shards_per_s",
        "many_small_put_per_s",
        "many_small_fetch_shm_per_s",
        "many_small_fetch_http_per_s",
        "http_consumer_peak_rss_x",
    ] {
        assert!(
            extras
                .iter()
                .any(|e| e["key"] == key && e["value"].is_number()),
            "{key} missing: {extras:?}"
        );
    }
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 13);
    assert!(targets
        .iter()
        .all(|t| t["met"].is_boolean() || t["met"].is_null()));

    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("shm-copy fetch"),
        "the legend names the series"
    );
}

#[test]
fn bench_refuses_unknown_paths_and_malformed_sizes() {
    let out = shardport()
        .args(["bench", "--paths", "shm-view,rdma"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown path `rdma`; expected one of shm-view, shm-copy, http, cuda-ipc"),
        "{err}"
    );

    let out = shardport()
        .args(["bench", "--sizes", "4KiB,12 parsecs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`12 parsecs` is not a byte size") && err.contains("--sizes"),
        "{err}"
    );

    let out = shardport()
        .args(["bench", "--ops", "get"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown operation `get`"));
}
