//! `shardport ab report` run as a user would: on a snapshot file written by
//! the test, and against a stand-in control endpoint.

use std::{
    io::{Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn shardport() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardport"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Control `posix-shm`: 200 fetches at 10 us; `http`: 200 at 45 us and 10
/// errors; `spool` (disabled by the guardrail): 30 at 1 ms.
fn snapshot_json() -> serde_json::Value {
    let arm = |name: &str, weight: u32, value: u64, n: u64, errors: u64, disabled: Option<&str>| {
        serde_json::json!({
            "weight": weight,
            "assigned": n + errors,
            "disabled": disabled,
            "name": name,
            "transport": name,
            "fetches": n,
            "bytes": n * 65536,
            "errors": errors,
            "downgrades": 0,
            "latency_ns_total": n * value,
            "latency": [{ "size": "64KiB", "counts": [[value, n]] }],
        })
    };
    serde_json::json!({
        "format": "shardport-metrics/1",
        "node": "rollout-3",
        "taken_at_unix_ms": 1_700_000_000_000u64,
        "window_s": 120.0,
        "transports": [],
        "experiments": [{
            "name": "shm-vs-http",
            "unit": "fetch",
            "control": "posix-shm",
            "arms": [
                arm("posix-shm", 80, 10_000, 200, 0, None),
                arm("http", 15, 45_000, 200, 10, None),
                arm("spool", 5, 1_000_000, 30, 0, Some("p99 above 500 us")),
            ],
        }],
        "downgrades": 0,
        "no_candidate": 0,
    })
}

fn write_snapshot(dir: &Path, value: &serde_json::Value) -> PathBuf {
    let p = dir.join("snapshot.json");
    std::fs::write(&p, serde_json::to_string_pretty(value).unwrap()).unwrap();
    p
}

fn report(args: &[&str]) -> Output {
    shardport()
        .args(["ab", "report"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn report_prints_every_arm_and_writes_a_well_formed_plot() {
    let dir = tempfile::tempdir().unwrap();
    let snap = write_snapshot(dir.path(), &snapshot_json());
    let plot = dir.path().join("cdf.svg");
    let out = report(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for arm in ["posix-shm", "http", "spool"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{arm} "))),
            "no row for {arm}:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("experiment shm-vs-http (unit fetch, control posix-shm)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("http is slower than posix-shm by 35.0 us p50 (95% CI 35.0..35.0 us)"),
        "{stdout}"
    );
    // 10 errors in 210 attempts.
    assert!(stdout.contains("4.76%"), "{stdout}");
    assert!(stdout.contains("disabled: p99 above 500 us"), "{stdout}");
    assert!(
        stdout.contains(&format!("plot: {}", plot.display())),
        "{stdout}"
    );

    let svg = std::fs::read_to_string(&plot).unwrap();
    let svg = svg.trim();
    assert!(svg.starts_with("<?xml") || svg.starts_with("<svg"), "{svg}");
    assert!(svg.ends_with("</svg>"), "{svg}");
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("<polyline").count(), 3);
    assert_eq!(svg.matches("<g>").count(), svg.matches("</g>").count());
}

#[test]
fn json_output_carries_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let snap = write_snapshot(dir.path(), &snapshot_json());
    let out = report(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--json",
        "--seed",
        "9",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["seed"], 9);
    assert_eq!(v["resamples"], 2000);
    let e = &v["experiments"][0];
    assert_eq!(e["arms"][1]["name"], "http");
    assert_eq!(e["arms"][1]["n"], 200);
    assert_eq!(e["arms"][1]["p50_ns"], 45_000);
    assert_eq!(e["arms"][2]["disabled"], "p99 above 500 us");
    let d = &e["differences"][0];
    assert_eq!(d["arm"], "http");
    assert_eq!(d["p50"]["estimate"], 35_000.0);
    assert_eq!(d["p50"]["ci95"], serde_json::json!([35_000.0, 35_000.0]));
    assert_eq!(d["p50"]["verdict"], "higher");
    assert_eq!(e["differences"][1]["arm"], "spool");
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = snapshot_json();
    v["format"] = "shardport-metrics/9".into();
    let snap = write_snapshot(dir.path(), &v);
    let out = report(&["--snapshot", snap.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: snapshot {}: format is \"shardport-metrics/9\", expected \"shardport-metrics/1\"\n",
            snap.display()
        )
    );

    let snap = write_snapshot(dir.path(), &snapshot_json());
    let out = report(&[
        "--snapshot",
        snap.to_str().unwrap(),
        "--experiment",
        "canary",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: no experiment `canary` in the snapshot of node `rollout-3`; available: shm-vs-http\n"
    );

    let out = report(&["--snapshot", snap.to_str().unwrap(), "--plot", "cdf.png"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("only SVG plots are written"));

    let out = report(&["--snapshot", "/nonexistent/snap.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("error: cannot read snapshot /nonexistent/snap.json:"),
        "{}",
        text(&out.stderr)
    );

    let out = report(&[]);
    assert_eq!(out.status.code(), Some(2), "neither --snapshot nor --node");
}

/// A control endpoint that answers one request with `body` and hands back
/// the request head.
fn one_shot_endpoint(body: String) -> (String, std::thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let served = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        String::from_utf8(head).unwrap()
    });
    (addr, served)
}

#[test]
fn report_scrapes_a_node_with_its_token() {
    let (addr, served) = one_shot_endpoint(snapshot_json().to_string());
    let out = shardport()
        .args([
            "ab",
            "report",
            "--node",
            &addr,
            "--experiment",
            "shm-vs-http",
        ])
        .env("SHARDPORT_TOKEN", "s3cret")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("node rollout-3: snapshot taken 2023-11-14 22:13:20 UTC"));
    let head = served.join().unwrap();
    assert!(
        head.starts_with("GET /v1/metrics.json HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains("authorization: Bearer s3cret\r\n"), "{head}");
}

#[test]
fn a_node_that_is_not_there_is_a_runtime_failure() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let out = report(&["--node", &addr]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with(&format!(
            "error: cannot scrape metrics: control endpoint {addr}:"
        )),
        "{}",
        text(&out.stderr)
    );
}
