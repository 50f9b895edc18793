//! This machine's own limits, measured in the same run as the matrix: the
//! fastest way this machine copies the bytes between warm, pre-faulted
//! buffers: glibc memcpy on one thread in one call, in 256 KiB calls (below
//! glibc's non-temporal threshold, so through the cache), or split across
//! every core ([`CopyWay`]), whichever is shortest. The table of limits
//! tries every way in each sample; the matrix's cells below 4 MiB take one
//! way per sample (see `matrix::Runner::rotation`). glibc already uses
//! non-temporal stores above its threshold; hand-written ones would need
//! `unsafe` in a crate that forbids it. And raw TCP over loopback with our
//! own socket pair: a round trip carrying the shard, and from 1 MiB up the
//! faster of that and a one-way stream of shards on the same sockets
//! ([`TcpPair::best`]): a single fetch of a small shard is one round trip
//! by nature (a stream of them measures pipelining, which one fetch cannot
//! do), while a large one is bound by the stream's bandwidth. Both ends of
//! the pair poll for the other's bytes before they sleep, and a sample is
//! the faster of two round trips back to back (the second finds the
//! server still polling): on a VM whose idle vCPUs halt, a sleeping thread
//! wakes 30-40 us late, so a round trip between sleeping ends (~70 us on
//! this machine kind) is not the fastest this machine does (~6 us). The
//! reader polls before every read and the writer polls a full socket
//! buffer, at every size: a writer that slept on a full buffer (as it did
//! below 1 MiB) woke late once per refill, and the http fetch of 256 KiB
//! beat that limit by 1.14-1.44x. After each sample the server is parked
//! (it sleeps until the next request): left polling, it spun on one of
//! the cores through the matrix's next cell sample.
//!
//! A product that beats its limit means the limit is wrong: the report
//! flags every ratio over [`SUSPECT_RATIO`].

use std::{
    hint::black_box,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::{Duration, Instant},
};

use shardport_kit::poll::await_bytes;

use super::stats::{gbps_us, Summary};

/// A ratio above this means the product beat its limit: the limit is not
/// the machine's and the report says so next to the ratio.
pub const SUSPECT_RATIO: f64 = 1.05;

/// Chunk of [`chunked_copy`].
const COPY_CHUNK: usize = 256 << 10;

/// Copies at least this long are also timed in chunks and split across
/// every core.
const PARALLEL_COPY_MIN: usize = 1 << 20;

/// From this size up the TCP limit also tries a one-way stream.
const STREAM_LIMIT_MIN: usize = 1 << 20;

/// How long each end of a [`TcpPair`] polls for the other's bytes before
/// it sleeps in a blocking read.
const POLL: Duration = Duration::from_micros(200);

/// Fills `buf` from `s`, polling before every read that would wait (as
/// the http consumer does between the pieces of a body).
fn read_polling(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    crate::polled::read(s, buf, POLL, || true)
}

/// Writes all of `buf` to `s`, polling instead of sleeping while the
/// socket's buffer is full ([`crate::polled::write`]): a writer that
/// sleeps there wakes 30-40 us late on this project's VMs, once per refill.
fn write_polling(s: &TcpStream, buf: &[u8]) -> std::io::Result<()> {
    crate::polled::write(s, buf, || true)
}

/// Socket buffers of a [`TcpPair`] end that hold a whole shard below 1
/// MiB: a fresh pair's buffers start at 16 KiB (send) and 128 KiB
/// (receive) and grow by the kernel's autotuning, which some pairs did
/// and some did not in the samples they lived for (a 256 KiB round trip
/// 20-21 us on one pair, 47-52 us on another, the same run). A long-lived
/// connection, as the http consumer's pooled ones, has grown them: the
/// limit must not lag behind it. Setting a size ends the autotuning for
/// that socket, so it is set only where the kernel grants the whole shard
/// (`net.core.{r,w}mem_max`) and not from 1 MiB up, where autotuning
/// grows past it (to 4 MiB and more) and a set size held the limit back.
/// Best effort.
fn socket_buffers(s: &TcpStream, len: usize) {
    let granted = |file: &str| {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .is_some_and(|max| max >= len)
    };
    if len >= 1 << 20
        || !granted("/proc/sys/net/core/rmem_max")
        || !granted("/proc/sys/net/core/wmem_max")
    {
        return;
    }
    let bytes = len.max(256 << 10);
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, bytes);
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(s, bytes);
}

