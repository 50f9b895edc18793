//! # shardport-weights: weight updates in one call
//!
//! A trainer publishes a state dict; every rollout or inference process
//! receives it into its own parameter storage, verified and whole.
//!
//! - [`Publisher::publish`] packs the tensors into a few buckets (small
//!   tensors together, each large one alone), puts each bucket as one shard
//!   through the node (so every bucket rides the node's transports, routes
//!   and relays like any shard), hashes each with BLAKE3 and returns a
//!   [`Manifest`]: a few dozen bytes per tensor beyond its name and shape,
//!   sent by the caller's own RPC.
//! - [`Receiver::update`] fetches the buckets in parallel, checks each
//!   against the manifest's hash, and only then copies every tensor into
//!   place: an update commits whole or leaves the previous version.
//! - The publisher keeps a version until every receiver it knows committed
//!   a newer one or a grace period passed, then removes it everywhere.
//!
//! ```no_run
//! use shardport_abi::DType;
//! use shardport_host::{config, Node};
//! use shardport_weights::{Manifest, Publisher, Receiver, Target, Tensor};
//!
//! let owner = Node::start(config::default_config())?;
//! let trainer = Publisher::new(&owner, Default::default());
//! let w = vec![0u8; 4 * 1024];
//! let manifest = trainer.publish(1, &[Tensor { name: "w", dtype: DType::F32, shape: &[1024], bytes: &w }])?;
//! let wire = manifest.to_bytes(); // through your RPC
//!
//! let node = Node::start(config::default_config())?;
//! let rollout = Receiver::new(&node, Default::default());
//! let mut mine = vec![0u8; 4 * 1024];
//! let mut targets = [Target { name: "w".into(), dtype: DType::F32, shape: vec![1024], strides: None, bytes: &mut mine }];
//! let done = rollout.update(&Manifest::from_bytes(&wire)?, &mut targets)?;
//! assert_eq!(done.version, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Where to start reading: [`manifest`] (the wire value), [`plan`] (the
//! pure packing rule), then [`publish`] and [`receive`]. The crate uses
//! only the host's public API.
#![forbid(unsafe_code)]

pub mod error;
pub mod manifest;
pub mod plan;
pub mod publish;
pub mod receive;
pub mod split;
mod work;

pub use error::WeightsError;
pub use manifest::Manifest;
pub use publish::{PublishOptions, Publisher, Tensor};
pub use receive::{ReceiveOptions, Receiver, Target, Update, Verify, DEFAULT_FETCHES};
pub use split::Split;
