//! The semantic check: turns the [`schema`](super::schema) structs into a
//! validated [`Config`], one section at a time, in file order.
//!
//! Every error points at the offending value ([`Ctx::error`]), names the
//! dotted key, says what was expected and shows an example. Findings that do
//! not stop the node (unknown keys, settings that have no effect, names no
//! plugin loads) become warnings. Routes and experiments are checked in
//! [`rules`](super::rules).

use std::path::Path;

use shardport_kit::parse_byte_size;
use toml::{
    de::{DeString, DeTable, DeValue},
    Spanned,
};

use super::{
    schema::{RawCache, RawConfig, RawControl, RawFaults, RawFetch, RawNode, RawPlugin, RawPut},
    span::{locate, ConfigError},
    ChecksumPolicy, Config, ControlConfig, ControlTls, Faults, FetchConfig, FetchMode, KeyPlaces,
    NodeConfig, OnDowngrade, Origin, PluginSpec, PutConfig, SameNodeMatch, Storage, TokenSource,
    TransportName, DEFAULT_CONTROL_BIND, DEFAULT_MAX_BATCH, DEFAULT_MAX_SHARD_SIZE,
    DEFAULT_SWEEP_INTERVAL, UNNAMED_NODE,
};
use crate::vocab::{CachePolicy, MAX_ADDR};

/// The text being checked and where it came from: what every error needs.
pub(super) struct Ctx<'a> {
    pub(super) text: &'a str,
    pub(super) origin: &'a Origin,
}

