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
//! [`guard_constructor`](crate::plugin::guard_constructor) runs the constructor
//! as the loader does (panics become errors).
//! ```no_run
//! // tests/conformance.rs of the plugin crate `my-transport`
//! # mod my_transport {
//! #     use shardport_abi::{PluginContext, PluginResult, TransportBox};
//! #     pub fn create(_ctx: PluginContext) -> PluginResult<TransportBox> { unimplemented!() }
//! # }
//! use shardport_abi::{conformance::Pair, plugin::guard_constructor, testing};
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
//! shardport_abi::conformance_suite!(pair);
//! # fn main() {}
//! ```
//! Several transports in one test crate: invoke the macro once per module
//! (`mod shm { shardport_abi::conformance_suite!(super::shm_pair); }`).
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

use crate::{
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

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

/// `describe` reports a usable name and version, only known capability and
/// identity bits, at least one of `CPU` / `CUDA`, the same answer on both
/// instances and on repeated calls, and a non-empty `needs_identity` for a
/// `SAME_NODE_ONLY` transport.
pub fn describe_is_sane(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("describe_is_sane", &pair);
    let info = &c.info;
    let name = info.name.as_str();
    if name.is_empty() {
        c.fail("describe() returned an empty name");
    }
    let name_ok = name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.as_bytes()[0].is_ascii_lowercase();
    if !name_ok {
        c.fail(format_args!(
            "name {name:?} is not a transport name: lowercase letters, digits and `-`, \
             starting with a letter, at most 64 characters (configs and handles use it)"
        ));
    }
    if info.version.trim().is_empty() {
        c.fail("describe() returned an empty version");
    }
    let caps = info.capabilities;
    if caps.0 & !KNOWN_CAPABILITIES != 0 {
        c.fail(format_args!(
            "capabilities {:#x} set bits this interface does not define ({:#x})",
            caps.0,
            caps.0 & !KNOWN_CAPABILITIES
        ));
    }
    if !caps.contains(Capabilities::CPU) && !caps.contains(Capabilities::CUDA) {
        c.fail(format_args!(
            "capabilities {caps:?} name neither `cpu` nor `cuda`: the transport moves nothing"
        ));
    }
    if info.needs_identity.0 & !KNOWN_IDENTITY != 0 {
        c.fail(format_args!(
            "needs_identity {:#x} sets bits this interface does not define",
            info.needs_identity.0
        ));
    }
    if caps.contains(Capabilities::SAME_NODE_ONLY) && info.needs_identity.0 == 0 {
        c.fail(
            "a same-node-only transport must say which identity parts must agree \
             (needs_identity is empty, so the router would try it on any local address)",
        );
    }
    for (who, other) in [
        ("the owner, called again,", pair.owner.describe()),
        ("the consumer", pair.consumer.describe()),
    ] {
        if !same_info(info, &other) {
            c.fail(format_args!(
                "{who} describes itself differently: {other:?} vs {info:?}"
            ));
        }
    }
}

/// Shards of 0, 1, 63, 4096 and 1 MiB + 3 bytes of a seeded pattern survive
/// `export` on the owner and `import_into` on the consumer, twice each.
pub fn copy_roundtrip(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("copy_roundtrip", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xC0_97);
    for len in SIZES {
        let shard = export_heap(&c, &pair.owner, &mut rng, len);
        if shard.desc.is_empty() {
            c.fail(format_args!(
                "export of a {len}-byte shard returned an empty descriptor"
            ));
        }
        for attempt in ["first", "second"] {
            let got = c.import_copy(&pair.consumer, &shard, attempt);
            c.same_bytes(&got, &shard.expected, format_args!("{attempt} import_into"));
        }
        shard.unexport(&c);
    }
}

/// With `ZERO_COPY`, `import_view` of every size yields the exported bytes,
/// two views of one shard coexist, and the leases release cleanly; without
/// it, `import_view` of a valid descriptor is `UNSUPPORTED`.
pub fn zero_copy_view(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("zero_copy_view", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x2E_20);
    if !c.has(Capabilities::ZERO_COPY) {
        let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
        let r = pair
            .consumer
            .import_view(RSlice::from_slice(&shard.desc), &shard.meta);
        c.err(
            r,
            &[ErrorKind::UNSUPPORTED],
            "import_view on a transport without `zero-copy`",
        );
        shard.unexport(&c);
        return;
    }
    for len in SIZES {
        let shard = export_heap(&c, &pair.owner, &mut rng, len);
        let first = c.view(&pair.consumer, &shard, "first import_view");
        let second = c.view(&pair.consumer, &shard, "second import_view");
        c.same_bytes(&first, &shard.expected, "first view");
        c.same_bytes(
            &second,
            &shard.expected,
            "second view, taken while the first is held",
        );
        if len > 0 && first.token() == second.token() {
            c.fail(format_args!(
                "two live views of one shard share lease token {}",
                first.token()
            ));
        }
        drop(first);
        c.same_bytes(
            &second,
            &shard.expected,
            "second view after the first was released",
        );
        drop(second);
        let copy = c.import_copy(&pair.consumer, &shard, "after both views were released");
        c.same_bytes(&copy, &shard.expected, "import_into after views");
        shard.unexport(&c);
    }
}

/// With `ALLOCATOR`: shards written into allocations and exported in place
/// (`allocation: guard.mark_exported()`) round-trip for every size, two live
/// allocations do not overlap, freeing an allocation twice fails, and 1 GiB
/// cycled through allocate-and-drop never exhausts the pool. Without it,
/// `allocate` is `UNSUPPORTED`.
pub fn allocator(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("allocator", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xA1_10C);
    if !c.has(Capabilities::ALLOCATOR) {
        let r = pair.owner.allocate(fresh_id(&mut rng), 4096);
        if let RResult::ROk(a) = &r {
            // Be tidy even though the case fails.
            let _ = pair.owner.free_allocation(a.token);
        }
        c.err(
            r,
            &[ErrorKind::UNSUPPORTED],
            "allocate on a transport without `allocator`",
        );
        return;
    }
    for len in SIZES {
        let shard = export_pool(&c, &pair.owner, &mut rng, len);
        let got = c.import_copy(&pair.consumer, &shard, "of a shard exported in place");
        c.same_bytes(&got, &shard.expected, "import_into of an allocation export");
        if c.has(Capabilities::ZERO_COPY) {
            let view = c.view(
                &pair.consumer,
                &shard,
                "import_view of an allocation export",
            );
            c.same_bytes(&view, &shard.expected, "view of an allocation export");
        }
        shard.unexport(&c);
    }

    // Two live allocations are disjoint: each keeps its own pattern.
    let len = 64 << 10;
    let mut a = c.allocate(&pair.owner, fresh_id(&mut rng), len);
    let mut b = c.allocate(&pair.owner, fresh_id(&mut rng), len);
    if a.token() == b.token() {
        c.fail(format_args!(
            "two live allocations share token {}",
            a.token()
        ));
    }
    let (pa, pb) = (rng.bytes(len as usize), rng.bytes(len as usize));
    a.as_mut_slice().copy_from_slice(&pa);
    b.as_mut_slice().copy_from_slice(&pb);
    c.same_bytes(
        a.as_slice(),
        &pa,
        "first of two live allocations (they overlap)",
    );
    c.same_bytes(
        b.as_slice(),
        &pb,
        "second of two live allocations (they overlap)",
    );

    // A dropped, never-exported allocation is freed: its token is gone...
    let token = a.token();
    drop(a);
    c.err(
        pair.owner.free_allocation(token),
        ANY_ERROR,
        format_args!("free_allocation of token {token}, already freed when its guard dropped"),
    );
    drop(b);
    // ...and its space comes back: cycling far more than a pool holds works.
    let mut cycled = 0;
    while cycled < ALLOC_CYCLE_BYTES {
        let id = fresh_id(&mut rng);
        match AllocationGuard::allocate(&pair.owner, id, ALLOC_CYCLE_STEP) {
            Ok(guard) => drop(guard),
            Err(e) => c.fail(format_args!(
                "allocate failed after {} of allocate-and-drop in {} steps \
                 (dropped allocations are not returned?): {e}",
                crate::config::format_byte_size(cycled),
                crate::config::format_byte_size(ALLOC_CYCLE_STEP)
            )),
        }
        cycled += ALLOC_CYCLE_STEP;
    }
}

/// After `unexport`, importing the old descriptor fails with `NOT_FOUND` or
/// `UNAVAILABLE`; a second `unexport`, or one of an id never exported, is
/// `NOT_FOUND`.
pub fn unexport_semantics(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("unexport_semantics", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x0E_C5);
    for len in [1, 4096] {
        let shard = export_heap(&c, &pair.owner, &mut rng, len);
        let (id, desc, meta) = (shard.id, shard.desc.clone(), shard.meta.clone());
        shard.unexport(&c);
        let mut dst = vec![0u8; len];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(&desc),
                &meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            GONE_KINDS,
            format_args!("import_into of shard {id} after its unexport"),
        );
        if c.has(Capabilities::ZERO_COPY) {
            c.err(
                LeasedView::import(&pair.consumer, &desc, &meta),
                GONE_KINDS,
                format_args!("import_view of shard {id} after its unexport"),
            );
        }
        c.err(
            pair.owner.unexport(id),
            &[ErrorKind::NOT_FOUND],
            format_args!("second unexport of shard {id}"),
        );
    }
    let never = fresh_id(&mut rng);
    c.err(
        pair.owner.unexport(never),
        &[ErrorKind::NOT_FOUND],
        format_args!("unexport of shard {never}, never exported"),
    );
}

