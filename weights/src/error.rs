//! Errors of publishing and receiving weights.

use shardport_host::HostError;

/// Why a publish or an update did not happen. Every update error leaves
/// the receiver's tensors and version exactly as they were.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// The manifest bytes are not a manifest this version reads: truncated,
    /// framed wrongly, another format, or entries that contradict each
    /// other. Likely a manifest cut short or altered on its way.
    #[error("bad manifest{}: {what}", offset.map(|o| format!(" at byte {o}")).unwrap_or_default())]
    Manifest {
        /// What was wrong.
        what: String,
        /// Byte offset in the manifest, when the framing was wrong.
        offset: Option<usize>,
    },
    /// Tensors of the update do not fit the receiver's tensors (a missing
    /// name, another shape or dtype, a destination too small): a manifest
    /// of another model, or a receiver built with another config.
    #[error("{} tensor(s) do not fit: {}", problems.len(), list(problems))]
    Mismatch {
        /// `(tensor name, what is wrong)`, in manifest order.
        problems: Vec<(String, String)>,
    },
    /// The update is not newer than the version this receiver committed.
    #[error("version {got} is older than the committed version {have}; nothing was changed")]
    Stale {
        /// The manifest's version.
        got: u64,
        /// The receiver's committed version.
        have: u64,
    },
    /// A bucket's bytes do not hash to what the publisher recorded: bytes
    /// changed on the wire or by a relay. Nothing was written.
    #[error("bucket {bucket} ({tensors}) of version {version}: bytes served by {via} do not match the publisher's BLAKE3 hash; nothing was changed")]
    Corrupt {
        /// The manifest's version.
        version: u64,
        /// Bucket index.
        bucket: usize,
        /// Its tensors (the first few).
        tensors: String,
        /// Which transport served them, and why.
        via: String,
    },
    /// A bucket could not be fetched (the owner gone, the version already
    /// retired, every transport failed). Nothing was written.
    #[error("bucket {bucket} ({tensors}) of version {version}: {source}; nothing was changed")]
    Fetch {
        /// The manifest's version.
        version: u64,
        /// Bucket index.
        bucket: usize,
        /// Its tensors (the first few).
        tensors: String,
        /// The host's error.
        #[source]
        source: Box<HostError>,
    },
    /// What a publish was given is not a state dict it can publish (a name
    /// twice, bytes that do not match dtype and shape, a version that does
    /// not move forward).
    #[error("publish of version {version}: {what}")]
    Publish {
        /// The version being published.
        version: u64,
        /// What was wrong.
        what: String,
    },
    /// The node the publisher or receiver works through was shut down.
    #[error("the node was shut down")]
    Closed,
    /// A bucket could not be put (storage full, no transport exported it).
    /// Buckets of the version already put were removed again.
    #[error("publish of version {version}: bucket {bucket} ({tensors}): {source}")]
    Put {
        /// The version being published.
        version: u64,
        /// Bucket index.
        bucket: usize,
        /// Its tensors (the first few).
        tensors: String,
        /// The host's error.
        #[source]
        source: Box<HostError>,
    },
}

fn list(problems: &[(String, String)]) -> String {
    let mut s: Vec<String> = problems
        .iter()
        .take(5)
        .map(|(n, w)| format!("{n:?}: {w}"))
        .collect();
    if problems.len() > 5 {
        s.push(format!("and {} more", problems.len() - 5));
    }
    s.join("; ")
}
