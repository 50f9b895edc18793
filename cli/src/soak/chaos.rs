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
//!   flatness numbers (`rss_*`, `fds_*`) are taken from these two
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
use shardport_host::config::FetchMode;

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
    /// The snapshot the end is compared with for flatness (the first one at
    /// or after this time; half the duration for shorter runs).
    pub mark: Duration,
    /// Live shards each owner keeps (older ones are removed).
    pub shards_per_owner: usize,
    /// Each owner's posix-shm pool, MiB.
    pub pool_mib: u64,
    /// Where the configs go (a fresh directory is made under it).
    pub work_dir: PathBuf,
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

const SHM_LIB: &str = "libshardport_posix_shm.so";
const HTTP_LIB: &str = "libshardport_http.so";

/// A small, seeded generator (splitmix64): the same choices for the same seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % (n.max(1) as u64)) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// `mean` scaled by a factor drawn from 0.5..1.5.
    pub fn jitter(&mut self, mean: Duration) -> Duration {
        let f = 0.5 + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        mean.mul_f64(f)
    }
}

/// Owner or consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Puts and removes shards.
    Owner,
    /// Fetches them.
    Consumer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Owner => "owner",
            Role::Consumer => "consumer",
        })
    }
}

/// The configuration a worker runs at reload generation `generation`: the
/// plugins never change (their pools and servers go on), the routes, the
/// consumer cache limit and the experiment weights do.
pub fn config_text(
    opts: &ChaosOptions,
    prefix: &str,
    role: Role,
    index: usize,
    generation: u64,
    sweep_on_start: bool,
) -> String {
    let lib = |l: &str| toml_string(&opts.plugin_dir.join(l).to_string_lossy());
    let cache = match role {
        // Owners cache nothing; consumers keep views and copies in an LRU
        // cache whose limit moves with every reload (a tighter limit evicts
        // at once, which releases leases on the owners' pools).
        Role::Owner => "policy = \"none\"".to_owned(),
        Role::Consumer => format!(
            "policy = [\"lru\"]\nmax-bytes = \"{}MiB\"",
            [16, 4, 32][(generation % 3) as usize]
        ),
    };
    // The canary's share swings between small and half.
    let (control, canary) = [(95, 5), (70, 30), (50, 50), (90, 10)][(generation % 4) as usize];
    // Shards tagged `path = "network"` go over http only, or over http
    // first with shared memory as a fallback.
    let network = if generation % 2 == 0 {
        "[\"http\"]"
    } else {
        "[\"http\", \"posix-shm\"]"
    };
    format!(
        "# shardport soak --chaos: {role} {index}, reload generation {generation}.\n\
         [node]\n\
         name = \"chaos-{role}-{index}\"\n\
         advertise = \"127.0.0.1:7070\"\n\
         \n\
         [put]\n\
         storage = \"pool\"\n\
         pool-transport = \"posix-shm\"\n\
         checksum = \"none\"\n\
         \n\
         [fetch]\n\
         mode = \"view\"\n\
         on-downgrade = \"allow\"\n\
         \n\
         [cache]\n\
         {cache}\n\
         \n\
         [[plugin]]\n\
         name = \"posix-shm\"\n\
         path = {shm}\n\
         required = true\n\
         [plugin.config]\n\
         pool-size = \"{pool}MiB\"\n\
         segment-prefix = \"{prefix}\"\n\
         sweep-on-start = {sweep_on_start}\n\
         \n\
         [[plugin]]\n\
         name = \"http\"\n\
         path = {http}\n\
         required = true\n\
         [plugin.config]\n\
         bind = \"127.0.0.1:0\"\n\
         \n\
         [[experiment]]\n\
         name = \"chaos-shm-vs-http\"\n\
         local = true\n\
         device = \"cpu\"\n\
         min-size = \"256KiB\"\n\
         unit = \"shard\"\n\
         salt = \"chaos\"\n\
         arms = [\n\
         \x20 {{ name = \"control\", transport = \"posix-shm\", weight = {control} }},\n\
         \x20 {{ name = \"canary\", transport = \"http\", weight = {canary} }},\n\
         ]\n\
         \n\
         [[route]]\n\
         name = \"network\"\n\
         tags = {{ path = \"network\" }}\n\
         transports = {network}\n",
        shm = lib(SHM_LIB),
        http = lib(HTTP_LIB),
        pool = opts.pool_mib,
    )
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes `text` to `path` through a temporary file and a rename, so a
/// worker restarting at that moment reads the old file or the new one,
/// never half of one.
fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The run's files: removed with everything in them when dropped, and the
/// run's leftover `/dev/shm` segments with them (after the report counted
/// them), so even a failed run leaves nothing behind.
struct RunDir {
    path: PathBuf,
    prefix: String,
}

impl RunDir {
    fn create(parent: &Path, prefix: &str) -> Result<RunDir, String> {
        let path = parent.join(format!("shardport-{prefix}"));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(RunDir {
            path,
            prefix: prefix.to_owned(),
        })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        for name in shm_names(&self.prefix) {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }
}

/// Names in `/dev/shm` of segments made with `prefix` (segment names are
/// `{prefix}-...`).
pub fn shm_names(prefix: &str) -> Vec<String> {
    let start = format!("{prefix}-");
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&start))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A prefix no other run uses: letters and digits only (the posix-shm
/// plugin allows `[A-Za-z0-9_-]`, at most 32 characters).
fn run_prefix(seed: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let salt = Rng::new(nanos ^ seed.rotate_left(17)).next_u64() & 0xffff_ffff;
    format!("chaos{}x{salt:08x}", std::process::id())
}

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

/// Resource use of one process, from `/proc/<pid>`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ProcUsage {
    /// Resident set, bytes (VmRSS).
    pub rss: u64,
    /// Private (anonymous) resident bytes (RssAnon): heap growth shows here.
    pub anon: u64,
    /// Resident shared-memory bytes (RssShmem): pool pages touched, bounded
    /// by the pools mapped, not a per-fetch cost.
    pub shmem: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
}

impl ProcUsage {
    /// Reads `/proc/<pid>/status` and counts `/proc/<pid>/fd`; `None` when
    /// the process is gone.
    pub fn of(pid: u32) -> Option<ProcUsage> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(ProcUsage {
            rss: field("VmRSS:") * 1024,
            anon: field("RssAnon:") * 1024,
            shmem: field("RssShmem:") * 1024,
            fds,
            threads: field("Threads:"),
        })
    }

    fn add(&mut self, o: ProcUsage) {
        self.rss += o.rss;
        self.anon += o.anon;
        self.shmem += o.shmem;
        self.fds += o.fds;
        self.threads += o.threads;
    }
}

