//! The plugin's config table, validated into typed values.
//!
//! ```toml
//! [[plugin]]
//! name = "shm"
//! path = "libshardport_posix_shm.so"
//! [plugin.config]
//! allocation = "pool"          # or "segment-per-shard"
//! pool-size = "1GiB"
//! on-full = "error"            # or "spill"
//! segment-prefix = "shardport"
//! max-leases = 4096
//! max-shards = 65536
//! sweep-on-start = true
//! owner-check-interval = "50us"
//! create-pool = "lazy"         # or "eager"
//! ```

use std::time::Duration;

use shardport_abi::PluginResult;
use shardport_kit::Options;

use crate::names;

/// Default allocation: one pool per owner. Creating a segment per shard costs
/// a few system calls and first-touch page faults every time; a pool reuses
/// pages that are already backed.
pub(crate) const DEFAULT_ALLOCATION: &str = "pool";
/// Default full-pool behaviour: fail loudly, so an undersized pool is seen
/// and fixed rather than silently paying per-shard segment costs.
pub(crate) const DEFAULT_ON_FULL: &str = "error";
/// Default pool size. The segment is created sparse (`ftruncate`), so an idle
/// pool costs no memory; 1 GiB holds a typical batch of weight or KV shards
/// without spilling, and fits the 24 GiB tmpfs of a normal host many times.
pub(crate) const DEFAULT_POOL_SIZE: u64 = 1 << 30;
/// Smallest pool: one page. Anything smaller cannot hold a useful shard.
pub(crate) const MIN_POOL_SIZE: u64 = 4096;
/// Largest pool: 1 TiB, far above any tmpfs a host has; guards against a
/// unit typo (`"1024GiB"` meant as MiB) reserving address space for nothing.
pub(crate) const MAX_POOL_SIZE: u64 = 1 << 40;
/// Default segment-name prefix: identifies our segments in `/dev/shm` and is
/// what consumers require of every name in a descriptor.
pub(crate) const DEFAULT_SEGMENT_PREFIX: &str = "shardport";
/// Default lease slots: 4096 concurrent views/copies per owner is well above
/// what a node's consumers hold at once, and costs 256 KiB of (sparse) board.
pub(crate) const DEFAULT_MAX_LEASES: u64 = 4096;
/// Upper bound for `max-leases`: the owner scans every slot on each unexport,
/// so a million slots (64 MiB of board) is the most that stays cheap.
pub(crate) const MAX_MAX_LEASES: u64 = 1 << 20;
/// Default shard-table size: 65536 live shards per owner covers a large
/// model's parameters one tensor per shard; 2 MiB of (sparse) board.
pub(crate) const DEFAULT_MAX_SHARDS: u64 = 65536;
/// Upper bound for `max-shards`: 4 Mi entries (128 MiB of board), beyond
/// which per-shard bookkeeping, not the table, is the problem.
pub(crate) const MAX_MAX_SHARDS: u64 = 1 << 22;
/// Default: sweep dead owners' segments when an instance starts. An owner
/// killed by the OOM killer or `SIGKILL` leaves its pool in `/dev/shm`,
/// holding memory until reboot; a job that restarts sweeps them before it
/// creates its own pool, so a crash loop cannot fill `/dev/shm`. Only
/// segments of provably dead owners are removed, so it is safe to leave on.
pub(crate) const DEFAULT_SWEEP_ON_START: bool = true;
/// Default for how long a consumer trusts that an owner is alive before it
/// checks again (one `poll` on the owner's pidfd, ~0.3 us: a fifth of a
/// 4 KiB zero-copy fetch if paid on every import). 50 us costs a few
/// nanoseconds per import at full rate, and is far shorter than a process
/// takes to die, be noticed and have its shards fetched again.
pub(crate) const DEFAULT_OWNER_CHECK_INTERVAL: Duration = Duration::from_micros(50);
/// Upper bound for `owner-check-interval`: beyond a second, a consumer could
/// keep serving a dead owner's shards noticeably long.
pub(crate) const MAX_OWNER_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Default: create the pool on the first allocation or export. A process
/// that only fetches (a rollout worker, an inference consumer) then leaves
/// no segment in `/dev/shm`; an owner pays the creation (a few system calls,
/// the pages stay sparse) once, on its first put.
pub(crate) const DEFAULT_CREATE_POOL: &str = "lazy";