/// A request to the [`TcpPair`] server with this bit set moves it to the
/// core numbered in the low bits.
const PIN: u64 = 1 << 63;

/// Moves the calling thread to `core` (best effort: a core this process
/// may not use leaves it where it was); [`ANY_CORE`] gives it back the
/// cores it started with, `home` (the scheduler places it).
fn pin_to(core: usize, home: Option<&rustix::thread::CpuSet>) {
    if core == ANY_CORE {
        if let Some(home) = home {
            let _ = rustix::thread::sched_setaffinity(None, home);
        }
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(core);
    let _ = rustix::thread::sched_setaffinity(None, &set);
}

/// The "core" of a [`PIN`] request that unpins the server.
const ANY_CORE: usize = 0xffff_ffff;

/// Where a limit's server runs, one sample each ([`TcpPair::best`]): on
/// the calling thread's core, on the next one and unpinned; only the
/// first on a single core.
fn placements() -> Vec<usize> {
    let here = rustix::thread::sched_getcpu();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        vec![here]
    } else {
        vec![here, (here + 1) % cores, ANY_CORE]
    }
}

/// Bytes per stream sample of [`TcpPair::stream`]: enough shards back to
/// back that one request's latency is spread thin, few enough that a
/// sample stays short.
const STREAM_SAMPLE_BYTES: usize = 8 << 20;

/// Each memcpy sample copies at least this many bytes (repeating small
/// copies), so a 4 KiB copy is not lost in the clock's resolution.
const MEMCPY_SAMPLE_BYTES: usize = 1 << 20;

/// A limit at one size.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct SizeLimit {
    /// Shard size in bytes.
    pub size: u64,
    /// Time per operation.
    pub samples: Summary,
    /// Throughput at the median, GB/s.
    pub gbps: f64,
}

/// Every limit of one run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Limits {
    /// Single-thread memcpy between two warm buffers, per size.
    pub memcpy: Vec<SizeLimit>,
    /// Raw TCP loopback, per size: a round trip (an 8-byte request out, the
    /// shard back into a warm buffer), from 1 MiB up the faster of that and
    /// a one-way stream of shards on the same sockets, per shard: the floor
    /// of any fetch over TCP.
    pub tcp_round_trip: Vec<SizeLimit>,
    /// Raw TCP loopback stream, one direction, 1 MiB writes, at the largest size.
    pub tcp_stream: Option<SizeLimit>,
}

impl Limits {
    /// The memcpy limit at `size`.
    pub fn memcpy_at(&self, size: u64) -> Option<&SizeLimit> {
        self.memcpy.iter().find(|l| l.size == size)
    }

    /// The TCP round-trip limit at `size`.
    pub fn tcp_at(&self, size: u64) -> Option<&SizeLimit> {
        self.tcp_round_trip.iter().find(|l| l.size == size)
    }
}

fn size_limit(size: u64, samples: &[Duration]) -> Option<SizeLimit> {
    let s = Summary::of(samples)?;
    Some(SizeLimit {
        size,
        samples: s,
        gbps: gbps_us(size, s.median_us),
    })
}

/// Warm single-thread memcpy of `len` bytes: `warmup` + `reps` samples.
pub fn memcpy(len: usize, warmup: usize, reps: usize) -> SizeLimit {
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src); // touch both
    let mut samples = Vec::with_capacity(reps);
    for i in 0..warmup + reps.max(1) {
        let d = memcpy_once(&src, &mut dst);
        if i >= warmup {
            samples.push(d);
        }
    }
    size_limit(len as u64, &samples).expect("at least one sample")
}