/// Empty, seeded random, valid-prefix-plus-random and every truncation of a
/// valid descriptor fail with `INVALID_DESCRIPTOR`, `NOT_FOUND` or
/// `UNAVAILABLE` (a panic caught by the guard is `PANIC`, and fails).
pub fn garbage_descriptors(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("garbage_descriptors", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x6A_4BA6E);
    let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
    let desc = shard.desc.clone();
    let mut garbage: Vec<(String, Vec<u8>)> = vec![("an empty descriptor".into(), Vec::new())];
    for len in [
        1, 2, 3, 4, 7, 8, 15, 16, 17, 24, 31, 32, 33, 64, 100, 255, 256, 1024, 4096,
    ] {
        for round in 0..4 {
            garbage.push((
                format!("{len} random bytes (round {round})"),
                rng.bytes(len),
            ));
        }
    }
    for keep in 1..desc.len() {
        garbage.push((
            format!(
                "the valid descriptor truncated to {keep} of {} bytes",
                desc.len()
            ),
            desc[..keep].to_vec(),
        ));
        let mut tail = desc[..keep].to_vec();
        tail.extend(rng.bytes(desc.len() - keep));
        if tail != desc {
            garbage.push((
                format!("the first {keep} bytes of the valid descriptor, then random bytes"),
                tail,
            ));
        }
    }
    for (what, bytes) in &garbage {
        let mut dst = vec![0u8; 4096];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(bytes),
                &shard.meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            BAD_DESCRIPTOR_KINDS,
            format_args!("import_into of {what} ({})", hex_preview(bytes)),
        );
        if c.has(Capabilities::ZERO_COPY) {
            c.err(
                LeasedView::import(&pair.consumer, bytes, &shard.meta),
                BAD_DESCRIPTOR_KINDS,
                format_args!("import_view of {what} ({})", hex_preview(bytes)),
            );
        }
    }
    // The valid descriptor still works after all that.
    let got = c.import_copy(&pair.consumer, &shard, "after the garbage");
    c.same_bytes(
        &got,
        &shard.expected,
        "import_into after garbage descriptors",
    );
    shard.unexport(&c);
}

