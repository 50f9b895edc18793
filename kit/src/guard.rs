//! Panic-safe bodies for the `Transport` methods that cannot return an
//! error (`describe`, `stats`, `health`) and for `import_many`, whose one
//! result per item must survive a panic too. Each runs its body inside
//! [`PluginContext::guard`], so events are forwarded to the host and a panic
//! is logged, never unwound across the boundary.

use std::sync::{Mutex, MutexGuard, PoisonError};

use abi_stable::std_types::{RResult, RSliceMut, RVec};

use shardport_abi::{
    error::{AbiError, PluginResult},
    plugin::PluginContext,
    transport::{Health, ImportInfo, ImportItem, Stat, TransportInfo},
};

/// Locks `m`, recovering from poisoning. A panic caught by the guard may
/// have poisoned a lock; keep every critical section consistent before
/// anything in it can panic, and the next call can go on with its state
/// (otherwise every later call would panic too).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `describe`: `info()`, or `info()` again after a panic was logged.
pub fn describe(ctx: &PluginContext, info: fn() -> TransportInfo) -> TransportInfo {
    ctx.guard_infallible("describe", info(), info)
}

/// `stats`: `f()`, or no stats after a panic was logged.
pub fn stats(ctx: &PluginContext, f: impl FnOnce() -> Vec<Stat>) -> RVec<Stat> {
    ctx.guard_infallible("stats", RVec::new(), || RVec::from(f()))
}

/// `health`: `f()`, or not ok ("health check panicked") after a panic.
pub fn health(ctx: &PluginContext, f: impl FnOnce() -> Health) -> Health {
    ctx.guard_infallible("health", failing("health check panicked"), f)
}

/// A healthy status line.
pub fn ok(message: impl Into<String>) -> Health {
    Health {
        ok: true,
        message: message.into().into(),
    }
}

/// An unhealthy status with the reason.
pub fn failing(message: impl Into<String>) -> Health {
    Health {
        ok: false,
        message: message.into().into(),
    }
}

/// `import_many`: `f(items)` must return one result per item, in order; a
/// panic (logged by the guard) fails every item with the panic's error, and
/// a wrong number of results is an `INTERNAL` error on the missing items.
pub fn import_many(
    ctx: &PluginContext,
    mut items: RSliceMut<'_, ImportItem<'_>>,
    f: impl FnOnce(&mut [ImportItem<'_>]) -> Vec<PluginResult<ImportInfo>>,
) -> RVec<RResult<ImportInfo, AbiError>> {
    let n = items.len();
    match ctx.guard("import_many", || Ok(f(items.as_mut_slice()))) {
        RResult::ROk(v) => {
            let mut out: RVec<RResult<ImportInfo, AbiError>> =
                v.into_iter().take(n).map(RResult::from).collect();
            while out.len() < n {
                out.push(RResult::RErr(AbiError::internal(format!(
                    "item {} of the batch was never imported",
                    out.len()
                ))));
            }
            out
        }
        RResult::RErr(e) => (0..n).map(|_| RResult::RErr(e.clone())).collect(),
    }
}