/// A raw TCP loopback socket pair whose server thread answers each 8-byte
/// request with `len` bytes from a warm buffer (Nagle off on both ends,
/// like any request/response client; both ends poll for [`POLL`] before
/// they sleep). Dropping it ends the thread.
pub struct TcpPair {
    stream: TcpStream,
    dst: Vec<u8>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl TcpPair {
    /// Connects a pair carrying `len` bytes per round trip.
    pub fn new(len: usize) -> std::io::Result<TcpPair> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let server = std::thread::Builder::new()
            .name("bench-tcp".into())
            .spawn(move || {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
                let _ = s.set_nodelay(true);
                socket_buffers(&s, len);
                let home = rustix::thread::sched_getaffinity(None).ok();
                let src = vec![7u8; len];
                let mut req = [0u8; 8];
                let mut poll = true;
                // A request is the number of shards to send back to back;
                // zero parks the thread: it sleeps until the next request
                // instead of polling for it; [`PIN`] plus a core number
                // moves it to that core (nothing is sent back).
                'serve: loop {
                    if poll {
                        await_bytes(&s, POLL);
                    }
                    if s.read_exact(&mut req).is_err() {
                        break;
                    }
                    let n = u64::from_le_bytes(req);
                    poll = n != 0;
                    if n & PIN != 0 {
                        pin_to((n & !PIN) as usize, home.as_ref());
                        continue;
                    }
                    for _ in 0..n.min(1 << 20) {
                        if write_polling(&s, &src).is_err() {
                            break 'serve;
                        }
                    }
                }
            })?;
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        socket_buffers(&stream, len);
        // A lost or short response is an error, never a hung benchmark.
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut pair = TcpPair {
            stream,
            dst: vec![0u8; len],
            server: Some(server),
        };
        pair.round_trip()?; // warms the buffers and the connection
        Ok(pair)
    }

    /// One round trip: the request out, all `len` bytes back.
    pub fn round_trip(&mut self) -> std::io::Result<Duration> {
        self.shards(1)
    }

    /// A one-way stream on the same sockets: one request, then shards back
    /// to back; the time per shard.
    pub fn stream(&mut self) -> std::io::Result<Duration> {
        self.shards((STREAM_SAMPLE_BYTES / self.dst.len().max(1)).max(1))
    }

    /// The TCP limit at this size: the faster of two round trips back to
    /// back (the first may find the server asleep, the second finds it
    /// polling), and from [`STREAM_LIMIT_MIN`] up the faster of that and a
    /// stream; measured with the server on this thread's core, on another
    /// one and unpinned, the fastest kept. Then the server is parked
    /// ([`park`](Self::park)).
    ///
    /// Both pinned placements, because the scheduler picks either and they
    /// differ:
    /// on 2 vCPUs, with both ends pinned and polling, a 64 KiB round trip
    /// took 9 us on one core and 18-20 us across two, 256 KiB 21 us and
    /// 33 us (1 MiB: 127 us either way); an http fetch whose owner was
    /// woken on the consumer's core beat a limit that had landed across
    /// cores (LIMIT SUSPECT). And unpinned, because the scheduler may move
    /// either end mid-transfer: 1 MiB http fetches back to back (an owner
    /// polling, eighth session) took 141-159 us against 147-168 us for the
    /// best pinned placement.
    pub fn best(&mut self) -> std::io::Result<Duration> {
        let mut best = Duration::MAX;
        for core in placements() {
            self.request(PIN | core as u64)?;
            let mut d = self.round_trip()?.min(self.round_trip()?);
            if self.dst.len() >= STREAM_LIMIT_MIN {
                d = d.min(self.stream()?);
            }
            best = best.min(d);
        }
        self.park()?;
        Ok(best)
    }

    /// The TCP limit of carrying `total` bytes as back-to-back shards of
    /// this pair's size: a stream of pieces out of one cache-resident
    /// buffer into another, which is what a staged GPU fetch sends (its
    /// pieces live in small pinned buffers, never in a shard-sized one).
    /// Whole pieces are sent; a total that is not a multiple of the piece
    /// is timed pro rata. Measured with the server on this thread's core,
    /// on another one and unpinned, the fastest kept, as
    /// [`best`](Self::best); then
    /// the server is parked.
    pub fn best_carrying(&mut self, total: u64) -> std::io::Result<Duration> {
        let piece = self.dst.len().max(1) as u64;
        let n = total.div_ceil(piece).max(1);
        let share = total as f64 / (n * piece) as f64;
        let mut best = Duration::MAX;
        for core in placements() {
            self.request(PIN | core as u64)?;
            let per_piece = self.shards(n as usize)?;
            best = best.min((per_piece * n as u32).mul_f64(share));
        }
        self.park()?;
        Ok(best)
    }

    fn request(&mut self, word: u64) -> std::io::Result<()> {
        self.stream.write_all(&word.to_le_bytes())
    }

    /// Tells the server thread to sleep until the next request instead of
    /// polling for it. The matrix takes a limit sample after each cell
    /// sample: a server left polling would spin on one of the machine's
    /// cores through the next cell sample (on 2 vCPUs, one of the two the
    /// owner and the consumer run on), slowing the product by the limit's
    /// own doing.
    pub fn park(&mut self) -> std::io::Result<()> {
        self.request(0)
    }

    /// `n` shards for one request; the time per shard.
    fn shards(&mut self, n: usize) -> std::io::Result<Duration> {
        let t = Instant::now();
        self.stream.write_all(&(n as u64).to_le_bytes())?;
        for _ in 0..n {
            read_polling(&mut self.stream, &mut self.dst)?;
        }
        Ok(t.elapsed() / n as u32)
    }
}

