//! GPU shards over http: the owner stages device memory through pinned
//! host buffers piece by piece while earlier pieces are on the wire
//! (`server`), the consumer copies arriving pieces to its device while
//! later ones are still being read (`client`). The second module of this
//! crate with `unsafe` (the CUDA driver, and pinned memory).
//!
//! # Memory
//! [`Staging`] is how device memory is reached: the CUDA driver, loaded at
//! run time through cudarc (a machine without one serves and fetches CPU
//! shards as before, and refuses GPU shards naming why), or, for tests on
//! machines without a GPU, host memory standing in for the device (plugin
//! config `test-device-is-host`: a GPU shard's address is then read and
//! written as host memory; never set in production). Piece buffers are
//! pinned (`cuMemHostAlloc`), so a copy runs at the link's full speed; the
//! owner keeps a bounded pool of them ([`PinnedPool`]), a consumer a ring
//! of its own per fetch.
//!
//! # Streams and ordering
//! The owner's device-to-host copies are synchronous copies on the legacy
//! default stream of the device's primary context: they wait for the work
//! of every blocking stream, as cuda-ipc's export event does (a producer
//! that wrote on a non-blocking stream synchronizes it before the put). The
//! consumer's host-to-device copies run on a stream of their own, one event
//! per ring buffer (a buffer is refilled only after its copy finished), and
//! the fetch returns after the stream is synchronized: the bytes are in
//! place when `fetch_device_into` returns.

use std::{
    collections::BTreeMap,
    ffi::c_void,
    sync::{Arc, Condvar, Mutex, OnceLock, PoisonError},
    time::{Duration, Instant},
};

use shardport_cuda::sys::{self, CUevent, CUresult, CUstream};
pub(crate) use shardport_cuda::ContextGuard;
use shardport_cuda::{Gpu, PinnedBuffer};

