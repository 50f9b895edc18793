//! The plugin's config table (`[plugin.config]`), validated; unknown keys
//! are errors naming their dotted path.

use shardport_abi::PluginResult;
use shardport_kit::Options;

use crate::cache::Policy;

/// Default `lease-slots`: shards one owner instance exports at a time. Each
/// slot is one 8-byte word of the board, so 4096 slots cost 32 KiB.
pub const DEFAULT_LEASE_SLOTS: u64 = 4096;
/// Default `lease-records`: leases all consumers together hold on one
/// owner's shards at a time (a device view, or an import in progress). Each
/// record is five words of the board (who holds it, and on what), so 4096
/// cost 160 KiB; a consumer that finds none free gets `RESOURCE_EXHAUSTED`.
pub const DEFAULT_LEASE_RECORDS: u64 = 4096;
/// Default `max-idle-mappings`: opened allocations kept open with no view,
/// so a later fetch of the same allocation costs no `cuIpcOpenMemHandle`
/// (the expensive part of a first fetch), bounded because each one pins the
/// owner's allocation in this process's address space.
pub const DEFAULT_MAX_IDLE: u64 = 64;

/// What `export` does with device memory no cross-process path shares
/// (stream-ordered pool memory, managed memory, VMM memory without a
/// shareable handle type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unshareable {
    /// Copy it into a `cuMemAlloc` buffer owned by the export (one device
    /// copy and the shard's size in device memory; warned once per
    /// allocator, counted in `exports_staged`).
    Stage,
    /// Refuse the export, naming the allocator.
    Refuse,
}

/// Validated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Lease board slots.
    pub lease_slots: u32,
    /// Lease board records.
    pub lease_records: u32,
    /// Consumer cache policy.
    pub cache: Policy,
    /// Device memory no path shares.
    pub unshareable: Unshareable,
    /// Remove the boards of provably dead owners at start.
    pub sweep_on_start: bool,
}

impl Config {
    /// Parses the table of plugin instance `instance`.
    pub fn parse(instance: &str, text: &str) -> PluginResult<Config> {
        let t = Options::parse(instance, text)?;
        let lease_slots = t.u64_in("lease-slots", 1..=1 << 20, DEFAULT_LEASE_SLOTS)? as u32;
        let lease_records = t.u64_in("lease-records", 1..=1 << 20, DEFAULT_LEASE_RECORDS)? as u32;
        let max_idle = t.u64_in("max-idle-mappings", 0..=1 << 16, DEFAULT_MAX_IDLE)? as usize;
        let cache = t.choose(
            "cache",
            &[
                ("keep", Policy::Keep { max_idle }),
                ("close-on-release", Policy::CloseOnRelease),
            ],
            "keep",
        )?;
        let unshareable = t.choose(
            "unshareable",
            &[
                ("stage", Unshareable::Stage),
                ("refuse", Unshareable::Refuse),
            ],
            "stage",
        )?;
        let sweep_on_start = t.bool("sweep-on-start", true)?;
        t.finish()?;
        Ok(Config {
            lease_slots,
            lease_records,
            cache,
            unshareable,
            sweep_on_start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_keys() {
        let c = Config::parse("gpu", "").unwrap();
        assert_eq!(c.lease_slots, DEFAULT_LEASE_SLOTS as u32);
        assert_eq!(c.lease_records, DEFAULT_LEASE_RECORDS as u32);
        assert_eq!(c.cache, Policy::Keep { max_idle: 64 });
        assert_eq!(c.unshareable, Unshareable::Stage);
        assert!(c.sweep_on_start);
        let c = Config::parse(
            "gpu",
            "cache = \"close-on-release\"\nlease-slots = 8\nunshareable = \"refuse\"\nsweep-on-start = false",
        )
        .unwrap();
        assert_eq!(c.cache, Policy::CloseOnRelease);
        assert_eq!(c.lease_slots, 8);
        assert_eq!(c.unshareable, Unshareable::Refuse);
        assert!(!c.sweep_on_start);
        let e = Config::parse("gpu", "unshareable = \"copy\"").unwrap_err();
        assert!(e.message.contains("plugin.gpu.config.unshareable"), "{e:?}");
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse("gpu", "cache = \"lru\"").unwrap_err();
        assert!(e.message.contains("plugin.gpu.config.cache"), "{e:?}");
        let e = Config::parse("gpu", "lease-slots = 0").unwrap_err();
        assert!(e.message.contains("plugin.gpu.config.lease-slots"), "{e:?}");
        let e = Config::parse("gpu", "lease-records = 0").unwrap_err();
        assert!(
            e.message.contains("plugin.gpu.config.lease-records"),
            "{e:?}"
        );
        assert_eq!(
            Config::parse("gpu", "lease-records = 9")
                .unwrap()
                .lease_records,
            9
        );
        let e = Config::parse("gpu", "bogus = 1").unwrap_err();
        assert!(e.message.contains("bogus"), "{e:?}");
    }
}
