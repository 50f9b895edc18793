//! Consumer side: pooled HTTP/1.1 connections to owners, and fetches that
//! stream response bodies straight into the host's destination buffers.
//!
//! # Overview
//! One [`OwnerPool`] per owner address holds idle kept-alive connections
//! and a semaphore of `max-connections-per-owner` permits; a request holds a
//! permit for its whole exchange, so at most that many connections to one
//! owner are ever open. A pooled connection found closed is dropped; a
//! request that fails on a reused connection before any response arrives is
//! retried once on a fresh one (both requests are idempotent reads).
//!
//! Bodies are read frame by frame and each frame is copied once, into its
//! place in the destination: no intermediate buffer, no growth per response.
//! `import_many` groups items by owner, sends one `POST /v1/batch` per
//! `max-batch` items, runs owners (and up to `max-connections-per-owner`
//! batches per owner) concurrently, and fails only the items that failed.
//!
//! # Timeouts
//! Resolving and connecting: `connect-timeout`. Waiting for a pool permit,
//! for a response head, and between two body frames: `request-timeout`. A
//! dead owner therefore costs at most one of these, never a hang.

use std::{
    collections::HashMap,
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::Poll,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    body::Incoming,
    client::conn::http1::{self, SendRequest},
    header::{self, HeaderValue},
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use shardport_abi::{AbiError, ErrorKind, ImportInfo, PluginResult, ShardId};
use tokio::{net::TcpStream, sync::Semaphore};
use tracing::debug;

use crate::{
    config::{format_duration, Config, Token},
    descriptor::Descriptor,
    stats::Stats,
    wire,
};

/// Largest error body read from an owner (JSON, a few hundred bytes in
/// practice); a larger one is cut off and its connection not reused.
const MAX_ERROR_BODY: usize = 64 << 10;
/// Owner pools kept before idle ones are forgotten: bounds the memory of a
/// long-lived consumer that fetched from many short-lived owners.
const MAX_IDLE_POOLS: usize = 256;
/// Sent with every request, so an owner's logs say who asked.
const USER_AGENT: &str = concat!("shardport-http/", env!("CARGO_PKG_VERSION"));

type Body = Full<Bytes>;

/// Results of a batch: `(item index, outcome)` per job.
type ItemResults = Vec<(usize, PluginResult<ImportInfo>)>;

/// A connection idle in its pool.
struct IdleConn {
    sender: SendRequest<Body>,
    since: Instant,
}

/// Connections to one owner.
struct OwnerPool {
    addr: String,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<IdleConn>>,
}

impl OwnerPool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<IdleConn>> {
        // Only pushes and pops happen under this lock.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection checked out of its pool with a permit; returned to the pool
/// on drop when the exchange left it reusable.
struct Checkout {
    pool: Arc<OwnerPool>,
    /// Always `Some` until dropped.
    sender: Option<SendRequest<Body>>,
    reused: bool,
    reusable: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Checkout {
    fn drop(&mut self) {
        match self.sender.take() {
            Some(sender) if self.reusable && !sender.is_closed() => {
                self.pool.idle().push(IdleConn {
                    sender,
                    since: Instant::now(),
                });
            }
            _ => {}
        }
    }
}

/// One shard to fetch: where its bytes go.
pub(crate) struct Job<'a> {
    /// Index of the item in the caller's batch.
    pub index: usize,
    pub id: ShardId,
    pub dst: &'a mut [u8],
}

/// The consumer side of one transport instance.
pub(crate) struct Client {
    pools: Mutex<HashMap<String, Arc<OwnerPool>>>,
    token: Option<HeaderValue>,
    connect_timeout: Duration,
    request_timeout: Duration,
    idle_timeout: Duration,
    max_conns: usize,
    max_batch: usize,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("max_conns", &self.max_conns)
            .finish_non_exhaustive()
    }
}

fn auth_value(token: &Token) -> PluginResult<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", token.as_str()))
        .map_err(|_| AbiError::config("the auth token cannot travel in an HTTP header"))?;
    v.set_sensitive(true);
    Ok(v)
}

impl Client {
    pub(crate) fn new(cfg: &Config, stats: Arc<Stats>) -> PluginResult<Client> {
        Ok(Client {
            pools: Mutex::default(),
            token: cfg.auth_token.as_ref().map(auth_value).transpose()?,
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
            idle_timeout: cfg.idle_timeout,
            max_conns: cfg.max_connections_per_owner,
            max_batch: cfg.max_batch,
            stats,
        })
    }

