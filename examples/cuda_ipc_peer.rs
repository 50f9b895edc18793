//! A GPU peer process for the two-process CUDA IPC test and benchmark
//! (`tests/e2e/cuda.rs`, `shardport`'s BENCHMARKS): one process owns device
//! buffers and puts them with `Node::put_device`; another fetches them as
//! zero-copy device views, device-to-device copies and host copies, and
//! checks every byte. Needs a CUDA GPU; without one it prints
//! `SKIP <reason>` and exits 0.
//!
//! ```text
//! cuda_ipc_peer owner CONFIG      # stdin: PUT len seed offset [allocator] | REALLOC len seed
//!                                 #        | PUTHOST len seed | REMOVE handle-hex
//!                                 #        | LEASES | SWEEP | STATS | EXIT
//! cuda_ipc_peer consumer CONFIG   # stdin: FETCH handle-hex seed | BENCH handle-hex iters
//!                                 #        | COPYFETCH handle-hex seed | STAGEDBENCH handle-hex iters
//!                                 #        | HOSTBENCH handle-hex iters
//!                                 #        | HOLD handle-hex | DROP | STATS | EXIT
//! ```
//! `allocator` is `plain` (cuMemAlloc, the default), `vmm` / `vmm:<chunk
//! bytes>` (VMM chunks exportable as file descriptors, like PyTorch's
//! expandable segments), `pool` (cudaMallocAsync's pool) or `managed`.
//! `COPYFETCH` and `STAGEDBENCH` copy without a view (`fetch_device_into`
//! and a host copy), what a consumer on another machine does: its config
//! loads http but not cuda-ipc, so the shard is staged over http.
//! `HOLD` keeps a zero-copy view (and so a lease on the owner's board) until
//! `DROP`, so a test can kill a consumer that holds one.
//! Replies are one line each: `OK ...`, `ERR ...`, `HANDLE <hex>`.

#![allow(clippy::print_stdout)] // a line protocol on stdout is this program's interface

use std::{
    io::{BufRead, Write},
    path::Path,
    time::Instant,
};

use shardport_abi::{DType, Device};
use shardport_cli::worker::{check_pattern, fill_pattern};
use shardport_cuda_ipc::testkit::{unavailable_reason, Allocator, DeviceScratch};
use shardport_host::{config, DevicePtr, FetchMode, Handle, Node, TensorSpec};

fn spec(len: u64) -> TensorSpec {
    TensorSpec {
        dtype: DType::U8,
        shape: vec![len],
        device: Device::cuda(0),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err("odd hex length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: cuda_ipc_peer owner|consumer CONFIG");
        return std::process::ExitCode::from(2);
    }
    if let Some(why) = unavailable_reason() {
        println!("SKIP {why}");
        return std::process::ExitCode::SUCCESS;
    }
    let cfg = match config::load(Path::new(&args[2])) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("config: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let node = match Node::start(cfg) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("node: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    println!("READY");
    let r = match args[1].as_str() {
        "owner" => owner(&node),
        "consumer" => consumer(&node),
        other => Err(format!("unknown role {other}")),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::from(1)
        }
    }
}

fn reply(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn owner(node: &Node) -> Result<(), String> {
    // Buffers stay allocated until EXIT (or REALLOC frees the last one).
    let mut buffers: Vec<DeviceScratch> = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            w.get(i)
                .ok_or(format!("missing argument {i}"))?
                .parse()
                .map_err(|e| format!("argument {i}: {e}"))
        };
        match w.first().copied() {
            Some("PUT") | Some("REALLOC") => {
                let (len, seed) = (num(1)?, num(2)?);
                let offset = if w[0] == "PUT" { num(3)? } else { 0 };
                if w[0] == "REALLOC" {
                    // Free the previous allocation first, so the driver may
                    // hand the same address (and handle) out again.
                    buffers.pop();
                }
                let allocator: Allocator = match w.get(4) {
                    Some(a) => a.parse()?,
                    None => Allocator::Plain,
                };
                let buf = DeviceScratch::with(0, offset + len.max(1), allocator)?;
                let mut bytes = vec![0u8; len as usize];
                fill_pattern(&mut bytes, seed);
                buf.upload_at(offset, &bytes)?;
                match node.put_device(
                    DevicePtr(buf.addr() + offset),
                    len,
                    &spec(len),
                    Default::default(),
                ) {
                    Ok(h) => reply(format!("HANDLE {}", hex(&h.to_bytes()))),
                    Err(e) => reply(format!("ERR {e}")),
                }
                buffers.push(buf);
            }
            Some("PUTHOST") => {
                // A host shard of the same bytes: the plain http baseline.
                let (len, seed) = (num(1)?, num(2)?);
                let mut bytes = vec![0u8; len as usize];
                fill_pattern(&mut bytes, seed);
                let spec = TensorSpec {
                    device: Device::CPU,
                    ..spec(len)
                };
                match node.put(&bytes, &spec, Default::default()) {
                    Ok(h) => reply(format!("HANDLE {}", hex(&h.to_bytes()))),
                    Err(e) => reply(format!("ERR {e}")),
                }
            }
            Some("REMOVE") => {
                let h = Handle::from_bytes(&unhex(w.get(1).ok_or("missing handle")?)?)
                    .map_err(|e| e.to_string())?;
                let missing = node.remove(&[h.id]);
                reply(format!(
                    "OK removed={} leases_held={}",
                    missing.is_empty(),
                    node.device_leases_held()
                ));
            }
            Some("LEASES") => reply(format!("OK leases_held={}", node.device_leases_held())),
            Some("SWEEP") => {
                node.sweep();
                reply(format!("OK leases_held={}", node.device_leases_held()));
            }
            Some("STATS") => reply(cuda_stats(node)),
            Some("EXIT") | None => break,
            Some(other) => reply(format!("ERR unknown command {other}")),
        }
    }
    node.clear();
    Ok(())
}

