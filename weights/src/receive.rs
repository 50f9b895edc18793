//! The receiver: takes a version into the caller's tensors, in place and
//! whole.
//!
//! An update runs in two phases.
//! 1. **Fetch and verify.** Every bucket is fetched (in parallel, a view
//!    of the owner's memory where a same-node transport offers one, else a
//!    copy from the owner or a relay) and checked against the manifest's
//!    BLAKE3 hash as it arrives, so verification overlaps the transfer of
//!    the other buckets. Nothing is written yet: any failure (a bucket
//!    gone, a peer dead, bytes that do not hash) ends the update with the
//!    receiver's tensors and version untouched.
//! 2. **Commit.** With every bucket held and verified, nothing can fail:
//!    each tensor is copied from its bucket into its destination (in
//!    parallel, large tensors split across threads), and the version moves.
//!
//! What the atomicity costs: the bytes of the update held at once until the
//! commit (copies from the node's shelf of copy buffers; a same-node view
//! holds a lease and no memory), and one copy into place, at memory speed.
//!
//! Bytes read straight from the owner's memory on this machine (a
//! posix-shm view) are the owner's own and are not hashed under the
//! default [`Verify::Fetched`]; [`Verify::Always`] hashes them too.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
    time::{Duration, Instant},
};

use shardport_abi::DType;
use shardport_host::{node::WeakNode, FetchMode, Fetched, Node};

use crate::{
    error::WeightsError,
    manifest::{Entry, Manifest},
    publish::default_threads,
    work,
};

/// Which fetched buckets are hashed before they count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// Every bucket except those read as a view of the owner's own memory
    /// on this machine.
    #[default]
    Fetched,
    /// Every bucket.
    Always,
}

/// Default [`ReceiveOptions::fetches`]: 4 buckets in flight, whatever the
/// cores (a fetch over the network waits on its link, and a bucket whose
/// fetch starts late adds its relay chain's fill time), as many as the
/// http transport's connections to one owner (`max-connections-per-owner`).
/// Measured on the simulated cluster: 16 in flight made 64 relay chains
/// share each link, some streams stalled past the owner's `idle-timeout`
/// and a 1 GiB update to 4 receivers failed; 4 took it in 1.09 times one
/// link's time, and 16 receivers of 67.5 MiB in 1.06 times 8 receivers'.
pub const DEFAULT_FETCHES: usize = 4;

/// How a [`Receiver`] takes updates.
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// Buckets fetched (and verified) at once.
    pub fetches: usize,
    /// Threads of the commit's copies.
    pub threads: usize,
    /// Which buckets are hashed.
    pub verify: Verify,
    /// Take only the tensors the receiver has (a rank that holds part of a
    /// model): tensors of the manifest without a destination are skipped,
    /// and so is every bucket holding only those.
    pub partial: bool,
    /// `(index, count)`: this receiver is tensor-parallel rank `index` of
    /// `count` and takes part `index` of every tensor published in parts
    /// ([`crate::split`]); the other parts' buckets are not fetched.
    pub part: Option<(u32, u32)>,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            fetches: DEFAULT_FETCHES,
            threads: default_threads(),
            verify: Verify::default(),
            partial: false,
            part: None,
        }
    }
}

/// One destination tensor of the receiver, by state-dict name.
#[derive(Debug)]
pub struct Target<'a> {
    /// State-dict key.
    pub name: String,
    /// Element type (must be the published one).
    pub dtype: DType,
    /// Dimensions (must be the published ones).
    pub shape: Vec<u64>,
    /// Element strides, `None` for C-contiguous.
    pub strides: Option<Vec<u64>>,
    /// The destination's memory: from its first element to past its last.
    pub bytes: &'a mut [u8],
}

/// What an update did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// The version the receiver is now on.
    pub version: u64,
    /// False when the receiver already had this version (nothing moved).
    pub changed: bool,
    /// Buckets fetched.
    pub buckets: usize,
    /// Bytes fetched.
    pub bytes: u64,
    /// Buckets whose hash was checked.
    pub verified: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Buckets by the transport that served them.
    pub transports: BTreeMap<String, usize>,
    /// Time fetching and verifying.
    pub fetch: Duration,
    /// Time copying into place.
    pub commit: Duration,
}

/// Takes versions of a state dict into the caller's tensors.
///
/// It holds its node weakly: once the node is shut down, updates fail with
/// [`WeightsError::Closed`].
pub struct Receiver {
    node: WeakNode,
    opts: ReceiveOptions,
    /// The committed version; held for the whole of an update, so updates
    /// of one receiver never interleave.
    version: Mutex<Option<u64>>,
}