/// One resource snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosSnapshot {
    /// Seconds since the traffic started.
    pub t_s: f64,
    /// The never-killed owner and consumer, summed (the flatness reference).
    pub reference: ProcUsage,
    /// Every worker alive at that moment, summed.
    pub all: ProcUsage,
    /// The driver process itself.
    pub driver: ProcUsage,
    /// Worker processes alive.
    pub workers: usize,
    /// `/dev/shm` entries with this run's prefix.
    pub shm_entries: usize,
    /// Per worker (`owner-0`...): its usage.
    pub per_worker: BTreeMap<String, ProcUsage>,
    /// Fetches so far.
    pub fetches: u64,
}

/// Reloads over the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadCounts {
    /// Reload rounds (every worker reloaded).
    pub rounds: u64,
    /// Reloads applied.
    pub applied: u64,
    /// Reloads of a valid config refused (unexpected; samples below).
    pub refused: u64,
    /// Probes with a config that must be refused (a changed `node.name`).
    pub probes: u64,
    /// Probes refused, as they must be.
    pub probes_refused: u64,
    /// Reloads cut short by a kill.
    pub interrupted: u64,
    /// Some refusal messages.
    pub samples: Vec<String>,
}

/// The chaos soak's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Seconds of traffic.
    pub duration_s: f64,
    /// The seed.
    pub seed: u64,
    /// Owner processes.
    pub owners: usize,
    /// Consumer processes.
    pub consumers: usize,
    /// This run's `segment-prefix`.
    pub segment_prefix: String,
    /// Puts done.
    pub puts: u64,
    /// Fetches that returned bytes (every one checked).
    pub fetches: u64,
    /// Bytes those fetches returned.
    pub fetched_bytes: u64,
    /// Bytes of fetches that did not match the owner's pattern (all bytes
    /// of such a fetch count): must be 0.
    pub wrong_bytes: u64,
    /// Fetches that did not match.
    pub bad_fetches: u64,
    /// Fetches by the transport that served them.
    pub served_by: BTreeMap<String, u64>,
    /// Fetches by kind (`view`, `copy`, `copy_into`).
    pub fetch_kinds: BTreeMap<String, u64>,
    /// Failed fetches by what had happened to the shard (`live`: the owner
    /// was alive and the shard not removed; `owner_killed`; `removed`), then
    /// by error kind.
    pub fetch_errors: BTreeMap<String, BTreeMap<String, u64>>,
    /// Failed puts by error kind (an owner's kill during a put is not one).
    pub put_errors: BTreeMap<String, u64>,
    /// Some error messages of failed fetches of live shards and failed puts.
    pub error_samples: Vec<String>,
    /// SIGKILLs by role.
    pub kills: BTreeMap<String, u64>,
    /// Workers restarted after a kill.
    pub restarts: u64,
    /// Requests cut short by a kill of the worker serving them.
    pub interrupted_calls: u64,
    /// Workers that exited without being killed (crashes): must be 0.
    pub unexpected_exits: u64,
    /// Reloads.
    pub reloads: ReloadCounts,
    /// Drain-and-sweep rounds during the run.
    pub sweeps: u64,
    /// What those sweeps reclaimed, summed over workers and transports.
    pub swept_during_run: BTreeMap<String, u64>,
    /// What the final sweep (a fresh process, after every worker was
    /// killed) reclaimed, summed over transports.
    pub final_sweep: BTreeMap<String, u64>,
    /// `/dev/shm` entries with this run's prefix just before the final sweep.
    pub segments_before_final_sweep: usize,
    /// This run's `/dev/shm` entries left after the final sweep: must be 0.
    pub leaked_segments: usize,
    /// Their names.
    pub leaked_names: Vec<String>,
    /// Reference RSS (never-killed owner + consumer), bytes, at the start.
    pub rss_start: u64,
    /// ... at the mark (the 5-minute snapshot in a long run).
    pub rss_mark: u64,
    /// ... at the end.
    pub rss_end: u64,
    /// Reference private memory, bytes, at the start, the mark and the end.
    pub anon_start: u64,
    /// See `anon_start`.
    pub anon_mark: u64,
    /// See `anon_start`.
    pub anon_end: u64,
    /// Reference open fds at the start.
    pub fds_start: u64,
    /// ... at the mark.
    pub fds_mark: u64,
    /// ... at the end.
    pub fds_end: u64,
    /// Reference threads at the start, the mark and the end.
    pub threads_start: u64,
    /// See `threads_start`.
    pub threads_mark: u64,
    /// See `threads_start`.
    pub threads_end: u64,
    /// When the mark snapshot was taken, seconds.
    pub mark_s: f64,
    /// RSS and fds at the end within 10% of the mark.
    pub flat: bool,
    /// Every snapshot.
    pub snapshots: Vec<ChaosSnapshot>,
}

