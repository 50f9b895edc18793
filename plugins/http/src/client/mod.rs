//! Consumer side: a blocking HTTP/1.1 client on `std::net::TcpStream`, run
//! on the calling host thread, that reads response bodies straight into the
//! host's destination buffers.
//!
//! # Overview
//! One [`OwnerPool`] per owner address holds idle kept-alive connections
//! and counts the connections checked out; a request holds one of
//! `max-connections-per-owner` slots for its whole exchange, so at most that
//! many connections to one owner are ever open. A pooled connection found
//! closed (or idle longer than `idle-timeout`) is dropped; a request that
//! fails on a reused connection before any response byte arrived is retried
//! once on a fresh one (both requests are idempotent reads).
//!
//! There is no runtime hop: the thread that calls `import_into` writes the
//! request, parses the response head ([`crate::head`]) and reads the body.
//! Each connection has a small buffer for response heads; body bytes that
//! arrived with the head are copied out of it, the rest of a body goes from
//! the socket straight into the destination (one copy, kernel to final
//! place). Only pieces smaller than the buffer (small batch items) are read
//! through it, so a batch of many small shards costs few system calls.
//!
//! `import_many` groups items by owner, sends one `POST /v1/batch` per
//! `max-batch` items, runs owners (and up to `max-connections-per-owner`
//! batches per owner) on scoped threads (the calling thread is one of them;
//! a single batch runs on it alone), and fails only the items that failed.
//!
//! # TLS
//! An owner whose descriptor says HTTPS is reached over TLS (rustls, the
//! owner's certificate checked against `tls-ca` and the descriptor's host);
//! its connections are pooled apart from plain ones to the same address.
//! Without `tls-ca` such an owner is refused at once with an error saying
//! so. The handshake runs when a connection opens, within what is left of
//! `connect-timeout`.
//!
//! # Timeouts
//! Resolving, connecting and the TLS handshake: `connect-timeout`. Waiting for a pool slot,
//! for a response head, and between two reads of a body: `request-timeout`
//! (the socket's read and write timeouts). A dead owner therefore costs at
//! most one of these, never a hang.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use hyper::StatusCode;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use shardport_abi::{AbiError, ErrorKind, ImportInfo, PluginResult, ShardId};
use shardport_kit::poll::{await_bytes, core_to_spare, nothing_to_read, MAX_FRUITLESS_POLLS};
use tracing::debug;

use crate::{
    config::{format_duration, Config, Token},
    descriptor::Descriptor,
    head::{self, ResponseHead},
    stats::{Held, Stats},
    tls, wire,
};

mod conn;
mod connect;
mod multi;
mod pool;
mod relay;
#[cfg(test)]
mod tests;

#[allow(clippy::wildcard_imports)]
use self::{conn::*, pool::*};
pub(crate) use relay::RelaySetup;

/// Largest error body read from an owner (JSON, a few hundred bytes in
/// practice); a larger one is cut off and its connection not reused.
const MAX_ERROR_BODY: usize = 64 << 10;
/// Read buffer of one connection: holds a response head (so it is at least
/// [`head::MAX_RESPONSE_HEAD`]) and batches the reads of pieces smaller than
/// itself; larger pieces are read straight into their destination.
const READ_BUF: usize = head::MAX_RESPONSE_HEAD;
// A head that fills the buffer is refused by the parser, so reading a head
// never asks the socket for zero bytes.
const _: () = assert!(READ_BUF >= head::MAX_RESPONSE_HEAD);
/// How long a request waits before it retries on a new connection that
/// was closed before its response (an owner's pending budget evicted it):
/// long enough for the burst that evicted it to be admitted; each further
/// retry waits 5 times longer (5, 25, 125 ms).
const FRESH_RETRY_PAUSE: Duration = Duration::from_millis(5);
/// Retries of a request whose new connection was closed before any
/// response byte (a pooled connection that fails gets one, on a new one).
const MAX_FRESH_RETRIES: usize = 3;
/// Most threads one `import_many` call uses (the calling thread included).
/// Each runs one batch at a time; per-owner parallelism is bounded by
/// `max-connections-per-owner` anyway, this bounds fan-out to many owners.
const MAX_IMPORT_THREADS: usize = 32;

/// Results of a batch: `(item index, outcome)` per job.
pub(crate) type ItemResults = Vec<(usize, PluginResult<ImportInfo>)>;

