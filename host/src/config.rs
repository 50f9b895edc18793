//! Deployment config: raw serde structs that mirror the TOML, and the
//! validated [`Config`] the rest of the host uses.
//!
//! Two layers (STYLE: "config in two layers"): `Raw*` structs deserialize the
//! text with spans kept; [`parse_str`] turns them into enums and newtypes so no
//! bare transport name or mode string reaches the router. Errors point at
//! `file:line:col` with a caret, say what was expected and show an example;
//! unknown keys become warnings carrying their dotted path. [`parse_str`] never
//! touches the disk; [`load`] reads a file and calls it.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use shardport_abi::parse_byte_size;
use toml::Spanned;

/// The embedded default config `shardport demo` runs on.
pub const DEFAULT_CONFIG: &str = include_str!("../../configs/default.toml");

/// Name shown for the embedded default config in messages.
pub const DEFAULT_CONFIG_ORIGIN: &str = "<embedded default config>";

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
// Raw layer

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawConfig {
    node: Option<RawNode>,
    fetch: Option<RawFetch>,
    put: Option<RawPut>,
    cache: Option<RawCache>,
    locality: Option<RawLocality>,
    control: Option<RawControl>,
    #[serde(default)]
    plugin: Vec<RawPlugin>,
    #[serde(default)]
    route: Vec<RawRoute>,
    #[serde(default)]
    experiment: Vec<RawExperiment>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawExperiment {
    name: Spanned<String>,
    unit: Option<Spanned<String>>,
    salt: Option<String>,
    local: Option<bool>,
    device: Option<Spanned<String>>,
    min_size: Option<Spanned<toml::Value>>,
    max_size: Option<Spanned<toml::Value>>,
    #[serde(default)]
    tags: std::collections::BTreeMap<String, String>,
    owner: Option<Spanned<String>>,
    arms: Spanned<Vec<RawArm>>,
    guardrail: Option<Spanned<RawGuardrail>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawArm {
    name: Option<Spanned<String>>,
    transport: Spanned<String>,
    weight: Spanned<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawGuardrail {
    max_error_rate: Option<Spanned<f64>>,
    max_p99_ratio: Option<Spanned<f64>>,
    window: Option<Spanned<String>>,
    min_samples: Option<Spanned<i64>>,
}

/// The conditions of a `[[route]]` or `[[experiment]]`, as written.
struct RawWhen<'a> {
    local: Option<bool>,
    device: &'a Option<Spanned<String>>,
    min_size: &'a Option<Spanned<toml::Value>>,
    max_size: &'a Option<Spanned<toml::Value>>,
    tags: &'a std::collections::BTreeMap<String, String>,
    owner: &'a Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawRoute {
    name: Option<Spanned<String>>,
    local: Option<bool>,
    device: Option<Spanned<String>>,
    min_size: Option<Spanned<toml::Value>>,
    max_size: Option<Spanned<toml::Value>>,
    #[serde(default)]
    tags: std::collections::BTreeMap<String, String>,
    owner: Option<Spanned<String>>,
    transports: Spanned<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawNode {
    name: Option<Spanned<String>>,
    advertise: Option<Spanned<String>>,
    max_shard_size: Option<Spanned<toml::Value>>,
    sweep_interval: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawFetch {
    mode: Option<Spanned<String>>,
    on_downgrade: Option<Spanned<String>>,
    verify_checksum: Option<bool>,
    max_batch: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawPut {
    storage: Option<Spanned<String>>,
    pool_transport: Option<Spanned<String>>,
    checksum: Option<Spanned<String>>,
    export_to: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawCache {
    policy: Option<Spanned<toml::Value>>,
    max_bytes: Option<Spanned<toml::Value>>,
    ttl: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawControl {
    bind: Option<Spanned<String>>,
    auth_token: Option<Spanned<String>>,
    auth_token_env: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct RawLocality {
    same_node: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawPlugin {
    name: Spanned<String>,
    path: Spanned<String>,
    sha256: Option<Spanned<String>>,
    required: Option<bool>,
    config: Option<toml::Table>,
}

// ---------------------------------------------------------------------------
// Validated layer

pub use crate::vocab::{
    ChecksumPolicy, DeviceSel, FetchMode, OnDowngrade, SameNodeMatch, Storage, TransportName,
    MAX_TRANSPORT_NAME,
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
    /// Relative weight (> 0).
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
}

impl Experiment {
    /// Sum of the arm weights.
    pub fn total_weight(&self) -> u64 {
        self.arms.iter().map(|a| u64::from(a.weight)).sum()
    }
}

/// One plugin to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// Transport name; must equal the name the library reports.
    pub name: TransportName,
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
}

/// Node identity settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Name for logs.
    pub name: String,
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

/// A config error pointing into the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// File name or origin.
    pub origin: String,
    /// 1-based line, 0 when unknown.
    pub line: usize,
    /// 1-based column, 0 when unknown.
    pub col: usize,
    /// What was wrong and what was expected.
    pub message: String,
    /// The offending source line.
    pub source_line: String,
    /// Caret width.
    pub width: usize,
    /// An example of a valid value.
    pub help: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if self.line == 0 {
            write!(f, "\n  --> {}", self.origin)?;
        } else {
            let num = self.line.to_string();
            let pad = " ".repeat(num.len());
            write!(
                f,
                "\n{pad}--> {}:{}:{}\n{pad} |\n{num} | {}\n{pad} | {}{}",
                self.origin,
                self.line,
                self.col,
                self.source_line,
                " ".repeat(self.col.saturating_sub(1)),
                "^".repeat(self.width.max(1))
            )?;
        }
        if let Some(help) = &self.help {
            write!(
                f,
                "\n{} = help: {help}",
                " ".repeat(self.line.to_string().len())
            )?;
        }
        Ok(())
    }
}

struct Ctx<'a> {
    text: &'a str,
    origin: &'a Origin,
}

impl Ctx<'_> {
    fn error(
        &self,
        span: Option<std::ops::Range<usize>>,
        message: String,
        help: Option<&str>,
    ) -> ConfigError {
        let (line, col, source_line, width) = match span {
            Some(span) => {
                let start = span.start.min(self.text.len());
                let before = &self.text[..start];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let line_end = self.text[start..]
                    .find('\n')
                    .map_or(self.text.len(), |i| start + i);
                let source_line = self.text[line_start..line_end].trim_end().to_owned();
                let col = self.text[line_start..start].chars().count() + 1;
                let width = self.text[start..span.end.min(line_end).max(start)]
                    .chars()
                    .count();
                (line, col, source_line, width)
            }
            None => (0, 0, String::new(), 0),
        };
        ConfigError {
            origin: self.origin.display(),
            line,
            col,
            message,
            source_line,
            width,
            help: help.map(str::to_owned),
        }
    }

    fn choice<T: Copy>(
        &self,
        key: &str,
        value: &Option<Spanned<String>>,
        choices: &[(&str, T)],
        default: T,
    ) -> Result<T, ConfigError> {
        let Some(v) = value else { return Ok(default) };
        if let Some((_, t)) = choices.iter().find(|(n, _)| *n == v.get_ref()) {
            return Ok(*t);
        }
        let expected: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        let leaf = key.rsplit('.').next().unwrap_or(key);
        Err(self.error(
            Some(v.span()),
            format!(
                "`{key}`: expected {}, found \"{}\"",
                expected.join(" or "),
                v.get_ref()
            ),
            Some(&format!("example: {leaf} = {}", expected[0])),
        ))
    }

    /// A positive duration (`"30s"`, `"500ms"`) at `key`.
    fn duration(
        &self,
        key: &str,
        v: &Spanned<String>,
        example: &str,
    ) -> Result<std::time::Duration, ConfigError> {
        parse_duration(v.get_ref())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                let leaf = key.rsplit('.').next().unwrap_or(key);
                self.error(
                    Some(v.span()),
                    format!(
                        "`{key}`: expected a duration such as \"{example}\", found \"{}\"",
                        v.get_ref()
                    ),
                    Some(&format!("example: {leaf} = \"{example}\"")),
                )
            })
    }

    /// An integer at `key` that must lie in `lo..=hi`.
    fn int_in(
        &self,
        key: &str,
        v: &Spanned<i64>,
        lo: i64,
        hi: i64,
        example: &str,
    ) -> Result<i64, ConfigError> {
        let n = *v.get_ref();
        if (lo..=hi).contains(&n) {
            return Ok(n);
        }
        let leaf = key.rsplit('.').next().unwrap_or(key);
        Err(self.error(
            Some(v.span()),
            format!("`{key}`: expected an integer in {lo}..={hi}, found {n}"),
            Some(&format!("example: {leaf} = {example}")),
        ))
    }

    /// Validates the conditions of a route or experiment at `key`.
    fn when(&self, key: &str, r: RawWhen<'_>) -> Result<RouteWhen, ConfigError> {
        let size =
            |name: &str, v: &Option<Spanned<toml::Value>>| -> Result<Option<u64>, ConfigError> {
                let Some(v) = v else { return Ok(None) };
                let parsed = match v.get_ref() {
                    toml::Value::Integer(n) if *n >= 0 => Some(*n as u64),
                    toml::Value::String(s) => parse_byte_size(s),
                    _ => None,
                };
                parsed.map(Some).ok_or_else(|| {
                    self.error(
                        Some(v.span()),
                        format!(
                            "`{key}.{name}`: expected a byte size such as \"1MiB\", found {}",
                            v.get_ref()
                        ),
                        Some(&format!("example: {name} = \"1MiB\"")),
                    )
                })
            };
        let min_size = size("min-size", r.min_size)?;
        let max_size = size("max-size", r.max_size)?;
        if let (Some(lo), Some(hi)) = (min_size, max_size) {
            if lo > hi {
                return Err(self.error(
                    r.max_size.as_ref().map(Spanned::span),
                    format!(
                        "`{key}`: max-size ({hi}) is below min-size ({lo}); it could never match"
                    ),
                    None,
                ));
            }
        }
        let device = self.choice(
            &format!("{key}.device"),
            r.device,
            &[
                ("cpu", Some(DeviceSel::Cpu)),
                ("cuda", Some(DeviceSel::Cuda)),
            ],
            None,
        )?;
        let owner = match r.owner {
            Some(p) if p.get_ref().is_empty() || p.get_ref().len() > 255 => {
                return Err(self.error(
                    Some(p.span()),
                    format!("`{key}.owner`: expected an address pattern of 1..=255 characters"),
                    Some("example: owner = \"10.0.*:7070\""),
                ))
            }
            Some(p) => Some(AddrPattern(p.get_ref().clone())),
            None => None,
        };
        Ok(RouteWhen {
            local: r.local,
            device,
            min_size,
            max_size,
            tags: r.tags.clone(),
            owner,
        })
    }

    /// Validates `[[experiment]]` number `i`.
    fn experiment(
        &self,
        i: usize,
        e: &RawExperiment,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Experiment, ConfigError> {
        let key = format!("experiment[{i}]");
        let name = e.name.get_ref().trim();
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(self.error(
                Some(e.name.span()),
                format!(
                    "`{key}.name`: expected 1..=64 characters of [A-Za-z0-9._-], found \"{}\"",
                    e.name.get_ref()
                ),
                Some("example: name = \"shm-vs-http\""),
            ));
        }
        let when = self.when(
            &key,
            RawWhen {
                local: e.local,
                device: &e.device,
                min_size: &e.min_size,
                max_size: &e.max_size,
                tags: &e.tags,
                owner: &e.owner,
            },
        )?;
        let unit = self.choice(
            &format!("{key}.unit"),
            &e.unit,
            &[
                ("shard", ExperimentUnit::Shard),
                ("fetch", ExperimentUnit::Fetch),
            ],
            ExperimentUnit::Shard,
        )?;
        let arms_help = Some("example: arms = [{ transport = \"posix-shm\", weight = 90 }, { transport = \"http\", weight = 10 }]");
        if e.arms.get_ref().len() < 2 || e.arms.get_ref().len() > MAX_ARMS {
            return Err(self.error(
                Some(e.arms.span()),
                format!(
                    "`{key}.arms`: expected 2..={MAX_ARMS} arms (the first is the control), found {}",
                    e.arms.get_ref().len()
                ),
                arms_help,
            ));
        }
        let mut arms: Vec<Arm> = Vec::new();
        for (j, a) in e.arms.get_ref().iter().enumerate() {
            let akey = format!("{key}.arms[{j}]");
            let transport = self.transport(&format!("{akey}.transport"), &a.transport)?;
            if !plugins.iter().any(|p| p.name == transport) {
                warnings.push(format!(
                    "`{akey}.transport` names `{transport}`, which no [[plugin]] table loads; the experiment will never apply"
                ));
            }
            if arms.iter().any(|b| b.transport == transport) {
                return Err(self.error(
                    Some(a.transport.span()),
                    format!("`{akey}.transport`: `{transport}` already has an arm; each arm needs its own transport"),
                    arms_help,
                ));
            }
            let weight = self.int_in(&format!("{akey}.weight"), &a.weight, 1, 1_000_000, "10")?;
            let name = match &a.name {
                Some(n) => {
                    let v = n.get_ref();
                    if v.is_empty()
                        || v.len() > 64
                        || !v
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                    {
                        return Err(self.error(
                            Some(n.span()),
                            format!("`{akey}.name`: expected 1..=64 characters of [A-Za-z0-9._-], found \"{v}\""),
                            Some("example: name = \"canary\""),
                        ));
                    }
                    v.clone()
                }
                None => transport.to_string(),
            };
            if arms.iter().any(|b| b.name == name) {
                return Err(self.error(
                    a.name
                        .as_ref()
                        .map_or(Some(a.transport.span()), |n| Some(n.span())),
                    format!("`{akey}`: arm name `{name}` is used twice"),
                    None,
                ));
            }
            arms.push(Arm {
                name,
                transport,
                weight: weight as u32,
            });
        }
        let guardrail = match &e.guardrail {
            None => None,
            Some(g) => {
                let span = g.span();
                let g = g.get_ref();
                let gkey = format!("{key}.guardrail");
                let fraction = |name: &str,
                                v: &Option<Spanned<f64>>,
                                lo: f64,
                                hi: f64,
                                example: &str|
                 -> Result<Option<f64>, ConfigError> {
                    match v {
                        None => Ok(None),
                        Some(v) if (lo..=hi).contains(v.get_ref()) => Ok(Some(*v.get_ref())),
                        Some(v) => Err(self.error(
                            Some(v.span()),
                            format!(
                                "`{gkey}.{name}`: expected a number in {lo}..={hi}, found {}",
                                v.get_ref()
                            ),
                            Some(&format!("example: {name} = {example}")),
                        )),
                    }
                };
                let max_error_rate =
                    fraction("max-error-rate", &g.max_error_rate, 0.0, 1.0, "0.05")?;
                let max_p99_ratio = fraction("max-p99-ratio", &g.max_p99_ratio, 1.0, 1e6, "3.0")?;
                if max_error_rate.is_none() && max_p99_ratio.is_none() {
                    return Err(self.error(
                        Some(span),
                        format!("`{gkey}` sets neither `max-error-rate` nor `max-p99-ratio`; it would never trip"),
                        Some("example: guardrail = { max-error-rate = 0.05, window = \"60s\" }"),
                    ));
                }
                let window = match &g.window {
                    None => DEFAULT_GUARDRAIL_WINDOW,
                    Some(v) => self.duration(&format!("{gkey}.window"), v, "60s")?,
                };
                let min_samples = match &g.min_samples {
                    None => DEFAULT_GUARDRAIL_MIN_SAMPLES,
                    Some(v) => {
                        self.int_in(&format!("{gkey}.min-samples"), v, 1, 100_000_000, "100")?
                            as u64
                    }
                };
                Some(Guardrail {
                    max_error_rate,
                    max_p99_ratio,
                    window,
                    min_samples,
                })
            }
        };
        Ok(Experiment {
            name: name.to_owned(),
            when,
            unit,
            salt: e.salt.clone().unwrap_or_else(|| name.to_owned()),
            arms,
            guardrail,
        })
    }

    fn transport(&self, key: &str, v: &Spanned<String>) -> Result<TransportName, ConfigError> {
        TransportName::new(v.get_ref()).map_err(|m| {
            self.error(
                Some(v.span()),
                format!("`{key}`: {m}"),
                Some("example: posix-shm"),
            )
        })
    }
}

/// Parses and validates config text. Pure: reads no file (plugin paths are
/// resolved to candidate paths, not checked for existence).
pub fn parse_str(text: &str, origin: Origin) -> Result<Config, ConfigError> {
    let ctx = Ctx {
        text,
        origin: &origin,
    };
    let mut warnings = Vec::new();
    let de = toml::Deserializer::parse(text).map_err(|e| {
        ctx.error(
            e.span(),
            format!("invalid TOML: {}", e.message().trim_end()),
            None,
        )
    })?;
    let raw: RawConfig = serde_ignored::deserialize(de, |path| {
        let path = dotted(&path.to_string());
        // Plugin tables are the plugin's to validate; everything else is ours.
        warnings.push(format!("unknown config key `{path}` (ignored)"));
    })
    .map_err(|e: toml::de::Error| {
        ctx.error(
            e.span(),
            format!("invalid config: {}", e.message().trim_end()),
            None,
        )
    })?;

    let node_raw = raw.node.unwrap_or_default();
    let node = NodeConfig {
        name: node_raw
            .name
            .map(Spanned::into_inner)
            .unwrap_or_else(|| "shardport".to_owned()),
        advertise: match node_raw.advertise {
            Some(a) => {
                let s = a.get_ref();
                let ok = s
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
                if !ok || s.len() > crate::vocab::MAX_ADDR {
                    return Err(ctx.error(
                        Some(a.span()),
                        format!(
                            "`node.advertise`: expected `host:port` of at most {} bytes, found \"{s}\"",
                            crate::vocab::MAX_ADDR
                        ),
                        Some("example: advertise = \"10.0.0.5:7070\""),
                    ));
                }
                a.into_inner()
            }
            None => "127.0.0.1:0".to_owned(),
        },
        sweep_interval: match &node_raw.sweep_interval {
            None => DEFAULT_SWEEP_INTERVAL,
            Some(v) => ctx.duration("node.sweep-interval", v, "30s")?,
        },
        max_shard_size: match node_raw.max_shard_size {
            None => DEFAULT_MAX_SHARD_SIZE,
            Some(v) => {
                let parsed = match v.get_ref() {
                    toml::Value::Integer(i) if *i > 0 => Some(*i as u64),
                    toml::Value::String(s) => parse_byte_size(s).filter(|&n| n > 0),
                    _ => None,
                };
                parsed.ok_or_else(|| {
                    ctx.error(
                        Some(v.span()),
                        format!(
                            "`node.max-shard-size`: expected a positive byte size such as \"64GiB\", found {}",
                            v.get_ref()
                        ),
                        Some("example: max-shard-size = \"64GiB\""),
                    )
                })?
            }
        },
    };

    let fetch_raw = raw.fetch.unwrap_or_default();
    let fetch = FetchConfig {
        mode: ctx.choice(
            "fetch.mode",
            &fetch_raw.mode,
            &[("view", FetchMode::View), ("copy", FetchMode::Copy)],
            FetchMode::Copy,
        )?,
        on_downgrade: ctx.choice(
            "fetch.on-downgrade",
            &fetch_raw.on_downgrade,
            &[
                ("warn", OnDowngrade::Warn),
                ("allow", OnDowngrade::Allow),
                ("fail", OnDowngrade::Fail),
            ],
            OnDowngrade::Warn,
        )?,
        verify_checksum: fetch_raw.verify_checksum.unwrap_or(true),
        max_batch: match &fetch_raw.max_batch {
            None => DEFAULT_MAX_BATCH,
            Some(v) => ctx.int_in("fetch.max-batch", v, 1, 1_000_000, "4096")? as usize,
        },
    };

    let put_raw = raw.put.unwrap_or_default();
    let storage_kind = ctx.choice(
        "put.storage",
        &put_raw.storage,
        &[("pool", true), ("heap", false)],
        false,
    )?;
    let storage = if storage_kind {
        let t = put_raw.pool_transport.as_ref().ok_or_else(|| {
            ctx.error(
                put_raw.storage.as_ref().map(Spanned::span),
                "`put.storage = \"pool\"` needs `put.pool-transport`, the transport whose allocator holds the bytes".to_owned(),
                Some("example: pool-transport = \"posix-shm\""),
            )
        })?;
        Storage::Pool(ctx.transport("put.pool-transport", t)?)
    } else {
        if let Some(t) = &put_raw.pool_transport {
            warnings.push(format!(
                "`put.pool-transport = \"{}\"` has no effect unless `put.storage = \"pool\"`",
                t.get_ref()
            ));
        }
        Storage::Heap
    };
    let checksum = ctx.choice(
        "put.checksum",
        &put_raw.checksum,
        &[
            ("none", ChecksumPolicy::None),
            ("crc32c", ChecksumPolicy::Crc32c),
            ("xxh3", ChecksumPolicy::Xxh3),
        ],
        ChecksumPolicy::None,
    )?;

    let cache_raw = raw.cache.unwrap_or_default();
    let cache = {
        let mut kinds: Vec<Spanned<String>> = Vec::new();
        if let Some(p) = &cache_raw.policy {
            let span = p.span();
            let bad = || {
                ctx.error(
                    Some(span.clone()),
                    format!(
                        "`cache.policy`: expected \"none\", \"explicit\", \"lru\", \"ttl\" or a list of them, found {}",
                        p.get_ref()
                    ),
                    Some("example: policy = [\"lru\", \"ttl\"]"),
                )
            };
            match p.get_ref() {
                toml::Value::String(s) => kinds.push(Spanned::new(span.clone(), s.clone())),
                toml::Value::Array(items) => {
                    for it in items {
                        kinds.push(Spanned::new(
                            span.clone(),
                            it.as_str().ok_or_else(bad)?.to_owned(),
                        ));
                    }
                }
                _ => return Err(bad()),
            }
        }
        let mut policy = crate::vocab::CachePolicy::default();
        let (mut lru, mut ttl) = (false, false);
        for k in &kinds {
            match k.get_ref().as_str() {
                "none" if kinds.len() == 1 => {}
                "explicit" => policy.enabled = true,
                "lru" => (policy.enabled, lru) = (true, true),
                "ttl" => (policy.enabled, ttl) = (true, true),
                other => {
                    return Err(ctx.error(
                        Some(k.span()),
                        format!("`cache.policy`: unknown or misplaced policy \"{other}\" (\"none\" stands alone)"),
                        Some("example: policy = [\"lru\", \"ttl\"]"),
                    ))
                }
            }
        }
        if lru {
            let Some(v) = &cache_raw.max_bytes else {
                return Err(ctx.error(
                    cache_raw.policy.as_ref().map(Spanned::span),
                    "`cache.policy` includes \"lru\", which needs `cache.max-bytes`".to_owned(),
                    Some("example: max-bytes = \"8GiB\""),
                ));
            };
            let n = match v.get_ref() {
                toml::Value::Integer(i) if *i > 0 => Some(*i as u64),
                toml::Value::String(s) => parse_byte_size(s).filter(|&n| n > 0),
                _ => None,
            };
            policy.max_bytes = Some(n.ok_or_else(|| {
                ctx.error(
                    Some(v.span()),
                    format!(
                        "`cache.max-bytes`: expected a positive byte size, found {}",
                        v.get_ref()
                    ),
                    Some("example: max-bytes = \"8GiB\""),
                )
            })?);
        } else if cache_raw.max_bytes.is_some() {
            warnings.push(
                "`cache.max-bytes` has no effect unless `cache.policy` includes \"lru\"".to_owned(),
            );
        }
        if ttl {
            let Some(v) = &cache_raw.ttl else {
                return Err(ctx.error(
                    cache_raw.policy.as_ref().map(Spanned::span),
                    "`cache.policy` includes \"ttl\", which needs `cache.ttl`".to_owned(),
                    Some("example: ttl = \"30s\""),
                ));
            };
            policy.ttl = Some(ctx.duration("cache.ttl", v, "30s")?);
        } else if cache_raw.ttl.is_some() {
            warnings.push(
                "`cache.ttl` has no effect unless `cache.policy` includes \"ttl\"".to_owned(),
            );
        }
        policy
    };
    let same_node = ctx.choice(
        "locality.same-node",
        &raw.locality.unwrap_or_default().same_node,
        &[
            ("both", SameNodeMatch::Both),
            ("address", SameNodeMatch::Address),
            ("identity", SameNodeMatch::Identity),
        ],
        SameNodeMatch::Both,
    )?;

    let mut plugins: Vec<PluginSpec> = Vec::new();
    for (i, p) in raw.plugin.into_iter().enumerate() {
        let key = format!("plugin[{i}]");
        let name = ctx.transport(&format!("{key}.name"), &p.name)?;
        if plugins.iter().any(|q| q.name == name) {
            return Err(ctx.error(
                Some(p.name.span()),
                format!("`{key}.name`: plugin `{name}` is configured twice"),
                None,
            ));
        }
        let written = p.path.get_ref();
        if written.trim().is_empty() {
            return Err(ctx.error(
                Some(p.path.span()),
                format!(
                    "`{key}.path`: expected the path of a plugin library, found an empty string"
                ),
                Some("example: path = \"libshardport_posix_shm.so\""),
            ));
        }
        let rel = Path::new(written);
        let paths = if rel.is_absolute() {
            vec![rel.to_path_buf()]
        } else {
            origin.candidates(rel)
        };
        let sha256 = match &p.sha256 {
            None => None,
            Some(s) => Some(parse_sha256(s.get_ref()).ok_or_else(|| {
                ctx.error(
                    Some(s.span()),
                    format!("`{key}.sha256`: expected 64 hexadecimal digits"),
                    Some("example: sha256 = \"<output of sha256sum libshardport_posix_shm.so>\""),
                )
            })?),
        };
        let config_text = match &p.config {
            Some(t) => toml::to_string(t).map_err(|e| {
                ctx.error(
                    Some(p.name.span()),
                    format!("`{key}.config` cannot be rendered: {e}"),
                    None,
                )
            })?,
            None => String::new(),
        };
        plugins.push(PluginSpec {
            name,
            paths,
            path_as_written: written.clone(),
            sha256,
            required: p.required.unwrap_or(false),
            config_text,
        });
    }

    let export_to = match put_raw.export_to {
        None => None,
        Some(list) if list.is_empty() => {
            return Err(ctx.error(
                None,
                "`put.export-to` is empty: no transport would export a shard (omit the key to export through every loaded transport)".to_owned(),
                Some("example: export-to = [\"posix-shm\"]"),
            ))
        }
        Some(list) => {
            let mut names = Vec::new();
            for (i, t) in list.iter().enumerate() {
                let name = ctx.transport(&format!("put.export-to[{i}]"), t)?;
                if !plugins.iter().any(|p| p.name == name) {
                    warnings.push(format!(
                        "`put.export-to[{i}]` names `{name}`, which no [[plugin]] table loads"
                    ));
                }
                names.push(name);
            }
            if let Storage::Pool(t) = &storage {
                if !names.contains(t) {
                    warnings.push(format!(
                        "`put.export-to` omits the pool transport `{t}`; it exports every shard anyway, since it holds the bytes"
                    ));
                }
            }
            Some(names)
        }
    };
    if let Storage::Pool(t) = &storage {
        if !plugins.iter().any(|p| &p.name == t) {
            warnings.push(format!(
                "`put.pool-transport` names `{t}`, which no [[plugin]] table loads; puts will use the heap"
            ));
        }
    }

    let control_raw = raw.control.unwrap_or_default();
    let control = ControlConfig {
        bind: match &control_raw.bind {
            Some(b) if crate::locality::split_host_port(b.get_ref()).is_none() => {
                return Err(ctx.error(
                    Some(b.span()),
                    format!(
                        "`control.bind`: expected `host:port`, found \"{}\"",
                        b.get_ref()
                    ),
                    Some("example: bind = \"127.0.0.1:7071\""),
                ))
            }
            Some(b) => b.get_ref().clone(),
            None => DEFAULT_CONTROL_BIND.to_owned(),
        },
        token: match (control_raw.auth_token, control_raw.auth_token_env) {
            (Some(_), Some(e)) => {
                return Err(ctx.error(
                    Some(e.span()),
                    "`control.auth-token` and `control.auth-token-env` are both set; keep one"
                        .to_owned(),
                    None,
                ))
            }
            (Some(t), None) if t.get_ref().is_empty() => {
                return Err(ctx.error(
                    Some(t.span()),
                    "`control.auth-token` is empty".to_owned(),
                    None,
                ))
            }
            (Some(t), None) => TokenSource::Literal(t.into_inner()),
            (None, Some(e)) => TokenSource::Env(e.into_inner()),
            (None, None) => TokenSource::None,
        },
    };

    let mut routes = Vec::new();
    for (i, r) in raw.route.into_iter().enumerate() {
        let key = format!("route[{i}]");
        let when = ctx.when(
            &key,
            RawWhen {
                local: r.local,
                device: &r.device,
                min_size: &r.min_size,
                max_size: &r.max_size,
                tags: &r.tags,
                owner: &r.owner,
            },
        )?;
        if r.transports.get_ref().is_empty() {
            return Err(ctx.error(
                Some(r.transports.span()),
                format!("`{key}.transports` is empty: a route needs at least one transport to try"),
                Some("example: transports = [\"posix-shm\", \"http\"]"),
            ));
        }
        let mut transports = Vec::new();
        for (j, t) in r.transports.get_ref().iter().enumerate() {
            let name = ctx.transport(&format!("{key}.transports[{j}]"), t)?;
            if transports.contains(&name) {
                return Err(ctx.error(
                    Some(t.span()),
                    format!("`{key}.transports[{j}]`: `{name}` is listed twice"),
                    None,
                ));
            }
            if !plugins.iter().any(|p| p.name == name) {
                warnings.push(format!(
                    "`{key}.transports[{j}]` names `{name}`, which no [[plugin]] table loads"
                ));
            }
            transports.push(name);
        }
        routes.push(Route {
            name: r
                .name
                .map(Spanned::into_inner)
                .unwrap_or_else(|| key.clone()),
            when,
            transports,
        });
    }
    let experiments = raw
        .experiment
        .iter()
        .enumerate()
        .map(|(i, e)| ctx.experiment(i, e, &plugins, &mut warnings))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, e) in experiments.iter().enumerate() {
        if experiments[..i].iter().any(|o| o.name == e.name) {
            return Err(ctx.error(
                Some(raw.experiment[i].name.span()),
                format!("`experiment[{i}].name`: `{}` is used twice", e.name),
                None,
            ));
        }
    }

    Ok(Config {
        origin,
        routes,
        experiments,
        control,
        node,
        fetch,
        put: PutConfig {
            storage,
            checksum,
            export_to,
        },
        cache,
        same_node,
        plugins,
        warnings,
    })
}

/// serde_ignored's path (`fetch.?.mod`, `plugin.0.colour`) as a dotted
/// config path (`fetch.mod`, `plugin[0].colour`).
fn dotted(path: &str) -> String {
    let mut out = String::new();
    for seg in path.split('.').filter(|s| *s != "?") {
        if seg.bytes().all(|b| b.is_ascii_digit()) && !out.is_empty() {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(s.trim()).ok()?;
    bytes.try_into().ok()
}

/// The effective routing table, one line per route in match order, then the
/// default order (what `shardport config check` prints).
pub fn routing_table(cfg: &Config) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if !cfg.experiments.is_empty() {
        out.push_str("  experiments (first match wins, before routes):\n");
        for (i, e) in cfg.experiments.iter().enumerate() {
            let total = e.total_weight() as f64;
            let arms: Vec<String> = e
                .arms
                .iter()
                .enumerate()
                .map(|(j, a)| {
                    format!(
                        "{}{} via {} {:.1}%",
                        a.name,
                        if j == 0 { " (control)" } else { "" },
                        a.transport,
                        f64::from(a.weight) * 100.0 / total
                    )
                })
                .collect();
            let guard = match &e.guardrail {
                None => String::new(),
                Some(g) => {
                    let mut parts = Vec::new();
                    if let Some(r) = g.max_error_rate {
                        parts.push(format!("error rate > {:.1}%", r * 100.0));
                    }
                    if let Some(r) = g.max_p99_ratio {
                        parts.push(format!("p99 > {r}x control"));
                    }
                    format!(
                        "; guardrail: {} over {:?} (>= {} samples) disables an arm",
                        parts.join(" or "),
                        g.window,
                        g.min_samples
                    )
                }
            };
            let _ = writeln!(
                out,
                "    {}. {:<14} {:<40} -> per {}: {}{guard}",
                i + 1,
                e.name,
                describe_when(&e.when),
                e.unit,
                arms.join(", ")
            );
        }
    }
    out.push_str("  routing (first match wins):\n");
    for (i, r) in cfg.routes.iter().enumerate() {
        let via: Vec<&str> = r.transports.iter().map(TransportName::as_str).collect();
        let _ = writeln!(
            out,
            "    {}. {:<14} {:<40} -> {}",
            i + 1,
            r.name,
            describe_when(&r.when),
            via.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "    {}. {:<14} {:<40} -> same-node transports first (per locality.same-node), zero-copy first for views, then the owner's export order",
        cfg.routes.len() + 1,
        "default",
        "no route matched"
    );
    out
}

/// The conditions of a route or experiment in one line.
fn describe_when(w: &RouteWhen) -> String {
    let mut conds = Vec::new();
    if let Some(l) = w.local {
        conds.push(if l { "local" } else { "remote" }.to_owned());
    }
    if let Some(d) = w.device {
        conds.push(format!(
            "device={}",
            if d == DeviceSel::Cpu { "cpu" } else { "cuda" }
        ));
    }
    let size = shardport_abi::format_byte_size;
    match (w.min_size, w.max_size) {
        (Some(lo), Some(hi)) => conds.push(format!("size {}..={}", size(lo), size(hi))),
        (Some(lo), None) => conds.push(format!("size >= {}", size(lo))),
        (None, Some(hi)) => conds.push(format!("size <= {}", size(hi))),
        (None, None) => {}
    }
    for (k, v) in &w.tags {
        conds.push(format!("tag {k}={v}"));
    }
    if let Some(p) = &w.owner {
        conds.push(format!("owner ~ {}", p.as_str()));
    }
    if conds.is_empty() {
        "any shard".to_owned()
    } else {
        conds.join(", ")
    }
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

/// Parses a byte size for CLI flags (`256MiB`).
pub fn byte_size_arg(s: &str) -> Result<u64, String> {
    parse_byte_size(s).ok_or_else(|| format!("expected a byte size such as 256MiB, found `{s}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_origin() -> Origin {
        Origin::Text {
            name: "test.toml".into(),
            base_dir: PathBuf::from("/opt/sp"),
            search_deps: false,
        }
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = parse_str(DEFAULT_CONFIG, text_origin()).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(c.plugins[0].name.as_str(), "posix-shm");
        assert_eq!(
            c.plugins[0].paths[0],
            PathBuf::from("/opt/sp/libshardport_posix_shm.so")
        );
    }

    #[test]
    fn ab_test_config_describes_its_split() {
        let c = parse_str(include_str!("../../configs/ab-test.toml"), text_origin()).unwrap();
        let e = &c.experiments[0];
        assert_eq!(
            (e.name.as_str(), e.unit),
            ("shm-vs-http", ExperimentUnit::Shard)
        );
        assert_eq!(e.salt, "2026-11-canary-1");
        assert_eq!(
            e.arms
                .iter()
                .map(|a| (a.name.as_str(), a.transport.as_str(), a.weight))
                .collect::<Vec<_>>(),
            [("control", "posix-shm", 95), ("canary", "http", 5)]
        );
        let g = e.guardrail.as_ref().unwrap();
        assert_eq!(
            (g.max_error_rate, g.max_p99_ratio, g.min_samples),
            (Some(0.02), Some(20.0), 200)
        );
        assert_eq!(g.window, std::time::Duration::from_secs(300));
        assert_eq!(
            (e.when.min_size, e.when.max_size, e.when.local),
            (Some(1 << 20), Some(64 << 20), Some(true))
        );
        let t = routing_table(&c);
        assert!(
            t.contains("shm-vs-http")
                && t.contains("control (control) via posix-shm 95.0%")
                && t.contains("canary via http 5.0%"),
            "{t}"
        );
    }

    #[test]
    fn experiment_errors_name_the_key() {
        let base = "[[plugin]]\nname = \"a\"\npath = \"a.so\"\n[[plugin]]\nname = \"b\"\npath = \"b.so\"\n";
        let cases = [
            ("arms = [{ transport = \"a\", weight = 1 }]", "`experiment[0].arms`: expected 2..=16 arms"),
            ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"a\", weight = 1 }]", "`experiment[0].arms[1].transport`: `a` already has an arm"),
            ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 0 }]", "`experiment[0].arms[1].weight`: expected an integer in 1..=1000000, found 0"),
            ("unit = \"request\"\narms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]", "`experiment[0].unit`: expected \"shard\" or \"fetch\", found \"request\""),
            ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { window = \"1m\" }", "`experiment[0].guardrail` sets neither"),
            ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { max-error-rate = 1.5 }", "`experiment[0].guardrail.max-error-rate`: expected a number in 0..=1, found 1.5"),
            ("arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]\nguardrail = { max-error-rate = 0.1, window = \"soon\" }", "`experiment[0].guardrail.window`: expected a duration"),
            ("min-size = \"2MiB\"\nmax-size = \"1MiB\"\narms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]", "`experiment[0]`: max-size (1048576) is below min-size (2097152)"),
        ];
        for (body, want) in cases {
            let text = format!("{base}[[experiment]]\nname = \"x\"\n{body}\n");
            let err = parse_str(&text, text_origin()).unwrap_err();
            assert!(err.message.contains(want), "{body}\n-> {err}");
            assert!(err.line > 0, "{err}");
        }
        // Two experiments with one name.
        let arms = "arms = [{ transport = \"a\", weight = 1 }, { transport = \"b\", weight = 1 }]";
        let text = format!(
            "{base}[[experiment]]\nname = \"x\"\n{arms}\n[[experiment]]\nname = \"x\"\n{arms}\n"
        );
        let err = parse_str(&text, text_origin()).unwrap_err();
        assert!(
            err.message
                .contains("`experiment[1].name`: `x` is used twice"),
            "{err}"
        );
        // An arm whose transport no plugin loads is a warning, not an error.
        let text = format!("{base}[[experiment]]\nname = \"x\"\narms = [{{ transport = \"a\", weight = 1 }}, {{ transport = \"c\", weight = 1 }}]\n");
        let c = parse_str(&text, text_origin()).unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("`experiment[0].arms[1].transport` names `c`")),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn shipped_configs_are_valid_without_warnings() {
        for (name, text) in [
            (
                "single-node.toml",
                include_str!("../../configs/single-node.toml"),
            ),
            (
                "multi-node.toml",
                include_str!("../../configs/multi-node.toml"),
            ),
            ("ab-test.toml", include_str!("../../configs/ab-test.toml")),
        ] {
            let c = parse_str(text, text_origin()).unwrap_or_else(|e| panic!("{name}:\n{e}"));
            assert!(c.warnings.is_empty(), "{name}: {:?}", c.warnings);
            assert!(!c.routes.is_empty(), "{name}");
        }
    }

    #[test]
    fn bad_choice_points_at_the_value() {
        let text = "[fetch]\nmode = \"fast\"\n";
        let e = parse_str(text, text_origin()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`fetch.mode`: expected \"view\" or \"copy\", found \"fast\"\n \
             --> test.toml:2:8\n  |\n2 | mode = \"fast\"\n  |        ^^^^^^\n  = help: example: mode = \"view\""
        );
    }

    #[test]
    fn syntax_error_has_position() {
        let e = parse_str("[fetch\nmode = 1", text_origin()).unwrap_err();
        assert_eq!((e.line, e.col), (1, 7));
        assert!(e.message.starts_with("invalid TOML"), "{}", e.message);
    }

    #[test]
    fn wrong_type_has_position() {
        let e = parse_str("[fetch]\nverify-checksum = \"yes\"\n", text_origin()).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("invalid type"), "{}", e.message);
    }

    #[test]
    fn unknown_keys_are_warned_with_dotted_path() {
        let c = parse_str(
            "[fetch]\nmod = \"view\"\n[[plugin]]\nname = \"x\"\npath = \"a.so\"\ncolour = 1\n[plugin.config]\nanything = 1\n",
            text_origin(),
        )
        .unwrap();
        assert_eq!(
            c.warnings,
            vec![
                "unknown config key `fetch.mod` (ignored)".to_owned(),
                "unknown config key `plugin[0].colour` (ignored)".to_owned()
            ]
        );
        assert_eq!(c.plugins[0].config_text, "anything = 1\n");
    }

    #[test]
    fn pool_storage_needs_a_transport() {
        let e = parse_str("[put]\nstorage = \"pool\"\n", text_origin()).unwrap_err();
        assert!(
            e.message.contains("needs `put.pool-transport`"),
            "{}",
            e.message
        );
        assert_eq!(e.line, 2);
    }

    #[test]
    fn duplicate_plugin_and_bad_names() {
        let dup = "[[plugin]]\nname = \"a\"\npath = \"a.so\"\n[[plugin]]\nname = \"a\"\npath = \"b.so\"\n";
        let e = parse_str(dup, text_origin()).unwrap_err();
        assert_eq!(
            e.message,
            "`plugin[1].name`: plugin `a` is configured twice"
        );
        assert_eq!(e.line, 5);
        let bad = "[[plugin]]\nname = \"Posix_Shm\"\npath = \"a.so\"\n";
        let e = parse_str(bad, text_origin()).unwrap_err();
        assert!(e
            .message
            .starts_with("`plugin[0].name`: `Posix_Shm` is not a transport name"));
        let sha = "[[plugin]]\nname = \"a\"\npath = \"a.so\"\nsha256 = \"abc\"\n";
        let e = parse_str(sha, text_origin()).unwrap_err();
        assert_eq!(
            e.message,
            "`plugin[0].sha256`: expected 64 hexadecimal digits"
        );
    }

    #[test]
    fn empty_export_list_and_bad_sizes_are_errors() {
        let e = parse_str("[put]\nexport-to = []\n", text_origin()).unwrap_err();
        assert!(
            e.message.starts_with("`put.export-to` is empty"),
            "{}",
            e.message
        );
        let e = parse_str("[node]\nmax-shard-size = \"huge\"\n", text_origin()).unwrap_err();
        assert_eq!(
            e.message,
            "`node.max-shard-size`: expected a positive byte size such as \"64GiB\", found \"huge\""
        );
        assert_eq!((e.line, e.col), (2, 18));
        let c = parse_str("[node]\nmax-shard-size = \"2GiB\"\n", text_origin()).unwrap();
        assert_eq!(c.node.max_shard_size, 2 << 30);
    }

    #[test]
    fn routes_are_validated_and_kept_in_order() {
        let text = "[[plugin]]\nname = \"posix-shm\"\npath = \"a.so\"\n[[plugin]]\nname = \"http\"\npath = \"b.so\"\n\
                    [[route]]\nname = \"big-local\"\nlocal = true\nmin-size = \"1MiB\"\ntransports = [\"posix-shm\", \"http\"]\n\
                    [[route]]\nowner = \"10.0.*\"\ntags = { role = \"kv\" }\ntransports = [\"http\"]\n";
        let c = parse_str(text, text_origin()).unwrap();
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[0].name, "big-local");
        assert_eq!(c.routes[0].when.min_size, Some(1 << 20));
        assert_eq!(c.routes[1].name, "route[1]");
        assert!(c.routes[1]
            .when
            .owner
            .as_ref()
            .unwrap()
            .matches("10.0.3.4:7070"));
        assert_eq!(c.same_node, SameNodeMatch::Both);

        let e = parse_str("[[route]]\ntransports = []\n", text_origin()).unwrap_err();
        assert_eq!((e.line, e.col), (2, 14));
        assert!(e.message.starts_with("`route[0].transports` is empty"));
        let e = parse_str(
            "[[route]]\nmin-size = \"2MiB\"\nmax-size = \"1MiB\"\ntransports = [\"x\"]\n",
            text_origin(),
        )
        .unwrap_err();
        assert!(e.message.contains("could never match"), "{}", e.message);
        let e = parse_str(
            "[[route]]\ndevice = \"tpu\"\ntransports = [\"x\"]\n",
            text_origin(),
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "`route[0].device`: expected \"cpu\" or \"cuda\", found \"tpu\""
        );
    }

    #[test]
    fn routing_table_lists_routes_then_the_default() {
        let c = parse_str(include_str!("../../configs/multi-node.toml"), text_origin()).unwrap();
        let t = routing_table(&c);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["1.", "same-machine", "local", "->", "posix-shm,", "http"]
        );
        assert!(lines[2].contains("tag kind=kv, owner ~ 10.0.1.*"), "{t}");
        assert!(lines[4].trim_start().starts_with("4. default"), "{t}");
    }

    #[test]
    fn address_globs() {
        let p = |s: &str| AddrPattern(s.to_owned());
        assert!(p("*").matches("anything:1"));
        assert!(p("10.0.?.*:7070").matches("10.0.5.12:7070"));
        assert!(!p("10.0.?.*:7070").matches("10.0.55.12:7070"));
        assert!(!p("10.*").matches("110.0.0.1:1"));
        assert!(p("*:7070").matches("[::1]:7070"));
        assert!(!p("a*b*c").matches(&"ab".repeat(1000)));
    }

    #[test]
    fn cache_policies_combine_and_need_their_parameters() {
        let c = parse_str(
            "[cache]\npolicy = [\"lru\", \"ttl\"]\nmax-bytes = \"1GiB\"\nttl = \"30s\"\n",
            text_origin(),
        )
        .unwrap();
        assert_eq!(
            c.cache,
            crate::vocab::CachePolicy {
                enabled: true,
                max_bytes: Some(1 << 30),
                ttl: Some(std::time::Duration::from_secs(30))
            }
        );
        let e = parse_str("[cache]\npolicy = \"lru\"\n", text_origin()).unwrap_err();
        assert_eq!(
            e.message,
            "`cache.policy` includes \"lru\", which needs `cache.max-bytes`"
        );
        assert_eq!((e.line, e.col), (2, 10));
        let e =
            parse_str("[cache]\npolicy = \"ttl\"\nttl = \"soon\"\n", text_origin()).unwrap_err();
        assert!(
            e.message.starts_with("`cache.ttl`: expected a duration"),
            "{}",
            e.message
        );
        let e = parse_str("[cache]\npolicy = [\"none\", \"lru\"]\n", text_origin()).unwrap_err();
        assert!(e.message.contains("\"none\" stands alone"), "{}", e.message);
        assert!(!parse_str("", text_origin()).unwrap().cache.enabled);
        assert_eq!(
            parse_duration("250ms"),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration("2h"),
            Some(std::time::Duration::from_secs(7200))
        );
        assert_eq!(parse_duration("5 parsecs"), None);
    }

    #[test]
    fn advertise_is_checked() {
        let e = parse_str("[node]\nadvertise = \"nohost\"\n", text_origin()).unwrap_err();
        assert_eq!(
            e.message,
            "`node.advertise`: expected `host:port` of at most 255 bytes, found \"nohost\""
        );
        let c = parse_str("[node]\nadvertise = \"[::1]:7070\"\n", text_origin()).unwrap();
        assert_eq!(c.node.advertise, "[::1]:7070");
    }

    #[test]
    fn relative_plugin_paths_resolve_against_the_config_file() {
        let c = parse_str(
            "[[plugin]]\nname = \"a\"\npath = \"lib/a.so\"\n",
            Origin::File(PathBuf::from("/etc/sp/node.toml")),
        )
        .unwrap();
        assert_eq!(c.plugins[0].paths, vec![PathBuf::from("/etc/sp/lib/a.so")]);
    }
}
