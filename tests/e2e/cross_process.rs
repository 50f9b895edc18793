//! Owner and consumer in separate processes (`shardport worker`), shards
//! moving through real shared-memory segments.

use shardport_cli::worker::{Request, WorkerProcess};
use shardport_host::FetchMode;

use crate::util;

struct Pair {
    owner: WorkerProcess,
    consumer: WorkerProcess,
    _dir: tempfile::TempDir,
}

fn start(test: &str, owner_cfg: &str, consumer_cfg: &str) -> Pair {
    let dir = util::temp_dir(test);
    let spawn = |role: &str, text: &str| {
        let sub = dir.path().join(role);
        std::fs::create_dir_all(&sub).unwrap();
        let (path, _) = util::write_config(&sub, text);
        WorkerProcess::spawn(
            role,
            &util::shardport_bin(),
            &["--config".into(), path.into_os_string()],
        )
        .expect("spawn worker")
    };
    Pair {
        owner: spawn("owner", owner_cfg),
        consumer: spawn("consumer", consumer_cfg),
        _dir: dir,
    }
}

fn pool_config(pool: &str) -> String {
    format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}",
        util::shm_plugin(&format!("pool-size = \"{pool}\""))
    )
}

#[test]
fn view_and_copy_fetches_across_processes_verify_every_byte() {
    let cfg = pool_config("64MiB");
    let mut p = start("xproc", &cfg, &cfg);
    for (i, len) in [0u64, 1, 4096, 3 << 20, (5 << 20) + 7]
        .into_iter()
        .enumerate()
    {
        let seed = 100 + i as u64;
        let h = util::put(&mut p.owner, len, seed).handle.unwrap();
        for mode in [FetchMode::View, FetchMode::Copy] {
            let r = util::fetch(&mut p.consumer, &h, mode, Some(seed), false, None).unwrap();
            assert_eq!(r.verified, Some(true), "len {len} {mode}");
            assert_eq!(r.transport.as_deref(), Some("posix-shm"));
            assert_eq!(r.mode, Some(mode));
            assert_eq!(r.downgraded, Some(false));
            let reason = r.reason.unwrap();
            assert!(
                reason.starts_with("owner on this node (address local, identity agrees)"),
                "{reason}"
            );
        }
    }
}

#[test]
fn a_removed_shard_is_not_found_by_the_consumer() {
    let cfg = pool_config("16MiB");
    let mut p = start("removed", &cfg, &cfg);
    let r = util::put(&mut p.owner, 4096, 1);
    p.owner
        .call(&Request::Remove {
            ids: vec![r.id.unwrap()],
        })
        .unwrap();
    let err = util::fetch(
        &mut p.consumer,
        &r.handle.unwrap(),
        FetchMode::Copy,
        Some(1),
        false,
        None,
    )
    .unwrap_err();
    assert!(err.contains("every transport failed: posix-shm:"), "{err}");
    assert!(err.ends_with("(not_found)"), "{err}");
}

#[test]
fn leased_space_is_never_reused_until_released() {
    // An 8 MiB pool: A (4 MiB) is viewed by the consumer and removed by the
    // owner. While the lease lives, the owner can place one more 4 MiB shard
    // but not two, and A's bytes stay intact; after release the space returns.
    let cfg = pool_config("8MiB");
    let mut p = start("lease", &cfg, &cfg);
    let four = 4 << 20;
    let a = util::put(&mut p.owner, four, 1);
    let a_id = a.id.clone().unwrap();
    let r = util::fetch(
        &mut p.consumer,
        a.handle.as_ref().unwrap(),
        FetchMode::View,
        Some(1),
        true,
        None,
    )
    .unwrap();
    assert_eq!(r.mode, Some(FetchMode::View));
    p.owner
        .call(&Request::Remove {
            ids: vec![a_id.clone()],
        })
        .unwrap();

    let b = util::put(&mut p.owner, four, 2);
    let full = util::try_put(&mut p.owner, four, 3).unwrap_err();
    assert!(
        full.contains("pool is full") || full.contains("resource_exhausted"),
        "{full}"
    );
    let check = p
        .consumer
        .call(&Request::Check {
            id: a_id.clone(),
            seed: 1,
        })
        .unwrap();
    assert_eq!(
        check.verified,
        Some(true),
        "leased bytes changed under the view"
    );

    p.consumer
        .call(&Request::Release { ids: vec![a_id] })
        .unwrap();
    let c = util::put(&mut p.owner, four, 3);
    for (h, seed) in [(b.handle.unwrap(), 2), (c.handle.unwrap(), 3)] {
        let r = util::fetch(
            &mut p.consumer,
            &h,
            FetchMode::Copy,
            Some(seed),
            false,
            None,
        )
        .unwrap();
        assert_eq!(r.verified, Some(true));
    }
}

