//! The loader failure matrix: every way a plugin can fail to load is reported
//! in one line naming the plugin and the file, all failures are collected
//! together, and the host keeps running.

use std::path::Path;

use shardport_abi::{ErrorKind, RSlice, RSliceMut, ShardId, ShardMeta};

use crate::util;

fn faulty(mode: &str) -> String {
    format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\n[plugin.config]\nmode = \"{mode}\"\n",
        util::plugin_lib("shardport-faulty-plugin").display()
    )
}

fn only_failure(text: &str) -> String {
    let (loaded, failures) = util::load(&util::parse(text));
    assert!(loaded.is_empty(), "expected no plugin to load");
    assert_eq!(failures.len(), 1, "{failures:?}");
    failures.into_iter().next().unwrap_or_default()
}

#[test]
fn missing_file_names_every_path_tried() {
    let msg = only_failure("[[plugin]]\nname = \"ghost\"\npath = \"/nonexistent/libghost.so\"\n");
    assert_eq!(
        msg,
        "plugin `ghost`: library `/nonexistent/libghost.so` not found (looked in /nonexistent/libghost.so)"
    );
}

#[test]
fn a_file_that_is_not_a_library() {
    let dir = util::temp_dir("garbage");
    let path = dir.path().join("libgarbage.so");
    std::fs::write(&path, b"this is not an ELF file").unwrap();
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"garbage\"\npath = \"{}\"\n",
        path.display()
    ));
    assert!(
        msg.starts_with(&format!(
            "plugin `garbage`: {} is not a shardport plugin: cannot open as a shared library:",
            path.display()
        )),
        "{msg}"
    );
}

#[test]
fn a_shared_library_without_a_root_module() {
    let lib = util::plugin_lib("shardport-not-a-plugin");
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"plain\"\npath = \"{}\"\n",
        lib.display()
    ));
    assert_eq!(
        msg,
        format!(
            "plugin `plain`: {} is not a shardport plugin: it exports no shardport root module (is it built with `export_plugin!`?)",
            lib.display()
        )
    );
}

#[test]
fn library_implementing_another_transport() {
    let lib = util::plugin_lib("shardport-faulty-plugin");
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"posix-shm\"\npath = \"{}\"\n",
        lib.display()
    ));
    assert_eq!(
        msg,
        format!(
            "plugin `posix-shm`: {} implements transport `faulty`, not `posix-shm`",
            lib.display()
        )
    );
}

#[test]
fn sha256_pin_mismatch() {
    let lib = util::plugin_lib("shardport-faulty-plugin");
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\nsha256 = \"{}\"\n",
        lib.display(),
        "00".repeat(32)
    ));
    let real = shardport_host::loader::sha256_hex(&lib).unwrap();
    assert_eq!(
        msg,
        format!(
            "plugin `faulty`: sha256 of {} is {real}, config pins {}",
            lib.display(),
            "00".repeat(32)
        )
    );
    // The right pin loads.
    let (loaded, failures) = util::load(&util::parse(&format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\nsha256 = \"{real}\"\n[plugin.config]\nmode = \"ok\"\n",
        lib.display()
    )));
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(loaded.len(), 1);
}

#[test]
fn constructor_error_and_panic_are_reported_not_fatal() {
    // The message names the file that was loaded: with several builds
    // installed, the operator can tell which one failed.
    let lib = util::plugin_lib("shardport-faulty-plugin");
    let prefix = format!("plugin `faulty`: constructor of {} failed: ", lib.display());
    let msg = only_failure(&faulty("ctor-error"));
    assert!(msg.starts_with(&prefix), "{msg}");
    assert!(msg.ends_with("(unavailable)"), "{msg}");
    let msg = only_failure(&faulty("ctor-panic"));
    assert!(
        msg.starts_with(&format!(
            "{prefix}plugin `faulty` panicked in new_transport"
        )),
        "{msg}"
    );
    assert!(msg.ends_with("(panic)"), "{msg}");
}

#[test]
fn a_put_whose_export_panics_fails_and_leaves_nothing_registered() {
    // posix-shm stores and exports the shard first; the faulty transport's
    // export then panics. The put must fail, not return a handle without
    // that export, and withdraw what posix-shm registered.
    let text = format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}{}",
        util::shm_plugin("pool-size = \"1MiB\""),
        faulty("panic-in-export")
    );
    let node = shardport_host::Node::start(util::parse(&text)).unwrap();
    let err = node
        .put(
            &[7u8; 4096],
            &shardport_host::TensorSpec::bytes(4096),
            Default::default(),
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, shardport_host::HostError::ExportPanicked { .. }),
        "{msg}"
    );
    assert!(msg.contains("`faulty` panicked while exporting"), "{msg}");
    let stats = node.stats();
    assert_eq!(
        stats.shards_owned, 0,
        "a failed put left a shard registered"
    );
    let shm = &stats.plugins[0].stats;
    assert_eq!(shm["shards_live"], 0, "posix-shm kept the export: {shm:?}");
    assert_eq!(
        shm["pool_bytes_used"], 0,
        "the pool space was not freed: {shm:?}"
    );
}