/// Driver symbols this module calls itself, beyond the shared crate's
/// (`shardport_cuda::REQUIRED_SYMBOLS`): the probe fails unless all are
/// present (cudarc panics at the first call of a missing one).
const HTTP_SYMBOLS: &[&str] = &[
    "cuMemcpyHtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

fn check(call: &'static str, r: CUresult) -> Result<(), String> {
    shardport_cuda::check(call, r).map_err(|e| e.to_string())
}

/// The CUDA driver, probed once per process, with the devices whose primary
/// contexts this plugin retained (once per device, kept for the process's
/// life, as frameworks do).
struct Driver {
    cuda: shardport_cuda::Driver,
    gpus: Mutex<BTreeMap<u32, Gpu>>,
}

fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let cuda = shardport_cuda::probe()?;
            cuda.require(HTTP_SYMBOLS)?;
            Ok(Driver {
                cuda,
                gpus: Mutex::default(),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Driver {
    /// Device `ordinal`, its primary context retained.
    fn gpu(&self, ordinal: u32) -> Result<Gpu, String> {
        let mut gpus = self.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(g) = gpus.get(&ordinal) {
            return Ok(g.clone());
        }
        let g = self.cuda.gpu(ordinal).map_err(|e| e.to_string())?;
        gpus.insert(ordinal, g.clone());
        Ok(g)
    }

    /// Makes device `ordinal`'s primary context current on this thread.
    fn bind(&self, ordinal: u32) -> Result<(), String> {
        self.gpu(ordinal)?.bind().map_err(|e| e.to_string())
    }
}

/// How this transport reaches device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Staging {
    /// The CUDA driver.
    Cuda,
    /// Tests only: a GPU shard's address is host memory.
    HostStandIn,
}

impl Staging {
    /// Whether GPU shards can be served and fetched here; `Err` says why not.
    pub(crate) fn ready(self) -> Result<(), String> {
        match self {
            Staging::Cuda => driver().map(|_| ()),
            Staging::HostStandIn => Ok(()),
        }
    }

    /// The device ordinal, in this process, of device address `addr`.
    pub(crate) fn device_of(self, addr: u64) -> Result<u32, String> {
        match self {
            Staging::HostStandIn => Ok(0),
            Staging::Cuda => {
                // The query needs a context: without one, device 0's is
                // bound for it. Retained here for the process's life, so
                // the query never creates and destroys it.
                let d = driver()?;
                d.gpu(0)?;
                d.cuda.device_of(addr).map_err(|e| e.to_string())
            }
        }
    }

    /// A host buffer of `len` bytes for pieces: pinned under CUDA (made in
    /// device `ordinal`'s context, pinned for every context).
    pub(crate) fn buffer(self, ordinal: u32, len: usize) -> Result<Pinned, String> {
        match self {
            Staging::HostStandIn => Ok(Pinned::Heap(vec![0; len].into_boxed_slice())),
            Staging::Cuda => {
                let d = driver()?;
                let pinned = d.cuda.alloc_pinned(&d.gpu(ordinal)?, len);
                Ok(Pinned::Cuda(pinned.map_err(|e| e.to_string())?))
            }
        }
    }

    /// Copies `dst.len()` bytes of device memory at `src` on `ordinal` into
    /// `dst` (waited for).
    pub(crate) fn to_host(self, ordinal: u32, src: u64, dst: &mut [u8]) -> Result<(), String> {
        if dst.is_empty() {
            return Ok(());
        }
        match self {
            Staging::HostStandIn => {
                // SAFETY: test-only mode (`test-device-is-host`): the host
                // lent `src` as a readable range of at least the shard's
                // length, of which this is a piece, alive until unexport
                // returns (it waits for this copy's reader).
                let src =
                    unsafe { std::slice::from_raw_parts(src as usize as *const u8, dst.len()) };
                dst.copy_from_slice(src);
                Ok(())
            }
            Staging::Cuda => {
                let d = driver()?;
                d.bind(ordinal)?;
                d.cuda.copy_dtoh(dst, src).map_err(|e| e.to_string())
            }
        }
    }

    /// A ring of `buffers` pieces of `piece` bytes copying into device
    /// memory on `ordinal`.
    pub(crate) fn uploader(
        self,
        ordinal: u32,
        buffers: usize,
        piece: usize,
    ) -> Result<Uploader, String> {
        let stream = match self {
            Staging::HostStandIn => None,
            Staging::Cuda => {
                let d = driver()?;
                d.bind(ordinal)?;
                let mut s: CUstream = std::ptr::null_mut();
                // SAFETY: out-pointer to a live local; a non-blocking stream
                // (flag 1), so it does not serialize with the legacy stream.
                check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut s, 1) })?;
                Some(Stream(s))
            }
        };
        let mut slots = Vec::with_capacity(buffers);
        for _ in 0..buffers.max(1) {
            let event = match &stream {
                None => None,
                Some(_) => {
                    let mut e: CUevent = std::ptr::null_mut();
                    // SAFETY: out-pointer to a live local; timing disabled (2).
                    check("cuEventCreate", unsafe { sys::cuEventCreate(&mut e, 2) })?;
                    Some(Event(e))
                }
            };
            slots.push(Slot {
                buf: self.buffer(ordinal, piece)?,
                event,
                pending: false,
            });
        }
        Ok(Uploader {
            staging: self,
            ordinal,
            stream,
            slots,
            next: 0,
        })
    }
}

/// A host buffer for pieces: pinned by the driver (made in a device's
/// context, freed in it), or plain heap memory in the host stand-in mode.
#[derive(Debug)]
pub(crate) enum Pinned {
    Cuda(PinnedBuffer),
    Heap(Box<[u8]>),
}

impl Pinned {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Pinned::Cuda(b) => b.as_slice(),
            Pinned::Heap(b) => b,
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Pinned::Cuda(b) => b.as_mut_slice(),
            Pinned::Heap(b) => b,
        }
    }
}

/// The owner's pinned piece buffers, shared by all its responses: at most
/// `max` exist; a response waits (up to its deadline) for a free one.
#[derive(Debug)]
pub(crate) struct PinnedPool {
    staging: Staging,
    piece: usize,
    max: usize,
    state: Mutex<(Vec<Pinned>, usize)>,
    freed: Condvar,
}

