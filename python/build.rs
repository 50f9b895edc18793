//! Bundles the first-party transport plugins into the Python package.
//!
//! `pip install ./python` and `pip wheel ./python` run maturin, which builds
//! this crate with the `bundle-plugins` feature (pyproject.toml). The
//! transports are cdylib libraries of their own (the host loads them through
//! the plugin ABI, as it loads a third party's), so this script builds them
//! with a nested `cargo build` into a target directory of its own (never
//! `target/`, whose lock the outer build holds) and copies the `.so` files
//! into `python/shardport/_plugins/`, which maturin packs into the wheel
//! after this crate is compiled. docs/decisions.md ("Python package: the
//! transports travel in the wheel") says why they are not linked into the
//! extension.
//!
//! Without the feature (`cargo build/test --workspace`) this does nothing.
//! `SHARDPORT_PLUGINS_PREBUILT=1` skips the nested build too: scripts/setup.sh
//! builds the plugins with the workspace and copies them itself.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// The transports bundled with the package: (cargo package, library file).
const BUNDLED: [(&str, &str); 3] = [
    ("shardport-posix-shm", "libshardport_posix_shm.so"),
    ("shardport-http", "libshardport_http.so"),
    ("shardport-cuda-ipc", "libshardport_cuda_ipc.so"),
];

fn main() {
    println!("cargo:rerun-if-env-changed=SHARDPORT_PLUGINS_PREBUILT");
    if env::var_os("CARGO_FEATURE_BUNDLE_PLUGINS").is_none() {
        return;
    }
    if env::var("SHARDPORT_PLUGINS_PREBUILT").is_ok_and(|v| v == "1") {
        return;
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir
        .parent()
        .expect("python/ lives inside the workspace")
        .to_path_buf();
    for dir in ["abi", "plugins", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    // What is in the destination goes into the wheel: when anything else
    // wrote there since (scripts/setup.sh copies its debug builds there for
    // `maturin develop`), copy this build's libraries again. Files are only
    // rewritten when their bytes differ, so the copy itself does not make
    // the next build run this script again.
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("python/shardport/_plugins").display()
    );
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    let target_dir = out_dir.join("plugins-target");
    // The outer build's profile: `release` for wheels, `debug` for
    // `maturin develop` without `--release`.
    let profile = env::var("PROFILE").expect("set by cargo");
    // A cross build (`maturin build --target T`) builds the plugins for T.
    let target = env::var("TARGET").expect("set by cargo");
    let cross = (env::var("HOST").ok().as_deref() != Some(target.as_str())).then_some(target);
    build_plugins(&workspace, &target_dir, &profile, cross.as_deref());
    let built = match &cross {
        Some(t) => target_dir.join(t).join(&profile),
        None => target_dir.join(&profile),
    };
    let dest = manifest_dir.join("python/shardport/_plugins");
    std::fs::create_dir_all(&dest)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dest.display()));
    for (_, file) in BUNDLED {
        let from = built.join(file);
        let to = dest.join(file);
        let bytes =
            std::fs::read(&from).unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display()));
        if std::fs::read(&to).is_ok_and(|old| old == bytes) {
            continue;
        }
        // Copy to a temporary name and rename: a process that has the old
        // file mapped keeps its mapping, never sees a half-written library.
        let tmp = dest.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, &bytes)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
        std::fs::rename(&tmp, &to)
            .unwrap_or_else(|e| panic!("cannot rename {} to {}: {e}", tmp.display(), to.display()));
    }
}

/// `cargo build` of the bundled plugins, with this build's profile, into
/// `target_dir`. The outer cargo's per-crate variables are cleared so the
/// nested build is an ordinary workspace build (its own features, flags for
/// the plugins alone); the jobserver (`CARGO_MAKEFLAGS`) is inherited, so
/// both builds share the job budget.
fn build_plugins(workspace: &Path, target_dir: &Path, profile: &str, cross: Option<&str>) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--locked");
    if profile == "release" {
        cmd.arg("--release");
    }
    if let Some(t) = cross {
        cmd.args(["--target", t]);
    }
    for (package, _) in BUNDLED {
        cmd.args(["-p", package]);
    }
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let per_crate = key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_CFG_")
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || key.starts_with("DEP_");
        if per_crate
            || matches!(
                key,
                "CARGO_TARGET_DIR"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_CRATE_NAME"
                    | "OUT_DIR"
                    | "TARGET"
                    | "HOST"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    // maturin's flags for the extension (link args of
                    // libpython, the abi3 cfg) are not the plugins'.
                    | "RUSTFLAGS"
                    | "CARGO_ENCODED_RUSTFLAGS"
                    | "PYO3_ENVIRONMENT_SIGNATURE"
            )
        {
            cmd.env_remove(key);
        }
    }
    // Wheels carry stripped libraries (maturin strips the extension).
    if profile == "release" {
        cmd.env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the transport plugins: {e}"));
    if !status.success() {
        panic!("building the transport plugins failed ({status}); the output above says why");
    }
}
