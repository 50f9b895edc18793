//! The host's shared vocabulary: the names, limits and policy values every
//! other module speaks of. A leaf: it imports nothing of this crate, so any
//! module may use it without creating a cycle.
//!
//! - [`TransportName`]: a validated transport name (configs, handles, plugins).
//! - Wire limits ([`MAX_ADDR`], [`MAX_DESCRIPTOR`], ...): bounds on what a
//!   handle from another process may carry, also applied at put and in config.
//! - Policy values chosen in config: [`FetchMode`], [`OnDowngrade`],
//!   [`Storage`], [`ChecksumPolicy`], [`SameNodeMatch`], [`DeviceSel`],
//!   [`CachePolicy`].
//! - [`ShardBytes`]: the bytes of a fetched shard (a leased view or a copy,
//!   a [`CopyBuf`] that returns to where it came from, [`TakeBack`],
//!   [`CopyHome`]).

use std::{
    fmt,
    ops::{Deref, DerefMut},
    sync::Weak,
    time::Duration,
};

use shardport_abi::LeasedView;

// ---------------------------------------------------------------------------
// Names

/// A transport's name: `[a-z0-9-]`, 1..=64 chars, starting with a letter.
/// Shared, not copied, when cloned (every handle and export carries one).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransportName(std::sync::Arc<str>);

/// Longest transport name accepted anywhere (configs, handles, plugins).
pub const MAX_TRANSPORT_NAME: usize = 64;

impl TransportName {
    /// Validates a name.
    pub fn new(name: &str) -> Result<TransportName, String> {
        let ok_chars = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let starts = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
        if name.is_empty() || name.len() > MAX_TRANSPORT_NAME || !ok_chars || !starts {
            Err(format!(
                "`{name}` is not a transport name (lowercase letters, digits and `-`, \
                 starting with a letter, at most {MAX_TRANSPORT_NAME} characters)"
            ))
        } else {
            Ok(TransportName(name.into()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TransportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

// ---------------------------------------------------------------------------
// Wire limits

/// Most exports in one handle (one per loaded transport in practice).
pub const MAX_EXPORTS: usize = 16;
/// Largest descriptor accepted (shm/http/cuda descriptors are < 300 bytes).
pub const MAX_DESCRIPTOR: usize = 4096;
/// Most dimensions in a shape.
pub const MAX_DIMS: usize = 32;
/// Most tags on a shard.
pub const MAX_TAGS: usize = 32;
/// Longest tag key or value.
pub const MAX_TAG_LEN: usize = 128;
/// Longest owner address.
pub const MAX_ADDR: usize = 255;
/// Largest JSON handle accepted by
/// [`Handle::from_json`](crate::handle::Handle::from_json).
pub const MAX_JSON: usize = 64 * 1024;

// ---------------------------------------------------------------------------
// Policy values

/// How `fetch` returns bytes unless the call says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FetchMode {
    /// A zero-copy view holding a lease on the owner's memory (falls back to a
    /// copy, reported as a downgrade, when no zero-copy transport can serve).
    View,
    /// An owned buffer.
    Copy,
}

impl fmt::Display for FetchMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FetchMode::View => "view",
            FetchMode::Copy => "copy",
        })
    }
}

/// What a downgrade (a faster candidate failed or was unavailable) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDowngrade {
    /// Count it, log at debug.
    Allow,
    /// Count it, log at warn.
    Warn,
    /// Fail the fetch.
    Fail,
}

impl OnDowngrade {
    /// The config's words for each value (`fetch.on-downgrade`), in the
    /// order errors list them: what the config check reads and what reload
    /// reports print.
    pub const KEYWORDS: [(&'static str, OnDowngrade); 3] = [
        ("warn", OnDowngrade::Warn),
        ("allow", OnDowngrade::Allow),
        ("fail", OnDowngrade::Fail),
    ];

    /// The config's word for this value.
    pub fn keyword(self) -> &'static str {
        keyword(&Self::KEYWORDS, self)
    }
}

/// The word of `value` in a keyword table (every value has one).
fn keyword<T: PartialEq>(table: &[(&'static str, T)], value: T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map_or("", |(k, _)| k)
}

/// Where the owner's bytes live after `put`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// A host heap buffer; every transport copies or lends from it.
    Heap,
    /// Written once into this transport's allocator (falls back to heap, loudly,
    /// when the transport is not loaded).
    Pool(TransportName),
}

/// Checksum computed at put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumPolicy {
    /// None.
    None,
    /// CRC-32C.
    Crc32c,
    /// XXH3-64.
    Xxh3,
}

impl ChecksumPolicy {
    /// The config's words for each value (`put.checksum`), as for
    /// [`OnDowngrade::KEYWORDS`].
    pub const KEYWORDS: [(&'static str, ChecksumPolicy); 3] = [
        ("none", ChecksumPolicy::None),
        ("crc32c", ChecksumPolicy::Crc32c),
        ("xxh3", ChecksumPolicy::Xxh3),
    ];

    /// The config's word for this value.
    pub fn keyword(self) -> &'static str {
        keyword(&Self::KEYWORDS, self)
    }
}