fn consumer(node: &Node) -> Result<(), String> {
    let mut held = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some(cmd @ ("FETCH" | "BENCH" | "HOSTBENCH" | "COPYFETCH" | "STAGEDBENCH")) => {
                // `<cmd> handle-hex n`: n is a seed or an iteration count.
                let h = Handle::from_bytes(&unhex(w.get(1).ok_or("missing handle")?)?)
                    .map_err(|e| e.to_string())?;
                let n: u64 = w
                    .get(2)
                    .ok_or("missing seed or iterations")?
                    .parse()
                    .map_err(|e| format!("{e}"))?;
                let r = match cmd {
                    "FETCH" => verify(node, &h, n),
                    "BENCH" => bench(node, &h, n as u32),
                    "HOSTBENCH" => host_bench(node, &h, n as u32),
                    "COPYFETCH" => verify_copies(node, &h, n),
                    _ => staged_bench(node, &h, n as u32),
                };
                reply(match r {
                    Ok(s) => format!("OK {s}"),
                    Err(e) => format!("ERR {e}"),
                });
            }
            Some("HOLD") => {
                let h = Handle::from_bytes(&unhex(w.get(1).ok_or("missing handle")?)?)
                    .map_err(|e| e.to_string())?;
                reply(match node.fetch_device(&h) {
                    Ok(v) => {
                        held.push(v);
                        format!("OK held={}", held.len())
                    }
                    Err(e) => format!("ERR {e}"),
                });
            }
            Some("DROP") => {
                held.clear();
                reply("OK held=0".into());
            }
            Some("STATS") => reply(cuda_stats(node)),
            Some("EXIT") | None => break,
            Some(other) => reply(format!("ERR unknown command {other}")),
        }
    }
    Ok(())
}

/// The cuda-ipc plugin's stats as one JSON line.
fn cuda_stats(node: &Node) -> String {
    let stats = node.stats();
    let cuda = stats.plugins.iter().find(|p| p.name == "cuda-ipc");
    format!(
        "OK {}",
        serde_json::to_string(&cuda.map(|p| &p.stats)).unwrap_or_default()
    )
}

/// Zero-copy view (read back through a device-to-device copy), a
/// device-to-device fetch, and a host copy: all three must hold the pattern.
fn verify(node: &Node, h: &Handle, seed: u64) -> Result<String, String> {
    let len = h.meta.byte_len;
    let view = node.fetch_device(h).map_err(|e| e.to_string())?;
    let scratch = DeviceScratch::new(0, len.max(1))?;
    scratch.copy_from_device(view.addr().0, len)?;
    if !check_pattern(&scratch.download(len)?, seed) {
        return Err("zero-copy view: wrong bytes".into());
    }
    let transport = view.selection().transport.clone();
    drop(view);
    scratch.fill(0)?;
    node.fetch_device_into(h, DevicePtr(scratch.addr()), len)
        .map_err(|e| e.to_string())?;
    if !check_pattern(&scratch.download(len)?, seed) {
        return Err("device-to-device fetch: wrong bytes".into());
    }
    let host = node
        .fetch_mode(h, FetchMode::Copy)
        .map_err(|e| e.to_string())?;
    if !check_pattern(&host.data, seed) {
        return Err("host copy: wrong bytes".into());
    }
    Ok(format!(
        "transport={transport} host_transport={}",
        host.selection.transport
    ))
}

/// A device-to-device fetch into a buffer of this process and a host copy
/// (no view): both must hold the pattern.
fn verify_copies(node: &Node, h: &Handle, seed: u64) -> Result<String, String> {
    let len = h.meta.byte_len;
    let scratch = DeviceScratch::new(0, len.max(1))?;
    let sel = node
        .fetch_device_into(h, DevicePtr(scratch.addr()), len)
        .map_err(|e| e.to_string())?;
    if !check_pattern(&scratch.download(len)?, seed) {
        return Err("device fetch: wrong bytes".into());
    }
    let host = node
        .fetch_mode(h, FetchMode::Copy)
        .map_err(|e| e.to_string())?;
    if !check_pattern(&host.data, seed) {
        return Err("host copy: wrong bytes".into());
    }
    Ok(format!(
        "transport={} host_transport={}",
        sel.transport, host.selection.transport
    ))
}

