use std::{
    collections::HashMap,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Mutex,
};

use abi_stable::std_types::RVec;

use super::*;
use crate::testing;
use shardport_abi::{
    error::PluginResult,
    plugin::{panic_message, PluginContext},
    transport::{Allocation, Health, ImportInfo, Region, Stat, Transport},
    TD_Opaque,
};

/// A deliberate defect of the reference transport.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Bug {
    None,
    /// `import_into` corrupts the last byte.
    WrongBytes,
    /// `unexport` forgets to withdraw the shard from the node.
    KeepAfterUnexport,
    /// Parsing a short descriptor panics (caught by the guard).
    PanicOnShortDescriptor,
    /// `import_into` copies whatever fits into any destination.
    IgnoreDestinationLength,
    /// `stats` reports one name twice.
    DuplicateStat,
    /// Leases do not pin storage: unexported memory is recycled.
    ReuseLeasedMemory,
    /// `free_allocation` reports success and frees nothing.
    LeakAllocations,
    /// Claims zero-copy but `import_view` is unsupported.
    NoViews,
    /// Sets a capability bit the interface does not define.
    UnknownCapability,
    /// Reports a name that is not a config key.
    BadName,
}

/// What two instances on one "node" share, as `/dev/shm` would be.
#[derive(Default)]
struct Node {
    shards: Mutex<HashMap<u128, Arc<Vec<u8>>>>,
    recycled: Mutex<Vec<Vec<u8>>>,
    next_key: AtomicU64,
}

const MAGIC: &[u8; 4] = b"MEM1";
const DESC_LEN: usize = 4 + 16 + 8;
const POOL_CAPACITY: usize = 64 << 20;

struct Mem {
    ctx: PluginContext,
    caps: Capabilities,
    bug: Bug,
    node: Arc<Node>,
    exported: Mutex<HashMap<ShardId, u128>>,
    allocs: Mutex<HashMap<u64, Vec<u8>>>,
    leases: Mutex<HashMap<u64, Option<Arc<Vec<u8>>>>>,
    next_token: AtomicU64,
    imports: AtomicU64,
}

impl Mem {
    fn buffer(&self, len: usize) -> Vec<u8> {
        if self.bug == Bug::ReuseLeasedMemory {
            let mut recycled = self.node.recycled.lock().unwrap();
            if let Some(i) = recycled.iter().position(|v| v.len() == len) {
                return recycled.swap_remove(i);
            }
        }
        vec![0; len]
    }

    fn lookup(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Arc<Vec<u8>>> {
        if self.bug == Bug::PanicOnShortDescriptor && desc.len() < DESC_LEN {
            panic!("descriptor of {} bytes", desc.len());
        }
        if desc.len() != DESC_LEN || &desc[..4] != MAGIC {
            return Err(AbiError::invalid_descriptor("not a mem-ref descriptor"));
        }
        let key = u128::from_le_bytes(desc[4..20].try_into().unwrap());
        let len = u64::from_le_bytes(desc[20..28].try_into().unwrap());
        if len != meta.byte_len {
            return Err(AbiError::invalid_descriptor(format!(
                "descriptor says {len} bytes, meta says {}",
                meta.byte_len
            )));
        }
        let stored = self.node.shards.lock().unwrap().get(&key).cloned();
        let stored = stored.ok_or_else(|| AbiError::not_found(format!("key {key:x}")))?;
        if stored.len() as u64 != len {
            return Err(AbiError::invalid_descriptor(
                "length disagrees with the shard",
            ));
        }
        Ok(stored)
    }
}

impl Transport for Mem {
    fn describe(&self) -> TransportInfo {
        let mut caps = self.caps;
        if self.bug == Bug::UnknownCapability {
            caps = caps.with(Capabilities(1 << 40));
        }
        TransportInfo {
            name: if self.bug == Bug::BadName {
                "Mem Ref".into()
            } else {
                "mem-ref".into()
            },
            version: "1.0.0".into(),
            capabilities: caps,
            needs_identity: if caps.contains(Capabilities::SAME_NODE_ONLY) {
                IdentityParts::BOOT_ID
            } else {
                IdentityParts::default()
            },
        }
    }

