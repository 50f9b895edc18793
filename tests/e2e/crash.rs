//! Crash safety with real processes and `kill -9`: nothing leaks, nobody hangs.

use shardport_cli::worker::{Request, WorkerProcess};
use shardport_host::FetchMode;

use crate::util;

fn spawn(dir: &std::path::Path, role: &str, text: &str) -> WorkerProcess {
    let sub = dir.join(role);
    std::fs::create_dir_all(&sub).unwrap();
    let (path, _) = util::write_config(&sub, text);
    WorkerProcess::spawn(
        role,
        &util::shardport_bin(),
        &["--config".into(), path.into_os_string()],
    )
    .unwrap()
}

fn with_http(shm: &str) -> String {
    format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}[[plugin]]\nname = \"http\"\npath = \"{}\"\n[plugin.config]\nbind = \"127.0.0.1:0\"\nconnect-timeout = \"2s\"\nrequest-timeout = \"5s\"\n",
        util::shm_plugin(shm),
        util::plugin_lib("shardport-http").display()
    )
}

/// A `segment-prefix` line unique to this test process and `name`.
fn own_prefix(name: &str) -> String {
    format!("segment-prefix = \"{name}{}\"", std::process::id())
}

fn owner_tag(w: &mut WorkerProcess) -> String {
    w.call(&Request::Stats).unwrap().stats.unwrap()["tag"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_consumer_killed_while_holding_a_lease_gives_the_space_back() {
    let dir = util::temp_dir("crash-consumer");
    let cfg = with_http("pool-size = \"8MiB\"");
    let mut owner = spawn(dir.path(), "owner", &cfg);
    let mut consumer = spawn(dir.path(), "consumer", &cfg);
    let four = 4 << 20;
    let a = util::put(&mut owner, four, 1);
    let r = util::fetch(
        &mut consumer,
        a.handle.as_ref().unwrap(),
        FetchMode::View,
        None,
        true,
        None,
    )
    .unwrap();
    assert_eq!(r.mode, Some(FetchMode::View));
    owner
        .call(&Request::Remove {
            ids: vec![a.id.unwrap()],
        })
        .unwrap();
    util::put(&mut owner, four, 2);
    let full = util::try_put(&mut owner, four, 3).unwrap_err();
    assert!(
        full.contains("pool is full") || full.contains("resource_exhausted"),
        "{full}"
    );

    consumer.kill().unwrap(); // SIGKILL: no release, no goodbye
    let swept = owner.call(&Request::Sweep).unwrap().swept.unwrap();
    assert!(
        swept["posix-shm"]["leases_reclaimed"].as_u64().unwrap() >= 1,
        "{swept}"
    );
    let c = util::put(&mut owner, four, 3);
    assert!(c.handle.is_some());
    owner.exit().unwrap();
}

#[test]
fn an_owner_killed_leaves_consumers_a_clear_error_and_its_segments_are_swept() {
    let dir = util::temp_dir("crash-owner");
    // A prefix of its own: nodes that other tests start at the same time
    // sweep dead owners' segments with their prefix only, so the segments
    // checked below are swept by this test's node and no other.
    let cfg = with_http(&format!(
        "pool-size = \"8MiB\"\n{}",
        own_prefix("crashowner")
    ));
    let mut owner = spawn(dir.path(), "owner", &cfg);
    let mut consumer = spawn(dir.path(), "consumer", &cfg);
    let tag = owner_tag(&mut owner);
    let pid = owner.pid();
    let h = util::put(&mut owner, 1 << 20, 4).handle.unwrap();
    assert!(util::fetch(&mut consumer, &h, FetchMode::Copy, None, false, None).is_ok());
    assert!(!util::shm_segments(&tag).is_empty());

    owner.kill().unwrap();
    let err = util::fetch(&mut consumer, &h, FetchMode::Copy, None, false, None).unwrap_err();
    assert!(err.contains("every transport failed"), "{err}");
    assert!(
        err.contains(&format!("owner process {pid} has exited")),
        "{err}"
    );
    assert!(
        err.contains("http:") && (err.contains("(unavailable)") || err.contains("(timeout)")),
        "{err}"
    );
    // The segments outlive the owner until someone sweeps...
    assert!(!util::shm_segments(&tag).is_empty());
    // ...and a node starting on this machine does.
    let mut restarted = spawn(dir.path(), "restarted", &cfg);
    restarted.call(&Request::Stats).unwrap(); // its node has started (and swept)
    assert_eq!(util::shm_segments(&tag), Vec::<String>::new());
    restarted.exit().unwrap();
    consumer.exit().unwrap();
}

#[test]
fn an_owner_killed_mid_transfer_never_hangs_its_consumer() {
    let dir = util::temp_dir("crash-transfer");
    let cfg = with_http("pool-size = \"300MiB\"");
    let mut owner = spawn(dir.path(), "owner", &cfg);
    let mut consumer = spawn(dir.path(), "consumer", &cfg);
    let h = util::put(&mut owner, 256 << 20, 5).handle.unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        owner.kill().unwrap();
    });
    // Whatever the race: the fetch ends, with all the bytes or an error.
    let first = util::fetch(
        &mut consumer,
        &h,
        FetchMode::Copy,
        None,
        false,
        Some("http"),
    );
    killer.join().unwrap();
    if let Err(e) = &first {
        assert!(e.contains("http:"), "{e}");
    }
    let again = util::fetch(
        &mut consumer,
        &h,
        FetchMode::Copy,
        None,
        false,
        Some("http"),
    )
    .unwrap_err();
    assert!(
        again.contains("(unavailable)") || again.contains("(timeout)"),
        "{again}"
    );
    // The killed owner's segments: swept by the next node to start.
    consumer.call(&Request::Sweep).unwrap();
    consumer.exit().unwrap();
}

#[test]
fn gc_reports_the_segments_it_swept_including_at_start_up() {
    let dir = util::temp_dir("crash-gc");
    let cfg = with_http(&format!("pool-size = \"8MiB\"\n{}", own_prefix("gcsweep")));
    let mut owner = spawn(dir.path(), "owner", &cfg);
    let tag = owner_tag(&mut owner);
    util::put(&mut owner, 1 << 20, 4).handle.unwrap();
    let before = util::shm_segments(&tag).len();
    assert!(before > 0);
    owner.kill().unwrap();
    let sub = dir.path().join("gc");
    std::fs::create_dir_all(&sub).unwrap();
    let (path, _) = util::write_config(&sub, &cfg);
    let out = std::process::Command::new(util::shardport_bin())
        .arg("gc")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("segments_swept={before}")),
        "gc did not report the {before} segments it swept:\n{stdout}"
    );
    assert_eq!(util::shm_segments(&tag), Vec::<String>::new());
}
