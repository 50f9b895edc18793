//! End-to-end tests across processes and plugin libraries: one test binary
//! (faster to link), one module per area, a unique temp dir per test.
//!
//! These load the real `.so` files cargo built for this workspace and start
//! the real `shardport` binary as owner and consumer processes; run them with
//! `cargo test --workspace` so both exist.

mod util;

mod backpressure;
mod chaos;
mod cluster;
mod conformance;
mod control_hostile;
mod crash;
mod cross_process;
mod cuda;
mod experiments;
mod faults;
mod load;
mod loader;
mod netns;
mod nodes;
mod operate;
mod out_of_tree;
mod reload;
mod serve;
mod tls;
mod weights;