/// Every single-bit flip of a valid descriptor either fails (any kind but
/// `PANIC`) or imports exactly the exported bytes: never different bytes.
pub fn descriptor_bit_flips(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("descriptor_bit_flips", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xB1_7F11);
    let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
    // Descriptors are small; bound the work for one that is not.
    let bits = (shard.desc.len() * 8).min(4096);
    for bit in 0..bits {
        let mut flipped = shard.desc.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let what = format!("import_into of the descriptor with bit {bit} flipped");
        let mut dst = vec![0xA5u8; 4096];
        match pair.consumer.import_into(
            RSlice::from_slice(&flipped),
            &shard.meta,
            RSliceMut::from_mut_slice(&mut dst),
        ) {
            RResult::ROk(_) => c.same_bytes(&dst, &shard.expected, &what),
            r @ RResult::RErr(_) => {
                c.err(r, ANY_ERROR, &what);
            }
        }
        if c.has(Capabilities::ZERO_COPY) {
            let what = format!("import_view of the descriptor with bit {bit} flipped");
            match LeasedView::import(&pair.consumer, &flipped, &shard.meta) {
                Ok(view) => c.same_bytes(&view, &shard.expected, &what),
                Err(e) => {
                    c.err::<()>(RResult::RErr(e), ANY_ERROR, &what);
                }
            }
        }
    }
    shard.unexport(&c);
}

