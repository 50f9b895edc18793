//! `shardport new-transport NAME`: writes the crate of a new third-party
//! transport, ready to build outside this repository against
//! `shardport-abi` and `shardport-kit`: a working transport (it moves CPU
//! shards between processes of one machine through files in a directory,
//! the design of the `spool-dir` example) under the new name, with its unit
//! tests and the kit's conformance suite, a standalone workspace, and the
//! config snippet that loads it. The author changes what it does; the
//! plumbing (entry point, panic safety, descriptor codec, counters,
//! liveness, tests) is already right.

use std::path::{Path, PathBuf};

use super::{Failure, Outcome, EXIT_CONFIG, EXIT_FAILURE};

/// Arguments of `shardport new-transport`.
#[derive(clap::Args)]
pub struct Args {
    /// The transport's name (what configs, routes and handles call it):
    /// 1..=32 of `[a-z0-9-]`, a letter first. Also the crate's name.
    name: String,
    /// The directory the crate is written in (it must not exist yet).
    /// Default: `./NAME`.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A checkout of shardport whose `abi/` and `kit/` the crate depends on
    /// by path. Default: the checkout this binary was built from, when it is
    /// still there; otherwise the registry versions.
    #[arg(long, value_name = "DIR")]
    shardport: Option<PathBuf>,
}

/// The template's files: the `spool-dir` example's sources.
const LIB: &str = include_str!("../../../examples/spool-transport/src/lib.rs");
const DESCRIPTOR: &str = include_str!("../../../examples/spool-transport/src/descriptor.rs");
const SYS: &str = include_str!("../../../examples/spool-transport/src/sys.rs");
const TESTS: &str = include_str!("../../../examples/spool-transport/src/tests.rs");
const CONFORMANCE: &str = include_str!("../../../examples/spool-transport/tests/conformance.rs");

/// The ABI and kit versions this binary speaks.
const ABI_VERSION: &str = shardport_abi::ABI_VERSION;
const KIT_VERSION: &str = shardport_kit::VERSION;

/// Whether `name` is a transport name the host accepts that also makes a
/// tidy crate name (at most 32 characters, no trailing `-`).
fn valid_name(name: &str) -> bool {
    shardport_host::vocab::TransportName::new(name).is_ok()
        && name.len() <= 32
        && !name.ends_with('-')
}

/// `my-files` -> `MyFiles`.
fn camel(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The template's text under the new name.
fn renamed(text: &str, name: &str) -> String {
    let ident = name.replace('-', "_");
    text.replace("shardport-spool-transport", name)
        .replace("shardport_spool_transport", &ident)
        .replace("SpoolTransport", &format!("{}Transport", camel(name)))
        .replace("spool-dir", name)
        .replace("\"spool_dir\"", &format!("\"{ident}\""))
}

/// Where `abi` and `kit` come from in the new manifest.
fn dependency(krate: &str, version: &str, checkout: Option<&Path>, features: &str) -> String {
    match checkout {
        Some(root) => format!(
            "shardport-{krate} = {{ path = {:?}, version = \"{version}\"{features} }}",
            root.join(krate).display().to_string()
        ),
        None => format!("shardport-{krate} = {{ version = \"={version}\"{features} }}"),
    }
}

fn manifest(name: &str, checkout: Option<&Path>) -> String {
    format!(
        "# A shardport transport, written against shardport-abi and shardport-kit\n\
         # alone. Build: cargo build --release; test: cargo test (unit tests and the\n\
         # conformance suite every transport passes).\n\
         [package]\n\
         name = \"{name}\"\n\
         version = \"0.1.0\"\n\
         edition = \"2021\"\n\
         rust-version = \"1.85\"\n\
         publish = false\n\n\
         [lib]\n\
         # cdylib: the `.so` the host loads; rlib: unit tests build instances in-process.\n\
         crate-type = [\"cdylib\", \"rlib\"]\n\n\
         [dependencies]\n{}\n{}\n\n\
         [dev-dependencies]\n{}\ntempfile = \"3\"\n\n\
         [lints.rust]\n\
         unsafe_op_in_unsafe_fn = \"deny\"\n\
         # abi_stable's `#[sabi_trait]` expands to impls inside a const block.\n\
         non_local_definitions = \"allow\"\n\n\
         # A panic is caught inside the plugin; `abort` would kill the host instead.\n\
         [profile.dev]\npanic = \"unwind\"\n[profile.release]\npanic = \"unwind\"\n\n\
         # Its own workspace: cargo never looks further up.\n\
         [workspace]\n",
        dependency("abi", ABI_VERSION, checkout, ""),
        dependency("kit", KIT_VERSION, checkout, ""),
        dependency(
            "kit",
            KIT_VERSION,
            checkout,
            ", features = [\"conformance\"]"
        ),
    )
}

fn readme(name: &str) -> String {
    format!(
        "# {name}\n\n\
         A shardport transport. As written by `shardport new-transport`, it moves\n\
         CPU shards between processes of one machine through files in a\n\
         directory (`dir` in its config table); change what it does in\n\
         `src/lib.rs` (export, import, unexport, health) and\n\
         `src/descriptor.rs` (what a handle carries to reach a shard).\n\n\
         ```sh\n\
         cargo test             # unit tests and the conformance suite\n\
         cargo build --release  # target/release/lib{ident}.so\n\
         shardport plugins --config plugin.toml\n\
         ```\n",
        ident = name.replace('-', "_")
    )
}

/// The config table that loads the built library.
fn snippet(name: &str, crate_dir: &Path) -> String {
    format!(
        "[[plugin]]\nname = \"{name}\"\npath = \"{}\"\nrequired = true\n[plugin.config]\ndir = \"{}\"\n",
        crate_dir
            .join("target/release")
            .join(format!("lib{}.so", name.replace('-', "_")))
            .display(),
        std::env::temp_dir().join(format!("{name}-spool")).display()
    )
}

/// The checkout this binary was built from, if it still has `abi` and `kit`.
fn built_from() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    (root.join("abi/Cargo.toml").is_file() && root.join("kit/Cargo.toml").is_file())
        .then(|| root.to_path_buf())
}

