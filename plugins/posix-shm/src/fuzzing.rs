//! Entry points for the fuzz targets in `fuzz/` (hidden from the docs; not
//! part of the plugin's interface). Each wraps a crate-private parser so a
//! target can drive it with arbitrary bytes without loading the plugin.

use shardport_abi::PluginResult;

use crate::descriptor::Descriptor;

/// Decodes a descriptor from another process as a consumer whose segment
/// prefix is `prefix` would, and re-encodes what it accepted.
pub fn descriptor_roundtrip(bytes: &[u8], prefix: &str) -> PluginResult<Vec<u8>> {
    Descriptor::decode(bytes, prefix).map(|d| d.encode())
}