    fn export(&self, req: ExportRequest) -> RResult<RVec<u8>, AbiError> {
        self.ctx.guard("export", || {
            if req.meta.byte_len != req.data.len() as u64 {
                return Err(AbiError::invalid_argument("meta.byte_len != data length"));
            }
            let mut exported = self.exported.lock().unwrap();
            if exported.contains_key(&req.id) {
                return Err(AbiError::invalid_argument("already exported"));
            }
            let bytes = if req.allocation != 0 {
                let a = self.allocs.lock().unwrap().remove(&req.allocation);
                let a = a.ok_or_else(|| AbiError::invalid_argument("unknown allocation"))?;
                if a.as_ptr() != req.data.as_ptr() || a.len() != req.data.len() {
                    return Err(AbiError::invalid_argument("data is not the allocation"));
                }
                a
            } else {
                let mut v = self.buffer(req.data.len());
                // SAFETY: inside `export`, the host keeps the lent bytes
                // alive and unmodified.
                v.copy_from_slice(unsafe { req.data.as_slice() });
                v
            };
            let key = (u128::from(self.node.next_key.fetch_add(1, Ordering::Relaxed)) << 64)
                | u128::from(req.id.lo);
            self.node
                .shards
                .lock()
                .unwrap()
                .insert(key, Arc::new(bytes));
            exported.insert(req.id, key);
            let mut desc = MAGIC.to_vec();
            desc.extend_from_slice(&key.to_le_bytes());
            desc.extend_from_slice(&req.meta.byte_len.to_le_bytes());
            Ok(desc.into())
        })
    }

    fn unexport(&self, id: ShardId) -> RResult<(), AbiError> {
        self.ctx.guard("unexport", || {
            let key = self.exported.lock().unwrap().remove(&id);
            let key = key.ok_or_else(|| AbiError::not_found(format!("shard {id}")))?;
            if self.bug != Bug::KeepAfterUnexport {
                let stored = self.node.shards.lock().unwrap().remove(&key);
                if let (Bug::ReuseLeasedMemory, Some(stored)) = (self.bug, stored) {
                    if let Ok(v) = Arc::try_unwrap(stored) {
                        self.node.recycled.lock().unwrap().push(v);
                    }
                }
            }
            Ok(())
        })
    }

    fn import_into(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        mut dst: RSliceMut<'_, u8>,
    ) -> RResult<ImportInfo, AbiError> {
        self.ctx.guard("import_into", || {
            if self.bug != Bug::IgnoreDestinationLength && dst.len() as u64 != meta.byte_len {
                return Err(AbiError::invalid_argument("destination length"));
            }
            let stored = self.lookup(&desc, meta)?;
            let n = dst.len().min(stored.len());
            dst[..n].copy_from_slice(&stored[..n]);
            if self.bug == Bug::WrongBytes {
                if let Some(last) = dst.last_mut() {
                    *last ^= 1;
                }
            }
            self.imports.fetch_add(1, Ordering::Relaxed);
            Ok(ImportInfo::default())
        })
    }

