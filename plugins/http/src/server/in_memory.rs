//! The owner's request handling over an in-memory connection: the same
//! hyper settings and handler as [`serve_connection`](super::serve_connection),
//! no socket, no watchdog and nothing exported. Used by the fuzz targets
//! (through `crate::fuzzing`) to feed arbitrary request bytes to the server.

use std::{
    cell::RefCell,
    io,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{http1_builder, service, Activity, Pending, Registry, Shared};
use crate::{config::Config, stats::Stats};

/// The bearer token the in-memory server requires.
pub(crate) const TOKEN: &str = "fuzz-token";

/// Longest a single [`serve`] may take: the input ends the connection, so
/// only a handler that hangs comes near it.
const SERVE_LIMIT: Duration = Duration::from_secs(10);

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// A connection whose peer sent `input` and then closed its sending side.
struct Memory {
    input: Vec<u8>,
    pos: usize,
    output: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Memory {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = buf.remaining().min(self.input.len() - self.pos);
        buf.put_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Memory {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn shared() -> Arc<Shared> {
    let cfg = Config::parse("fuzz", &format!("auth-token = \"{TOKEN}\"\nmax-batch = 64"))
        .expect("the in-memory server's config is valid");
    let bound = "127.0.0.1:7070".parse().expect("a socket address");
    let stats = Arc::new(Stats::default());
    let client = crate::client::Client::new(&cfg, None, Arc::clone(&stats))
        .expect("the in-memory server's client config is valid");
    Arc::new(Shared {
        client: Arc::new(client),
        registry: Arc::new(Registry::default()),
        stats,
        token: cfg.auth_token.clone(),
        bound,
        advertised: bound.to_string(),
        max_batch: cfg.max_batch,
        max_request_bytes: cfg.max_request_bytes,
        max_header_bytes: cfg.max_header_bytes,
        request_timeout: cfg.request_timeout,
        idle_timeout: cfg.idle_timeout,
        header_timeout: cfg.header_timeout,
        owner_spin: Duration::ZERO,
        dedicated: super::connection::Dedicated::none(),
        rotations: 0.into(),
        rotating: 0.into(),
        // Plain HTTP: the fuzz target drives the request framing, not TLS.
        tls: None,
        tls_handshake_timeout: cfg.tls.handshake_timeout,
        admission: shardport_kit::admission::Admission::new(
            cfg.max_pending,
            cfg.max_pending_per_peer,
        ),
        epoch: Instant::now(),
        stopped: Mutex::new(None),
        accept_error: Mutex::new(None),
        staging: Arc::new(crate::gpu::PinnedPool::new(
            cfg.staging,
            cfg.device_piece,
            cfg.device_buffers,
        )),
        trackers: crate::relay::Trackers::new(
            cfg.relay.fanout,
            cfg.relay.sources,
            cfg.relay.piece,
            crate::relay::TlsPolicy::default(),
            cfg.relay.keep,
        ),
        holdings: Arc::new(crate::relay::Holdings::new(
            cfg.relay.cache,
            cfg.relay.window,
            cfg.relay.keep,
        )),
        relay_stall: cfg.relay.stall_timeout,
        relay_corrupt: false,
    })
}

/// Serves one connection that carries `input`; returns what the server
/// wrote, and whether the connection ended within [`SERVE_LIMIT`].
pub(crate) fn serve(input: &[u8]) -> (Vec<u8>, bool) {
    let output = Arc::new(Mutex::new(Vec::new()));
    let io = Memory {
        input: input.to_vec(),
        pos: 0,
        output: Arc::clone(&output),
    };
    let shared = shared();
    let activity = Arc::new(Activity::new(shared.epoch));
    let mut builder = http1_builder(&shared);
    let conn = builder
        // The peer's end of input comes with its last byte: answer what
        // was asked before closing, as a real peer would wait for.
        .half_close(true)
        .serve_connection(
            TokioIo::new(io),
            service(Arc::clone(&shared), activity, Pending::alone()),
        );
    let ended = RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a current-thread runtime")
        });
        // A connection error (a malformed head) is answered by hyper and
        // ends the connection: what was written is the result either way.
        rt.block_on(async { tokio::time::timeout(SERVE_LIMIT, conn).await })
            .is_ok()
    });
    let out = std::mem::take(&mut *output.lock().unwrap_or_else(PoisonError::into_inner));
    (out, ended)
}
