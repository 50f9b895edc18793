//! What the matrix can measure: paths (a transport and how its result is
//! used), operations, and what each cell is compared with.
//!
//! # Adding a path
//! A path is one row of [`PATHS`]: the transport it needs loaded, the fetch
//! mode, and the shard's device. `matrix` drives every path through the same
//! three operations; a path is skipped (with the reason in the table and the
//! JSON) when its plugin is not loaded, is unhealthy, lacks a capability it
//! needs, or needs something this process cannot do ([`PathSpec::blocker`]:
//! the GPU paths need the CUDA driver here, to allocate device memory and to
//! read fetched bytes back).
//!
//! # The GPU paths
//! `cuda-ipc` views a GPU shard in place, `cuda-copy` copies it device to
//! device, both through cuda-ipc on one machine; `cuda-http` forces the
//! shard over http, staged through pinned host memory on both ends, which is
//! what a consumer on another node gets. Their puts export the caller's
//! device memory and move no bytes, so they are judged by the latency
//! target; a `cuda-copy` fetch is compared with one `cuMemcpyDtoD` of the
//! same size, a `cuda-http` fetch with the slowest of a pinned
//! device-to-host copy, the raw TCP limit and a pinned host-to-device copy.

use std::{fmt, str::FromStr};

use shardport_abi::{Capabilities, DeviceKind};

use shardport_host::vocab::FetchMode;

/// A path through the system: a transport plus how the consumer uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathId {
    /// posix-shm, zero-copy view (a lease on the owner's memory).
    ShmView,
    /// posix-shm, copy into the consumer's warm buffer.
    ShmCopy,
    /// http, streamed into the consumer's warm buffer.
    Http,
    /// cuda-ipc, a GPU shard opened in place.
    CudaIpc,
    /// cuda-ipc, a GPU shard copied device to device into the consumer's
    /// device memory (`fetch_device_into`).
    CudaCopy,
    /// http, a GPU shard staged through pinned host memory at both ends
    /// into the consumer's device memory (what another node gets).
    CudaHttp,
}

/// One operation of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// The bench process puts bytes from a warm buffer (owner side only).
    Put,
    /// The bench process fetches a shard another process owns.
    Fetch,
    /// An owner process puts, a separate consumer process fetches.
    PutFetch,
}

/// Everything the matrix needs to know about a path.
#[derive(Clone, Copy)]
pub struct PathSpec {
    /// Which path.
    pub id: PathId,
    /// Transport that must be loaded (and healthy).
    pub transport: &'static str,
    /// How the consumer fetches.
    pub mode: FetchMode,
    /// Device of the shard.
    pub device: DeviceKind,
    /// Capabilities the transport must report.
    pub needs: Capabilities,
    /// What a fetch through this path is compared with.
    pub fetch_limit: FetchLimit,
}

/// The physical limit a fetch is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchLimit {
    /// No bytes move: latency against the zero-copy target.
    LatencyTarget,
    /// One single-thread memcpy of the shard.
    Memcpy,
    /// One round trip on a raw TCP loopback socket pair carrying the shard.
    Tcp,
    /// One device-to-device copy of the shard (`cuMemcpyDtoD`).
    DeviceCopy,
    /// The slowest of a pinned device-to-host copy, the TCP limit of the
    /// shard sent as 4 MiB pieces (cache-resident buffers, as staging sends
    /// them) and a pinned host-to-device copy: the stages of a staged fetch,
    /// which overlap, so the slowest bounds it.
    Staged,
}

/// Every path the bench knows, in table order.
pub const PATHS: &[PathSpec] = &[
    PathSpec {
        id: PathId::ShmView,
        transport: "posix-shm",
        mode: FetchMode::View,
        device: DeviceKind::CPU,
        needs: Capabilities::ZERO_COPY,
        fetch_limit: FetchLimit::LatencyTarget,
    },
    PathSpec {
        id: PathId::ShmCopy,
        transport: "posix-shm",
        mode: FetchMode::Copy,
        device: DeviceKind::CPU,
        needs: Capabilities::CPU,
        fetch_limit: FetchLimit::Memcpy,
    },
    PathSpec {
        id: PathId::Http,
        transport: "http",
        mode: FetchMode::Copy,
        device: DeviceKind::CPU,
        needs: Capabilities::CPU,
        fetch_limit: FetchLimit::Tcp,
    },
    PathSpec {
        id: PathId::CudaIpc,
        transport: "cuda-ipc",
        mode: FetchMode::View,
        device: DeviceKind::CUDA,
        needs: Capabilities::CUDA,
        fetch_limit: FetchLimit::LatencyTarget,
    },
    PathSpec {
        id: PathId::CudaCopy,
        transport: "cuda-ipc",
        mode: FetchMode::Copy,
        device: DeviceKind::CUDA,
        needs: Capabilities::CUDA,
        fetch_limit: FetchLimit::DeviceCopy,
    },
    PathSpec {
        id: PathId::CudaHttp,
        transport: "http",
        mode: FetchMode::Copy,
        device: DeviceKind::CUDA,
        needs: Capabilities::CUDA,
        fetch_limit: FetchLimit::Staged,
    },
];

