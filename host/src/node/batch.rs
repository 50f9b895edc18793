//! fetch_many: shards grouped by owner and transport, groups in parallel.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

use shardport_abi::{AbiError, ErrorKind, ImportItem, RResult, RSlice, RSliceMut};

use super::{lock, Fetched, Generation, Node};
use crate::{
    error::HostError,
    handle::Handle,
    select::{Attempt, Plan},
    vocab::{CopyBuf, FetchMode, ShardBytes, TransportName},
};

impl Node {
    /// Fetches many shards; results come back in input order, one per handle.
    ///
    /// Copies are batched: shards are grouped by (owner, transport) and each
    /// group goes to the transport's `import_many` in one call (one round trip
    /// per owner for a network transport); groups run in parallel (at most
    /// [`MAX_FETCH_THREADS`]). When a transport fails some shards of a group,
    /// only those move on to their next candidate, in the next round, so a
    /// failover fetches only what is still missing. Views are per shard
    /// (each holds its own lease), grouped by owner and run in parallel.
    pub fn fetch_many(
        &self,
        handles: &[Handle],
        mode: FetchMode,
    ) -> Result<Vec<Result<Fetched, HostError>>, HostError> {
        let g = self.inner.live();
        let max = g.config.fetch.max_batch;
        if handles.len() > max {
            return Err(HostError::BatchTooLarge {
                n: handles.len(),
                max,
            });
        }
        match mode {
            FetchMode::View => Ok(self.fetch_each(handles, mode)),
            FetchMode::Copy => Ok(self.fetch_batched(g, handles)),
        }
    }

    fn fetch_each(&self, handles: &[Handle], mode: FetchMode) -> Vec<Result<Fetched, HostError>> {
        let mut groups: BTreeMap<(&str, u64), Vec<usize>> = BTreeMap::new();
        for (i, h) in handles.iter().enumerate() {
            groups
                .entry((h.owner.addr.as_str(), h.owner.epoch))
                .or_default()
                .push(i);
        }
        let groups: Vec<Vec<usize>> = groups.into_values().collect();
        let done = run_parallel(&groups, |group| {
            group
                .iter()
                .map(|&i| (i, self.fetch_mode(&handles[i], mode)))
                .collect()
        });
        in_order(handles.len(), done)
    }

    /// Copies in rounds: each round imports every shard still missing from
    /// its next candidate, one `import_many` per (owner, transport) group.
    fn fetch_batched(
        &self,
        g: Arc<Generation>,
        handles: &[Handle],
    ) -> Vec<Result<Fetched, HostError>> {
        let start = Instant::now();
        let mut b = Batch::new(handles.len(), g);
        let mut pending = self.batch_plan(handles, &mut b, start);
        while !pending.is_empty() {
            // Group what is still missing by (owner, next transport to try).
            let mut groups: BTreeMap<(&str, u64, usize), Vec<usize>> = BTreeMap::new();
            for &i in &pending {
                let a = &b.plans[i].attempts[b.cursor[i]];
                let owner = &handles[i].owner;
                groups
                    .entry((owner.addr.as_str(), owner.epoch, a.plugin))
                    .or_default()
                    .push(i);
            }
            let groups: Vec<(usize, Vec<usize>)> =
                groups.into_iter().map(|((_, _, p), v)| (p, v)).collect();
            let results = run_parallel(&groups, |(pi, members)| {
                self.import_group(&b.g, *pi, members, handles, &b.plans, &b.cursor)
            });
            pending.clear();
            for (i, r) in results {
                if self.settle(handles, &mut b, i, r, start) {
                    pending.push(i);
                }
            }
        }
        b.out
            .into_iter()
            .map(|r| r.expect("every shard resolved"))
            .collect()
    }

