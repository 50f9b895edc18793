//! The plugin's config table, validated into typed values.
//!
//! ```toml
//! [[plugin]]
//! name = "http"
//! path = "libshardport_http.so"
//! [plugin.config]
//! bind = "0.0.0.0:7071"
//! advertise = "node7.cluster.internal:7071"
//! auth-token-env = "SHARDPORT_TOKEN"
//! request-timeout = "120s"
//! listen = "lazy"          # bind on the first export (default), or "eager"
//! ```
//!
//! Every key is optional; an unknown key is an error naming it. Durations are
//! strings with a unit (`"250ms"`, `"5s"`, `"2m"`, `"1h"`). Parsing is the
//! plugin kit's [`Options`].

use std::{
    fmt,
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    time::Duration,
};

use shardport_abi::PluginResult;
use shardport_kit::{format_byte_size, Options};

pub(crate) use shardport_kit::format_duration;

use crate::descriptor::{self, MAX_ADDR_LEN};

/// Default bind address: loopback with an ephemeral port. A transport that
/// serves shard bytes must never be reachable from other machines unless an
/// operator says so; the port is chosen by the kernel so two nodes on one
/// machine never collide.
pub(crate) const DEFAULT_BIND: &str = "127.0.0.1:0";
/// Default shards per batch request: 1024 ids are 16 KiB of request body,
/// enough to fetch a model's tensors from one owner in a handful of round
/// trips while keeping one request's work bounded.
pub(crate) const DEFAULT_MAX_BATCH: u64 = 1024;
/// Largest `max-batch`: 65536 ids are a 1 MiB request body and 640 KiB of
/// response header table, beyond which one request monopolises a connection.
pub(crate) const MAX_MAX_BATCH: u64 = 65536;
/// Default request-head limit: 16 KiB is twice what common servers accept by
/// default (8 KiB) and far above what our own client sends (< 300 bytes).
pub(crate) const DEFAULT_MAX_HEADER_BYTES: u64 = 16 << 10;
/// Smallest `max-header-bytes`: 1 KiB still fits our client's requests with
/// a long token; anything smaller would refuse legitimate requests.
pub(crate) const MIN_MAX_HEADER_BYTES: u64 = 1 << 10;
/// Largest `max-header-bytes`: 1 MiB; headers are buffered in memory per
/// connection, so this bounds what a hostile client can make us hold.
pub(crate) const MAX_MAX_HEADER_BYTES: u64 = 1 << 20;
/// Default request-body limit: 1 MiB holds a batch of 65536 ids, so with the
/// default `max-batch` it never binds for our own client while bounding what
/// any request can make the owner buffer.
pub(crate) const DEFAULT_MAX_REQUEST_BYTES: u64 = 1 << 20;
/// Largest `max-request-bytes`: bodies are buffered whole, so 64 MiB per
/// request is the most we let a config ask for.
pub(crate) const MAX_MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Default TCP connect timeout: 5 s covers a SYN retransmit on a lossy
/// network; an owner that does not answer by then is treated as down.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default idle timeout: 60 s keeps pooled connections warm between the
/// bursts of an RL or inference step, and frees a connection whose peer made
/// no progress (a stalled reader) within a minute.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default request timeout: 120 s. The longest a consumer waits for an owner
/// to start answering or to send the next bytes of a body, the longest an
/// owner waits for a request body, and the longest `unexport` waits for
/// responses still reading the shard. Longer than `idle-timeout`, so with the
/// defaults a stalled reader is cut off before `unexport` gives up.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Default header timeout: a client has 10 s from its first byte to finish a
/// request head; slow-header (slowloris) clients are dropped well before
/// they can tie up `max-connections`.
pub(crate) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `spin`: 50 us. How long a consumer polls its connection for a
/// response before it sleeps in the kernel. On this project's VMs a
/// sleeping thread takes 30-40 us to wake (the guest halts its idle vCPUs:
/// `guest_halt_poll_ns` = 0): a 4 KiB fetch took ~70 us with a sleeping
/// consumer and 11-14 us with a polling one (BENCHMARKS.md, 2026-11-26).
/// Owners poll only after a response, for `owner-spin`.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// Default `owner-spin`: 200 us. How long an owner's connection polls for
/// the next request after writing a response, while a core is idle.
pub(crate) const DEFAULT_OWNER_SPIN: Duration = Duration::from_micros(200);
/// Longest accepted `spin`: 1 ms (beyond that, polling only burns CPU).
pub(crate) const MAX_SPIN: Duration = Duration::from_millis(1);
/// Longest accepted duration for any timeout: one day (a typo guard).
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Default pooled connections per owner: 4 parallel streams saturate a
/// 100 Gb/s link in practice while keeping an owner's fan-in bounded when
/// hundreds of consumers fetch from it at once.
pub(crate) const DEFAULT_MAX_CONNECTIONS_PER_OWNER: u64 = 4;
/// Largest `max-connections-per-owner`.
pub(crate) const MAX_MAX_CONNECTIONS_PER_OWNER: u64 = 1024;
/// Default inbound connection limit of the owner's server: 512 covers 128
/// consumers with the default per-owner pool; beyond it new connections wait
/// in the kernel's accept backlog instead of exhausting file descriptors.
pub(crate) const DEFAULT_MAX_CONNECTIONS: u64 = 512;
/// Largest `max-connections`.
pub(crate) const MAX_MAX_CONNECTIONS: u64 = 65536;
/// Default budget of *pending* inbound connections (accepted, no
/// authenticated request yet): a new one beyond it evicts the oldest, so
/// clients that trickle their heads (or never send a valid token) cannot
/// hold `max-connections` against real consumers.
pub(crate) const DEFAULT_MAX_PENDING: u64 = 64;
/// Default pending connections from one address (its oldest goes first).
pub(crate) const DEFAULT_MAX_PENDING_PER_PEER: u64 = 16;
/// Default runtime worker threads: 2. The plugin's runtime only moves bytes
/// between sockets and memory; two workers keep a 100 Gb/s NIC busy without
/// competing with the training process for cores.
pub(crate) const DEFAULT_THREADS: u64 = 2;
/// Default `dedicated-threads`: 2. An owner with one or two consumers (a
/// relay serving the next node of its chain, a trainer with two rollout
/// engines) serves each on a thread of its own; with more, all share the
/// runtime (see `server::connection::Dedicated`).
pub(crate) const DEFAULT_DEDICATED_THREADS: u64 = 2;
/// Largest `threads`, and largest `dedicated-threads`.
pub(crate) const MAX_THREADS: u64 = 256;
/// Longest accepted auth token, in bytes (it travels in every request head).
pub(crate) const MAX_TOKEN_LEN: usize = 4096;
/// Default of `listen`: bind and start the server on the first export. A
/// process that only fetches then opens no port and starts no runtime
/// threads; a bind failure goes to that export, naming the address.
pub(crate) const DEFAULT_LISTEN: &str = "lazy";

