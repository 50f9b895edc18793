//! Errors of the host library: [`HostError`] for node operations and
//! [`LoadError`] for one plugin that did not load. A leaf above [`crate::vocab`].

use std::path::PathBuf;

use shardport_abi::{AbiError, ShardId};

use crate::vocab::TransportName;

/// A host operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// One or more `required = true` plugins did not load.
    #[error("required plugins did not load:\n  {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    RequiredPlugins(Vec<LoadError>),
    /// Plugins refused a key or value of their own config tables
    /// (`[plugin.config]`): each a config error rendered at the key's
    /// `file:line:col` (see `loader::config_refusal`). Fatal whether the
    /// plugin is `required` or not: `required = false` means "may be
    /// unavailable on this machine", never "drop what I wrote".
    #[error("{}", .0.join("\n"))]
    PluginConfig(Vec<String>),
    /// A config reload was refused; the running config stays in force.
    #[error("reload refused, the running config stays: {0}")]
    ReloadRefused(String),
    /// Put arguments disagree (byte length vs dtype and shape, unsupported device).
    #[error("invalid shard: {0}")]
    InvalidShard(String),
    /// No transport could export the shard. Likely: no plugin loaded, or all refused.
    #[error("shard {id}: no transport exported it: {}", if failures.is_empty() { "none is loaded and selected by put.export-to".to_owned() } else { list(failures) })]
    NoExport {
        /// Shard.
        id: ShardId,
        /// `(transport, error)` per transport tried.
        failures: Vec<(TransportName, AbiError)>,
    },
    /// A transport panicked while exporting the shard: its state is unknown,
    /// so the put was withdrawn from every transport (nothing registered).
    /// Likely: a bug in that plugin.
    #[error("shard {id}: the put was withdrawn because `{transport}` panicked while exporting it: {error}")]
    ExportPanicked {
        /// Shard.
        id: ShardId,
        /// The transport that panicked.
        transport: TransportName,
        /// Its error (kind `panic`).
        error: AbiError,
    },
    /// The storage transport's allocator refused (pool full, ...).
    #[error("shard storage in `{transport}` failed: {error}")]
    Storage {
        /// Storage transport.
        transport: TransportName,
        /// Its error.
        error: AbiError,
    },
    /// A GPU shard could not be exported: no transport with the `cuda`
    /// capability is loaded, or every one refused (no CUDA driver, memory
    /// not exportable by CUDA IPC).
    #[error("no transport can export {device} memory: {why}")]
    NoDeviceTransport {
        /// The shard's device.
        device: String,
        /// Why, per transport.
        why: String,
    },
    /// The shard is not owned by this node.
    #[error("shard {0} is not owned by this node")]
    NotOwned(ShardId),
    /// No loaded transport can reach the shard.
    #[error("shard {id}: no loaded transport can reach it ({})", .skipped.iter().map(|(t, w)| format!("{t}: {w}")).collect::<Vec<_>>().join("; "))]
    NoCandidate {
        /// Shard.
        id: ShardId,
        /// `(transport, why not)` per export.
        skipped: Vec<(TransportName, String)>,
    },
    /// Every candidate transport failed.
    #[error("shard {id}: every transport failed: {}", list(failures))]
    FetchFailed {
        /// Shard.
        id: ShardId,
        /// `(transport, error)` per attempt.
        failures: Vec<(TransportName, AbiError)>,
    },
    /// A faster transport failed and `on-downgrade = "fail"`.
    #[error("shard {id}: downgrade refused (fetch.on-downgrade = \"fail\"): {why}")]
    Downgrade {
        /// Shard.
        id: ShardId,
        /// What was downgraded.
        why: String,
    },
    /// The fetched bytes do not match the handle's checksum.
    #[error("shard {id}: checksum mismatch via `{transport}`: expected {expected:#x}, computed {found:#x}")]
    ChecksumMismatch {
        /// Shard.
        id: ShardId,
        /// Transport that delivered the bytes.
        transport: TransportName,
        /// From the handle.
        expected: u64,
        /// Computed.
        found: u64,
    },
    /// A batch exceeds `fetch.max-batch`.
    #[error("batch of {n} shards exceeds fetch.max-batch = {max}")]
    BatchTooLarge {
        /// Requested.
        n: usize,
        /// Limit.
        max: usize,
    },
}

