//! reload: a new config applied to a running node, atomically, without
//! dropping its shards.
//!
//! A reload is checked whole before anything changes: the config parses
//! and validates, settings that only a restart can change are unchanged,
//! and every new or changed plugin loads. Then one new [`Generation`]
//! replaces the old one in a single pointer swap: fetches in flight finish
//! under the old one, new fetches see only the new one. Plugins the new
//! config keeps unchanged are the same instances (their pools, servers and
//! leases go on). Experiment states carry over by arm name (see
//! [`ExperimentState::carried`]): a tripped arm stays tripped and a ramp
//! keeps its step whatever else changed, even when a new instance (a new
//! build, another table) now serves an arm; only that arm's guardrail
//! window starts afresh, and a changed ramp restarts. Per-arm and
//! per-transport metrics are kept by name, so no counter goes back. A
//! tighter cache limit evicts at once.
//!
//! A plugin the new config drops (or replaces with another build or
//! table) stops taking new work at the swap: no new put exports through it
//! and no new fetch goes through it. It keeps serving the exports it made
//! of shards this node owns, because the handles consumers hold name them
//! (its port, its segment), until each of those shards is removed; it is
//! *draining* until no fetch in flight, owned shard or lease holds it, then
//! the instance is dropped (its segments and servers go; the library stays
//! mapped, as abi_stable never unloads one).
//!
//! A reload without a file reads the file the node was started with, even
//! after reloads of other files, unless one of them was adopted
//! ([`Node::adopt_config_file`]).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{lock, Generation, Node};
use crate::{
    config::{self, Config, Experiment, Origin},
    error::HostError,
    experiment::{same_ramp, ExperimentState},
    loader::{config_refusal, load_instance, LoadedPlugin},
    vocab::{Storage, TransportName},
};
use serde::Serialize;

/// What a reload did.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    /// The generation now in force.
    pub generation: u64,
    /// One line per change (plugins, routes, experiments, weights, cache,
    /// fetch and put settings); empty when the config was the same.
    pub changes: Vec<String>,
    /// Cache entries the new cache policy evicted at once.
    pub evicted: usize,
    /// Removed plugins still draining (name: why).
    pub draining: Vec<String>,
    /// Non-fatal findings (config warnings, optional plugins that still do
    /// not load, settings that take effect at the next restart).
    pub warnings: Vec<String>,
}

/// A step every reloaded config goes through before it is checked (the
/// embedding program's own adjustments, such as `shardport serve` making
/// its transports start eagerly); an error refuses the reload.
pub type ConfigHook = Arc<dyn Fn(&mut Config) -> Result<(), String> + Send + Sync>;

/// Plugins that a reload removed, kept until nothing uses them, the
/// reload hook, and the node's own config file.
#[derive(Default)]
pub(super) struct Book {
    draining: Vec<Arc<LoadedPlugin>>,
    hook: Option<ConfigHook>,
    /// What a reload without a file reads: the file the node started
    /// from, or the one adopted since.
    file: Option<PathBuf>,
}

impl Book {
    /// The book of a node started from a config of `origin`.
    pub(super) fn started_from(origin: &Origin) -> Book {
        Book {
            file: match origin {
                Origin::File(p) => Some(p.clone()),
                _ => None,
            },
            ..Book::default()
        }
    }

    /// Drops the removed plugins nothing holds any more; returns the rest
    /// as `name (path): why` lines.
    fn reap(&mut self) -> Vec<String> {
        self.draining.retain(|p| {
            let busy = Arc::strong_count(p) > 1 || Arc::strong_count(&p.transport) > 1;
            if !busy {
                tracing::info!(target: "reload", plugin = %p.name, path = %p.path.display(), "drained plugin dropped");
            }
            busy
        });
        self.draining.iter().map(draining_line).collect()
    }
}

fn draining_line(p: &Arc<LoadedPlugin>) -> String {
    format!(
        "{} ({}): draining, {} holders (fetches in flight, owned shards it exported) and {} leases or allocations",
        p.name,
        p.path.display(),
        Arc::strong_count(p) - 1,
        Arc::strong_count(&p.transport) - 1
    )
}

fn refused(why: impl Into<String>) -> HostError {
    HostError::ReloadRefused(why.into())
}