/// When the owner creates its pool (pool mode only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreatePool {
    /// On the first `allocate` or `export`; a failure goes to that call.
    Lazy,
    /// At construction (a long-lived owner that wants `/dev/shm` problems
    /// reported by `health` before the first put).
    Eager,
}

/// How the owner places shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allocation {
    /// One pre-created data segment with a bump allocator, plus a lease board.
    Pool,
    /// One segment per shard, sized to it.
    SegmentPerShard,
}

/// What a full pool does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFull {
    /// Fail the allocation with `RESOURCE_EXHAUSTED`.
    Error,
    /// Put that shard in its own segment instead (logged at warn).
    Spill,
}

/// Validated configuration of one transport instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// The plugin instance name, for messages (`plugin.<instance>.config.*`).
    pub instance: String,
    pub allocation: Allocation,
    pub pool_size: u64,
    pub on_full: OnFull,
    pub segment_prefix: String,
    pub max_leases: u32,
    pub max_shards: u32,
    /// Sweep dead owners' segments (with our prefix) at construction.
    pub sweep_on_start: bool,
    /// How long a consumer's "owner alive" verdict stays fresh.
    pub owner_check_interval: Duration,
    /// When the pool is created.
    pub create_pool: CreatePool,
}

impl Config {
    /// Parses and validates the config table `text` of plugin `instance`.
    /// Unknown keys are errors that name the key.
    pub(crate) fn parse(instance: &str, text: &str) -> PluginResult<Config> {
        let t = Options::parse(instance, text)?;
        let allocation = t.choose(
            "allocation",
            &[
                ("pool", Allocation::Pool),
                ("segment-per-shard", Allocation::SegmentPerShard),
            ],
            DEFAULT_ALLOCATION,
        )?;
        let pool_size = t.byte_size_in(
            "pool-size",
            MIN_POOL_SIZE..=MAX_POOL_SIZE,
            DEFAULT_POOL_SIZE,
        )?;
        let on_full = t.choose(
            "on-full",
            &[("error", OnFull::Error), ("spill", OnFull::Spill)],
            DEFAULT_ON_FULL,
        )?;
        let segment_prefix = t.string("segment-prefix", DEFAULT_SEGMENT_PREFIX)?;
        names::validate_prefix(&segment_prefix).map_err(|why| t.fail("segment-prefix", why))?;
        let max_leases = t.u64_in("max-leases", 1..=MAX_MAX_LEASES, DEFAULT_MAX_LEASES)?;
        let max_shards = t.u64_in("max-shards", 1..=MAX_MAX_SHARDS, DEFAULT_MAX_SHARDS)?;
        let sweep_on_start = t.bool("sweep-on-start", DEFAULT_SWEEP_ON_START)?;
        let owner_check_interval = t.duration_in(
            "owner-check-interval",
            Duration::ZERO..=MAX_OWNER_CHECK_INTERVAL,
            DEFAULT_OWNER_CHECK_INTERVAL,
        )?;
        let create_pool = t.choose(
            "create-pool",
            &[("lazy", CreatePool::Lazy), ("eager", CreatePool::Eager)],
            DEFAULT_CREATE_POOL,
        )?;
        t.finish()?;
        Ok(Config {
            instance: instance.to_owned(),
            allocation,
            pool_size,
            on_full,
            segment_prefix,
            // Both bounds are far below u32::MAX.
            max_leases: max_leases as u32,
            max_shards: max_shards as u32,
            sweep_on_start,
            owner_check_interval,
            create_pool,
        })
    }

