//! The worker's operations, one function per request kind that does more
//! than one call (the dispatch is [`super::handle`]).

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use shardport_abi::DType;
use shardport_host::{
    handle::Handle,
    node::{Node, TensorSpec},
    vocab::FetchMode,
    DevicePtr, HostError, Selection,
};

use super::{check_pattern, decode_handle, fill_pattern, parse_id, Reply, State};

/// `put_buffer`: a put from the buffer this worker keeps for `(len, seed)`.
pub(super) fn put_buffer(
    node: &Node,
    state: &mut State,
    len: u64,
    seed: u64,
    tags: BTreeMap<String, String>,
) -> Reply {
    let Ok(n) = usize::try_from(len) else {
        return Reply::err(format!("{len} bytes do not fit in memory here"));
    };
    let source = match &mut state.source {
        Some((s, buf)) if *s == seed && buf.len() == n => buf,
        slot => {
            let mut buf = Vec::new();
            if buf.try_reserve_exact(n).is_err() {
                return Reply::err(format!("cannot allocate a {len}-byte source buffer"));
            }
            buf.resize(n, 0);
            fill_pattern(&mut buf, seed);
            &mut slot.insert((seed, buf)).1
        }
    };
    let start = Instant::now();
    put_reply(start, node.put(source, &TensorSpec::bytes(len), tags))
}

/// The reply to a put timed from `start`: the handle and the time.
fn put_reply(start: Instant, put: Result<Handle, HostError>) -> Reply {
    match put {
        Ok(h) => Reply {
            ns: Some(start.elapsed().as_nanos() as u64),
            handle: Some(hex::encode(h.to_bytes())),
            id: Some(h.id.to_string()),
            ..Reply::ok()
        },
        Err(e) => Reply::host_err(&e),
    }
}

/// The reply to a fetch of `h` that took `ns`: which transport served it,
/// how and why, and whether the bytes were right (when checked).
fn fetched_reply(h: &Handle, ns: u64, sel: Selection, verified: Option<bool>) -> Reply {
    Reply {
        id: Some(h.id.to_string()),
        ns: Some(ns),
        transport: Some(sel.transport),
        reason: Some(sel.reason),
        downgraded: Some(sel.downgraded),
        mode: Some(sel.mode),
        verified,
        ..Reply::ok()
    }
}

/// `fetch_buffer`: a copy into this worker's warm buffer, timed.
pub(super) fn fetch_buffer(
    node: &Node,
    state: &mut State,
    handle: &str,
    only: Option<&str>,
    seed: Option<u64>,
) -> Reply {
    let h = match decode_handle(handle, only) {
        Ok(h) => h,
        Err(e) => return Reply::err(e),
    };
    if let Err(e) = scratch(state, h.meta.byte_len) {
        return Reply::err(e);
    }
    let start = Instant::now();
    match node.fetch_into(&h, &mut state.scratch) {
        Ok(sel) => {
            let ns = start.elapsed().as_nanos() as u64;
            let verified = seed.map(|s| check_pattern(&state.scratch, s));
            fetched_reply(&h, ns, sel, verified)
        }
        Err(e) => Reply::host_err(&e),
    }
}

/// Sizes the buffer `fetch_buffer` fetches into to `len` bytes, written
/// once (every page backed), unless it has that size already: what an
/// application's destination (a weight tensor) is before its fetch.
pub(super) fn scratch(state: &mut State, len: u64) -> Result<(), String> {
    let n = usize::try_from(len).map_err(|_| "the shard does not fit in memory here".to_owned())?;
    if state.scratch.len() != n {
        state.scratch = Vec::new();
        if state.scratch.try_reserve_exact(n).is_err() {
            return Err(format!("cannot allocate a {n}-byte buffer"));
        }
        state.scratch.resize(n, 0);
    }
    Ok(())
}

