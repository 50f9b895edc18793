//! The argument checks every transport makes, with the same words
//! everywhere (`INVALID_ARGUMENT` for what the host passed,
//! `INVALID_DESCRIPTOR` for what another process sent).

use shardport_abi::{
    error::{AbiError, PluginResult},
    meta::ShardMeta,
    transport::ExportRequest,
};

/// `import_into`: the destination holds exactly `meta.byte_len` bytes.
pub fn destination(dst_len: usize, meta: &ShardMeta) -> PluginResult<()> {
    device_destination(dst_len as u64, meta)
}

/// `import_into_device`: the device destination (`dst_len` bytes at a
/// device address) holds exactly `meta.byte_len` bytes; the same words as
/// [`destination`].
pub fn device_destination(dst_len: u64, meta: &ShardMeta) -> PluginResult<()> {
    if dst_len == meta.byte_len {
        return Ok(());
    }
    Err(AbiError::invalid_argument(format!(
        "destination is {dst_len} bytes, the shard is {}",
        meta.byte_len
    )))
}

/// `export`: the lent bytes are `meta.byte_len` long, and a non-empty range
/// has an address.
pub fn lent(req: &ExportRequest) -> PluginResult<()> {
    let (id, len) = (req.id, req.data.len());
    if req.meta.byte_len != len as u64 {
        return Err(AbiError::invalid_argument(format!(
            "export of shard {id}: meta.byte_len is {} but {len} bytes were lent",
            req.meta.byte_len
        )));
    }
    if req.data.as_ptr().is_null() && len > 0 {
        return Err(AbiError::invalid_argument(format!(
            "export of shard {id}: null data pointer for {len} bytes"
        )));
    }
    Ok(())
}

/// A descriptor's length field (`field` of `what`, e.g. `"http descriptor"`)
/// agrees with the shard's metadata.
pub fn declared_len(what: &str, field: &str, declared: u64, meta: &ShardMeta) -> PluginResult<()> {
    if declared == meta.byte_len {
        return Ok(());
    }
    Err(AbiError::invalid_descriptor(format!(
        "{what} field `{field}`: {declared} bytes, but meta.byte_len is {}",
        meta.byte_len
    )))
}

/// Compares `given` with `expected` (a secret such as a bearer token) in time
/// that depends only on the length of `expected`, so response timing does
/// not reveal how much of a guessed token was right.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff: usize = given.len() ^ expected.len();
    for (i, &e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= usize::from(g ^ e);
        diff = std::hint::black_box(diff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::{error::ErrorKind, meta::ShardId, transport::SharedBytes};

    #[test]
    fn checks_name_what_disagrees() {
        let meta = ShardMeta::bytes(4);
        destination(4, &meta).unwrap();
        let e = destination(3, &meta).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);
        assert_eq!(e.message.as_str(), "destination is 3 bytes, the shard is 4");
        device_destination(4, &meta).unwrap();
        let e = device_destination(5, &meta).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);
        assert_eq!(e.message.as_str(), "destination is 5 bytes, the shard is 4");
        declared_len("x descriptor", "len", 4, &meta).unwrap();
        let e = declared_len("x descriptor", "len", 5, &meta).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
        assert_eq!(
            e.message.as_str(),
            "x descriptor field `len`: 5 bytes, but meta.byte_len is 4"
        );
        let bytes = [0u8; 3];
        let req = ExportRequest {
            id: ShardId::from_u128(9),
            meta,
            data: SharedBytes::lend(&bytes),
            allocation: 0,
        };
        assert_eq!(
            lent(&req).unwrap_err().message.as_str(),
            format!(
                "export of shard {}: meta.byte_len is 4 but 3 bytes were lent",
                req.id
            )
        );
        let req = ExportRequest {
            meta: ShardMeta::bytes(8),
            data: SharedBytes::device(0, 8),
            ..req
        };
        assert!(lent(&req)
            .unwrap_err()
            .message
            .contains("null data pointer"));
    }
}