impl Node {
    /// Applies `next` to the running node (see the module docs), or
    /// refuses it with the reason and leaves the running config in force.
    /// Logged and counted either way.
    pub fn reload(&self, next: Config) -> Result<ReloadReport, HostError> {
        let r = match self.try_reload(next) {
            Ok(r) => r,
            Err(e) => return self.count_refusal(e),
        };
        self.inner.metrics.reload(true);
        let summary = if r.changes.is_empty() {
            "no change".to_owned()
        } else {
            r.changes.join("; ")
        };
        tracing::info!(target: "reload", generation = r.generation, evicted = r.evicted, "config reloaded: {summary}");
        for w in &r.warnings {
            tracing::warn!(target: "reload", generation = r.generation, "{w}");
        }
        self.inner.event(
            "reload",
            None,
            format!("generation {}: {summary}", r.generation),
        );
        Ok(r)
    }

    /// Reads, parses and applies a config file: `path`, or the node's own
    /// file (the one it was started with, or adopted since; a reload of
    /// another file does not change it). A file that cannot be read or
    /// parsed is refused with the error (file:line:col for a bad value).
    pub fn reload_file(&self, path: Option<&Path>) -> Result<ReloadReport, HostError> {
        let path = match (path, self.config_file()) {
            (Some(p), _) => p.to_path_buf(),
            (None, Some(p)) => p,
            (None, None) => {
                let e = refused(format!(
                    "the node was started from a config that has no file to read again ({:?}); name a config file",
                    self.inner.live().config.origin
                ));
                return self.count_refusal(e);
            }
        };
        match config::load(&path) {
            Ok(next) => self.reload(next),
            Err(e) => self.count_refusal(refused(e.to_string())),
        }
    }

    /// Parses `text` (as if read from `origin`) and applies it.
    pub fn reload_text(&self, text: &str, origin: Origin) -> Result<ReloadReport, HostError> {
        match config::parse_str(text, origin) {
            Ok(next) => self.reload(next),
            Err(e) => self.count_refusal(refused(e.to_string())),
        }
    }

    /// Counts, logs and records a refused reload (the running config stays).
    fn count_refusal(&self, e: HostError) -> Result<ReloadReport, HostError> {
        self.inner.metrics.reload(false);
        tracing::error!(target: "reload", error = %e, "config reload refused");
        self.inner.event("reload-refused", None, e.to_string());
        Err(e)
    }

    /// Makes `path` the node's own config file: what a reload without a
    /// file (SIGHUP to `shardport serve`, `shardport reload` without
    /// `--config`) reads from now on.
    pub fn adopt_config_file(&self, path: PathBuf) {
        tracing::info!(target: "reload", file = %path.display(), "config file adopted: reloads without a file read it");
        lock(&self.inner.reload).file = Some(path);
    }

    /// The node's own config file (see [`adopt_config_file`](Self::adopt_config_file)).
    pub fn config_file(&self) -> Option<PathBuf> {
        lock(&self.inner.reload).file.clone()
    }

    /// Sets the step every reloaded config goes through first (see
    /// [`ConfigHook`]); the program that started the node with an adjusted
    /// config sets the same adjustment here, so that a reload of the same
    /// file changes nothing.
    pub fn set_reload_hook(&self, hook: ConfigHook) {
        lock(&self.inner.reload).hook = Some(hook);
    }

    /// Removed plugins still draining, one line each.
    pub fn draining(&self) -> Vec<String> {
        lock(&self.inner.reload).reap()
    }