impl ChaosReport {
    /// What makes the run fail, in words (empty: it passed).
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.wrong_bytes > 0 {
            out.push(format!(
                "{} wrong bytes in {} fetches",
                self.wrong_bytes, self.bad_fetches
            ));
        }
        if self.leaked_segments > 0 {
            out.push(format!(
                "{} segments leaked after the final sweep: {}",
                self.leaked_segments,
                self.leaked_names.join(", ")
            ));
        }
        if self.unexpected_exits > 0 {
            out.push(format!(
                "{} workers exited without being killed",
                self.unexpected_exits
            ));
        }
        if self.reloads.probes_refused < self.reloads.probes {
            out.push(format!(
                "{} reloads that must be refused were applied",
                self.reloads.probes - self.reloads.probes_refused
            ));
        }
        out
    }

    /// SVG plot of the reference RSS and fds (and all workers') over time.
    pub fn svg(&self) -> String {
        super::plot::svg(self)
    }
}

fn within_10pct(mark: u64, end: u64) -> bool {
    (end as f64) <= (mark as f64) * 1.1 && (end as f64) >= (mark as f64) * 0.9
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "chaos soak: {:.0} s, {} owners, {} consumers, seed {}, segment prefix {}",
            self.duration_s, self.owners, self.consumers, self.seed, self.segment_prefix
        )?;
        writeln!(
            f,
            "{:>8} {:>9} {:>26} {:>17} {:>17} {:>8} {:>8}",
            "t (s)",
            "workers",
            "ref RSS (anon/shm) MiB",
            "ref fds/threads",
            "all RSS MiB/fds",
            "shm",
            "fetches"
        )?;
        for s in &self.snapshots {
            writeln!(
                f,
                "{:>8.0} {:>9} {:>26} {:>17} {:>17} {:>8} {:>8}",
                s.t_s,
                s.workers,
                format!(
                    "{:.1} ({:.1}/{:.1})",
                    mib(s.reference.rss),
                    mib(s.reference.anon),
                    mib(s.reference.shmem)
                ),
                format!("{}/{}", s.reference.fds, s.reference.threads),
                format!("{:.1}/{}", mib(s.all.rss), s.all.fds),
                s.shm_entries,
                s.fetches
            )?;
        }
        writeln!(
            f,
            "fetches {} ({:.1} MiB), wrong bytes {}, puts {}; served by {:?}; kinds {:?}",
            self.fetches,
            mib(self.fetched_bytes),
            self.wrong_bytes,
            self.puts,
            self.served_by,
            self.fetch_kinds
        )?;
        writeln!(
            f,
            "fetch errors {:?}; put errors {:?}",
            self.fetch_errors, self.put_errors
        )?;
        writeln!(
            f,
            "kills {:?}, restarts {}, calls cut short {}, unexpected exits {}",
            self.kills, self.restarts, self.interrupted_calls, self.unexpected_exits
        )?;
        writeln!(
            f,
            "reloads: {} rounds, {} applied, {} refused, {}/{} bad-config probes refused, {} cut short by a kill",
            self.reloads.rounds,
            self.reloads.applied,
            self.reloads.refused,
            self.reloads.probes_refused,
            self.reloads.probes,
            self.reloads.interrupted
        )?;
        writeln!(
            f,
            "sweeps {}: reclaimed {:?}; final sweep ({} segments before): {:?}; leaked segments {}",
            self.sweeps,
            self.swept_during_run,
            self.segments_before_final_sweep,
            self.final_sweep,
            self.leaked_segments
        )?;
        writeln!(
            f,
            "reference (owner-0 + consumer-0, never killed): RSS {:.1} / {:.1} / {:.1} MiB, \
             private {:.1} / {:.1} / {:.1} MiB, fds {} / {} / {}, threads {} / {} / {} \
             (start / mark at {:.0} s / end): {}",
            mib(self.rss_start),
            mib(self.rss_mark),
            mib(self.rss_end),
            mib(self.anon_start),
            mib(self.anon_mark),
            mib(self.anon_end),
            self.fds_start,
            self.fds_mark,
            self.fds_end,
            self.threads_start,
            self.threads_mark,
            self.threads_end,
            self.mark_s,
            if self.flat {
                "flat (end within 10% of the mark)"
            } else {
                "NOT FLAT (end beyond 10% of the mark)"
            }
        )?;
        let failures = self.failures();
        if failures.is_empty() {
            writeln!(f, "PASS: 0 wrong bytes, 0 leaked segments")
        } else {
            writeln!(f, "FAIL: {}", failures.join("; "))
        }
    }
}