/// Writes the crate and prints what to do next.
pub fn run(args: Args) -> Outcome {
    let name = args.name;
    if !valid_name(&name) {
        return Err(Failure::from((
            EXIT_CONFIG,
            format!("transport name `{name}`: expected 1..=32 of [a-z0-9-], a letter first, not ending in `-` (example: my-files)"),
        )));
    }
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&name));
    if dir.exists() {
        return Err(Failure::from((
            EXIT_CONFIG,
            format!(
                "{} exists already: name a new directory with --dir",
                dir.display()
            ),
        )));
    }
    let checkout = match args.shardport {
        Some(p) if p.join("abi/Cargo.toml").is_file() && p.join("kit/Cargo.toml").is_file() => {
            Some(std::path::absolute(&p).unwrap_or(p))
        }
        Some(p) => {
            return Err(Failure::from((
                EXIT_CONFIG,
                format!(
                    "--shardport {}: no abi/Cargo.toml and kit/Cargo.toml there",
                    p.display()
                ),
            )))
        }
        None => built_from(),
    };
    let abs = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
    let table = snippet(&name, &abs);
    let files: [(&str, String); 8] = [
        ("Cargo.toml", manifest(&name, checkout.as_deref())),
        ("README.md", readme(&name)),
        ("src/lib.rs", renamed(LIB, &name)),
        ("src/descriptor.rs", renamed(DESCRIPTOR, &name)),
        ("src/sys.rs", renamed(SYS, &name)),
        ("src/tests.rs", renamed(TESTS, &name)),
        ("tests/conformance.rs", renamed(CONFORMANCE, &name)),
        ("plugin.toml", table.clone()),
    ];
    for (path, text) in &files {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                Failure::from((EXIT_FAILURE, format!("creating {}: {e}", parent.display())))
            })?;
        }
        super::write_file(&file, text.as_bytes())?;
    }
    println!("wrote the crate of transport `{name}` in {}", abs.display());
    match &checkout {
        Some(c) => println!("  shardport-abi and shardport-kit from {}", c.display()),
        None => println!(
            "  shardport-abi ={ABI_VERSION} and shardport-kit ={KIT_VERSION} from the registry"
        ),
    }
    println!("next:");
    println!(
        "  cd {} && cargo test && cargo build --release",
        abs.display()
    );
    println!(
        "  shardport plugins --config {}",
        abs.join("plugin.toml").display()
    );
    println!("the config table that loads it (also in plugin.toml):");
    print!("{table}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_renamed_everywhere() {
        for ok in ["my-files", "a", "x2-y"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "My", "2x", "a_b", "a-", &"a".repeat(33)] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(camel("my-files"), "MyFiles");
        let lib = renamed(LIB, "my-files");
        assert!(
            lib.contains("pub const TRANSPORT_NAME: &str = \"my-files\";"),
            "the name constant"
        );
        assert!(lib.contains("MyFilesTransport"));
        for old in ["spool-dir", "SpoolTransport", "shardport_spool_transport"] {
            assert!(!lib.contains(old), "{old} left in lib.rs");
        }
        assert!(renamed(CONFORMANCE, "my-files").contains("my_files::create"));
    }
}
