//! Errors of the host library.

use shardport_abi::{AbiError, ShardId};

use crate::{config::TransportName, loader::LoadError};

/// A host operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// One or more `required = true` plugins did not load.
    #[error("required plugins did not load:\n  {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    RequiredPlugins(Vec<LoadError>),
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