#[test]
fn a_panicking_method_becomes_an_error_and_the_host_survives() {
    let (loaded, failures) = util::load(&util::parse(&faulty("panic-in-export")));
    assert!(failures.is_empty(), "{failures:?}");
    let t = &loaded[0].transport;
    let data = vec![1u8; 16];
    let err = t
        .export(shardport_abi::ExportRequest {
            id: ShardId::from_u128(1),
            meta: ShardMeta::bytes(16),
            data: shardport_abi::SharedBytes::lend(&data),
            allocation: 0,
        })
        .into_result()
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::PANIC);
    assert!(err.message.contains("panicked in export"), "{err}");
    // Still usable afterwards.
    assert!(t.health().ok);

    let (loaded, _) = util::load(&util::parse(&faulty("panic-in-import")));
    let t = &loaded[0].transport;
    let mut dst = vec![0u8; 4];
    let err = t
        .import_into(
            RSlice::from_slice(&[0u8; 16]),
            &ShardMeta::bytes(4),
            RSliceMut::from_mut_slice(&mut dst),
        )
        .into_result()
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::PANIC);
}

#[test]
fn every_failure_is_collected_and_good_plugins_still_load() {
    let text = format!(
        "{}{}[[plugin]]\nname = \"ghost\"\npath = \"/nonexistent/libghost.so\"\n",
        util::shm_plugin("pool-size = \"8MiB\"").replace("required = true\n", ""),
        faulty("ctor-error"),
    );
    let (loaded, failures) = util::load(&util::parse(&text));
    assert_eq!(
        loaded.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["posix-shm"]
    );
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures[0].starts_with("plugin `faulty`"));
    assert!(failures[1].starts_with("plugin `ghost`"));
}

#[test]
fn a_required_plugin_failure_stops_the_node_with_every_reason() {
    let text = format!(
        "[[plugin]]\nname = \"ghost\"\npath = \"/nonexistent/libghost.so\"\nrequired = true\n{}",
        faulty("ctor-error")
    );
    let err = shardport_host::Node::start(util::parse(&text))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("required plugins did not load:\n  plugin `ghost`"),
        "{err}"
    );
    assert!(
        err.contains("\n  plugin `faulty`: constructor of "),
        "{err}"
    );
}

