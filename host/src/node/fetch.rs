//! fetch: one shard through the first candidate transport that delivers.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use shardport_abi::{AbiError, ErrorKind, LeasedView, ROption, RSlice, RSliceMut, ShardMeta};

use super::{checksum::compute, lock, Fetched, Generation, Node, Selection};
use crate::{
    error::HostError,
    experiment::ArmEvent,
    handle::Handle,
    loader::LoadedPlugin,
    select::{Attempt, Plan},
    vocab::{FetchMode, OnDowngrade, ShardBytes, TransportName},
};

impl Node {
    /// Fetches with the configured default mode.
    pub fn fetch(&self, handle: &Handle) -> Result<Fetched, HostError> {
        let mode = self.inner.live().config.fetch.mode;
        self.fetch_mode(handle, mode)
    }

    /// Fetches a shard as a zero-copy view or a copy.
    pub fn fetch_mode(&self, handle: &Handle, mode: FetchMode) -> Result<Fetched, HostError> {
        let start = Instant::now();
        let _span =
            tracing::debug_span!(target: "fetch", "fetch", shard = %handle.id, %mode).entered();
        if let Some(hit) = self.cached(handle, mode, start) {
            return Ok(hit);
        }
        let target = match mode {
            FetchMode::View => Target::View,
            FetchMode::Copy => Target::Alloc,
        };
        let (data, selection) = self.fetch_inner(handle, mode, target, start)?;
        let data = Arc::new(data.expect("view and alloc targets return bytes"));
        self.remember(handle, &data);
        Ok(Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data,
            selection,
            elapsed: start.elapsed(),
        })
    }

    /// Fetches a shard as memory its caller may **write**: a private,
    /// copy-on-write view where a same-node transport offers one
    /// ([`Transport::import_view_private`](shardport_abi::Transport::import_view_private):
    /// zero-copy until written, and a write never reaches the owner, another
    /// process or another view), else a private copy. What to lend to a
    /// library that ignores read-only flags (torch's DLPack import). Planned
    /// like a view (zero-copy transports first); never cached.
    pub fn fetch_private(&self, handle: &Handle) -> Result<Fetched, HostError> {
        let start = Instant::now();
        let _span =
            tracing::debug_span!(target: "fetch", "fetch_private", shard = %handle.id).entered();
        let (data, selection) =
            self.fetch_inner(handle, FetchMode::View, Target::PrivateView, start)?;
        Ok(Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data: Arc::new(data.expect("private view targets return bytes")),
            selection,
            elapsed: start.elapsed(),
        })
    }

    /// Fetches a shard by copying it into `dst` (`dst.len()` must equal the
    /// shard's byte length). The fastest copy path: the caller reuses a warm
    /// buffer, so no page is faulted in per fetch. Bypasses the cache.
    pub fn fetch_into(&self, handle: &Handle, dst: &mut [u8]) -> Result<Selection, HostError> {
        if dst.len() as u64 != handle.meta.byte_len {
            return Err(HostError::InvalidShard(format!(
                "destination is {} bytes, shard {} is {}",
                dst.len(),
                handle.id,
                handle.meta.byte_len
            )));
        }
        let start = Instant::now();
        let _span =
            tracing::debug_span!(target: "fetch", "fetch_into", shard = %handle.id).entered();
        self.fetch_inner(handle, FetchMode::Copy, Target::Into(dst), start)
            .map(|(_, sel)| sel)
    }

    fn fetch_inner(
        &self,
        handle: &Handle,
        mode: FetchMode,
        mut target: Target<'_>,
        start: Instant,
    ) -> Result<(Option<ShardBytes>, Selection), HostError> {
        let g = self.inner.live();
        self.check_claimed_size(&g, handle)?;
        let plan = self.plan_for(&g, handle, mode, super::plan::Memory::Host);
        let attempts = self.candidates(handle, &plan.attempts, &plan.skipped)?;
        self.deliver(
            &g,
            handle,
            attempts,
            Some(&plan),
            start,
            |attempt, p, desc, note| {
                let data = match &mut target {
                    Target::View if attempt.zero_copy => {
                        LeasedView::import(&p.transport, desc, &handle.meta)
                            .map(|v| Some(ShardBytes::View(v)))
                    }
                    Target::PrivateView if attempt.zero_copy => {
                        match LeasedView::import_private(&p.transport, desc, &handle.meta) {
                            Ok(v) => Ok(Some(ShardBytes::View(v))),
                            // No private views in this transport: a private
                            // copy through it, rather than a slower one.
                            Err(e) if e.kind == ErrorKind::UNSUPPORTED => {
                                let mut buf = self
                                    .inner
                                    .copy_destination(handle.meta.byte_len)
                                    .map_err(Miss::Stop)?;
                                import_into(p, desc, &handle.meta, &mut buf, note)
                                    .map(|()| Some(ShardBytes::Owned(buf)))
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Target::View | Target::PrivateView | Target::Alloc => {
                        let mut buf = self
                            .inner
                            .copy_destination(handle.meta.byte_len)
                            .map_err(Miss::Stop)?;
                        import_into(p, desc, &handle.meta, &mut buf, note)
                            .map(|()| Some(ShardBytes::Owned(buf)))
                    }
                    Target::Into(dst) => {
                        import_into(p, desc, &handle.meta, dst, note).map(|()| None)
                    }
                }
                .map_err(Miss::Failed)?;
                let bytes: &[u8] = match (&data, &target) {
                    (Some(d), _) => d,
                    (None, Target::Into(dst)) => dst,
                    (None, _) => &[],
                };
                // Wrong bytes from this transport: the next one may do better.
                self.verify(&g, handle, &attempt.transport, bytes)
                    .map_err(Miss::Corrupt)?;
                Ok(data)
            },
        )
        .map(|(data, mut selection)| {
            // A view asked for and a copy delivered (a transport without
            // private views): the selection says what was served.
            if selection.mode == FetchMode::View && matches!(data, Some(ShardBytes::Owned(_))) {
                selection.mode = FetchMode::Copy;
                selection
                    .reason
                    .push_str(", a private copy (the transport lends no private views)");
            }
            (data, selection)
        })
    }

    /// The plan's attempts, or `NoCandidate` (counted) when there is none.
    pub(super) fn candidates<'p>(
        &self,
        handle: &Handle,
        attempts: &'p [Attempt],
        skipped: &[(TransportName, String)],
    ) -> Result<&'p [Attempt], HostError> {
        if attempts.is_empty() {
            self.inner.metrics.fetch_error(None);
            return Err(HostError::NoCandidate {
                id: handle.id,
                skipped: skipped.to_vec(),
            });
        }
        Ok(attempts)
    }

    /// Tries `attempts` in order until `import` delivers (every fetch path:
    /// host view or copy, device view or copy). Each miss is counted,
    /// logged and listed in the selection; an experiment arm (`arm`: the
    /// plan, when the fetch takes part) records the outcome. Fails with the
    /// first verification error, else `FetchFailed` listing every attempt.
    pub(super) fn deliver<T>(
        &self,
        g: &Generation,
        handle: &Handle,
        attempts: &[Attempt],
        arm: Option<&Plan>,
        start: Instant,
        mut import: impl FnMut(&Attempt, &LoadedPlugin, &[u8], &mut String) -> Result<T, Miss>,
    ) -> Result<(T, Selection), HostError> {
        let len = handle.meta.byte_len;
        let mut failures: Vec<(TransportName, AbiError)> = Vec::new();
        let mut corrupt: Option<HostError> = None;
        let exhausted_wait = g.config.fetch.exhausted_wait;
        for attempt in attempts {
            let p = &g.plugins[attempt.plugin];
            let desc = &handle.exports[attempt.export].descriptor;
            // What the transport says of how it served (a relay, say).
            let mut note = String::new();
            let mut outcome = import(attempt, p, desc, &mut note);
            // A limit exhausted at the transport (a lease table, a pool):
            // retried, backing off, for up to `fetch.exhausted-wait`.
            let waiting = Instant::now();
            let mut backoff = Duration::from_micros(200);
            while let Err(Miss::Failed(e)) = &outcome {
                if e.kind != ErrorKind::RESOURCE_EXHAUSTED
                    || waiting.elapsed() + backoff > exhausted_wait
                {
                    break;
                }
                self.inner.metrics.exhausted_wait();
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(20));
                outcome = import(attempt, p, desc, &mut note);
            }
            let e = match outcome {
                Ok(value) => {
                    let latency = start.elapsed();
                    if let Some(plan) = arm {
                        self.record_arm(g, plan, Some(&attempt.transport), len, latency);
                    }
                    let selection = self.report(g, handle, attempt, &note, failures)?;
                    self.inner
                        .metrics
                        .fetch_ok(attempt.transport.as_str(), len, latency);
                    return Ok((value, selection));
                }
                Err(Miss::Stop(e)) => return Err(e),
                Err(Miss::Failed(e)) => {
                    tracing::debug!(target: "select", transport = %attempt.transport, error = %e, "attempt failed");
                    self.inner
                        .metrics
                        .fetch_error(Some(attempt.transport.as_str()));
                    e
                }
                Err(Miss::Corrupt(e)) => {
                    tracing::warn!(target: "select", transport = %attempt.transport, error = %e, "fetched bytes failed verification");
                    let err = AbiError::internal(e.to_string());
                    corrupt.get_or_insert(e);
                    err
                }
            };
            failures.push((attempt.transport.clone(), e));
        }
        if let Some(plan) = arm {
            self.record_arm(g, plan, None, len, start.elapsed());
        }
        Err(corrupt.unwrap_or(HostError::FetchFailed {
            id: handle.id,
            failures,
        }))
    }

    /// Refuses a handle claiming more than `node.max-shard-size`, before
    /// anything is allocated for it.
    pub(super) fn check_claimed_size(
        &self,
        g: &Generation,
        handle: &Handle,
    ) -> Result<(), HostError> {
        let max = g.config.node.max_shard_size;
        if handle.meta.byte_len > max {
            return Err(HostError::InvalidShard(format!(
                "shard {} claims {} bytes, over node.max-shard-size = {max}",
                handle.id, handle.meta.byte_len
            )));
        }
        Ok(())
    }

    /// The selection plan for `handle` on this node (each call counts as
    /// one fetch for per-fetch experiments). Exports a transport refuses in
    /// `can_import` are skipped with its reason; host fetches of CUDA shards
    /// are copies (see `node::device`).
    pub fn plan(&self, handle: &Handle, mode: FetchMode) -> Plan {
        self.plan_for(&self.inner.live(), handle, mode, super::plan::Memory::Host)
    }

    /// Records the outcome of a fetch for its experiment arm, if it has one,
    /// and applies the arm's guardrail. `served`: the transport that served
    /// the fetch (`None`: every attempt failed).
    pub(super) fn record_arm(
        &self,
        g: &Generation,
        plan: &Plan,
        served: Option<&TransportName>,
        bytes: u64,
        latency: Duration,
    ) {
        let Some(choice) = &plan.arm else { return };
        let exp = &g.config.experiments[choice.experiment];
        let arm = &exp.arms[choice.arm];
        let counters = &g.arm_counters[choice.experiment];
        counters[choice.arm].assigned();
        if let Some(d) = choice.redirected_from {
            counters[d].redirected();
        }
        let ok = served == Some(&arm.transport);
        if ok {
            counters[choice.arm].ok(bytes, latency);
        } else {
            counters[choice.arm].error(served.is_some());
        }
        let latency_ns = latency.as_nanos().min(u128::from(u64::MAX)) as u64;
        let now = self.inner.clock.monotonic_nanos();
        let st = &g.experiments[choice.experiment];
        if let Some(event) = st.record(exp, choice.arm, ok, latency_ns, now) {
            if matches!(event, ArmEvent::Tripped { .. }) {
                counters[choice.arm].tripped();
            }
            self.log_arm_event(exp, &event);
            let ramped = exp.ramp.as_ref().is_some_and(|r| r.arm == choice.arm);
            if let (true, ArmEvent::Tripped { .. }, Some((step, true))) =
                (ramped, &event, st.ramp())
            {
                self.log_arm_event(exp, &ArmEvent::RampHalted { step });
            }
        }
    }

    /// Builds the selection report of a successful attempt, applying the
    /// downgrade policy.
    pub(super) fn report(
        &self,
        g: &Generation,
        handle: &Handle,
        attempt: &Attempt,
        note: &str,
        failures: Vec<(TransportName, AbiError)>,
    ) -> Result<Selection, HostError> {
        // A view served as a copy is not by itself a downgrade: the plan puts
        // zero-copy candidates first, so if one existed and failed it is in
        // `failures`; if none existed (a remote owner) a copy is the best there is.
        let downgraded = !failures.is_empty();
        let mut reason = attempt.reason.clone();
        if !note.is_empty() {
            reason.push_str(" (");
            reason.push_str(note);
            reason.push(')');
        }
        if !failures.is_empty() {
            let names: Vec<&str> = failures.iter().map(|(t, _)| t.as_str()).collect();
            reason.push_str(&format!("; after {} failed", names.join(", ")));
        }
        if downgraded {
            self.inner.metrics.downgrade(attempt.transport.as_str());
            let list: Vec<String> = failures.iter().map(|(t, e)| format!("{t}: {e}")).collect();
            let why = format!(
                "served by `{}` after {}",
                attempt.transport,
                list.join("; ")
            );
            match g.config.fetch.on_downgrade {
                OnDowngrade::Fail => return Err(HostError::Downgrade { id: handle.id, why }),
                OnDowngrade::Warn => {
                    tracing::warn!(target: "select", shard = %handle.id, "downgrade: {why}")
                }
                OnDowngrade::Allow => {
                    tracing::debug!(target: "select", shard = %handle.id, "downgrade: {why}")
                }
            }
        }
        tracing::debug!(target: "select", transport = %attempt.transport, %reason, downgraded, "fetched");
        Ok(Selection {
            transport: attempt.transport.to_string(),
            reason,
            downgraded,
            mode: if attempt.zero_copy {
                FetchMode::View
            } else {
                FetchMode::Copy
            },
            failures: failures
                .iter()
                .map(|(t, e)| (t.to_string(), e.to_string()))
                .collect(),
        })
    }

    pub(super) fn verify(
        &self,
        g: &Generation,
        handle: &Handle,
        transport: &TransportName,
        data: &[u8],
    ) -> Result<(), HostError> {
        if !g.config.fetch.verify_checksum {
            return Ok(());
        }
        let ROption::RSome(expected) = handle.meta.checksum else {
            return Ok(());
        };
        let found = compute(expected.algo, data);
        if found != Some(expected.value) {
            self.inner.metrics.fetch_error(Some(transport.as_str()));
            return Err(HostError::ChecksumMismatch {
                id: handle.id,
                transport: transport.clone(),
                expected: expected.value,
                found: found.unwrap_or(0),
            });
        }
        Ok(())
    }

    /// A cache hit for `handle` in `mode`, if the policy keeps results.
    pub(super) fn cached(
        &self,
        handle: &Handle,
        mode: FetchMode,
        start: Instant,
    ) -> Option<Fetched> {
        let mut cache = lock(&self.inner.cache);
        if !cache.policy().enabled {
            return None;
        }
        let now = self.inner.clock.monotonic_nanos();
        let data = cache.get(handle.id, &handle.meta, mode == FetchMode::View, now)?;
        drop(cache);
        Some(Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data,
            selection: Selection {
                transport: "cache".to_owned(),
                reason: "consumer cache hit".to_owned(),
                downgraded: false,
                mode,
                failures: Vec::new(),
            },
            elapsed: start.elapsed(),
        })
    }

    /// Keeps a fetched shard when the cache policy says so, and applies the
    /// policy's eviction.
    pub(super) fn remember(&self, handle: &Handle, data: &Arc<ShardBytes>) {
        let mut cache = lock(&self.inner.cache);
        if !cache.policy().enabled {
            // Nothing kept: no clock read, no metadata copy.
            return;
        }
        let now = self.inner.clock.monotonic_nanos();
        let removed = cache.insert(handle.id, handle.meta.clone(), data, now);
        drop(cache);
        // Evicted leases end here, outside the lock (release is a plugin call).
        if !removed.is_empty() {
            tracing::debug!(target: "cache", evicted = removed.len(), "cache eviction");
        }
        drop(removed);
    }
}

/// Why one attempt did not deliver.
pub(super) enum Miss {
    /// The transport failed; the next candidate is tried.
    Failed(AbiError),
    /// The bytes failed verification (already counted); the next candidate is tried.
    Corrupt(HostError),
    /// The fetch cannot go on (the buffer cannot be allocated).
    Stop(HostError),
}

/// Where a host fetch puts the bytes.
enum Target<'a> {
    View,
    /// A view the caller may write (`fetch_private`).
    PrivateView,
    Alloc,
    Into(&'a mut [u8]),
}

/// One `import_into`; the transport's note (how it served) goes to `note`.
pub(super) fn import_into(
    p: &LoadedPlugin,
    desc: &[u8],
    meta: &ShardMeta,
    dst: &mut [u8],
    note: &mut String,
) -> Result<(), AbiError> {
    p.transport
        .import_into(
            RSlice::from_slice(desc),
            meta,
            RSliceMut::from_mut_slice(dst),
        )
        .into_result()
        .map(|info| {
            note.clear();
            note.push_str(&info.note);
        })
}
