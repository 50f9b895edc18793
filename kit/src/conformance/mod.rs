//! A transport conformance suite, written once and run by every transport
//! against itself (feature `conformance`).
//!
//! Like rustls compiling the same API tests once per crypto provider, each
//! transport crate instantiates the same cases with its own factory. A case
//! fails (panics) with a message that names the case and the transport, so a
//! broken transport fails its own test run before any host loads it.
//!
//! # Using it from a transport crate
//! Add the feature in the plugin crate's dev-dependencies:
//! ```toml
//! [dev-dependencies]
//! shardport-abi = { version = "0.3", features = ["conformance"] }
//! ```
//! then write a factory returning a [`Pair`]: two **separate** instances of
//! the transport (an owner and a consumer), configured so that the consumer
//! can reach what the owner exports, as two processes on one node would be.
//! [`testing::context`](crate::testing::context) builds the host context
//! each constructor needs, with a unique node tag.
//! [`guard_constructor`](shardport_abi::plugin::guard_constructor) runs the constructor
//! as the loader does (panics become errors).
//! ```no_run
//! // tests/conformance.rs of the plugin crate `my-transport`
//! # mod my_transport {
//! #     use shardport_abi::{PluginContext, PluginResult, TransportBox};
//! #     pub fn create(_ctx: PluginContext) -> PluginResult<TransportBox> { unimplemented!() }
//! # }
//! use shardport_abi::plugin::guard_constructor;
//! use shardport_kit::{conformance::Pair, testing};
//!
//! fn pair() -> Pair {
//!     // Both instances must reach each other: here, the same spool directory.
//!     let config = "dir = \"/tmp/my-transport-tests\"";
//!     let make = || {
//!         guard_constructor(testing::context("mine", config), my_transport::create)
//!             .into_result()
//!             .expect("my-transport constructor failed")
//!     };
//!     Pair::new(make(), make())
//! }
//!
//! // One `#[test]` per case: `describe_is_sane`, `copy_roundtrip`, ...
//! shardport_kit::conformance_suite!(pair);
//! # fn main() {}
//! ```
//! Several transports in one test crate: invoke the macro once per module
//! (`mod shm { shardport_kit::conformance_suite!(super::shm_pair); }`).
//! A transport that cannot run on this machine (no GPU) is skipped with a
//! printed reason: `conformance_suite!(pair, skip_if: no_gpu)`, where
//! `no_gpu: fn() -> Option<String>` returns the reason to skip.
//!
//! The host runs the same cases against loaded plugin libraries, by building
//! the pair from two instances of the loaded module; [`CASES`] lists every
//! case by name for callers that drive them in a loop.
//!
//! # What is checked
//! The cases assert behaviour, never timing. Data cases move CPU shards
//! (host memory); a transport without [`Capabilities::CPU`] is skipped by
//! them with a printed reason.
//! - [`describe_is_sane`]: name, version, known capability bits, both
//!   instances agree, same-node transports name the identity parts they need.
//! - [`copy_roundtrip`]: `export` / `import_into` for 0, 1, 63, 4096 and
//!   1 MiB + 3 bytes of a seeded pattern.
//! - [`zero_copy_view`]: with `ZERO_COPY`, views hold the right bytes; without
//!   it, `import_view` is `UNSUPPORTED`.
//! - [`allocator`]: with `ALLOCATOR`, shards written into allocations and
//!   exported in place round-trip, live allocations do not overlap, dropped
//!   unexported allocations are freed; without it, `allocate` is `UNSUPPORTED`.
//! - [`unexport_semantics`]: importing an unexported shard fails
//!   (`NOT_FOUND` / `UNAVAILABLE`), unexporting twice is `NOT_FOUND`.
//! - [`garbage_descriptors`]: empty, random and truncated descriptors fail
//!   with `INVALID_DESCRIPTOR` / `NOT_FOUND` / `UNAVAILABLE`, never a panic.
//! - [`descriptor_bit_flips`]: every single-bit flip of a valid descriptor
//!   either fails or yields exactly the right bytes.
//! - [`wrong_destination_length`]: `INVALID_ARGUMENT`; a meta that disagrees
//!   with the descriptor fails.
//! - [`release_errors`]: releasing an unknown token, or a token twice, fails.
//! - [`view_survives_unexport`]: a leased view keeps its bytes while its
//!   shard is unexported and other shards are exported over it.
//! - [`stats_and_health`]: snake_case unique stat names, counters never
//!   decrease, health ok.
//! - [`concurrent_imports`]: 4 threads export, then 4 threads import
//!   (and view, with `ZERO_COPY`) the same shards, all correct.
//! - [`batch_import`]: one `import_many` of good shards mixed with a
//!   garbage descriptor, a short destination and an unexported shard: one
//!   result per item in order, good items exact, bad ones failing alone.
//!
//! # Memory contracts the suite itself keeps
//! Bytes lent to `export` stay alive and unmodified until `unexport` returns,
//! even when a case fails half-way (a drop guard unexports first). Leases are
//! held by [`LeasedView`], allocations by [`AllocationGuard`].
//!
//! # Resources
//! A case uses a few MiB of memory; [`allocator`] cycles 1 GiB through
//! allocate-and-drop in 1 MiB steps (without touching the bytes) to show that
//! dropped allocations are returned. No case sleeps or measures time.

