//! The only `unsafe` of this crate: reading the bytes the host lent to
//! `export`, straight from its memory, while responses stream them out.
//!
//! # Overview
//! [`LentBytes`] wraps the [`SharedBytes`] of one export together with a
//! count of live [`Reader`]s. A response body holds a `Reader` (turned into
//! a [`Bytes`] with [`Reader::into_bytes`], no copy) for as long as hyper may
//! still write from that memory: until the bytes are on the socket or the
//! connection is dropped.
//!
//! # What the safe API relies on
//! The host keeps lent bytes alive and unmodified until `unexport` of the
//! shard returns (the transport's memory contract). `unexport` calls
//! [`LentBytes::withdraw`], which
//! 1. refuses every new reader from then on, and
//! 2. returns `Ok` only once no reader is alive.
//!
//! So when `unexport` succeeds nothing can read the bytes any more. When the
//! wait times out, `withdraw` returns the number of readers left, `unexport`
//! fails with `TIMEOUT`, and the host never frees those bytes (it leaks them
//! by design: docs/decisions.md), so the remaining readers stay valid.
//!
//! # Locking
//! One mutex per export guards the reader count and the withdrawn flag; it
//! is taken when a response starts, when it ends and by `withdraw`, never
//! while doing I/O, and never together with another lock.

