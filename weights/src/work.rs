//! A queue of indices worked off by scoped threads: what publishing
//! (buckets put at once) and receiving (buckets fetched at once) share.

use std::sync::{
    atomic::{AtomicBool, AtomicUsize, Ordering},
    Mutex,
};

/// Runs `f(i)` for every `i` in `0..n` on at most `threads` threads, each
/// taking the next index not yet taken. Once a result satisfies `stop`, no
/// further index is taken (those left are `None`). One slot per index, in
/// index order.
pub(crate) fn each_index<R: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(usize) -> R + Sync,
    stop: impl Fn(&R) -> bool + Sync,
) -> Vec<Option<R>> {
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let slots: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || stopped.load(Ordering::Relaxed) {
                    break;
                }
                let r = f(i);
                if stop(&r) {
                    stopped.store(true, Ordering::Relaxed);
                }
                *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_in_order_and_a_stop_ends_the_queue() {
        let all = each_index(50, 4, |i| i * 2, |_| false);
        assert_eq!(all, (0..50).map(|i| Some(i * 2)).collect::<Vec<_>>());
        // One thread: indices are taken in order, so nothing after 3 runs.
        let some = each_index(10, 1, |i| i, |&r| r == 3);
        assert_eq!(&some[..4], &[Some(0), Some(1), Some(2), Some(3)]);
        assert!(some[4..].iter().all(Option::is_none));
        assert!(each_index(0, 8, |i| i, |_| false).is_empty());
    }
}