#[test]
fn a_refused_option_stops_the_node_at_its_line_whether_required_or_not() {
    // posix-shm is required, http is not: both refusals are fatal, both
    // point at the key the user wrote.
    let text = format!(
        "{}\n{}tls-cert = \"/nonexistent/cert.pem\"\ntls-key = \"/nonexistent/key.pem\"\n",
        util::shm_plugin("pool-size = true"),
        util::http_plugin()
    );
    let err = shardport_host::Node::start(util::parse(&text)).unwrap_err();
    let shardport_host::HostError::PluginConfig(errs) = &err else {
        panic!("expected a config error, got {err}");
    };
    assert_eq!(errs.len(), 2, "{err}");
    assert!(
        errs[0].starts_with(
            "plugin `posix-shm` refused its config: `plugin.posix-shm.config.pool-size`: expected a byte size"
        ),
        "{err}"
    );
    // Rendered like the host's own config errors: file:line:col, the line,
    // a caret under the key.
    assert!(
        errs[0].contains("--> test.toml:6:1\n  |\n6 | pool-size = true\n  | ^^^^^^^^^"),
        "{err}"
    );
    assert!(errs[1].contains("`plugin.http.config.tls-cert`"), "{err}");
    assert!(errs[1].contains("--> test.toml:13:1\n"), "{err}");
    // A reload with the same mistake is refused the same way; the node
    // keeps its config.
    let good = format!(
        "{}\n{}",
        util::shm_plugin("pool-size = \"16MiB\""),
        util::http_plugin()
    );
    let node = shardport_host::Node::start(util::parse(&good)).unwrap();
    let bad = good.replace(
        "bind = \"127.0.0.1:0\"",
        "bind = \"127.0.0.1:0\"\nmax-connections = \"many\"",
    );
    let e = node
        .reload_text(
            &bad,
            shardport_host::config::Origin::File("/etc/next.toml".into()),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugin `http` refused its config"), "{e}");
    assert!(e.contains("/etc/next.toml:"), "{e}");
    assert_eq!(node.generation(), 0);
}

#[test]
fn the_same_file_loaded_twice_gives_independent_instances() {
    // `RootModule::load_from_file` would hand back one cached module for the
    // interface type; the loader opens each file by its header instead, and
    // every node gets its own instance.
    let text = format!(
        "{}{}",
        util::shm_plugin("pool-size = \"8MiB\""),
        faulty("ok")
    );
    let cfg = util::parse(&text);
    let (a, fa) = util::load(&cfg);
    let (b, fb) = util::load(&cfg);
    assert!(fa.is_empty() && fb.is_empty());
    assert_eq!(
        a.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["posix-shm", "faulty"]
    );
    assert_eq!(
        b.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["posix-shm", "faulty"]
    );
    assert!(!std::sync::Arc::ptr_eq(&a[0].transport, &b[0].transport));
}

// ---------------------------------------------------------------------------
// Plugins built against an incompatible `shardport-abi`, by the test itself.

/// Builds a copy of the faulty fixture plugin against a patched copy of the
/// `abi` crate and returns the `.so`. `patch` edits the copied abi sources.
fn build_against_patched_abi(
    variant: &str,
    version: &str,
    patch: impl Fn(&Path),
) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = util::profile_dir().join("abi-fixtures").join(variant);
    let _ = std::fs::remove_dir_all(work.join("abi"));
    let _ = std::fs::remove_dir_all(work.join("kit"));
    let _ = std::fs::remove_dir_all(work.join("plugin"));
    copy_dir(&root.join("abi/src"), &work.join("abi/src"));
    // The kit, unchanged, built against the patched abi (the plugin uses it).
    copy_dir(&root.join("kit/src"), &work.join("kit/src"));
    copy_dir(
        &root.join("tests/fixtures/faulty-plugin/src"),
        &work.join("plugin/src"),
    );
    patch(&work.join("abi"));
    let abi_deps = read_deps(
        root,
        "abi",
        &["abi_stable", "tracing", "tracing-subscriber"],
    );
    std::fs::write(
        work.join("abi/Cargo.toml"),
        format!(
            "[package]\nname = \"shardport-abi\"\nversion = \"{version}\"\nedition = \"2021\"\n\n[dependencies]\n{abi_deps}"
        ),
    )
    .unwrap();
    let kit_deps = read_deps(
        root,
        "kit",
        &[
            "abi_stable",
            "memmap2",
            "rustix",
            "toml",
            "tracing",
            "tracing-subscriber",
        ],
    );
    std::fs::write(
        work.join("kit/Cargo.toml"),
        format!(
            "[package]\nname = \"shardport-kit\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[features]\nconformance = []\n\n[dependencies]\nshardport-abi = {{ path = \"../abi\" }}\n{kit_deps}"
        ),
    )
    .unwrap();
    std::fs::write(
        work.join("plugin/Cargo.toml"),
        "[package]\nname = \"shardport-faulty-plugin\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n\n[dependencies]\nshardport-abi = { path = \"../abi\" }\nshardport-kit = { path = \"../kit\" }\n",
    )
    .unwrap();
    std::fs::write(
        work.join("Cargo.toml"),
        "[workspace]\nresolver = \"2\"\nmembers = [\"abi\", \"kit\", \"plugin\"]\n[profile.dev]\npanic = \"unwind\"\n",
    )
    .unwrap();
    // Same dependency versions as this workspace, so the build is offline.
    std::fs::copy(root.join("Cargo.lock"), work.join("Cargo.lock")).unwrap();
    let target = util::profile_dir().join("abi-fixtures").join("target");
    util::cargo_build_offline(
        &work.join("Cargo.toml"),
        &target,
        &["-p", "shardport-faulty-plugin"],
        &format!("the {variant} fixture"),
    );
    let so = target.join("debug/libshardport_faulty_plugin.so");
    let dest = work.join("libshardport_faulty_plugin.so");
    std::fs::copy(&so, &dest).unwrap();
    dest
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The lines of `<krate>/Cargo.toml` (a manifest that stands alone)
/// declaring the dependencies `names`.
fn read_deps(root: &Path, krate: &str, names: &[&str]) -> String {
    let text = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
    names
        .iter()
        .map(|n| {
            text.lines()
                .find(|l| l.starts_with(&format!("{n} =")))
                .unwrap_or_else(|| panic!("{krate} dependency {n} not found"))
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn plugins_built_against_an_incompatible_abi_are_refused_in_one_line() {
    // A minor bump of a 0.x interface crate: abi_stable refuses it even with
    // an identical layout.
    let minor = build_against_patched_abi("minor-bump", "0.4.0", |_| {});
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\n",
        minor.display()
    ));
    assert_eq!(
        msg,
        format!(
            "plugin `faulty`: {} was built against shardport-abi 0.4.0, this host expects 0.3.x (incompatible ABI; rebuild the plugin)",
            minor.display()
        )
    );

    // A patch release that broke the rules: a field inserted into the root
    // module before its last prefix field.
    let layout = build_against_patched_abi("layout-break", "0.3.0", |abi| {
        let m = abi.join("src/module.rs");
        let text = std::fs::read_to_string(&m).unwrap();
        let text = text
            .replace(
                "    pub plugin_version: RStr<'static>,\n",
                "    pub plugin_version: RStr<'static>,\n    /// Inserted by the layout-break test fixture.\n    pub fixture_extra: u64,\n",
            )
            .replace(
                "        plugin_version: RStr::from_str(plugin_version),\n",
                "        plugin_version: RStr::from_str(plugin_version),\n        fixture_extra: 0,\n",
            );
        assert!(text.contains("fixture_extra: 0"), "patch did not apply");
        std::fs::write(m, text).unwrap();
    });
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\n",
        layout.display()
    ));
    assert!(
        msg.starts_with(&format!(
            "plugin `faulty`: {} has an incompatible interface layout: ",
            layout.display()
        )),
        "{msg}"
    );
    assert!(
        msg.ends_with("(rebuild against shardport-abi 0.3.0; details at debug level)"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "not one line: {msg}");
    assert!(
        msg.len() < 600,
        "summary too long ({} bytes): {msg}",
        msg.len()
    );

    // The evolution rules, both directions, at the same version: a plugin
    // built before the last appended method is refused (abi_stable wants
    // the plugin's vtable at least as long as the host's: that is why every
    // append is a minor bump)...
    let older = build_against_patched_abi("before-append", "0.3.0", |abi| {
        let t = abi.join("src/transport.rs");
        let text = std::fs::read_to_string(&t).unwrap();
        let start = text
            .find("    /// Consumer side: a zero-copy view the caller may **write**")
            .unwrap();
        let tail = "            \"this transport has no private (copy-on-write) views\",\n        ))\n    }\n";
        let end = start + text[start..].find(tail).unwrap() + tail.len();
        std::fs::write(&t, format!("{}{}", &text[..start], &text[end..])).unwrap();
        let a = abi.join("../kit/src/adapter.rs");
        let text = std::fs::read_to_string(&a).unwrap();
        let start = text
            .find("    fn import_view_private(\n        &self,\n        desc: RSlice")
            .unwrap();
        let end = start
            + text[start..].find("        })\n    }\n").unwrap()
            + "        })\n    }\n".len();
        std::fs::write(&a, format!("{}{}", &text[..start], &text[end..])).unwrap();
        // The host-side wrapper of the method, so the older crate builds.
        let v = abi.join("src/view.rs");
        let text = std::fs::read_to_string(&v).unwrap();
        assert!(
            text.contains(".import_view_private("),
            "patch did not apply"
        );
        std::fs::write(v, text.replace(".import_view_private(", ".import_view(")).unwrap();
    });
    let msg = only_failure(&format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\n",
        older.display()
    ));
    assert!(
        msg.contains("incompatible interface layout") && msg.contains("too many fields"),
        "{msg}"
    );
    // ...and a plugin built against a newer interface (one more method
    // appended) loads and moves shards.
    let newer = build_against_patched_abi("after-append", "0.3.0", |abi| {
        let t = abi.join("src/transport.rs");
        let text = std::fs::read_to_string(&t).unwrap();
        let anchor = "            \"this transport has no private (copy-on-write) views\",\n        ))\n    }\n";
        assert!(text.contains(anchor), "patch did not apply");
        let text = text.replace(
            anchor,
            &format!("{anchor}\n    /// Appended by the after-append test fixture.\n    fn fixture_newer(&self) -> u64 {{\n        7\n    }}\n"),
        );
        std::fs::write(t, text).unwrap();
    });
    let node = shardport_host::Node::start(util::parse(&format!(
        "[[plugin]]\nname = \"faulty\"\npath = \"{}\"\nrequired = true\n",
        newer.display()
    )))
    .expect("a newer plugin loads");
    let h = node
        .put(
            &[9u8; 64],
            &shardport_host::TensorSpec::bytes(64),
            Default::default(),
        )
        .unwrap();
    let f = node
        .fetch_mode(&h, shardport_host::FetchMode::Copy)
        .unwrap();
    assert_eq!((f.selection.transport.as_str(), f.data[0]), ("faulty", 9));
}
