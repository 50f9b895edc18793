//! What an embedding program was handed as "the config": a file or TOML
//! text. The one rule that tells them apart lives here, so that every front
//! door (the Python binding's `Node(config)`, `Node.reload(config)`,
//! `shardport.env.apply`) reads a string the same way.

use std::path::{Path, PathBuf};

use super::{load, parse_str, Config, LoadError, Origin};

/// A config given as a string: the file it names, or TOML text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file to read (errors point at `file:line:col`, and a node started
    /// from it can read it again on reload).
    File(PathBuf),
    /// TOML text.
    Text(String),
}

impl Source {
    /// The rule: a string naming an existing file is that file; otherwise a
    /// string with a line break, a `=` or a leading `[` is TOML text;
    /// anything else is a path (reading it fails naming the file).
    pub fn of_str(s: &str) -> Source {
        if !s.contains('\n') && Path::new(s).is_file() {
            return Source::File(PathBuf::from(s));
        }
        if s.contains(['\n', '=']) || s.trim_start().starts_with('[') {
            Source::Text(s.to_owned())
        } else {
            Source::File(PathBuf::from(s))
        }
    }

    /// Reads and validates it; text gets `text_origin` (its display name and
    /// the directory its relative plugin paths resolve against).
    pub fn load(&self, text_origin: Origin) -> Result<Config, LoadError> {
        match self {
            Source::File(p) => load(p),
            Source::Text(t) => Ok(parse_str(t, text_origin)?),
        }
    }

    /// The TOML table as written, unvalidated (for a program that edits it
    /// and hands it back, as `shardport.env.apply` does). A file's relative
    /// plugin paths that exist next to it are made absolute, so the table
    /// means the same wherever it is used next.
    pub fn table(&self) -> Result<toml::Table, String> {
        match self {
            Source::Text(t) => {
                toml::from_str(t).map_err(|e| format!("config text is not valid TOML: {e}"))
            }
            Source::File(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read config file {}: {e}", p.display()))?;
                let mut table: toml::Table = toml::from_str(&text)
                    .map_err(|e| format!("cannot read config file {}: {e}", p.display()))?;
                let dir = p.parent().unwrap_or(Path::new("."));
                let plugins = table.get_mut("plugin").and_then(toml::Value::as_array_mut);
                for plugin in plugins.into_iter().flatten() {
                    let Some(path) = plugin.get_mut("path") else {
                        continue;
                    };
                    if let Some(rel) = path.as_str().map(Path::new) {
                        let beside = dir.join(rel);
                        if rel.is_relative() && beside.exists() {
                            let abs = beside.canonicalize().unwrap_or(beside);
                            *path = toml::Value::String(abs.display().to_string());
                        }
                    }
                }
                Ok(table)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin::Text {
            name: "<config string>".into(),
            base_dir: PathBuf::from("/opt/sp"),
            search_deps: false,
        }
    }

    #[test]
    fn a_string_is_a_file_or_text_by_one_rule() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a=b.toml"); // an existing file wins over `=`
        std::fs::write(&odd, "[node]\nname = \"n\"\n").unwrap();
        let odd = odd.to_str().unwrap();
        assert_eq!(Source::of_str(odd), Source::File(odd.into()));
        for text in ["[node]", "  [fetch]", "node.name = \"x\"", "x\ny"] {
            assert_eq!(Source::of_str(text), Source::Text(text.into()), "{text}");
        }
        for path in ["/no/such.toml", "node.toml", "configs/x"] {
            assert_eq!(Source::of_str(path), Source::File(path.into()), "{path}");
        }
    }

    #[test]
    fn a_file_keeps_its_origin_and_text_gets_the_given_one() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("node.toml");
        std::fs::write(&f, "[node]\nname = \"n\"\n").unwrap();
        let c = Source::of_str(f.to_str().unwrap()).load(origin()).unwrap();
        assert_eq!(c.origin, Origin::File(f.clone()));
        let c = Source::of_str("[node]\nname = \"t\"\n")
            .load(origin())
            .unwrap();
        assert_eq!((c.origin, c.node.name.as_str()), (origin(), "t"));
        let e = Source::of_str("/no/such.toml").load(origin()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot read config file /no/such.toml: "),
            "{e}"
        );
        let e = Source::of_str("[fetch]\nmode = \"sideways\"\n")
            .load(origin())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--> <config string>:2:8"), "{e}");
    }

    #[test]
    fn the_table_of_a_file_has_its_existing_relative_plugin_paths_made_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("node.toml");
        std::fs::write(
            &f,
            "[[plugin]]\nname = \"http\"\npath = \"x.so\"\n[[plugin]]\nname = \"y\"\npath = \"gone.so\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("x.so"), b"").unwrap();
        let t = Source::File(f.clone()).table().unwrap();
        let paths: Vec<&str> = t["plugin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["path"].as_str().unwrap())
            .collect();
        let abs = dir.path().canonicalize().unwrap().join("x.so");
        assert_eq!(paths, [abs.to_str().unwrap(), "gone.so"]);
        let text = std::fs::read_to_string(&f).unwrap();
        let t = Source::Text(text).table().unwrap();
        assert_eq!(t["plugin"][0]["path"].as_str(), Some("x.so"));
        let e = Source::Text("[node\n".into()).table().unwrap_err();
        assert!(e.starts_with("config text is not valid TOML"), "{e}");
        let e = Source::of_str("/no/such.toml").table().unwrap_err();
        assert!(
            e.starts_with("cannot read config file /no/such.toml"),
            "{e}"
        );
    }
}
