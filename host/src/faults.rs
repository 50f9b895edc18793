//! Fault injection: a transport that sits in front of a loaded plugin and
//! makes it misbehave at configured rates (`[plugin.faults]`), for drills
//! and tests of what the host does when transports fail.
//!
//! Faults, each drawn independently per call from a seeded sequence:
//! - `delay` (`delay-rate`): the import or export waits first;
//! - `reset`: an import writes part of the bytes and then fails, as a
//!   connection reset mid-body does (views: the import fails, no lease);
//! - `short-read`: a copy reports success with the second half of the
//!   destination never written (a transport that missed a short read);
//! - `corrupt`: a copy reports success with one byte flipped;
//! - `enospc`: an allocation (creating or growing a segment) fails with
//!   `RESOURCE_EXHAUSTED`, as a full `/dev/shm` does;
//! - `garbage-descriptor`: an export succeeds but returns random bytes as
//!   its descriptor (the plugin keeps the real export, withdrawn as usual
//!   when the shard is removed; consumers must refuse the descriptor).
//!
//! Short reads and corruption are only caught where the handle carries a
//! checksum (`put.checksum`) and consumers verify it (`fetch.verify-checksum`):
//! that is what the drills show. Views cannot be corrupted here (they map
//! the owner's memory read-only). Everything else passes through; the
//! plugin's stats gain `faults_<kind>_total` counters and its health line
//! says that injection is on.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use shardport_abi::{
    AbiError, Allocation, ErrorKind, ExportRequest, Health, ImportInfo, ImportItem, OwnerClaim,
    RResult, RSlice, RSliceMut, RVec, Region, ShardId, ShardMeta, SharedTransport, Stat, TD_Opaque,
    Transport, TransportBox, TransportInfo,
};

use crate::config::Faults;

/// Kinds of injected faults, in the order of their counters.
const KINDS: [&str; 6] = [
    "delay",
    "reset",
    "short_read",
    "corrupt",
    "enospc",
    "garbage_descriptor",
];

/// The transport in front of a plugin's instance.
struct Injector {
    inner: SharedTransport,
    dice: Dice,
}

/// What decides the faults: the rates, the seeded sequence, the counts.
struct Dice {
    faults: Faults,
    /// Position in the seeded sequence.
    state: AtomicU64,
    /// Faults injected, per kind (see [`KINDS`]).
    injected: [AtomicU64; KINDS.len()],
}

/// Wraps `inner` so it misbehaves as `faults` says.
pub fn inject(inner: TransportBox, faults: Faults) -> TransportBox {
    TransportBox::from_value(
        Injector {
            inner: Arc::new(inner),
            dice: Dice::new(faults),
        },
        TD_Opaque,
    )
}

