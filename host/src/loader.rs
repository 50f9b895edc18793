//! The plugin loader.
//!
//! Each configured library is opened through its abi_stable library header
//! and `init_root_module` (never `RootModule::load_from_file`, which caches one
//! module per interface type and would hand back the first plugin for every
//! file). Only the plugins the config names are loaded; libraries are never
//! unloaded (abi_stable leaks them, and the same path loaded twice is one
//! module). Every failure is collected and reported together, each as one line
//! naming the plugin and the file; the long layout report of an ABI mismatch
//! goes to the `debug` level.

use std::{
    fmt,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
};

use abi_stable::library::{lib_header_from_path, LibraryError, RootModule};
use sha2::{Digest, Sha256};
use shardport_abi::{
    Capabilities, ErrorKind, HostContext, HostServicesBox, IdentityParts, PluginModuleRef,
    SharedTransport, TD_Opaque, TransportInfo, ABI_VERSION,
};

use crate::{
    config::PluginSpec,
    services::{Clock, PluginServices},
    vocab::TransportName,
};

/// A loaded, constructed transport.
pub struct LoadedPlugin {
    /// Instance name (the config's `name`).
    pub name: TransportName,
    /// The spec it was loaded from (a reload keeps the instance when the
    /// spec is unchanged); `spec.transport` is what the library implements.
    pub spec: PluginSpec,
    /// The file that was loaded.
    pub path: PathBuf,
    /// `shardport-abi` version the plugin was built against.
    pub abi_version: String,
    /// The plugin's own version.
    pub plugin_version: String,
    /// What the instance reported in `describe`.
    pub info: TransportInfo,
    /// The instance.
    pub transport: SharedTransport,
}

impl LoadedPlugin {
    /// Capability flags.
    pub fn capabilities(&self) -> Capabilities {
        self.info.capabilities
    }

    /// Identity parts a same-node transport needs.
    pub fn needs_identity(&self) -> IdentityParts {
        self.info.needs_identity
    }
}

impl fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("plugin_version", &self.plugin_version)
            .field("capabilities", &self.info.capabilities)
            .finish_non_exhaustive()
    }
}

use crate::error::LoadError;

/// The plugin's refusal of its own config table (a `CONFIG` error from its
/// constructor), located at the key it names in `spec`'s table.
pub fn config_refusal(e: &LoadError, spec: &PluginSpec) -> Option<crate::config::ConfigError> {
    match e {
        LoadError::Constructor { plugin, error, .. } if error.kind == ErrorKind::CONFIG => {
            Some(spec.config_places.error(
                plugin.as_str(),
                format!("plugin `{plugin}` refused its config: {}", error.message),
            ))
        }
        _ => None,
    }
}

/// Everything one load pass produced.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Plugins that loaded, in config order.
    pub loaded: Vec<LoadedPlugin>,
    /// Failures, in config order, with whether the plugin was `required`.
    pub failures: Vec<(LoadError, bool)>,
}

/// What the loader needs from the node for each instance's context.
#[derive(Debug, Clone)]
pub struct NodeContext {
    /// Node name.
    pub node_name: String,
    /// Node tag (unique per node instance).
    pub node_tag: String,
    /// Clock handed to plugins.
    pub clock: Arc<dyn Clock>,
    /// Transports (kinds) that already have an instance holding the bare
    /// node tag, and a counter for the tags of the others.
    pub tags_used: Arc<std::sync::Mutex<(Vec<TransportName>, u64)>>,
}

impl NodeContext {
    /// The node tag for a new instance of `spec`: the node's own for the
    /// first instance of its transport, `{tag}x{n}` for later ones (the
    /// tag's last part stays `[a-z0-9]`, so dead-owner sweeps still read it).
    pub fn instance_tag(&self, spec: &PluginSpec) -> String {
        let mut used = self.tags_used.lock().unwrap_or_else(|p| p.into_inner());
        if !used.0.contains(&spec.transport) {
            used.0.push(spec.transport.clone());
            return self.node_tag.clone();
        }
        used.1 += 1;
        format!("{}x{}", self.node_tag, used.1)
    }
}

/// Loads every spec; never panics, never stops at the first failure.
pub fn load_all(specs: &[PluginSpec], node: &NodeContext) -> LoadReport {
    let mut report = LoadReport::default();
    for spec in specs {
        match load_instance(spec, node) {
            Ok(p) => report.loaded.push(p),
            Err(e) => report.failures.push((e, spec.required)),
        }
    }
    report
}

