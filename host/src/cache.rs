//! The consumer cache: fetched shards kept per policy until drained.
//!
//! Policies combine: `explicit` (kept until `drain(ids)` / `clear()`), `lru`
//! with a byte budget, `ttl`. Eviction decisions are a pure function of the
//! entries and an injected `now` ([`evictions`]), so they are property-tested
//! without sleeping. An entry whose bytes someone still holds (a live lease on
//! a zero-copy view, or an owned buffer shared with a caller) is never
//! evicted: evicting it would free nothing and break "leased memory is never
//! reclaimed". Cleanup never fails a request: it runs after the fetch
//! succeeded and cannot return an error.

use std::{collections::HashMap, sync::Arc};

use shardport_abi::{ShardId, ShardMeta};

use crate::vocab::ShardBytes;

use crate::vocab::CachePolicy as Policy;

/// One entry as the pure decision function sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryView {
    /// Shard id.
    pub id: ShardId,
    /// Bytes it holds.
    pub bytes: u64,
    /// Fetch time (monotonic ns).
    pub inserted_ns: u64,
    /// Last hit (monotonic ns).
    pub used_ns: u64,
    /// Someone besides the cache holds the bytes.
    pub held: bool,
}

/// The ids to evict at `now_ns`: expired entries first, then least recently
/// used ones until the unheld bytes fit the budget. Held entries never.
pub fn evictions(entries: &[EntryView], policy: &Policy, now_ns: u64) -> Vec<ShardId> {
    let mut out = Vec::new();
    let mut keep: Vec<&EntryView> = Vec::with_capacity(entries.len());
    for e in entries {
        let expired = policy
            .ttl
            .is_some_and(|ttl| now_ns.saturating_sub(e.inserted_ns) > ttl.as_nanos() as u64);
        if expired && !e.held {
            out.push(e.id);
        } else {
            keep.push(e);
        }
    }
    if let Some(max) = policy.max_bytes {
        let mut total: u64 = keep.iter().map(|e| e.bytes).sum();
        if total > max {
            let mut lru: Vec<&&EntryView> = keep.iter().filter(|e| !e.held).collect();
            lru.sort_by_key(|e| (e.used_ns, e.inserted_ns, e.id));
            for e in lru {
                if total <= max {
                    break;
                }
                total -= e.bytes;
                out.push(e.id);
            }
        }
    }
    out
}

struct Entry {
    meta: ShardMeta,
    data: Arc<ShardBytes>,
    inserted_ns: u64,
    used_ns: u64,
}

/// Counters and gauges of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Entries.
    pub entries: usize,
    /// Bytes held.
    pub bytes: u64,
    /// Age of the oldest entry in ms.
    pub oldest_age_ms: u64,
    /// Entries whose bytes a caller still holds.
    pub held: usize,
    /// Evicted by TTL or LRU so far.
    pub evicted: u64,
    /// Removed by drain/clear so far.
    pub drained: u64,
    /// Hits so far.
    pub hits: u64,
}