impl Receiver {
    /// A receiver fetching through `node`.
    pub fn new(node: &Node, opts: ReceiveOptions) -> Receiver {
        Receiver {
            node: node.downgrade(),
            opts,
            version: Mutex::new(None),
        }
    }

    /// The version committed last (`None` before the first update).
    pub fn version(&self) -> Option<u64> {
        *self.version.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `manifest`'s version into `targets`: all of it, or (on any
    /// error) nothing. A version older than the committed one is refused;
    /// the committed one again is a no-op. Versions in between need not
    /// have been seen: each manifest is whole.
    pub fn update(
        &self,
        manifest: &Manifest,
        targets: &mut [Target<'_>],
    ) -> Result<Update, WeightsError> {
        let mut version = self.version.lock().unwrap_or_else(|p| p.into_inner());
        let v = manifest.version;
        match *version {
            Some(have) if v < have => return Err(WeightsError::Stale { got: v, have }),
            Some(have) if v == have => return Ok(Update::unchanged(v)),
            _ => {}
        }
        let pairs = match_targets(manifest, targets, self.opts.partial, self.opts.part)?;
        let node = self.node.upgrade().ok_or(WeightsError::Closed)?;
        let mut needed: Vec<usize> = pairs
            .iter()
            .map(|&(_, e)| manifest.tensors[e].bucket as usize)
            .collect();
        needed.sort_unstable();
        needed.dedup();

        let t0 = Instant::now();
        let fetched = self.fetch_all(&node, manifest, &needed)?;
        drop(node);
        let fetch = t0.elapsed();

        let t1 = Instant::now();
        let mut by_bucket: HashMap<usize, &[u8]> = HashMap::with_capacity(needed.len());
        for (b, f) in &fetched {
            by_bucket.insert(*b, &f.0.data[..]);
        }
        commit(manifest, targets, &pairs, &by_bucket, self.opts.threads);
        let commit = t1.elapsed();
        *version = Some(v);

        let mut transports = BTreeMap::new();
        for (_, (f, _)) in &fetched {
            *transports.entry(f.selection.transport.clone()).or_insert(0) += 1;
        }
        let up = Update {
            version: v,
            changed: true,
            buckets: fetched.len(),
            bytes: fetched.iter().map(|(_, (f, _))| f.data.len() as u64).sum(),
            verified: fetched.iter().filter(|(_, (_, checked))| *checked).count(),
            tensors: pairs.len(),
            transports,
            fetch,
            commit,
        };
        tracing::info!(target: "weights", version = v, buckets = up.buckets, bytes = up.bytes, fetch_ms = fetch.as_millis() as u64, commit_ms = commit.as_millis() as u64, "updated");
        Ok(up)
    }

    /// Fetches and verifies the `needed` buckets, in parallel; each with
    /// whether it was hashed. The first failure (lowest bucket) on error.
    #[allow(clippy::type_complexity)]
    fn fetch_all(
        &self,
        node: &Node,
        m: &Manifest,
        needed: &[usize],
    ) -> Result<Vec<(usize, (Fetched, bool))>, WeightsError> {
        let slots = work::each_index(
            needed.len(),
            self.opts.fetches,
            |i| self.fetch_one(node, m, needed[i]),
            Result::is_err,
        );
        let mut out = Vec::with_capacity(needed.len());
        for (i, slot) in slots.into_iter().enumerate() {
            match slot {
                Some(Ok(f)) => out.push((needed[i], f)),
                Some(Err(e)) => return Err(e),
                // Not tried: an earlier failure stopped the workers; that
                // failure is in a slot of its own.
                None => {}
            }
        }
        debug_assert_eq!(
            out.len(),
            needed.len(),
            "a bucket is skipped only after another failed"
        );
        Ok(out)
    }

    fn fetch_one(
        &self,
        node: &Node,
        m: &Manifest,
        b: usize,
    ) -> Result<(Fetched, bool), WeightsError> {
        let bucket = &m.buckets[b];
        let f = node
            .fetch_mode(&bucket.handle, FetchMode::View)
            .map_err(|source| WeightsError::Fetch {
                version: m.version,
                bucket: b,
                tensors: m.names_in(b),
                source: Box::new(source),
            })?;
        let check = self.opts.verify == Verify::Always || !f.data.is_view();
        if check && blake3::hash(&f.data).as_bytes() != &bucket.hash {
            return Err(WeightsError::Corrupt {
                version: m.version,
                bucket: b,
                tensors: m.names_in(b),
                via: format!("{} ({})", f.selection.transport, f.selection.reason),
            });
        }
        Ok((f, check))
    }
}

impl Update {
    /// The report of an update to the version already committed.
    fn unchanged(version: u64) -> Update {
        Update {
            version,
            changed: false,
            buckets: 0,
            bytes: 0,
            verified: 0,
            tensors: 0,
            transports: BTreeMap::new(),
            fetch: Duration::ZERO,
            commit: Duration::ZERO,
        }
    }
}

/// `(target index, entry index)` of every tensor to write, or every
/// mismatch between the manifest and the targets.
fn match_targets(
    m: &Manifest,
    targets: &[Target<'_>],
    partial: bool,
    part: Option<(u32, u32)>,
) -> Result<Vec<(usize, usize)>, WeightsError> {
    let mut problems = Vec::new();
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(targets.len());
    for (i, t) in targets.iter().enumerate() {
        if by_name.insert(t.name.as_str(), i).is_some() {
            problems.push((t.name.clone(), "given twice as a destination".to_owned()));
        }
    }
    let mut pairs = Vec::with_capacity(targets.len());
    let mut seen = vec![false; targets.len()];
    let mut told = std::collections::HashSet::new();
    for (e, entry) in m.tensors.iter().enumerate() {
        if let Some(p) = entry.part {
            let ours = match part {
                Some((i, n)) if n == p.count => p.index == i,
                _ => {
                    if by_name.contains_key(entry.name.as_str()) && told.insert(entry.name.as_str())
                    {
                        let have = part.map_or("takes whole tensors".to_owned(), |(i, n)| {
                            format!("takes part {i} of {n}")
                        });
                        problems.push((
                            entry.name.clone(),
                            format!("published in {} parts; this receiver {have}", p.count),
                        ));
                        seen[by_name[entry.name.as_str()]] = true;
                    }
                    false
                }
            };
            if !ours {
                continue;
            }
        }
        let Some(&t) = by_name.get(entry.name.as_str()) else {
            if !partial {
                problems.push((
                    entry.name.clone(),
                    format!("in version {} but not in this receiver", m.version),
                ));
            }
            continue;
        };
        seen[t] = true;
        match fits(entry, &targets[t]) {
            Ok(()) => pairs.push((t, e)),
            Err(why) => problems.push((entry.name.clone(), why)),
        }
    }
    for (t, _) in seen.iter().enumerate().filter(|(_, s)| !**s) {
        problems.push((
            targets[t].name.clone(),
            format!("not in version {}", m.version),
        ));
    }
    if problems.is_empty() {
        Ok(pairs)
    } else {
        Err(WeightsError::Mismatch { problems })
    }
}

/// Whether `t` can take `e`'s bytes.
fn fits(e: &Entry, t: &Target<'_>) -> Result<(), String> {
    if e.dtype != t.dtype {
        return Err(format!("dtype {} published, {} here", e.dtype, t.dtype));
    }
    if e.shape != t.shape {
        return Err(format!("shape {:?} published, {:?} here", e.shape, t.shape));
    }
    let len = e.byte_len().expect("a checked manifest has byte lengths");
    let need = match &t.strides {
        None => len,
        Some(s) => strided_extent(e.dtype, &t.shape, s)?,
    };
    if (t.bytes.len() as u64) < need {
        return Err(format!(
            "the destination has {} bytes; {need} are needed",
            t.bytes.len()
        ));
    }
    Ok(())
}

/// Bytes from the first to past the last element of a strided tensor.
fn strided_extent(dtype: DType, shape: &[u64], strides: &[u64]) -> Result<u64, String> {
    if strides.len() != shape.len() {
        return Err(format!(
            "{} strides for {} dimensions",
            strides.len(),
            shape.len()
        ));
    }
    let bits = dtype.bits().unwrap_or(0);
    if bits % 8 != 0 {
        return Err(format!("a strided destination of dtype {dtype}"));
    }
    if shape.contains(&0) {
        return Ok(0);
    }
    if shape.iter().zip(strides).any(|(&d, &s)| d > 1 && s == 0) {
        return Err("a destination whose elements overlap (a stride of 0)".into());
    }
    let last = shape
        .iter()
        .zip(strides)
        .try_fold(0u64, |acc, (&d, &s)| {
            (d - 1).checked_mul(s)?.checked_add(acc)
        })
        .ok_or("strides overflow")?;
    (last + 1)
        .checked_mul(u64::from(bits / 8))
        .ok_or_else(|| "strides overflow".to_owned())
}

/// Copies smaller than this are not split across threads.
const SPLIT: usize = 8 << 20;

/// Writes every pair's bytes into place, in parallel. Cannot fail: every
/// pair was checked to fit and every bucket is held.
fn commit(
    m: &Manifest,
    targets: &mut [Target<'_>],
    pairs: &[(usize, usize)],
    buckets: &HashMap<usize, &[u8]>,
    threads: usize,
) {
    let entry_of: HashMap<usize, usize> = pairs.iter().copied().collect();
    let mut jobs: Vec<Job<'_, '_>> = Vec::new();
    for (t, target) in targets.iter_mut().enumerate() {
        let Some(&e) = entry_of.get(&t) else { continue };
        let entry = &m.tensors[e];
        let len = entry.byte_len().expect("checked") as usize;
        let off = entry.offset as usize;
        let src = &buckets[&(entry.bucket as usize)][off..off + len];
        match &target.strides {
            Some(s) if !is_c_contiguous(&target.shape, s) => jobs.push(Job::Strided {
                dst: &mut target.bytes[..],
                src,
                shape: &target.shape,
                strides: s,
                item: (entry.dtype.bits().expect("checked") / 8) as usize,
            }),
            _ => {
                let dst = &mut target.bytes[..len];
                for (d, s) in dst.chunks_mut(SPLIT).zip(src.chunks(SPLIT)) {
                    jobs.push(Job::Dense { dst: d, src: s });
                }
            }
        }
    }
    // Largest first, each to the least loaded thread.
    jobs.sort_by_key(|j| std::cmp::Reverse(j.len()));
    let n = threads.clamp(1, jobs.len().max(1));
    let mut lanes: Vec<(usize, Vec<Job<'_, '_>>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for j in jobs {
        let lane = lanes
            .iter_mut()
            .min_by_key(|(load, _)| *load)
            .expect("at least one lane");
        lane.0 += j.len();
        lane.1.push(j);
    }
    std::thread::scope(|s| {
        let mut lanes = lanes.into_iter();
        let first = lanes.next();
        for (_, lane) in lanes {
            s.spawn(move || lane.into_iter().for_each(Job::run));
        }
        if let Some((_, lane)) = first {
            lane.into_iter().for_each(Job::run);
        }
    });
}

enum Job<'d, 's> {
    Dense {
        dst: &'d mut [u8],
        src: &'s [u8],
    },
    Strided {
        dst: &'d mut [u8],
        src: &'s [u8],
        shape: &'d [u64],
        strides: &'d [u64],
        item: usize,
    },
}

impl Job<'_, '_> {
    fn len(&self) -> usize {
        match self {
            Job::Dense { src, .. } | Job::Strided { src, .. } => src.len(),
        }
    }

    fn run(self) {
        match self {
            Job::Dense { dst, src } => dst.copy_from_slice(src),
            Job::Strided {
                dst,
                src,
                shape,
                strides,
                item,
            } => scatter(dst, src, shape, strides, item),
        }
    }
}

fn is_c_contiguous(shape: &[u64], strides: &[u64]) -> bool {
    let mut expect = 1u64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expect {
            return false;
        }
        expect *= d;
    }
    true
}

/// Copies the C-ordered `src` into `dst` laid out by element `strides`.
fn scatter(dst: &mut [u8], src: &[u8], shape: &[u64], strides: &[u64], item: usize) {
    let Some((&inner, outer)) = shape.split_last() else {
        dst[..item].copy_from_slice(&src[..item]);
        return;
    };
    let inner = inner as usize;
    let s_inner = strides[strides.len() - 1] as usize * item;
    let row = inner * item;
    let rows: usize = outer.iter().map(|&d| d as usize).product();
    let mut idx = vec![0u64; outer.len()];
    for r in 0..rows {
        let base: usize = idx
            .iter()
            .zip(strides)
            .map(|(&i, &s)| i as usize * s as usize * item)
            .sum();
        let from = &src[r * row..(r + 1) * row];
        if s_inner == item {
            dst[base..base + row].copy_from_slice(from);
        } else {
            for (k, el) in from.chunks_exact(item).enumerate() {
                let at = base + k * s_inner;
                dst[at..at + item].copy_from_slice(el);
            }
        }
        // Next index, last outer dimension fastest.
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < outer[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests;