/// Default `device-piece`: large enough that a device-to-host copy runs at
/// full speed, small enough that the first bytes leave at once.
pub(crate) const DEFAULT_DEVICE_PIECE: u64 = 4 << 20;
const MIN_DEVICE_PIECE: u64 = 64 << 10;
const MAX_DEVICE_PIECE: u64 = 256 << 20;
/// Default `device-buffers`: 8 pinned pieces (32 MiB) per owner.
const DEFAULT_DEVICE_BUFFERS: u64 = 8;

/// Default TLS handshake timeout: 10 s, like `header-timeout`: a handshake
/// is two round trips and a few KiB, so a peer still handshaking after 10 s
/// is stalled or hostile, and it holds one of `max-connections` meanwhile.
pub(crate) const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the owner asks consumers for a certificate (mutual TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    /// Any consumer that trusts the owner's certificate may connect.
    None,
    /// A consumer must present a certificate issued by `tls-client-ca`.
    Required,
}

/// The TLS part of the config: files by path, loaded and checked by
/// [`crate::tls::setup`] when the transport is constructed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// `tls-cert` / `tls-key`: the owner serves HTTPS with this chain and key.
    pub cert: Option<(PathBuf, PathBuf)>,
    /// `tls-ca`: the CAs this consumer trusts for HTTPS owners.
    pub ca: Option<PathBuf>,
    /// `tls-client-auth`.
    pub client_auth: ClientAuth,
    /// `tls-client-ca`: the CAs whose client certificates the owner accepts.
    pub client_ca: Option<PathBuf>,
    /// `tls-client-cert` / `tls-client-key`: what this consumer presents when
    /// an owner asks (default: `tls-cert` / `tls-key`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// `tls-handshake-timeout`: the owner's deadline for a handshake.
    pub handshake_timeout: Duration,
}

/// When the owner's server binds and starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listen {
    /// On the first `export`.
    Lazy,
    /// At construction: a bind failure fails the constructor (a long-lived
    /// `serve` node that must hold its port, or be told at once it cannot).
    Eager,
}

