//! The worker's weight publishes and updates (`shardport bench weights`
//! and the end-to-end tests): a synthetic state dict of tensors of given
//! sizes, each filled with the pattern of its own seed, published through
//! a [`Publisher`] this worker keeps, and received by a [`Receiver`] into
//! destinations this worker keeps (allocated and written once per layout,
//! so a timed update finds them resident, as a model's parameters are).

use std::time::Instant;

use serde::Serialize;
use shardport_abi::DType;
use shardport_host::Node;
use shardport_weights::{
    Manifest, PublishOptions, Publisher, ReceiveOptions, Receiver, Target, Tensor, Verify,
};

use super::{check_pattern, fill_pattern, Reply};

/// What the worker keeps for weights.
#[derive(Default)]
pub(super) struct Weights {
    /// The published tensors: `(seed, sizes, bytes)`.
    source: Option<(u64, Vec<u64>, Vec<Vec<u8>>)>,
    publisher: Option<(Option<u64>, Publisher)>,
    receiver: Option<(bool, Receiver)>,
    /// The receiver's destinations, one per manifest tensor.
    dest: Vec<Vec<u8>>,
}

/// What an update did, for the bench.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default)]
pub struct UpdateReport {
    /// The version now committed.
    pub version: u64,
    /// Buckets fetched.
    pub buckets: usize,
    /// Buckets hashed.
    pub verified_buckets: usize,
    /// Bytes fetched.
    pub bytes: u64,
    /// Buckets per transport.
    pub transports: std::collections::BTreeMap<String, usize>,
    /// Fetch and verification, nanoseconds.
    pub fetch_ns: u64,
    /// Copies into place, nanoseconds.
    pub commit_ns: u64,
    /// Every tensor holds its pattern (when a seed was given).
    pub correct: Option<bool>,
    /// The same bytes copied from one resident buffer to another with the
    /// receiver's threads, best of three, nanoseconds (when asked).
    pub memcpy_ns: Option<u64>,
}

/// The seed of tensor `i` of a state dict seeded `seed`.
pub fn tensor_seed(seed: u64, i: usize) -> u64 {
    seed.wrapping_mul(1_000_003).wrapping_add(i as u64)
}

fn name(i: usize) -> String {
    format!("t{i}")
}

/// `publish`: the state dict of `sizes` (bytes per tensor, `u8`) filled
/// for `seed`, as `version`; replies with the manifest (hex) and the
/// publish time.
pub(super) fn publish(
    node: &Node,
    w: &mut Weights,
    version: u64,
    sizes: Vec<u64>,
    seed: u64,
    bucket_size: Option<u64>,
) -> Reply {
    if w.source
        .as_ref()
        .is_none_or(|(s, z, _)| *s != seed || *z != sizes)
    {
        w.source = None;
        let bufs = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let mut b = vec![0u8; len as usize];
                fill_pattern(&mut b, tensor_seed(seed, i));
                b
            })
            .collect();
        w.source = Some((seed, sizes, bufs));
    }
    if w.publisher.as_ref().is_none_or(|(b, _)| *b != bucket_size) {
        let mut opts = PublishOptions::default();
        if let Some(b) = bucket_size {
            opts.bucket_size = b;
        }
        w.publisher = Some((bucket_size, Publisher::new(node, opts)));
    }
    let (_, sizes, bufs) = w.source.as_ref().expect("just made");
    let names: Vec<String> = (0..sizes.len()).map(name).collect();
    let shapes: Vec<[u64; 1]> = sizes.iter().map(|&s| [s]).collect();
    let tensors: Vec<Tensor<'_>> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| Tensor {
            name: &names[i],
            dtype: DType::U8,
            shape: &shapes[i],
            bytes: b,
        })
        .collect();
    let t = Instant::now();
    let publisher = &w.publisher.as_ref().expect("just made").1;
    match publisher.publish(version, &tensors) {
        Ok(m) => Reply {
            ns: Some(t.elapsed().as_nanos() as u64),
            manifest: Some(hex::encode(m.to_bytes())),
            ..Reply::ok()
        },
        Err(e) => Reply::err(e),
    }
}