/// Loads one spec as a new instance, logging the outcome. Two instances of
/// one transport in a node (two builds, or an old and a new instance across
/// a reload) must not share the names of their resources: the second and
/// later get a node tag of their own ([`NodeContext::instance_tag`]).
pub fn load_instance(spec: &PluginSpec, node: &NodeContext) -> Result<LoadedPlugin, LoadError> {
    let node = NodeContext {
        node_tag: node.instance_tag(spec),
        ..node.clone()
    };
    {
        let _span = tracing::info_span!(target: "loader", "load", plugin = %spec.name).entered();
        match load_one(spec, &node) {
            Ok(p) => {
                tracing::info!(
                    target: "loader",
                    path = %p.path.display(),
                    version = %p.plugin_version,
                    abi = %p.abi_version,
                    capabilities = ?p.info.capabilities,
                    "plugin loaded"
                );
                Ok(p)
            }
            Err(e) => {
                if let LoadError::Layout { detail, .. } = &e {
                    tracing::debug!(target: "loader", detail = %detail, "abi_stable layout report");
                }
                tracing::warn!(target: "loader", error = %e, required = spec.required, "plugin not loaded");
                Err(e)
            }
        }
    }
}

fn load_one(spec: &PluginSpec, node: &NodeContext) -> Result<LoadedPlugin, LoadError> {
    let plugin = spec.name.clone();
    let path = spec
        .paths
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| LoadError::NotFound {
            plugin: plugin.clone(),
            written: spec.path_as_written.clone(),
            tried: spec.paths.clone(),
        })?;
    if let Some(expected) = spec.sha256 {
        let found = sha256_file(&path).map_err(|source| LoadError::Read {
            plugin: plugin.clone(),
            path: path.clone(),
            source,
        })?;
        if found != expected {
            return Err(LoadError::Checksum {
                plugin,
                path,
                expected: hex::encode(expected),
                found: hex::encode(found),
            });
        }
    }
    let module = open_module(&plugin, &path)?;
    let declared = module.transport_name().to_string();
    if declared != spec.transport.as_str() {
        return Err(LoadError::WrongTransport {
            plugin,
            expected: spec.transport.clone(),
            path,
            found: declared,
        });
    }
    let services = PluginServices {
        plugin: plugin.to_string(),
        node: node.node_name.clone(),
        clock: Arc::clone(&node.clock),
    };
    let ctx = HostContext {
        instance: plugin.as_str().into(),
        config: spec.config_text.as_str().into(),
        node_name: node.node_name.as_str().into(),
        node_tag: node.node_tag.as_str().into(),
        services: HostServicesBox::from_value(services, TD_Opaque),
    };
    let transport = (module.new_transport())(ctx)
        .into_result()
        .map_err(|error| LoadError::Constructor {
            plugin: plugin.clone(),
            path: path.clone(),
            error,
        })?;
    let transport = match spec.faults {
        Some(f) => {
            tracing::warn!(target: "loader", plugin = %plugin, faults = ?f, "FAULT INJECTION enabled in front of this plugin ([plugin.faults]); for drills and tests only");
            crate::faults::inject(transport, f)
        }
        None => transport,
    };
    let info = transport.describe();
    if info.name.as_str() != spec.transport.as_str() {
        return Err(LoadError::WrongTransport {
            plugin,
            expected: spec.transport.clone(),
            path,
            found: info.name.to_string(),
        });
    }
    Ok(LoadedPlugin {
        name: plugin,
        spec: spec.clone(),
        path,
        abi_version: module.abi_version().to_string(),
        plugin_version: module.plugin_version().to_string(),
        info,
        transport: Arc::new(transport),
    })
}

fn open_module(plugin: &TransportName, path: &Path) -> Result<PluginModuleRef, LoadError> {
    let header = lib_header_from_path(path).map_err(|e| classify(plugin, path, e))?;
    header
        .init_root_module::<PluginModuleRef>()
        .map_err(|e| classify(plugin, path, e))
}

