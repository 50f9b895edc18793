//! Deployment config: the TOML schema, its semantic check, and the
//! validated [`Config`] the rest of the host uses.
//!
//! Two layers (raw structs mirroring the TOML, then a validated config):
//! - `schema.rs`: serde structs that mirror the TOML, spans kept;
//! - `check.rs`: [`parse_str`] turns them into the enums and newtypes of this
//!   module (and of [`crate::vocab`]), so no bare transport name or mode
//!   string reaches the router; `rules.rs` checks routes and experiments.
//!
//! Errors ([`ConfigError`], rendered in `span.rs`) point at `file:line:col`
//! with a caret, say what was expected and show an example; unknown keys
//! become warnings carrying their dotted path. [`parse_str`] never touches
//! the disk; [`load`] reads a file and calls it. [`routing_table`] prints the
//! effective rules.
//!
//! Embedding programs (the Python binding) come in through two more doors,
//! each kept here so that no binding repeats it: [`Source`] tells a config
//! file from config text (`source.rs`), and [`EngineOverrides`] applies the
//! address and name a process takes from its engine (`engine.rs`), to a
//! checked config or, as the node's reload hook, to every reloaded one.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use shardport_kit::parse_byte_size;

use crate::vocab::MAX_ADDR;

mod check;
mod engine;
mod rules;
mod schema;
mod source;
mod span;
mod table;
#[cfg(test)]
mod tests;

pub use check::parse_str;
pub use engine::{EngineOverrides, Exposed};
pub use source::Source;
pub use span::{ConfigError, KeyPlaces};
pub use table::routing_table;
/// The embedded default config `shardport demo` runs on.
pub const DEFAULT_CONFIG: &str = include_str!("../../../configs/default.toml");

/// Name shown for the embedded default config in messages.
pub const DEFAULT_CONFIG_ORIGIN: &str = "<embedded default config>";

/// The embedded library config: what a node embedded in a program starts
/// with when its caller gives no config (Python's `shardport.Node()`). As
/// [`DEFAULT_CONFIG`] without the demo's fixed name and port: the node names
/// itself uniquely and advertises port 0 (it listens on no fixed port).
pub const LIBRARY_CONFIG: &str = include_str!("../../../configs/library.toml");

/// Name shown for the embedded library config in messages.
pub const LIBRARY_CONFIG_ORIGIN: &str = "<embedded library config>";

/// `node.name` of a checked config that names no node; the node replaces it
/// with a unique name when it starts ([`NodeConfig::name_given`]).
pub const UNNAMED_NODE: &str = "shardport";

/// Environment variable that overrides where the embedded config's relative
/// plugin paths are resolved (default: the `shardport` executable's directory).
pub const PLUGIN_DIR_ENV: &str = "SHARDPORT_PLUGIN_DIR";

/// Default bound on one shard's size: larger than any single tensor of
/// today's models, small enough that a hostile handle cannot make a consumer
/// try to allocate exabytes.
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 64 << 30;

/// Default sweep period of a serving node: dead consumers' leases and dead
/// owners' segments come back within half a minute, for a directory listing
/// and a few `/proc` reads each time.
pub const DEFAULT_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Default bound on shards per `fetch_many` call: large enough for a layer's
/// worth of shards, small enough that one request cannot pin unbounded memory.
pub const DEFAULT_MAX_BATCH: usize = 4096;

/// Where a config came from; decides how relative plugin paths resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A file: relative plugin paths resolve against its directory.
    File(PathBuf),
    /// Text with a display name and the directory relative paths resolve against.
    Text {
        /// Shown in messages (`<embedded default config>`).
        name: String,
        /// Base for relative plugin paths.
        base_dir: PathBuf,
        /// Also look in `base_dir/deps` (where `cargo test` puts plugin `.so` files).
        search_deps: bool,
    },
}

