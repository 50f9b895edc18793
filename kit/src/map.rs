//! Zero-copy views of mapped memory, without `unsafe` in the plugin.
//!
//! [`ReadOnlyMap`] owns a read-only mapping of a file or shared-memory
//! object. Its constructor is the one `unsafe` call a plugin makes (in its
//! `sys` module): there it states why nobody changes the mapped bytes. A
//! [`LeaseTable`] then hands out [`Region`]s over it: each lease keeps its
//! mapping alive until `release`, as the `Transport::import_view` contract
//! asks.
//!
//! ```no_run
//! use std::{fs::File, sync::Arc};
//! use shardport_kit::map::{LeaseTable, ReadOnlyMap};
//!
//! let leases: LeaseTable<Arc<ReadOnlyMap>> = LeaseTable::new("example");
//! let file = File::open("/var/spool/shardport/a.shard")?;
//! // SAFETY: shard files are written once, renamed into place and never
//! // modified or truncated afterwards, only unlinked.
//! let map = Arc::new(unsafe { ReadOnlyMap::map_file(&file) }?);
//! let region = leases.grant(map, 0, 4096)?;   // what `import_view` returns
//! leases.release(region.token)?;              // what `release` does
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{collections::HashMap, sync::Mutex};

use shardport_abi::{
    error::{AbiError, PluginResult},
    transport::Region,
};

pub use super::sys::ReadOnlyMap;

/// Something a lease can view: a [`ReadOnlyMap`] behind a pointer that
/// keeps it alive (`Arc<ReadOnlyMap>`), or a plugin type holding one.
pub trait Viewable {
    /// The mapping the region points into.
    fn map(&self) -> &ReadOnlyMap;
}

impl Viewable for std::sync::Arc<ReadOnlyMap> {
    fn map(&self) -> &ReadOnlyMap {
        self
    }
}

/// Zero-copy leases by token: each holds what keeps its bytes mapped (and,
/// for a plugin type, whatever else must live as long: a lease slot...).
#[derive(Debug)]
pub struct LeaseTable<T> {
    transport: &'static str,
    inner: Mutex<Leases<T>>,
}

#[derive(Debug)]
struct Leases<T> {
    next: u64,
    held: HashMap<u64, T>,
}

impl<T: Viewable> LeaseTable<T> {
    /// An empty table; `transport` names the transport in errors.
    pub fn new(transport: &'static str) -> Self {
        LeaseTable {
            transport,
            inner: Mutex::new(Leases {
                next: 1,
                held: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leases<T>> {
        // Every update is one insert or remove: a poisoned table is consistent.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A region of `len` bytes at `offset` of `holder`'s mapping, under a
    /// new lease that keeps `holder` until [`release`](Self::release).
    /// `INVALID_DESCRIPTOR` when the range is not inside the mapping.
    pub fn grant(&self, holder: T, offset: u64, len: u64) -> PluginResult<Region> {
        let mut l = self.lock();
        let token = l.next;
        let region = holder.map().region(offset, len, token).ok_or_else(|| {
            AbiError::invalid_descriptor(format!(
                "{} descriptor: bytes {offset}..+{len} run past the end of the mapping ({} bytes)",
                self.transport,
                holder.map().len()
            ))
        })?;
        l.next += 1;
        l.held.insert(token, holder);
        Ok(region)
    }

    /// Ends lease `token`, dropping what it held. Unknown tokens are
    /// `INVALID_ARGUMENT`, as the `Transport::release` contract says.
    pub fn release(&self, token: u64) -> PluginResult<T> {
        self.lock().held.remove(&token).ok_or_else(|| {
            AbiError::invalid_argument(format!(
                "release of token {token}: no such {} lease (released twice?)",
                self.transport
            ))
        })
    }

    /// Leases held now.
    pub fn active(&self) -> usize {
        self.lock().held.len()
    }

    /// Ends every lease (the transport is going away).
    pub fn clear(&self) {
        let held = std::mem::take(&mut self.lock().held);
        drop(held);
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write, sync::Arc};

    use super::*;
    use shardport_abi::error::ErrorKind;

    fn file(bytes: &[u8]) -> (std::fs::File, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "shardport-kit-map-{}-{}",
            std::process::id(),
            crate::testing::unique_node_tag()
        ));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        (std::fs::File::open(&path).unwrap(), path)
    }

    #[test]
    fn maps_reads_and_leases() {
        let (f, path) = file(b"hello, mapped world");
        // SAFETY: the test's own file, not modified while mapped.
        let map = Arc::new(unsafe { ReadOnlyMap::map_file(&f) }.unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            map.as_slice(),
            b"hello, mapped world",
            "unlinked stays mapped"
        );
        assert_eq!(map.get(7, 6), Some(&b"mapped"[..]));
        assert_eq!(map.get(7, 100), None);
        assert_eq!(map.get(u64::MAX, 2), None, "overflow");
        let mut dst = [0u8; 5];
        assert!(map.copy_out(0, &mut dst));
        assert_eq!(&dst, b"hello");
        assert!(!map.copy_out(15, &mut dst));
        assert_eq!(&*map.lent(0, 5).unwrap(), b"hello");

        let leases = LeaseTable::new("test");
        let r = leases.grant(Arc::clone(&map), 7, 6).unwrap();
        assert_eq!(r.len, 6);
        assert_eq!(leases.active(), 1);
        assert_eq!(Arc::strong_count(&map), 2, "the lease keeps the map");
        let e = leases.grant(Arc::clone(&map), 10, 100).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR);
        leases.release(r.token).unwrap();
        let e = leases.release(r.token).unwrap_err();
        assert_eq!(e.kind, ErrorKind::INVALID_ARGUMENT);
        assert!(e.message.contains("released twice"), "{e}");
        assert_eq!(Arc::strong_count(&map), 1);
        leases.grant(Arc::clone(&map), 0, 0).unwrap();
        leases.clear();
        assert_eq!(leases.active(), 0);
    }

    #[test]
    fn large_copies_out_are_split_and_exact() {
        use crate::copy::{threads_for, PARALLEL_MIN, PIECE_MIN};
        let len = PARALLEL_MIN + 3 * PIECE_MIN + 13;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let (f, path) = file(&bytes);
        // SAFETY: the test's own file, not modified while mapped.
        let map = unsafe { ReadOnlyMap::map_file(&f) }.unwrap();
        std::fs::remove_file(&path).unwrap();
        // From an odd offset, so no piece starts aligned.
        let mut dst = vec![0u8; len - 7];
        assert!(threads_for(dst.len()) >= 1);
        assert!(map.copy_out(7, &mut dst));
        assert!(dst == bytes[7..], "a split copy out differs");
        assert!(!map.copy_out(8, &mut dst), "one byte past the end");
    }

    #[test]
    fn empty_files_map_to_nothing() {
        let (f, path) = file(b"");
        // SAFETY: the test's own file, not modified while mapped.
        let map = unsafe { ReadOnlyMap::map_file(&f) }.unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(map.is_empty());
        assert_eq!(map.as_slice(), b"");
        assert!(map.region(0, 0, 1).is_some());
        assert!(map.region(0, 1, 1).is_none());
    }

    #[test]
    fn lent_bytes_read_safely() {
        use crate::Lent;
        let v = vec![7u8; 10];
        let l = Lent::new(&v);
        assert_eq!(l.len(), 10);
        assert_eq!(l.shared().len(), 10);
        let empty = Lent::new(&[]);
        assert!(empty.as_slice().is_empty());
    }
}