impl Drop for TcpPair {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
    }
}

/// The raw TCP loopback limit at `len` bytes ([`TcpPair::best`]): `warmup`
/// + `reps` samples on one kept-alive [`TcpPair`].
pub fn tcp_round_trip(len: usize, warmup: usize, reps: usize) -> std::io::Result<SizeLimit> {
    let mut pair = TcpPair::new(len)?;
    let mut samples = Vec::with_capacity(reps);
    for i in 0..warmup + reps.max(1) {
        let d = pair.best()?;
        if i >= warmup {
            samples.push(d);
        }
    }
    Ok(size_limit(len as u64, &samples).expect("at least one sample"))
}

/// A way this machine copies bytes; the memcpy limit is the fastest of
/// [`copy_ways`] for the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyWay {
    /// One memcpy on one thread ([`single_copy`]).
    Single,
    /// A run of 256 KiB memcpys ([`chunked_copy`]).
    Chunked,
    /// Split across every core ([`parallel_copy`]).
    Parallel,
}

/// The ways worth trying for a copy of `len` bytes: one memcpy, and from
/// 1 MiB up also chunked and split across cores.
pub fn copy_ways(len: usize) -> &'static [CopyWay] {
    if len < PARALLEL_COPY_MIN {
        &[CopyWay::Single]
    } else {
        &[CopyWay::Single, CopyWay::Chunked, CopyWay::Parallel]
    }
}

/// One copy of `src` into `dst` (same length) done `way`, timed.
pub fn copy_by(way: CopyWay, src: &[u8], dst: &mut [u8]) -> Duration {
    match way {
        CopyWay::Single => single_copy(src, dst),
        CopyWay::Chunked => chunked_copy(src, dst),
        CopyWay::Parallel => parallel_copy(src, dst),
    }
}

/// The fastest of [`copy_ways`] for one copy of `src` into `dst`, tried
/// back to back (the later ones find the bytes in the cache: the matrix's
/// cells below 4 MiB take one way per sample instead, see
/// `matrix::Runner::rotation`).
pub fn memcpy_once(src: &[u8], dst: &mut [u8]) -> Duration {
    copy_ways(src.len())
        .iter()
        .map(|&way| copy_by(way, src, dst))
        .min()
        .expect("at least one way")
}

/// One copy as a run of [`COPY_CHUNK`]-byte memcpys: below glibc's
/// non-temporal threshold each chunk is written through the cache, which
/// on some machines (VMs reporting a small shared cache) beats one large
/// memcpy by 2x for copies that fit in the cache.
fn chunked_copy(src: &[u8], dst: &mut [u8]) -> Duration {
    let t = Instant::now();
    for (s, d) in src.chunks(COPY_CHUNK).zip(dst.chunks_mut(COPY_CHUNK)) {
        d.copy_from_slice(black_box(s));
    }
    black_box(&mut *dst);
    t.elapsed()
}

/// One single-threaded memcpy, timed; small copies are repeated so the
/// sample is long enough for the clock, and the time per copy returned.
fn single_copy(src: &[u8], dst: &mut [u8]) -> Duration {
    let inner = (MEMCPY_SAMPLE_BYTES / src.len().max(1)).max(1);
    let t = Instant::now();
    for _ in 0..inner {
        dst.copy_from_slice(black_box(src));
        black_box(&mut *dst);
    }
    t.elapsed() / inner as u32
}

