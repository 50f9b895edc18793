//! The documents speak of the product: no Markdown file of the repository
//! narrates how it was made (work sessions, issue numbers) or points
//! outside the repository for the facts it relies on. Fails listing every
//! `file:line` that does.

use std::path::{Path, PathBuf};

/// Directories that hold no documents of the product.
const SKIP: &[&str] = &[
    ".git",
    "target",
    ".venv",
    ".tools",
    "node_modules",
    "corpus",
    ".pytest_cache",
];

fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIP.contains(&name.as_str()) {
                markdown(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// Why `line` narrates, if it does.
fn narrates(line: &str) -> Option<&'static str> {
    let l = line.to_lowercase();
    let words: Vec<&str> = l
        .split(|c: char| !c.is_alphanumeric() && c != '#')
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or("");
        let prev = if i > 0 { words[i - 1] } else { "" };
        // TLS's sessions (resumption, tickets) are the product's.
        let tls = matches!(prev, "tls" | "ssl" | "encrypted")
            || matches!(next, "ticket" | "tickets" | "resumption" | "keys");
        if (*w == "session" || *w == "sessions") && !tls {
            return Some("names a work session");
        }
        if (*w == "issue" || *w == "issues")
            && next
                .trim_start_matches('#')
                .starts_with(|c: char| c.is_ascii_digit())
        {
            return Some("cites an issue number");
        }
    }
    if l.contains("../shared") {
        return Some("points outside the repository");
    }
    None
}

#[test]
fn no_document_narrates_how_the_product_was_made() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    markdown(root, &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "the scan found the README"
    );
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = narrates(line) {
                let rel = f.strip_prefix(root).unwrap_or(f).display();
                found.push(format!("{rel}:{}: {why}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_rule_catches_narration_and_spares_the_product() {
    assert!(narrates("measured in the eleventh session").is_some());
    assert!(narrates("Sessions 3 and 4 found").is_some());
    assert!(narrates("see (issues 26, 27)").is_some());
    assert!(narrates("## Open (issue 13)").is_some());
    assert!(narrates("issue #12 fixed it").is_some());
    // Built at run time, so this file itself names no path outside.
    let outside = format!("facts in ../{}/NOTES.md", "shared");
    assert!(narrates(&outside).is_some());
    assert!(narrates("a TLS session is resumed").is_none());
    assert!(narrates("no session tickets: a pooled connection").is_none());
    assert!(narrates("a known issue with NIXL's fallback").is_none());
    assert!(narrates("the 16-node broadcast takes 1.11x").is_none());
}