impl Origin {
    /// The embedded default config's origin: paths resolve next to the
    /// running executable, or under `$SHARDPORT_PLUGIN_DIR`.
    pub fn embedded() -> Origin {
        let base_dir = std::env::var_os(PLUGIN_DIR_ENV)
            .map(PathBuf::from)
            .or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
            })
            .unwrap_or_else(|| PathBuf::from("."));
        Origin::Text {
            name: DEFAULT_CONFIG_ORIGIN.to_owned(),
            base_dir,
            search_deps: true,
        }
    }

    fn display(&self) -> String {
        match self {
            Origin::File(p) => p.display().to_string(),
            Origin::Text { name, .. } => name.clone(),
        }
    }

    /// `path` as written in this config: absolute as is, relative against
    /// the config file's directory (or the text's base directory).
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            return path.to_path_buf();
        }
        match self {
            Origin::File(p) => p.parent().unwrap_or(Path::new(".")).join(path),
            Origin::Text { base_dir, .. } => base_dir.join(path),
        }
    }

    fn candidates(&self, rel: &Path) -> Vec<PathBuf> {
        match self {
            Origin::File(p) => {
                let dir = p.parent().unwrap_or(Path::new("."));
                vec![dir.join(rel)]
            }
            Origin::Text {
                base_dir,
                search_deps,
                ..
            } => {
                let mut v = vec![base_dir.join(rel)];
                if *search_deps {
                    v.push(base_dir.join("deps").join(rel));
                }
                v
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Validated config

use crate::vocab::{
    ChecksumPolicy, DeviceSel, FetchMode, OnDowngrade, SameNodeMatch, Storage, TransportName,
};

/// A `*`/`?` glob over an owner address (`10.0.*:7070`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrPattern(String);

impl AddrPattern {
    /// A pattern (`*` any run, `?` any one character).
    pub fn new(pattern: &str) -> Self {
        AddrPattern(pattern.to_owned())
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `addr` matches the whole pattern.
    pub fn matches(&self, addr: &str) -> bool {
        fn go(p: &[u8], s: &[u8]) -> bool {
            // Iterative glob with single-star backtracking: linear in practice.
            let (mut pi, mut si) = (0, 0);
            let (mut star, mut mark) = (None, 0);
            while si < s.len() {
                if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
                    pi += 1;
                    si += 1;
                } else if pi < p.len() && p[pi] == b'*' {
                    star = Some(pi);
                    mark = si;
                    pi += 1;
                } else if let Some(st) = star {
                    pi = st + 1;
                    mark += 1;
                    si = mark;
                } else {
                    return false;
                }
            }
            p[pi..].iter().all(|&c| c == b'*')
        }
        go(self.0.as_bytes(), addr.as_bytes())
    }
}

/// Conditions of a route; every present condition must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteWhen {
    /// Owner on this node (per `locality.same-node`).
    pub local: Option<bool>,
    /// Device kind of the shard.
    pub device: Option<DeviceSel>,
    /// Smallest byte length (inclusive).
    pub min_size: Option<u64>,
    /// Largest byte length (inclusive).
    pub max_size: Option<u64>,
    /// Tags the shard must carry with these values.
    pub tags: std::collections::BTreeMap<String, String>,
    /// Owner address pattern.
    pub owner: Option<AddrPattern>,
}

/// A routing rule: conditions -> ordered transports to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Name for reasons and metrics (`route[N]` when unnamed).
    pub name: String,
    /// Conditions.
    pub when: RouteWhen,
    /// Transports to try, in order; others are not tried for matching shards.
    pub transports: Vec<TransportName>,
}

/// How an experiment assigns fetches to arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExperimentUnit {
    /// Per shard: every fetch of a shard goes to the same arm (a hash of
    /// the experiment's salt and the shard id picks it).
    Shard,
    /// Per fetch: each fetch draws an arm.
    Fetch,
}

impl fmt::Display for ExperimentUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExperimentUnit::Shard => "shard",
            ExperimentUnit::Fetch => "fetch",
        })
    }
}