/// A bearer token, never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Where the advertised address comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Advertise {
    /// Not configured: advertise the address the server actually bound.
    Bound,
    /// `host:port` as configured.
    Full(String),
    /// A host without a port: the bound port is appended.
    HostOnly(String),
}

/// Validated configuration of one transport instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// The plugin instance name, for messages.
    pub instance: String,
    pub bind: SocketAddr,
    /// The `bind` text as configured, for messages.
    pub bind_text: String,
    pub advertise: Advertise,
    pub auth_token: Option<Token>,
    pub max_batch: usize,
    pub max_header_bytes: usize,
    pub max_request_bytes: usize,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub request_timeout: Duration,
    pub header_timeout: Duration,
    /// Consumer: polling for a response before sleeping (0: never poll).
    pub spin: Duration,
    /// Owner: polling for the next request after a response (0: never).
    pub owner_spin: Duration,
    pub max_connections_per_owner: usize,
    pub max_connections: usize,
    pub max_pending: usize,
    pub max_pending_per_peer: usize,
    pub threads: usize,
    /// Owner: connections served each on a thread of its own, at most
    /// (`dedicated-threads`); the others share the runtime.
    pub dedicated_threads: usize,
    pub listen: Listen,
    pub tls: TlsFiles,
    /// GPU shards: bytes per staged piece (`device-piece`).
    pub device_piece: usize,
    /// GPU shards: the owner's pinned piece buffers at most, and a
    /// consumer's ring per fetch (`device-buffers`).
    pub device_buffers: usize,
    /// How device memory is reached (`test-device-is-host` for tests).
    pub staging: crate::gpu::Staging,
    /// Relays: serving fetched shards onward (the `relay-*` keys).
    pub relay: RelayConfig,
}

/// The `relay*` keys (see `crate::relay`): the consumer's side (`relay`,
/// `relay-min-size`, `relay-cache`, `relay-window`, `relay-keep`,
/// `relay-stall-timeout`), the owner's (`relay-fanout`, `relay-piece`),
/// and `relay-sources`, which both sides read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelayConfig {
    /// Consumer: join the owner's relay tree for large shards and serve
    /// what arrives onward (`relay = "on"`).
    pub on: bool,
    /// Consumer: shards smaller than this are fetched from the owner alone.
    pub min_size: u64,
    /// Consumer: bytes of relay copies kept at once.
    pub cache: u64,
    /// Consumer: bytes of its most recent pieces a copy keeps (0: all).
    pub window: u64,
    /// Consumer: how long a complete relay copy is kept.
    pub keep: Duration,
    /// Consumer: a relay that sends nothing for this long is abandoned.
    pub stall_timeout: Duration,
    /// Owner: consumers served by each holder (the owner included).
    pub fanout: u32,
    /// Both sides: sources a relayed fetch takes pieces from at once (its
    /// parent and up to this less one alternates).
    pub sources: u32,
    /// Consumer: the least time without a piece after which a source is
    /// late and an alternate takes its pieces over.
    pub lag: Duration,
    /// Owner: bytes per verified piece.
    pub piece: u64,
    /// Tests only: a relay flips one bit in every piece it serves.
    pub test_corrupt: bool,
}

/// Default `relay-min-size`: below 1 MiB the join's extra round trip costs
/// more than relaying saves.
pub(crate) const DEFAULT_RELAY_MIN_SIZE: u64 = 1 << 20;
/// Default `relay-cache`: 2 GiB of relay copies per consumer.
pub(crate) const DEFAULT_RELAY_CACHE: u64 = 2 << 30;
/// Default `relay-keep`: a minute, long enough for the late joiners of one
/// step's broadcast, short enough not to hold a step's weights into the next.
pub(crate) const DEFAULT_RELAY_KEEP: Duration = Duration::from_secs(60);
/// Default `relay-stall-timeout`: 5 s without a byte from a relay.
pub(crate) const DEFAULT_RELAY_STALL: Duration = Duration::from_secs(5);
/// Default `relay-fanout`: 1, a chain: every holder's upload link carries one
/// copy, so with equal links a broadcast runs at one link's rate.
pub(crate) const DEFAULT_RELAY_FANOUT: u64 = 1;
/// Default `relay-sources`: the parent and one alternate, which takes over
/// the pieces a parent that falls behind is late with.
pub(crate) const DEFAULT_RELAY_SOURCES: u64 = 2;
/// Default `relay-lag`: 250 ms, past the scheduling jitter of a loaded
/// machine, far below `relay-stall-timeout`.
pub(crate) const DEFAULT_RELAY_LAG: Duration = Duration::from_millis(250);
/// Largest `relay-sources`.
const MAX_RELAY_SOURCES: u64 = 1 + crate::relay::wire::MAX_ALTERNATES as u64;
/// Largest `relay-fanout`.
pub(crate) const MAX_RELAY_FANOUT: u64 = 64;
/// Default `relay-piece`: 256 KiB: 10 ms at 200 Mbit/s per hop of the
/// pipeline, 32 KiB of hashes per GiB.
pub(crate) const DEFAULT_RELAY_PIECE: u64 = 256 << 10;
pub(crate) const MIN_RELAY_PIECE: u64 = 16 << 10;
const MAX_RELAY_PIECE: u64 = 64 << 20;