    fn try_reload(&self, mut next: Config) -> Result<ReloadReport, HostError> {
        let mut book = lock(&self.inner.reload);
        if let Some(hook) = &book.hook {
            hook(&mut next).map_err(refused)?;
        }
        let old = self.inner.live();
        if !next.node.name_given {
            // A config that names no node keeps the running name (the one
            // the node gave itself, or the one its first config gave).
            next.node.name.clone_from(&old.config.node.name);
        }
        let mut warnings = restart_only(&old.config, &next)?;
        warnings.extend(next.warnings.iter().cloned());
        let (plugins, load_failures) = self.reload_plugins(&old, &next, &mut warnings)?;
        let removed: Vec<Arc<LoadedPlugin>> = old
            .plugins
            .iter()
            .filter(|p| !plugins.iter().any(|q| Arc::ptr_eq(p, q)))
            .cloned()
            .collect();
        let mut changes = describe_changes(&old.config, &next, &removed, &plugins);
        let now_ns = self.inner.clock.monotonic_nanos();
        // Transports whose instance this reload adds, replaces or removes:
        // an arm they serve keeps its state but not its window.
        let renewed: Vec<TransportName> = plugins
            .iter()
            .filter(|p| !old.plugins.iter().any(|q| Arc::ptr_eq(p, q)))
            .chain(&removed)
            .map(|p| p.name.clone())
            .collect();
        let mut notes = Vec::new();
        let mut retired = Vec::new();
        let carried = |e: &Experiment| {
            let i = old
                .config
                .experiments
                .iter()
                .position(|o| o.name == e.name)?;
            let (was, st) = (&old.config.experiments[i], &old.experiments[i]);
            let renewed_arm = |j: usize| renewed.contains(&e.arms[j].transport);
            if st.fits(was, e) && !(0..e.arms.len()).any(renewed_arm) {
                return Some(Arc::clone(st));
            }
            let (next, lines): (ExperimentState, Vec<String>) =
                st.carried(was, e, renewed_arm, now_ns);
            notes.extend(lines);
            let next = Arc::new(next);
            retired.push((Arc::clone(st), Arc::clone(&next), e.clone()));
            Some(next)
        };
        let cache_policy = next.cache;
        let copy_buffers = next.fetch.copy_buffers;
        let generation = Generation::new(
            old.number + 1,
            next,
            plugins,
            load_failures,
            &self.inner.metrics,
            carried,
            now_ns,
        );
        changes.extend(notes);
        // Fetches still running under the old config record into the new
        // states from now on: a trip in flight is not lost.
        for (old_state, new_state, exp) in &retired {
            old_state.retire(new_state, exp);
        }
        let number = generation.number;
        *self.inner.live.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(generation);
        drop(old);
        self.inner.copy_buffers.set_budget(copy_buffers);
        // After the swap no new put or fetch reaches a removed plugin; it
        // serves what it exported until those shards are removed.
        let still_served = self.exported_through(&removed);
        if still_served > 0 {
            changes.push(format!(
                "the removed or replaced plugin instances keep serving the {still_served} owned shard(s) they exported until those are removed"
            ));
        }
        book.draining.extend(removed);
        let evicted = {
            let gone = lock(&self.inner.cache).set_policy(cache_policy, now_ns);
            gone.len()
        };
        Ok(ReloadReport {
            generation: number,
            changes,
            evicted,
            draining: book.reap(),
            warnings,
        })
    }

    /// The plugin instances of `next`: unchanged specs keep their instance,
    /// new or changed ones are loaded. A load failure refuses the reload,
    /// except for an optional plugin whose unchanged spec did not load
    /// before either (a warning, as at start).
    fn reload_plugins(
        &self,
        old: &Generation,
        next: &Config,
        warnings: &mut Vec<String>,
    ) -> Result<(Vec<Arc<LoadedPlugin>>, Vec<String>), HostError> {
        let mut plugins = Vec::new();
        let mut failures = Vec::new();
        let mut load_failures = Vec::new();
        for spec in &next.plugins {
            if let Some(p) = old.plugins.iter().find(|p| p.spec == *spec) {
                plugins.push(Arc::clone(p));
                continue;
            }
            match load_instance(spec, &self.inner.load_ctx) {
                Ok(p) => plugins.push(Arc::new(p)),
                // A refused option is the user's mistake: never skipped.
                Err(e) => match config_refusal(&e, spec) {
                    Some(refusal) => failures.push(refusal.to_string()),
                    None if !spec.required && old.config.plugins.contains(spec) => {
                        warnings.push(format!("optional plugin still not loaded: {e}"));
                        load_failures.push(e.to_string());
                    }
                    None => failures.push(e.to_string()),
                },
            }
        }
        if !failures.is_empty() {
            return Err(refused(format!(
                "plugins did not load: {}",
                failures.join("; ")
            )));
        }
        Ok((plugins, load_failures))
    }

    /// Owned shards that one of `plugins` exported.
    fn exported_through(&self, plugins: &[Arc<LoadedPlugin>]) -> usize {
        if plugins.is_empty() {
            return 0;
        }
        lock(&self.inner.shards)
            .values()
            .filter(|s| {
                s.exported_by
                    .iter()
                    .any(|p| plugins.iter().any(|r| Arc::ptr_eq(p, r)))
            })
            .count()
    }
}

