//! Copying a shard's bytes as fast as the machine allows.
//!
//! One core does not saturate memory: on this project's 2-vCPU VMs a single
//! `memcpy` of 64 MiB between warm buffers runs at 7-12 GB/s, the same copy
//! split across both cores at 15-21 GB/s (a C loop, 2026-11-26). So from
//! [`PARALLEL_MIN`] bytes up, [`copy`] splits the copy into contiguous
//! pieces of at least [`PIECE_MIN`] bytes, one per core (at most
//! [`MAX_THREADS`]), copied by scoped threads and by the calling thread
//! itself, each taking pieces until none is left: the way Ray's object
//! store copies large objects.
//! Below that a thread's start (tens of microseconds) costs more than it
//! saves, and the copy is one `copy_from_slice`.
//!
//! A split copy starts threads only for cores that look idle at that
//! moment ([`threads_now`]: fewer runnable tasks on the machine than it
//! has cores, from `/proc/loadavg`, read at most once a millisecond). On a
//! machine whose cores are all busy, such as dozens of consumer processes
//! on a few cores, a second thread adds no capacity: it only costs its
//! start and exit and makes the copy wait until the new thread, queued
//! behind every other runnable task, has run. At 64 consumer processes on
//! 2 vCPUs, starting a thread per split copy meant about 1,150 thread
//! starts a second and 1.5-1.6x the CPU per fetch of 8 consumers
//! (BENCHMARKS.md, seventh session).
//!
//! ```
//! let src = vec![7u8; 1 << 20];
//! let mut dst = vec![0u8; 1 << 20];
//! shardport_kit::copy::copy(&src, &mut dst);
//! assert_eq!(src, dst);
//! ```

use crate::busy::cores;

/// Copies at least this long are split across cores.
pub const PARALLEL_MIN: usize = 4 << 20;

/// Smallest piece one thread copies.
pub const PIECE_MIN: usize = 2 << 20;

/// Most threads one copy uses (the caller's included).
pub const MAX_THREADS: usize = 4;

/// Copies `src` into `dst`, which must be as long.
///
/// # Panics
/// When the lengths differ, like `copy_from_slice`.
pub fn copy(src: &[u8], dst: &mut [u8]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "kit::copy: source and destination lengths differ"
    );
    split_copy(src, dst, threads_now(src.len()));
}

/// [`copy`] in `threads` pieces (1: the caller's `copy_from_slice`).
fn split_copy(src: &[u8], dst: &mut [u8], threads: usize) {
    if threads <= 1 || src.is_empty() {
        dst.copy_from_slice(src);
        return;
    }
    let piece = src.len().div_ceil(threads);
    let pieces: Vec<(&[u8], &mut [u8])> = src.chunks(piece).zip(dst.chunks_mut(piece)).collect();
    in_parallel(pieces, |(s, d)| d.copy_from_slice(s));
}

/// Runs `work` on every piece: the calling thread and up to one scoped
/// thread per other piece take pieces from a shared queue until none is
/// left. A thread that cannot be started (the system's limit) is not an
/// error: the others, the caller at least, take its pieces.
pub(crate) fn in_parallel<T: Send>(pieces: Vec<T>, work: impl Fn(T) + Sync) {
    let helpers = pieces.len().saturating_sub(1);
    let queue = std::sync::Mutex::new(pieces.into_iter());
    let next = || {
        queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .next()
    };
    let drain = || {
        while let Some(p) = next() {
            work(p);
        }
    };
    std::thread::scope(|s| {
        for _ in 0..helpers {
            if std::thread::Builder::new()
                .name("shardport-copy".into())
                .spawn_scoped(s, drain)
                .is_err()
            {
                break;
            }
        }
        drain();
    });
}

/// Threads a copy of `len` bytes uses: 1 below [`PARALLEL_MIN`], else as
/// many as the cores, [`MAX_THREADS`] and pieces of [`PIECE_MIN`] allow.
pub fn threads_for(len: usize) -> usize {
    if len < PARALLEL_MIN {
        return 1;
    }
    cores().min(MAX_THREADS).min(len / PIECE_MIN).max(1)
}

/// Threads a copy of `len` bytes uses now: [`threads_for`], less the cores
/// that are busy at this moment (the caller's thread always copies). 1
/// when every core of the machine has a runnable task: the copy is then
/// the caller's alone.
pub fn threads_now(len: usize) -> usize {
    let most = threads_for(len);
    if most <= 1 {
        return 1;
    }
    most.min(1 + crate::busy::spare_cores().unwrap_or(MAX_THREADS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_copies_stay_on_the_caller_and_large_ones_split_in_big_pieces() {
        assert_eq!(threads_for(0), 1);
        assert_eq!(threads_for(PARALLEL_MIN - 1), 1);
        let t = threads_for(PARALLEL_MIN);
        assert!((1..=2).contains(&t), "{t}");
        assert!(threads_for(1 << 40) <= MAX_THREADS);
        assert_eq!(threads_for(1 << 40), cores().min(MAX_THREADS));
    }

    #[test]
    fn busy_cores_are_not_given_copy_threads() {
        // Whatever this machine's load: never more than the static
        // bound, never fewer than the caller, one for small copies.
        assert_eq!(threads_now(PARALLEL_MIN - 1), 1);
        let now = threads_now(1 << 40);
        assert!((1..=threads_for(1 << 40)).contains(&now), "{now}");
    }

    #[test]
    fn every_byte_lands_where_it_belongs_at_every_split() {
        // Odd lengths around the thresholds: the last piece is shorter.
        for len in [
            0,
            1,
            4097,
            PARALLEL_MIN - 3,
            PARALLEL_MIN + 5,
            3 * PIECE_MIN + 11,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut dst = vec![0xA5u8; len];
            copy(&src, &mut dst);
            assert!(src == dst, "copy of {len} bytes differs");
            // The split itself, whatever this machine's load allows now.
            for threads in 2..=MAX_THREADS {
                let mut dst = vec![0xA5u8; len];
                split_copy(&src, &mut dst, threads);
                assert!(src == dst, "copy of {len} bytes in {threads} differs");
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn lengths_must_match() {
        copy(&[1, 2, 3], &mut [0; 2]);
    }
}