impl PinnedPool {
    pub(crate) fn new(staging: Staging, piece: usize, max: usize) -> PinnedPool {
        PinnedPool {
            staging,
            piece,
            max: max.max(1),
            state: Mutex::new((Vec::new(), 0)),
            freed: Condvar::new(),
        }
    }

    /// Bytes per piece.
    pub(crate) fn piece(&self) -> usize {
        self.piece
    }

    /// How device memory is reached.
    pub(crate) fn staging(&self) -> Staging {
        self.staging
    }

    /// A free buffer (made when fewer than `max` exist, in device
    /// `ordinal`'s context), waiting up to `timeout` for one.
    pub(crate) fn take(self: &Arc<Self>, ordinal: u32, timeout: Duration) -> Result<Piece, String> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(buf) = st.0.pop() {
                return Ok(Piece {
                    buf: Some(buf),
                    len: 0,
                    pool: Arc::clone(self),
                });
            }
            if st.1 < self.max {
                st.1 += 1;
                drop(st);
                return match self.staging.buffer(ordinal, self.piece) {
                    Ok(buf) => Ok(Piece {
                        buf: Some(buf),
                        len: 0,
                        pool: Arc::clone(self),
                    }),
                    Err(e) => {
                        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 -= 1;
                        // A waiter may make the buffer this one could not.
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "all {} staging buffers of {} bytes stayed busy for {:?} (plugin config \
                     `device-buffers`)",
                    self.max, self.piece, timeout
                ));
            }
            st = self
                .freed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn give_back(&self, buf: Pinned) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .push(buf);
        self.freed.notify_one();
    }

    /// Buffers made so far (pinned memory in use: this times the piece size).
    pub(crate) fn made(&self) -> usize {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1
    }
}

/// One piece on its way out: `len` bytes of a pool buffer, returned to the
/// pool when dropped (when the response has written it).
#[derive(Debug)]
pub(crate) struct Piece {
    buf: Option<Pinned>,
    len: usize,
    pool: Arc<PinnedPool>,
}

impl Piece {
    /// Fills the first `n` bytes from device memory.
    pub(crate) fn fill(&mut self, ordinal: u32, src: u64, n: usize) -> Result<(), String> {
        let staging = self.pool.staging;
        let buf = self.buf.as_mut().expect("present until drop");
        staging.to_host(ordinal, src, &mut buf.as_mut_slice()[..n])?;
        self.len = n;
        Ok(())
    }
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until drop").as_slice()[..self.len]
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give_back(buf);
        }
    }
}

struct Stream(CUstream);
struct Event(CUevent);

struct Slot {
    buf: Pinned,
    event: Option<Event>,
    pending: bool,
}

/// The consumer's ring: fill a buffer ([`Uploader::next_buffer`]), send it
/// to the device ([`Uploader::submit`]); [`Uploader::finish`] waits for all.
/// Kept between fetches ([`Uploaders`]): pinning memory costs about as much
/// as copying it.
pub(crate) struct Uploader {
    staging: Staging,
    ordinal: u32,
    stream: Option<Stream>,
    slots: Vec<Slot>,
    next: usize,
}

// SAFETY: the stream and events are driver objects of a primary context,
// usable from any thread once that context is current (every use binds it
// first); an uploader is used by one thread at a time (`&mut self`).
unsafe impl Send for Uploader {}

/// Idle uploaders of one transport, by device ordinal and ring shape.
#[derive(Default)]
pub(crate) struct Uploaders {
    idle: Mutex<Vec<Uploader>>,
}

impl std::fmt::Debug for Uploaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploaders").finish_non_exhaustive()
    }
}

/// Most idle uploaders a transport keeps (one per concurrent fetch seen).
const MAX_IDLE_UPLOADERS: usize = 4;