    fn import_view(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<Region, AbiError> {
        self.ctx.guard("import_view", || {
            if !self.caps.contains(Capabilities::ZERO_COPY) || self.bug == Bug::NoViews {
                return Err(AbiError::unsupported("no zero-copy"));
            }
            let stored = self.lookup(&desc, meta)?;
            let token = self.next_token.fetch_add(1, Ordering::Relaxed);
            let region = Region {
                ptr: stored.as_ptr(),
                len: stored.len(),
                token,
            };
            let pin = (self.bug != Bug::ReuseLeasedMemory).then_some(stored);
            self.leases.lock().unwrap().insert(token, pin);
            self.imports.fetch_add(1, Ordering::Relaxed);
            Ok(region)
        })
    }

    fn release(&self, token: u64) -> RResult<(), AbiError> {
        self.ctx.guard("release", || {
            match self.leases.lock().unwrap().remove(&token) {
                Some(_) => Ok(()),
                None => Err(AbiError::invalid_argument(format!("unknown lease {token}"))),
            }
        })
    }

    fn allocate(&self, _id: ShardId, len: u64) -> RResult<Allocation, AbiError> {
        self.ctx.guard("allocate", || {
            if !self.caps.contains(Capabilities::ALLOCATOR) {
                return Err(AbiError::unsupported("no allocator"));
            }
            let mut allocs = self.allocs.lock().unwrap();
            let used: usize = allocs.values().map(Vec::len).sum();
            if used + len as usize > POOL_CAPACITY {
                return Err(AbiError::new(ErrorKind::RESOURCE_EXHAUSTED, "pool full"));
            }
            let mut v = self.buffer(len as usize);
            let token = self.next_token.fetch_add(1, Ordering::Relaxed);
            let a = Allocation {
                ptr: v.as_mut_ptr(),
                len: v.len(),
                token,
            };
            allocs.insert(token, v);
            Ok(a)
        })
    }

    fn free_allocation(&self, token: u64) -> RResult<(), AbiError> {
        self.ctx.guard("free_allocation", || {
            if self.bug == Bug::LeakAllocations {
                return Ok(());
            }
            match self.allocs.lock().unwrap().remove(&token) {
                Some(_) => Ok(()),
                None => Err(AbiError::invalid_argument(format!(
                    "unknown allocation {token}"
                ))),
            }
        })
    }

    fn stats(&self) -> RVec<Stat> {
        let mut s = vec![
            Stat::counter("imports_total", self.imports.load(Ordering::Relaxed)),
            Stat::gauge(
                "shards_exported",
                self.exported.lock().unwrap().len() as u64,
            ),
        ];
        if self.bug == Bug::DuplicateStat {
            s.push(Stat::gauge("shards_exported", 0));
        }
        s.into()
    }

    fn health(&self) -> Health {
        Health {
            ok: true,
            message: "ok".into(),
        }
    }
}

const FULL: Capabilities = Capabilities::CPU
    .with(Capabilities::SAME_NODE_ONLY)
    .with(Capabilities::ZERO_COPY)
    .with(Capabilities::ALLOCATOR);

fn pair_with(caps: Capabilities, bug: Bug) -> Pair {
    let node = Arc::new(Node::default());
    let make = |role: &str| {
        TransportBox::from_value(
            Mem {
                ctx: PluginContext::new(testing::context(role, "")),
                caps,
                bug,
                node: Arc::clone(&node),
                exported: Mutex::default(),
                allocs: Mutex::default(),
                leases: Mutex::default(),
                next_token: AtomicU64::new(1),
                imports: AtomicU64::new(0),
            },
            TD_Opaque,
        )
    };
    Pair::new(make("owner"), make("consumer"))
}

fn full_pair() -> Pair {
    pair_with(FULL, Bug::None)
}

fn copy_only_pair() -> Pair {
    pair_with(Capabilities::CPU, Bug::None)
}

/// Every case against a transport with zero-copy and an allocator.
mod full {
    crate::conformance_suite!(super::full_pair);
}

/// Every case against a copy-only transport.
mod copy_only {
    crate::conformance_suite!(super::copy_only_pair);
}

/// The skip arm: a case never reaches a factory that would panic.
mod skipped {
    crate::conformance_suite!(
        || -> super::Pair { panic!("the factory of a skipped suite ran") },
        skip_if: || Some("no such device on this machine".to_owned()),
    );
}

/// Runs `case` against a transport with `bug` and returns the failure message.
fn failure(case: Case, caps: Capabilities, bug: Bug) -> String {
    let r = catch_unwind(AssertUnwindSafe(|| case(&|| pair_with(caps, bug))));
    match r {
        Ok(()) => panic!("the case passed against a transport with {bug:?}"),
        Err(payload) => panic_message(&*payload),
    }
}

#[track_caller]
fn assert_fails(case: Case, name: &str, caps: Capabilities, bug: Bug, needle: &str) {
    let msg = failure(case, caps, bug);
    assert!(
        msg.starts_with(&format!(
            "conformance case `{name}` failed for transport `mem-ref`: "
        )),
        "{msg}"
    );
    assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
}

#[test]
fn wrong_bytes_fail_roundtrips() {
    let needle = "wrong bytes of a 1-byte shard, first difference at byte 0";
    assert_fails(
        copy_roundtrip,
        "copy_roundtrip",
        FULL,
        Bug::WrongBytes,
        needle,
    );
    assert_fails(
        concurrent_imports,
        "concurrent_imports",
        Capabilities::CPU,
        Bug::WrongBytes,
        "first difference",
    );
    assert_fails(
        batch_import,
        "batch_import",
        Capabilities::CPU,
        Bug::WrongBytes,
        "first difference",
    );
}

#[test]
fn keeping_unexported_shards_fails() {
    assert_fails(
        unexport_semantics,
        "unexport_semantics",
        FULL,
        Bug::KeepAfterUnexport,
        "after its unexport succeeded; expected an error of kind not_found or unavailable",
    );
}

#[test]
fn panicking_on_garbage_fails() {
    assert_fails(
        garbage_descriptors,
        "garbage_descriptors",
        FULL,
        Bug::PanicOnShortDescriptor,
        "import_into of an empty descriptor (empty) panicked inside the plugin",
    );
}

#[test]
fn ignoring_destination_length_fails() {
    assert_fails(
        wrong_destination_length,
        "wrong_destination_length",
        FULL,
        Bug::IgnoreDestinationLength,
        "import_into a 0-byte destination for a shard of 4096 bytes succeeded; \
         expected an error of kind invalid_argument",
    );
}

#[test]
fn duplicate_stats_fail() {
    assert_fails(
        stats_and_health,
        "stats_and_health",
        FULL,
        Bug::DuplicateStat,
        "owner reports stat `shards_exported` twice",
    );
}

#[test]
fn recycling_leased_memory_fails() {
    assert_fails(
        view_survives_unexport,
        "view_survives_unexport",
        FULL,
        Bug::ReuseLeasedMemory,
        "its memory was reused while leased",
    );
}

#[test]
fn leaking_allocations_fails() {
    assert_fails(
        allocator,
        "allocator",
        FULL,
        Bug::LeakAllocations,
        "already freed when its guard dropped succeeded",
    );
}

#[test]
fn claiming_zero_copy_without_views_fails() {
    assert_fails(
        zero_copy_view,
        "zero_copy_view",
        FULL,
        Bug::NoViews,
        "no zero-copy (unsupported)",
    );
}

#[test]
fn unknown_capability_bits_fail() {
    assert_fails(
        describe_is_sane,
        "describe_is_sane",
        FULL,
        Bug::UnknownCapability,
        "set bits this interface does not define",
    );
}

#[test]
fn names_that_are_not_config_keys_fail() {
    let msg = failure(describe_is_sane, FULL, Bug::BadName);
    assert!(
        msg.starts_with(
            "conformance case `describe_is_sane` failed for transport `Mem Ref`: \
             name \"Mem Ref\" is not a transport name"
        ),
        "{msg}"
    );
}

#[test]
fn case_names_are_unique() {
    let names: HashSet<&str> = CASES.iter().map(|(n, _)| *n).collect();
    assert_eq!(names.len(), CASES.len());
    assert_eq!(CASES.len(), 13);
}

#[test]
fn run_all_passes_a_correct_transport() {
    run_all(&copy_only_pair);
}

#[test]
fn snake_case_names() {
    assert!(is_snake_case("bytes_read_total"));
    assert!(is_snake_case("p2p"));
    for bad in ["", "Bytes", "bytes-read", "_x", "x_", "a__b", "1x", "a b"] {
        assert!(!is_snake_case(bad), "{bad:?}");
    }
}
