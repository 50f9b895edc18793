//! Locating build artefacts and writing configs for the end-to-end tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use shardport_host::{
    config::{self, Config, Origin},
    loader::{load_all, LoadedPlugin, NodeContext},
    services::SystemClock,
};

/// `target/<profile>` of this build (the test binary lives in its `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// Path of a plugin library cargo built as a dev-dependency (`deps/lib<crate>.so`).
pub fn plugin_lib(crate_name: &str) -> PathBuf {
    let file = format!("lib{}.so", crate_name.replace('-', "_"));
    let candidates = [
        profile_dir().join("deps").join(&file),
        profile_dir().join(&file),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("{file} not built; looked in {candidates:?}"))
}

/// The `shardport` binary of this build.
pub fn shardport_bin() -> PathBuf {
    let p = profile_dir().join("shardport");
    assert!(
        p.is_file(),
        "{} not built: run the tests with `cargo test --workspace`",
        p.display()
    );
    p
}

/// A fresh temp dir for one test.
pub fn temp_dir(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("shardport-{test}-"))
        .tempdir()
        .expect("temp dir")
}

/// The posix-shm plugin table with `extra` plugin config lines.
pub fn shm_plugin(extra: &str) -> String {
    format!(
        "[[plugin]]\nname = \"posix-shm\"\npath = \"{}\"\nrequired = true\n[plugin.config]\n{extra}\n",
        plugin_lib("shardport-posix-shm").display()
    )
}

/// The spool-dir plugin table (the example third-party transport) over `dir`.
pub fn spool_plugin(dir: &Path) -> String {
    format!(
        "[[plugin]]\nname = \"spool-dir\"\npath = \"{}\"\n[plugin.config]\ndir = \"{}\"\n",
        plugin_lib("shardport-spool-transport").display(),
        dir.display()
    )
}

/// The http plugin table on an ephemeral loopback port.
pub fn http_plugin() -> String {
    format!(
        "[[plugin]]\nname = \"http\"\npath = \"{}\"\n[plugin.config]\nbind = \"127.0.0.1:0\"\n",
        plugin_lib("shardport-http").display()
    )
}

/// Writes `text` as `node.toml` in `dir` and parses it.
pub fn write_config(dir: &Path, text: &str) -> (PathBuf, Config) {
    let path = dir.join("node.toml");
    std::fs::write(&path, text).expect("write config");
    let cfg = config::load(&path).expect("valid test config");
    (path, cfg)
}

/// Parses config text whose plugin paths are absolute.
pub fn parse(text: &str) -> Config {
    config::parse_str(
        text,
        Origin::Text {
            name: "test.toml".into(),
            base_dir: profile_dir(),
            search_deps: true,
        },
    )
    .unwrap_or_else(|e| panic!("test config invalid:\n{e}"))
}

/// Loads the plugins of `cfg` as one fresh node instance would.
pub fn load(cfg: &Config) -> (Vec<LoadedPlugin>, Vec<String>) {
    let ctx = NodeContext {
        node_name: "test".into(),
        node_tag: shardport_kit::testing::unique_node_tag(),
        clock: std::sync::Arc::new(SystemClock::default()),
        tags_used: Default::default(),
    };
    let report = load_all(&cfg.plugins, &ctx);
    (
        report.loaded,
        report.failures.iter().map(|(e, _)| e.to_string()).collect(),
    )
}

/// Names of the shared-memory segments in `/dev/shm` containing `needle`.
pub fn shm_segments(needle: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(needle))
                .collect()
        })
        .unwrap_or_default()
}

/// Stops a child the way an operator would: SIGTERM, then up to 10 s for a
/// clean exit (a node removes its segments), and SIGKILL only after that.
pub fn terminate(child: &mut std::process::Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Asks a worker to put `len` bytes of the pattern for `seed`.
pub fn try_put(
    w: &mut shardport_cli::worker::WorkerProcess,
    len: u64,
    seed: u64,
) -> Result<shardport_cli::worker::Reply, String> {
    w.call(&shardport_cli::worker::Request::Put {
        len,
        seed,
        dtype: None,
        tags: Default::default(),
    })
    .map_err(|e| e.to_string())
}

/// [`try_put`] that must succeed.
pub fn put(
    w: &mut shardport_cli::worker::WorkerProcess,
    len: u64,
    seed: u64,
) -> shardport_cli::worker::Reply {
    try_put(w, len, seed).expect("put")
}

/// Asks a worker to fetch `handle` (verifying the pattern for `seed` when
/// given; keeping it when `hold`; through `only` that transport when given).
pub fn fetch(
    w: &mut shardport_cli::worker::WorkerProcess,
    handle: &str,
    mode: shardport_host::FetchMode,
    seed: Option<u64>,
    hold: bool,
    only: Option<&str>,
) -> Result<shardport_cli::worker::Reply, String> {
    w.call(&shardport_cli::worker::Request::Fetch {
        handle: handle.to_owned(),
        mode: Some(mode),
        seed,
        hold,
        only: only.map(str::to_owned),
    })
    .map_err(|e| e.to_string())
}

/// A clock the test moves by hand.
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicU64);

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, d: std::time::Duration) {
        self.0
            .fetch_add(d.as_nanos() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl shardport_host::services::Clock for ManualClock {
    fn now_unix_nanos(&self) -> u64 {
        1_700_000_000_000_000_000 + self.monotonic_nanos()
    }
    fn monotonic_nanos(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The cuda-ipc plugin table (optional, as in the default config).
pub fn cuda_plugin() -> String {
    format!(
        "[[plugin]]\nname = \"cuda-ipc\"\npath = \"{}\"\nrequired = false\n",
        plugin_lib("shardport-cuda-ipc").display()
    )
}

/// An example binary of this package (`target/<profile>/examples/NAME`);
/// `cargo test` builds the examples.
pub fn example_bin(name: &str) -> PathBuf {
    let p = profile_dir().join("examples").join(name);
    assert!(
        p.is_file(),
        "{} not built: run the tests with `cargo test --workspace`",
        p.display()
    );
    p
}

/// Runs the `shardport` binary with `args`; asserts it succeeded and
/// returns its stdout.
pub fn shardport_ok<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let out = std::process::Command::new(shardport_bin())
        .args(args)
        .output()
        .expect("run shardport");
    assert!(
        out.status.success(),
        "shardport {:?} failed:\n{}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 stdout")
}

/// Builds the crate at `manifest` offline (same Cargo.lock as this
/// workspace, so every dependency is already downloaded) into `target`,
/// with `args` after `cargo build --offline --quiet`; fails the test with
/// cargo's output, naming `what`, when the build fails.
pub fn cargo_build_offline(manifest: &Path, target: &Path, args: &[&str], what: &str) {
    cargo_build_offline_env(manifest, target, args, &[], what);
}

/// [`cargo_build_offline`] with environment variables set for the build
/// (a crate's `option_env!` reads them, so two builds of one source differ).
pub fn cargo_build_offline_env(
    manifest: &Path,
    target: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
    what: &str,
) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .args(args)
        .arg("--manifest-path")
        .arg(manifest)
        .envs(envs.iter().copied())
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building {what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