/// `put_device`: a device put of the memory this worker keeps for
/// `(len, seed)`.
pub(super) fn put_device(node: &Node, state: &mut State, len: u64, seed: u64) -> Reply {
    if state
        .device_source
        .as_ref()
        .is_none_or(|(s, mem)| *s != seed || mem.len() != len)
    {
        // The old memory goes before the new is allocated.
        if let Err(e) = free_device_source(node, state) {
            return Reply::err(e);
        }
        let mem = match crate::gpu::DeviceMem::new(len).and_then(|m| m.fill(seed).map(|()| m)) {
            Ok(m) => m,
            Err(e) => return Reply::err(format!("device memory for the put: {e}")),
        };
        state.device_source = Some((seed, mem));
    }
    let source = &state.device_source.as_ref().expect("just made").1;
    let start = Instant::now();
    let put = node.put_device(
        DevicePtr(source.addr()),
        len,
        &crate::gpu::spec(len),
        BTreeMap::new(),
    );
    if let Ok(h) = &put {
        state.device_puts.push(h.id);
    }
    put_reply(start, put)
}

/// Frees the device memory `put_device` puts from, after removing the
/// shards put from it (their exports end); refused, keeping it, while a
/// consumer still holds a lease on device memory this node exported (the
/// `put_device` contract).
pub(super) fn free_device_source(node: &Node, state: &mut State) -> Result<(), String> {
    if state.device_source.is_none() {
        return Ok(());
    }
    node.remove(&std::mem::take(&mut state.device_puts));
    match node.device_leases_held() {
        0 => {
            state.device_source = None;
            Ok(())
        }
        n => Err(format!(
            "{n} consumer lease(s) still hold device memory this worker put; it stays allocated"
        )),
    }
}

/// `fetch_device`: a device view, or a copy into this worker's device
/// memory, timed; verified on the host afterwards when `seed` is given.
pub(super) fn fetch_device(
    node: &Node,
    state: &mut State,
    handle: &str,
    into: bool,
    only: Option<&str>,
    seed: Option<u64>,
) -> Reply {
    let h = match decode_handle(handle, only) {
        Ok(h) => h,
        Err(e) => return Reply::err(e),
    };
    let len = h.meta.byte_len;
    if into && state.device_scratch.as_ref().is_none_or(|m| m.len() != len) {
        state.device_scratch = None;
        match crate::gpu::DeviceMem::new(len) {
            Ok(m) => state.device_scratch = Some(m),
            Err(e) => return Reply::err(format!("device memory for the fetch: {e}")),
        }
    }
    let start = Instant::now();
    // The view (when viewing) lives until the bytes are checked.
    let fetched = match (&state.device_scratch, into) {
        (Some(dst), true) => node
            .fetch_device_into(&h, DevicePtr(dst.addr()), len)
            .map(|sel| (sel, dst.addr(), None)),
        _ => node
            .fetch_device(&h)
            .map(|v| (v.selection().clone(), v.addr().0, Some(v))),
    };
    let ns = start.elapsed().as_nanos() as u64;
    let (sel, addr, _view) = match fetched {
        Ok(f) => f,
        Err(e) => return Reply::host_err(&e),
    };
    let verified = match seed.map(|s| crate::gpu::holds_pattern(addr, len, s)) {
        Some(Err(e)) => return Reply::err(format!("reading the fetched bytes back: {e}")),
        Some(Ok(v)) => Some(v),
        None => None,
    };
    fetched_reply(&h, ns, sel, verified)
}