    /// Dotted path of `key` in the host config, for messages.
    pub(crate) fn key(&self, key: &str) -> String {
        format!("plugin.{}.config.{key}", self.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::ErrorKind;

    #[test]
    fn defaults() {
        let c = Config::parse("shm", "").unwrap();
        assert_eq!(c.allocation, Allocation::Pool);
        assert_eq!(c.pool_size, 1 << 30);
        assert_eq!(c.on_full, OnFull::Error);
        assert_eq!(c.segment_prefix, "shardport");
        assert_eq!(c.max_leases, 4096);
        assert_eq!(c.max_shards, 65536);
        assert!(c.sweep_on_start);
        assert_eq!(c.owner_check_interval, Duration::from_micros(50));
        assert_eq!(c.create_pool, CreatePool::Lazy);
    }

    #[test]
    fn every_key() {
        let c = Config::parse(
            "shm",
            r#"allocation = "segment-per-shard"
               pool-size = "64MiB"
               on-full = "spill"
               segment-prefix = "job_7-a"
               max-leases = 16
               max-shards = 32
               sweep-on-start = false
               owner-check-interval = "0us"
               create-pool = "eager""#,
        )
        .unwrap();
        assert_eq!(c.allocation, Allocation::SegmentPerShard);
        assert_eq!(c.pool_size, 64 << 20);
        assert_eq!(c.on_full, OnFull::Spill);
        assert_eq!(c.segment_prefix, "job_7-a");
        assert_eq!((c.max_leases, c.max_shards), (16, 32));
        assert!(!c.sweep_on_start);
        assert_eq!(c.owner_check_interval, Duration::ZERO);
        assert_eq!(c.create_pool, CreatePool::Eager);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                "pool-sise = \"1GiB\"",
                "unknown key `plugin.shm.config.pool-sise`",
            ),
            (
                "pool-size = \"1KiB\"",
                "`plugin.shm.config.pool-size`: 1 KiB is out of range 4 KiB..=1 TiB",
            ),
            (
                "on-full = \"drop\"",
                "`plugin.shm.config.on-full`: expected \"error\" or \"spill\", found \"drop\"",
            ),
            (
                "segment-prefix = \"../x\"",
                "`plugin.shm.config.segment-prefix`: ",
            ),
            (
                "segment-prefix = \"9lives\"",
                "`plugin.shm.config.segment-prefix`: must start with a letter",
            ),
            (
                "segment-prefix = \"\"",
                "`plugin.shm.config.segment-prefix`: ",
            ),
            (
                "max-leases = 0",
                "`plugin.shm.config.max-leases`: 0 is out of range",
            ),
            (
                "max-shards = -1",
                "`plugin.shm.config.max-shards`: expected a non-negative integer",
            ),
            (
                "sweep-on-start = \"yes\"",
                "`plugin.shm.config.sweep-on-start`: expected true or false",
            ),
            (
                "sweep_on_start = false",
                "unknown key `plugin.shm.config.sweep_on_start`",
            ),
            (
                "owner-check-interval = \"50\"",
                "`plugin.shm.config.owner-check-interval`: expected a duration such as",
            ),
            (
                "owner-check-interval = \"2s\"",
                "`plugin.shm.config.owner-check-interval`: 2s is out of range 0s..=1s",
            ),
            (
                "create-pool = \"later\"",
                "`plugin.shm.config.create-pool`: expected \"lazy\" or \"eager\", found \"later\"",
            ),
            (
                "owner-check-interval = 50",
                "`plugin.shm.config.owner-check-interval`: expected a string",
            ),
        ];
        for (text, want) in cases {
            let e = Config::parse("shm", text).unwrap_err();
            assert_eq!(e.kind, ErrorKind::CONFIG, "{text}");
            assert!(e.message.starts_with(want), "{text}: {}", e.message);
        }
        let long = format!("segment-prefix = \"{}\"", "a".repeat(33));
        let e = Config::parse("shm", &long).unwrap_err();
        assert!(e.message.contains("at most 32"), "{}", e.message);
    }
}
