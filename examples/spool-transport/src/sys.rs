//! The crate's only `unsafe`: two calls into `shardport_kit`, each
//! with the reason it is sound here.

use std::{fs::File, io};

use shardport_abi::{ExportRequest, PluginResult};
use shardport_kit::{Lent, ReadOnlyMap};

/// The bytes lent to `export`, checked against `meta.byte_len`.
///
/// The borrow is tied to `req`, and `export` uses it only before it returns.
pub(crate) fn export_bytes(req: &ExportRequest) -> PluginResult<Lent<'_>> {
    // SAFETY: called only from `export` with the request the host passed it,
    // for a CPU shard (checked before); the borrow of `req` ends before
    // `export` returns, inside the window in which the host keeps the lent
    // bytes alive and unmodified (until `unexport` of this shard returns).
    unsafe { Lent::from_export(req) }
}

/// Maps a published shard file read-only.
pub(crate) fn map_shard_file(file: &File) -> io::Result<ReadOnlyMap> {
    // SAFETY: a published shard file is written once under a `.tmp` name
    // and renamed into place (so it is complete), then never modified or
    // truncated: the owner only unlinks it, and an unlinked file stays
    // mapped. The directory is `0700` and files are `0600`, so only the
    // same user could break this, by writing into a file it does not own
    // by this protocol.
    unsafe { ReadOnlyMap::map_file(file) }
}
