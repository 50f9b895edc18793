//! One cell of the matrix (a size, a path, an operation), its outcome, and
//! the limit it is measured against: which parts the limit is made of for a
//! path and operation ([`limit_parts`]) and how their samples combine
//! ([`cell_limit`]).

use shardport_abi::DeviceKind;

use super::{
    limits::Limits,
    spec::{FetchLimit, Op, PathSpec},
    stats::Summary,
};

/// The zero-copy view target: a fetch that moves no bytes answers within this.
pub const VIEW_TARGET_US: f64 = 20.0;

/// Outcome of one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CellStatus {
    /// Measured.
    Ok,
    /// Not run; `reason` says why.
    Skipped,
    /// Started and failed; `reason` has the error.
    Failed,
}

/// What a cell is compared with.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellLimit {
    /// `memcpy`, `tcp`, `memcpy + tcp`, ...
    pub name: String,
    /// The limit's median time for the same work, microseconds.
    pub median_us: f64,
    /// The limit's throughput for the same work, GB/s.
    pub gbps: f64,
    /// Measured between the cell's own repetitions (else: the limits table).
    pub paired: bool,
}

/// One cell of the matrix.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    /// Path.
    pub path: super::spec::PathId,
    /// Operation.
    pub op: Op,
    /// Shard size in bytes.
    pub size: u64,
    /// Transport the path uses.
    pub transport: String,
    /// Measured, skipped or failed.
    pub status: CellStatus,
    /// Why it was skipped or how it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Warm-up iterations run before the samples.
    pub warmup: usize,
    /// Timings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<Summary>,
    /// Throughput at the median time, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// The machine's limit for the same work, measured in this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<CellLimit>,
    /// Limit time / median time: the fraction of the machine's limit reached
    /// (1.0 = as fast as the limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// For zero-copy fetches: the latency target, microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_us: Option<f64>,
}

impl Cell {
    /// A cell that did not run.
    pub fn skipped(spec: &PathSpec, op: Op, size: u64, reason: String) -> Cell {
        Cell {
            path: spec.id,
            op,
            size,
            transport: spec.transport.to_owned(),
            status: CellStatus::Skipped,
            reason: Some(reason),
            warmup: 0,
            samples: None,
            gbps: None,
            limit: None,
            ratio: None,
            target_us: None,
        }
    }

    /// A measured cell, compared with `limits`.
    pub fn measured(
        spec: &PathSpec,
        op: Op,
        size: u64,
        warmup: usize,
        samples: Summary,
        paired: Option<&Summary>,
        limits: &Limits,
    ) -> Cell {
        let limit = cell_limit(spec, op, size, paired, limits);
        let ratio = limit.as_ref().map(|l| l.median_us / samples.median_us);
        let view = spec.fetch_limit == FetchLimit::LatencyTarget;
        let device_put = spec.device != DeviceKind::CPU;
        let moves_nothing = match op {
            Op::Fetch => view,
            Op::Put => device_put,
            Op::PutFetch => view && device_put,
        };
        let target_us = moves_nothing.then_some(VIEW_TARGET_US);
        Cell {
            path: spec.id,
            op,
            size,
            transport: spec.transport.to_owned(),
            status: CellStatus::Ok,
            reason: None,
            warmup,
            gbps: Some(samples.gbps(size)),
            samples: Some(samples),
            limit,
            ratio,
            target_us,
        }
    }
}

/// One part of a cell's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitPart {
    /// The fastest copy of the shard from a warm buffer into another or
    /// into shared memory (what a put does).
    Memcpy,
    /// The fastest copy of the shard between warm buffers or out of a
    /// shared-memory mapping (what a posix-shm copy fetch does).
    MemcpyFromShm,
    /// Raw TCP loopback carrying the shard: a round trip, from 1 MiB up the
    /// faster of that and a one-way stream on the same sockets.
    Tcp,
    /// One `cuMemcpyDtoD` of the shard between two buffers of device 0.
    DeviceCopy,
    /// The slowest of a pinned device-to-host copy, the TCP limit of the
    /// shard sent in 4 MiB pieces and a pinned host-to-device copy, each
    /// taken once.
    Staged,
}

