//! The owner's books: which shards are exported on which board slot, which
//! unexported ones wait for their last lease, and the reclamation of the
//! leases of consumers that died (see `board`, "Reclaiming").
//!
//! Generic over what an export keeps alive (`T`: the staged buffer and the
//! IPC event in the transport, a drop probe in tests), so the owner's whole
//! lease logic, board included, runs without a GPU.
//!
//! # When leases are reclaimed
//! Reclaiming needs a scan of the board's records and a liveness check per
//! distinct holder, so it runs where it pays:
//! - `unexport` and every `export` ([`Scope::Retired`]): records naming a
//!   retired slot, whose memory waits for them;
//! - `sweep` ([`Scope::All`]): every record, so a dead consumer's lease on a
//!   still-exported shard stops counting in `leases_held_on_owner` too.
//!
//! Locking: the transport keeps the books under its owner lock; every
//! method takes `&mut self`, so reclaims never race each other.

use std::collections::{HashMap, HashSet};

use shardport_abi::ShardId;
use shardport_kit::lease::liveness::{self, Here, Holder, Verdict};

use crate::{
    board::{Board, Layout, Scanned},
    sys::BoardMap,
};

/// One exported (or retired, waiting) shard's slot and what it keeps alive.
#[derive(Debug)]
pub(crate) struct Published<T> {
    pub slot: u32,
    pub generation: u64,
    pub value: T,
}

/// Which records a reap may reclaim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Records naming a retired slot whose memory waits.
    Retired,
    /// Every record with a dead holder.
    All,
}

/// What a reap did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Reaped {
    /// Leases of dead consumers taken back.
    pub reclaimed: u64,
    /// Retired shards whose memory was freed.
    pub freed: u64,
}

/// The owner's books of one transport instance.
#[derive(Debug)]
pub(crate) struct Books<T> {
    layout: Layout,
    here: Here,
    /// Created on the first export.
    board: Option<Board<BoardMap>>,
    next_slot: u32,
    shards: HashMap<ShardId, Published<T>>,
    /// Unexported shards whose slots are still named by a lease.
    deferred: Vec<Published<T>>,
}

impl<T> Books<T> {
    pub(crate) fn new(layout: Layout, here: Here) -> Books<T> {
        Books {
            layout,
            here,
            board: None,
            next_slot: 0,
            shards: HashMap::new(),
            deferred: Vec::new(),
        }
    }

    /// The board, created (exclusively, as `name`) on first use.
    pub(crate) fn board(&mut self, name: &str) -> Result<&Board<BoardMap>, String> {
        if self.board.is_none() {
            let map = BoardMap::create(name, self.layout.words())?;
            let board = Board::init(map, self.layout);
            board.set_owner_namespaces(self.here.process.ns);
            self.board = Some(board);
        }
        Ok(self.board.as_ref().expect("created above"))
    }

    pub(crate) fn contains(&self, id: &ShardId) -> bool {
        self.shards.contains_key(id)
    }

    pub(crate) fn get(&self, id: &ShardId) -> Option<&Published<T>> {
        self.shards.get(id)
    }

    /// Publishes a free slot (after [`board`](Self::board)): its index and
    /// new generation, or `None` when every slot is taken.
    pub(crate) fn publish(&mut self) -> Option<(u32, u64)> {
        let board = self.board.as_ref()?;
        let slots = self.layout.slots;
        let start = self.next_slot;
        let found = (0..slots)
            .map(|i| (start + i) % slots)
            .find_map(|slot| board.publish(slot).map(|g| (slot, g)))?;
        self.next_slot = (found.0 + 1) % slots;
        Some(found)
    }

    /// Records a published shard.
    pub(crate) fn insert(&mut self, id: ShardId, p: Published<T>) {
        self.shards.insert(id, p);
    }