#[test]
fn a_failing_transport_falls_back_and_reports_the_downgrade() {
    // The consumer's posix-shm only accepts segments named `other-*`, so it
    // refuses the owner's descriptor; the spool-dir transport completes the fetch.
    let dir = util::temp_dir("spool-fallback");
    let spool = format!(
        "[[plugin]]\nname = \"spool-dir\"\npath = \"{}\"\n[plugin.config]\ndir = \"{}\"\n",
        util::plugin_lib("shardport-spool-transport").display(),
        dir.path().display()
    );
    let owner_cfg = format!("{}{spool}", pool_config("16MiB"));
    let consumer_cfg = format!("{}{spool}", util::shm_plugin("segment-prefix = \"other\""));
    let mut p = start("fallback", &owner_cfg, &consumer_cfg);
    let h = util::put(&mut p.owner, 8192, 5).handle.unwrap();
    let r = util::fetch(&mut p.consumer, &h, FetchMode::View, Some(5), false, None).unwrap();
    assert_eq!(r.verified, Some(true));
    assert_eq!(r.transport.as_deref(), Some("spool-dir"));
    assert_eq!(r.downgraded, Some(true));
    assert!(r.reason.unwrap().ends_with("; after posix-shm failed"));

    // The same fetch with on-downgrade = "fail" is refused.
    let strict = format!("[fetch]\non-downgrade = \"fail\"\n{consumer_cfg}");
    let mut p2 = start("fallback-strict", &owner_cfg, &strict);
    let h = util::put(&mut p2.owner, 8192, 6).handle.unwrap();
    let err = util::fetch(&mut p2.consumer, &h, FetchMode::View, Some(6), false, None).unwrap_err();
    assert!(
        err.contains("downgrade refused (fetch.on-downgrade = \"fail\")"),
        "{err}"
    );
}

#[test]
fn malformed_handles_are_refused_and_the_worker_keeps_serving() {
    let cfg = pool_config("8MiB");
    let mut p = start("badhandle", &cfg, &cfg);
    let err =
        util::fetch(&mut p.consumer, "zz", FetchMode::Copy, Some(0), false, None).unwrap_err();
    assert!(err.contains("bad handle"), "{err}");
    let good = util::put(&mut p.owner, 64, 9).handle.unwrap();
    let truncated = &good[..good.len() - 2];
    let err = util::fetch(
        &mut p.consumer,
        truncated,
        FetchMode::Copy,
        Some(9),
        false,
        None,
    )
    .unwrap_err();
    assert!(err.contains("invalid handle: truncated"), "{err}");
    assert_eq!(
        util::fetch(
            &mut p.consumer,
            &good,
            FetchMode::Copy,
            Some(9),
            false,
            None
        )
        .unwrap()
        .verified,
        Some(true)
    );
}

#[test]
fn segments_are_removed_when_the_owner_exits_and_when_it_is_killed_they_stay_named_by_it() {
    let cfg = pool_config("8MiB");
    let mut p = start("cleanup", &cfg, &cfg);
    util::put(&mut p.owner, 4096, 1);
    let stats = p.owner.call(&Request::Stats).unwrap().stats.unwrap();
    let tag = stats["tag"].as_str().unwrap().to_owned();
    assert!(
        !util::shm_segments(&tag).is_empty(),
        "owner has no segments named by its tag {tag}"
    );
    let Pair { owner, .. } = p;
    assert!(owner.exit().unwrap().success());
    assert_eq!(util::shm_segments(&tag), Vec::<String>::new());
}

#[test]
fn the_demo_runs_end_to_end_and_reads_well_in_a_pipe() {
    // Piped output, as into a file: no colour codes even though the demo
    // styles its table, and no RUST_LOG from the test environment.
    let out = std::process::Command::new(util::shardport_bin())
        .args(["demo", "--max-size", "1MiB"])
        .env("SHARDPORT_PLUGIN_DIR", util::profile_dir().join("deps"))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(
        !stdout.contains('\x1b') && !stderr.contains('\x1b'),
        "ANSI escapes in piped output:\n{stdout:?}\n{stderr:?}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" view ") || l.contains(" copy "))
        .collect();
    // 4 KiB, 64 KiB and 1 MiB, each as a view and a copy through shared
    // memory, and one copy over http chosen by the `network` route; all
    // verified.
    let shm: Vec<&&str> = rows.iter().filter(|r| r.contains(" posix-shm ")).collect();
    assert_eq!(shm.len(), 6, "{stdout}");
    let http: Vec<&&str> = rows.iter().filter(|r| r.contains(" http ")).collect();
    assert_eq!(http.len(), 1, "{stdout}");
    assert!(http[0].contains("route `network`"), "{stdout}");
    assert!(rows.iter().all(|r| r.contains(" ok ")), "{stdout}");
    assert!(
        stdout.contains("0 B of"),
        "storage did not come back:\n{stdout}"
    );
    assert!(
        stdout.contains("Transports available here: posix-shm, http"),
        "{stdout}"
    );
    // An unavailable transport is logged by the demo process only, once,
    // not again by each worker process.
    let warned = stderr
        .lines()
        .filter(|l| l.contains("cuda-ipc unavailable"))
        .count();
    assert!(warned <= 1, "cuda-ipc warned {warned} times:\n{stderr}");
}