/// One shard to fetch: where its bytes go.
pub(crate) struct Job<'a> {
    /// Index of the item in the caller's batch.
    pub index: usize,
    pub id: ShardId,
    pub dst: &'a mut [u8],
}

/// An owner as a consumer reaches it: its address and whether it serves
/// HTTPS (from the descriptor). Plain and TLS connections to one address
/// are pooled apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    pub addr: String,
    pub tls: bool,
}

impl Owner {
    pub(crate) fn of(d: &Descriptor) -> Owner {
        Owner {
            addr: d.addr.clone(),
            tls: d.tls,
        }
    }
}

/// A request to send.
struct Request<'r> {
    method: &'static str,
    path: &'r str,
    body: &'r [u8],
    /// The socket's read timeout for this exchange, when not
    /// `request-timeout` (a relay's `relay-stall-timeout`).
    read_timeout: Option<Duration>,
}

/// Why an exchange failed before a response head was parsed.
enum SendError {
    /// Nothing of a response arrived (write failed, or the connection was
    /// closed or reset first): a reused connection is retried.
    NoResponse(io::Error),
    /// Reading the head timed out.
    Timeout,
    /// Part of a head arrived, then the connection failed.
    Broken(io::Error, usize),
    /// The head is not something this client reads.
    Malformed(String),
}

/// How a consumer copies GPU shards into device memory: its ring of
/// `buffers` pieces of `piece` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceRing {
    pub staging: crate::gpu::Staging,
    pub buffers: usize,
    pub piece: usize,
}

/// The consumer side of one transport instance.
pub(crate) struct Client {
    pools: Mutex<HashMap<Owner, Arc<OwnerPool>>>,
    /// Reaches HTTPS owners (`tls-ca`); `None`: they are refused.
    tls: Option<Arc<ClientConfig>>,
    /// `Bearer <token>`, sent as `authorization`.
    auth: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    idle_timeout: Duration,
    max_conns: usize,
    max_batch: usize,
    /// How long to poll for a response before sleeping (`spin`).
    spin: Duration,
    stats: Arc<Stats>,
    /// Rings of pinned buffers for GPU shards, kept between fetches.
    uploaders: crate::gpu::Uploaders,
    /// This instance's secret, as the owner of relayed shards: each
    /// holder's removal key is derived from it (see [`Client::removal_key`]).
    relay_secret: [u8; 32],
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("max_conns", &self.max_conns)
            .finish_non_exhaustive()
    }
}

fn auth_value(token: &Token) -> PluginResult<String> {
    let t = token.as_str();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AbiError::config(
            "the auth token cannot travel in an HTTP header",
        ));
    }
    Ok(format!("Bearer {t}"))
}

impl Client {
    pub(crate) fn new(
        cfg: &Config,
        tls: Option<Arc<ClientConfig>>,
        stats: Arc<Stats>,
    ) -> PluginResult<Client> {
        let mut relay_secret = [0u8; 32];
        getrandom::fill(&mut relay_secret).map_err(|e| {
            AbiError::internal(format!("no randomness for the relay removal keys: {e}"))
        })?;
        Ok(Client {
            relay_secret,
            pools: Mutex::default(),
            tls,
            auth: cfg.auth_token.as_ref().map(auth_value).transpose()?,
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
            idle_timeout: cfg.idle_timeout,
            max_conns: cfg.max_connections_per_owner,
            max_batch: cfg.max_batch,
            spin: cfg.spin,
            stats,
            uploaders: crate::gpu::Uploaders::default(),
        })
    }

    /// The key with which this owner drops or moves the copy of `id` that
    /// the holder at `addr` serves: only the owner (which knows its secret)
    /// and that holder (told at its join, over the owner's connection)
    /// know it, so no other token holder can drop or move the copy.
    pub(crate) fn removal_key(&self, id: ShardId, addr: &str) -> crate::relay::RemovalKey {
        let mut h = blake3::Hasher::new_keyed(&self.relay_secret);
        h.update(&id.as_u128().to_be_bytes());
        h.update(addr.as_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&h.finalize().as_bytes()[..16]);
        key
    }