impl Uploaders {
    /// An idle uploader for `ordinal` with this ring, or a new one.
    pub(crate) fn take(
        &self,
        staging: Staging,
        ordinal: u32,
        buffers: usize,
        piece: usize,
    ) -> Result<Uploader, String> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = idle.iter().position(|u| {
            u.staging == staging
                && u.ordinal == ordinal
                && u.slots.len() == buffers.max(1)
                && u.slots[0].buf.as_slice().len() == piece
        }) {
            return Ok(idle.swap_remove(i));
        }
        drop(idle);
        staging.uploader(ordinal, buffers, piece)
    }

    /// Keeps `u` for a later fetch (after a successful `finish`).
    pub(crate) fn give_back(&self, mut u: Uploader) {
        u.next = 0;
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE_UPLOADERS {
            idle.push(u);
        }
    }
}

impl Uploader {
    /// The next ring buffer, once its previous copy finished.
    pub(crate) fn next_buffer(&mut self) -> Result<&mut [u8], String> {
        let slot = &mut self.slots[self.next];
        if slot.pending {
            if let Some(e) = &slot.event {
                // SAFETY: a live event recorded after this buffer's copy.
                check("cuEventSynchronize", unsafe {
                    sys::cuEventSynchronize(e.0)
                })?;
            }
            slot.pending = false;
        }
        Ok(slot.buf.as_mut_slice())
    }

    /// Copies the first `n` bytes of the buffer [`next_buffer`] gave to
    /// device address `dst`, and moves to the next buffer.
    ///
    /// [`next_buffer`]: Uploader::next_buffer
    pub(crate) fn submit(&mut self, dst: u64, n: usize) -> Result<(), String> {
        let slot = &mut self.slots[self.next];
        match (&self.stream, &slot.event) {
            (Some(s), Some(e)) => {
                driver()?.bind(self.ordinal)?;
                // SAFETY: the buffer is pinned and stays untouched until its
                // event completes (`next_buffer` waits for it; drop
                // synchronizes the stream); the device range is validated
                // by the driver.
                check("cuMemcpyHtoDAsync", unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        dst,
                        slot.buf.as_slice().as_ptr().cast::<c_void>(),
                        n,
                        s.0,
                    )
                })?;
                // SAFETY: live event and stream.
                check("cuEventRecord", unsafe { sys::cuEventRecord(e.0, s.0) })?;
                slot.pending = true;
            }
            _ => {
                debug_assert_eq!(self.staging, Staging::HostStandIn);
                // SAFETY: test-only mode: the caller's destination is host
                // memory of at least the shard's length, of which this is a
                // piece (the `import_into_device` contract, host standing in).
                let dst = unsafe { std::slice::from_raw_parts_mut(dst as usize as *mut u8, n) };
                dst.copy_from_slice(&slot.buf.as_slice()[..n]);
            }
        }
        self.next = (self.next + 1) % self.slots.len();
        Ok(())
    }

    /// Waits until every submitted copy has finished.
    pub(crate) fn finish(&mut self) -> Result<(), String> {
        if let Some(s) = &self.stream {
            driver()?.bind(self.ordinal)?;
            // SAFETY: a live stream.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(s.0)
            })?;
        }
        for slot in &mut self.slots {
            slot.pending = false;
        }
        Ok(())
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        if let Some(s) = &self.stream {
            // Nothing may still read the buffers when they are freed.
            let r = driver().and_then(|d| {
                d.bind(self.ordinal)?;
                // SAFETY: a live stream.
                check("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(s.0)
                })
            });
            if let Err(e) = r {
                tracing::warn!(target: "http", error = %e, "waiting for pending uploads failed");
            }
            for slot in &mut self.slots {
                if let Some(e) = slot.event.take() {
                    // SAFETY: created in `uploader`, destroyed once.
                    let _ = unsafe { sys::cuEventDestroy_v2(e.0) };
                }
            }
            // SAFETY: created in `uploader`, destroyed once, synchronized above.
            let _ = unsafe { sys::cuStreamDestroy_v2(s.0) };
        }
    }
}