/// `update`: takes the manifest into this worker's destinations (made for
/// its layout first, untimed); with `prepare` only makes them. Checks the
/// patterns for `seed` afterwards, untimed.
pub(super) fn update(
    node: &Node,
    w: &mut Weights,
    manifest: &str,
    seed: Option<u64>,
    prepare: bool,
    memcpy: bool,
    verify_always: bool,
) -> Reply {
    let m = match hex::decode(manifest)
        .map_err(|e| e.to_string())
        .and_then(|b| Manifest::from_bytes(&b).map_err(|e| e.to_string()))
    {
        Ok(m) => m,
        Err(e) => return Reply::err(format!("bad manifest: {e}")),
    };
    let lens: Vec<usize> = m
        .tensors
        .iter()
        .map(|e| e.byte_len().unwrap_or(0) as usize)
        .collect();
    if w.dest.len() != lens.len() || w.dest.iter().zip(&lens).any(|(d, &l)| d.len() != l) {
        // Written once (not just reserved): resident before the clock starts.
        w.dest = lens.iter().map(|&l| vec![1u8; l]).collect();
    }
    if prepare {
        return Reply::ok();
    }
    if w.receiver.as_ref().is_none_or(|(v, _)| *v != verify_always) {
        let opts = ReceiveOptions {
            verify: if verify_always {
                Verify::Always
            } else {
                Verify::Fetched
            },
            ..ReceiveOptions::default()
        };
        w.receiver = Some((verify_always, Receiver::new(node, opts)));
    }
    let receiver = &w.receiver.as_ref().expect("just made").1;
    let mut targets: Vec<Target<'_>> = m
        .tensors
        .iter()
        .zip(w.dest.iter_mut())
        .map(|(e, d)| Target {
            name: e.name.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            strides: None,
            bytes: d,
        })
        .collect();
    let up = match receiver.update(&m, &mut targets) {
        Ok(u) => u,
        Err(e) => return Reply::err(e),
    };
    drop(targets);
    let correct = seed.map(|s| {
        m.tensors.iter().zip(&w.dest).all(|(e, d)| {
            let i: usize = e.name[1..].parse().unwrap_or(usize::MAX);
            check_pattern(d, tensor_seed(s, i))
        })
    });
    let memcpy_ns = memcpy.then(|| copy_limit(&mut w.dest, ReceiveOptions::default().threads));
    let report = UpdateReport {
        version: up.version,
        buckets: up.buckets,
        verified_buckets: up.verified,
        bytes: up.bytes,
        transports: up.transports,
        fetch_ns: up.fetch.as_nanos() as u64,
        commit_ns: up.commit.as_nanos() as u64,
        correct,
        memcpy_ns,
    };
    Reply {
        ns: Some((up.fetch + up.commit).as_nanos() as u64),
        weights: serde_json::to_value(report).ok(),
        ..Reply::ok()
    }
}

/// The machine's copy of the same bytes: into these destinations, from
/// resident buffers of the same sizes, in pieces of at most 8 MiB shared
/// out across `threads` as the commit shares its copies; best of three,
/// nanoseconds.
fn copy_limit(dest: &mut [Vec<u8>], threads: usize) -> u64 {
    let src: Vec<Vec<u8>> = dest.iter().map(|d| vec![7u8; d.len()]).collect();
    let threads = threads.max(1);
    (0..3)
        .map(|_| {
            let mut lanes: Vec<Vec<(&mut [u8], &[u8])>> =
                (0..threads).map(|_| Vec::new()).collect();
            let mut load = vec![0usize; threads];
            for (d, s) in dest.iter_mut().zip(&src) {
                for (dc, sc) in d.chunks_mut(8 << 20).zip(s.chunks(8 << 20)) {
                    let lane = (0..threads).min_by_key(|&i| load[i]).unwrap_or(0);
                    load[lane] += sc.len();
                    lanes[lane].push((dc, sc));
                }
            }
            let t = Instant::now();
            std::thread::scope(|s| {
                for lane in lanes {
                    s.spawn(move || lane.into_iter().for_each(|(d, s)| d.copy_from_slice(s)));
                }
            });
            t.elapsed().as_nanos() as u64
        })
        .min()
        .unwrap_or(0)
}