use std::{
    collections::HashSet,
    fmt::Display,
    panic::resume_unwind,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use abi_stable::std_types::{RResult, RSlice, RSliceMut};

use shardport_abi::{
    error::{AbiError, ErrorKind},
    meta::{DType, Device, ShardId, ShardMeta},
    transport::{
        Capabilities, ExportRequest, IdentityParts, ImportInfo, ImportItem, SharedBytes,
        SharedTransport, StatKind, TransportBox, TransportInfo,
    },
    view::{AllocationGuard, LeasedView},
};

/// Two separate instances of the same transport: `owner` exports, `consumer`
/// imports. They must reach each other as two processes on one node would
/// (same shared-memory namespace, same spool directory, a reachable server).
pub struct Pair {
    /// The instance that exports shards.
    pub owner: SharedTransport,
    /// The instance that imports them.
    pub consumer: SharedTransport,
}

impl Pair {
    /// Wraps two transport instances.
    pub fn new(owner: TransportBox, consumer: TransportBox) -> Pair {
        Pair {
            owner: Arc::new(owner),
            consumer: Arc::new(consumer),
        }
    }
}

/// A conformance case: runs against a fresh [`Pair`] from the factory and
/// panics with a message naming the case and the transport when it fails.
pub type Case = fn(&dyn Fn() -> Pair);

/// Every case, by name, in the order [`conformance_suite!`](crate::conformance_suite) emits them.
pub const CASES: &[(&str, Case)] = &[
    ("describe_is_sane", describe_is_sane),
    ("copy_roundtrip", copy_roundtrip),
    ("zero_copy_view", zero_copy_view),
    ("allocator", allocator),
    ("unexport_semantics", unexport_semantics),
    ("garbage_descriptors", garbage_descriptors),
    ("descriptor_bit_flips", descriptor_bit_flips),
    ("wrong_destination_length", wrong_destination_length),
    ("release_errors", release_errors),
    ("view_survives_unexport", view_survives_unexport),
    ("stats_and_health", stats_and_health),
    ("concurrent_imports", concurrent_imports),
    ("batch_import", batch_import),
];

/// Runs every case in [`CASES`] in order; the first failure panics.
pub fn run_all(make: &dyn Fn() -> Pair) {
    for (_, case) in CASES {
        case(make);
    }
}

/// Expands to one `#[test]` per conformance case, each calling
/// `$crate::conformance::<case>(&$make)`. `$make` is a factory
/// `Fn() -> Pair` (a function path or a closure). An optional
/// `skip_if: $f` (`Fn() -> Option<String>`) skips every case with the
/// printed reason when it returns `Some` (a transport that needs a GPU on a
/// machine without one). See the [module docs](crate::conformance).
#[macro_export]
macro_rules! conformance_suite {
    (@emit $make:expr, $skip:expr, $($case:ident)*) => {
        $(
            #[test]
            fn $case() {
                if let ::core::option::Option::Some(reason) = ($skip)() {
                    ::std::eprintln!(
                        "conformance case `{}` skipped: {}",
                        ::core::stringify!($case),
                        reason
                    );
                    return;
                }
                $crate::conformance::$case(&$make);
            }
        )*
    };
    ($make:expr, skip_if: $skip:expr $(,)?) => {
        $crate::conformance_suite!(@emit $make, $skip,
            describe_is_sane
            copy_roundtrip
            zero_copy_view
            allocator
            unexport_semantics
            garbage_descriptors
            descriptor_bit_flips
            wrong_destination_length
            release_errors
            view_survives_unexport
            stats_and_health
            concurrent_imports
            batch_import
        );
    };
    ($make:expr $(,)?) => {
        $crate::conformance_suite!(
            $make,
            skip_if: || ::core::option::Option::<::std::string::String>::None
        );
    };
}

/// Sizes every data case round-trips: empty, one byte, odd, a page, and a
/// size past 1 MiB that is not a multiple of anything a pool might round to.
const SIZES: [usize; 5] = [0, 1, 63, 4096, (1 << 20) + 3];

/// Total bytes cycled through allocate-and-drop to show allocations are freed.
const ALLOC_CYCLE_BYTES: u64 = 1 << 30;

/// Step of that cycle.
const ALLOC_CYCLE_STEP: u64 = 1 << 20;

/// Shards exported over a live view in [`view_survives_unexport`].
const OVERWRITE_SHARDS: usize = 8;

/// Threads in [`concurrent_imports`].
const THREADS: usize = 4;

/// Shards exported for [`batch_import`]: more than a transport that takes
/// its batches in slices (posix-shm: 64) puts in one.
const BATCH_SHARDS: usize = 70;

/// Capability bits this version of the interface defines.
const KNOWN_CAPABILITIES: u64 = Capabilities::CPU.0
    | Capabilities::CUDA.0
    | Capabilities::SAME_NODE_ONLY.0
    | Capabilities::ZERO_COPY.0
    | Capabilities::ALLOCATOR.0;

/// Identity bits this version of the interface defines.
const KNOWN_IDENTITY: u32 = IdentityParts::BOOT_ID.0
    | IdentityParts::SHM_DEVICE.0
    | IdentityParts::IPC_NS.0
    | IdentityParts::PID_NS.0
    | IdentityParts::GPU_UUID.0;

/// Error kinds a consumer may report for a descriptor it cannot use.
const BAD_DESCRIPTOR_KINDS: &[ErrorKind] = &[
    ErrorKind::INVALID_DESCRIPTOR,
    ErrorKind::NOT_FOUND,
    ErrorKind::UNAVAILABLE,
];

/// Error kinds for a shard that is no longer exported.
const GONE_KINDS: &[ErrorKind] = &[ErrorKind::NOT_FOUND, ErrorKind::UNAVAILABLE];

/// Any error but a panic (an empty list in [`Check::err`]).
const ANY_ERROR: &[ErrorKind] = &[];

mod cases;
mod support;
/// Self-tests: the suite passes a correct in-memory reference transport
/// (with and without zero-copy and allocator) and fails deliberately broken
/// variants of it, each with a message naming the case and the transport.
#[cfg(test)]
mod tests;

pub use self::cases::*;
#[allow(clippy::wildcard_imports)]
use self::support::*;
