//! A relay's copies: the verified pieces of the shards this consumer
//! fetched (or is fetching), served onward by its server as they arrive.
//!
//! One thread fills a [`Holding`] (the fetch), appending pieces it has
//! verified; any number of server tasks stream them, waiting for the next
//! one. Copies are bounded by `relay-cache` bytes (a copy that does not
//! fit is not made: its fetch joins as a leaf) and kept `relay-keep` after
//! they complete; complete copies are dropped oldest first to make room.
//!
//! With `relay-window` a copy keeps only its most recent pieces (at least
//! [`MIN_WINDOW_PIECES`]): a relay's memory for a shard is then the window,
//! whatever the shard's size, which is what lets a node relay a shard as
//! large as its memory. A reader that asks for a piece already dropped gets
//! [`Next::Evicted`] (its fetch takes the rest from the owner); a child
//! streaming behind its parent in a chain stays a few pieces behind, well
//! inside any window.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use bytes::Bytes;
use shardport_abi::ShardId;

/// How a copy stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Pieces still arriving.
    Filling,
    /// Every piece is here (since then).
    Complete(Instant),
    /// It will never complete; readers stop with this reason.
    Failed(String),
}

/// The fewest pieces a windowed copy keeps, whatever `relay-window` says.
pub(crate) const MIN_WINDOW_PIECES: u64 = 4;

/// Bytes a copy of `len` bytes counts against `relay-cache` under
/// `relay-window` `window` (0: the whole copy).
fn budget_bytes(len: u64, window: u64) -> u64 {
    if window == 0 {
        len
    } else {
        len.min(window)
    }
}

#[derive(Debug)]
struct State {
    /// Bytes per piece, 0 until the owner said.
    piece: u64,
    /// Index of `pieces[0]`: the pieces before it were dropped (window).
    first: u64,
    pieces: VecDeque<Bytes>,
    end: End,
}

/// One shard's copy.
#[derive(Debug)]
pub(crate) struct Holding {
    pub id: ShardId,
    pub len: u64,
    /// Bytes of recent pieces kept (`relay-window`); 0: every piece.
    window: u64,
    state: Mutex<State>,
    changed: tokio::sync::Notify,
    /// Its owner demoted this relay (`POST /v1/relay/{id}`): the fetch
    /// filling it rejoins the tree at its next piece.
    rejoin: std::sync::atomic::AtomicBool,
    /// The key its owner gave at the join: a removal or a move of this
    /// copy must carry it.
    key: std::sync::OnceLock<super::RemovalKey>,
}

/// What a reader waiting for piece `k` gets.
#[derive(Debug)]
pub(crate) enum Next {
    Piece(Bytes),
    /// Nothing past the last piece.
    Done,
    Failed(String),
    /// Not yet: wait for a change.
    Wait,
    /// Dropped already (`relay-window`): the pieces held start here.
    Evicted(u64),
}

impl Holding {
    fn new(id: ShardId, len: u64, window: u64) -> Holding {
        Holding {
            id,
            len,
            window: if window >= len { 0 } else { window },
            state: Mutex::new(State {
                piece: 0,
                first: 0,
                pieces: VecDeque::new(),
                end: End::Filling,
            }),
            changed: tokio::sync::Notify::new(),
            rejoin: std::sync::atomic::AtomicBool::new(false),
            key: std::sync::OnceLock::new(),
        }
    }

    /// Keeps the removal key the owner gave at the join (the first one: the
    /// owner gives the same key to every join from one serving address).
    pub(crate) fn set_key(&self, key: super::RemovalKey) {
        let _ = self.key.set(key);
    }

    /// Whether `sent` is this copy's removal key (constant time).
    pub(crate) fn is_key(&self, sent: &[u8]) -> bool {
        self.key
            .get()
            .is_some_and(|key| shardport_kit::check::constant_time_eq(sent, key))
    }