/// Settings only a restart can change (handles carry the node's address,
/// and its name labels every metric): a difference refuses the reload.
/// Returns warnings for settings that take effect at the next restart.
fn restart_only(old: &Config, next: &Config) -> Result<Vec<String>, HostError> {
    let mut fixed = Vec::new();
    if old.node.name != next.node.name {
        fixed.push(format!(
            "node.name ({} -> {})",
            old.node.name, next.node.name
        ));
    }
    if old.node.advertise != next.node.advertise {
        fixed.push(format!(
            "node.advertise ({} -> {})",
            old.node.advertise, next.node.advertise
        ));
    }
    if !fixed.is_empty() {
        return Err(refused(format!(
            "{} cannot change under a running node (handles and metrics carry it); restart to change it",
            fixed.join(", ")
        )));
    }
    let mut warnings = Vec::new();
    if old.control != next.control {
        warnings.push(
            "control.* changed: the control endpoint keeps its address and token until the next restart"
                .to_owned(),
        );
    }
    Ok(warnings)
}

/// One line per difference an operator cares about.
fn describe_changes(
    old: &Config,
    next: &Config,
    removed: &[Arc<LoadedPlugin>],
    plugins: &[Arc<LoadedPlugin>],
) -> Vec<String> {
    let mut out = Vec::new();
    for p in removed {
        out.push(format!("plugin {} ({}) removed", p.name, p.path.display()));
    }
    for p in plugins {
        if !old.plugins.contains(&p.spec) {
            out.push(format!(
                "plugin {} loaded from {} (version {})",
                p.name,
                p.path.display(),
                p.plugin_version
            ));
        }
    }
    if old.routes != next.routes {
        let names: Vec<&str> = next.routes.iter().map(|r| r.name.as_str()).collect();
        out.push(format!("routes: now [{}]", names.join(", ")));
    }
    for e in &next.experiments {
        match old.experiments.iter().find(|o| o.name == e.name) {
            None => out.push(format!("experiment {} added", e.name)),
            Some(o) if o != e => out.push(experiment_change(o, e)),
            Some(_) => {}
        }
    }
    for o in &old.experiments {
        if !next.experiments.iter().any(|e| e.name == o.name) {
            out.push(format!("experiment {} removed", o.name));
        }
    }
    let (a, b) = (settings(old), settings(next));
    for ((key, was), (_, now)) in a.iter().zip(&b) {
        if was != now {
            out.push(format!("{key}: {was} -> {now}"));
        }
    }
    out
}

/// The settings a reload applies in place, as `(config key, value as
/// written in a config)`, in the same order for every config: what the
/// change lines compare and print (`fetch.mode: view -> copy`).
fn settings(c: &Config) -> Vec<(&'static str, String)> {
    use shardport_kit::format_duration;
    let quoted = |s: &str| format!("\"{s}\"");
    // As a config writes it (`"64KiB"`), exact: the largest unit that
    // divides the size.
    let size = |n: u64| {
        let (v, unit) = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")]
            .into_iter()
            .find(|&(shift, _)| n != 0 && n % (1u64 << shift) == 0)
            .map_or((n, ""), |(shift, u)| (n >> shift, u));
        format!("\"{v}{unit}\"")
    };
    let names = |v: &[TransportName]| {
        let v: Vec<String> = v.iter().map(|t| quoted(t.as_str())).collect();
        format!("[{}]", v.join(", "))
    };
    vec![
        ("fetch.mode", quoted(&c.fetch.mode.to_string())),
        ("fetch.on-downgrade", quoted(c.fetch.on_downgrade.keyword())),
        ("fetch.verify-checksum", c.fetch.verify_checksum.to_string()),
        ("fetch.max-batch", c.fetch.max_batch.to_string()),
        (
            "put.storage",
            match &c.put.storage {
                Storage::Heap => quoted("heap"),
                Storage::Pool(t) => format!("\"pool\" (pool-transport = \"{t}\")"),
            },
        ),
        ("put.checksum", quoted(c.put.checksum.keyword())),
        (
            "put.export-to",
            c.put
                .export_to
                .as_deref()
                .map_or_else(|| "every loaded transport".to_owned(), names),
        ),
        (
            "cache.policy",
            match (c.cache.enabled, c.cache.max_bytes, c.cache.ttl) {
                (false, _, _) => quoted("none"),
                (true, None, None) => quoted("explicit"),
                (true, Some(_), None) => quoted("lru"),
                (true, None, Some(_)) => quoted("ttl"),
                (true, Some(_), Some(_)) => "[\"lru\", \"ttl\"]".to_owned(),
            },
        ),
        (
            "cache.max-bytes",
            c.cache.max_bytes.map_or_else(|| "none".to_owned(), size),
        ),
        (
            "cache.ttl",
            c.cache
                .ttl
                .map_or_else(|| "none".to_owned(), |t| quoted(&format_duration(t))),
        ),
        ("node.max-shard-size", size(c.node.max_shard_size)),
    ]
}

