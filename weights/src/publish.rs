//! The publisher: puts one version of a state dict as buckets, hashes them,
//! returns the manifest, and retires old versions when their receivers are
//! done with them.
//!
//! A publish copies every tensor once, straight into its bucket's storage
//! (`Node::put_with`: the transport's pool under `storage = "pool"`), and
//! hashes the bucket while its bytes are still in cache; buckets are put in
//! parallel. A failed publish removes the buckets it had put.
//!
//! ## Retiring versions
//! Version N stays until it is not the newest and one of these holds:
//! every receiver the publisher knows ([`Publisher::expect`], or that
//! reported through [`Publisher::committed`]) committed a newer version;
//! [`PublishOptions::grace`] passed since a newer version was published (a
//! dead receiver never blocks the others); or more than
//! [`PublishOptions::keep_versions`] versions are held. Checked at every
//! publish, every commit report and every [`Publisher::sweep`]. Removal
//! goes through the node (`Node::remove`), which reaches every relay copy
//! the transports made.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use shardport_abi::{DType, ShardId};
use shardport_host::{
    node::{Pinned, WeakNode},
    Handle, Node, TensorSpec,
};

use crate::{
    error::WeightsError,
    manifest::{byte_len, Bucket, Entry, Manifest, MAX_NAME, MAX_TENSORS},
    plan::{self, Plan},
    split::{self, Item, Split},
    work,
};

/// Default [`PublishOptions::bucket_size`]: 16 MiB, large enough that a
/// bucket's join and request are a small part of its transfer over any
/// link, small enough that a few buckets of a 64 MiB state dict move in
/// parallel and that a receiver's first bytes arrive early.
pub const DEFAULT_BUCKET_SIZE: u64 = 16 << 20;
/// Default [`PublishOptions::keep_versions`]: the newest and the one before,
/// which receivers still updating may be reading.
pub const DEFAULT_KEEP_VERSIONS: usize = 2;
/// Default [`PublishOptions::grace`]: a minute after a newer version, the
/// longest a live receiver should take to move to it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// One tensor to publish: its name, dtype, shape and dense bytes.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    /// State-dict key.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: &'a [u64],
    /// The bytes, C-contiguous (`byte_len(dtype, shape)` of them).
    pub bytes: &'a [u8],
}

/// How a [`Publisher`] packs and keeps versions.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// Largest bucket of packed tensors; a tensor larger than this is a
    /// bucket of its own.
    pub bucket_size: u64,
    /// Tags of every bucket (what the node's routes and the transports'
    /// relay rules match on).
    pub tags: BTreeMap<String, String>,
    /// Most versions held at once (at least 1).
    pub keep_versions: usize,
    /// How long an older version outlives the publish of a newer one when
    /// some receiver has not reported committing it.
    pub grace: Duration,
    /// Buckets put at once.
    pub threads: usize,
}

impl Default for PublishOptions {
    fn default() -> Self {
        PublishOptions {
            bucket_size: DEFAULT_BUCKET_SIZE,
            tags: BTreeMap::new(),
            keep_versions: DEFAULT_KEEP_VERSIONS,
            grace: DEFAULT_GRACE,
            threads: default_threads(),
        }
    }
}

/// Worker threads for parallel bucket work: the machine's cores, at most 8.
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(8))
}

/// Publishes versions of one state dict from the node that owns them.
///
/// It holds its node weakly: shutting the node down ends the publisher
/// (its calls then fail with [`WeightsError::Closed`]), and dropping the
/// publisher removes every version it holds.
pub struct Publisher {
    node: WeakNode,
    opts: PublishOptions,
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    /// Versions held, oldest first.
    held: VecDeque<Held>,
    /// Receivers and the newest version each reported committing.
    receivers: BTreeMap<String, Option<u64>>,
    /// The newest version ever published (versions only move forward).
    newest: Option<u64>,
}

#[derive(Debug)]
struct Held {
    version: u64,
    ids: Vec<ShardId>,
    /// When a newer version was published.
    superseded: Option<Instant>,
}

impl Publisher {
    /// A publisher putting its buckets through `node`.
    pub fn new(node: &Node, opts: PublishOptions) -> Publisher {
        Publisher {
            node: node.downgrade(),
            opts,
            book: Mutex::default(),
        }
    }