/// One copy split into a chunk per core, the calling thread copying the
/// first while one new thread per other chunk copies the rest (thread
/// start included: a product would pay it too, or keep a pool). Spawning a
/// thread for every chunk and waiting was 25-35% slower at 256 MiB on 2
/// vCPUs (27 ms against 20 ms; the new threads start on a busy core), and
/// the put, which copies like this ([`shardport_kit::copy`]), beat
/// that limit by 1.17x.
fn parallel_copy(src: &[u8], dst: &mut [u8]) -> Duration {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = src.len().div_ceil(threads).max(1);
    let t = Instant::now();
    let mut pieces = src.chunks(chunk).zip(dst.chunks_mut(chunk));
    if let Some((first_src, first_dst)) = pieces.next() {
        std::thread::scope(|scope| {
            for (s, d) in pieces {
                scope.spawn(move || d.copy_from_slice(black_box(s)));
            }
            first_dst.copy_from_slice(black_box(first_src));
        });
    }
    black_box(&mut *dst);
    t.elapsed()
}

/// Raw TCP loopback stream: one thread writes `len` bytes from a warm
/// buffer in 1 MiB writes, the other reads them into a warm buffer; the
/// first round warms up.
pub fn tcp_stream(len: usize, reps: usize) -> std::io::Result<SizeLimit> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let rounds = reps.max(1) + 1;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let (s, _) = listener.accept()?;
        let src = vec![7u8; 1 << 20];
        for _ in 0..rounds {
            let mut left = len;
            while left > 0 {
                let n = left.min(src.len());
                write_polling(&s, &src[..n])?;
                left -= n;
            }
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    let mut dst = vec![0u8; len];
    let mut samples = Vec::new();
    for round in 0..rounds {
        let t = Instant::now();
        read_polling(&mut s, &mut dst)?;
        if round > 0 {
            samples.push(t.elapsed());
        }
    }
    writer
        .join()
        .map_err(|_| std::io::Error::other("the TCP writer thread panicked"))??;
    Ok(size_limit(len as u64, &samples).expect("at least one sample"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copy_method_copies_every_byte() {
        let src: Vec<u8> = (0..PARALLEL_COPY_MIN + 4099)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut dst = vec![0u8; src.len()];
        parallel_copy(&src, &mut dst);
        assert!(dst == src, "the parallel copy lost bytes");
        let mut dst = vec![0u8; src.len()];
        single_copy(&src, &mut dst);
        assert!(dst == src, "the single-thread copy lost bytes");
        let mut dst = vec![0u8; src.len()];
        chunked_copy(&src, &mut dst);
        assert!(dst == src, "the chunked copy lost bytes");
        let mut dst = vec![0u8; src.len()];
        memcpy_once(&src, &mut dst);
        assert!(dst == src);
    }

    #[test]
    fn limits_measure_something() {
        let m = memcpy(4096, 1, 3);
        assert_eq!((m.size, m.samples.n), (4096, 3));
        assert!(m.gbps > 0.0);
        let t = tcp_round_trip(4096, 1, 3).unwrap();
        assert_eq!(t.samples.n, 3);
        let s = tcp_stream(1 << 16, 2).unwrap();
        assert_eq!(s.samples.n, 2);
        let l = Limits {
            memcpy: vec![m],
            tcp_round_trip: vec![t],
            tcp_stream: Some(s),
        };
        assert!(l.memcpy_at(4096).is_some() && l.memcpy_at(1).is_none());
        assert!(l.tcp_at(4096).is_some());
    }

    #[test]
    fn the_tcp_pair_streams_whole_shards_and_counts_per_shard() {
        let mut p = TcpPair::new(STREAM_LIMIT_MIN).unwrap();
        // 8 shards for one request: every byte of each arrives (read_exact
        // would fail or hang on a short stream), and the next request lines
        // up with the next response.
        for _ in 0..3 {
            p.stream().unwrap();
            p.round_trip().unwrap();
            p.best().unwrap();
        }
        // A parked server and one moved to another core answer nothing
        // for those requests, and still answer the next one whole.
        p.park().unwrap();
        p.request(PIN).unwrap();
        p.round_trip().unwrap();
        assert!(p.dst.iter().all(|&b| b == 7));
        // Carrying a total in pieces: whole pieces, rounded up, leave the
        // connection lined up for the next request (a short or long read
        // would fail it or hang on the read timeout).
        p.dst.fill(0);
        p.best_carrying(3 * STREAM_LIMIT_MIN as u64 + 1).unwrap();
        assert!(
            p.dst.iter().all(|&b| b == 7),
            "the last piece arrived whole"
        );
        p.round_trip().unwrap();
    }
}