/// Which evidence makes an owner "same node" for same-node transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameNodeMatch {
    /// The owner's advertised address is local (`is_local_addr`).
    Address,
    /// The identity parts the transport needs agree.
    Identity,
    /// Both (the default: an address is not proof that `/dev/shm` is shared,
    /// and identity alone cannot tell network namespaces apart).
    Both,
}

/// Which device kind a route matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSel {
    /// Host memory.
    Cpu,
    /// Any CUDA device.
    Cuda,
}

/// What the cache keeps and for how long. `None` fields are off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CachePolicy {
    /// Keep entries at all (any of explicit / lru / ttl).
    pub enabled: bool,
    /// Evict least-recently-used entries beyond this many bytes.
    pub max_bytes: Option<u64>,
    /// Evict entries this long after they were fetched.
    pub ttl: Option<Duration>,
}

// ---------------------------------------------------------------------------
// Shard bytes

/// The bytes of a fetched shard.
pub enum ShardBytes {
    /// Zero-copy view holding a lease on the owner's memory.
    View(LeasedView),
    /// An owned copy (its buffer goes back to the node's shelf of copy
    /// destinations when dropped; [`CopyBuf::into_vec`] keeps it).
    Owned(CopyBuf),
}

/// Where a [`CopyBuf`]'s bytes go when it is dropped: a node's shelf of
/// copy destinations ([`buffers`](crate::buffers)).
pub trait TakeBack: Send + Sync {
    /// Takes back the bytes of a dropped copy (or frees them).
    fn take_back(&self, bytes: Vec<u8>);
}

/// A copy's bytes: owned by its holder, handed back to where they came
/// from ([`TakeBack`]: the node's shelf of copy destinations) when
/// dropped, unless taken out with [`into_vec`](Self::into_vec) or that
/// place is gone.
pub struct CopyBuf {
    bytes: Vec<u8>,
    home: Option<Weak<dyn TakeBack>>,
}

impl CopyBuf {
    /// Bytes that belong nowhere (freed when dropped).
    pub fn detached(bytes: Vec<u8>) -> Self {
        CopyBuf { bytes, home: None }
    }

    /// Bytes handed to `home` when dropped.
    pub fn returning(bytes: Vec<u8>, home: Weak<dyn TakeBack>) -> Self {
        CopyBuf {
            bytes,
            home: Some(home),
        }
    }

    /// The bytes, taken out for good: they are never handed back.
    pub fn into_vec(mut self) -> Vec<u8> {
        self.home = None;
        std::mem::take(&mut self.bytes)
    }

    /// The bytes and where they go back to, for a holder that cannot keep
    /// them as a `CopyBuf` (the Python binding lends them out through raw
    /// pointers, and must not hold a value that derefs to them while
    /// Python writes): it hands them back with [`CopyHome::take_back`]
    /// once nothing reaches them any more.
    pub fn into_parts(mut self) -> (Vec<u8>, CopyHome) {
        let home = CopyHome(self.home.take());
        (std::mem::take(&mut self.bytes), home)
    }
}

/// Where the bytes of a [`CopyBuf`] taken apart with
/// [`CopyBuf::into_parts`] go back to: the node's shelf of copy
/// destinations (held weakly: a shelf that is gone, its node dropped,
/// takes nothing back), or nowhere.
pub struct CopyHome(Option<Weak<dyn TakeBack>>);

impl CopyHome {
    /// Hands `bytes` back (or frees them: no home, or a home that is gone,
    /// full or over its budget). The caller must hold no pointer to them
    /// any more: the shelf gives them out again as another copy's
    /// destination.
    pub fn take_back(self, bytes: Vec<u8>) {
        drop(CopyBuf {
            bytes,
            home: self.0,
        });
    }
}

impl fmt::Debug for CopyHome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let to = match &self.0 {
            None => "nowhere",
            Some(h) if h.strong_count() == 0 => "a shelf that is gone",
            Some(_) => "a shelf",
        };
        write!(f, "CopyHome({to})")
    }
}

impl Deref for CopyBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl DerefMut for CopyBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl fmt::Debug for CopyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CopyBuf({} bytes)", self.bytes.len())
    }
}

impl Drop for CopyBuf {
    fn drop(&mut self) {
        if let Some(home) = self.home.take().and_then(|h| h.upgrade()) {
            home.take_back(std::mem::take(&mut self.bytes));
        }
    }
}

impl Deref for ShardBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ShardBytes::View(v) => v,
            ShardBytes::Owned(v) => v,
        }
    }
}

impl fmt::Debug for ShardBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardBytes::View(v) => write!(f, "View({} bytes, lease {})", v.len(), v.token()),
            ShardBytes::Owned(v) => write!(f, "Owned({} bytes)", v.len()),
        }
    }
}

impl ShardBytes {
    /// True for a zero-copy view.
    pub fn is_view(&self) -> bool {
        matches!(self, ShardBytes::View(_))
    }
}
