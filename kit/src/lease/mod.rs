//! # One lease-and-liveness core for transports that share memory
//!
//! A transport that lends memory to other processes (a shared-memory pool,
//! GPU memory exported through IPC handles) must know which consumers still
//! read it, and take back the leases of consumers that died, without ever
//! taking one from a consumer that is alive. This module is that protocol,
//! written once, with its proofs next to it:
//!
//! - [`liveness`]: who a process is ([`Holder`](liveness::Holder),
//!   [`ProcessRecord`](liveness::ProcessRecord): pid, start time,
//!   namespaces, boot id) and [`judge`](liveness::judge), which calls a
//!   process dead only with proof, through a [`Probe`](liveness::Probe)
//!   tests can fabricate; the boot id is parsed here and nowhere else
//!   ([`boot_id`](liveness::boot_id)).
//! - [`board`]: lease records in a table of shared atomic words: the claim
//!   protocol (a claim word of sequence and state, the holder's identity
//!   written before the claim is published), release, the owner's scan and
//!   its reclaim of dead holders, and the board header (magic and version).
//!
//! A transport keeps what is its own: where the words live (a POSIX
//! segment, a vector in tests), what a lease names (its payload words), the
//! tables beside the lease records (shard entries, slot words), its magic
//! and layout version, and whatever it counts around a lease.
//!
//! ```
//! use std::sync::atomic::AtomicU64;
//! use shardport_kit::lease::{
//!     board::{LeaseRecords, Refused},
//!     liveness::{self, Here, System, Verdict},
//! };
//!
//! // Two lease records, each with one payload word (say, a shard slot). A
//! // transport's are in its board segment; these are in process memory.
//! let words: Vec<AtomicU64> = (0..LeaseRecords::<1>::words_for(2))
//!     .map(|_| AtomicU64::new(0))
//!     .collect();
//! let records = LeaseRecords::<1>::new(&words);
//! let me = Here::current();
//!
//! // Consumer: claim, re-check what the payload names, read, release.
//! let claim = records.claim(&me.holder(), [7], 0)?;
//! assert!(records.release(claim));
//!
//! // Owner: scan, judge each complete holder, reclaim only the dead.
//! let _held = records.claim(&me.holder(), [7], 0)?;
//! for lease in records.scan() {
//!     assert_eq!(lease.payload, [7]);
//!     let holder = lease.holder.expect("identity complete");
//!     if let Verdict::Dead(_) = liveness::judge_holder(&holder, &me, &System) {
//!         records.reclaim(&lease);
//!     }
//! }
//! assert_eq!(records.taken(), 1, "this process is alive: its lease stays");
//! # Ok::<(), Refused>(())
//! ```

pub mod board;
pub mod liveness;
