//! `shardport soak --chaos`: owners and consumers in separate `shardport
//! worker` processes, for a fixed duration, while a killer thread SIGKILLs
//! random workers at random moments and the driver restarts them, reloads
//! every worker's config (routes, cache limits, experiment weights), drains
//! caches and sweeps. Every fetched byte is checked against the pattern its
//! owner wrote. At the end every worker is killed and a fresh process sweeps:
//! what is then left in `/dev/shm` under this run's segment prefix leaked.
//!
//! Why each piece is there:
//! - SIGKILL, not a clean exit: a scheduler or the OOM killer gives no
//!   warning, so segments, lease slots and connections are left behind
//!   exactly as a crash leaves them. The killer runs on its own thread and
//!   signals through a pidfd, so a kill lands in the middle of whatever the
//!   victim is doing (a put, a fetch, a reload), and it can never hit an
//!   unrelated process that reused a pid.
//! - One owner and one consumer (the first of each) are never killed: a
//!   restarted worker starts its memory and descriptor counts again, so the
//!   flatness numbers (`flatness`, `rss_*`, `fds_*`) are taken from these two
//!   long-lived references.
//! - A unique `segment-prefix` per run: only this run's segments are counted
//!   and swept, whatever other tests or nodes on the machine do.

use std::{
    collections::{BTreeMap, VecDeque},
    ffi::OsString,
    fmt,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::{mpsc, Arc, Mutex, MutexGuard},
    thread,
    time::{Duration, Instant},
};

use serde::Serialize;
use shardport_host::vocab::FetchMode;

use crate::worker::{Reply, Request, WorkerError, WorkerProcess};

/// Shard sizes the owners put (4 KiB to 1 MiB: small views, medium copies,
/// and shards large enough for the experiment's size condition).
pub const CHAOS_SIZES: [u64; 4] = [4 << 10, 64 << 10, 256 << 10, 1 << 20];

/// Most workers of one kind: every worker is a process with a pool.
pub const MAX_WORKERS: usize = 32;

/// Upper bound on traffic steps, whatever the duration: the loop is
/// bounded in count as well as in time.
pub const MAX_STEPS: u64 = 1 << 32;

/// Shards of killed owners and removed shards kept for later fetches (which
/// must fail cleanly or return the right bytes).
const GONE_KEPT: usize = 64;

/// Error messages kept per category in the report (the counts are complete).
const SAMPLES_KEPT: usize = 8;

/// Chaos soak settings.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// `shardport` executable the workers run.
    pub exe: PathBuf,
    /// Directory holding `libshardport_posix_shm.so` and `libshardport_http.so`.
    pub plugin_dir: PathBuf,
    /// Owner processes (the first is never killed).
    pub owners: usize,
    /// Consumer processes (the first is never killed).
    pub consumers: usize,
    /// How long the traffic runs.
    pub duration: Duration,
    /// Seed of every random choice (victims, kill moments, sizes, modes).
    pub seed: u64,
    /// Mean time between kills (each wait is drawn from 0.5x-1.5x of it).
    pub kill_every: Duration,
    /// Time between config reloads of every worker.
    pub reload_every: Duration,
    /// Time between drains of every consumer's cache and sweeps of every
    /// worker.
    pub sweep_every: Duration,
    /// Time between resource snapshots.
    pub snapshot_every: Duration,
    /// Where flatness is judged from: the first snapshot at or after this
    /// time (half the duration for shorter runs); what came before it is
    /// warm-up.
    pub mark: Duration,
    /// Live shards each owner keeps (older ones are removed).
    pub shards_per_owner: usize,
    /// Each owner's posix-shm pool, MiB.
    pub pool_mib: u64,
    /// Where the configs go (a fresh directory is made under it).
    pub work_dir: PathBuf,
    /// Where each live worker's metrics go at every snapshot, one
    /// Prometheus text file per worker (`shardport-soak-<worker>.prom`,
    /// every series labelled `soak_worker`), for a node_exporter textfile
    /// collector and the Grafana dashboard; `None`: not written.
    pub metrics_dir: Option<PathBuf>,
}