/// One arm of an experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    /// Name in metrics and reports (the transport name when not given).
    pub name: String,
    /// The transport this arm's fetches try first.
    pub transport: TransportName,
    /// Relative weight (0 drains the arm and keeps it configured).
    pub weight: u32,
}

/// When an arm is switched off automatically.
#[derive(Debug, Clone, PartialEq)]
pub struct Guardrail {
    /// Largest tolerated error rate (errors / attempts) over the window.
    pub max_error_rate: Option<f64>,
    /// Largest tolerated ratio of the arm's p99 latency to the control arm's.
    pub max_p99_ratio: Option<f64>,
    /// The sliding window the rates are computed over.
    pub window: std::time::Duration,
    /// Fewest attempts in the window (per arm, and for the control arm when
    /// comparing latency) before the guardrail judges anything.
    pub min_samples: u64,
    /// How long a tripped arm stays off before it is probed (half-open);
    /// `None` (`cooldown = "off"`): off until `shardport ab reset`.
    pub cooldown: Option<std::time::Duration>,
    /// The longest cool-down: each failed probe doubles it up to this.
    pub max_cooldown: std::time::Duration,
    /// Share of a probing arm's draws that it serves (the rest go to the
    /// control arm) while its probes are judged.
    pub probe_share: f64,
}

/// Default cool-down before a tripped arm is probed: 5 windows.
pub const DEFAULT_COOLDOWN_WINDOWS: u32 = 5;
/// Default longest cool-down.
pub const DEFAULT_MAX_COOLDOWN: std::time::Duration = std::time::Duration::from_secs(3600);
/// Default probe share.
pub const DEFAULT_PROBE_SHARE: f64 = 0.1;

/// A canary ramp: the share of traffic of one arm, raised step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct Ramp {
    /// Index of the ramped arm (never the control).
    pub arm: usize,
    /// Shares of all matching traffic, as fractions in `(0, 1]`, strictly
    /// increasing; the other arms split the rest by their weights.
    pub steps: Vec<f64>,
    /// Time at each step before the next (while the guardrail holds).
    pub interval: std::time::Duration,
}

/// Default guardrail window.
pub const DEFAULT_GUARDRAIL_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
/// Default guardrail minimum sample count.
pub const DEFAULT_GUARDRAIL_MIN_SAMPLES: u64 = 100;
/// Most arms in one experiment.
pub const MAX_ARMS: usize = 16;

/// An A/B (or canary) experiment: matching fetches are split between arms,
/// each arm's transport tried first; the first arm is the control.
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    /// Name in metrics and reports.
    pub name: String,
    /// Which fetches take part (as in routes).
    pub when: RouteWhen,
    /// Assignment unit.
    pub unit: ExperimentUnit,
    /// Hash salt (the name when not given); changing it reshuffles shards.
    pub salt: String,
    /// Arms; `arms[0]` is the control.
    pub arms: Vec<Arm>,
    /// Automatic switch-off of misbehaving arms.
    pub guardrail: Option<Guardrail>,
    /// A schedule raising one arm's share step by step.
    pub ramp: Option<Ramp>,
}

impl Experiment {
    /// Sum of the arm weights.
    pub fn total_weight(&self) -> u64 {
        self.arms.iter().map(|a| u64::from(a.weight)).sum()
    }