/// The cache state (behind the node's cache mutex).
#[derive(Default)]
pub struct Cache {
    policy: Policy,
    entries: HashMap<ShardId, Entry>,
    evicted: u64,
    drained: u64,
    hits: u64,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("policy", &self.policy)
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// Bytes removed from the cache: dropped by the caller outside the lock
/// (dropping a view releases its lease, a plugin call).
pub type Removed = Vec<Arc<ShardBytes>>;

impl Cache {
    /// An empty cache with `policy`.
    pub fn new(policy: Policy) -> Self {
        Cache {
            policy,
            ..Cache::default()
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Replaces the policy (a config reload) and applies it now: a tighter
    /// limit evicts at once, by the policy (held entries stay); a disabled
    /// cache lets go of every entry. Returns what left.
    pub fn set_policy(&mut self, policy: Policy, now_ns: u64) -> Removed {
        self.policy = policy;
        if !self.policy.enabled {
            let removed: Removed = self.entries.drain().map(|(_, e)| e.data).collect();
            self.evicted += removed.len() as u64;
            return removed;
        }
        self.evict(now_ns)
    }

    /// A hit for `id` with matching metadata and kind (view or copy).
    pub fn get(
        &mut self,
        id: ShardId,
        meta: &ShardMeta,
        view: bool,
        now_ns: u64,
    ) -> Option<Arc<ShardBytes>> {
        if !self.policy.enabled {
            return None;
        }
        let e = self.entries.get_mut(&id)?;
        if e.meta != *meta || e.data.is_view() != view {
            return None;
        }
        e.used_ns = now_ns;
        self.hits += 1;
        Some(Arc::clone(&e.data))
    }

    /// Keeps a fetched shard, then applies the policy. Returns what left.
    pub fn insert(
        &mut self,
        id: ShardId,
        meta: ShardMeta,
        data: &Arc<ShardBytes>,
        now_ns: u64,
    ) -> Removed {
        if !self.policy.enabled {
            return Vec::new();
        }
        let mut removed: Removed = self
            .entries
            .insert(
                id,
                Entry {
                    meta,
                    data: Arc::clone(data),
                    inserted_ns: now_ns,
                    used_ns: now_ns,
                },
            )
            .map(|e| vec![e.data])
            .unwrap_or_default();
        removed.extend(self.evict(now_ns));
        removed
    }

    /// Applies TTL and LRU at `now_ns`.
    pub fn evict(&mut self, now_ns: u64) -> Removed {
        let views: Vec<EntryView> = self
            .entries
            .iter()
            .map(|(id, e)| EntryView {
                id: *id,
                bytes: e.meta.byte_len,
                inserted_ns: e.inserted_ns,
                used_ns: e.used_ns,
                // The cache's own reference is one; more means a caller holds it.
                held: Arc::strong_count(&e.data) > 1,
            })
            .collect();
        let ids = evictions(&views, &self.policy, now_ns);
        self.evicted += ids.len() as u64;
        ids.iter()
            .filter_map(|id| self.entries.remove(id).map(|e| e.data))
            .collect()
    }

    /// Removes `ids` (explicit drain). Returns what left.
    pub fn drain(&mut self, ids: &[ShardId]) -> Removed {
        let removed: Removed = ids
            .iter()
            .filter_map(|id| self.entries.remove(id).map(|e| e.data))
            .collect();
        self.drained += removed.len() as u64;
        removed
    }

    /// Removes everything.
    pub fn clear(&mut self) -> Removed {
        let removed: Removed = self.entries.drain().map(|(_, e)| e.data).collect();
        self.drained += removed.len() as u64;
        removed
    }

    /// Stats at `now_ns`.
    pub fn stats(&self, now_ns: u64) -> CacheStats {
        CacheStats {
            entries: self.entries.len(),
            bytes: self.entries.values().map(|e| e.meta.byte_len).sum(),
            oldest_age_ms: self
                .entries
                .values()
                .map(|e| now_ns.saturating_sub(e.inserted_ns) / 1_000_000)
                .max()
                .unwrap_or(0),
            held: self
                .entries
                .values()
                .filter(|e| Arc::strong_count(&e.data) > 1)
                .count(),
            evicted: self.evicted,
            drained: self.drained,
            hits: self.hits,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn e(id: u128, bytes: u64, inserted: u64, used: u64, held: bool) -> EntryView {
        EntryView {
            id: ShardId::from_u128(id),
            bytes,
            inserted_ns: inserted,
            used_ns: used,
            held,
        }
    }

    #[test]
    fn ttl_then_lru_never_held() {
        let p = Policy {
            enabled: true,
            max_bytes: Some(100),
            ttl: Some(Duration::from_nanos(50)),
        };
        let entries = [
            e(1, 60, 0, 0, false),   // expired
            e(2, 60, 0, 0, true),    // expired but held
            e(3, 60, 40, 45, false), // live, least recently used
            e(4, 60, 40, 90, false), // live, recent
        ];
        let ids: Vec<u128> = evictions(&entries, &p, 100)
            .iter()
            .map(|i| i.as_u128())
            .collect();
        // 1 expires; 2+3+4 = 180 > 100: 3 (LRU) goes, 2 is held, then 4 (120 > 100).
        assert_eq!(ids, vec![1, 3, 4]);
    }

    #[test]
    fn explicit_only_never_evicts() {
        let p = Policy {
            enabled: true,
            ..Policy::default()
        };
        assert!(evictions(&[e(1, u64::MAX, 0, 0, false)], &p, u64::MAX).is_empty());
    }

    proptest! {
        #[test]
        fn evictions_respect_holds_budget_and_ttl(
            entries in proptest::collection::vec((1u64..1000, 0u64..1000, 0u64..1000, any::<bool>()), 0..40),
            max in proptest::option::of(0u64..5000),
            ttl in proptest::option::of(0u64..1000),
            now in 0u64..2000,
        ) {
            let views: Vec<EntryView> = entries
                .iter()
                .enumerate()
                .map(|(i, &(b, ins, used, held))| e(i as u128, b, ins, ins.max(used), held))
                .collect();
            let p = Policy { enabled: true, max_bytes: max, ttl: ttl.map(Duration::from_nanos) };
            let out = evictions(&views, &p, now);
            let evicted = |v: &EntryView| out.contains(&v.id);
            // Never a held entry; never twice.
            prop_assert!(views.iter().filter(|v| evicted(v)).all(|v| !v.held));
            let mut sorted = out.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), out.len());
            let kept: Vec<&EntryView> = views.iter().filter(|v| !evicted(v)).collect();
            // No unheld expired entry survives.
            if let Some(t) = ttl {
                prop_assert!(kept.iter().all(|v| v.held || now.saturating_sub(v.inserted_ns) <= t));
            }
            // Within budget, unless only held entries are left over it.
            if let Some(m) = max {
                let total: u64 = kept.iter().map(|v| v.bytes).sum();
                prop_assert!(total <= m || kept.iter().all(|v| v.held));
                // LRU order: no kept unheld unexpired entry was used before an evicted LRU victim.
                let victims: Vec<&EntryView> = views.iter().filter(|v| evicted(v) && ttl.is_none_or(|t| now.saturating_sub(v.inserted_ns) <= t)).collect();
                for k in kept.iter().filter(|v| !v.held) {
                    for v in &victims {
                        prop_assert!((k.used_ns, k.inserted_ns, k.id) > (v.used_ns, v.inserted_ns, v.id));
                    }
                }
            } else if ttl.is_none() {
                prop_assert!(out.is_empty());
            }
        }
    }
}