impl ChaosOptions {
    /// Defaults for the given executable and plugin directory: 2 owners, 4
    /// consumers, 10 minutes, a kill every 20 s, a reload every minute.
    pub fn new(exe: PathBuf, plugin_dir: PathBuf) -> Self {
        ChaosOptions {
            exe,
            plugin_dir,
            owners: 2,
            consumers: 4,
            duration: Duration::from_secs(600),
            seed: 1,
            kill_every: Duration::from_secs(20),
            reload_every: Duration::from_secs(60),
            sweep_every: Duration::from_secs(30),
            snapshot_every: Duration::from_secs(60),
            mark: Duration::from_secs(300),
            shards_per_owner: 32,
            pool_mib: 256,
            work_dir: std::env::temp_dir(),
            metrics_dir: None,
        }
    }

    /// Checks the settings before anything starts.
    pub fn validate(&self) -> Result<(), String> {
        for (what, n) in [("--owners", self.owners), ("--consumers", self.consumers)] {
            if !(1..=MAX_WORKERS).contains(&n) {
                return Err(format!("{what} must be 1..={MAX_WORKERS}, found {n}"));
            }
        }
        for (what, d) in [
            ("--duration", self.duration),
            ("--kill-every", self.kill_every),
            ("--reload-every", self.reload_every),
            ("--sweep-every", self.sweep_every),
            ("--snapshot-every", self.snapshot_every),
        ] {
            if d < Duration::from_millis(100) {
                return Err(format!("{what} must be at least 100ms, found {d:?}"));
            }
        }
        if !(1..=4096).contains(&self.shards_per_owner) {
            return Err("--shards-per-owner must be 1..=4096".into());
        }
        if !(16..=65536).contains(&self.pool_mib) {
            return Err("the pool must be 16 MiB..=64 GiB".into());
        }
        for lib in [SHM_LIB, HTTP_LIB] {
            let p = self.plugin_dir.join(lib);
            if !p.is_file() {
                return Err(format!(
                    "{} not found (set --plugin-dir to the directory holding the plugins)",
                    p.display()
                ));
            }
        }
        Ok(())
    }
}

mod config;
mod report;
#[cfg(test)]
mod tests;

#[allow(clippy::wildcard_imports)]
use self::config::*;
pub use self::config::{config_text, shm_names, Rng, Role};
use self::report::{add_swept, label_series, summarize};
pub use self::report::{ChaosReport, ChaosSnapshot, ProcUsage, ReloadCounts};

/// What the killer thread shares with the driver, one entry per worker.
#[derive(Default)]
struct KillSlot {
    /// The current process (a pidfd: a signal through it can only reach
    /// that process, even after it was reaped and its pid reused).
    pidfd: Option<OwnedFd>,
    /// May be killed (false for the reference workers).
    killable: bool,
    /// The killer signalled the current process.
    killed: bool,
    /// Kills over the run.
    kills: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The killer thread; stopped and joined when dropped, so a failing run
/// never leaves it signalling.
struct Killer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Killer {
    fn start(table: Arc<Mutex<Vec<KillSlot>>>, seed: u64, every: Duration) -> Killer {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            let mut rng = Rng::new(seed);
            loop {
                match stopped.recv_timeout(rng.jitter(every)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let mut t = lock(&table);
                let alive: Vec<usize> = (0..t.len())
                    .filter(|&i| t[i].killable && !t[i].killed && t[i].pidfd.is_some())
                    .collect();
                if alive.is_empty() {
                    continue;
                }
                let v = alive[rng.below(alive.len())];
                // Marked before the signal: the driver, seeing the process
                // gone, then always knows it was this kill and not a crash.
                t[v].killed = true;
                if let Some(fd) = &t[v].pidfd {
                    if rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL).is_ok()
                    {
                        t[v].kills += 1;
                    }
                }
            }
        });
        Killer {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A shard an owner put.
#[derive(Debug, Clone)]
struct Shard {
    handle: String,
    id: String,
    seed: u64,
    len: u64,
    /// Tagged `path = "network"`: a route sends it over http only in some
    /// generations, so a fetch must not insist on shared memory.
    network: bool,
}

/// Why a shard is no longer live.
#[derive(Debug, Clone, Copy)]
enum Gone {
    Removed,
    OwnerKilled,
}

/// One worker slot: its config file, its current process (none between a
/// kill and the restart) and, for owners, the shards it holds.
struct Slot {
    role: Role,
    index: usize,
    config: PathBuf,
    process: Option<WorkerProcess>,
    shards: VecDeque<Shard>,
}

impl Slot {
    fn name(&self) -> String {
        format!("{}-{}", self.role, self.index)
    }
}

/// The workers; every process still running is SIGKILLed and reaped when
/// this is dropped, so a failing run leaves no child behind.
struct Fleet {
    slots: Vec<Slot>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(p) = s.process.take() {
                let _ = p.kill();
            }
        }
    }
}