/// `import_into` with a destination shorter or longer than `meta.byte_len`
/// is `INVALID_ARGUMENT`; a `meta.byte_len` that disagrees with what was
/// exported (destination sized to match it) fails, for copies and views.
pub fn wrong_destination_length(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("wrong_destination_length", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x1E_4674);
    let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
    for len in [0, 1, 4095, 4097, 8192] {
        let mut dst = vec![0u8; len];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(&shard.desc),
                &shard.meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            &[ErrorKind::INVALID_ARGUMENT],
            format_args!(
                "import_into a {len}-byte destination for a shard of {} bytes",
                shard.meta.byte_len
            ),
        );
    }
    for claimed in [0u64, 4095, 4097] {
        let mut meta = shard.meta.clone();
        meta.byte_len = claimed;
        meta.dtype = DType::U8;
        meta.shape = vec![claimed].into();
        let mut dst = vec![0u8; claimed as usize];
        c.err(
            pair.consumer.import_into(
                RSlice::from_slice(&shard.desc),
                &meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            ANY_ERROR,
            format_args!("import_into with meta.byte_len {claimed} for a 4096-byte shard"),
        );
        if c.has(Capabilities::ZERO_COPY) {
            let r = pair
                .consumer
                .import_view(RSlice::from_slice(&shard.desc), &meta);
            if let RResult::ROk(region) = &r {
                let _ = pair.consumer.release(region.token);
            }
            c.err(
                r,
                ANY_ERROR,
                format_args!("import_view with meta.byte_len {claimed} for a 4096-byte shard"),
            );
        }
    }
    let got = c.import_copy(&pair.consumer, &shard, "after the wrong lengths");
    c.same_bytes(&got, &shard.expected, "import_into after wrong lengths");
    shard.unexport(&c);
}

/// `release` of a token never handed out (0 and random ones) fails; with
/// `ZERO_COPY`, releasing a real lease twice fails the second time. Without
/// `ALLOCATOR`, `free_allocation` of any token fails too.
pub fn release_errors(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("release_errors", &pair);
    let mut rng = Rng::new(0x4E_1EA5E);
    let mut unknown_release = vec![ErrorKind::INVALID_ARGUMENT, ErrorKind::NOT_FOUND];
    if !c.has(Capabilities::ZERO_COPY) {
        unknown_release.push(ErrorKind::UNSUPPORTED);
    }
    let mut tokens = vec![0, u64::MAX];
    tokens.extend((0..8).map(|_| rng.next_u64()));
    for token in &tokens {
        c.err(
            pair.consumer.release(*token),
            &unknown_release,
            format_args!("release of token {token}, never handed out"),
        );
    }
    let mut unknown_free = vec![ErrorKind::INVALID_ARGUMENT, ErrorKind::NOT_FOUND];
    if !c.has(Capabilities::ALLOCATOR) {
        unknown_free.push(ErrorKind::UNSUPPORTED);
    }
    for token in &tokens {
        c.err(
            pair.owner.free_allocation(*token),
            &unknown_free,
            format_args!("free_allocation of token {token}, never handed out"),
        );
    }
    if c.has(Capabilities::ZERO_COPY) && c.moves_cpu() {
        let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
        let region = c.ok(
            pair.consumer
                .import_view(RSlice::from_slice(&shard.desc), &shard.meta),
            "import_view of a valid descriptor",
        );
        let token = region.token;
        c.ok(pair.consumer.release(token), "first release of a lease");
        c.err(
            pair.consumer.release(token),
            &[ErrorKind::INVALID_ARGUMENT, ErrorKind::NOT_FOUND],
            format_args!("second release of lease token {token}"),
        );
        shard.unexport(&c);
    }
}

/// With `ZERO_COPY`: a view taken before its shard is unexported keeps its
/// bytes while several other shards of the same size are exported (through
/// the allocator when there is one, so a pool would reuse the space) and
/// unexported; the view is then dropped. Without it, `import_view` is
/// `UNSUPPORTED`.
pub fn view_survives_unexport(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("view_survives_unexport", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0x5A_17E);
    if !c.has(Capabilities::ZERO_COPY) {
        let shard = export_heap(&c, &pair.owner, &mut rng, 64);
        c.err(
            pair.consumer
                .import_view(RSlice::from_slice(&shard.desc), &shard.meta),
            &[ErrorKind::UNSUPPORTED],
            "import_view on a transport without `zero-copy`",
        );
        shard.unexport(&c);
        return;
    }
    let pooled = c.has(Capabilities::ALLOCATOR);
    let export = |rng: &mut Rng, len| {
        if pooled {
            export_pool(&c, &pair.owner, rng, len)
        } else {
            export_heap(&c, &pair.owner, rng, len)
        }
    };
    for len in [4096, (1 << 20) + 3] {
        let shard = export(&mut rng, len);
        let view = c.view(&pair.consumer, &shard, "import_view before unexport");
        let expected = shard.expected.clone();
        shard.unexport(&c);
        c.same_bytes(
            &view,
            &expected,
            "a view right after its shard was unexported",
        );
        // Churn: export, import and unexport others, then keep a few live.
        for _ in 0..OVERWRITE_SHARDS {
            let other = export(&mut rng, len);
            let got = c.import_copy(&pair.consumer, &other, "of a shard exported over a view");
            c.same_bytes(
                &got,
                &other.expected,
                "a shard exported while a view is held",
            );
            other.unexport(&c);
        }
        let live: Vec<Exported> = (0..OVERWRITE_SHARDS)
            .map(|_| export(&mut rng, len))
            .collect();
        c.same_bytes(
            &view,
            &expected,
            format_args!(
                "a view of an unexported shard after {} other {len}-byte shards were exported \
                 (its memory was reused while leased)",
                2 * OVERWRITE_SHARDS
            ),
        );
        drop(view);
        for other in live {
            let got = c.import_copy(&pair.consumer, &other, "after the old view was released");
            c.same_bytes(
                &got,
                &other.expected,
                "a live shard after the old view was released",
            );
            other.unexport(&c);
        }
    }
}