/// What the fastest way to do a cell's work consists of: a put is one
/// memcpy into storage; a copy fetch one memcpy, one TCP round trip, one
/// device-to-device copy or the slowest stage of a staged copy; a zero-copy
/// fetch moves nothing, nor does a device put (it exports the caller's
/// memory): those are judged by the latency target instead.
pub fn limit_parts(spec: &PathSpec, op: Op) -> Vec<LimitPart> {
    let fetch = match spec.fetch_limit {
        FetchLimit::LatencyTarget => None,
        FetchLimit::Memcpy => Some(LimitPart::MemcpyFromShm),
        FetchLimit::Tcp => Some(LimitPart::Tcp),
        FetchLimit::DeviceCopy => Some(LimitPart::DeviceCopy),
        FetchLimit::Staged => Some(LimitPart::Staged),
    };
    let put = (spec.device == DeviceKind::CPU).then_some(LimitPart::Memcpy);
    match op {
        Op::Put => put.into_iter().collect(),
        Op::Fetch => fetch.into_iter().collect(),
        Op::PutFetch => put.into_iter().chain(fetch).collect(),
    }
}

fn limit_name(parts: &[LimitPart]) -> String {
    let word = |p: &LimitPart| match p {
        LimitPart::Memcpy | LimitPart::MemcpyFromShm => "memcpy",
        LimitPart::Tcp => "tcp",
        LimitPart::DeviceCopy => "device copy",
        LimitPart::Staged => "slowest of d2h, tcp, h2d",
    };
    match parts {
        [LimitPart::Memcpy, LimitPart::MemcpyFromShm] => "2x memcpy".into(),
        _ => parts.iter().map(word).collect::<Vec<_>>().join(" + "),
    }
}

