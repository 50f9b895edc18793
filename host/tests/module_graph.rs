//! The host library's modules form a DAG, listed leaves first in `lib.rs`;
//! so do the kit's, the transports', the CLI's and the Python binding's.
//!
//! Reads every file under `host/src`, collects the top-level modules each one
//! names (`crate::a::..`, `use crate::{a, b::C}`, `super::` paths resolved
//! against the file's and inline modules' position, so `super::super::a`
//! from `mod tests` in `x.rs` is `a`), and checks three things: the graph has
//! no cycle (printing it when it has one), no module imports `node`, and
//! `lib.rs` declares every module after the ones it uses.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Module name -> the other top-level modules it refers to.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Tokens of Rust source with comments, string and char literals dropped.
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1);
        } else if ch == '\'' {
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1; // a lifetime: its name follows as an identifier
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw = (word == "r" || word == "br") && matches!(c.get(i), Some('"' | '#'));
            if raw {
                i = skip_raw_string(&c, i);
            } else {
                out.push(Tok::Ident(word));
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push(Tok::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// Index just past the closing quote of a string whose body starts at `i`.
fn skip_string(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Index just past a raw string whose `#`s or opening quote start at `i`.
fn skip_raw_string(c: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while c.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < c.len() {
        if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// The top-level modules named by the file whose module path is `path`
/// (`["node", "device"]` for `src/node/device.rs`).
fn references(src: &str, path: &[String]) -> BTreeSet<String> {
    let toks = tokens(src);
    let mut out = BTreeSet::new();
    // Inline modules open at the brace depth recorded with them.
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(d, _)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((depth + 1, name.clone()));
                }
            }
            Tok::Ident(kw) if kw == "crate" || kw == "super" => {
                let preceded_by_sep = i > 0 && toks[i - 1] == Tok::PathSep;
                if !preceded_by_sep {
                    let mut here: Vec<String> = path.to_vec();
                    here.extend(inline.iter().map(|(_, n)| n.clone()));
                    i = resolve(&toks, i, here, &mut out);
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Resolves the path starting at `toks[i]` (`crate` or `super`) seen from
/// module `here`; adds the top-level module it names to `out`. Returns the
/// index of the first token it did not consume.
fn resolve(toks: &[Tok], mut i: usize, mut here: Vec<String>, out: &mut BTreeSet<String>) -> usize {
    if toks[i] == Tok::Ident("crate".into()) {
        here.clear();
        i += 1;
    } else {
        while toks.get(i) == Some(&Tok::Ident("super".into())) {
            here.pop();
            i += 1;
            if toks.get(i) == Some(&Tok::PathSep)
                && toks.get(i + 1) == Some(&Tok::Ident("super".into()))
            {
                i += 1;
            }
        }
    }
    if toks.get(i) != Some(&Tok::PathSep) {
        return i;
    }
    i += 1;
    if let Some(top) = here.first() {
        out.insert(top.clone());
        return i;
    }
    match toks.get(i) {
        Some(Tok::Ident(name)) => {
            out.insert(name.clone());
            i + 1
        }
        Some(Tok::Punct('{')) => group(toks, i, out),
        _ => i,
    }
}

/// Adds the first name of each item of the `{..}` group at `toks[i]`.
fn group(toks: &[Tok], mut i: usize, out: &mut BTreeSet<String>) -> usize {
    let mut nest = 0;
    let mut item_start = true;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => {
                nest += 1;
                item_start = nest == 1;
            }
            Tok::Punct('}') => {
                nest -= 1;
                if nest == 0 {
                    return i + 1;
                }
            }
            Tok::Punct(',') if nest == 1 => item_start = true,
            Tok::Ident(name) if item_start && nest == 1 => {
                out.insert(name.clone());
                item_start = false;
            }
            _ => item_start = false,
        }
        i += 1;
    }
    i
}

/// Every `.rs` file under `dir`, with its module path.
fn source_files(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                out.push((p, parts));
            }
        }
    }
    out.sort();
    out
}

/// The module graph of the crate whose sources are under `src`. Only edges
/// between top-level modules declared in `lib.rs` count.
fn module_graph(src: &Path) -> Graph {
    let modules: BTreeSet<String> = lib_order(src).into_iter().collect();
    let mut g: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (file, path) in source_files(src) {
        let Some(from) = path.first() else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        for to in references(&text, &path) {
            if &to != from && modules.contains(&to) {
                g.get_mut(from).unwrap().insert(to);
            }
        }
    }
    g
}

/// The `pub mod` (or `mod`) lines of `lib.rs`, in order.
fn lib_order(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))?;
            Some(rest.strip_suffix(';')?.trim().to_owned())
        })
        .collect()
}