/// `stats` names are snake_case and unique with a known kind on both
/// instances, counters never decrease across an export and import, and
/// `health` is ok.
pub fn stats_and_health(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("stats_and_health", &pair);
    let before = [
        c.stats(&pair.owner, "owner"),
        c.stats(&pair.consumer, "consumer"),
    ];
    if c.moves_cpu() {
        let mut rng = Rng::new(0x57_A75);
        let shard = export_heap(&c, &pair.owner, &mut rng, 4096);
        let got = c.import_copy(&pair.consumer, &shard, "between two stats calls");
        c.same_bytes(&got, &shard.expected, "import_into between stats calls");
        shard.unexport(&c);
    }
    let after = [
        c.stats(&pair.owner, "owner"),
        c.stats(&pair.consumer, "consumer"),
    ];
    for ((who, before), after) in ["owner", "consumer"].iter().zip(&before).zip(&after) {
        for (name, kind, old) in before {
            let new = after.iter().find(|(n, _, _)| n == name);
            if let Some((_, k, new)) = new {
                if *kind == StatKind::COUNTER && *k == StatKind::COUNTER && new < old {
                    c.fail(format_args!(
                        "{who} counter `{name}` went down from {old} to {new}"
                    ));
                }
            }
        }
    }
    for (who, t) in [("owner", &pair.owner), ("consumer", &pair.consumer)] {
        let h = t.health();
        if !h.ok {
            c.fail(format_args!(
                "{who} health is not ok: {:?}",
                h.message.as_str()
            ));
        }
    }
}