impl Config {
    /// Parses and validates the config table `text` of plugin `instance`.
    /// Unknown keys are errors that name the key. Reads the environment when
    /// `auth-token-env` is set.
    pub(crate) fn parse(instance: &str, text: &str) -> PluginResult<Config> {
        Self::parse_with_env(instance, text, |name| std::env::var(name).ok())
    }

    /// [`parse`](Self::parse) with an injected environment, for tests.
    pub(crate) fn parse_with_env(
        instance: &str,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> PluginResult<Config> {
        let t = Options::parse(instance, text)?;
        let bad = |k: &str, why: String| t.fail(k, why);

        let bind_text = t.string("bind", DEFAULT_BIND)?;
        let bind = parse_bind(&bind_text).map_err(|why| bad("bind", why))?;

        let advertise = match t.opt_string("advertise")? {
            None if bind.ip().is_unspecified() => {
                return Err(bad(
                    "advertise",
                    format!(
                        "required when `bind` is the unspecified address {}: consumers need \
                         an address that reaches this node, e.g. advertise = \"node7.example:{}\"",
                        bind.ip(),
                        if bind.port() == 0 { 7071 } else { bind.port() }
                    ),
                ))
            }
            None => Advertise::Bound,
            Some(a) => parse_advertise(&a).map_err(|why| bad("advertise", why))?,
        };

        let token = t.opt_string("auth-token")?;
        let token_env = t.opt_string("auth-token-env")?;
        let auth_token = match (token, token_env) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "auth-token",
                    "set either `auth-token` or `auth-token-env`, not both".to_owned(),
                ))
            }
            (Some(tok), None) => Some(check_token(tok).map_err(|why| bad("auth-token", why))?),
            (None, Some(var)) => {
                if var.is_empty() {
                    return Err(bad(
                        "auth-token-env",
                        "expected the name of an environment variable".to_owned(),
                    ));
                }
                let Some(tok) = env(&var) else {
                    return Err(bad(
                        "auth-token-env",
                        format!("environment variable `{var}` is not set (or not UTF-8)"),
                    ));
                };
                Some(check_token(tok).map_err(|why| {
                    bad(
                        "auth-token-env",
                        format!("the token in environment variable `{var}` {why}"),
                    )
                })?)
            }
            (None, None) => None,
        };

        let max_batch = t.u64_in("max-batch", 1..=MAX_MAX_BATCH, DEFAULT_MAX_BATCH)?;
        let max_header_bytes = t.byte_size_in(
            "max-header-bytes",
            MIN_MAX_HEADER_BYTES..=MAX_MAX_HEADER_BYTES,
            DEFAULT_MAX_HEADER_BYTES,
        )?;
        let max_request_bytes = t.byte_size("max-request-bytes", DEFAULT_MAX_REQUEST_BYTES)?;
        let min_request = crate::wire::batch_request_len(max_batch as usize) as u64;
        if !(min_request..=MAX_MAX_REQUEST_BYTES).contains(&max_request_bytes) {
            return Err(bad(
                "max-request-bytes",
                format!(
                    "{} is out of range {}..={} (the lower bound is a batch request of \
                     `max-batch` = {max_batch} ids)",
                    format_byte_size(max_request_bytes),
                    format_byte_size(min_request),
                    format_byte_size(MAX_MAX_REQUEST_BYTES)
                ),
            ));
        }

        let duration = |k: &str, default: Duration| {
            t.duration_in(k, Duration::from_millis(1)..=MAX_TIMEOUT, default)
        };
        let connect_timeout = duration("connect-timeout", DEFAULT_CONNECT_TIMEOUT)?;
        let idle_timeout = duration("idle-timeout", DEFAULT_IDLE_TIMEOUT)?;
        let request_timeout = duration("request-timeout", DEFAULT_REQUEST_TIMEOUT)?;
        let header_timeout = duration("header-timeout", DEFAULT_HEADER_TIMEOUT)?;
        let spin = t.duration_in("spin", Duration::ZERO..=MAX_SPIN, DEFAULT_SPIN)?;
        let owner_spin =
            t.duration_in("owner-spin", Duration::ZERO..=MAX_SPIN, DEFAULT_OWNER_SPIN)?;

        let max_connections_per_owner = t.u64_in(
            "max-connections-per-owner",
            1..=MAX_MAX_CONNECTIONS_PER_OWNER,
            DEFAULT_MAX_CONNECTIONS_PER_OWNER,
        )?;
        let max_connections = t.u64_in(
            "max-connections",
            1..=MAX_MAX_CONNECTIONS,
            DEFAULT_MAX_CONNECTIONS,
        )?;
        let max_pending = t.u64_in("max-pending", 1..=MAX_MAX_CONNECTIONS, DEFAULT_MAX_PENDING)?;
        let max_pending_per_peer = t.u64_in(
            "max-pending-per-peer",
            1..=MAX_MAX_CONNECTIONS,
            DEFAULT_MAX_PENDING_PER_PEER,
        )?;
        let threads = t.u64_in("threads", 1..=MAX_THREADS, DEFAULT_THREADS)?;
        let dedicated_threads = t.u64_in(
            "dedicated-threads",
            0..=MAX_THREADS,
            DEFAULT_DEDICATED_THREADS,
        )?;
        let listen = t.choose(
            "listen",
            &[("lazy", Listen::Lazy), ("eager", Listen::Eager)],
            DEFAULT_LISTEN,
        )?;
        let tls = parse_tls(&t, &duration)?;
        let device_piece = t.byte_size_in(
            "device-piece",
            MIN_DEVICE_PIECE..=MAX_DEVICE_PIECE,
            DEFAULT_DEVICE_PIECE,
        )?;
        let device_buffers = t.u64_in("device-buffers", 2..=256, DEFAULT_DEVICE_BUFFERS)?;
        let staging = if t.bool("test-device-is-host", false)? {
            if !cfg!(any(test, feature = "test-device-is-host")) {
                return Err(bad(
                    "test-device-is-host",
                    "tests only: this build of the http plugin does not accept it (a test \
                     build enables the `test-device-is-host` feature)"
                        .to_owned(),
                ));
            }
            crate::gpu::Staging::HostStandIn
        } else {
            crate::gpu::Staging::Cuda
        };
        let relay = parse_relay(&t, &duration)?;
        t.finish()?;

        // Every bound above is far below usize::MAX on the 64-bit targets we build for.
        Ok(Config {
            instance: instance.to_owned(),
            bind,
            bind_text,
            advertise,
            auth_token,
            max_batch: max_batch as usize,
            max_header_bytes: max_header_bytes as usize,
            max_request_bytes: max_request_bytes as usize,
            connect_timeout,
            idle_timeout,
            request_timeout,
            header_timeout,
            spin,
            owner_spin,
            max_connections_per_owner: max_connections_per_owner as usize,
            max_connections: max_connections as usize,
            max_pending: max_pending as usize,
            max_pending_per_peer: max_pending_per_peer as usize,
            threads: threads as usize,
            dedicated_threads: dedicated_threads as usize,
            listen,
            tls,
            device_piece: device_piece as usize,
            device_buffers: device_buffers as usize,
            staging,
            relay,
        })
    }

    /// The address to put into descriptors, given the address actually bound.
    pub(crate) fn advertised(&self, bound: SocketAddr) -> String {
        match &self.advertise {
            Advertise::Bound => bound.to_string(),
            Advertise::Full(a) => a.clone(),
            Advertise::HostOnly(h) => format!("{h}:{}", bound.port()),
        }
    }
}