    fn pool(&self, owner: &Owner) -> Arc<OwnerPool> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = pools.get(owner) {
            return Arc::clone(p);
        }
        // A new owner (one restarted elsewhere, say): first forget pools
        // nobody uses any more, closing their idle connections that expired
        // or that the owner closed, so a long-lived consumer of many
        // short-lived owners keeps neither their pools nor the descriptors
        // of their dead sockets.
        let timeout = self.idle_timeout;
        let mut closing = Vec::new();
        pools.retain(|_, p| {
            if Arc::strong_count(p) > 1 {
                return true;
            }
            let mut st = p.state();
            let (fresh, dead) = std::mem::take(&mut st.idle)
                .into_iter()
                .partition(|c| c.idle_since.elapsed() < timeout && c.looks_alive());
            st.idle = fresh;
            closing.push(dead);
            !st.idle.is_empty()
        });
        drop(closing);
        let p = Arc::new(OwnerPool {
            addr: owner.addr.clone(),
            tls: owner.tls,
            state: Mutex::default(),
            freed: Condvar::new(),
        });
        pools.insert(owner.clone(), Arc::clone(&p));
        p
    }

    /// Fetches one shard into `dst` (`dst.len() == desc.len`, checked by
    /// the caller).
    pub(crate) fn fetch_one(&self, desc: &Descriptor, dst: &mut [u8]) -> PluginResult<ImportInfo> {
        self.fetch_one_with(desc, |body| body.read_exact(dst, What::Shard(desc.id)))
    }

    /// Fetches one GPU shard into device memory at `dst` on device
    /// `ordinal`: each piece of the body is read into a ring buffer and
    /// copied to the device while the next pieces are read; returns once
    /// every copy has finished.
    pub(crate) fn fetch_one_device(
        &self,
        desc: &Descriptor,
        ordinal: u32,
        dst: u64,
        ring: &DeviceRing,
    ) -> PluginResult<ImportInfo> {
        let mut up = self.uploader(ring, ordinal)?;
        let device_err = |why: String| AbiError::new(ErrorKind::IO, format!("http: {why}"));
        let r = self.fetch_one_with(desc, |body| {
            let mut at = 0u64;
            while at < desc.len {
                let n = (ring.piece as u64).min(desc.len - at) as usize;
                let buf = up.next_buffer().map_err(device_err)?;
                body.read_exact(&mut buf[..n], What::Shard(desc.id))?;
                up.submit(dst + at, n).map_err(device_err)?;
                at += n as u64;
            }
            up.finish().map_err(device_err)
        });
        if r.is_ok() {
            self.uploaders.give_back(up);
        }
        r
    }

    /// A ring of pinned buffers that copies into device `ordinal`.
    fn uploader(&self, ring: &DeviceRing, ordinal: u32) -> PluginResult<crate::gpu::Uploader> {
        self.uploaders
            .take(ring.staging, ordinal, ring.buffers, ring.piece)
            .map_err(|why| {
                AbiError::unavailable(format!("http cannot copy into cuda:{ordinal} here: {why}"))
            })
    }

    /// One `GET` of `desc`'s shard; `read` takes the body (exactly the
    /// shard's length, checked against the descriptor first).
    fn fetch_one_with(
        &self,
        desc: &Descriptor,
        read: impl FnOnce(&mut Body<'_>) -> PluginResult<()>,
    ) -> PluginResult<ImportInfo> {
        let pool = self.pool(&Owner::of(desc));
        let path = wire::shard_path(desc.id);
        let req = Request {
            method: "GET",
            path: &path,
            body: &[],
            read_timeout: None,
        };
        let (mut co, head) = self.exchange(&pool, &req)?;
        if head.status != 200 {
            return Err(self.error_response(&pool, &head, &mut co, &format!("shard {}", desc.id)));
        }
        let declared = head.content_length.unwrap_or_default();
        for n in [Some(declared), head.shard_len].into_iter().flatten() {
            if n != desc.len {
                return Err(AbiError::invalid_descriptor(format!(
                    "owner {} serves {n} bytes for shard {}, the descriptor says {}",
                    pool.addr, desc.id, desc.len
                )));
            }
        }
        let kind = co.kind();
        let mut body = Body::new(co.conn(), &pool.addr, self.request_timeout, declared);
        read(&mut body)?;
        co.reusable = body.complete() && !head.close;
        Ok(ImportInfo {
            note: format!("GET {path} from {} ({kind} connection)", pool.addr).into(),
        })
    }

    /// Fetches every job, grouped by owner address: one batch per
    /// `max-batch` jobs, up to `max-connections-per-owner` batches of one
    /// owner at once, owners in parallel. Returns one result per job (by
    /// its `index`).
    pub(crate) fn fetch_many<'a>(&self, owners: Vec<(Owner, Vec<Job<'a>>)>) -> ItemResults {
        // Per owner: its batches spread round-robin over its lanes; a lane
        // runs its batches one after another on one connection.
        let mut per_owner: Vec<VecDeque<Lane<'a>>> = Vec::with_capacity(owners.len());
        for (owner, jobs) in owners {
            let pool = self.pool(&owner);
            let mut chunks: Vec<Vec<Job<'a>>> = Vec::new();
            for job in jobs {
                match chunks.last_mut() {
                    Some(c) if c.len() < self.max_batch => c.push(job),
                    _ => chunks.push(vec![job]),
                }
            }
            let lanes = chunks.len().clamp(1, self.max_conns);
            let mut owner_lanes: VecDeque<Lane<'a>> = (0..lanes)
                .map(|_| Lane {
                    pool: Arc::clone(&pool),
                    batches: Vec::new(),
                })
                .collect();
            for (i, c) in chunks.into_iter().enumerate() {
                owner_lanes[i % lanes].batches.push(c);
            }
            per_owner.push(owner_lanes);
        }
        // Interleave owners so the first lanes taken reach different owners.
        let mut queue: VecDeque<Lane<'a>> = VecDeque::new();
        while per_owner.iter().any(|o| !o.is_empty()) {
            for o in &mut per_owner {
                queue.extend(o.pop_front());
            }
        }
        let threads = queue.len().min(MAX_IMPORT_THREADS);
        if threads <= 1 {
            return queue.into_iter().flat_map(|l| self.run_lane(l)).collect();
        }
        let queue = Mutex::new(queue);
        let work = || {
            let mut out = Vec::new();
            loop {
                let next = queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front();
                let Some(lane) = next else { break out };
                out.extend(self.run_lane(lane));
            }
        };
        on_threads(threads, "shardport-http-fetch", work)
    }

    fn run_lane(&self, lane: Lane<'_>) -> ItemResults {
        let mut out = Vec::new();
        for batch in lane.batches {
            out.extend(self.fetch_batch(&lane.pool, batch));
        }
        out
    }

    /// One `POST /v1/batch` for `jobs`; a 413 splits the batch in two.
    fn fetch_batch(&self, pool: &Arc<OwnerPool>, mut jobs: Vec<Job<'_>>) -> ItemResults {
        let fail_all = |jobs: Vec<Job<'_>>, e: AbiError| -> ItemResults {
            jobs.into_iter()
                .map(|j| (j.index, Err(e.clone())))
                .collect()
        };
        let n = jobs.len();
        let ids: Vec<ShardId> = jobs.iter().map(|j| j.id).collect();
        self.stats.batch_requests.inc();
        let body = wire::encode_batch_request(&ids);
        let req = Request {
            method: "POST",
            path: wire::BATCH_PATH,
            body: &body,
            read_timeout: None,
        };
        let (mut co, head) = match self.exchange(pool, &req) {
            Ok(r) => r,
            Err(e) => return fail_all(jobs, e),
        };
        if head.status != 200 {
            let e = self.error_response(pool, &head, &mut co, &format!("a batch of {n} shards"));
            drop(co);
            if head.status == StatusCode::PAYLOAD_TOO_LARGE.as_u16() && n > 1 {
                debug!(target: "http", owner = %pool.addr, shards = n, "batch too large for the owner, splitting");
                let second = jobs.split_off(n / 2);
                let mut out = self.fetch_batch(pool, jobs);
                out.extend(self.fetch_batch(pool, second));
                return out;
            }
            return fail_all(jobs, e);
        }
        let declared = head.content_length.unwrap_or_default();
        let table_len = wire::batch_head_len(n);
        if declared < table_len as u64 {
            return fail_all(
                jobs,
                AbiError::internal(format!(
                    "owner {} sent a batch response of {declared} bytes, shorter than the \
                     {table_len}-byte header table of {n} items",
                    pool.addr
                )),
            );
        }
        let kind = co.kind();
        let mut body = Body::new(co.conn(), &pool.addr, self.request_timeout, declared);
        let mut table = vec![0u8; table_len];
        if let Err(e) = body.read_exact(&mut table, What::BatchHead) {
            return fail_all(jobs, e);
        }
        let entries = match wire::decode_batch_head(&table, n) {
            Ok(e) => e,
            Err(why) => {
                return fail_all(
                    jobs,
                    AbiError::internal(format!(
                        "owner {} sent a malformed batch response: {why}",
                        pool.addr
                    )),
                )
            }
        };
        let total = entries
            .iter()
            .try_fold(table_len as u64, |t, e| t.checked_add(e.len));
        if total != Some(declared) {
            return fail_all(
                jobs,
                AbiError::internal(format!(
                    "owner {} sent a batch response of {declared} bytes whose header table \
                     announces {}",
                    pool.addr,
                    total.map_or_else(|| "more than 2^64".to_owned(), |t| t.to_string())
                )),
            );
        }
        let mut out = Vec::with_capacity(n);
        let mut broken: Option<AbiError> = None;
        for (job, entry) in jobs.into_iter().zip(entries) {
            if let Some(e) = &broken {
                out.push((job.index, Err(e.clone())));
                continue;
            }
            let r = match entry.status {
                wire::ITEM_OK if entry.len == job.dst.len() as u64 => {
                    match body.read_exact(job.dst, What::Shard(job.id)) {
                        Ok(()) => Ok(ImportInfo {
                            note: format!(
                                "POST /v1/batch of {n} to {} ({kind} connection)",
                                pool.addr
                            )
                            .into(),
                        }),
                        Err(e) => {
                            broken = Some(e.clone());
                            Err(e)
                        }
                    }
                }
                wire::ITEM_OK => {
                    if let Err(e) = body.skip(entry.len, What::Shard(job.id)) {
                        broken = Some(e);
                    }
                    Err(AbiError::invalid_descriptor(format!(
                        "owner {} serves {} bytes for shard {}, the descriptor says {}",
                        pool.addr,
                        entry.len,
                        job.id,
                        job.dst.len()
                    )))
                }
                wire::ITEM_NOT_FOUND => Err(AbiError::not_found(format!(
                    "shard {} is not exported by owner {} (it was removed, or the owner \
                     restarted)",
                    job.id, pool.addr
                ))),
                s => Err(AbiError::new(
                    ErrorKind::IO,
                    format!(
                        "owner {} answered item status {s} for shard {}",
                        pool.addr, job.id
                    ),
                )),
            };
            out.push((job.index, r));
        }
        co.reusable = broken.is_none() && body.complete() && !head.close;
        out
    }

    /// Sends one request and reads its response head, retrying on a fresh
    /// connection when one fails before any response byte: once for a
    /// pooled one (the owner closed it idle, or restarted), up to
    /// `MAX_FRESH_RETRIES` times, backing off, for a new one (an owner that
    /// admits at most
    /// `max-pending-per-peer` new connections from one address closes the
    /// oldest when a burst of them arrives, as when many consumer
    /// processes on one machine connect at once). Every request this client
    /// sends is idempotent.
    fn exchange(
        &self,
        pool: &Arc<OwnerPool>,
        req: &Request<'_>,
    ) -> PluginResult<(Checkout, ResponseHead)> {
        let mut co = self.checkout(pool)?;
        let mut retries = 0usize;
        loop {
            self.stats.requests_sent.inc();
            if co.reused {
                self.stats.client_connections_reused.inc();
            }
            let r = self.send(&pool.addr, co.conn(), req);
            let e = match r {
                Ok(head) => return Ok((co, head)),
                Err(e) => e,
            };
            match e {
                SendError::NoResponse(e) | SendError::Broken(e, _) if tls::is_tls_error(&e) => {
                    return Err(tls::explain(&pool.addr, &e))
                }
                SendError::NoResponse(e) if co.reused && !is_timeout(&e) => {
                    // The owner closed an idle connection as we picked it up
                    // (its idle-timeout), or it restarted: try a fresh one.
                    debug!(target: "http", owner = %pool.addr, error = %e, "pooled connection failed, retrying on a new one");
                    self.stats.retries.inc();
                    // A pooled connection gets this one retry only.
                    retries = MAX_FRESH_RETRIES;
                    co.conn = None;
                    co.conn = Some(self.connect(pool)?);
                    co.reused = false;
                }
                SendError::NoResponse(e) if retries < MAX_FRESH_RETRIES && !is_timeout(&e) => {
                    debug!(target: "http", owner = %pool.addr, error = %e, retries, "a new connection was closed before the response, retrying");
                    self.stats.retries.inc();
                    co.conn = None;
                    std::thread::sleep(FRESH_RETRY_PAUSE * 5u32.pow(retries as u32));
                    retries += 1;
                    co.conn = Some(self.connect(pool)?);
                }
                SendError::NoResponse(e) => {
                    return Err(AbiError::new(
                        if is_timeout(&e) {
                            ErrorKind::TIMEOUT
                        } else {
                            ErrorKind::UNAVAILABLE
                        },
                        format!(
                            "request {} {} to owner {} failed: {e}",
                            req.method, req.path, pool.addr
                        ),
                    ))
                }
                SendError::Timeout => {
                    return Err(AbiError::new(
                        ErrorKind::TIMEOUT,
                        format!(
                            "owner {} did not answer {} {} within request-timeout ({})",
                            pool.addr,
                            req.method,
                            req.path,
                            format_duration(self.request_timeout)
                        ),
                    ))
                }
                SendError::Broken(e, got) => {
                    return Err(AbiError::unavailable(format!(
                        "connection to owner {} failed after {got} bytes of the response head \
                         to {} {}: {e}",
                        pool.addr, req.method, req.path
                    )))
                }
                SendError::Malformed(why) => {
                    return Err(AbiError::internal(format!(
                        "owner {} sent a response to {} {} this consumer cannot read: {why} \
                         (is something other than a shardport owner listening there?)",
                        pool.addr, req.method, req.path
                    )))
                }
            }
        }
    }

    /// Writes `req` and reads the response head into the connection's
    /// buffer (body bytes read along with it stay buffered).
    fn send(
        &self,
        addr: &str,
        conn: &mut Conn,
        req: &Request<'_>,
    ) -> Result<ResponseHead, SendError> {
        let mut out = std::mem::take(&mut conn.req);
        head::write_request(
            &mut out,
            req.method,
            req.path,
            addr,
            self.auth.as_deref(),
            req.body,
        );
        // One write of head and body together (a TLS stream encrypts and
        // sends it in records of up to 16 KiB as it goes).
        let written = conn
            .stream
            .write_all(&out)
            .and_then(|()| conn.stream.flush());
        conn.req = out;
        written.map_err(SendError::NoResponse)?;
        // A pooled connection may carry another request's timeout (a
        // relay's): each request sets its own.
        let t = req.read_timeout.unwrap_or(self.request_timeout);
        if conn.read_timeout != t {
            conn.stream
                .tcp()
                .set_read_timeout(Some(t))
                .map_err(SendError::NoResponse)?;
            conn.read_timeout = t;
        }
        conn.pos = 0;
        conn.end = 0;
        if core_to_spare() {
            await_bytes(conn.stream.tcp(), self.spin);
        }
        loop {
            let got = conn.end;
            let n = match read_retrying(&mut conn.stream, &mut conn.buf[got..]) {
                Ok(0) if got == 0 => {
                    return Err(SendError::NoResponse(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection was closed before a response arrived",
                    )))
                }
                Ok(0) => {
                    return Err(SendError::Broken(
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the owner closed the connection inside the response head",
                        ),
                        got,
                    ))
                }
                Ok(n) => n,
                Err(e) if is_timeout(&e) => return Err(SendError::Timeout),
                Err(e) if got == 0 => return Err(SendError::NoResponse(e)),
                Err(e) => return Err(SendError::Broken(e, got)),
            };
            conn.end += n;
            match head::parse_response_head(&conn.buf[..conn.end]) {
                Ok(Some((h, len))) => {
                    conn.pos = len;
                    return Ok(h);
                }
                Ok(None) => {}
                Err(why) => return Err(SendError::Malformed(why)),
            }
        }
    }

    /// A slot of `pool` and a connection, pooled or new.
    fn checkout(&self, pool: &Arc<OwnerPool>) -> PluginResult<Checkout> {
        let deadline = Instant::now() + self.request_timeout;
        {
            let mut st = pool.state();
            if st.busy >= self.max_conns {
                self.stats.pool_waits.inc();
            }
            while st.busy >= self.max_conns {
                let now = Instant::now();
                if now >= deadline {
                    self.stats.pool_wait_timeouts.inc();
                    return Err(AbiError::new(
                        ErrorKind::TIMEOUT,
                        format!(
                            "all {} connections to owner {} stayed busy for request-timeout ({})",
                            self.max_conns,
                            pool.addr,
                            format_duration(self.request_timeout)
                        ),
                    ));
                }
                st.waiting += 1;
                st = pool
                    .freed
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                st.waiting -= 1;
            }
            st.busy += 1;
        }
        // From here on, dropping `co` gives the slot back.
        let mut co = Checkout {
            pool: Arc::clone(pool),
            conn: None,
            reused: false,
            reusable: false,
            idle_timeout: self.idle_timeout,
        };
        loop {
            let candidate = pool.state().idle.pop();
            let Some(c) = candidate else { break };
            if c.idle_since.elapsed() < self.idle_timeout && c.looks_alive() {
                co.conn = Some(c);
                co.reused = true;
                return Ok(co);
            }
            debug!(target: "http", owner = %pool.addr, "dropping a pooled connection the owner closed");
        }
        co.conn = Some(self.connect(pool)?);
        Ok(co)
    }

    /// Turns a non-200 response into an error, reading its JSON body (small,
    /// bounded); the connection is reused when the body was read whole.
    fn error_response(
        &self,
        pool: &OwnerPool,
        head: &ResponseHead,
        co: &mut Checkout,
        what: &str,
    ) -> AbiError {
        let text = match head.content_length {
            Some(n) if n <= MAX_ERROR_BODY as u64 => {
                let mut text = vec![0u8; n as usize];
                let mut body = Body::new(co.conn(), &pool.addr, self.request_timeout, n);
                match body.read_exact(&mut text, What::ErrorBody) {
                    Ok(()) => {
                        co.reusable = body.complete() && !head.close;
                        text
                    }
                    Err(_) => {
                        text.truncate(body.received as usize);
                        text
                    }
                }
            }
            // Longer than we read, or delimited by the end of the
            // connection: read a bounded prefix, never reuse.
            _ => {
                let conn = co.conn();
                let mut text = conn.buf[conn.pos..conn.end].to_vec();
                conn.pos = conn.end;
                let mut chunk = [0u8; 4096];
                while text.len() < MAX_ERROR_BODY {
                    match read_retrying(&mut conn.stream, &mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => text.extend_from_slice(&chunk[..n]),
                    }
                }
                text.truncate(MAX_ERROR_BODY);
                text
            }
        };
        let message = match wire::parse_error_body(&text) {
            Some((code, msg)) => format!("{msg} ({code})"),
            None => String::from_utf8_lossy(&text[..text.len().min(200)]).into_owned(),
        };
        let addr = &pool.addr;
        let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (kind, hint) = match status {
            StatusCode::NOT_FOUND => (ErrorKind::NOT_FOUND, ""),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => (
                ErrorKind::PERMISSION_DENIED,
                "; owner and consumer must be configured with the same auth-token",
            ),
            StatusCode::PAYLOAD_TOO_LARGE => (
                ErrorKind::RESOURCE_EXHAUSTED,
                "; lower this consumer's max-batch or raise the owner's limits",
            ),
            StatusCode::REQUEST_TIMEOUT => (ErrorKind::TIMEOUT, ""),
            s if s.is_server_error() => (ErrorKind::UNAVAILABLE, ""),
            s if s.is_client_error() => (
                ErrorKind::INTERNAL,
                "; owner and consumer may run incompatible versions of the http transport",
            ),
            _ => (ErrorKind::IO, ""),
        };
        let shown = if status.as_u16() == head.status {
            status.to_string()
        } else {
            head.status.to_string()
        };
        AbiError::new(
            kind,
            format!("owner {addr} refused {what} with HTTP {shown}: {message}{hint}"),
        )
    }
}

/// Runs `work` on the calling thread and `threads - 1` scoped helpers
/// (named `name`, each forwarding its events to the host like the
/// caller), and gathers what they return. `work` takes jobs from a shared
/// queue until it is empty.
pub(crate) fn on_threads<T: Send>(
    threads: usize,
    name: &str,
    work: impl Fn() -> Vec<T> + Sync,
) -> Vec<T> {
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(scope, || {
                        tracing::dispatcher::with_default(&dispatch, &work)
                    })
                    .ok()
            })
            .collect();
        let mut out = work();
        for h in helpers {
            match h.join() {
                Ok(v) => out.extend(v),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// The batches of one owner that run one after another on one connection.
struct Lane<'a> {
    pool: Arc<OwnerPool>,
    batches: Vec<Vec<Job<'a>>>,
}