/// 4 threads export 3 shards each at once; then 4 threads import every
/// shard 8 times in different orders (alternating copies and, with
/// `ZERO_COPY`, views) and check every byte.
pub fn concurrent_imports(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("concurrent_imports", &pair);
    if !c.moves_cpu() {
        return;
    }
    const PER_THREAD: usize = 3;
    const ROUNDS: usize = 8;
    let lens = [1usize, 4096, (256 << 10) + 5];
    let shards: Vec<Exported> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, owner) = (&c, &pair.owner);
                s.spawn(move || {
                    let mut rng = Rng::new(0xC0_2C + t as u64);
                    (0..PER_THREAD)
                        .map(|i| export_heap(c, owner, &mut rng, lens[i % lens.len()]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| resume_unwind(p)))
            .collect()
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, consumer, shards) = (&c, &pair.consumer, &shards);
                s.spawn(move || {
                    for round in 0..ROUNDS {
                        for k in 0..shards.len() {
                            let shard = &shards[(k + t * 5 + round) % shards.len()];
                            let what = format!("thread {t} round {round} shard {}", shard.id);
                            if c.has(Capabilities::ZERO_COPY) && (k + round) % 2 == 1 {
                                let view = c.view(consumer, shard, &what);
                                c.same_bytes(&view, &shard.expected, &what);
                            } else {
                                let got = c.import_copy(consumer, shard, &what);
                                c.same_bytes(&got, &shard.expected, &what);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap_or_else(|p| resume_unwind(p));
        }
    });
    for shard in shards {
        shard.unexport(&c);
    }
}

/// `import_many` of one batch: [`BATCH_SHARDS`] - 1 good shards of three
/// sizes, with a garbage descriptor first, a destination one byte short in
/// the middle and a shard unexported just before the call last. One result
/// per item, in order; every good item has exactly its bytes and every bad
/// one fails with its own kind, without failing the others.
pub fn batch_import(make: &dyn Fn() -> Pair) {
    let pair = make();
    let c = Check::start("batch_import", &pair);
    if !c.moves_cpu() {
        return;
    }
    let mut rng = Rng::new(0xBA_7C4);
    let lens = [4096usize, 1, 63 << 10];
    let mut shards: Vec<Exported> = (0..BATCH_SHARDS)
        .map(|i| export_heap(&c, &pair.owner, &mut rng, lens[i % lens.len()]))
        .collect();
    let gone = shards.pop().expect("BATCH_SHARDS > 0");
    let (gone_desc, gone_meta) = (gone.desc.clone(), gone.meta.clone());
    let mut gone_dst = vec![0u8; gone.expected.len()];
    gone.unexport(&c);
    let garbage = rng.bytes(40);
    let garbage_meta = meta_for(16);
    let mut garbage_dst = vec![0u8; 16];
    let mut short_dst = vec![0u8; shards[0].expected.len() - 1];
    let mut dsts: Vec<Vec<u8>> = shards
        .iter()
        .map(|s| vec![0x5A; s.expected.len()])
        .collect();
    let half = shards.len() / 2;
    fn item<'a>(desc: &'a [u8], meta: &'a ShardMeta, dst: &'a mut [u8]) -> ImportItem<'a> {
        ImportItem {
            desc: RSlice::from_slice(desc),
            meta,
            dst: RSliceMut::from_mut_slice(dst),
        }
    }
    let mut items = vec![item(&garbage, &garbage_meta, &mut garbage_dst)];
    let mut good = dsts.iter_mut().zip(&shards);
    for (dst, s) in good.by_ref().take(half) {
        items.push(item(&s.desc, &s.meta, dst));
    }
    items.push(item(&shards[0].desc, &shards[0].meta, &mut short_dst));
    for (dst, s) in good {
        items.push(item(&s.desc, &s.meta, dst));
    }
    items.push(item(&gone_desc, &gone_meta, &mut gone_dst));
    let n = items.len();
    let results: Vec<Result<ImportInfo, AbiError>> = pair
        .consumer
        .import_many(RSliceMut::from_mut_slice(&mut items))
        .into_iter()
        .map(RResult::into_result)
        .collect();
    drop(items);
    if results.len() != n {
        c.fail(format_args!(
            "import_many returned {} results for {n} items",
            results.len()
        ));
    }
    c.err(
        results[0].clone(),
        BAD_DESCRIPTOR_KINDS,
        "import_many item 0 (a garbage descriptor)",
    );
    c.err(
        results[half + 1].clone(),
        &[ErrorKind::INVALID_ARGUMENT],
        format_args!(
            "import_many item {} (a destination one byte short)",
            half + 1
        ),
    );
    c.err(
        results[n - 1].clone(),
        GONE_KINDS,
        format_args!("import_many item {} (an unexported shard)", n - 1),
    );
    for (k, (s, dst)) in shards.iter().zip(&dsts).enumerate() {
        let pos = if k < half { 1 + k } else { 2 + k };
        let what = format!(
            "import_many item {pos} (shard {}, {} bytes)",
            s.id,
            dst.len()
        );
        c.ok(results[pos].clone(), &what);
        c.same_bytes(dst, &s.expected, &what);
    }
    for s in shards {
        s.unexport(&c);
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The case being run and the transport it runs against, for messages.
struct Check {
    case: &'static str,
    info: TransportInfo,
}

impl Check {
    fn start(case: &'static str, pair: &Pair) -> Check {
        Check {
            case,
            info: pair.owner.describe(),
        }
    }

    fn has(&self, cap: Capabilities) -> bool {
        self.info.capabilities.contains(cap)
    }

    /// True when the transport moves CPU shards; otherwise prints why the
    /// data part of the case is skipped.
    fn moves_cpu(&self) -> bool {
        let cpu = self.has(Capabilities::CPU);
        if !cpu {
            eprintln!(
                "conformance case `{}` for transport `{}`: data checks skipped, \
                 the transport does not move cpu shards",
                self.case, self.info.name
            );
        }
        cpu
    }

    #[track_caller]
    fn fail(&self, msg: impl Display) -> ! {
        panic!(
            "conformance case `{}` failed for transport `{}`: {msg}",
            self.case, self.info.name
        )
    }

    #[track_caller]
    fn ok<T>(&self, r: impl Into<Result<T, AbiError>>, what: impl Display) -> T {
        match r.into() {
            Ok(v) => v,
            Err(e) => self.fail(format_args!("{what} failed: {e}")),
        }
    }

    /// Expects an error of one of `kinds` (any kind but `PANIC` when empty).
    #[track_caller]
    fn err<T>(
        &self,
        r: impl Into<Result<T, AbiError>>,
        kinds: &[ErrorKind],
        what: impl Display,
    ) -> AbiError {
        match r.into() {
            Ok(_) => self.fail(format_args!(
                "{what} succeeded; expected {}",
                expected(kinds)
            )),
            Err(e) if e.kind == ErrorKind::PANIC => {
                self.fail(format_args!("{what} panicked inside the plugin: {e}"))
            }
            Err(e) if kinds.is_empty() || kinds.contains(&e.kind) => e,
            Err(e) => self.fail(format_args!(
                "{what} failed with the wrong kind: expected {}, got {e}",
                expected(kinds)
            )),
        }
    }

    #[track_caller]
    fn same_bytes(&self, got: &[u8], want: &[u8], what: impl Display) {
        if got.len() != want.len() {
            self.fail(format_args!(
                "{what}: got {} bytes, expected {}",
                got.len(),
                want.len()
            ));
        }
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            self.fail(format_args!(
                "{what}: wrong bytes of a {}-byte shard, first difference at byte {i} \
                 (expected {:#04x}, got {:#04x})",
                want.len(),
                want[i],
                got[i]
            ));
        }
    }

    #[track_caller]
    fn import_copy(
        &self,
        consumer: &SharedTransport,
        shard: &Exported,
        what: impl Display,
    ) -> Vec<u8> {
        let mut dst = vec![0x5Au8; shard.expected.len()];
        self.ok(
            consumer.import_into(
                RSlice::from_slice(&shard.desc),
                &shard.meta,
                RSliceMut::from_mut_slice(&mut dst),
            ),
            format_args!(
                "import_into of a {}-byte shard ({what})",
                shard.expected.len()
            ),
        );
        dst
    }

    #[track_caller]
    fn view(&self, consumer: &SharedTransport, shard: &Exported, what: impl Display) -> LeasedView {
        self.ok(
            LeasedView::import(consumer, &shard.desc, &shard.meta),
            format_args!(
                "import_view of a {}-byte shard ({what})",
                shard.expected.len()
            ),
        )
    }

    #[track_caller]
    fn allocate(&self, owner: &SharedTransport, id: ShardId, len: u64) -> AllocationGuard {
        self.ok(
            AllocationGuard::allocate(owner, id, len),
            format_args!("allocate({id}, {len})"),
        )
    }

    /// Stats as `(name, kind, value)`, checked for names and kinds.
    #[track_caller]
    fn stats(&self, t: &SharedTransport, who: &str) -> Vec<(String, StatKind, u64)> {
        let stats = t.stats();
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(stats.len());
        for s in stats.iter() {
            let name = s.name.as_str();
            if !is_snake_case(name) {
                self.fail(format_args!(
                    "{who} stat name {name:?} is not snake_case ([a-z][a-z0-9_]*, no `__`, no trailing `_`)"
                ));
            }
            if !seen.insert(name.to_owned()) {
                self.fail(format_args!("{who} reports stat `{name}` twice"));
            }
            if s.kind != StatKind::COUNTER && s.kind != StatKind::GAUGE {
                self.fail(format_args!(
                    "{who} stat `{name}` has unknown kind {}",
                    s.kind.0
                ));
            }
            out.push((name.to_owned(), s.kind, s.value));
        }
        out
    }
}

/// A shard the case exported. Dropping it unexports the shard first (when
/// the case did not), then frees the lent bytes: the lent memory outlives
/// the export even when the case panics half-way.
struct Exported {
    owner: SharedTransport,
    id: ShardId,
    meta: ShardMeta,
    desc: Vec<u8>,
    /// What an import must return.
    expected: Vec<u8>,
    /// The lent bytes, read by the transport until `unexport` returns: only
    /// kept alive here, never read.
    _backing: Backing,
    live: bool,
}

/// Owner of lent bytes.
enum Backing {
    Heap { _bytes: Vec<u8> },
    Pool { _guard: AllocationGuard },
}

impl Exported {
    #[track_caller]
    fn unexport(mut self, c: &Check) {
        self.live = false;
        c.ok(
            self.owner.unexport(self.id),
            format_args!("unexport of shard {}", self.id),
        );
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        if self.live {
            let _ = self.owner.unexport(self.id);
        }
        // `_backing` drops after this body, once the shard is withdrawn.
    }
}

/// Exports `len` seeded bytes from a heap buffer.
#[track_caller]
fn export_heap(c: &Check, owner: &SharedTransport, rng: &mut Rng, len: usize) -> Exported {
    let id = fresh_id(rng);
    let expected = rng.bytes(len);
    let data = expected.clone();
    let meta = meta_for(len);
    let lent = SharedBytes::lend(&data);
    let mut shard = Exported {
        owner: Arc::clone(owner),
        id,
        meta: meta.clone(),
        desc: Vec::new(),
        expected,
        // Moving the Vec keeps its heap buffer, which `lent` points at.
        _backing: Backing::Heap { _bytes: data },
        live: false,
    };
    let desc = c.ok(
        owner.export(ExportRequest {
            id,
            meta,
            data: lent,
            allocation: 0,
        }),
        format_args!("export of a {len}-byte shard {id}"),
    );
    shard.live = true;
    shard.desc = desc.into_vec();
    shard
}

/// Writes `len` seeded bytes into an allocation and exports it in place.
#[track_caller]
fn export_pool(c: &Check, owner: &SharedTransport, rng: &mut Rng, len: usize) -> Exported {
    let id = fresh_id(rng);
    let expected = rng.bytes(len);
    let mut guard = c.allocate(owner, id, len as u64);
    guard.as_mut_slice().copy_from_slice(&expected);
    let allocation = guard.mark_exported();
    let lent = SharedBytes::lend(guard.as_slice());
    let meta = meta_for(len);
    let mut shard = Exported {
        owner: Arc::clone(owner),
        id,
        meta: meta.clone(),
        desc: Vec::new(),
        expected,
        _backing: Backing::Pool { _guard: guard },
        live: false,
    };
    let desc = c.ok(
        owner.export(ExportRequest {
            id,
            meta,
            data: lent,
            allocation,
        }),
        format_args!(
            "export in place of a {len}-byte allocation (token {allocation}) as shard {id}"
        ),
    );
    shard.live = true;
    shard.desc = desc.into_vec();
    shard
}

/// Metadata for `len` bytes: bf16 for even lengths (two-dimensional when it
/// divides), raw bytes otherwise, so transports see more than `u8`.
fn meta_for(len: usize) -> ShardMeta {
    let len64 = len as u64;
    if len > 0 && len % 128 == 0 {
        ShardMeta {
            dtype: DType::BF16,
            shape: vec![len64 / 128, 64].into(),
            device: Device::CPU,
            byte_len: len64,
            checksum: abi_stable::std_types::ROption::RNone,
        }
    } else if len > 0 && len % 2 == 0 {
        ShardMeta {
            dtype: DType::BF16,
            shape: vec![len64 / 2].into(),
            device: Device::CPU,
            byte_len: len64,
            checksum: abi_stable::std_types::ROption::RNone,
        }
    } else {
        ShardMeta::bytes(len64)
    }
}

/// An id unique within the process: random high half, counter low half.
fn fresh_id(rng: &mut Rng) -> ShardId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ShardId {
        hi: rng.next_u64(),
        lo: NEXT.fetch_add(1, Ordering::Relaxed),
    }
}