    /// Unexports `id`: retires its slot, reclaims the leases of dead
    /// consumers on retired slots, then frees it (drops its value) if no
    /// lease names it, or keeps it until one [`reap`](Self::reap) finds none.
    /// Returns the leases still held on it, and what the reap did; `None`
    /// when `id` is not exported.
    pub(crate) fn unexport(&mut self, id: &ShardId) -> Option<(u64, Reaped)> {
        let p = self.shards.remove(id)?;
        if let Some(b) = &self.board {
            b.retire(p.slot, p.generation);
        }
        let (slot, generation) = (p.slot, p.generation);
        // Retired first, then scanned (see `board`, "Protocol").
        self.deferred.push(p);
        let reaped = self.reap(Scope::Retired);
        let held = match &self.board {
            Some(b) if self.deferred.iter().any(|d| d.slot == slot) => {
                b.leases_on(slot, generation)
            }
            _ => 0,
        };
        Some((held, reaped))
    }

    /// Reclaims the leases of provably dead consumers in `scope`, then frees
    /// every retired shard no lease names any more.
    pub(crate) fn reap(&mut self, scope: Scope) -> Reaped {
        let mut r = Reaped::default();
        let Some(b) = &self.board else {
            return r;
        };
        if scope == Scope::Retired && self.deferred.is_empty() {
            return r;
        }
        let waiting: HashSet<(u32, u64)> = self
            .deferred
            .iter()
            .map(|d| (d.slot, d.generation))
            .collect();
        let retired = |s: &Scanned| s.target.1 != 0 && waiting.contains(&s.target);
        let mut verdicts: HashMap<Holder, Verdict> = HashMap::new();
        let mut live = Vec::new();
        for s in b.scan() {
            let dead = match s.holder {
                Some(h) if scope == Scope::All || retired(&s) => {
                    let v = *verdicts.entry(h).or_insert_with(|| {
                        liveness::judge_holder(&h, &self.here, &liveness::System)
                    });
                    match v {
                        Verdict::Dead(why) => Some((h, why)),
                        Verdict::Alive => None,
                        Verdict::Unknown(why) => {
                            tracing::debug!(target: "cuda_ipc", pid = h.pid, reason = why, "lease holder not judged; its lease stays");
                            None
                        }
                    }
                }
                _ => None,
            };
            match dead {
                Some((h, why)) if b.reclaim(&s) => {
                    tracing::info!(target: "cuda_ipc", pid = h.pid, slot = s.target.0, reason = %why, "reclaimed the lease of a dead consumer");
                    r.reclaimed += 1;
                }
                _ => live.push(s),
            }
        }
        let named: HashSet<(u32, u64)> = live
            .iter()
            .filter(|s| s.target.1 != 0)
            .map(|s| s.target)
            .collect();
        let deferred = std::mem::take(&mut self.deferred);
        for d in deferred {
            if named.contains(&(d.slot, d.generation)) {
                self.deferred.push(d);
            } else {
                b.free(d.slot, d.generation);
                r.freed += 1;
                drop(d);
            }
        }
        r
    }

    /// Leases held on this owner's shards, exported or retired.
    pub(crate) fn leases_held(&self) -> u64 {
        let Some(b) = &self.board else {
            return 0;
        };
        let ours: HashSet<(u32, u64)> = self.all().map(|p| (p.slot, p.generation)).collect();
        b.scan()
            .iter()
            .filter(|s| s.target.1 != 0 && ours.contains(&s.target))
            .count() as u64
    }

    /// Retired shards waiting for their last lease.
    pub(crate) fn deferred_len(&self) -> usize {
        self.deferred.len()
    }

    /// Exported shards.
    pub(crate) fn exported_len(&self) -> usize {
        self.shards.len()
    }

    /// Every shard the books hold, exported or retired.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Published<T>> {
        self.shards.values().chain(self.deferred.iter())
    }

    /// Empties the books (the owner is going away): the leases still held,
    /// and every value, to be dropped by the caller; the board is unlinked
    /// when the books are dropped.
    pub(crate) fn drain(&mut self) -> (u64, Vec<T>) {
        let held = self.leases_held();
        let values = self
            .shards
            .drain()
            .map(|(_, p)| p)
            .chain(self.deferred.drain(..))
            .map(|p| p.value)
            .collect();
        (held, values)
    }
}
