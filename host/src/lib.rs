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
//! [`node`] (put/fetch/remove), then [`select`] (the pure selection rules),
//! [`loader`] (how plugins are opened and checked) and [`config`].
#![forbid(unsafe_code)]

pub mod cache;
pub mod config;
pub mod error;
pub mod experiment;
pub mod handle;
pub mod identity;
pub mod loader;
pub mod locality;
pub mod metrics;
pub mod node;
pub mod select;
pub mod services;
pub mod snapshot;

pub use config::{Config, FetchMode};
pub use error::HostError;
pub use handle::Handle;
pub use node::{
    DevicePtr, DeviceView, Fetched, Node, NodeStats, Selection, ShardBytes, TensorSpec,
};