    /// Asks the fetch filling this copy to rejoin its tree (its owner moved
    /// it); whether the copy is still being filled (a complete or failed
    /// copy has no fetch to ask).
    pub(crate) fn ask_rejoin(&self) -> bool {
        if self.end() != End::Filling {
            return false;
        }
        self.rejoin
            .store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// Whether the owner asked the filling fetch to rejoin (the request is
    /// taken: asked once, rejoined once).
    pub(crate) fn take_rejoin(&self) -> bool {
        self.rejoin
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes this copy counts against `relay-cache`: the window, or the
    /// whole shard.
    pub(crate) fn budget_bytes(&self) -> u64 {
        budget_bytes(self.len, self.window)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the piece size (from the owner's join reply).
    pub(crate) fn set_piece(&self, piece: u64) {
        let mut st = self.state();
        if st.piece == 0 {
            st.piece = piece;
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Appends the next verified piece (nothing once the copy failed: it
    /// was dropped, and holds no memory any more).
    pub(crate) fn push(&self, piece: Bytes) {
        let mut st = self.state();
        if matches!(st.end, End::Failed(_)) {
            return;
        }
        st.pieces.push_back(piece);
        if self.window > 0 && st.piece > 0 {
            let keep = (self.window / st.piece).max(MIN_WINDOW_PIECES);
            while st.pieces.len() as u64 > keep {
                st.pieces.pop_front();
                st.first += 1;
            }
        }
        if st.piece > 0
            && st.first + st.pieces.len() as u64 == super::piece_count(self.len, st.piece)
        {
            st.end = End::Complete(Instant::now());
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Ends the copy for good; readers stop with `why`.
    pub(crate) fn fail(&self, why: &str) {
        let mut st = self.state();
        if !matches!(st.end, End::Failed(_)) {
            st.end = End::Failed(why.to_owned());
            st.pieces = VecDeque::new();
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Pieces received so far (held or, with a window, dropped since),
    /// and the piece size (0: not known yet).
    pub(crate) fn progress(&self) -> (u64, u64) {
        let st = self.state();
        (st.first + st.pieces.len() as u64, st.piece)
    }

    pub(crate) fn end(&self) -> End {
        self.state().end.clone()
    }

    /// Piece `k`, if here.
    pub(crate) fn next(&self, k: u64) -> Next {
        let st = self.state();
        if let End::Failed(why) = &st.end {
            return Next::Failed(why.clone());
        }
        if k < st.first {
            return Next::Evicted(st.first);
        }
        if let Some(p) = st.pieces.get((k - st.first) as usize) {
            return Next::Piece(p.clone());
        }
        if st.piece > 0 && k >= super::piece_count(self.len, st.piece) {
            return Next::Done;
        }
        Next::Wait
    }

    /// Waits (async) until `check` gives an answer, or `stall` passes with
    /// no change; `None` on the timeout.
    pub(crate) async fn wait_for<T>(
        &self,
        stall: Duration,
        mut check: impl FnMut(&Holding) -> Option<T>,
    ) -> Option<T> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a change in between wakes us.
            changed.as_mut().enable();
            if let Some(t) = check(self) {
                return Some(t);
            }
            if tokio::time::timeout(stall, changed).await.is_err() {
                return None;
            }
        }
    }
}

/// A fetch's hold on the copy it fills: unless the fetch marks it
/// [`complete`](Filling::complete), dropping it (a failed fetch, a panic)
/// fails the copy and drops it from the store, so a copy never stays
/// half-filled, its readers waiting and its budget taken.
pub(crate) struct Filling<'a> {
    pub holding: Arc<Holding>,
    holdings: &'a Holdings,
    done: bool,
}

impl Filling<'_> {
    /// The copy has every piece: it stays in the store.
    pub(crate) fn complete(mut self) {
        self.done = true;
    }

    /// The fetch failed (or will not fill the copy): drop it, readers stop
    /// with `why`.
    pub(crate) fn fail(mut self, why: &str) {
        self.done = true;
        self.holdings.drop_if_current(&self.holding, why);
    }
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.holdings
                .drop_if_current(&self.holding, "its fetch ended without completing it");
        }
    }
}

/// Every copy this consumer holds.
#[derive(Debug)]
pub(crate) struct Holdings {
    map: Mutex<HashMap<ShardId, Arc<Holding>>>,
    budget: u64,
    /// `relay-window` (0: whole copies).
    window: u64,
    keep: Duration,
}

impl Holdings {
    pub(crate) fn new(budget: u64, window: u64, keep: Duration) -> Holdings {
        Holdings {
            map: Mutex::default(),
            budget,
            window,
            keep,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<ShardId, Arc<Holding>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new, empty copy of `id` (`len` bytes) for a fetch to fill, or
    /// `None` when one exists already or it cannot fit in the budget even
    /// after dropping complete copies (oldest first) and expired ones.
    pub(crate) fn fill(&self, id: ShardId, len: u64) -> Option<Filling<'_>> {
        self.reserve(id, len).map(|holding| Filling {
            holding,
            holdings: self,
            done: false,
        })
    }

    fn reserve(&self, id: ShardId, len: u64) -> Option<Arc<Holding>> {
        let mut map = self.map();
        Self::prune_locked(&mut map, self.keep);
        let need = budget_bytes(len, self.window);
        if map.contains_key(&id) || need > self.budget {
            return None;
        }
        let mut used: u64 = map.values().map(|h| h.budget_bytes()).sum();
        if used + need > self.budget {
            let mut complete: Vec<(Instant, ShardId, u64)> = map
                .values()
                .filter_map(|h| match h.end() {
                    End::Complete(at) => Some((at, h.id, h.budget_bytes())),
                    _ => None,
                })
                .collect();
            complete.sort();
            for (_, old, n) in complete {
                if used + need <= self.budget {
                    break;
                }
                if let Some(h) = map.remove(&old) {
                    h.fail("dropped to make room (relay-cache)");
                }
                used -= n;
            }
            if used + need > self.budget {
                return None;
            }
        }
        let h = Arc::new(Holding::new(id, len, self.window));
        map.insert(id, Arc::clone(&h));
        Some(h)
    }

    /// The copy of `id`, if held.
    pub(crate) fn get(&self, id: ShardId) -> Option<Arc<Holding>> {
        self.map().get(&id).cloned()
    }

    /// Drops the copy of `id` (its owner removed the shard, or its fetch
    /// failed): readers stop with `why`. Whether there was one.
    pub(crate) fn drop_copy(&self, id: ShardId, why: &str) -> bool {
        let h = self.map().remove(&id);
        h.map(|h| h.fail(why)).is_some()
    }

    /// Drops `h` if it is still the copy of its shard.
    pub(crate) fn drop_if_current(&self, h: &Arc<Holding>, why: &str) {
        let mut map = self.map();
        if map.get(&h.id).is_some_and(|cur| Arc::ptr_eq(cur, h)) {
            map.remove(&h.id);
        }
        drop(map);
        h.fail(why);
    }

    /// Drops complete copies older than `relay-keep`.
    pub(crate) fn prune(&self) {
        Self::prune_locked(&mut self.map(), self.keep);
    }

    fn prune_locked(map: &mut HashMap<ShardId, Arc<Holding>>, keep: Duration) {
        map.retain(|_, h| match h.end() {
            End::Complete(at) if at.elapsed() >= keep => {
                h.fail("kept for relay-keep");
                false
            }
            End::Failed(_) => false,
            _ => true,
        });
    }

    /// Copies held and the bytes they count against `relay-cache`.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let map = self.map();
        (
            map.len() as u64,
            map.values().map(|h| h.budget_bytes()).sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> ShardId {
        ShardId::from_u128(n)
    }

    fn fill(h: &Holding, piece: u64) {
        h.set_piece(piece);
        let n = super::super::piece_count(h.len, piece);
        for _ in 0..n {
            h.push(Bytes::from_static(b"x"));
        }
    }

    #[test]
    fn a_copy_completes_with_its_last_piece_and_readers_see_each_piece() {
        let hs = Holdings::new(1000, 0, Duration::from_secs(60));
        let h = hs.reserve(id(1), 300).unwrap();
        assert!(hs.reserve(id(1), 300).is_none(), "one copy per shard");
        assert!(matches!(h.next(0), Next::Wait));
        h.set_piece(128);
        h.push(Bytes::from_static(b"a"));
        assert!(matches!(h.next(0), Next::Piece(_)));
        assert!(matches!(h.next(1), Next::Wait));
        h.push(Bytes::from_static(b"b"));
        h.push(Bytes::from_static(b"c"));
        assert!(matches!(h.end(), End::Complete(_)));
        assert!(matches!(h.next(3), Next::Done));
        assert_eq!(h.progress(), (3, 128));
    }

    #[test]
    fn a_windowed_copy_keeps_its_latest_pieces_and_counts_only_them() {
        // Window of 5 bytes in pieces of 1: 5 pieces kept.
        let hs = Holdings::new(100, 5, Duration::from_secs(60));
        let h = hs.reserve(id(1), 12).unwrap();
        assert_eq!(h.budget_bytes(), 5);
        assert_eq!(hs.totals(), (1, 5), "the window counts, not the shard");
        h.set_piece(1);
        for b in b"abcdefghijkl" {
            h.push(Bytes::copy_from_slice(&[*b]));
        }
        assert!(matches!(h.end(), End::Complete(_)));
        assert_eq!(h.progress(), (12, 1), "every piece received counts");
        assert!(matches!(h.next(6), Next::Evicted(7)));
        assert!(matches!(h.next(0), Next::Evicted(7)));
        assert!(matches!(h.next(7), Next::Piece(p) if &p[..] == b"h"));
        assert!(matches!(h.next(11), Next::Piece(p) if &p[..] == b"l"));
        assert!(matches!(h.next(12), Next::Done));
        // Never fewer than MIN_WINDOW_PIECES pieces, whatever the window.
        let h = hs.reserve(id(2), 64).unwrap();
        h.set_piece(8);
        for _ in 0..8 {
            h.push(Bytes::from_static(b"12345678"));
        }
        assert!(matches!(h.next(8 - MIN_WINDOW_PIECES), Next::Piece(_)));
        assert!(matches!(
            h.next(8 - MIN_WINDOW_PIECES - 1),
            Next::Evicted(_)
        ));
        // A window at least the shard's size keeps the whole copy.
        let whole = hs.reserve(id(3), 4).unwrap();
        assert_eq!(whole.budget_bytes(), 4);
        whole.set_piece(1);
        for _ in 0..4 {
            whole.push(Bytes::from_static(b"w"));
        }
        assert!(matches!(whole.next(0), Next::Piece(_)));
    }

    #[test]
    fn the_budget_drops_complete_copies_oldest_first_never_filling_ones() {
        let hs = Holdings::new(1000, 0, Duration::from_secs(60));
        let a = hs.reserve(id(1), 400).unwrap();
        fill(&a, 400);
        let b = hs.reserve(id(2), 400).unwrap(); // filling
        assert!(hs.reserve(id(3), 1001).is_none(), "over the whole budget");
        let c = hs
            .reserve(id(3), 500)
            .expect("room made by dropping the complete copy");
        assert!(hs.get(id(1)).is_none());
        assert!(matches!(a.next(0), Next::Failed(_)), "its readers stop");
        assert!(
            hs.reserve(id(4), 200).is_none(),
            "filling copies are never dropped"
        );
        assert_eq!(hs.totals(), (2, 900));
        drop((b, c));
    }

    #[test]
    fn a_fetch_that_ends_without_completing_drops_its_copy() {
        let hs = Holdings::new(1000, 0, Duration::from_secs(60));
        let f = hs.fill(id(1), 10).unwrap();
        let h = Arc::clone(&f.holding);
        drop(f);
        assert!(hs.get(id(1)).is_none());
        assert!(matches!(h.next(0), Next::Failed(w) if w.contains("without completing")));
        h.push(Bytes::from_static(b"late"));
        assert!(
            matches!(h.next(0), Next::Failed(_)),
            "a failed copy takes no pieces"
        );
        let f = hs.fill(id(2), 10).unwrap();
        fill(&f.holding, 16);
        f.complete();
        assert!(hs.get(id(2)).is_some(), "a complete copy stays");
    }

    #[test]
    fn removal_and_expiry_stop_readers() {
        let hs = Holdings::new(1000, 0, Duration::ZERO);
        let a = hs.reserve(id(1), 10).unwrap();
        assert!(hs.drop_copy(id(1), "removed by its owner"));
        assert!(matches!(a.next(0), Next::Failed(w) if w.contains("removed")));
        assert!(!hs.drop_copy(id(1), "again"));
        let b = hs.reserve(id(2), 10).unwrap();
        fill(&b, 16);
        hs.prune();
        assert_eq!(hs.totals(), (0, 0), "kept for relay-keep = 0");
    }

    #[tokio::test]
    async fn waiters_wake_on_each_change_and_time_out_without_one() {
        let hs = Holdings::new(1000, 0, Duration::from_secs(60));
        let h = hs.reserve(id(1), 10).unwrap();
        let none = h
            .wait_for(Duration::from_millis(20), |h| match h.next(0) {
                Next::Wait => None,
                n => Some(n),
            })
            .await;
        assert!(none.is_none());
        let h2 = Arc::clone(&h);
        let pusher = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            h2.set_piece(16);
            h2.push(Bytes::from_static(b"z"));
        });
        let got = h
            .wait_for(Duration::from_secs(10), |h| match h.next(0) {
                Next::Wait => None,
                n => Some(n),
            })
            .await;
        assert!(matches!(got, Some(Next::Piece(b)) if &b[..] == b"z"));
        pusher.await.unwrap();
    }
}
