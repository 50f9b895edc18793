//! The bodies of shardport's fuzz targets, one function per target.
//!
//! Each function takes the fuzzer's bytes, feeds them to a parser that reads
//! input from a peer or a file, and asserts the property that matters for
//! it: no panic, a refusal is an error value, what was accepted re-encodes
//! to what decodes equal (byte for byte where the format is canonical), and
//! sizes stay within their limits. A failed assertion is a finding.
//!
//! This file holds the targets over the host and the CLI; each transport's
//! targets sit in a file of their own (`posix_shm.rs`, `http.rs`,
//! `cuda_ipc.rs`, `spool.rs`) that only its binaries include: two plugin
//! crates cannot link into one binary (each defines abi_stable's root-module
//! symbol).
//!
//! The libFuzzer binaries in `fuzz_targets/` call these functions (nightly,
//! `cargo +nightly fuzz run <target>`); the root package's
//! `tests/fuzz_corpus*.rs` include the same files and replay the checked-in
//! corpus through every function on stable, so `cargo test --workspace`
//! covers the corpus without nightly.
//!
//! Where to start: each file's `TARGETS` lists its targets by name (the
//! name is also the corpus directory, `fuzz/corpus/<name>/`).

use std::io::Cursor;

use shardport_cli::ab_report;
use shardport_control as control;
use shardport_host::{
    config::{self, Origin},
    handle::Handle,
    snapshot::{self, Snapshot},
    vocab::MAX_JSON,
};

/// A fuzz target: its name (binary and corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// The targets of this file: name (binary and corpus directory) and body.
pub const TARGETS: &[Target] = &[
    ("handle_bytes", handle_bytes),
    ("handle_json", handle_json),
    ("control_head", control_head),
    ("config_toml", config_toml),
    ("snapshot_json", snapshot_json),
    ("weights_manifest", weights_manifest),
];

// ---------------------------------------------------------------------------
// Weights manifests (weights/src/manifest.rs)

/// Weights manifests (what a receiver decodes from the caller's RPC): a
/// refusal names what was wrong; an accepted manifest passes its own checks,
/// re-encodes byte for byte (the format is canonical but for handles, which
/// re-encode to their own canonical form) and decodes equal again.
pub fn weights_manifest(data: &[u8]) {
    use shardport_weights::{Manifest, WeightsError};
    let m = match Manifest::from_bytes(data) {
        Ok(m) => m,
        Err(WeightsError::Manifest { what, offset }) => {
            assert!(!what.is_empty());
            assert!(
                offset.is_none_or(|o| o <= data.len()),
                "offset past the input"
            );
            return;
        }
        Err(e) => panic!("a decode failed with a non-manifest error: {e}"),
    };
    m.check().expect("an accepted manifest passes its checks");
    let bytes = m.to_bytes();
    let again = Manifest::from_bytes(&bytes).expect("a re-encoded manifest decodes");
    assert_eq!(again, m);
    assert_eq!(again.to_bytes(), bytes, "the encoding is canonical");
}

// ---------------------------------------------------------------------------
// Handles (host/src/handle/)

/// Binary handles: a decoded handle re-encodes to bytes that decode equal
/// (version 2), no longer than a version 1 input (duplicate tags collapse;
/// a version 2 input may pack its descriptors more tightly than the
/// encoder's greedy packing, so it is not compared), and converts to a
/// JSON handle that decodes equal; a refusal points inside the input.
pub fn handle_bytes(data: &[u8]) {
    let h = match Handle::from_bytes(data) {
        Ok(h) => h,
        Err(e) => {
            assert!(
                e.offset <= data.len(),
                "error offset {} past the input",
                e.offset
            );
            assert!(!e.what.is_empty());
            return;
        }
    };
    let bytes = h.to_bytes();
    if data.starts_with(b"SPHD") {
        assert!(
            bytes.len() <= data.len(),
            "re-encoding a version 1 handle grew"
        );
    }
    let again = Handle::from_bytes(&bytes).expect("a re-encoded handle decodes");
    assert_eq!(again, h);
    check_json_form(&h);
}

/// JSON handles: a decoded handle converts to JSON and to the binary form,
/// both of which decode equal; refusals carry offset 0.
pub fn handle_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let h = match Handle::from_json(text) {
        Ok(h) => h,
        Err(e) => {
            assert_eq!(e.offset, 0, "JSON errors have no byte offset");
            return;
        }
    };
    assert!(text.len() <= MAX_JSON);
    let again = Handle::from_bytes(&h.to_bytes()).expect("the binary form decodes");
    assert_eq!(again, h);
    check_json_form(&h);
}

fn check_json_form(h: &Handle) {
    let json = h.to_json();
    // A handle whose descriptors are near their limits has a JSON form
    // over MAX_JSON (hex doubles them); that one is refused by design.
    if json.len() <= MAX_JSON {
        let again = Handle::from_json(&json).expect("a handle's JSON form decodes");
        assert_eq!(&again, h);
    }
}

// ---------------------------------------------------------------------------
// Control endpoint request heads (http-base/src/head.rs with the control
// endpoint's rules, control/src/lib.rs `HEAD_RULES`)