    /// Publishes `tensors` as `version` (greater than every version
    /// published before) and returns its manifest. Older versions that may
    /// go are retired.
    pub fn publish(&self, version: u64, tensors: &[Tensor<'_>]) -> Result<Manifest, WeightsError> {
        self.publish_split(version, tensors, &Split::default())
    }

    /// [`publish`](Self::publish) with the tensors named by `split` in
    /// parts, one per tensor-parallel rank of the receivers
    /// ([`crate::split`]): a receiver taking part `i` fetches only the
    /// buckets of part `i` and of the tensors published whole.
    pub fn publish_split(
        &self,
        version: u64,
        tensors: &[Tensor<'_>],
        split: &Split,
    ) -> Result<Manifest, WeightsError> {
        if let Some(newest) = lock(&self.book).newest {
            if version <= newest {
                return Err(WeightsError::Publish {
                    version,
                    what: format!("versions move forward; version {newest} was published"),
                });
            }
        }
        check_tensors(version, tensors)?;
        let items =
            split::items(tensors, split).map_err(|what| WeightsError::Publish { version, what })?;
        let lens: Vec<u64> = items.iter().map(|i| i.src.len() as u64).collect();
        let groups: Vec<u32> = items.iter().map(Item::group).collect();
        let node = self.node()?;
        let plan = plan::pack_groups(&lens, &groups, self.opts.bucket_size);
        let puts = self.put_buckets(&node, version, &items, &plan);
        let mut buckets = Vec::with_capacity(puts.len());
        let mut failed = None;
        for (b, r) in puts.into_iter().enumerate() {
            match r {
                Ok(bucket) => buckets.push(bucket),
                Err(e) => failed = failed.or(Some((b, e))),
            }
        }
        let ids: Vec<ShardId> = buckets.iter().map(|b| b.handle.id).collect();
        if let Some((bucket, source)) = failed {
            node.remove(&ids);
            return Err(WeightsError::Put {
                version,
                bucket,
                tensors: names_of(&items, &plan, bucket),
                source: Box::new(source),
            });
        }
        let manifest = Manifest {
            version,
            buckets,
            tensors: items
                .iter()
                .zip(&plan.places)
                .map(|(t, &(bucket, offset))| Entry {
                    name: t.name.to_owned(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    bucket,
                    offset,
                    part: t.part,
                })
                .collect(),
        };
        let now = Instant::now();
        let mut book = lock(&self.book);
        if let Some(prev) = book.held.back_mut() {
            prev.superseded = Some(now);
        }
        book.held.push_back(Held {
            version,
            ids,
            superseded: None,
        });
        book.newest = Some(version);
        self.retire(book, now);
        tracing::info!(target: "weights", version, buckets = manifest.buckets.len(), tensors = manifest.tensors.len(), bytes = manifest.total_bytes(), "published");
        Ok(manifest)
    }

    /// Puts every bucket of `plan`, in parallel; one result per bucket.
    /// Every bucket goes through the config generation of the first: a
    /// reload during the publish does not split one version across two.
    fn put_buckets(
        &self,
        node: &Node,
        version: u64,
        tensors: &[Item<'_>],
        plan: &Plan,
    ) -> Vec<Result<Bucket, shardport_host::HostError>> {
        let node = node.pinned();
        let node = &node;
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); plan.buckets.len()];
        for (i, &(b, _)) in plan.places.iter().enumerate() {
            members[b as usize].push(i);
        }
        let results = work::each_index(
            plan.buckets.len(),
            self.opts.threads,
            |b| self.put_bucket(node, plan.buckets[b], &members[b], tensors, plan),
            |_| false,
        );
        tracing::debug!(target: "weights", version, buckets = plan.buckets.len(), "buckets put");
        results
            .into_iter()
            .map(|r| r.expect("every bucket was put"))
            .collect()
    }

    fn put_bucket(
        &self,
        node: &Pinned<'_>,
        len: u64,
        members: &[usize],
        tensors: &[Item<'_>],
        plan: &Plan,
    ) -> Result<Bucket, shardport_host::HostError> {
        let mut hash = [0u8; 32];
        let handle: Handle =
            node.put_with(&TensorSpec::bytes(len), self.opts.tags.clone(), |dst| {
                // Every byte is written: the tensors, and zeros between
                // them (pool memory may hold an earlier shard's bytes).
                let mut at = 0usize;
                for &i in members {
                    let off = plan.places[i].1 as usize;
                    let src = &tensors[i].src;
                    dst[at..off].fill(0);
                    src.write(&mut dst[off..off + src.len()]);
                    at = off + src.len();
                }
                dst[at..].fill(0);
                hash = *blake3::hash(dst).as_bytes();
            })?;
        Ok(Bucket { handle, hash })
    }

    /// The receivers whose commits decide when a version may go (replaces
    /// the set; what they reported before is kept for those still named).
    pub fn expect<I: IntoIterator<Item = S>, S: Into<String>>(&self, receivers: I) {
        let mut book = lock(&self.book);
        let old = std::mem::take(&mut book.receivers);
        for r in receivers {
            let r = r.into();
            let seen = old.get(&r).copied().flatten();
            book.receivers.insert(r, seen);
        }
        self.retire(book, Instant::now());
    }

    /// Stops waiting for `receiver` (it died or left); returns the versions
    /// this retired.
    pub fn forget(&self, receiver: &str) -> Vec<u64> {
        let mut book = lock(&self.book);
        book.receivers.remove(receiver);
        self.retire(book, Instant::now())
    }

    /// Records that `receiver` committed `version`; returns the versions
    /// this retired.
    pub fn committed(&self, receiver: &str, version: u64) -> Vec<u64> {
        let mut book = lock(&self.book);
        let seen = book.receivers.entry(receiver.to_owned()).or_insert(None);
        *seen = Some(seen.map_or(version, |v| v.max(version)));
        self.retire(book, Instant::now())
    }

    /// Retires what may go now (a grace period that ran out); returns the
    /// versions retired.
    pub fn sweep(&self) -> Vec<u64> {
        self.retire(lock(&self.book), Instant::now())
    }

    /// Removes every version this publisher holds.
    pub fn retire_all(&self) -> Vec<u64> {
        let held: Vec<Held> = lock(&self.book).held.drain(..).collect();
        if let Some(node) = self.node.upgrade() {
            for h in &held {
                node.remove(&h.ids);
            }
        }
        held.iter().map(|h| h.version).collect()
    }

    /// The versions held, oldest first.
    pub fn versions(&self) -> Vec<u64> {
        lock(&self.book).held.iter().map(|h| h.version).collect()
    }

    /// The node the buckets are put through, while it runs.
    pub fn node(&self) -> Result<Node, WeightsError> {
        self.node.upgrade().ok_or(WeightsError::Closed)
    }

    fn retire(&self, mut book: MutexGuard<'_, Book>, now: Instant) -> Vec<u64> {
        let gone = retirable(&book, &self.opts, now);
        let mut removed = Vec::with_capacity(gone.len());
        for i in gone.into_iter().rev() {
            if let Some(h) = book.held.remove(i) {
                removed.push(h);
            }
        }
        drop(book);
        removed.reverse();
        let node = self.node.upgrade();
        for h in &removed {
            if let Some(node) = &node {
                node.remove(&h.ids);
            }
            tracing::info!(target: "weights", version = h.version, buckets = h.ids.len(), "retired");
        }
        removed.iter().map(|h| h.version).collect()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.retire_all();
    }
}

/// Indices (ascending) of the held versions that may be removed at `now`.
fn retirable(book: &Book, opts: &PublishOptions, now: Instant) -> Vec<usize> {
    let n = book.held.len();
    let over = n.saturating_sub(opts.keep_versions.max(1));
    let mut out = Vec::new();
    for (i, h) in book.held.iter().enumerate().take(n.saturating_sub(1)) {
        let all_moved_on = !book.receivers.is_empty()
            && book
                .receivers
                .values()
                .all(|c| c.is_some_and(|c| c > h.version));
        let grace_over = h
            .superseded
            .is_some_and(|t| now.saturating_duration_since(t) >= opts.grace);
        if i < over || all_moved_on || grace_over {
            out.push(i);
        }
    }
    out
}

/// Checks what a publish was given; the byte length of every tensor.
fn check_tensors(version: u64, tensors: &[Tensor<'_>]) -> Result<Vec<u64>, WeightsError> {
    let bad = |what: String| WeightsError::Publish { version, what };
    if tensors.len() > MAX_TENSORS {
        return Err(bad(format!(
            "{} tensors, at most {MAX_TENSORS}",
            tensors.len()
        )));
    }
    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    let mut lens = Vec::with_capacity(tensors.len());
    for t in tensors {
        if t.name.is_empty() || t.name.len() > MAX_NAME {
            return Err(bad(format!(
                "tensor name {:?}: 1 to {MAX_NAME} bytes",
                t.name
            )));
        }
        if !names.insert(t.name) {
            return Err(bad(format!("tensor {:?} is named twice", t.name)));
        }
        if t.shape.len() > shardport_host::vocab::MAX_DIMS {
            return Err(bad(format!(
                "tensor {:?}: {} dimensions",
                t.name,
                t.shape.len()
            )));
        }
        let len = byte_len(t.dtype, t.shape).ok_or_else(|| {
            bad(format!(
                "tensor {:?}: dtype {} and shape {:?} have no byte length",
                t.name, t.dtype, t.shape
            ))
        })?;
        if len != t.bytes.len() as u64 {
            return Err(bad(format!(
                "tensor {:?}: dtype {} and shape {:?} are {len} bytes; {} were given",
                t.name,
                t.dtype,
                t.shape,
                t.bytes.len()
            )));
        }
        lens.push(len);
    }
    Ok(lens)
}

fn names_of(tensors: &[Item<'_>], plan: &Plan, bucket: usize) -> String {
    let names: Vec<&str> = tensors
        .iter()
        .zip(&plan.places)
        .filter(|(_, p)| p.0 as usize == bucket)
        .map(|(t, _)| t.name)
        .take(4)
        .collect();
    names.join(", ")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(
        versions: &[(u64, Option<u64>)],
        receivers: &[(&str, Option<u64>)],
        t0: Instant,
    ) -> Book {
        Book {
            held: versions
                .iter()
                .map(|&(version, sup)| Held {
                    version,
                    ids: Vec::new(),
                    superseded: sup.map(|s| t0 + Duration::from_secs(s)),
                })
                .collect(),
            receivers: receivers.iter().map(|&(n, c)| (n.to_owned(), c)).collect(),
            newest: versions.last().map(|v| v.0),
        }
    }

    #[test]
    fn a_version_stays_until_every_receiver_moved_on_or_the_grace_ran_out() {
        let t0 = Instant::now();
        let opts = PublishOptions {
            keep_versions: 3,
            grace: Duration::from_secs(60),
            ..PublishOptions::default()
        };
        let b = book(
            &[(1, Some(0)), (2, None)],
            &[("a", Some(2)), ("b", Some(1))],
            t0,
        );
        // "b" still reads version 1 (it may be updating to 2).
        assert!(retirable(&b, &opts, t0 + Duration::from_secs(10)).is_empty());
        // b is dead: the grace runs out.
        assert_eq!(retirable(&b, &opts, t0 + Duration::from_secs(60)), vec![0]);
        let b = book(
            &[(1, Some(0)), (2, None)],
            &[("a", Some(2)), ("b", Some(2))],
            t0,
        );
        assert_eq!(retirable(&b, &opts, t0), vec![0]);
        // The newest is never retired, whatever the receivers say.
        let b = book(&[(2, None)], &[("a", Some(5))], t0);
        assert!(retirable(&b, &opts, t0 + Duration::from_secs(999)).is_empty());
    }

    #[test]
    fn no_more_than_keep_versions_are_held() {
        let t0 = Instant::now();
        let opts = PublishOptions {
            keep_versions: 2,
            ..PublishOptions::default()
        };
        let b = book(&[(1, Some(0)), (2, Some(1)), (3, None)], &[("a", None)], t0);
        assert_eq!(retirable(&b, &opts, t0 + Duration::from_secs(2)), vec![0]);
    }

    #[test]
    fn bad_tensors_are_refused_naming_the_tensor() {
        let b = [0u8; 8];
        let t = |name, shape: &'static [u64]| Tensor {
            name,
            dtype: DType::F32,
            shape,
            bytes: &b,
        };
        let e = check_tensors(1, &[t("w", &[2]), t("w", &[2])]).unwrap_err();
        assert!(e.to_string().contains("\"w\" is named twice"), "{e}");
        let e = check_tensors(1, &[t("x", &[3])]).unwrap_err();
        assert!(
            e.to_string().contains("\"x\"") && e.to_string().contains("12 bytes; 8"),
            "{e}"
        );
        assert_eq!(check_tensors(1, &[t("y", &[2])]).unwrap(), vec![8]);
    }
}