    /// Plans every shard of a batch; settles the ones that need no import
    /// (too large, no candidate, cache hit) and returns the others.
    fn batch_plan(&self, handles: &[Handle], b: &mut Batch, start: Instant) -> Vec<usize> {
        let mut pending = Vec::new();
        for (i, h) in handles.iter().enumerate() {
            let plan = self.plan_for(&b.g, h, FetchMode::Copy, super::plan::Memory::Host);
            if let Err(e) = self.check_claimed_size(&b.g, h) {
                b.out[i] = Some(Err(e));
            } else if let Err(e) = self.candidates(h, &plan.attempts, &plan.skipped) {
                b.out[i] = Some(Err(e));
            } else if let Some(hit) = self.cached(h, FetchMode::Copy, start) {
                b.out[i] = Some(Ok(hit));
            } else {
                pending.push(i);
            }
            b.plans.push(plan);
        }
        pending
    }

    /// Settles shard `i` after its current attempt returned `r`. Returns
    /// true when it moves on to its next candidate in the next round.
    fn settle(
        &self,
        handles: &[Handle],
        b: &mut Batch,
        i: usize,
        r: Result<Served, AbiError>,
        start: Instant,
    ) -> bool {
        let attempt = &b.plans[i].attempts[b.cursor[i]];
        let verified = r.map(|(buf, note)| {
            (
                self.verify(&b.g, &handles[i], &attempt.transport, &buf),
                (buf, note),
            )
        });
        let failed = match verified {
            Ok((Ok(()), served)) => {
                let failures = std::mem::take(&mut b.failures[i]);
                b.out[i] = Some(self.batch_served(
                    &b.g,
                    &handles[i],
                    &b.plans[i],
                    attempt,
                    failures,
                    served,
                    start,
                ));
                return false;
            }
            // `verify` counted the failed attempt already.
            Ok((Err(e), _)) => {
                let err = AbiError::internal(e.to_string());
                b.corrupt[i].get_or_insert(e);
                err
            }
            Err(e) => {
                self.inner
                    .metrics
                    .fetch_error(Some(attempt.transport.as_str()));
                e
            }
        };
        tracing::debug!(target: "select", shard = %handles[i].id, transport = %attempt.transport, error = %failed, "batch attempt failed");
        b.failures[i].push((attempt.transport.clone(), failed));
        b.cursor[i] += 1;
        if b.cursor[i] < b.plans[i].attempts.len() {
            return true;
        }
        self.record_arm(
            &b.g,
            &b.plans[i],
            None,
            handles[i].meta.byte_len,
            start.elapsed(),
        );
        let error = b.corrupt[i]
            .take()
            .unwrap_or_else(|| HostError::FetchFailed {
                id: handles[i].id,
                failures: std::mem::take(&mut b.failures[i]),
            });
        b.out[i] = Some(Err(error));
        false
    }