use std::{
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use bytes::Bytes;
use shardport_abi::{ExportRequest, SharedBytes};

#[derive(Debug, Default)]
struct ReaderBook {
    readers: usize,
    withdrawn: bool,
    /// `withdraw` calls waiting for the last reader: only while there are
    /// any does that reader's drop signal `idle` (a signal is a system
    /// call, and every response drops a reader).
    waiting: usize,
}

/// The bytes one `export` lent us, and who is reading them.
#[derive(Debug)]
pub(crate) struct LentBytes {
    data: SharedBytes,
    /// A GPU shard: the CUDA device ordinal `data`'s address is on (never
    /// read as host memory; see `gpu`).
    device: Option<u32>,
    book: Mutex<ReaderBook>,
    idle: Condvar,
}

impl LentBytes {
    /// Records the bytes of `req`. They are only read through [`Reader`]s,
    /// and only until [`withdraw`](Self::withdraw) succeeds; `unexport` of
    /// `req.id` must call `withdraw` before it returns.
    pub(crate) fn from_request(req: &ExportRequest) -> Arc<LentBytes> {
        let device = (req.meta.device.kind == shardport_abi::DeviceKind::CUDA)
            .then_some(req.meta.device.index);
        Arc::new(LentBytes {
            data: req.data,
            device,
            book: Mutex::default(),
            idle: Condvar::new(),
        })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    fn book(&self) -> MutexGuard<'_, ReaderBook> {
        // The critical sections below cannot panic half-way.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new reader, or `None` once the export is withdrawn.
    pub(crate) fn reader(self: &Arc<Self>) -> Option<Reader> {
        let mut book = self.book();
        if book.withdrawn {
            return None;
        }
        book.readers += 1;
        Some(Reader {
            lent: Arc::clone(self),
        })
    }

    /// Readers alive now.
    #[cfg(test)]
    pub(crate) fn readers(&self) -> usize {
        self.book().readers
    }

    /// Refuses new readers, then waits up to `timeout` for the live ones to
    /// finish. `Err(n)`: `n` readers were still alive at the deadline.
    pub(crate) fn withdraw(&self, timeout: Duration) -> Result<(), usize> {
        let deadline = Instant::now() + timeout;
        let mut book = self.book();
        book.withdrawn = true;
        while book.readers > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(book.readers);
            }
            book.waiting += 1;
            book = self
                .idle
                .wait_timeout(book, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            book.waiting -= 1;
        }
        Ok(())
    }
}

/// A live reference to lent bytes: while one exists, `withdraw` (and so
/// `unexport`) cannot succeed.
#[derive(Debug)]
pub(crate) struct Reader {
    lent: Arc<LentBytes>,
}

impl Reader {
    /// Length of the shard in bytes.
    pub(crate) fn len(&self) -> usize {
        self.lent.data.len()
    }

    /// A GPU shard's device ordinal and address; `None` for host bytes.
    pub(crate) fn device(&self) -> Option<(u32, u64)> {
        self.lent.device.map(|d| (d, self.lent.data.addr()))
    }

    /// The bytes as a [`Bytes`] that reads the host's memory in place and
    /// releases this reader when the last clone of it is dropped. Host
    /// bytes only: a GPU shard is staged (`server::body`).
    pub(crate) fn into_bytes(self) -> Bytes {
        assert!(
            self.lent.device.is_none(),
            "a GPU shard's address is not host memory"
        );
        if self.lent.data.is_empty() {
            return Bytes::new();
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Reader {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: this reader is counted in `lent.book`, so `withdraw` cannot
        // return `Ok` while it lives, so `unexport` has not returned and the
        // host keeps the bytes alive and unmodified (the export contract). If
        // `withdraw` timed out, `unexport` failed and the host never frees
        // them. The slice borrows `self`, which the `Bytes` owning it keeps.
        unsafe { self.lent.data.as_slice() }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut book = self.lent.book();
        book.readers -= 1;
        if book.readers == 0 && book.waiting > 0 {
            self.lent.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::{ShardId, ShardMeta};

    fn lend(bytes: &[u8]) -> Arc<LentBytes> {
        LentBytes::from_request(&ExportRequest {
            id: ShardId::from_u128(1),
            meta: ShardMeta::bytes(bytes.len() as u64),
            data: SharedBytes::lend(bytes),
            allocation: 0,
        })
    }

    #[test]
    fn readers_see_the_lent_bytes_and_block_withdraw() {
        let data = vec![7u8; 100];
        let lent = lend(&data);
        let b = lent.reader().unwrap().into_bytes();
        assert_eq!(&b[..], &data[..]);
        assert_eq!(b.as_ptr(), data.as_ptr(), "no copy");
        let clone = b.slice(10..20);
        drop(b);
        assert_eq!(lent.readers(), 1, "a slice keeps the reader");
        assert_eq!(lent.withdraw(Duration::from_millis(1)), Err(1));
        assert!(lent.reader().is_none(), "withdrawn: no new readers");
        let waiter = {
            let lent = Arc::clone(&lent);
            std::thread::spawn(move || lent.withdraw(Duration::from_secs(60)))
        };
        drop(clone);
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert_eq!(lent.readers(), 0);
    }

    #[test]
    fn the_last_reader_wakes_a_waiting_withdraw() {
        let data = vec![3u8; 10];
        let lent = lend(&data);
        let b = lent.reader().unwrap().into_bytes();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let lent = Arc::clone(&lent);
            // A deadline far past the receive below: a withdraw that is not
            // woken by the reader's drop cannot pass this test by timing out.
            std::thread::spawn(move || tx.send(lent.withdraw(Duration::from_secs(3600))))
        };
        // Bounded: the waiter registers at once.
        for _ in 0..60_000 {
            if lent.book().waiting == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(lent.book().waiting, 1, "the withdraw is waiting");
        drop(b);
        let woken = rx.recv_timeout(Duration::from_secs(120));
        assert_eq!(
            woken,
            Ok(Ok(())),
            "the last reader's drop woke the withdraw"
        );
        waiter
            .join()
            .unwrap()
            .expect("the result was received above");
        assert_eq!(lent.book().waiting, 0);
    }

    #[test]
    fn empty_exports_need_no_memory() {
        let lent = lend(&[]);
        let b = lent.reader().unwrap().into_bytes();
        assert!(b.is_empty());
        assert_eq!(lent.readers(), 0, "an empty body holds no reader");
        assert_eq!(lent.withdraw(Duration::ZERO), Ok(()));
    }
}