/// `experiment e: weights control 90 -> 80, canary 10 -> 20` and what else changed.
fn experiment_change(o: &Experiment, e: &Experiment) -> String {
    let w = |x: &Experiment| {
        x.arms
            .iter()
            .map(|a| format!("{}={}", a.name, a.weight))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut parts = Vec::new();
    if w(o) != w(e) {
        parts.push(format!("weights {} -> {}", w(o), w(e)));
    }
    if o.guardrail != e.guardrail {
        parts.push("guardrail changed".to_owned());
    }
    if !same_ramp(o, e) {
        parts.push("ramp changed (restarts at its first step)".to_owned());
    }
    if o.when != e.when || o.unit != e.unit || o.salt != e.salt {
        parts.push("conditions, unit or salt changed".to_owned());
    }
    format!("experiment {}: {}", e.name, parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineOverrides;

    /// A node started from `file` with engine overrides, which it also
    /// sets as its reload hook (as the Python binding does).
    fn start_with_overrides(file: &Path, overrides: EngineOverrides) -> Node {
        let mut cfg = config::load(file).unwrap();
        overrides.apply(&mut cfg).unwrap();
        let node = Node::start(cfg).unwrap();
        node.set_reload_hook(Arc::new(move |c: &mut Config| {
            overrides.apply(c).map(drop).map_err(|e| e.to_string())
        }));
        node
    }

    #[test]
    fn overrides_survive_a_reload_of_the_file_and_its_errors_keep_their_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "[node]\nadvertise = \"127.0.0.1:9\"\n").unwrap();
        let node = start_with_overrides(
            &file,
            EngineOverrides {
                name: Some("rank1".into()),
                host: "10.1.2.3".into(),
            },
        );
        assert_eq!(node.config().node.name, "rank1");
        assert_eq!(node.config().node.advertise, "10.1.2.3:9");
        // The file again: the hook gives it the same name and address.
        let same = node.reload_file(None).unwrap();
        assert!(same.changes.is_empty(), "{:?}", same.changes);
        assert_eq!(node.config().node.advertise, "10.1.2.3:9");
        // A bad value in the file points at it.
        std::fs::write(
            &file,
            "[node]\nadvertise = \"127.0.0.1:9\"\n[fetch]\nmode = \"sideways\"\n",
        )
        .unwrap();
        let e = node.reload_file(None).unwrap_err().to_string();
        assert!(e.contains(&format!("--> {}:4:8", file.display())), "{e}");
        // So does a bad value only the overrides read (an http bind).
        std::fs::write(
            &file,
            "[node]\nadvertise = \"127.0.0.1:9\"\n[[plugin]]\nname = \"http\"\npath = \"h.so\"\n[plugin.config]\nbind = \"nohostport\"\n",
        )
        .unwrap();
        let e = node.reload_file(None).unwrap_err().to_string();
        assert!(
            e.contains("`plugin.http.config.bind`: expected `host:port`"),
            "{e}"
        );
        assert!(e.contains(&format!("--> {}:7:1", file.display())), "{e}");
        assert_eq!(node.stats().generation, 1);
    }

    #[test]
    fn without_the_hook_a_reload_of_the_file_would_undo_the_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "[node]\nname = \"as-written\"\n").unwrap();
        let mut cfg = config::load(&file).unwrap();
        EngineOverrides {
            name: Some("rank1".into()),
            host: "10.1.2.3".into(),
        }
        .apply(&mut cfg)
        .unwrap();
        let node = Node::start(cfg).unwrap();
        let e = node.reload_file(None).unwrap_err().to_string();
        assert!(e.contains("restart"), "{e}");
    }
}