/// The control endpoint's head reader, field parser and body framing, with
/// the server's head limit and with a small one: lines never carry CR or
/// LF, a head never reads past its limit, fields are tokens with trimmed
/// values, and the body length agrees with a straightforward reading of
/// RFC 9112 restricted to this endpoint's rules.
pub fn control_head(data: &[u8]) {
    for max in [control::MAX_HEADER_BYTES, 64] {
        control_head_with(data, max);
    }
}

fn control_head_with(data: &[u8], max: usize) {
    use shardport_http_base::head::{self, HeadError, Rules};
    let rules = Rules {
        max_bytes: max,
        ..control::HEAD_RULES
    };
    let mut cursor = Cursor::new(data);
    let mut lines = Vec::new();
    let read = head::read_lines(&mut cursor, &rules, |line| {
        assert!(
            !line.contains(['\r', '\n']),
            "line end inside a line: {line:?}"
        );
        lines.push(line.to_owned());
        Ok(())
    });
    let used = cursor.position() as usize;
    match read {
        Ok(()) => {
            assert!(used <= max, "read {used} bytes of head, limit {max}");
            assert!(data[..used].ends_with(b"\n"));
            let breaks = data[..used].iter().filter(|&&b| b == b'\n').count();
            assert_eq!(breaks, lines.len() + 1, "one line per line end");
        }
        Err(HeadError::TooLarge(m)) => {
            assert_eq!(m, max);
            assert!(data.len() > max, "too large, but only {} bytes", data.len());
            return;
        }
        Err(_) => return,
    }
    // The first line is the request line; the rest are fields.
    let mut fields = Vec::new();
    for line in lines.iter().skip(1) {
        let Ok((name, value)) = head::parse_field(line, &rules) else {
            return;
        };
        assert!(!name.is_empty() && line.starts_with(&format!("{name}:")));
        assert!(!value.starts_with([' ', '\t']) && !value.ends_with([' ', '\t']));
        assert!(!value.contains('\0'));
        fields.push((name, value));
    }
    let got = head::body_length(&fields, &rules).ok();
    assert_eq!(got, expected_body_length(&fields), "fields {fields:?}");
}

/// The body length a request with `fields` declares, read directly from the
/// endpoint's rules: no `transfer-encoding`, at most one `content-length`
/// of 1 to 19 ASCII digits. `None` inside: no body; outer `None`: refused.
fn expected_body_length(fields: &[(String, String)]) -> Option<Option<u64>> {
    if fields
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding"))
    {
        return None;
    }
    let lengths: Vec<&String> = fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v)
        .collect();
    match lengths[..] {
        [] => Some(None),
        [v] if (1..=19).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()) => {
            Some(Some(v.parse().expect("19 digits fit a u64")))
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Config TOML (shardport_host::config::parse_str)

/// Config text: parsing is deterministic, and an error's location points
/// into the text (its source line is the text's line, its column on it).
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = || Origin::Text {
        name: "fuzz.toml".to_owned(),
        base_dir: "/nonexistent-fuzz-dir".into(),
        search_deps: false,
    };
    match config::parse_str(text, origin()) {
        Ok(c) => {
            assert_eq!(config::parse_str(text, origin()).ok(), Some(c));
        }
        Err(e) => {
            assert_eq!(e.origin, "fuzz.toml");
            assert!(!e.message.is_empty());
            if e.line > 0 {
                let line = text
                    .split('\n')
                    .nth(e.line - 1)
                    .unwrap_or_else(|| panic!("error on line {} past the text", e.line));
                assert_eq!(e.source_line, line.trim_end());
                assert!(e.col >= 1 && e.col - 1 <= line.chars().count());
            }
            assert!(e.to_string().contains("fuzz.toml"));
        }
    }
}

// ---------------------------------------------------------------------------
// Metrics snapshot JSON (shardport_host::snapshot, shardport_cli::ab_report)

/// Snapshot JSON: `ab_report::parse_str` accepts exactly what serde reads
/// with the right format tag; an accepted snapshot serializes to JSON that
/// reads back equal (floats to their precision); the report builds or
/// refuses without panicking.
pub fn snapshot_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let direct = serde_json::from_str::<Snapshot>(text);
    let parsed = match ab_report::parse_str(text, "fuzz.json") {
        Ok(s) => s,
        Err(e) => {
            assert!(
                e.to_string().contains("fuzz.json"),
                "error without origin: {e}"
            );
            if let Ok(s) = direct {
                assert_ne!(s.format, snapshot::FORMAT, "refused a well-formed snapshot");
            }
            return;
        }
    };
    assert_eq!(parsed.format, snapshot::FORMAT);
    let direct = direct.expect("serde reads what parse_str accepted");
    assert!(same_json(&to_value(&direct), &to_value(&parsed)));
    let json = serde_json::to_string(&parsed).expect("a snapshot serializes");
    let again: Snapshot = serde_json::from_str(&json).expect("a serialized snapshot reads back");
    assert!(same_json(&to_value(&again), &to_value(&parsed)));
    let opts = ab_report::Options {
        resamples: ab_report::MIN_RESAMPLES,
        ..ab_report::Options::default()
    };
    if let Ok(report) = ab_report::build(&parsed, &opts) {
        let _ = report.to_string();
    }
}

fn to_value(s: &Snapshot) -> serde_json::Value {
    serde_json::to_value(s).expect("a snapshot converts to a JSON value")
}

/// JSON equality with floats compared to a relative 1e-12.
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