/// Paths measured when `--paths` is not given (the GPU paths are tried;
/// without a GPU, or its plugin, they show as skipped with the reason).
pub const DEFAULT_PATHS: &[PathId] = &[
    PathId::ShmView,
    PathId::ShmCopy,
    PathId::Http,
    PathId::CudaIpc,
    PathId::CudaCopy,
    PathId::CudaHttp,
];

/// Sizes measured when `--sizes` is not given.
pub const DEFAULT_SIZES: &[u64] = &[4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20];

/// Sizes of `--quick` (and its repetitions): enough to run every code path
/// in seconds, even in a debug build.
pub const QUICK_SIZES: &[u64] = &[4 << 10, 256 << 10];

/// Operations measured when `--ops` is not given.
pub const ALL_OPS: &[Op] = &[Op::Put, Op::Fetch, Op::PutFetch];

impl PathId {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PathId::ShmView => "shm-view",
            PathId::ShmCopy => "shm-copy",
            PathId::Http => "http",
            PathId::CudaIpc => "cuda-ipc",
            PathId::CudaCopy => "cuda-copy",
            PathId::CudaHttp => "cuda-http",
        }
    }

    /// Its row of [`PATHS`].
    pub fn spec(self) -> &'static PathSpec {
        PATHS
            .iter()
            .find(|p| p.id == self)
            .expect("every path has a row in PATHS")
    }
}

impl PathSpec {
    /// Why this process cannot drive this path, whatever the plugin says:
    /// a GPU path without a usable CUDA driver here.
    pub fn blocker(&self) -> Option<String> {
        if self.device == DeviceKind::CPU {
            return None;
        }
        crate::gpu::available()
            .err()
            .map(|why| format!("this GPU path needs the CUDA driver in the bench process: {why}"))
    }
}

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PathId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        PATHS
            .iter()
            .map(|p| p.id)
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "unknown path `{s}`; expected one of {}",
                    PATHS
                        .iter()
                        .map(|p| p.id.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

impl Op {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Fetch => "fetch",
            Op::PutFetch => "put-fetch",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ALL_OPS
            .iter()
            .copied()
            .find(|o| o.name() == s.trim())
            .ok_or_else(|| {
                format!("unknown operation `{s}`; expected one of put, fetch, put-fetch")
            })
    }
}

/// Parses a `--sizes` item: a byte size of at least one byte.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match shardport_kit::parse_byte_size(s) {
        Some(0) => Err(format!("size `{s}` is zero; a shard has at least 1 byte")),
        Some(n) => Ok(n),
        None => Err(format!(
            "`{s}` is not a byte size; expected a number with an optional unit, such as 4KiB, 1MiB or 4096"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_errors_name_the_input() {
        for p in PATHS {
            assert_eq!(p.id.name().parse::<PathId>(), Ok(p.id));
            assert_eq!(p.id.spec().id, p.id);
        }
        for o in ALL_OPS {
            assert_eq!(o.name().parse::<Op>(), Ok(*o));
        }
        let e = "shm".parse::<PathId>().unwrap_err();
        assert_eq!(
            e,
            "unknown path `shm`; expected one of shm-view, shm-copy, http, cuda-ipc, cuda-copy, cuda-http"
        );
        assert!("get".parse::<Op>().unwrap_err().contains("`get`"));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert!(parse_size("4 parsecs").unwrap_err().contains("`4 parsecs`"));
        assert!(parse_size("0").unwrap_err().contains("zero"));
    }

    #[test]
    fn only_device_paths_are_blocked_and_only_without_a_driver() {
        for p in PATHS {
            let blocked = p.blocker();
            match (p.device == DeviceKind::CPU, crate::gpu::available()) {
                (true, _) | (false, Ok(_)) => assert_eq!(blocked, None, "{}", p.id),
                (false, Err(why)) => {
                    let b = blocked.unwrap_or_default();
                    assert!(b.contains(&why), "{}: {b}", p.id);
                }
            }
        }
    }
}