    fn pool(&self, addr: &str) -> Arc<OwnerPool> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = pools.get(addr) {
            return Arc::clone(p);
        }
        if pools.len() >= MAX_IDLE_POOLS {
            // Forget pools nobody uses: no idle connection, no request out.
            pools.retain(|_, p| Arc::strong_count(p) > 1 || !p.idle().is_empty());
        }
        let p = Arc::new(OwnerPool {
            addr: addr.to_owned(),
            permits: Arc::new(Semaphore::new(self.max_conns)),
            idle: Mutex::default(),
        });
        pools.insert(addr.to_owned(), Arc::clone(&p));
        p
    }

    /// Fetches one shard into `dst` (`dst.len() == desc.len`, checked by
    /// the caller).
    pub(crate) async fn fetch_one(
        &self,
        desc: &Descriptor,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        let pool = self.pool(&desc.addr);
        let path = wire::shard_path(desc.id);
        let (resp, mut co) = self.send(&pool, Method::GET, &path, Bytes::new()).await?;
        let reused = co.reused;
        let status = resp.status();
        if status != StatusCode::OK {
            let e = self
                .error_response(&pool, resp, &mut co, &format!("shard {}", desc.id))
                .await;
            return Err(e);
        }
        let declared = content_length(&resp);
        let len_header = resp
            .headers()
            .get(wire::LEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        for n in [declared, len_header].into_iter().flatten() {
            if n != desc.len {
                return Err(AbiError::invalid_descriptor(format!(
                    "owner {} serves {n} bytes for shard {}, the descriptor says {}",
                    pool.addr, desc.id, desc.len
                )));
            }
        }
        let mut body = BodyReader::new(resp.into_body(), &pool.addr, self.request_timeout);
        body.read_exact(dst, desc.id).await?;
        body.expect_end(desc.id).await?;
        co.reusable = true;
        Ok(ImportInfo {
            note: format!(
                "GET {} from {} ({} connection)",
                path,
                pool.addr,
                if reused { "pooled" } else { "new" }
            )
            .into(),
        })
    }

    /// Fetches every job from owner `addr`, in batches of `max-batch` spread
    /// over up to `max-connections-per-owner` connections. Returns one result
    /// per job (by its `index`).
    pub(crate) async fn fetch_owner<'a>(&self, addr: &str, jobs: Vec<Job<'a>>) -> ItemResults {
        let pool = self.pool(addr);
        let mut chunks: Vec<Vec<Job<'a>>> = Vec::new();
        for job in jobs {
            match chunks.last_mut() {
                Some(c) if c.len() < self.max_batch => c.push(job),
                _ => chunks.push(vec![job]),
            }
        }
        let lanes = chunks.len().min(self.max_conns).max(1);
        let mut per_lane: Vec<Vec<Vec<Job<'a>>>> = (0..lanes).map(|_| Vec::new()).collect();
        for (i, c) in chunks.into_iter().enumerate() {
            per_lane[i % lanes].push(c);
        }
        let futs = per_lane.into_iter().map(|lane| {
            let pool = Arc::clone(&pool);
            async move {
                let mut out = Vec::new();
                for chunk in lane {
                    out.extend(self.fetch_batch(Arc::clone(&pool), chunk).await);
                }
                out
            }
        });
        join_all(futs.collect())
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// One `POST /v1/batch` for `jobs`; a 413 splits the batch in two.
    fn fetch_batch<'s, 'a: 's>(
        &'s self,
        pool: Arc<OwnerPool>,
        mut jobs: Vec<Job<'a>>,
    ) -> Pin<Box<dyn Future<Output = ItemResults> + 's>> {
        Box::pin(async move {
            let fail_all = |jobs: Vec<Job<'a>>, e: AbiError| {
                jobs.into_iter()
                    .map(|j| (j.index, Err(e.clone())))
                    .collect::<Vec<_>>()
            };
            let ids: Vec<ShardId> = jobs.iter().map(|j| j.id).collect();
            self.stats.batch_requests.inc();
            let body = Bytes::from(wire::encode_batch_request(&ids));
            let (resp, mut co) = match self.send(&pool, Method::POST, wire::BATCH_PATH, body).await
            {
                Ok(r) => r,
                Err(e) => return fail_all(jobs, e),
            };
            let status = resp.status();
            if status != StatusCode::OK {
                let what = format!("a batch of {} shards", jobs.len());
                let e = self.error_response(&pool, resp, &mut co, &what).await;
                drop(co);
                if status == StatusCode::PAYLOAD_TOO_LARGE && jobs.len() > 1 {
                    debug!(target: "http", owner = %pool.addr, shards = jobs.len(), "batch too large for the owner, splitting");
                    let second = jobs.split_off(jobs.len() / 2);
                    let mut out = self.fetch_batch(Arc::clone(&pool), jobs).await;
                    out.extend(self.fetch_batch(pool, second).await);
                    return out;
                }
                return fail_all(jobs, e);
            }
            let declared = content_length(&resp);
            let n = jobs.len();
            let mut body = BodyReader::new(resp.into_body(), &pool.addr, self.request_timeout);
            let mut head = vec![0u8; wire::batch_head_len(n)];
            if let Err(e) = body.read_exact(&mut head, BATCH_HEAD).await {
                return fail_all(jobs, e);
            }
            let entries = match wire::decode_batch_head(&head, n) {
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
            let total: u64 = head.len() as u64 + entries.iter().map(|e| e.len).sum::<u64>();
            if declared.is_some_and(|d| d != total) {
                return fail_all(
                    jobs,
                    AbiError::internal(format!(
                        "owner {} sent a batch response of {} bytes whose header table \
                         announces {total}",
                        pool.addr,
                        declared.unwrap_or_default()
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
                        match body.read_exact(job.dst, job.id).await {
                            Ok(()) => Ok(ImportInfo {
                                note: format!(
                                    "POST /v1/batch of {n} to {} ({} connection)",
                                    pool.addr,
                                    if co.reused { "pooled" } else { "new" }
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
                        if let Err(e) = body.skip(entry.len, job.id).await {
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
            if broken.is_none() && body.expect_end(BATCH_HEAD).await.is_ok() {
                co.reusable = true;
            }
            out
        })
    }

    /// Sends one request, retrying once on a fresh connection when a pooled
    /// one fails before answering.
    async fn send(
        &self,
        pool: &Arc<OwnerPool>,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> PluginResult<(Response<Incoming>, Checkout)> {
        let deadline = Instant::now() + self.request_timeout;
        let mut co = self.checkout(pool, deadline).await?;
        loop {
            let req = self.request(pool, &method, path, body.clone())?;
            self.stats.requests_sent.inc();
            if co.reused {
                self.stats.client_connections_reused.inc();
            }
            let Some(sender) = co.sender.as_mut() else {
                return Err(AbiError::internal(
                    "checked-out connection without a sender",
                ));
            };
            match tokio::time::timeout_at(deadline.into(), sender.send_request(req)).await {
                Ok(Ok(resp)) => return Ok((resp, co)),
                Ok(Err(e)) if co.reused => {
                    // The owner closed an idle connection as we picked it up
                    // (its idle-timeout), or it restarted: try a fresh one.
                    debug!(target: "http", owner = %pool.addr, error = %e, "pooled connection failed, retrying on a new one");
                    self.stats.retries.inc();
                    co.sender = Some(self.connect(pool).await?);
                    co.reused = false;
                }
                Ok(Err(e)) => return Err(request_failed(&pool.addr, &e)),
                Err(_) => {
                    return Err(AbiError::new(
                        ErrorKind::TIMEOUT,
                        format!(
                            "owner {} did not answer {method} {path} within request-timeout ({})",
                            pool.addr,
                            format_duration(self.request_timeout)
                        ),
                    ))
                }
            }
        }
    }

    fn request(
        &self,
        pool: &OwnerPool,
        method: &Method,
        path: &str,
        body: Bytes,
    ) -> PluginResult<Request<Body>> {
        let mut b = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::HOST, pool.addr.as_str())
            .header(header::USER_AGENT, USER_AGENT);
        if let Some(t) = &self.token {
            b = b.header(header::AUTHORIZATION, t.clone());
        }
        if !body.is_empty() {
            b = b.header(header::CONTENT_TYPE, "application/octet-stream");
        }
        b.body(Full::new(body)).map_err(|e| {
            AbiError::internal(format!(
                "cannot build the request {method} {path} to {}: {e}",
                pool.addr
            ))
        })
    }

    /// A connection to `pool`'s owner, pooled or new, with a permit.
    async fn checkout(&self, pool: &Arc<OwnerPool>, deadline: Instant) -> PluginResult<Checkout> {
        let permit =
            tokio::time::timeout_at(deadline.into(), Arc::clone(&pool.permits).acquire_owned())
                .await
                .map_err(|_| {
                    AbiError::new(
                        ErrorKind::TIMEOUT,
                        format!(
                            "all {} connections to owner {} stayed busy for request-timeout ({})",
                            self.max_conns,
                            pool.addr,
                            format_duration(self.request_timeout)
                        ),
                    )
                })?
                .map_err(|_| AbiError::internal("connection pool semaphore closed"))?;
        loop {
            let candidate = pool.idle().pop();
            let Some(mut idle) = candidate else { break };
            if idle.sender.is_closed() || idle.since.elapsed() >= self.idle_timeout {
                continue;
            }
            let ready = tokio::time::timeout_at(deadline.into(), idle.sender.ready()).await;
            if matches!(ready, Ok(Ok(()))) {
                return Ok(Checkout {
                    pool: Arc::clone(pool),
                    sender: Some(idle.sender),
                    reused: true,
                    reusable: false,
                    _permit: permit,
                });
            }
        }
        let sender = self.connect(pool).await?;
        Ok(Checkout {
            pool: Arc::clone(pool),
            sender: Some(sender),
            reused: false,
            reusable: false,
            _permit: permit,
        })
    }

    /// Opens a new connection to `pool`'s owner within `connect-timeout`.
    async fn connect(&self, pool: &OwnerPool) -> PluginResult<SendRequest<Body>> {
        let addr = pool.addr.as_str();
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let timed_out = || {
            AbiError::new(
                ErrorKind::TIMEOUT,
                format!(
                    "cannot connect to owner {addr} within connect-timeout ({}): the owner \
                     host is down or unreachable",
                    format_duration(self.connect_timeout)
                ),
            )
        };
        let addrs: Vec<_> =
            match tokio::time::timeout_at(deadline, tokio::net::lookup_host(addr)).await {
                Err(_) => return Err(timed_out()),
                Ok(Err(e)) => {
                    return Err(AbiError::unavailable(format!(
                        "cannot resolve owner address {addr}: {e}"
                    )))
                }
                Ok(Ok(a)) => a.collect(),
            };
        let mut last: Option<io::Error> = None;
        let mut stream = None;
        for a in &addrs {
            match tokio::time::timeout_at(deadline, TcpStream::connect(a)).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(s)) => {
                    stream = Some(s);
                    break;
                }
                Ok(Err(e)) => last = Some(e),
            }
        }
        let Some(stream) = stream else {
            let e = last.unwrap_or_else(|| io::Error::other("the name resolved to no address"));
            return Err(connect_failed(addr, &e));
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = match tokio::time::timeout_at(
            deadline,
            http1::Builder::new()
                .writev(true)
                .handshake::<_, Body>(TokioIo::new(stream)),
        )
        .await
        {
            Err(_) => return Err(timed_out()),
            Ok(Err(e)) => return Err(request_failed(addr, &e)),
            Ok(Ok(x)) => x,
        };
        self.stats.client_connections_opened.inc();
        self.stats.client_connections_open.add(1);
        let stats = Arc::clone(&self.stats);
        let owner = addr.to_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(target: "http", owner = %owner, error = %e, "connection to owner ended with an error");
            }
            stats.client_connections_open.sub(1);
        });
        debug!(target: "http", owner = %addr, "connected");
        Ok(sender)
    }

    /// Turns a non-200 response into an error, reading its JSON body (small,
    /// bounded); the connection is reused when the body was read whole.
    async fn error_response(
        &self,
        pool: &OwnerPool,
        resp: Response<Incoming>,
        co: &mut Checkout,
        what: &str,
    ) -> AbiError {
        let status = resp.status();
        let mut body = resp.into_body();
        let mut text = Vec::new();
        let mut complete = false;
        while text.len() <= MAX_ERROR_BODY {
            match tokio::time::timeout(self.request_timeout, body.frame()).await {
                Ok(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        text.extend_from_slice(&d);
                    }
                }
                Ok(None) => {
                    complete = true;
                    break;
                }
                _ => break,
            }
        }
        co.reusable = complete;
        let message = match wire::parse_error_body(&text) {
            Some((code, msg)) => format!("{msg} ({code})"),
            None => String::from_utf8_lossy(&text[..text.len().min(200)]).into_owned(),
        };
        let addr = &pool.addr;
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
        AbiError::new(
            kind,
            format!("owner {addr} refused {what} with HTTP {status}: {message}{hint}"),
        )
    }
}

/// Marker for "the batch header table" in messages of [`BodyReader`].
const BATCH_HEAD: ShardId = ShardId { hi: 0, lo: 0 };

/// Reads a response body frame by frame, each frame copied once into its
/// destination; `pending` keeps the tail of a frame that spans two items.
struct BodyReader<'p> {
    body: Incoming,
    pending: Bytes,
    addr: &'p str,
    timeout: Duration,
    received: u64,
}

impl<'p> BodyReader<'p> {
    fn new(body: Incoming, addr: &'p str, timeout: Duration) -> Self {
        BodyReader {
            body,
            pending: Bytes::new(),
            addr,
            timeout,
            received: 0,
        }
    }

    fn what(id: ShardId) -> String {
        if id == BATCH_HEAD {
            "the batch header table".to_owned()
        } else {
            format!("shard {id}")
        }
    }

    /// The next non-empty chunk, or `None` at the end of the body.
    async fn next_chunk(&mut self, id: ShardId) -> PluginResult<Option<Bytes>> {
        if !self.pending.is_empty() {
            return Ok(Some(std::mem::take(&mut self.pending)));
        }
        loop {
            match tokio::time::timeout(self.timeout, self.body.frame()).await {
                Err(_) => {
                    return Err(AbiError::new(
                        ErrorKind::TIMEOUT,
                        format!(
                            "owner {} sent nothing for request-timeout ({}) while sending {} \
                             ({} bytes of the response received)",
                            self.addr,
                            format_duration(self.timeout),
                            Self::what(id),
                            self.received
                        ),
                    ))
                }
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => {
                    return Err(AbiError::unavailable(format!(
                        "connection to owner {} failed while receiving {} ({} bytes of the \
                         response received): {}",
                        self.addr,
                        Self::what(id),
                        self.received,
                        error_chain(&e)
                    )))
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            self.received += data.len() as u64;
                            return Ok(Some(data));
                        }
                    }
                }
            }
        }
    }

    /// Fills `dst` exactly.
    async fn read_exact(&mut self, dst: &mut [u8], id: ShardId) -> PluginResult<()> {
        let mut filled = 0;
        while filled < dst.len() {
            let Some(mut chunk) = self.next_chunk(id).await? else {
                return Err(AbiError::unavailable(format!(
                    "owner {} ended the response after {filled} of {} bytes of {}",
                    self.addr,
                    dst.len(),
                    Self::what(id)
                )));
            };
            let take = chunk.len().min(dst.len() - filled);
            dst[filled..filled + take].copy_from_slice(&chunk[..take]);
            filled += take;
            if take < chunk.len() {
                self.pending = chunk.split_off(take);
            }
        }
        Ok(())
    }

    /// Discards `n` bytes.
    async fn skip(&mut self, mut n: u64, id: ShardId) -> PluginResult<()> {
        while n > 0 {
            let Some(mut chunk) = self.next_chunk(id).await? else {
                return Err(AbiError::unavailable(format!(
                    "owner {} ended the response inside {}",
                    self.addr,
                    Self::what(id)
                )));
            };
            let take = (chunk.len() as u64).min(n) as usize;
            n -= take as u64;
            if take < chunk.len() {
                self.pending = chunk.split_off(take);
            }
        }
        Ok(())
    }

    /// Checks that nothing follows.
    async fn expect_end(&mut self, id: ShardId) -> PluginResult<()> {
        match self.next_chunk(id).await? {
            None => Ok(()),
            Some(extra) => Err(AbiError::internal(format!(
                "owner {} sent at least {} bytes more than announced after {}",
                self.addr,
                extra.len(),
                Self::what(id)
            ))),
        }
    }
}