/// Parses and validates config text. Pure: reads no file (plugin paths are
/// resolved to candidate paths, not checked for existence).
pub fn parse_str(text: &str, origin: Origin) -> Result<Config, ConfigError> {
    let ctx = Ctx {
        text,
        origin: &origin,
    };
    let mut warnings = Vec::new();
    let raw = ctx.raw(&mut warnings)?;
    let node = ctx.node(raw.node.unwrap_or_default())?;
    let fetch = ctx.fetch(raw.fetch.unwrap_or_default())?;
    let put_raw = raw.put.unwrap_or_default();
    let storage = ctx.storage(&put_raw, &mut warnings)?;
    let checksum = ctx.choice(
        "put.checksum",
        &put_raw.checksum,
        &ChecksumPolicy::KEYWORDS,
        ChecksumPolicy::None,
    )?;
    let cache = ctx.cache(raw.cache.unwrap_or_default(), &mut warnings)?;
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
    let plugins = ctx.plugins(raw.plugin)?;
    let export_to = ctx.export_to(put_raw.export_to, &storage, &plugins, &mut warnings)?;
    let control = ctx.control(raw.control.unwrap_or_default())?;
    let routes = ctx.routes(raw.route, &plugins, &mut warnings)?;
    let experiments = ctx.experiments(&raw.experiment, &plugins, &mut warnings)?;
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

impl Ctx<'_> {
    /// An error at `span` (none: the whole file) with an optional example.
    pub(super) fn error(
        &self,
        span: Option<std::ops::Range<usize>>,
        message: String,
        help: Option<&str>,
    ) -> ConfigError {
        let at = span.map(|s| locate(self.text, s));
        ConfigError {
            origin: self.origin.display(),
            line: at.as_ref().map_or(0, |a| a.line),
            col: at.as_ref().map_or(0, |a| a.col),
            source_line: at
                .as_ref()
                .map_or_else(String::new, |a| a.source_line.clone()),
            width: at.as_ref().map_or(0, |a| a.width),
            message,
            help: help.map(str::to_owned),
        }
    }

    /// One of `choices` at `key`, or `default` when the key is absent.
    pub(super) fn choice<T: Copy>(
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
        Err(self.error(
            Some(v.span()),
            format!(
                "`{key}`: expected {}, found \"{}\"",
                expected.join(" or "),
                v.get_ref()
            ),
            Some(&format!("example: {} = {}", leaf(key), expected[0])),
        ))
    }

    /// A positive duration (`"30s"`, `"500ms"`) at `key`.
    pub(super) fn duration(
        &self,
        key: &str,
        v: &Spanned<String>,
        example: &str,
    ) -> Result<std::time::Duration, ConfigError> {
        super::parse_duration(v.get_ref())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                self.error(
                    Some(v.span()),
                    format!(
                        "`{key}`: expected a duration such as \"{example}\", found \"{}\"",
                        v.get_ref()
                    ),
                    Some(&format!("example: {} = \"{example}\"", leaf(key))),
                )
            })
    }

    /// An integer at `key` that must lie in `lo..=hi`.
    pub(super) fn int_in(
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
        Err(self.error(
            Some(v.span()),
            format!("`{key}`: expected an integer in {lo}..={hi}, found {n}"),
            Some(&format!("example: {} = {example}", leaf(key))),
        ))
    }

    /// A byte size at `key`: an integer or a string such as `"1MiB"`;
    /// `positive` refuses zero.
    pub(super) fn byte_size(
        &self,
        key: &str,
        v: &Spanned<toml::Value>,
        positive: bool,
        example: &str,
    ) -> Result<u64, ConfigError> {
        let parsed = match v.get_ref() {
            toml::Value::Integer(n) if *n >= 0 => Some(*n as u64),
            toml::Value::String(s) => parse_byte_size(s),
            _ => None,
        };
        parsed.filter(|&n| n > 0 || !positive).ok_or_else(|| {
            self.error(
                Some(v.span()),
                format!(
                    "`{key}`: expected a {}byte size such as \"{example}\", found {}",
                    if positive { "positive " } else { "" },
                    v.get_ref()
                ),
                Some(&format!("example: {} = \"{example}\"", leaf(key))),
            )
        })
    }

    /// A transport name at `key`.
    pub(super) fn transport(
        &self,
        key: &str,
        v: &Spanned<String>,
    ) -> Result<TransportName, ConfigError> {
        TransportName::new(v.get_ref()).map_err(|m| {
            self.error(
                Some(v.span()),
                format!("`{key}`: {m}"),
                Some("example: posix-shm"),
            )
        })
    }

    /// The schema structs; unknown keys become warnings.
    fn raw(&self, warnings: &mut Vec<String>) -> Result<RawConfig, ConfigError> {
        let de = toml::Deserializer::parse(self.text).map_err(|e| {
            self.error(
                e.span(),
                format!("invalid TOML: {}", e.message().trim_end()),
                None,
            )
        })?;
        let mut unknown = Vec::new();
        let raw = serde_ignored::deserialize(de, |path| unknown.push(path.to_string()));
        // In the order they are written (serde reports them by field). The
        // spanned document is parsed only when there is a key to place.
        let doc = if unknown.is_empty() {
            None
        } else {
            DeTable::parse(self.text).ok()
        };
        let mut unknown: Vec<_> = unknown
            .into_iter()
            .map(|path| {
                let segs = path.split('.').filter(|s| *s != "?");
                let span = doc
                    .as_ref()
                    .and_then(|d| entry(d.get_ref(), segs))
                    .map(|(k, _)| k.span());
                (span, path)
            })
            .collect();
        unknown.sort_by_key(|(span, _)| span.as_ref().map_or(usize::MAX, |s| s.start));
        for (span, path) in unknown {
            // Plugin tables are the plugin's to validate; everything else is ours.
            let at = match span {
                Some(span) => {
                    let at = locate(self.text, span);
                    format!(" at {}:{}:{}", self.origin.display(), at.line, at.col)
                }
                None => format!(" in {}", self.origin.display()),
            };
            warnings.push(format!(
                "unknown config key `{}` (ignored){at}",
                dotted(&path)
            ));
        }
        raw.map_err(|e: toml::de::Error| {
            self.error(
                e.span(),
                format!("invalid config: {}", e.message().trim_end()),
                None,
            )
        })
    }

    /// `[node]`.
    fn node(&self, raw: RawNode) -> Result<NodeConfig, ConfigError> {
        Ok(NodeConfig {
            name_given: raw.name.is_some(),
            name: raw
                .name
                .map(Spanned::into_inner)
                .unwrap_or_else(|| UNNAMED_NODE.to_owned()),
            advertise: match raw.advertise {
                Some(a) => self.advertise(a)?,
                None => "127.0.0.1:0".to_owned(),
            },
            sweep_interval: match &raw.sweep_interval {
                None => DEFAULT_SWEEP_INTERVAL,
                Some(v) => self.duration("node.sweep-interval", v, "30s")?,
            },
            max_shard_size: match &raw.max_shard_size {
                None => DEFAULT_MAX_SHARD_SIZE,
                Some(v) => self.byte_size("node.max-shard-size", v, true, "64GiB")?,
            },
        })
    }

    /// `node.advertise`: `host:port`, short enough for a handle.
    fn advertise(&self, a: Spanned<String>) -> Result<String, ConfigError> {
        let s = a.get_ref();
        let ok = s
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !ok || s.len() > MAX_ADDR {
            return Err(self.error(
                Some(a.span()),
                format!(
                    "`node.advertise`: expected `host:port` of at most {MAX_ADDR} bytes, found \"{s}\""
                ),
                Some("example: advertise = \"10.0.0.5:7070\""),
            ));
        }
        Ok(a.into_inner())
    }

    /// `[fetch]`.
    fn fetch(&self, raw: RawFetch) -> Result<FetchConfig, ConfigError> {
        Ok(FetchConfig {
            mode: self.choice(
                "fetch.mode",
                &raw.mode,
                &[("view", FetchMode::View), ("copy", FetchMode::Copy)],
                FetchMode::Copy,
            )?,
            on_downgrade: self.choice(
                "fetch.on-downgrade",
                &raw.on_downgrade,
                &OnDowngrade::KEYWORDS,
                OnDowngrade::Warn,
            )?,
            verify_checksum: raw.verify_checksum.unwrap_or(true),
            max_batch: match &raw.max_batch {
                None => DEFAULT_MAX_BATCH,
                Some(v) => self.int_in("fetch.max-batch", v, 1, 1_000_000, "4096")? as usize,
            },
            exhausted_wait: match &raw.exhausted_wait {
                None => std::time::Duration::ZERO,
                Some(v) if v.get_ref().trim() == "0s" => std::time::Duration::ZERO,
                Some(v) => self.duration("fetch.exhausted-wait", v, "2s")?,
            },
            copy_buffers: match &raw.copy_buffers {
                None => crate::buffers::DEFAULT_BUDGET,
                Some(v) => self.byte_size("fetch.copy-buffers", v, false, "64MiB")?,
            },
        })
    }

    /// `put.storage` and `put.pool-transport`.
    fn storage(&self, raw: &RawPut, warnings: &mut Vec<String>) -> Result<Storage, ConfigError> {
        let pool = self.choice(
            "put.storage",
            &raw.storage,
            &[("pool", true), ("heap", false)],
            false,
        )?;
        if pool {
            let t = raw.pool_transport.as_ref().ok_or_else(|| {
                self.error(
                    raw.storage.as_ref().map(Spanned::span),
                    "`put.storage = \"pool\"` needs `put.pool-transport`, the transport whose allocator holds the bytes".to_owned(),
                    Some("example: pool-transport = \"posix-shm\""),
                )
            })?;
            return Ok(Storage::Pool(self.transport("put.pool-transport", t)?));
        }
        if let Some(t) = &raw.pool_transport {
            warnings.push(format!(
                "`put.pool-transport = \"{}\"` has no effect unless `put.storage = \"pool\"`",
                t.get_ref()
            ));
        }
        Ok(Storage::Heap)
    }

    /// `[cache]`: the policy list and the parameters it needs.
    fn cache(&self, raw: RawCache, warnings: &mut Vec<String>) -> Result<CachePolicy, ConfigError> {
        let mut policy = CachePolicy::default();
        let (mut lru, mut ttl) = (false, false);
        let kinds = self.cache_kinds(&raw.policy)?;
        for k in &kinds {
            match k.get_ref().as_str() {
                "none" if kinds.len() == 1 => {}
                "explicit" => policy.enabled = true,
                "lru" => (policy.enabled, lru) = (true, true),
                "ttl" => (policy.enabled, ttl) = (true, true),
                other => {
                    return Err(self.error(
                        Some(k.span()),
                        format!("`cache.policy`: unknown or misplaced policy \"{other}\" (\"none\" stands alone)"),
                        Some("example: policy = [\"lru\", \"ttl\"]"),
                    ))
                }
            }
        }
        let policy_span = raw.policy.as_ref().map(Spanned::span);
        let needs = |what: &str, key: &str, example: &str| {
            self.error(
                policy_span.clone(),
                format!("`cache.policy` includes \"{what}\", which needs `cache.{key}`"),
                Some(&format!("example: {key} = \"{example}\"")),
            )
        };
        if lru {
            let v = raw
                .max_bytes
                .as_ref()
                .ok_or_else(|| needs("lru", "max-bytes", "8GiB"))?;
            policy.max_bytes = Some(self.byte_size("cache.max-bytes", v, true, "8GiB")?);
        } else if raw.max_bytes.is_some() {
            warnings.push(
                "`cache.max-bytes` has no effect unless `cache.policy` includes \"lru\"".to_owned(),
            );
        }
        if ttl {
            let v = raw.ttl.as_ref().ok_or_else(|| needs("ttl", "ttl", "30s"))?;
            policy.ttl = Some(self.duration("cache.ttl", v, "30s")?);
        } else if raw.ttl.is_some() {
            warnings.push(
                "`cache.ttl` has no effect unless `cache.policy` includes \"ttl\"".to_owned(),
            );
        }
        Ok(policy)
    }

    /// `cache.policy`: one name or a list of them, each spanned by the value.
    fn cache_kinds(
        &self,
        policy: &Option<Spanned<toml::Value>>,
    ) -> Result<Vec<Spanned<String>>, ConfigError> {
        let Some(p) = policy else {
            return Ok(Vec::new());
        };
        let span = p.span();
        let bad = || {
            self.error(
                Some(span.clone()),
                format!(
                    "`cache.policy`: expected \"none\", \"explicit\", \"lru\", \"ttl\" or a list of them, found {}",
                    p.get_ref()
                ),
                Some("example: policy = [\"lru\", \"ttl\"]"),
            )
        };
        match p.get_ref() {
            toml::Value::String(s) => Ok(vec![Spanned::new(span.clone(), s.clone())]),
            toml::Value::Array(items) => items
                .iter()
                .map(|it| {
                    Ok(Spanned::new(
                        span.clone(),
                        it.as_str().ok_or_else(bad)?.to_owned(),
                    ))
                })
                .collect(),
            _ => Err(bad()),
        }
    }

    /// `[[plugin]]` tables, in order; names are unique.
    fn plugins(&self, raw: Vec<RawPlugin>) -> Result<Vec<PluginSpec>, ConfigError> {
        let mut plugins: Vec<PluginSpec> = Vec::new();
        // Parsed once for every plugin's key places.
        let doc = if raw.is_empty() {
            None
        } else {
            DeTable::parse(self.text).ok()
        };
        for (i, p) in raw.into_iter().enumerate() {
            let key = format!("plugin[{i}]");
            let name = self.transport(&format!("{key}.name"), &p.name)?;
            if plugins.iter().any(|q| q.name == name) {
                return Err(self.error(
                    Some(p.name.span()),
                    format!("`{key}.name`: plugin `{name}` is configured twice"),
                    None,
                ));
            }
            let places = self.plugin_places(doc.as_ref().map(|d| d.get_ref()), i, &p);
            let mut spec = self.plugin(&key, name, p)?;
            spec.config_places = places;
            plugins.push(spec);
        }
        Ok(plugins)
    }

    /// The rest of the `[[plugin]]` table at `key`, named `name`.
    fn plugin(
        &self,
        key: &str,
        name: TransportName,
        p: RawPlugin,
    ) -> Result<PluginSpec, ConfigError> {
        let written = p.path.get_ref();
        if written.trim().is_empty() {
            return Err(self.error(
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
            self.origin.candidates(rel)
        };
        let sha256 = match &p.sha256 {
            None => None,
            Some(s) => Some(parse_sha256(s.get_ref()).ok_or_else(|| {
                self.error(
                    Some(s.span()),
                    format!("`{key}.sha256`: expected 64 hexadecimal digits"),
                    Some("example: sha256 = \"<output of sha256sum libshardport_posix_shm.so>\""),
                )
            })?),
        };
        let config_text = match &p.config {
            Some(t) => toml::to_string(t).map_err(|e| {
                self.error(
                    Some(p.name.span()),
                    format!("`{key}.config` cannot be rendered: {e}"),
                    None,
                )
            })?,
            None => String::new(),
        };
        let transport = match &p.transport {
            Some(t) => self.transport(&format!("{key}.transport"), t)?,
            None => name.clone(),
        };
        let faults = match &p.faults {
            Some(f) => Some(self.faults(&format!("{key}.faults"), f.get_ref())?),
            None => None,
        };
        Ok(PluginSpec {
            name,
            transport,
            paths,
            path_as_written: written.clone(),
            sha256,
            required: p.required.unwrap_or(false),
            config_text,
            faults,
            config_places: KeyPlaces::default(),
        })
    }

    /// Where the keys of `[[plugin]]` number `i`'s `config` table are in
    /// the spanned document `doc` (the plugin's name stands for the table
    /// when it has none).
    fn plugin_places(&self, doc: Option<&DeTable<'_>>, i: usize, p: &RawPlugin) -> KeyPlaces {
        let origin = self.origin.display();
        let index = i.to_string();
        let config = doc.and_then(|d| entry(d, ["plugin", index.as_str(), "config"].into_iter()));
        match config {
            Some((key, value)) => {
                let keys = match value.get_ref() {
                    DeValue::Table(t) => t
                        .iter()
                        .map(|(k, _)| (k.get_ref().to_string(), k.span()))
                        .collect(),
                    _ => Vec::new(),
                };
                KeyPlaces::new(self.text, origin, Some(key.span()), keys)
            }
            None => KeyPlaces::new(self.text, origin, Some(p.name.span()), []),
        }
    }

    /// `[plugin.faults]` at `fkey`: rates in 0..=1, a delay, a seed.
    fn faults(&self, fkey: &str, f: &RawFaults) -> Result<Faults, ConfigError> {
        let rate = |name: &str, v: &Option<Spanned<f64>>| -> Result<u32, ConfigError> {
            match v {
                None => Ok(0),
                Some(v) if (0.0..=1.0).contains(v.get_ref()) => {
                    Ok((v.get_ref() * 1e6).round() as u32)
                }
                Some(v) => Err(self.error(
                    Some(v.span()),
                    format!(
                        "`{fkey}.{name}`: expected a rate in 0..=1, found {}",
                        v.get_ref()
                    ),
                    Some(&format!("example: {name} = 0.05")),
                )),
            }
        };
        let delay = match &f.delay {
            Some(d) => self.duration(&format!("{fkey}.delay"), d, "5ms")?,
            None => std::time::Duration::from_millis(1),
        };
        let seed = match &f.seed {
            Some(s) => self.int_in(&format!("{fkey}.seed"), s, 0, i64::MAX, "7")? as u64,
            None => 0,
        };
        Ok(Faults {
            seed,
            delay,
            delay_ppm: rate("delay-rate", &f.delay_rate)?,
            reset_ppm: rate("reset", &f.reset)?,
            short_read_ppm: rate("short-read", &f.short_read)?,
            corrupt_ppm: rate("corrupt", &f.corrupt)?,
            enospc_ppm: rate("enospc", &f.enospc)?,
            garbage_descriptor_ppm: rate("garbage-descriptor", &f.garbage_descriptor)?,
        })
    }

    /// `put.export-to`, and the pool transport, against the loaded plugins.
    fn export_to(
        &self,
        raw: Option<Vec<Spanned<String>>>,
        storage: &Storage,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Option<Vec<TransportName>>, ConfigError> {
        let export_to = match raw {
            None => None,
            Some(list) if list.is_empty() => {
                return Err(self.error(
                    None,
                    "`put.export-to` is empty: no transport would export a shard (omit the key to export through every loaded transport)".to_owned(),
                    Some("example: export-to = [\"posix-shm\"]"),
                ))
            }
            Some(list) => Some(self.export_list(&list, storage, plugins, warnings)?),
        };
        if let Storage::Pool(t) = storage {
            if !loads(plugins, t) {
                warnings.push(format!(
                    "`put.pool-transport` names `{t}`, which no [[plugin]] table loads; puts will use the heap"
                ));
            }
        }
        Ok(export_to)
    }

    /// A non-empty `put.export-to` list.
    fn export_list(
        &self,
        list: &[Spanned<String>],
        storage: &Storage,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Vec<TransportName>, ConfigError> {
        let mut names = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let name = self.transport(&format!("put.export-to[{i}]"), t)?;
            if !loads(plugins, &name) {
                warnings.push(format!(
                    "`put.export-to[{i}]` names `{name}`, which no [[plugin]] table loads"
                ));
            }
            names.push(name);
        }
        if let Storage::Pool(t) = storage {
            if !names.contains(t) {
                warnings.push(format!(
                    "`put.export-to` omits the pool transport `{t}`; it exports every shard anyway, since it holds the bytes"
                ));
            }
        }
        Ok(names)
    }

    /// `[control]`.
    fn control(&self, raw: RawControl) -> Result<ControlConfig, ConfigError> {
        let bind = match &raw.bind {
            Some(b) if crate::locality::split_host_port(b.get_ref()).is_none() => {
                return Err(self.error(
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
        };
        let token = match (raw.auth_token, raw.auth_token_env) {
            (Some(_), Some(e)) => {
                return Err(self.error(
                    Some(e.span()),
                    "`control.auth-token` and `control.auth-token-env` are both set; keep one"
                        .to_owned(),
                    None,
                ))
            }
            (Some(t), None) if t.get_ref().is_empty() => {
                return Err(self.error(
                    Some(t.span()),
                    "`control.auth-token` is empty".to_owned(),
                    None,
                ))
            }
            (Some(t), None) => TokenSource::Literal(t.into_inner()),
            (None, Some(e)) => TokenSource::Env(e.into_inner()),
            (None, None) => TokenSource::None,
        };
        let tls = match (raw.tls_cert, raw.tls_key) {
            (Some(c), Some(k)) => {
                for (key, v) in [("tls-cert", &c), ("tls-key", &k)] {
                    if v.get_ref().is_empty() {
                        return Err(self.error(
                            Some(v.span()),
                            format!("`control.{key}`: expected the path of a PEM file, found \"\""),
                            None,
                        ));
                    }
                }
                Some(ControlTls {
                    cert: self.origin.resolve(Path::new(c.get_ref())),
                    key: self.origin.resolve(Path::new(k.get_ref())),
                })
            }
            (Some(c), None) => {
                return Err(self.error(
                    Some(c.span()),
                    "`control.tls-cert` needs `control.tls-key` (the private key of that \
                     certificate, PEM)"
                        .to_owned(),
                    Some("example: tls-key = \"/etc/shardport/control.key\""),
                ))
            }
            (None, Some(k)) => {
                return Err(self.error(
                    Some(k.span()),
                    "`control.tls-key` needs `control.tls-cert` (the certificate chain of \
                     that key, PEM)"
                        .to_owned(),
                    Some("example: tls-cert = \"/etc/shardport/control.crt\""),
                ))
            }
            (None, None) => None,
        };
        Ok(ControlConfig { bind, token, tls })
    }
}

/// True when a `[[plugin]]` table loads `name`.
pub(super) fn loads(plugins: &[PluginSpec], name: &TransportName) -> bool {
    plugins.iter().any(|p| &p.name == name)
}

/// The last segment of a dotted key (`mode` for `fetch.mode`), for examples.
fn leaf(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

/// The key and value at `path` in a spanned document (`fetch`, `mdoe`;
/// `plugin`, `0`, `config`: after an array of tables, a segment is the
/// index), if they are there.
fn entry<'d, 'i>(
    doc: &'d DeTable<'i>,
    path: impl Iterator<Item = &'d str>,
) -> Option<(&'d Spanned<DeString<'i>>, &'d Spanned<DeValue<'i>>)> {
    let mut table = doc;
    let mut segs = path.peekable();
    while let Some(seg) = segs.next() {
        let (key, value) = table.get_key_value(seg)?;
        if segs.peek().is_none() {
            return Some((key, value));
        }
        let mut value = value.get_ref();
        while let DeValue::Array(items) = value {
            let i: usize = segs.next()?.parse().ok()?;
            value = items.get(i)?.get_ref();
        }
        match value {
            DeValue::Table(t) => table = t,
            _ => return None,
        }
    }
    None
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