fn classify(plugin: &TransportName, path: &Path, e: LibraryError) -> LoadError {
    let plugin = plugin.clone();
    let path = path.to_path_buf();
    let e_text = e.to_string();
    match e {
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => LoadError::Incompatible {
            plugin,
            path,
            expected: compatible_range(&expected_version.to_string()),
            found: actual_version.to_string(),
        },
        LibraryError::AbiInstability(report) => {
            let detail = report.to_string();
            // A plugin built against a newer minor version passes abi_stable's
            // version check and fails here, on the package version of every
            // interface type: report it as the version mismatch it is.
            if let Some(e) = layout_errors(&detail)
                .into_iter()
                .find(|e| e.what == "incompatible package versions")
            {
                tracing::debug!(target: "loader", detail = %detail, "abi_stable layout report");
                return LoadError::Incompatible {
                    plugin,
                    path,
                    expected: compatible_range(&e.expected),
                    found: e.found,
                };
            }
            LoadError::Layout {
                plugin,
                path,
                summary: layout_summary(&detail),
                host_abi: ABI_VERSION.to_owned(),
                detail,
            }
        }
        LibraryError::OpenError { err, .. } => LoadError::NotAPlugin {
            plugin,
            path,
            reason: format!("cannot open as a shared library: {err}"),
        },
        LibraryError::InvalidAbiHeader(_) | LibraryError::InvalidCAbi { .. } => LoadError::NotAPlugin {
            plugin,
            path,
            reason: format!(
                "it was built with an abi_stable version or C ABI incompatible with this host's: {}",
                one_line(&e_text)
            ),
        },
        LibraryError::GetSymbolError { .. } => LoadError::NotAPlugin {
            plugin,
            path,
            reason: "it exports no shardport root module (is it built with `export_plugin!`?)"
                .to_owned(),
        },
        LibraryError::RootModule { err, .. } => LoadError::NotAPlugin {
            plugin,
            path,
            reason: format!("its root module failed to initialize: {err}"),
        },
        other => LoadError::NotAPlugin {
            plugin,
            path,
            reason: one_line(&other.to_string()),
        },
    }
}

/// `0.1.0` -> `0.1.x`; `1.2.3` -> `1.x` (abi_stable's compatibility rule).
fn compatible_range(v: &str) -> String {
    let parts: Vec<&str> = v.split('.').collect();
    match parts.as_slice() {
        ["0", minor, ..] => format!("0.{minor}.x"),
        [major, ..] => format!("{major}.x"),
        _ => v.to_owned(),
    }
}

/// One `Error:` entry of abi_stable's layout report.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LayoutError {
    what: String,
    expected: String,
    found: String,
}

/// The `Error:` entries of abi_stable's (~46 KB) layout report, each with
/// its `Expected:` / `Found:` values (which abi_stable puts on the same or
/// the following line), deduplicated, in order.
fn layout_errors(report: &str) -> Vec<LayoutError> {
    let mut out: Vec<LayoutError> = Vec::new();
    let lines: Vec<&str> = report.lines().map(str::trim).collect();
    let value = |i: usize, label: &str| -> Option<String> {
        let rest = lines.get(i)?.strip_prefix(label)?.trim();
        Some(if rest.is_empty() {
            lines.get(i + 1).map(|l| one_line(l)).unwrap_or_default()
        } else {
            one_line(rest)
        })
    };
    for (i, line) in lines.iter().enumerate() {
        let Some(what) = line.strip_prefix("Error:") else {
            continue;
        };
        let mut e = LayoutError {
            what: one_line(what),
            expected: String::new(),
            found: String::new(),
        };
        for j in i + 1..(i + 5).min(lines.len()) {
            if let Some(v) = value(j, "Expected:") {
                e.expected = v;
            } else if let Some(v) = value(j, "Found:") {
                e.found = v;
            }
        }
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// A one-line summary of a layout report: its first three errors.
pub fn layout_summary(report: &str) -> String {
    let errors = layout_errors(report);
    if errors.is_empty() {
        return one_line(report).chars().take(200).collect();
    }
    errors
        .iter()
        .take(3)
        .map(|e| {
            if e.expected.is_empty() && e.found.is_empty() {
                e.what.clone()
            } else {
                format!("{} (expected {}, found {})", e.what, e.expected, e.found)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().into())
}

/// sha256 of a file as hex (for `shardport plugins` and pinning).
pub fn sha256_hex(path: &Path) -> std::io::Result<String> {
    sha256_file(path).map(hex::encode)
}

/// The abi_stable name of the root module type, for messages.
pub fn root_module_name() -> &'static str {
    <PluginModuleRef as RootModule>::NAME
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(compatible_range("0.1.0"), "0.1.x");
        assert_eq!(compatible_range("2.3.4"), "2.x");
    }

    #[test]
    fn summary_keeps_error_lines() {
        let report = "lots of text\n  Error: too many fields\n   Expected: 4\n   Found: 5\nmore\nError: too many fields\nExpected: 4\nFound: 5\n";
        assert_eq!(
            layout_summary(report),
            "too many fields (expected 4, found 5)"
        );
        let versions = "x\nError:incompatible package versions\nExpected:\n    0.1.0\nFound:\n    0.2.0\n1 error(s)inside:";
        assert_eq!(
            layout_errors(versions),
            vec![LayoutError {
                what: "incompatible package versions".into(),
                expected: "0.1.0".into(),
                found: "0.2.0".into()
            }]
        );
    }
}