/// `bind`: an IP socket address, or `host:port` resolved once (first address).
fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    if descriptor::parse_host_port(text).is_err() {
        return Err(format!(
            "expected an address such as \"127.0.0.1:0\" or \"0.0.0.0:7071\", found \"{text}\""
        ));
    }
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("\"{text}\" resolves to no address")),
        Err(e) => Err(format!("cannot resolve \"{text}\": {e}")),
    }
}

/// `advertise`: `host:port`, or a host alone (the bound port is appended).
fn parse_advertise(text: &str) -> Result<Advertise, String> {
    if text.len() > MAX_ADDR_LEN - 6 {
        return Err(format!(
            "at most {} bytes (it travels in every descriptor), found {}",
            MAX_ADDR_LEN - 6,
            text.len()
        ));
    }
    match descriptor::parse_host_port(text) {
        Ok((_, 0)) => Err(format!(
            "port 0 in \"{text}\" cannot be reached; give the real port, or the host alone \
             to advertise the bound port"
        )),
        Ok(_) => Ok(Advertise::Full(text.to_owned())),
        Err(_) if descriptor::check_host(text).is_ok() => Ok(Advertise::HostOnly(text.to_owned())),
        Err(why) => Err(format!(
            "expected \"host:port\" or a host, such as \"10.0.0.7:7071\" or \
             \"node7.example\": {why}"
        )),
    }
}