/// A cycle in `g` as `[a, b, .., a]`, or `None` when `g` is a DAG.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        g: &'a Graph,
        n: &'a str,
        marks: &mut BTreeMap<&'a str, Mark>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match marks.get(n) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack.iter().position(|s| *s == n).unwrap();
                let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
                cycle.push(n.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(n, Mark::Open);
        stack.push(n);
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, m, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(n, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut marks, &mut Vec::new()))
}

fn host_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn render(g: &Graph) -> String {
    g.iter()
        .map(|(m, to)| {
            format!(
                "  {m} -> {}",
                to.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn host_modules_form_a_dag() {
    let g = module_graph(&host_src());
    assert!(g.len() > 10, "too few modules found:\n{}", render(&g));
    if let Some(cycle) = find_cycle(&g) {
        panic!(
            "host modules import each other in a cycle: {}\nfull graph:\n{}",
            cycle.join(" -> "),
            render(&g)
        );
    }
}

/// The same rule for the other crates whose layout a change must not
/// tangle: the plugin kit, the HTTP/TLS base, the transports, the control
/// endpoint, the CLI and the Python binding.
#[test]
fn other_crates_modules_form_dags() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut tangled = Vec::new();
    for krate in [
        "kit",
        "http-base",
        "plugins/posix-shm",
        "plugins/http",
        "plugins/cuda-ipc",
        "control",
        "cli",
        "python",
    ] {
        let g = module_graph(&root.join(krate).join("src"));
        assert!(
            g.len() > 3,
            "{krate}: too few modules found:\n{}",
            render(&g)
        );
        if let Some(cycle) = find_cycle(&g) {
            tangled.push(format!(
                "{krate}: {}\nfull graph:\n{}",
                cycle.join(" -> "),
                render(&g)
            ));
        }
    }
    assert!(
        tangled.is_empty(),
        "modules import each other in a cycle:\n{}",
        tangled.join("\n")
    );
}

#[test]
fn no_module_imports_node_and_vocab_is_a_leaf() {
    let g = module_graph(&host_src());
    let importers: Vec<&String> = g
        .iter()
        .filter(|(_, to)| to.contains("node"))
        .map(|(m, _)| m)
        .collect();
    assert!(importers.is_empty(), "modules import `node`: {importers:?}");
    assert!(
        g["vocab"].is_empty(),
        "vocab must be a leaf: {:?}",
        g["vocab"]
    );
    let error_deps: Vec<&String> = g["error"].iter().filter(|m| *m != "vocab").collect();
    assert!(
        error_deps.is_empty(),
        "error may use only vocab: {error_deps:?}"
    );
}

#[test]
fn lib_rs_lists_modules_leaves_first() {
    let src = host_src();
    let g = module_graph(&src);
    let order = lib_order(&src);
    for (i, m) in order.iter().enumerate() {
        for dep in &g[m] {
            let at = order.iter().position(|o| o == dep).unwrap();
            assert!(
                at < i,
                "lib.rs declares `{m}` before `{dep}`, which it uses"
            );
        }
    }
}

#[test]
fn cycle_finder_reports_a_hand_made_cycle() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let dag = graph(&[("a", "b"), ("b", "c"), ("a", "c"), ("d", "a")]);
    assert_eq!(find_cycle(&dag), None);
    let cyclic = graph(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "b"), ("e", "a")]);
    assert_eq!(
        find_cycle(&cyclic).unwrap(),
        ["b", "c", "d", "b"].map(String::from)
    );
    assert_eq!(
        find_cycle(&graph(&[("x", "x")])).unwrap(),
        ["x", "x"].map(String::from)
    );
}

#[test]
fn scanner_sees_groups_super_and_skips_literals() {
    let src = r##"
        use crate::{config::{self, Config}, handle::Handle, vocab};
        use super::lock;
        // crate::commented
        /* crate::blocked /* nested */ crate::still */
        const S: &str = "crate::quoted";
        const R: &str = r#"crate::raw "quoted""#;
        const C: char = '{';
        fn f<'a>(x: &'a str) -> crate::error::HostError { crate::metrics::x() }
        mod tests {
            use super::*;
            use super::super::select::plan;
        }
    "##;
    let names = |path: &[&str]| {
        let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        references(src, &path).into_iter().collect::<Vec<_>>()
    };
    // From `node/device.rs`: `super::` is `node`, and `super::super::select`
    // inside its `mod tests` is `node` too (device's parent).
    assert_eq!(
        names(&["node", "device"]),
        ["config", "error", "handle", "metrics", "node", "vocab"]
    );
    // From `cache.rs`: `super::lock` names the crate root's `lock`, and
    // `super::super::select` from its `mod tests` is `select`.
    assert_eq!(
        names(&["cache"]),
        ["cache", "config", "error", "handle", "lock", "metrics", "select", "vocab"]
    );
}