fn content_length(resp: &Response<Incoming>) -> Option<u64> {
    resp.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The message of `e` and of every error it wraps.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        source = inner.source();
    }
    s
}

/// A TCP connect failure, with the kind the host acts on.
fn connect_failed(addr: &str, e: &io::Error) -> AbiError {
    let kind = match e.kind() {
        io::ErrorKind::TimedOut => ErrorKind::TIMEOUT,
        io::ErrorKind::PermissionDenied => ErrorKind::PERMISSION_DENIED,
        _ => ErrorKind::UNAVAILABLE,
    };
    let hint = match e.kind() {
        io::ErrorKind::ConnectionRefused => {
            "; nothing listens there: the owner exited, or it serves another address"
        }
        _ => "",
    };
    AbiError::new(kind, format!("cannot connect to owner {addr}: {e}{hint}"))
}

/// A request that failed before a response head arrived.
fn request_failed(addr: &str, e: &hyper::Error) -> AbiError {
    let kind = if e.is_timeout() {
        ErrorKind::TIMEOUT
    } else {
        ErrorKind::UNAVAILABLE
    };
    AbiError::new(
        kind,
        format!("request to owner {addr} failed: {}", error_chain(e)),
    )
}

/// Polls every future to completion on the current task; outputs in order.
pub(crate) async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outs.into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}
