//! # shardport-kit: what every transport repeats, written once
//!
//! Everything here is ordinary Rust on the plugin's side of the boundary: it
//! adds nothing to the ABI (no field of the root module, no method, no
//! `StableAbi` type), so a plugin built with or without it loads the same,
//! and an old plugin still loads in a new host. It is a crate of its own,
//! apart from `shardport-abi` (the types and the trait that cross the
//! boundary), with a version of its own: changing a helper here bumps this
//! crate, never the ABI, so it never refuses a plugin built against another
//! kit. Besides the helpers: [`testing`] (a host context for a plugin's own
//! tests) and, with the feature `conformance`, the `conformance` suite a
//! transport runs against itself.
//!
//! | module | for |
//! |---|---|
//! | [`stats`] | relaxed [`Counter`]s and [`Gauge`]s, a [`GaugeHold`] that gives a unit back on drop, and [`StatList`] to report them |
//! | [`codec`] | descriptor [`Writer`] / [`Reader`]: bounds-checked, little-endian, errors name the field and the byte offset, never a panic on hostile input |
//! | [`copy`] | a shard's bytes copied at the machine's speed: large copies split across cores |
//! | [`check`] | the argument checks every transport makes (destination and lent lengths, a descriptor's length against the metadata), worded the same everywhere |
//! | [`error`] | `io::Error` and own errors to [`AbiError`](shardport_abi::AbiError) with context ([`IoContext`]), and the stock "this transport does not do that" errors ([`unsupported`]) |
//! | [`options`] | the plugin's TOML table ([`Options`]): typed getters with defaults, byte sizes, durations, unknown keys refused by dotted path |
//! | [`map`] | [`ReadOnlyMap`], a safe owner of a read-only mapping of a file or segment, from which a plugin hands out zero-copy [`Region`](shardport_abi::Region)s |
//! | [`poll`] | [`await_bytes`](poll::await_bytes): polls a socket for bytes for a bounded time before the read sleeps (a sleeping reader wakes tens of microseconds late on VMs that halt idle vCPUs) |
//! | [`lease`] | one lease-and-liveness core for transports that lend memory to other processes: lease records with a claim protocol, the owner's scan and reclaim of dead holders ([`lease::board`]); process identity and proof of death ([`lease::liveness`]), the boot id parsed once |
//! | [`lent`] | [`Lent`], bytes whose lifetime the type system knows, readable without `unsafe`; the one `unsafe` door from a raw [`SharedBytes`](shardport_abi::SharedBytes) |
//! | [`hash`] | [`IdHashMap`](hash::IdHashMap): a fast hash for keys the process makes itself (shard ids, tokens), not for keys a peer picks |
//! | [`guard`] | panic-safe bodies for `stats`, `health` and `import_many`, on top of [`PluginContext::guard`](shardport_abi::PluginContext::guard) |
//! | [`adapter`] | [`PlainTransport`]: a transport in plain Rust types (slices, `PluginResult`), with defaults for what it lacks; [`Guarded`] makes it the ABI's trait object, every method under the guard |
//!
//! ```
//! use shardport_kit::{codec::{Reader, Writer}, options::Options, stats::{Counter, StatList}};
//!
//! // A descriptor: magic, version, a length-prefixed name, a length.
//! let mut w = Writer::new();
//! w.bytes(b"SPEX").u8(1).short_str("shard-7").u64(4096);
//! let bytes = w.finish();
//! let mut r = Reader::new("example descriptor", &bytes);
//! r.magic("magic", b"SPEX")?;
//! r.version("version", 1)?;
//! let name = r.short_str("name")?;
//! let len = r.u64("len")?;
//! r.end("len")?;
//! assert_eq!((name, len), ("shard-7", 4096));
//!
//! // Options: unknown keys are errors naming `plugin.<instance>.config.<key>`.
//! let o = Options::parse("ex", "pool-size = \"64MiB\"")?;
//! assert_eq!(o.byte_size("pool-size", 1 << 20)?, 64 << 20);
//! o.finish()?;
//!
//! // Stats.
//! let fetches = Counter::default();
//! fetches.inc();
//! let stats = StatList::new().counter("fetches", &fetches).finish();
//! assert_eq!(stats[0].value, 1);
//! # Ok::<(), shardport_abi::AbiError>(())
//! ```
//!
//! `unsafe` in the kit lives in `sys` only.

pub mod adapter;
pub mod admission;
mod busy;
pub mod check;
pub mod codec;
pub mod copy;
pub mod error;
pub mod guard;
pub mod hash;
pub mod lease;
pub mod lent;
pub mod map;
pub mod options;
pub mod poll;
pub mod stats;
mod sys;
pub mod testing;

#[cfg(feature = "conformance")]
pub mod conformance;

/// The kit's [`Options`] under the name the plugin config reader had when it
/// lived in `shardport-abi` (`shardport_abi::ConfigTable`).
pub use options::Options as ConfigTable;

/// This kit's version (a transport pins the kit it was written against).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub use adapter::{into_transport_box, Guarded, PlainTransport};
pub use codec::{Reader, Writer};
pub use error::{unsupported, IoContext};
pub use guard::lock;
pub use lent::Lent;
pub use map::ReadOnlyMap;
pub use options::{format_byte_size, format_duration, parse_byte_size, parse_duration, Options};
pub use stats::{Counter, Gauge, GaugeHold, StatList};
pub use sys::advise_huge_pages;