    /// The result of a batch shard whose current attempt delivered `buf`.
    #[allow(clippy::too_many_arguments)]
    fn batch_served(
        &self,
        g: &Generation,
        handle: &Handle,
        plan: &Plan,
        attempt: &Attempt,
        failures: Vec<(TransportName, AbiError)>,
        (buf, note): Served,
        start: Instant,
    ) -> Result<Fetched, HostError> {
        let len = handle.meta.byte_len;
        // One clock read per shard (a batch's shards settle together).
        let elapsed = start.elapsed();
        self.record_arm(g, plan, Some(&attempt.transport), len, elapsed);
        let selection = self.report(g, handle, attempt, &note, failures)?;
        self.inner
            .metrics
            .fetch_ok(attempt.transport.as_str(), len, elapsed);
        let data = Arc::new(ShardBytes::Owned(buf));
        self.remember(handle, &data);
        Ok(Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data,
            selection,
            elapsed,
        })
    }

    /// Imports one (owner, transport) group with a single `import_many`.
    fn import_group(
        &self,
        g: &Generation,
        pi: usize,
        members: &[usize],
        handles: &[Handle],
        plans: &[Plan],
        cursor: &[usize],
    ) -> Vec<(usize, Result<Served, AbiError>)> {
        let p = &g.plugins[pi];
        let mut bufs: Vec<(usize, Result<CopyBuf, AbiError>)> = members
            .iter()
            .map(|&i| {
                let buf = self
                    .inner
                    .copy_destination(handles[i].meta.byte_len)
                    .map_err(|e| AbiError::new(ErrorKind::RESOURCE_EXHAUSTED, e.to_string()));
                (i, buf)
            })
            .collect();
        let mut slots: Vec<usize> = Vec::new();
        let mut items: Vec<ImportItem<'_>> = Vec::new();
        for (k, (i, buf)) in bufs.iter_mut().enumerate() {
            if let Ok(buf) = buf {
                let export = plans[*i].attempts[cursor[*i]].export;
                items.push(ImportItem {
                    desc: RSlice::from_slice(&handles[*i].exports[export].descriptor),
                    meta: &handles[*i].meta,
                    dst: RSliceMut::from_mut_slice(&mut buf[..]),
                });
                slots.push(k);
            }
        }
        let n = items.len();
        let results = p
            .transport
            .import_many(RSliceMut::from_mut_slice(&mut items));
        drop(items);
        let mut results = results.into_iter();
        let mut notes: Vec<String> = vec![String::new(); bufs.len()];
        for (j, k) in slots.into_iter().enumerate() {
            let r = results.next().map(RResult::into_result).unwrap_or_else(|| {
                Err(AbiError::internal(format!(
                    "`{}` import_many returned {j} results for {n} shards",
                    p.name
                )))
            });
            match r {
                Ok(info) => notes[k] = info.note.into(),
                Err(e) => bufs[k].1 = Err(e),
            }
        }
        bufs.into_iter()
            .zip(notes)
            .map(|((i, r), note)| (i, r.map(|buf| (buf, note))))
            .collect()
    }
}

/// A batch shard's bytes and its transport's note (how it served them).
type Served = (CopyBuf, String);

/// The state of one copy batch, one slot per shard.
struct Batch {
    /// The result, once settled.
    out: Vec<Option<Result<Fetched, HostError>>>,
    /// The selection plan.
    plans: Vec<Plan>,
    /// Index of the attempt being tried.
    cursor: Vec<usize>,
    /// `(transport, error)` per attempt that failed so far.
    failures: Vec<Vec<(TransportName, AbiError)>>,
    /// The first verification failure, reported if no attempt delivers.
    corrupt: Vec<Option<HostError>>,
    /// The config generation the whole batch runs under.
    g: Arc<Generation>,
}

impl Batch {
    fn new(n: usize, g: Arc<Generation>) -> Self {
        Batch {
            g,
            out: (0..n).map(|_| None).collect(),
            plans: Vec::with_capacity(n),
            cursor: vec![0; n],
            failures: vec![Vec::new(); n],
            corrupt: (0..n).map(|_| None).collect(),
        }
    }
}

/// Runs `work` over `groups` on at most [`MAX_FETCH_THREADS`] threads and
/// collects every `(index, result)` it returns.
fn run_parallel<G: Sync, R: Send>(
    groups: &[G],
    work: impl Fn(&G) -> Vec<(usize, R)> + Sync,
) -> Vec<(usize, R)> {
    if groups.len() <= 1 {
        return groups.iter().flat_map(&work).collect();
    }
    let threads = groups.len().min(MAX_FETCH_THREADS);
    let next = AtomicU64::new(0);
    let collected = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let g = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(group) = groups.get(g) else { break };
                let local = work(group);
                lock(&collected).extend(local);
            });
        }
    });
    collected.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Orders `(index, result)` pairs by index; every index below `n` must appear once.
fn in_order<R>(n: usize, pairs: Vec<(usize, R)>) -> Vec<R> {
    let mut slots: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for (i, r) in pairs {
        slots[i] = Some(r);
    }
    slots
        .into_iter()
        .map(|r| r.expect("every index produced"))
        .collect()
}

/// Most threads one `fetch_many` call uses (one per owner group).
pub const MAX_FETCH_THREADS: usize = 8;
