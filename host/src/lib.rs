//! # shardport-host: the shardport runtime
//!
//! The *user crate* of shardport's plugin system: it loads transport plugins
//! (cdylibs built against [`shardport_abi`]), owns shards put by this process,
//! and fetches shards owned by others through the fastest transport that can
//! reach them, saying which one and why.
//!
//! ```no_run
//! use shardport_host::{config, Node, TensorSpec};
//!
//! let node = Node::start(config::default_config())?;
//! let handle = node.put(&[1, 2, 3, 4], &TensorSpec::bytes(4), Default::default())?;
//! // ... send `handle.to_bytes()` to a consumer through your own RPC ...
//! let fetched = node.fetch(&handle)?;
//! assert_eq!(&fetched.data[..], &[1, 2, 3, 4]);
//! println!("via {}: {}", fetched.selection.transport, fetched.selection.reason);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Where to start reading
//! The modules below are listed leaves first: each one uses only modules
//! above it, so the file reads top to bottom as the crate's dependency order
//! (`host/tests/module_graph.rs` keeps it a DAG). Start with [`vocab`] (the
//! words everything else uses), then [`config`] (the TOML schema and its
//! checks), [`select`] (the pure selection rules), [`loader`] (how plugins
//! are opened and checked) and finally [`node`] (put/fetch/remove), which
//! ties them together.
//!
//! ## The public face
//! One item, one path: every type is named by the module that defines it
//! (`vocab::TransportName`, `error::LoadError`, `vocab::CachePolicy`), with
//! no re-exports under other modules. The crate root re-exports the front
//! types a program starts from ([`Node`], [`Config`], [`Handle`],
//! [`HostError`], [`TensorSpec`], [`FetchMode`], [`Fetched`], [`Selection`],
//! [`ShardBytes`], [`DevicePtr`], [`DeviceView`], [`NodeStats`]); anything
//! else is reached through its module.
#![forbid(unsafe_code)]

// Leaves: import nothing of this crate.
// Shared vocabulary: transport names, wire limits, policy values, shard bytes.
pub mod vocab;
// This machine's locality identity (boot id, namespaces, `/dev/shm` device).
pub mod identity;
// Is an address this machine's? Interface addresses, cached.
pub mod locality;
// Services the host lends plugins: log sink and clock.
pub mod services;
// The serializable metrics snapshot and its size buckets.
pub mod snapshot;

// Built on the leaves.
// Copy destinations a node hands out again: a bounded shelf (uses `vocab`).
pub mod buffers;
// Host errors, and why a plugin did not load (uses `vocab`).
pub mod error;
// Handles: the token `put` returns, binary and JSON forms (uses `vocab`, `identity`).
pub mod handle;
// The consumer cache and its pure eviction rule (uses `vocab`).
pub mod cache;
// Metrics registry and Prometheus text (uses `snapshot`).
pub mod metrics;
// Deployment config: TOML schema, semantic checks, validated types (uses `vocab`, `locality`).
pub mod config;
// Fault injection in front of a plugin (uses `config`).
pub mod faults;
// Experiment arm assignment and guardrails (uses `config`).
pub mod experiment;
// Pure transport selection (uses `config`, `experiment`, `handle`, `identity`, `vocab`).
pub mod select;
// Opens and checks plugin libraries (uses `config`, `error`, `faults`, `services`, `vocab`).
pub mod loader;

// The top: uses everything above; nothing imports it.
// A running node: put, fetch, remove, stats.
pub mod node;

pub use config::Config;
pub use error::HostError;
pub use handle::Handle;
pub use node::{DevicePtr, DeviceView, Fetched, Node, NodeStats, Selection, TensorSpec};
pub use vocab::{FetchMode, ShardBytes};