/// `fetch_many`: one batch copy, each shard checked against its seed.
pub(super) fn fetch_many(node: &Node, handles: &[String], seeds: Option<Vec<u64>>) -> Reply {
    let hs: Result<Vec<Handle>, String> = handles
        .iter()
        .map(|h| decode_handle(h, None).map_err(|e| e.to_string()))
        .collect();
    let hs = match hs {
        Ok(h) => h,
        Err(e) => return Reply::err(e),
    };
    if seeds.as_ref().is_some_and(|s| s.len() != hs.len()) {
        return Reply::err("`seeds` must have one seed per handle");
    }
    let start = Instant::now();
    let results = match node.fetch_many(&hs, FetchMode::Copy) {
        Ok(r) => r,
        Err(e) => return Reply::err(e),
    };
    let ns = start.elapsed().as_nanos() as u64;
    let mut verified = true;
    let mut transports = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(f) => {
                if let Some(s) = &seeds {
                    verified &= check_pattern(&f.data, s[i]);
                }
                transports.push(f.selection.transport);
            }
            Err(e) => return Reply::err(format!("shard {i}: {e}")),
        }
    }
    transports.dedup();
    Reply {
        ns: Some(ns),
        transport: Some(transports.join(",")),
        verified: seeds.as_ref().map(|_| verified),
        ..Reply::ok()
    }
}

/// `put`: `len` bytes of the pattern for `seed`, as `dtype` elements.
pub(super) fn put(
    node: &Node,
    len: u64,
    seed: u64,
    dtype: Option<String>,
    tags: BTreeMap<String, String>,
) -> Reply {
    let dtype = match dtype.as_deref().map(DType::from_name) {
        None => DType::U8,
        Some(Some(d)) => d,
        Some(None) => return Reply::err(format!("unknown dtype `{}`", dtype.unwrap_or_default())),
    };
    let width = u64::from(dtype.bits().unwrap_or(8).div_ceil(8));
    if len % width != 0 {
        return Reply::err(format!(
            "{len} bytes is not a whole number of {dtype} elements"
        ));
    }
    let spec = TensorSpec {
        dtype,
        shape: vec![len / width],
        device: shardport_abi::Device::CPU,
    };
    let start = Instant::now();
    put_reply(
        start,
        node.put_with(&spec, tags, |dst| fill_pattern(dst, seed)),
    )
}

/// `fetch`: one fetch, checked, kept until `release` when `hold`.
pub(super) fn fetch(
    node: &Node,
    state: &mut State,
    handle: &str,
    mode: Option<FetchMode>,
    seed: Option<u64>,
    hold: bool,
    only: Option<&str>,
) -> Reply {
    let h = match decode_handle(handle, only) {
        Ok(h) => h,
        Err(e) => return Reply::err(e),
    };
    let mode = mode.unwrap_or(node.config().fetch.mode);
    match node.fetch_mode(&h, mode) {
        Ok(f) => {
            let ns = f.elapsed.as_nanos() as u64;
            let verified = seed.map(|s| check_pattern(&f.data, s));
            if hold {
                state.held.insert(f.id, Arc::clone(&f.data));
            }
            Reply {
                id: Some(f.id.to_string()),
                ns: Some(ns),
                transport: Some(f.selection.transport),
                reason: Some(f.selection.reason),
                downgraded: Some(f.selection.downgraded),
                mode: Some(f.selection.mode),
                verified,
                ..Reply::ok()
            }
        }
        Err(e) => Reply::host_err(&e),
    }
}

/// `remove`: the ids must all parse before anything is removed.
pub(super) fn remove(node: &Node, ids: &[String]) -> Reply {
    let mut parsed = Vec::new();
    for s in ids {
        match parse_id(s) {
            Ok(id) => parsed.push(id),
            Err(e) => return Reply::err(e),
        }
    }
    let missing = node
        .remove(&parsed)
        .iter()
        .map(ToString::to_string)
        .collect();
    Reply {
        missing: Some(missing),
        ..Reply::ok()
    }
}

/// `drain`: the listed ids, or every cached copy when none is listed.
pub(super) fn drain(node: &Node, ids: &[String]) -> Reply {
    if ids.is_empty() {
        return Reply {
            drained: Some(node.drain_all()),
            ..Reply::ok()
        };
    }
    match ids
        .iter()
        .map(|s| parse_id(s))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(ids) => Reply {
            drained: Some(node.drain(&ids)),
            ..Reply::ok()
        },
        Err(e) => Reply::err(e),
    }
}