/// Raw TCP over loopback, one connection, `bytes` sent in 4 MiB writes:
/// GB/s, the network limit of a staged fetch measured in the same run.
fn tcp_loopback_gbs(bytes: u64) -> Result<f64, String> {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let mut s = std::net::TcpStream::connect(addr)?;
        let buf = vec![7u8; 4 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            s.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let (mut r, _) = listener.accept().map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4 << 20];
    let t = Instant::now();
    let mut got = 0u64;
    while got < bytes {
        let n = r.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the sender closed early".into());
        }
        got += n as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    sender
        .join()
        .map_err(|_| "sender panicked".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(bytes as f64 / secs / 1e9)
}

/// A GPU shard staged over http into this process's device memory
/// (`fetch_device_into`, `iters` times), beside the limits measured in the
/// same run: pinned device-to-host and host-to-device copies of the same
/// size, and raw TCP over loopback; `ratio` is the staged speed over the
/// slowest of the three.
fn staged_bench(node: &Node, h: &Handle, iters: u32) -> Result<String, String> {
    let len = h.meta.byte_len;
    let dst = DeviceScratch::new(0, len.max(1))?;
    // Warm: connection, pools, pinned buffers.
    node.fetch_device_into(h, DevicePtr(dst.addr()), len)
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..iters {
        node.fetch_device_into(h, DevicePtr(dst.addr()), len)
            .map_err(|e| e.to_string())?;
    }
    let staged = (len as f64 * f64::from(iters)) / t.elapsed().as_secs_f64() / 1e9;
    let (d2h, h2d) = dst.pinned_copy_gbs(iters)?;
    let tcp = tcp_loopback_gbs(len * u64::from(iters))?;
    let floor = d2h.min(h2d).min(tcp);
    Ok(format!(
        "bytes={len} staged_gbs={staged:.2} d2h_gbs={d2h:.2} h2d_gbs={h2d:.2} tcp_gbs={tcp:.2} ratio={:.2}",
        staged / floor
    ))
}

/// A host shard fetched over http into a reused buffer (`fetch_into`,
/// `iters` times after one warm-up): the plain http path a staged GPU fetch
/// is compared with, GB/s.
fn host_bench(node: &Node, h: &Handle, iters: u32) -> Result<String, String> {
    let len = h.meta.byte_len;
    let mut dst = vec![0u8; len as usize];
    node.fetch_into(h, &mut dst).map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..iters {
        node.fetch_into(h, &mut dst).map_err(|e| e.to_string())?;
    }
    let gbs = (len as f64 * f64::from(iters)) / t.elapsed().as_secs_f64() / 1e9;
    Ok(format!("bytes={len} http_host_gbs={gbs:.2}"))
}

/// First-open and cached view latency, device-to-device fetch bandwidth and
/// a local cuMemcpyDtoD baseline of the same size, all in this process.
/// The scratch buffers are allocated first, so the process's CUDA context
/// exists before anything is timed (as in scripts/bench_torch_ipc.py): the
/// first open measures the IPC open, not the context's creation.
fn bench(node: &Node, h: &Handle, iters: u32) -> Result<String, String> {
    let len = h.meta.byte_len;
    let dst = DeviceScratch::new(0, len.max(1))?;
    let src = DeviceScratch::new(0, len.max(1))?;
    let t = Instant::now();
    let first = node.fetch_device(h).map_err(|e| e.to_string())?;
    let first_us = t.elapsed().as_secs_f64() * 1e6;
    drop(first);
    let mut cached = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let t = Instant::now();
        let v = node.fetch_device(h).map_err(|e| e.to_string())?;
        cached.push(t.elapsed().as_secs_f64() * 1e6);
        drop(v);
    }
    cached.sort_by(f64::total_cmp);
    let t = Instant::now();
    for _ in 0..iters {
        node.fetch_device_into(h, DevicePtr(dst.addr()), len)
            .map_err(|e| e.to_string())?;
    }
    let ipc_gbs = (len as f64 * f64::from(iters)) / t.elapsed().as_secs_f64() / 1e9;
    let t = Instant::now();
    for _ in 0..iters {
        dst.copy_from_device(src.addr(), len)?;
    }
    let local_gbs = (len as f64 * f64::from(iters)) / t.elapsed().as_secs_f64() / 1e9;
    Ok(format!(
        "bytes={len} first_open_us={first_us:.1} cached_p50_us={:.1} d2d_fetch_gbs={ipc_gbs:.2} local_dtod_gbs={local_gbs:.2}",
        cached.get(cached.len() / 2).copied().unwrap_or(f64::NAN)
    ))
}