/// How a call to a worker ended.
enum Outcome {
    /// A reply (`ok` or not).
    Reply(Box<Reply>),
    /// The process is gone (killed, or crashed).
    Gone,
}

/// The run in progress.
struct Run<'a> {
    opts: &'a ChaosOptions,
    prefix: String,
    dir: PathBuf,
    fleet: Fleet,
    table: Arc<Mutex<Vec<KillSlot>>>,
    rng: Rng,
    generation: u64,
    next_seed: u64,
    gone: VecDeque<(Shard, Gone)>,
    report: ChaosReport,
    start: Instant,
}

impl Run<'_> {
    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let slot = &mut self.fleet.slots[i];
        let args: Vec<OsString> = vec!["--config".into(), slot.config.clone().into_os_string()];
        // Workers log errors only: a kill makes the survivors warn about
        // every fetch from the dead owner, which is the expected case here.
        // The probes' refusals are logged as errors by design: not shown.
        let env = [("RUST_LOG".to_owned(), "error,reload=off".to_owned())];
        let p = WorkerProcess::spawn_with_env(&slot.name(), &self.opts.exe, &args, &env)
            .map_err(|e| e.to_string())?;
        let pid = rustix::process::Pid::from_raw(p.pid() as i32)
            .ok_or_else(|| format!("{}: bad pid {}", slot.name(), p.pid()))?;
        // The child is not reaped yet, so the pid is still its own.
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| format!("pidfd_open({}): {e}", p.pid()))?;
        slot.process = Some(p);
        let mut t = lock(&self.table);
        t[i].pidfd = Some(fd);
        t[i].killed = false;
        Ok(())
    }

    /// Sends a request to worker `i`; a vanished process is handled here
    /// (counted, its shards marked gone, restarted).
    fn call(&mut self, i: usize, req: &Request) -> Result<Outcome, String> {
        let Some(p) = self.fleet.slots[i].process.as_mut() else {
            return Ok(Outcome::Gone);
        };
        match p.call_raw(req) {
            Ok(r) => Ok(Outcome::Reply(Box::new(r))),
            Err(WorkerError::Exited { .. } | WorkerError::Io { .. }) => {
                self.report.interrupted_calls += 1;
                self.restart(i)?;
                Ok(Outcome::Gone)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Reaps worker `i` (killed, or found dead) and starts a new one.
    fn restart(&mut self, i: usize) -> Result<(), String> {
        let killed = {
            let mut t = lock(&self.table);
            t[i].pidfd = None;
            std::mem::take(&mut t[i].killed)
        };
        if let Some(p) = self.fleet.slots[i].process.take() {
            let _ = p.kill();
        }
        if !killed {
            self.report.unexpected_exits += 1;
            let name = self.fleet.slots[i].name();
            self.sample(format!("{name} exited without being killed"));
        }
        let shards: Vec<Shard> = self.fleet.slots[i].shards.drain(..).collect();
        for s in shards {
            self.forget(s, Gone::OwnerKilled);
        }
        self.spawn(i)?;
        self.report.restarts += 1;
        Ok(())
    }

    /// Restarts every worker the killer has killed since the last look.
    fn restart_killed(&mut self) -> Result<(), String> {
        let killed: Vec<usize> = {
            let t = lock(&self.table);
            (0..t.len()).filter(|&i| t[i].killed).collect()
        };
        for i in killed {
            self.restart(i)?;
        }
        Ok(())
    }

    fn forget(&mut self, s: Shard, why: Gone) {
        if self.gone.len() >= GONE_KEPT {
            self.gone.pop_front();
        }
        self.gone.push_back((s, why));
    }

    fn sample(&mut self, text: String) {
        if self.report.error_samples.len() < SAMPLES_KEPT * 4 {
            self.report.error_samples.push(text);
        }
    }

    fn owners(&self) -> usize {
        self.opts.owners
    }

    /// One traffic step: maybe a put (and a removal), then one fetch.
    fn step(&mut self) -> Result<(), String> {
        let o = self.rng.below(self.owners());
        let cap = self.opts.shards_per_owner;
        let held = self.fleet.slots[o].shards.len();
        if held < cap || self.rng.chance(0.2) {
            if held >= cap {
                if let Some(old) = self.fleet.slots[o].shards.pop_front() {
                    let req = Request::Remove {
                        ids: vec![old.id.clone()],
                    };
                    if let Outcome::Reply(r) = self.call(o, &req)? {
                        if !r.ok {
                            return Err(format!(
                                "owner-{o}: remove failed: {}",
                                r.error.unwrap_or_default()
                            ));
                        }
                    }
                    self.forget(old, Gone::Removed);
                }
            }
            self.put(o)?;
        }
        self.fetch()
    }

    fn put(&mut self, o: usize) -> Result<(), String> {
        let len = CHAOS_SIZES[self.rng.below(CHAOS_SIZES.len())];
        let seed = self.next_seed;
        self.next_seed += 1;
        let mut tags = BTreeMap::new();
        let network = self.rng.chance(0.25);
        if network {
            tags.insert("path".to_owned(), "network".to_owned());
        }
        let req = Request::Put {
            len,
            seed,
            dtype: None,
            tags,
        };
        match self.call(o, &req)? {
            Outcome::Gone => {}
            Outcome::Reply(r) if r.ok => {
                self.report.puts += 1;
                if let (Some(handle), Some(id)) = (r.handle, r.id) {
                    self.fleet.slots[o].shards.push_back(Shard {
                        handle,
                        id,
                        seed,
                        len,
                        network,
                    });
                }
            }
            Outcome::Reply(r) => {
                let kind = r.error_kind.unwrap_or_else(|| "other".into());
                *self.report.put_errors.entry(kind).or_default() += 1;
                self.sample(format!("put on owner-{o}: {}", r.error.unwrap_or_default()));
            }
        }
        Ok(())
    }

    fn fetch(&mut self) -> Result<(), String> {
        let c = self.owners() + self.rng.below(self.opts.consumers);
        // Mostly live shards; sometimes one that was removed or whose owner
        // was killed (it must fail cleanly, or come from a cache intact).
        let target = if !self.gone.is_empty() && self.rng.chance(0.1) {
            let (s, why) = &self.gone[self.rng.below(self.gone.len())];
            Some((s.clone(), Some(*why), None))
        } else {
            let o = self.rng.below(self.owners());
            let shards = &self.fleet.slots[o].shards;
            if shards.is_empty() {
                None
            } else {
                Some((shards[self.rng.below(shards.len())].clone(), None, Some(o)))
            }
        };
        let Some((shard, gone, owner)) = target else {
            return Ok(());
        };
        // Views through shared memory; copies through shared memory, http
        // and whatever the routes and the experiment pick; copies into a
        // reused buffer.
        let shm_only = (!shard.network).then_some("posix-shm");
        let (kind, req) = match self.rng.below(5) {
            0 => ("view", fetch_req(&shard, FetchMode::View, None)),
            1 => ("view", fetch_req(&shard, FetchMode::View, shm_only)),
            2 => ("copy", fetch_req(&shard, FetchMode::Copy, Some("http"))),
            3 => ("copy", fetch_req(&shard, FetchMode::Copy, None)),
            _ => (
                "copy_into",
                Request::FetchBuffer {
                    handle: shard.handle.clone(),
                    only: None,
                    seed: Some(shard.seed),
                },
            ),
        };
        let r = match self.call(c, &req)? {
            Outcome::Gone => return Ok(()),
            Outcome::Reply(r) => r,
        };
        if r.ok {
            self.report.fetches += 1;
            self.report.fetched_bytes += shard.len;
            *self.report.fetch_kinds.entry(kind.to_owned()).or_default() += 1;
            *self
                .report
                .served_by
                .entry(r.transport.unwrap_or_default())
                .or_default() += 1;
            if r.verified != Some(true) {
                self.report.wrong_bytes += shard.len;
                self.report.bad_fetches += 1;
                let text = format!(
                    "WRONG BYTES: consumer-{} fetched shard {} ({} bytes, {kind}) and it does not match seed {}",
                    c - self.owners(),
                    shard.id,
                    shard.len,
                    shard.seed
                );
                self.sample(text);
            }
            if self.rng.chance(0.05) {
                let req = Request::Drain {
                    ids: vec![shard.id.clone()],
                };
                self.call(c, &req)?;
            }
            return Ok(());
        }
        // Whether the owner died while this fetch ran is known only now.
        let category = match (gone, owner) {
            (Some(Gone::Removed), _) => "removed",
            (Some(Gone::OwnerKilled), _) => "owner_killed",
            (None, Some(o)) if lock(&self.table)[o].killed => "owner_killed",
            (None, Some(o)) if !self.fleet.slots[o].shards.iter().any(|s| s.id == shard.id) => {
                "owner_killed"
            }
            _ => "live",
        };
        let error_kind = r.error_kind.unwrap_or_else(|| "other".into());
        *self
            .report
            .fetch_errors
            .entry(category.to_owned())
            .or_default()
            .entry(error_kind)
            .or_default() += 1;
        if category == "live" {
            let text = format!(
                "fetch ({kind}) by consumer-{}: {}",
                c - self.owners(),
                r.error.unwrap_or_default()
            );
            self.sample(text);
        }
        Ok(())
    }

    /// Slot `i`'s config for the current generation.
    fn current_config(&self, i: usize) -> String {
        let s = &self.fleet.slots[i];
        config_text(
            self.opts,
            &self.prefix,
            s.role,
            s.index,
            self.generation,
            true,
        )
    }

    /// Rewrites every worker's config for the next generation and reloads
    /// each one; then one worker is sent a config it must refuse.
    fn reload_round(&mut self) -> Result<(), String> {
        self.generation += 1;
        self.report.reloads.rounds += 1;
        for i in 0..self.fleet.slots.len() {
            write_atomic(&self.fleet.slots[i].config, &self.current_config(i))?;
        }
        for i in 0..self.fleet.slots.len() {
            let req = Request::Reload {
                config_path: Some(self.fleet.slots[i].config.to_string_lossy().into_owned()),
            };
            match self.call(i, &req)? {
                Outcome::Gone => self.report.reloads.interrupted += 1,
                Outcome::Reply(r) if r.ok => self.report.reloads.applied += 1,
                Outcome::Reply(r) => {
                    self.report.reloads.refused += 1;
                    if self.report.reloads.samples.len() < SAMPLES_KEPT {
                        let name = self.fleet.slots[i].name();
                        self.report
                            .reloads
                            .samples
                            .push(format!("{name}: {}", r.error.unwrap_or_default()));
                    }
                }
            }
        }
        // A config that changes `node.name` (handles and metrics carry it)
        // must be refused, leaving the running config in force.
        let i = self.rng.below(self.fleet.slots.len());
        let bad = self
            .current_config(i)
            .replacen("name = \"chaos-", "name = \"renamed-", 1);
        let probe = self.dir.join("probe.toml");
        write_atomic(&probe, &bad)?;
        let req = Request::Reload {
            config_path: Some(probe.to_string_lossy().into_owned()),
        };
        match self.call(i, &req)? {
            Outcome::Gone => self.report.reloads.interrupted += 1,
            Outcome::Reply(r) => {
                self.report.reloads.probes += 1;
                if !r.ok && r.error_kind.as_deref() == Some("reload_refused") {
                    self.report.reloads.probes_refused += 1;
                } else if r.ok {
                    // Put the right config back so the run goes on sane.
                    let req = Request::Reload {
                        config_path: Some(
                            self.fleet.slots[i].config.to_string_lossy().into_owned(),
                        ),
                    };
                    self.call(i, &req)?;
                }
            }
        }
        Ok(())
    }

    /// Drains every consumer's cache and sweeps every worker.
    fn sweep_round(&mut self) -> Result<(), String> {
        self.report.sweeps += 1;
        for i in 0..self.fleet.slots.len() {
            if self.fleet.slots[i].role == Role::Consumer {
                self.call(i, &Request::Drain { ids: Vec::new() })?;
            }
            if let Outcome::Reply(r) = self.call(i, &Request::Sweep)? {
                add_swept(&mut self.report.swept_during_run, r.swept.as_ref());
            }
        }
        Ok(())
    }

    fn snapshot(&mut self) {
        let mut snap = ChaosSnapshot {
            t_s: self.start.elapsed().as_secs_f64(),
            reference: ProcUsage::default(),
            all: ProcUsage::default(),
            driver: ProcUsage::of(std::process::id()).unwrap_or_default(),
            workers: 0,
            shm_entries: shm_names(&self.prefix).len(),
            per_worker: BTreeMap::new(),
            fetches: self.report.fetches,
        };
        for s in &self.fleet.slots {
            let Some(u) = s.process.as_ref().and_then(|p| ProcUsage::of(p.pid())) else {
                continue;
            };
            snap.workers += 1;
            snap.all.add(u);
            if s.index == 0 {
                snap.reference.add(u);
            }
            snap.per_worker.insert(s.name(), u);
        }
        eprintln!(
            "soak --chaos: {:>6.0} s: {} fetches, {} wrong bytes, kills {}, reference RSS {:.1} MiB, fds {}, /dev/shm {}",
            snap.t_s,
            self.report.fetches,
            self.report.wrong_bytes,
            lock(&self.table).iter().map(|k| k.kills).sum::<u64>(),
            snap.reference.rss as f64 / (1 << 20) as f64,
            snap.reference.fds,
            snap.shm_entries
        );
        self.report.snapshots.push(snap);
        if let Some(dir) = self.opts.metrics_dir.clone() {
            self.export_metrics(&dir);
        }
    }

    /// Writes every live worker's metrics into `dir` (see
    /// [`ChaosOptions::metrics_dir`]); a worker killed meanwhile is
    /// skipped, a file that cannot be written is counted as an error.
    fn export_metrics(&mut self, dir: &Path) {
        for i in 0..self.fleet.slots.len() {
            let name = self.fleet.slots[i].name();
            let text = match self.call(i, &Request::Metrics) {
                Ok(Outcome::Reply(r)) => r.metrics,
                _ => None,
            };
            let Some(text) = text else { continue };
            let path = dir.join(format!("shardport-soak-{name}.prom"));
            if let Err(e) = write_atomic(&path, &label_series(&text, &name)) {
                self.sample(format!("writing {}: {e}", path.display()));
            }
        }
    }

    /// Kills every worker, starts a fresh process that sweeps (its own
    /// sweep at start turned off, so the reply says what was reclaimed),
    /// and counts what is left.
    fn final_sweep(&mut self) -> Result<(), String> {
        for s in &mut self.fleet.slots {
            if let Some(p) = s.process.take() {
                let _ = p.kill();
            }
        }
        self.report.segments_before_final_sweep = shm_names(&self.prefix).len();
        let config = self.dir.join("sweeper.toml");
        write_atomic(
            &config,
            &config_text(self.opts, &self.prefix, Role::Consumer, 999, 0, false),
        )?;
        let args: Vec<OsString> = vec!["--config".into(), config.into_os_string()];
        let env = [("RUST_LOG".to_owned(), "error".to_owned())];
        let mut sweeper = WorkerProcess::spawn_with_env("sweeper", &self.opts.exe, &args, &env)
            .map_err(|e| e.to_string())?;
        let r = sweeper.call(&Request::Sweep).map_err(|e| e.to_string())?;
        add_swept(&mut self.report.final_sweep, r.swept.as_ref());
        sweeper.exit().map_err(|e| e.to_string())?;
        self.report.leaked_names = shm_names(&self.prefix);
        self.report.leaked_segments = self.report.leaked_names.len();
        Ok(())
    }
}

fn fetch_req(s: &Shard, mode: FetchMode, only: Option<&str>) -> Request {
    Request::Fetch {
        handle: s.handle.clone(),
        mode: Some(mode),
        seed: Some(s.seed),
        hold: false,
        only: only.map(str::to_owned),
    }
}

/// Runs the chaos soak.
pub fn run_chaos(opts: &ChaosOptions) -> Result<ChaosReport, String> {
    opts.validate()?;
    let prefix = run_prefix(opts.seed);
    let run_dir = RunDir::create(&opts.work_dir, &prefix)?;
    let mut slots = Vec::new();
    for (role, n) in [(Role::Owner, opts.owners), (Role::Consumer, opts.consumers)] {
        for index in 0..n {
            let config = run_dir.path.join(format!("{role}-{index}.toml"));
            write_atomic(&config, &config_text(opts, &prefix, role, index, 0, true))?;
            slots.push(Slot {
                role,
                index,
                config,
                process: None,
                shards: VecDeque::new(),
            });
        }
    }
    let table = Arc::new(Mutex::new(
        slots
            .iter()
            .map(|s| KillSlot {
                killable: s.index > 0,
                ..KillSlot::default()
            })
            .collect::<Vec<_>>(),
    ));
    let mut run = Run {
        opts,
        prefix: prefix.clone(),
        dir: run_dir.path.clone(),
        fleet: Fleet { slots },
        table: Arc::clone(&table),
        rng: Rng::new(opts.seed),
        generation: 0,
        next_seed: opts.seed.wrapping_mul(1_000_003),
        gone: VecDeque::new(),
        report: ChaosReport {
            seed: opts.seed,
            owners: opts.owners,
            consumers: opts.consumers,
            segment_prefix: prefix,
            ..ChaosReport::default()
        },
        start: Instant::now(),
    };
    for i in 0..run.fleet.slots.len() {
        run.spawn(i)?;
    }
    // Each owner holds a few shards before the first snapshot, so the start
    // is a working node rather than an idle one.
    for o in 0..opts.owners {
        for _ in 0..opts.shards_per_owner.min(8) {
            run.put(o)?;
        }
    }
    run.start = Instant::now();
    run.snapshot();
    let mut killer = Killer::start(Arc::clone(&table), opts.seed ^ 0x6b69_6c6c, opts.kill_every);
    let start = run.start;
    let deadline = start + opts.duration;
    let mut next_reload = start + opts.reload_every;
    let mut next_sweep = start + opts.sweep_every;
    let mut next_snapshot = start + opts.snapshot_every;
    let mut steps = 0u64;
    while steps < MAX_STEPS {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        run.restart_killed()?;
        if now >= next_reload {
            run.reload_round()?;
            next_reload += opts.reload_every;
        }
        if now >= next_sweep {
            run.sweep_round()?;
            next_sweep += opts.sweep_every;
        }
        if now >= next_snapshot {
            run.snapshot();
            next_snapshot += opts.snapshot_every;
        }
        run.step()?;
        steps += 1;
    }
    killer.stop();
    run.report.duration_s = start.elapsed().as_secs_f64();
    // Kills the killer made but the driver had not yet seen.
    run.restart_killed()?;
    // The end snapshot comes before the last drain, like every snapshot
    // before it (a drain right before it would flatter the end).
    run.snapshot();
    run.sweep_round()?;
    for (i, k) in lock(&table).iter().enumerate() {
        let role = run.fleet.slots[i].role.to_string();
        *run.report.kills.entry(role).or_default() += k.kills;
    }
    run.final_sweep()?;
    let mut report = run.report.clone();
    summarize(&mut report, opts.mark.min(opts.duration / 2));
    drop(run);
    drop(run_dir);
    Ok(report)
}
