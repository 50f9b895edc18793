//! A node's config from what Python gives (`None`, a path, TOML text, a
//! dict), read by the host's one pipeline (`config::Source`), with the
//! engine's overrides (`shardport.env`) applied by the host.

use std::path::{Path, PathBuf};

use pyo3::{
    prelude::*,
    types::{PyDict, PyString},
};
use shardport_host::{
    config::{self, EngineOverrides, Exposed, Origin},
    Config,
};

use crate::{
    convert::{dict_to_toml, json_to_py},
    errors::{py_err, Kind},
};

/// The forms a config comes in from Python, before the host reads it.
enum Given {
    /// `None`: the embedded library config.
    Library,
    /// A dict, as TOML text.
    Dict(String),
    /// A path or a string (the host's rule, [`config::Source::of_str`],
    /// tells a file from TOML text).
    Source(config::Source),
}

/// What `config` is, or `None` when it is none of the accepted forms.
fn given(config: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Given>> {
    let Some(c) = config.filter(|c| !c.is_none()) else {
        return Ok(Some(Given::Library));
    };
    Ok(Some(if let Ok(d) = c.downcast::<PyDict>() {
        Given::Dict(dict_to_toml(d)?)
    } else if c.is_instance_of::<PyString>() {
        Given::Source(config::Source::of_str(&c.extract::<String>()?))
    } else if let Ok(p) = c.extract::<PathBuf>() {
        Given::Source(config::Source::File(p))
    } else {
        return Ok(None);
    }))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// Builds the config: `None` (the embedded library config), a path, TOML
/// text or a dict. Text resolves relative plugin paths in `plugin_dir`.
pub(crate) fn load_config(
    config: Option<&Bound<'_, PyAny>>,
    plugin_dir: Option<&Path>,
) -> PyResult<Config> {
    let text_origin = |name: &str| match plugin_dir {
        Some(dir) => Origin::Text {
            name: name.to_owned(),
            base_dir: dir.to_path_buf(),
            search_deps: false,
        },
        None => Origin::embedded(),
    };
    let cfg_err = |e: &dyn std::fmt::Display| py_err(Kind::Config, e.to_string());
    match given(config)? {
        Some(Given::Library) => config::parse_str(
            config::LIBRARY_CONFIG,
            text_origin(config::LIBRARY_CONFIG_ORIGIN),
        )
        .map_err(|e| cfg_err(&e)),
        Some(Given::Dict(text)) => {
            config::parse_str(&text, text_origin("<config dict>")).map_err(|e| cfg_err(&e))
        }
        Some(Given::Source(src)) => src
            .load(text_origin("<config string>"))
            .map_err(|e| cfg_err(&e)),
        None => Err(py_err(
            Kind::Config,
            format!(
                "config must be None, a path, TOML text or a dict, not {}",
                type_name(config.expect("None is a form"))
            ),
        )),
    }
}

/// What this binding changes in every config its node runs: at start, and
/// as the node's reload hook at every reload (so `reload()` of the node's
/// own file changes nothing).
#[derive(Clone)]
pub(crate) struct Adjust {
    /// Relative plugin paths also resolve here (the bundled plugins).
    pub(crate) plugin_dir: Option<PathBuf>,
    /// The engine's address and name (`shardport.env`).
    pub(crate) engine: Option<EngineOverrides>,
}

impl Adjust {
    pub(crate) fn apply(&self, cfg: &mut Config) -> Result<Vec<Exposed>, config::ConfigError> {
        if let Some(dir) = &self.plugin_dir {
            for p in &mut cfg.plugins {
                let written = Path::new(&p.path_as_written);
                if written.is_relative() {
                    p.paths.push(dir.join(written));
                }
            }
        }
        match &self.engine {
            Some(e) => e.apply(cfg),
            None => Ok(Vec::new()),
        }
    }
}

/// `shardport.env`'s overrides applied to a config (the forms `Node`
/// takes), returned as a dict with the warnings to give (an http transport
/// exposed without a token).
#[pyfunction(name = "_engine_config")]
#[pyo3(signature = (config, name, host))]
pub(crate) fn engine_config(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
    name: Option<String>,
    host: String,
) -> PyResult<(PyObject, Vec<String>)> {
    let cfg_err = |e: String| py_err(Kind::Config, e);
    let mut table = match given(config)? {
        Some(Given::Library) => config::Source::Text(config::LIBRARY_CONFIG.to_owned())
            .table()
            .map_err(cfg_err)?,
        Some(Given::Dict(text)) => config::Source::Text(text).table().map_err(cfg_err)?,
        Some(Given::Source(src)) => src.table().map_err(cfg_err)?,
        None => {
            return Err(py_err(
                Kind::InvalidInput,
                format!(
                    "config: expected None, a dict, a path or TOML text, found {}",
                    type_name(config.expect("None is a form"))
                ),
            ))
        }
    };
    let exposed = EngineOverrides { name, host }
        .apply_table(&mut table)
        .map_err(cfg_err)?;
    let v = serde_json::to_value(&table).map_err(|e| py_err(Kind::Config, e.to_string()))?;
    Ok((
        json_to_py(py, &v)?,
        exposed.iter().map(ToString::to_string).collect(),
    ))
}

/// Gives `shardport.env.ExposedWithoutTokenWarning` for each (pointing at
/// the caller's line outside the package; an exception when the filters
/// say so).
pub(crate) fn warn_exposed(py: Python<'_>, exposed: &[Exposed]) -> PyResult<()> {
    if exposed.is_empty() {
        return Ok(());
    }
    let warn = py.import("shardport.env")?.getattr("_warn_exposed")?;
    for e in exposed {
        warn.call1((e.to_string(),))?;
    }
    Ok(())
}