/// Adds every numeric field of a sweep reply (`{transport: {counter: n}}`)
/// to `into`.
fn add_swept(into: &mut BTreeMap<String, u64>, swept: Option<&serde_json::Value>) {
    let Some(serde_json::Value::Object(per_transport)) = swept else {
        return;
    };
    for v in per_transport.values() {
        if let serde_json::Value::Object(counters) = v {
            for (k, n) in counters {
                if let Some(n) = n.as_u64() {
                    *into.entry(k.clone()).or_default() += n;
                }
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

    /// Rewrites every worker's config for the next generation and reloads
    /// each one; then one worker is sent a config it must refuse.
    fn reload_round(&mut self) -> Result<(), String> {
        self.generation += 1;
        self.report.reloads.rounds += 1;
        for i in 0..self.fleet.slots.len() {
            let s = &self.fleet.slots[i];
            let text = config_text(
                self.opts,
                &self.prefix,
                s.role,
                s.index,
                self.generation,
                true,
            );
            write_atomic(&s.config, &text)?;
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
        let s = &self.fleet.slots[i];
        let bad = config_text(
            self.opts,
            &self.prefix,
            s.role,
            s.index,
            self.generation,
            true,
        )
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

/// Fills the start / mark / end fields from the snapshots.
fn summarize(r: &mut ChaosReport, mark: Duration) {
    let (Some(first), Some(last)) = (r.snapshots.first(), r.snapshots.last()) else {
        return;
    };
    let at_mark = r
        .snapshots
        .iter()
        .find(|s| s.t_s >= mark.as_secs_f64())
        .unwrap_or(last);
    let (a, m, e) = (first.reference, at_mark.reference, last.reference);
    r.mark_s = at_mark.t_s;
    (r.rss_start, r.rss_mark, r.rss_end) = (a.rss, m.rss, e.rss);
    (r.anon_start, r.anon_mark, r.anon_end) = (a.anon, m.anon, e.anon);
    (r.fds_start, r.fds_mark, r.fds_end) = (a.fds, m.fds, e.fds);
    (r.threads_start, r.threads_mark, r.threads_end) = (a.threads, m.threads, e.threads);
    r.flat = within_10pct(m.rss, e.rss) && within_10pct(m.fds, e.fds);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ChaosOptions {
        ChaosOptions::new("shardport".into(), "/nonexistent".into())
    }

    #[test]
    fn configs_parse_at_every_generation() {
        let o = opts();
        for generation in 0..12 {
            for role in [Role::Owner, Role::Consumer] {
                let text = config_text(&o, "chaos1x0", role, 1, generation, generation % 2 == 0);
                let parsed: toml::Value = toml::from_str(&text).expect("valid TOML");
                assert_eq!(
                    parsed["node"]["name"].as_str(),
                    Some(&*format!("chaos-{role}-1"))
                );
            }
        }
        // The weights, cache limit and routes change between generations.
        let a = config_text(&o, "p", Role::Consumer, 0, 0, true);
        let b = config_text(&o, "p", Role::Consumer, 0, 1, true);
        assert_ne!(a, b);
    }

    #[test]
    fn rng_is_seeded_and_jitter_bounded() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
            let j = a.jitter(Duration::from_secs(10));
            assert_eq!(j, b.jitter(Duration::from_secs(10)));
            assert!(j >= Duration::from_secs(5) && j <= Duration::from_secs(15));
            assert!(a.below(3) < 3);
            b.below(3);
        }
    }

    #[test]
    fn prefix_is_a_valid_segment_prefix() {
        let p = run_prefix(42);
        assert!(p.len() <= 32, "{p}");
        assert!(p.chars().next().is_some_and(|c| c.is_ascii_alphabetic()));
        assert!(p.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(p, run_prefix(42));
    }

    #[test]
    fn summary_compares_the_end_with_the_mark() {
        let snap = |t_s: f64, rss: u64, fds: u64| ChaosSnapshot {
            t_s,
            reference: ProcUsage {
                rss,
                fds,
                ..ProcUsage::default()
            },
            all: ProcUsage::default(),
            driver: ProcUsage::default(),
            workers: 2,
            shm_entries: 0,
            per_worker: BTreeMap::new(),
            fetches: 0,
        };
        let mut r = run_report_for_tests();
        r.snapshots = vec![
            snap(0.0, 10, 10),
            snap(300.0, 100, 40),
            snap(600.0, 105, 41),
        ];
        summarize(&mut r, Duration::from_secs(300));
        assert_eq!((r.rss_start, r.rss_mark, r.rss_end), (10, 100, 105));
        assert!(r.flat);
        r.snapshots.push(snap(900.0, 150, 41));
        summarize(&mut r, Duration::from_secs(300));
        assert!(!r.flat);
        assert!(r.failures().is_empty());
        r.leaked_segments = 1;
        r.wrong_bytes = 4096;
        assert_eq!(r.failures().len(), 2);
    }

    fn run_report_for_tests() -> ChaosReport {
        ChaosReport::default()
    }
}