    /// The weight arm `i` draws with: its configured weight, or under a
    /// ramp step `(arm, share)` the ramped arm's share of the whole
    /// (`share / (1 - share)` times the others' total; a 100% step gives
    /// the others nothing). A ramped arm whose weight is 0 is drained: the
    /// ramp is ignored and it draws nothing.
    pub fn draw_weight(&self, i: usize, ramp: Option<(usize, f64)>) -> f64 {
        let w = f64::from(self.arms[i].weight);
        let Some((r, share)) = ramp.filter(|&(r, _)| self.arms[r].weight > 0) else {
            return w;
        };
        if share >= 1.0 {
            return if i == r { 1.0 } else { 0.0 };
        }
        if i != r {
            return w;
        }
        let others: f64 = self
            .arms
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != r)
            .map(|(_, a)| f64::from(a.weight))
            .sum();
        others * share / (1.0 - share)
    }

    /// Each arm's share of the draws under a ramp step (or none): its
    /// [`draw_weight`](Self::draw_weight) over their total.
    pub fn shares_at(&self, ramp: Option<(usize, f64)>) -> Vec<f64> {
        let w: Vec<f64> = (0..self.arms.len())
            .map(|i| self.draw_weight(i, ramp))
            .collect();
        let total: f64 = w.iter().sum();
        w.iter()
            .map(|x| if total > 0.0 { x / total } else { 0.0 })
            .collect()
    }
}

/// One plugin to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// Instance name: what handles, routes, arms and metrics call it.
    pub name: TransportName,
    /// The transport the library must declare (`transport = ...`; the
    /// instance name when not given): two builds of one transport load as
    /// two instances, such as `posix-shm` and `posix-shm-next`.
    pub transport: TransportName,
    /// Candidate paths, tried in order (the first that exists is loaded).
    pub paths: Vec<PathBuf>,
    /// The path as written in the config.
    pub path_as_written: String,
    /// Expected sha256 of the file.
    pub sha256: Option<[u8; 32]>,
    /// When true a load failure stops the node; otherwise it is reported and skipped.
    pub required: bool,
    /// The plugin's own table, as TOML text.
    pub config_text: String,
    /// Fault injection in front of the plugin (`[plugin.faults]`; testing
    /// and drills only).
    pub faults: Option<Faults>,
    /// Where the keys of `config_text` were written (for errors).
    pub config_places: KeyPlaces,
}

/// Faults injected in front of a plugin, each at a rate in parts per
/// million of the calls it applies to (see `crate::faults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// Seed of the injector's random sequence (the same seed and call order
    /// give the same faults).
    pub seed: u64,
    /// How long an injected delay lasts.
    pub delay: std::time::Duration,
    /// Rate of delays before an import or export.
    pub delay_ppm: u32,
    /// Rate of imports that fail mid-body (some bytes written, then an
    /// error, as a connection reset would).
    pub reset_ppm: u32,
    /// Rate of copies that report success with the tail never written (a
    /// short read the transport did not notice).
    pub short_read_ppm: u32,
    /// Rate of copies that report success with one byte flipped.
    pub corrupt_ppm: u32,
    /// Rate of allocations (segment creations) that fail with "no space".
    pub enospc_ppm: u32,
    /// Rate of exports that return a garbage descriptor.
    pub garbage_descriptor_ppm: u32,
}

/// Node identity settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Name for logs and metrics. When the config does not set one
    /// ([`name_given`](Self::name_given) false), the node names itself
    /// uniquely at start (`node-<pid>-<n>`); a reload with a config that
    /// sets none keeps the running name.
    pub name: String,
    /// Whether the config wrote `node.name`.
    pub name_given: bool,
    /// Address written into handles (`host:port`).
    pub advertise: String,
    /// Largest shard this node puts or fetches.
    pub max_shard_size: u64,
    /// How often `shardport serve` sweeps (dead processes' leftovers, cache expiry).
    pub sweep_interval: std::time::Duration,
}

/// Fetch settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchConfig {
    /// Default mode.
    pub mode: FetchMode,
    /// Downgrade policy.
    pub on_downgrade: OnDowngrade,
    /// Verify the handle's checksum after a fetch.
    pub verify_checksum: bool,
    /// Most shards in one `fetch_many`.
    pub max_batch: usize,
    /// How long an attempt whose transport says a limit is exhausted
    /// (`RESOURCE_EXHAUSTED`: the owner's lease table, a full pool) is
    /// retried before the next candidate is tried; zero: at once.
    pub exhausted_wait: std::time::Duration,
    /// Bytes of copy destinations the node keeps for later copies of the
    /// same length (see [`buffers`](crate::buffers)); zero: none kept.
    pub copy_buffers: u64,
}

