//! # shardport-cli: the `shardport` command line
//!
//! The tools built over the [`shardport_host`] runtime library. Each
//! subcommand of the `shardport` binary lives in its own module; `main.rs`
//! only parses arguments and dispatches. Users who link `shardport-host`
//! compile none of this (no benchmark, plotting or report code).
//!
//! ## Where things live
//! - [`demo`]: `shardport demo`, the main job (owner and consumer processes).
//! - [`worker`]: `shardport worker`, a node driven by JSON lines: what the demo,
//!   the benchmark, the soak and the end-to-end tests start as real processes.
//! - the control server of `shardport serve` and its client (`put`,
//!   `stats`, `metrics`, `drain`) are the [`shardport_control`] library;
//!   `cmd/` only turns arguments into its calls.
//! - [`bench`]: `shardport bench`, the matrix against this machine's limits.
//! - [`ab_report`]: `shardport ab report`, an experiment's arms compared.
//! - [`soak`]: `shardport soak`, a long run of put/fetch/remove steps.
#![forbid(unsafe_code)]

pub mod ab_report;
pub mod bench;
pub mod cluster;
pub mod demo;
pub mod gpu;
pub mod pattern;
pub mod polled;
pub mod soak;
pub mod worker;