/// One step of SplitMix64 from `x`.
fn mix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Dice {
    fn new(faults: Faults) -> Dice {
        Dice {
            faults,
            state: AtomicU64::new(faults.seed),
            injected: Default::default(),
        }
    }

    fn next(&self) -> u64 {
        mix(self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
    }

    /// Draws a fault of `kind` (index into [`KINDS`]) at `ppm`; counts it.
    fn roll(&self, kind: usize, ppm: u32) -> bool {
        if ppm == 0 || self.next() % 1_000_000 >= u64::from(ppm) {
            return false;
        }
        self.injected[kind].fetch_add(1, Ordering::Relaxed);
        true
    }

    fn maybe_delay(&self) {
        if self.roll(0, self.faults.delay_ppm) {
            std::thread::sleep(self.faults.delay);
        }
    }

    /// After a successful copy into `dst`: a reset (error, half written),
    /// a short read (tail zeroed, success) or a flipped byte, or nothing.
    fn after_copy(&self, dst: &mut [u8], ok: ImportInfo) -> RResult<ImportInfo, AbiError> {
        let f = &self.faults;
        if self.roll(1, f.reset_ppm) {
            let half = dst.len() / 2;
            dst[half..].fill(0);
            return RResult::RErr(AbiError::unavailable(format!(
                "injected fault: connection reset after {half} of {} bytes",
                dst.len()
            )));
        }
        if !dst.is_empty() && self.roll(2, f.short_read_ppm) {
            let half = dst.len() / 2;
            dst[half..].fill(0);
            return RResult::ROk(ok);
        }
        if !dst.is_empty() && self.roll(3, f.corrupt_ppm) {
            let i = (self.next() % dst.len() as u64) as usize;
            dst[i] ^= 0x5a;
        }
        RResult::ROk(ok)
    }
}

impl Transport for Injector {
    fn describe(&self) -> TransportInfo {
        self.inner.describe()
    }

    fn export(&self, req: ExportRequest) -> RResult<RVec<u8>, AbiError> {
        self.dice.maybe_delay();
        let r = self.inner.export(req);
        if let RResult::ROk(desc) = &r {
            if self.dice.roll(5, self.dice.faults.garbage_descriptor_ppm) {
                // The plugin keeps its real export (a storage transport's
                // unexport would free bytes the shard still uses); the
                // handle gets garbage.
                let n = desc.len().clamp(1, 64);
                let garbage: Vec<u8> = (0..n).map(|_| self.dice.next() as u8).collect();
                return RResult::ROk(garbage.into());
            }
        }
        r
    }

    fn unexport(&self, id: ShardId) -> RResult<(), AbiError> {
        self.inner.unexport(id)
    }

    fn import_into(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        mut dst: RSliceMut<'_, u8>,
    ) -> RResult<ImportInfo, AbiError> {
        self.dice.maybe_delay();
        let r = self
            .inner
            .import_into(desc, meta, RSliceMut::from_mut_slice(dst.as_mut_slice()));
        match r {
            RResult::ROk(ok) => self.dice.after_copy(dst.as_mut_slice(), ok),
            err => err,
        }
    }

    fn import_view(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<Region, AbiError> {
        self.dice.maybe_delay();
        if self.dice.roll(1, self.dice.faults.reset_ppm) {
            return RResult::RErr(AbiError::unavailable(
                "injected fault: connection reset before the view was granted",
            ));
        }
        self.inner.import_view(desc, meta)
    }

    fn import_view_private(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
    ) -> RResult<Region, AbiError> {
        self.dice.maybe_delay();
        if self.dice.roll(1, self.dice.faults.reset_ppm) {
            return RResult::RErr(AbiError::unavailable(
                "injected fault: connection reset before the private view was granted",
            ));
        }
        self.inner.import_view_private(desc, meta)
    }

    fn release(&self, token: u64) -> RResult<(), AbiError> {
        self.inner.release(token)
    }

    fn allocate(&self, id: ShardId, len: u64) -> RResult<Allocation, AbiError> {
        if self.dice.roll(4, self.dice.faults.enospc_ppm) {
            return RResult::RErr(AbiError::new(
                ErrorKind::RESOURCE_EXHAUSTED,
                format!("injected fault: no space left on device creating a segment of {len} bytes for shard {id}"),
            ));
        }
        self.inner.allocate(id, len)
    }

    fn free_allocation(&self, token: u64) -> RResult<(), AbiError> {
        self.inner.free_allocation(token)
    }

    fn stats(&self) -> RVec<Stat> {
        let mut out = self.inner.stats();
        for (kind, n) in KINDS.iter().zip(&self.dice.injected) {
            out.push(Stat::counter(
                &format!("faults_{kind}_total"),
                n.load(Ordering::Relaxed),
            ));
        }
        out
    }

    fn health(&self) -> Health {
        let h = self.inner.health();
        Health {
            ok: h.ok,
            message: format!("FAULT INJECTION ON; {}", h.message).into(),
        }
    }

    fn echo(&self, x: u64) -> u64 {
        self.inner.echo(x)
    }

    fn import_many(
        &self,
        mut items: RSliceMut<'_, ImportItem<'_>>,
    ) -> RVec<RResult<ImportInfo, AbiError>> {
        self.dice.maybe_delay();
        let results = self
            .inner
            .import_many(RSliceMut::from_mut_slice(items.as_mut_slice()));
        results
            .into_iter()
            .zip(items.as_mut_slice().iter_mut())
            .map(|(r, item)| match r {
                RResult::ROk(ok) => self.dice.after_copy(item.dst.as_mut_slice(), ok),
                err => err,
            })
            .collect()
    }

    fn sweep(&self) -> RResult<RVec<Stat>, AbiError> {
        self.inner.sweep()
    }

    fn can_import(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<(), AbiError> {
        self.inner.can_import(desc, meta)
    }

    fn can_import_from(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        owner: &OwnerClaim<'_>,
    ) -> RResult<(), AbiError> {
        self.inner.can_import_from(desc, meta, owner)
    }

    fn import_into_device(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        dst_addr: u64,
        dst_len: u64,
    ) -> RResult<ImportInfo, AbiError> {
        self.dice.maybe_delay();
        if self.dice.roll(1, self.dice.faults.reset_ppm) {
            return RResult::RErr(AbiError::unavailable(
                "injected fault: connection reset during the device copy",
            ));
        }
        self.inner.import_into_device(desc, meta, dst_addr, dst_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dice(seed: u64, f: Faults) -> Dice {
        Dice::new(Faults { seed, ..f })
    }

    #[test]
    fn rates_are_followed_and_the_sequence_is_seeded() {
        let a = dice(7, Faults::default());
        let hits = (0..20_000).filter(|_| a.roll(3, 250_000)).count();
        assert!((4_500..5_500).contains(&hits), "{hits} of 20000 at 25%");
        assert_eq!(a.injected[3].load(Ordering::Relaxed), hits as u64);
        let (b, c) = (dice(7, Faults::default()), dice(7, Faults::default()));
        let seq = |x: &Dice| (0..100).map(|_| x.roll(3, 500_000)).collect::<Vec<_>>();
        assert_eq!(seq(&b), seq(&c), "same seed, same faults");
        assert_ne!(
            seq(&dice(8, Faults::default())),
            seq(&dice(9, Faults::default()))
        );
        assert!((0..1000).all(|_| !a.roll(0, 0)), "rate 0 never fires");
    }

    #[test]
    fn a_copy_fault_changes_the_bytes_and_claims_success_only_when_a_transport_could_not_tell() {
        let reset = dice(
            1,
            Faults {
                reset_ppm: 1_000_000,
                ..Faults::default()
            },
        );
        let mut dst = vec![7u8; 100];
        let r = reset.after_copy(&mut dst, ImportInfo::default());
        assert!(
            matches!(r, RResult::RErr(ref e) if e.message.contains("connection reset after 50 of 100"))
        );
        assert!(dst[50..].iter().all(|&b| b == 0));
        let short = dice(
            1,
            Faults {
                short_read_ppm: 1_000_000,
                ..Faults::default()
            },
        );
        let mut dst = vec![7u8; 100];
        assert!(matches!(
            short.after_copy(&mut dst, ImportInfo::default()),
            RResult::ROk(_)
        ));
        assert_eq!(
            dst.iter().filter(|&&x| x == 0).count(),
            50,
            "the tail was never written"
        );
        let corrupt = dice(
            1,
            Faults {
                corrupt_ppm: 1_000_000,
                ..Faults::default()
            },
        );
        let mut dst = vec![7u8; 100];
        assert!(matches!(
            corrupt.after_copy(&mut dst, ImportInfo::default()),
            RResult::ROk(_)
        ));
        assert_eq!(
            dst.iter().filter(|&&x| x != 7).count(),
            1,
            "one byte flipped"
        );
    }
}