/// The `relay*` keys.
fn parse_relay(
    t: &Options,
    duration: &dyn Fn(&str, Duration) -> PluginResult<Duration>,
) -> PluginResult<RelayConfig> {
    let on = t.choose("relay", &[("off", false), ("on", true)], "off")?;
    let min_size = t.byte_size("relay-min-size", DEFAULT_RELAY_MIN_SIZE)?;
    let cache = t.byte_size("relay-cache", DEFAULT_RELAY_CACHE)?;
    let window = t.byte_size("relay-window", 0)?;
    let keep = duration("relay-keep", DEFAULT_RELAY_KEEP)?;
    let stall_timeout = duration("relay-stall-timeout", DEFAULT_RELAY_STALL)?;
    let fanout = t.u64_in("relay-fanout", 1..=MAX_RELAY_FANOUT, DEFAULT_RELAY_FANOUT)?;
    let sources = t.u64_in(
        "relay-sources",
        1..=MAX_RELAY_SOURCES,
        DEFAULT_RELAY_SOURCES,
    )?;
    let lag = duration("relay-lag", DEFAULT_RELAY_LAG)?;
    let piece = t.byte_size_in(
        "relay-piece",
        MIN_RELAY_PIECE..=MAX_RELAY_PIECE,
        DEFAULT_RELAY_PIECE,
    )?;
    let test_corrupt = t.bool("test-corrupt-relay", false)?;
    if test_corrupt && !cfg!(any(test, feature = "test-device-is-host")) {
        return Err(t.fail(
            "test-corrupt-relay",
            "tests only: this build of the http plugin does not accept it (a test build \
             enables the `test-device-is-host` feature)"
                .to_owned(),
        ));
    }
    Ok(RelayConfig {
        on,
        min_size,
        cache,
        window,
        keep,
        stall_timeout,
        fanout: fanout as u32,
        sources: sources as u32,
        lag,
        piece,
        test_corrupt,
    })
}