fn list(failures: &[(TransportName, AbiError)]) -> String {
    failures
        .iter()
        .map(|(t, e)| format!("{t}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl LoadError {
    /// The plugin (instance name) that did not load.
    pub fn plugin(&self) -> &TransportName {
        match self {
            LoadError::NotFound { plugin, .. }
            | LoadError::Read { plugin, .. }
            | LoadError::Checksum { plugin, .. }
            | LoadError::NotAPlugin { plugin, .. }
            | LoadError::Incompatible { plugin, .. }
            | LoadError::Layout { plugin, .. }
            | LoadError::WrongTransport { plugin, .. }
            | LoadError::Constructor { plugin, .. } => plugin,
        }
    }
}

/// Why one plugin did not load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate path exists. Likely: not built (`cargo build --workspace`), or a wrong `path`.
    #[error(
        "plugin `{plugin}`: library `{written}` not found (looked in {})",
        list_paths(tried)
    )]
    NotFound {
        /// Plugin name.
        plugin: TransportName,
        /// The path as written in the config.
        written: String,
        /// Every path tried.
        tried: Vec<PathBuf>,
    },
    /// The file could not be read for its checksum.
    #[error("plugin `{plugin}`: cannot read {}: {source}", path.display())]
    Read {
        /// Plugin name.
        plugin: TransportName,
        /// The file.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The file's sha256 differs from the pinned one. Likely: a rebuilt or replaced library.
    #[error("plugin `{plugin}`: sha256 of {} is {found}, config pins {expected}", path.display())]
    Checksum {
        /// Plugin name.
        plugin: TransportName,
        /// The file.
        path: PathBuf,
        /// Pinned digest.
        expected: String,
        /// Actual digest.
        found: String,
    },
    /// The file is not a loadable shardport plugin (not a shared library, or
    /// one without a shardport root module).
    #[error("plugin `{plugin}`: {} is not a shardport plugin: {reason}", path.display())]
    NotAPlugin {
        /// Plugin name.
        plugin: TransportName,
        /// The file.
        path: PathBuf,
        /// What the dynamic loader or abi_stable said.
        reason: String,
    },
    /// Built against an incompatible `shardport-abi` version.
    #[error("plugin `{plugin}`: {} was built against shardport-abi {found}, this host expects {expected} (incompatible ABI; rebuild the plugin)", path.display())]
    Incompatible {
        /// Plugin name.
        plugin: TransportName,
        /// The file.
        path: PathBuf,
        /// Compatible range this host accepts.
        expected: String,
        /// Version the plugin reports.
        found: String,
    },
    /// The root module's type layout differs from the host's.
    #[error("plugin `{plugin}`: {} has an incompatible interface layout: {summary} (rebuild against shardport-abi {host_abi}; details at debug level)", path.display())]
    Layout {
        /// Plugin name.
        plugin: TransportName,
        /// The file.
        path: PathBuf,
        /// The `Error:` lines of abi_stable's report, joined.
        summary: String,
        /// Host ABI version.
        host_abi: String,
        /// abi_stable's full report.
        detail: String,
    },
    /// The library implements another transport than the config names.
    #[error("plugin `{plugin}`: {} implements transport `{found}`, not `{expected}`{}", path.display(), if expected == plugin { "" } else { " (its `transport` key)" })]
    WrongTransport {
        /// Plugin (instance) name.
        plugin: TransportName,
        /// The transport the config says the library implements.
        expected: TransportName,
        /// The file.
        path: PathBuf,
        /// What the library reports.
        found: String,
    },
    /// The plugin's constructor failed (bad config table, missing resource, panic).
    #[error("plugin `{plugin}`: constructor of {} failed: {error}", path.display())]
    Constructor {
        /// Plugin name.
        plugin: TransportName,
        /// The file that was loaded (several builds may be installed).
        path: PathBuf,
        /// The plugin's error.
        error: AbiError,
    },
}

fn list_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
