//! The crate's only `unsafe`: reading the bytes the host lends to `export`
//! (`shardport-abi` exposes them through an `unsafe fn`, since their validity,
//! "until `unexport` returns", is not a Rust lifetime).

use shardport_abi::ExportRequest;

/// The bytes lent to `export`.
///
/// The only `unsafe` in this crate: `shardport-abi` offers no safe accessor
/// for [`ExportRequest::data`] yet. The borrow is tied to `req`, and it is
/// used only inside `export`, where the host guarantees the bytes.
pub(crate) fn lent_bytes(req: &ExportRequest) -> &[u8] {
    // SAFETY: called only from `export`, before it returns; the host keeps
    // the lent bytes alive and unmodified until `unexport` of this shard.
    unsafe { req.data.as_slice() }
}