/// Put settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutConfig {
    /// Storage policy.
    pub storage: Storage,
    /// Checksum policy.
    pub checksum: ChecksumPolicy,
    /// Transports every put exports through; `None` = every loaded transport.
    pub export_to: Option<Vec<TransportName>>,
}

/// Where a secret token comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// No token: endpoints are open (bind to loopback).
    None,
    /// Written in the config.
    Literal(String),
    /// Read from this environment variable when the endpoint starts.
    Env(String),
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::None => f.write_str("None"),
            TokenSource::Literal(_) => f.write_str("Literal(<redacted>)"),
            TokenSource::Env(v) => write!(f, "Env({v})"),
        }
    }
}

impl TokenSource {
    /// The token, reading the environment for [`TokenSource::Env`].
    pub fn resolve(&self) -> Result<Option<String>, String> {
        match self {
            TokenSource::None => Ok(None),
            TokenSource::Literal(t) => Ok(Some(t.clone())),
            TokenSource::Env(var) => match std::env::var(var) {
                Ok(t) if !t.is_empty() => Ok(Some(t)),
                _ => Err(format!(
                    "control.auth-token-env names `{var}`, which is unset or empty"
                )),
            },
        }
    }
}

/// Default control endpoint: loopback only.
pub const DEFAULT_CONTROL_BIND: &str = "127.0.0.1:7071";

/// The node's control endpoint (`shardport serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Address to bind.
    pub bind: String,
    /// Bearer token for every endpoint.
    pub token: TokenSource,
    /// Serve HTTPS with this certificate and key (`tls-cert`, `tls-key`);
    /// `None`: plain HTTP. The files are read when the endpoint starts.
    pub tls: Option<ControlTls>,
}

/// `[control] tls-cert` and `tls-key`: PEM files, relative paths resolved
/// against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlTls {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A validated config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where it came from.
    pub origin: Origin,
    /// Node settings.
    pub node: NodeConfig,
    /// Fetch settings.
    pub fetch: FetchConfig,
    /// Put settings.
    pub put: PutConfig,
    /// Consumer cache policy.
    pub cache: crate::vocab::CachePolicy,
    /// Same-node evidence.
    pub same_node: SameNodeMatch,
    /// Plugins to load, in config order.
    pub plugins: Vec<PluginSpec>,
    /// Routing rules, first match wins (none: the default order).
    pub routes: Vec<Route>,
    /// Experiments, first match wins; they take precedence over routes.
    pub experiments: Vec<Experiment>,
    /// Control endpoint.
    pub control: ControlConfig,
    /// Unknown keys and other non-fatal findings, with their dotted paths.
    pub warnings: Vec<String>,
}

/// Errors of [`load`].
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The text is invalid.
    #[error("{0}")]
    Invalid(#[from] ConfigError),
}

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_str(&text, Origin::File(path.to_path_buf()))?)
}

/// The embedded default config, validated.
pub fn default_config() -> Config {
    parse_str(DEFAULT_CONFIG, Origin::embedded()).expect("the embedded default config is valid")
}

/// Parses a duration: an integer with `ms`, `s`, `m` or `h` (`250ms`, `30s`).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let ms = match unit.trim() {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(ms))
}

/// Parses a duration for CLI flags (`100ms`, `90s`, `10m`).
pub fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s)
        .ok_or_else(|| format!("expected a duration such as 100ms, 90s or 10m, found `{s}`"))
}

/// Parses a byte size for CLI flags (`256MiB`).
pub fn byte_size_arg(s: &str) -> Result<u64, String> {
    parse_byte_size(s).ok_or_else(|| format!("expected a byte size such as 256MiB, found `{s}`"))
}