/// The `tls-*` keys: which go together, and which need which. The files
/// themselves are read by [`crate::tls::setup`].
fn parse_tls(
    t: &Options,
    duration: &dyn Fn(&str, Duration) -> PluginResult<Duration>,
) -> PluginResult<TlsFiles> {
    let path = |k: &str| -> PluginResult<Option<PathBuf>> {
        match t.opt_string(k)? {
            Some(p) if p.is_empty() => {
                Err(t.fail(k, "expected the path of a PEM file, found \"\""))
            }
            p => Ok(p.map(PathBuf::from)),
        }
    };
    let pair = |cert: &str, key: &str| -> PluginResult<Option<(PathBuf, PathBuf)>> {
        match (path(cert)?, path(key)?) {
            (Some(c), Some(k)) => Ok(Some((c, k))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(t.fail(
                key,
                format!("required with `{cert}`: the private key of that certificate (PEM)"),
            )),
            (None, Some(_)) => Err(t.fail(
                cert,
                format!("required with `{key}`: the certificate chain of that key (PEM)"),
            )),
        }
    };
    let cert = pair("tls-cert", "tls-key")?;
    let ca = path("tls-ca")?;
    let client_auth = t.choose(
        "tls-client-auth",
        &[
            ("none", ClientAuth::None),
            ("required", ClientAuth::Required),
        ],
        "none",
    )?;
    let client_ca = path("tls-client-ca")?;
    let client_cert = pair("tls-client-cert", "tls-client-key")?;
    let handshake_timeout = duration("tls-handshake-timeout", DEFAULT_TLS_HANDSHAKE_TIMEOUT)?;
    match (client_auth, &client_ca) {
        (ClientAuth::Required, None) => {
            return Err(t.fail(
                "tls-client-ca",
                "required with `tls-client-auth = \"required\"`: the CA certificates (PEM) \
                 that issue the consumers' certificates",
            ))
        }
        (ClientAuth::None, Some(_)) => {
            return Err(t.fail(
                "tls-client-ca",
                "only used with `tls-client-auth = \"required\"` (set it, or remove \
                 `tls-client-ca`)",
            ))
        }
        _ => {}
    }
    if client_auth == ClientAuth::Required && cert.is_none() {
        return Err(t.fail(
            "tls-client-auth",
            "mutual TLS needs the owner to serve TLS: set `tls-cert` and `tls-key`",
        ));
    }
    Ok(TlsFiles {
        cert,
        ca,
        client_auth,
        client_ca,
        client_cert,
        handshake_timeout,
    })
}

fn check_token(tok: String) -> Result<Token, String> {
    if tok.is_empty() {
        return Err("is empty".to_owned());
    }
    if tok.len() > MAX_TOKEN_LEN {
        return Err(format!("is longer than {MAX_TOKEN_LEN} bytes"));
    }
    if !tok.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "must be printable ASCII without spaces (it travels in an HTTP header)".to_owned(),
        );
    }
    Ok(Token(tok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::ErrorKind;

    fn parse(text: &str) -> PluginResult<Config> {
        Config::parse_with_env("http", text, |name| {
            (name == "SP_TOKEN").then(|| "s3cret-token".to_owned())
        })
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.bind, "127.0.0.1:0".parse().unwrap());
        assert_eq!(c.advertise, Advertise::Bound);
        assert_eq!(c.auth_token, None);
        assert_eq!(c.max_batch, 1024);
        assert_eq!(c.max_header_bytes, 16 << 10);
        assert_eq!(c.max_request_bytes, 1 << 20);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.request_timeout, Duration::from_secs(120));
        assert_eq!(c.header_timeout, Duration::from_secs(10));
        assert_eq!(c.spin, Duration::from_micros(50));
        assert_eq!(c.owner_spin, DEFAULT_OWNER_SPIN);
        assert_eq!(c.max_connections_per_owner, 4);
        assert_eq!(c.max_connections, 512);
        assert_eq!(c.threads, 2);
        assert_eq!(c.dedicated_threads, 2);
        assert_eq!(c.listen, Listen::Lazy);
        assert_eq!(c.tls.cert, None);
        assert_eq!(c.tls.ca, None);
        assert_eq!(c.tls.client_auth, ClientAuth::None);
        assert_eq!(c.tls.handshake_timeout, Duration::from_secs(10));
        assert_eq!(
            c.advertised("127.0.0.1:4567".parse().unwrap()),
            "127.0.0.1:4567"
        );
    }

    #[test]
    fn every_key() {
        let c = parse(
            r#"bind = "0.0.0.0:7071"
               advertise = "node7.example:80"
               auth-token-env = "SP_TOKEN"
               max-batch = 10
               max-header-bytes = "8KiB"
               max-request-bytes = 4096
               connect-timeout = "250ms"
               idle-timeout = "2m"
               request-timeout = "1h"
               header-timeout = "3s"
               spin = "0us"
               max-connections-per-owner = 2
               max-connections = 8
               threads = 3
               listen = "eager""#,
        )
        .unwrap();
        assert_eq!(c.bind, "0.0.0.0:7071".parse().unwrap());
        assert_eq!(c.advertise, Advertise::Full("node7.example:80".into()));
        assert_eq!(c.auth_token.as_ref().unwrap().as_str(), "s3cret-token");
        assert_eq!(
            (c.max_batch, c.max_header_bytes, c.max_request_bytes),
            (10, 8192, 4096)
        );
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.idle_timeout, Duration::from_secs(120));
        assert_eq!(c.request_timeout, Duration::from_secs(3600));
        assert_eq!(c.header_timeout, Duration::from_secs(3));
        assert_eq!(c.spin, Duration::ZERO);
        assert_eq!(
            (c.max_connections_per_owner, c.max_connections, c.threads),
            (2, 8, 3)
        );
        assert_eq!(c.listen, Listen::Eager);
        // The token never shows in debug output.
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn advertise_host_only_takes_the_bound_port() {
        let c = parse("bind = \"[::]:0\"\nadvertise = \"node7.example\"").unwrap();
        assert_eq!(
            c.advertised("[::]:4242".parse().unwrap()),
            "node7.example:4242"
        );
        let c = parse("advertise = \"[fe80::1]:99\"").unwrap();
        assert_eq!(c.advertised("127.0.0.1:1".parse().unwrap()), "[fe80::1]:99");
        let c = parse("bind = \"[::1]:0\"").unwrap();
        assert_eq!(c.advertised("[::1]:5".parse().unwrap()), "[::1]:5");
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("bnd = \"x\"", "unknown key `plugin.http.config.bnd`"),
            ("bind = \"nowhere\"", "`plugin.http.config.bind`: expected an address"),
            (
                "bind = \"0.0.0.0:0\"",
                "`plugin.http.config.advertise`: required when `bind` is the unspecified address",
            ),
            (
                "advertise = \"host:0\"",
                "`plugin.http.config.advertise`: port 0",
            ),
            (
                "advertise = \"a b:1\"",
                "`plugin.http.config.advertise`: expected \"host:port\" or a host",
            ),
            (
                "auth-token = \"x\"\nauth-token-env = \"SP_TOKEN\"",
                "`plugin.http.config.auth-token`: set either",
            ),
            (
                "auth-token = \"\"",
                "`plugin.http.config.auth-token`: is empty",
            ),
            (
                "auth-token = \"two words\"",
                "`plugin.http.config.auth-token`: must be printable ASCII",
            ),
            (
                "auth-token-env = \"NOPE_NOT_SET\"",
                "`plugin.http.config.auth-token-env`: environment variable `NOPE_NOT_SET` is not set",
            ),
            (
                "max-batch = 0",
                "`plugin.http.config.max-batch`: 0 is out of range",
            ),
            (
                "max-header-bytes = 100",
                "`plugin.http.config.max-header-bytes`: 100 B is out of range 1 KiB..=1 MiB",
            ),
            (
                "max-request-bytes = 1000",
                "`plugin.http.config.max-request-bytes`: 1000 B is out of range 16.0 KiB..=64 MiB",
            ),
            (
                "idle-timeout = 5",
                "`plugin.http.config.idle-timeout`: expected a string, found integer `5`",
            ),
            (
                "request-timeout = \"5\"",
                "`plugin.http.config.request-timeout`: expected a duration such as",
            ),
            (
                "connect-timeout = \"0s\"",
                "`plugin.http.config.connect-timeout`: 0s is out of range",
            ),
            (
                "header-timeout = \"2d\"",
                "`plugin.http.config.header-timeout`: expected a duration",
            ),
            (
                "threads = 0",
                "`plugin.http.config.threads`: 0 is out of range",
            ),
            (
                "dedicated-threads = 257",
                "`plugin.http.config.dedicated-threads`: 257 is out of range",
            ),
            (
                "spin = \"2ms\"",
                "`plugin.http.config.spin`: 2ms is out of range 0s..=1ms",
            ),
            (
                "owner-spin = \"5ms\"",
                "`plugin.http.config.owner-spin`: 5ms is out of range 0s..=1ms",
            ),
            (
                "listen = \"now\"",
                "`plugin.http.config.listen`: expected \"lazy\" or \"eager\", found \"now\"",
            ),
            (
                "tls-cert = \"/c.pem\"",
                "`plugin.http.config.tls-key`: required with `tls-cert`",
            ),
            (
                "tls-key = \"/k.pem\"",
                "`plugin.http.config.tls-cert`: required with `tls-key`",
            ),
            (
                "tls-client-key = \"/k.pem\"",
                "`plugin.http.config.tls-client-cert`: required with `tls-client-key`",
            ),
            (
                "tls-ca = \"\"",
                "`plugin.http.config.tls-ca`: expected the path of a PEM file",
            ),
            (
                "tls-client-auth = \"yes\"",
                "`plugin.http.config.tls-client-auth`: expected \"none\" or \"required\"",
            ),
            (
                "tls-cert = \"/c\"\ntls-key = \"/k\"\ntls-client-auth = \"required\"",
                "`plugin.http.config.tls-client-ca`: required with `tls-client-auth = \"required\"`",
            ),
            (
                "tls-client-ca = \"/ca\"",
                "`plugin.http.config.tls-client-ca`: only used with",
            ),
            (
                "tls-client-auth = \"required\"\ntls-client-ca = \"/ca\"",
                "`plugin.http.config.tls-client-auth`: mutual TLS needs the owner to serve TLS",
            ),
            (
                "tls-handshake-timeout = \"0ms\"",
                "`plugin.http.config.tls-handshake-timeout`: 0s is out of range",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.kind, ErrorKind::CONFIG, "{text}");
            assert!(e.message.starts_with(want), "{text}: {}", e.message);
        }
        // The token is not echoed in errors.
        let e = parse("auth-token = \"bad token\"").unwrap_err();
        assert!(!e.message.contains("bad token"), "{}", e.message);
    }
}
