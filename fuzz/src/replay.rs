//! Replays the checked-in corpus of a target through its body: included by
//! the root package's `tests/fuzz_corpus*.rs` (stable, no libFuzzer).

use std::{
    fs,
    path::{Path, PathBuf},
};

/// `fuzz/corpus/<target>/` of this checkout.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// Runs every input of `target`'s corpus through `run`; fails naming the
/// first input it panics on. A corpus needs at least 3 inputs.
pub fn replay(target: &str, run: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "corpus {target} has {} inputs",
        files.len()
    );
    for file in files {
        let data = fs::read(&file).expect("a corpus file");
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "target {target} failed on {}",
            file.display()
        );
    }
}

/// Replaces the `seed-*` files of `target`'s corpus with `seeds` (findings,
/// named `finding-*`, stay).
pub fn write_seeds(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = corpus_dir(target);
    fs::create_dir_all(&dir).expect("corpus directory");
    for entry in fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("an entry").path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        {
            fs::remove_file(path).expect("an old seed");
        }
    }
    for (name, data) in seeds {
        fs::write(dir.join(format!("seed-{name}")), data).expect("a seed");
    }
}