fn same_info(a: &TransportInfo, b: &TransportInfo) -> bool {
    a.name == b.name
        && a.version == b.version
        && a.capabilities == b.capabilities
        && a.needs_identity == b.needs_identity
}

fn is_snake_case(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
        && !name.contains("__")
        && !name.ends_with('_')
}

fn expected(kinds: &[ErrorKind]) -> String {
    if kinds.is_empty() {
        return "an error".to_owned();
    }
    let names: Vec<String> = kinds.iter().map(ToString::to_string).collect();
    format!("an error of kind {}", names.join(" or "))
}

/// The first bytes of `b` in hex, for messages.
fn hex_preview(b: &[u8]) -> String {
    const SHOWN: usize = 24;
    let mut s: String = b.iter().take(SHOWN).map(|x| format!("{x:02x}")).collect();
    if b.len() > SHOWN {
        s.push_str(&format!("... {} bytes", b.len()));
    }
    if s.is_empty() {
        s.push_str("empty");
    }
    s
}

/// SplitMix64: a tiny seeded generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        for chunk in v.chunks_mut(8) {
            let x = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
        v
    }
}

/// Self-tests: the suite passes a correct in-memory reference transport
/// (with and without zero-copy and allocator) and fails deliberately broken
/// variants of it, each with a message naming the case and the transport.
#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        panic::{catch_unwind, AssertUnwindSafe},
        sync::Mutex,
    };

    use abi_stable::std_types::RVec;

    use super::*;
    use crate::{
        error::PluginResult,
        plugin::{panic_message, PluginContext},
        testing,
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
}
