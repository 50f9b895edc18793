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