/// A cell's limit: from limit samples taken between the cell's own samples
/// (`paired`, so both see the same load on the machine), or else from the
/// run's limits table at that size.
pub fn cell_limit(
    spec: &PathSpec,
    op: Op,
    size: u64,
    paired: Option<&Summary>,
    limits: &Limits,
) -> Option<CellLimit> {
    let parts = limit_parts(spec, op);
    if parts.is_empty() {
        return None;
    }
    let us = match paired {
        Some(s) => s.median_us,
        None => parts
            .iter()
            .map(|p| match p {
                LimitPart::Memcpy | LimitPart::MemcpyFromShm => {
                    limits.memcpy_at(size).map(|l| l.samples.median_us)
                }
                LimitPart::Tcp => limits.tcp_at(size).map(|l| l.samples.median_us),
                // Only ever paired: the limits table is the CPU's.
                LimitPart::DeviceCopy | LimitPart::Staged => None,
            })
            .sum::<Option<f64>>()?,
    };
    Some(CellLimit {
        name: limit_name(&parts),
        median_us: us,
        gbps: super::stats::gbps_us(size, us),
        paired: paired.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{limits::SizeLimit, spec::PathId};

    fn limit(size: u64, us: f64) -> SizeLimit {
        let samples = Summary::of_us(&mut [us]).unwrap();
        SizeLimit {
            size,
            samples,
            gbps: super::super::stats::gbps_us(size, us),
        }
    }

    #[test]
    fn each_cell_is_compared_with_the_same_work() {
        let parts = |p: PathId, o| limit_parts(p.spec(), o);
        use LimitPart::{Memcpy, MemcpyFromShm, Tcp};
        assert_eq!(parts(PathId::ShmView, Op::Put), [Memcpy]);
        assert_eq!(parts(PathId::ShmView, Op::Fetch), []);
        assert_eq!(parts(PathId::ShmView, Op::PutFetch), [Memcpy]);
        assert_eq!(parts(PathId::ShmCopy, Op::Fetch), [MemcpyFromShm]);
        assert_eq!(
            parts(PathId::ShmCopy, Op::PutFetch),
            [Memcpy, MemcpyFromShm]
        );
        assert_eq!(parts(PathId::Http, Op::Fetch), [Tcp]);
        assert_eq!(parts(PathId::Http, Op::PutFetch), [Memcpy, Tcp]);
        // A device put exports the caller's memory: no bytes, no limit.
        use LimitPart::{DeviceCopy, Staged};
        assert_eq!(parts(PathId::CudaIpc, Op::Put), []);
        assert_eq!(parts(PathId::CudaIpc, Op::Fetch), []);
        assert_eq!(parts(PathId::CudaCopy, Op::Fetch), [DeviceCopy]);
        assert_eq!(parts(PathId::CudaCopy, Op::PutFetch), [DeviceCopy]);
        assert_eq!(parts(PathId::CudaHttp, Op::PutFetch), [Staged]);

        let limits = Limits {
            memcpy: vec![limit(4096, 1.0)],
            tcp_round_trip: vec![limit(4096, 10.0)],
            tcp_stream: None,
        };
        let http = PathId::Http.spec();
        let l = cell_limit(http, Op::PutFetch, 4096, None, &limits).unwrap();
        assert_eq!(
            (l.name.as_str(), l.median_us, l.paired),
            ("memcpy + tcp", 11.0, false)
        );
        let copy = PathId::ShmCopy.spec();
        let l = cell_limit(copy, Op::PutFetch, 4096, None, &limits).unwrap();
        assert_eq!((l.name.as_str(), l.median_us), ("2x memcpy", 2.0));
        // Paired samples win over the table; no table entry, no limit.
        let paired = Summary::of_us(&mut [3.0, 5.0, 4.0]).unwrap();
        let l = cell_limit(copy, Op::Fetch, 4096, Some(&paired), &limits).unwrap();
        assert_eq!((l.median_us, l.paired), (4.0, true));
        assert!(cell_limit(copy, Op::Fetch, 1 << 20, None, &limits).is_none());
        assert!(cell_limit(PathId::ShmView.spec(), Op::Fetch, 4096, None, &limits).is_none());

        let cell = Cell::measured(
            copy,
            Op::Fetch,
            4096,
            1,
            Summary::of_us(&mut [2.0]).unwrap(),
            None,
            &limits,
        );
        assert_eq!(cell.ratio, Some(0.5));
        assert_eq!(cell.target_us, None);
        let view = PathId::ShmView.spec();
        let cell = Cell::measured(
            view,
            Op::Fetch,
            4096,
            1,
            Summary::of_us(&mut [2.0]).unwrap(),
            None,
            &limits,
        );
        assert_eq!((cell.ratio, cell.target_us), (None, Some(VIEW_TARGET_US)));
        // A device put is judged by the latency target; a GPU copy has no
        // limit from the (CPU) table, only a paired one.
        let staged = PathId::CudaHttp.spec();
        let cell = Cell::measured(
            staged,
            Op::Put,
            4096,
            1,
            Summary::of_us(&mut [2.0]).unwrap(),
            None,
            &limits,
        );
        assert_eq!((cell.ratio, cell.target_us), (None, Some(VIEW_TARGET_US)));
        assert!(cell_limit(staged, Op::Fetch, 4096, None, &limits).is_none());
        // A device put then a device view move nothing either.
        let cell = Cell::measured(
            PathId::CudaIpc.spec(),
            Op::PutFetch,
            4096,
            1,
            Summary::of_us(&mut [2.0]).unwrap(),
            None,
            &limits,
        );
        assert_eq!((cell.ratio, cell.target_us), (None, Some(VIEW_TARGET_US)));
        let l = cell_limit(staged, Op::Fetch, 4096, Some(&paired), &limits).unwrap();
        assert_eq!(
            (l.name.as_str(), l.median_us),
            ("slowest of d2h, tcp, h2d", 4.0)
        );
    }
}
