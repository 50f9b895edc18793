//! A third party builds a transport outside this repository: a copy of
//! `examples/spool-transport` in a temporary directory outside the
//! workspace, its manifest pointed at `abi` and `kit` by path (as an author
//! would point them by git or registry), built with `cargo build
//! --offline`. The
//! `.so` must exist, load through the host's loader (abi_stable's library
//! header and layout check) and move a shard.
//!
//! The build uses its own target directory under this workspace's
//! (`target/out-of-tree`), so registry crates are compiled once and reused
//! by later runs; the sources come from `~/.cargo/registry`, which the
//! workspace build filled, pinned by a copy of the workspace's `Cargo.lock`.

use std::{path::Path, sync::Arc};

use shardport_abi::{
    ExportRequest, LeasedView, RSlice, RSliceMut, ShardId, ShardMeta, SharedBytes,
};

use crate::util;

/// Copies `from` into `to`, recursively (regular files and directories).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

#[test]
fn a_plugin_built_outside_the_workspace_loads_and_moves_shards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = util::temp_dir("out-of-tree");
    assert!(
        !tmp.path().starts_with(root),
        "the copy must live outside the workspace: {}",
        tmp.path().display()
    );
    let krate = tmp.path().join("spool-transport");
    copy_dir(
        &root.join("examples/spool-transport/src"),
        &krate.join("src"),
    );
    let manifest =
        std::fs::read_to_string(root.join("examples/spool-transport/Cargo.toml")).unwrap();
    // The lines an author changes: where `shardport-abi` and
    // `shardport-kit` come from.
    let mut rewritten = manifest.clone();
    for krate in ["abi", "kit"] {
        let before = rewritten.clone();
        rewritten = rewritten.replace(
            &format!("path = \"../../{krate}\""),
            &format!("path = {:?}", root.join(krate).display().to_string()),
        );
        assert_ne!(rewritten, before, "the example depends on {krate} by path");
    }
    assert!(
        !rewritten.contains("workspace = true") && !rewritten.contains(".workspace"),
        "the example's manifest inherits nothing from the workspace"
    );
    // Its own workspace root, so cargo never looks further up.
    std::fs::write(
        krate.join("Cargo.toml"),
        format!("{rewritten}\n[workspace]\n"),
    )
    .unwrap();
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();

    let target = util::profile_dir()
        .parent()
        .expect("target dir")
        .join("out-of-tree");
    util::cargo_build_offline(
        &krate.join("Cargo.toml"),
        &target,
        &["--lib"],
        "the out-of-tree plugin",
    );
    let so = target.join("debug/libshardport_spool_transport.so");
    assert!(so.is_file(), "{} was not built", so.display());

    let dir = tmp.path().join("spool");
    let cfg = util::parse(&format!(
        "[[plugin]]\nname = \"spool-dir\"\npath = \"{}\"\n[plugin.config]\ndir = \"{}\"\n",
        so.display(),
        dir.display()
    ));
    let (loaded, failures) = util::load(&cfg);
    assert!(failures.is_empty(), "{failures:?}");
    let [plugin] = &loaded[..] else {
        panic!("expected one plugin, got {}", loaded.len())
    };
    assert_eq!(plugin.path, so);
    assert_eq!(plugin.abi_version, shardport_abi::ABI_VERSION);
    let t = Arc::clone(&plugin.transport);

    let bytes: Vec<u8> = (0..=255)
        .cycle()
        .take(10_000)
        .map(|b: u32| b as u8)
        .collect();
    let meta = ShardMeta::bytes(bytes.len() as u64);
    let desc = t
        .export(ExportRequest {
            id: ShardId::from_u128(7),
            meta: meta.clone(),
            data: SharedBytes::lend(&bytes),
            allocation: 0,
        })
        .into_result()
        .unwrap()
        .into_vec();
    let mut copy = vec![0u8; bytes.len()];
    t.import_into(
        RSlice::from_slice(&desc),
        &meta,
        RSliceMut::from_mut_slice(&mut copy),
    )
    .into_result()
    .unwrap();
    assert_eq!(copy, bytes);
    let view = LeasedView::import(&t, &desc, &meta).unwrap();
    t.unexport(ShardId::from_u128(7)).into_result().unwrap();
    assert_eq!(&*view, &bytes[..], "a zero-copy view outlives unexport");
}

/// `shardport new-transport` writes a crate that builds outside the
/// workspace, passes its own tests and the conformance suite, and loads
/// into `shardport plugins` with the config table it printed.
#[test]
fn a_scaffolded_transport_builds_passes_conformance_and_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = util::temp_dir("scaffold");
    let krate = tmp.path().join("tiny-files");
    let out = util::shardport_ok(&[
        "new-transport".as_ref(),
        "tiny-files".as_ref(),
        "--dir".as_ref(),
        krate.as_os_str(),
        "--shardport".as_ref(),
        root.as_os_str(),
    ]);
    assert!(out.contains("[[plugin]]\nname = \"tiny-files\""), "{out}");
    // Offline, as the other out-of-tree build: the workspace's lock pins
    // what `~/.cargo/registry` already holds.
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    let target = util::profile_dir()
        .parent()
        .expect("target dir")
        .join("out-of-tree");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let tested = std::process::Command::new(&cargo)
        .args(["test", "--offline", "--quiet", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    let report = String::from_utf8_lossy(&tested.stdout);
    assert!(
        tested.status.success(),
        "the scaffold's tests failed:\n{report}\n{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    // Its unit tests and the conformance suite both ran.
    assert!(report.matches("test result: ok.").count() >= 2, "{report}");
    util::cargo_build_offline(
        &krate.join("Cargo.toml"),
        &target,
        &["--lib"],
        "the scaffold",
    );
    // The printed table, pointed at this debug build.
    let table = std::fs::read_to_string(krate.join("plugin.toml")).unwrap();
    let so = target.join("debug/libtiny_files.so");
    let table = table.replace(
        &krate
            .join("target/release/libtiny_files.so")
            .display()
            .to_string(),
        &so.display().to_string(),
    );
    let cfg = tmp.path().join("plugin.toml");
    std::fs::write(&cfg, table).unwrap();
    let listed = util::shardport_ok(&["plugins".as_ref(), "--config".as_ref(), cfg.as_os_str()]);
    assert!(
        listed.starts_with("tiny-files") && listed.contains("loaded"),
        "{listed}"
    );
}
