//! Fuzz target over the spool-dir example transport's descriptor decoder
//! (a file of its own: see the crate docs for why each plugin's targets are
//! apart).

use shardport_abi::ErrorKind;
use shardport_spool_transport::descriptor::{validate_file_name, Descriptor};

/// A fuzz target: its name (binary and corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// The targets of this file.
pub const TARGETS: &[Target] = &[("descriptor_spool", descriptor_spool)];

/// An accepted descriptor re-encodes to the input and names a file that
/// stays inside the spool directory; a refusal is `INVALID_DESCRIPTOR`.
pub fn descriptor_spool(data: &[u8]) {
    match Descriptor::decode(data) {
        Ok(d) => {
            assert!(validate_file_name(&d.file_name).is_ok());
            assert!(!d.file_name.contains(['/', '\\', '\0']) && !d.file_name.contains(".."));
            assert_eq!(
                d.encode(),
                data,
                "re-encoding differs from the accepted input"
            );
        }
        Err(e) => assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{}", e.message),
    }
}
