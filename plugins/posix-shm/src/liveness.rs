//! Is a process still alive? The decision behind dead-consumer lease
//! reclamation, the dead-owner segment sweep and the consumer's dead-owner
//! check.
//!
//! # Identity
//! A process records who it is as a [`ProcessRecord`]: its pid and start
//! time (clock ticks since boot, `/proc/<pid>/stat` field 22) as it sees them
//! in its own PID namespace, the inodes of its PID and time namespaces and
//! the kernel's boot id. A segment owner's record is in its segment names
//! (see `names`); a lease holder's is in its lease slot (see `board`), where
//! the boot is implied (a lease board is kernel memory of this boot).
//!
//! # Proof of death
//! [`judge`] says [`Verdict::Dead`] only with proof, and only for a record
//! made in *our* boot and *our* PID namespace, where its pid means the same
//! process to us as to it:
//! - `kill(pid, 0)` fails with `ESRCH`: no such process ([`Death::Exited`]);
//! - or the pid exists with another start time: it was reused
//!   ([`Death::PidReused`]). Start times are compared only when `/proc` is our
//!   PID namespace's (otherwise `/proc/<pid>` is another process) and the time
//!   namespaces agree (start times are shifted by a time namespace's offset).
//!
//! Everything else is [`Verdict::Unknown`], which every caller treats as
//! alive: another boot, another or an unknown PID namespace, an unreadable
//! `/proc`, a failed probe. A zombie (exited, not yet reaped by its parent)
//! still has its pid and start time, so `judge` alone counts it as alive
//! until it is reaped; a [`Watcher`] knows better through its pidfd.
//!
//! # Watching
//! [`Watcher`] caches verdicts per record for the side that checks the same
//! processes again and again (a consumer its owners, an owner its lease
//! holders): a process judged alive gets a pidfd, bound to it after its
//! start time is re-checked, so later checks are one non-blocking `poll`
//! that no pid reuse can fool. Death is final and cached; `Unknown` is not
//! cached. Where pidfds are unavailable (kernels before 5.3, some sandboxes)
//! a check runs [`judge`] again. A watcher may trust an "alive" verdict for
//! a re-check window (the consumer's `owner-check-interval`): within it a
//! check costs no system call. The caller passes `now`, so the window is
//! tested without sleeping.

use std::{
    collections::HashMap,
    fmt,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use shardport_abi::{AbiError, PluginResult};

use crate::sys::{self, PidFd};

/// Processes a [`Watcher`] keeps verdicts (and pidfds) for. A node's
/// consumers watch a handful of owners and owners a few dozen consumers; the
/// bound keeps a process far from its descriptor limit (each live entry holds
/// one pidfd). Beyond it the least recently checked entry is dropped and
/// judged afresh when it comes back.
pub(crate) const MAX_WATCHED: usize = 64;

/// Inodes of a process's PID and time namespaces; 0 when unknown (for the
/// time namespace also: a kernel without time namespaces, before 5.6).
/// Namespace inodes are 32-bit in Linux (`ns_common::inum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Namespaces {
    pub pid: u32,
    pub time: u32,
}

impl Namespaces {
    /// This process's namespaces, from `/proc/self/ns`.
    pub(crate) fn current() -> Namespaces {
        let ino = |p: &str| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| u32::try_from(m.ino()).ok())
                .unwrap_or(0)
        };
        Namespaces {
            pid: ino("/proc/self/ns/pid"),
            time: ino("/proc/self/ns/time"),
        }
    }

    /// Packed into one board word: PID namespace low, time namespace high.
    pub(crate) fn to_word(self) -> u64 {
        u64::from(self.pid) | u64::from(self.time) << 32
    }

    /// Inverse of [`to_word`](Self::to_word).
    pub(crate) fn from_word(w: u64) -> Namespaces {
        Namespaces {
            pid: w as u32,
            time: (w >> 32) as u32,
        }
    }
}

/// Who a process is, as it recorded itself. Zero in any field means unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct ProcessRecord {
    /// Pid in its own PID namespace.
    pub pid: u32,
    /// Start time, clock ticks since boot, as read in its own time namespace.
    pub start_ticks: u64,
    pub ns: Namespaces,
    /// `/proc/sys/kernel/random/boot_id` as a number.
    pub boot: u128,
}

/// This process: its own record, and whether our `/proc` shows our PID
/// namespace (so `/proc/<pid>` means what `kill(pid, 0)` means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Here {
    pub process: ProcessRecord,
    pub proc_is_ours: bool,
}

impl Here {
    /// Reads this process's identity from `/proc`. Parts that cannot be read
    /// stay 0, and then nothing recorded with them is ever judged dead.
    pub(crate) fn current() -> Here {
        let pid = std::process::id();
        let start_ticks = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat_start_ticks(&s))
            .unwrap_or(0);
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .and_then(|s| parse_boot_id(&s))
            .unwrap_or(0);
        let proc_is_ours = match std::fs::read_to_string("/proc/self/status") {
            Ok(status) => match nspid_is_ours(&status, pid) {
                Some(ours) => ours,
                // Kernels before 4.1 have no NSpid line: /proc/self then
                // names us by our pid in the namespace /proc belongs to.
                None => std::fs::read_link("/proc/self")
                    .is_ok_and(|p| p.as_os_str() == pid.to_string().as_str()),
            },
            Err(_) => false,
        };
        Here {
            process: ProcessRecord {
                pid,
                start_ticks,
                ns: Namespaces::current(),
                boot,
            },
            proc_is_ours,
        }
    }

    /// Fails when this process is not the one the instance was created in:
    /// a forked child would record its parent's identity in names and lease
    /// slots, and a sweep that saw the parent die would take them away.
    pub(crate) fn check_not_forked(&self) -> PluginResult<()> {
        let now = std::process::id();
        if now == self.process.pid {
            return Ok(());
        }
        Err(AbiError::internal(format!(
            "this posix-shm instance was created in process {} and is used in process {now} \
             (a fork): create a new node in the child",
            self.process.pid
        )))
    }
}

/// Start time (field 22) from the text of a `/proc/<pid>/stat` file.
pub(crate) fn parse_stat_start_ticks(stat: &str) -> Option<u64> {
    // Field 2 (comm) is parenthesised and may contain spaces or `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// A boot id (`6b2ad925-277a-4541-9847-21082ff9412d`) as a number.
pub(crate) fn parse_boot_id(text: &str) -> Option<u128> {
    let hex: String = text.trim().chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok().filter(|&b| b != 0)
}

/// From `/proc/self/status`: does `/proc` belong to our PID namespace? Its
/// `NSpid` line lists our pid in every namespace from the one `/proc` belongs
/// to down to our own, so it is ours when that is exactly our own pid.
/// `None` without an `NSpid` line.
fn nspid_is_ours(status: &str, pid: u32) -> Option<bool> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Vec<&str> = line.split_whitespace().collect();
    Some(ids.len() == 1 && ids[0] == pid.to_string())
}

/// How a recorded process is known to have ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Death {
    /// No process has its pid any more.
    Exited,
    /// A process with a later start time has its pid.
    PidReused,
}

impl fmt::Display for Death {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Death::Exited => "exited",
            Death::PidReused => "exited, its pid now belongs to another process",
        })
    }
}

/// What [`judge`] concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Alive,
    Dead(Death),
    /// Cannot tell (the reason, for debug logs). Treated as alive.
    Unknown(&'static str),
}

/// What `/proc/<pid>/stat` says about a start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcStart {
    Ticks(u64),
    /// No such file (the process is gone, or hidden by `hidepid`).
    Missing,
    /// Present but unreadable or unparsable.
    Unreadable,
}

/// The two questions [`judge`] asks the system, as a trait so the decision
/// table is tested with fabricated answers.
pub(crate) trait Probe {
    /// `kill(pid, 0)`: `Some(false)` only when no such process exists.
    fn exists(&self, pid: u32) -> Option<bool>;
    /// Start time of `pid` as our `/proc` shows it.
    fn start_ticks(&self, pid: u32) -> ProcStart;
}

/// The real system.
#[derive(Debug, Clone, Copy)]
pub(crate) struct System;

impl Probe for System {
    fn exists(&self, pid: u32) -> Option<bool> {
        sys::process_exists(pid)
    }

    fn start_ticks(&self, pid: u32) -> ProcStart {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => parse_stat_start_ticks(&s).map_or(ProcStart::Unreadable, ProcStart::Ticks),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ProcStart::Missing,
            Err(_) => ProcStart::Unreadable,
        }
    }
}

/// Is the process `rec` describes alive, seen from `here`? Dead only with
/// proof; see the module docs for the rules.
pub(crate) fn judge(rec: &ProcessRecord, here: &Here, probe: &impl Probe) -> Verdict {
    let me = &here.process;
    if rec.boot == 0 || me.boot == 0 {
        return Verdict::Unknown("boot id unknown");
    }
    if rec.boot != me.boot {
        // /dev/shm is a tmpfs, emptied at boot: a record of another boot is
        // on a filesystem shared with another kernel, whose processes we
        // cannot see.
        return Verdict::Unknown("recorded under another boot (another kernel)");
    }
    if rec.ns.pid == 0 || me.ns.pid == 0 {
        return Verdict::Unknown("PID namespace unknown");
    }
    if rec.ns.pid != me.ns.pid {
        return Verdict::Unknown("recorded in another PID namespace");
    }
    if rec.pid == 0 || rec.start_ticks == 0 {
        return Verdict::Unknown("pid or start time unknown");
    }
    match probe.exists(rec.pid) {
        Some(false) => return Verdict::Dead(Death::Exited),
        None => return Verdict::Unknown("kill(pid, 0) failed"),
        Some(true) => {}
    }
    if !here.proc_is_ours {
        return Verdict::Unknown("/proc belongs to another PID namespace");
    }
    if rec.ns.time != me.ns.time {
        return Verdict::Unknown("recorded in another time namespace");
    }
    match probe.start_ticks(rec.pid) {
        ProcStart::Ticks(t) if t == rec.start_ticks => Verdict::Alive,
        ProcStart::Ticks(_) => Verdict::Dead(Death::PidReused),
        // kill saw it, /proc does not: hidden (hidepid) or just exiting.
        ProcStart::Missing | ProcStart::Unreadable => {
            Verdict::Unknown("the pid exists but its start time cannot be read")
        }
    }
}

#[derive(Debug)]
enum Watch {
    /// Alive, bound to a pidfd.
    Bound(PidFd),
    /// Alive when last judged; no pidfd (re-judged at every check).
    Unbound,
    Dead(Death),
}

#[derive(Debug)]
struct Watched {
    watch: Watch,
    last_used: u64,
    /// When it was last found alive.
    checked_at: Instant,
}

/// Cached verdicts for the processes one side keeps checking. Not shared:
/// each side keeps its own, under its own lock.
#[derive(Debug, Default)]
pub(crate) struct Watcher {
    entries: HashMap<ProcessRecord, Watched>,
    tick: u64,
    /// How long an "alive" verdict is trusted without a system call.
    recheck: Duration,
}

impl Watcher {
    /// A watcher that trusts an "alive" verdict for `recheck` (zero: checks
    /// every time, as `Default` does).
    pub(crate) fn new(recheck: Duration) -> Watcher {
        Watcher {
            recheck,
            ..Watcher::default()
        }
    }

    /// The verdict on `rec` at `now`, from the cache where it can be trusted.
    pub(crate) fn verdict(&mut self, rec: &ProcessRecord, here: &Here, now: Instant) -> Verdict {
        self.tick += 1;
        let tick = self.tick;
        if let Some(w) = self.entries.get_mut(rec) {
            w.last_used = tick;
            let fresh = now.saturating_duration_since(w.checked_at) < self.recheck;
            match &w.watch {
                Watch::Dead(d) => return Verdict::Dead(*d),
                Watch::Bound(_) | Watch::Unbound if fresh => return Verdict::Alive,
                Watch::Bound(fd) => match fd.has_exited() {
                    Some(false) => {
                        w.checked_at = now;
                        return Verdict::Alive;
                    }
                    Some(true) => {
                        w.watch = Watch::Dead(Death::Exited);
                        return Verdict::Dead(Death::Exited);
                    }
                    None => {}
                },
                Watch::Unbound => {}
            }
        }
        let watch = match judge_bound(rec, here) {
            Ok(watch) => watch,
            Err(unknown) => {
                self.entries.remove(rec);
                return unknown;
            }
        };
        let verdict = match watch {
            Watch::Dead(d) => Verdict::Dead(d),
            Watch::Bound(_) | Watch::Unbound => Verdict::Alive,
        };
        if !self.entries.contains_key(rec) {
            // A process not seen before (a consumer restarted, say): first
            // close the pidfds of watched processes that have exited since
            // they were last asked about, so dead processes never keep
            // descriptors (their verdict stays cached, without the fd).
            for w in self.entries.values_mut() {
                if let Watch::Bound(fd) = &w.watch {
                    if fd.has_exited() == Some(true) {
                        w.watch = Watch::Dead(Death::Exited);
                    }
                }
            }
        }
        if !self.entries.contains_key(rec) && self.entries.len() >= MAX_WATCHED {
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, w)| w.last_used)
                .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(
            *rec,
            Watched {
                watch,
                last_used: tick,
                checked_at: now,
            },
        );
        verdict
    }

    /// Processes with a cached entry (for tests and stats).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries holding a pidfd (for tests).
    #[cfg(test)]
    fn bound(&self) -> usize {
        self.entries
            .values()
            .filter(|w| matches!(w.watch, Watch::Bound(_)))
            .count()
    }
}

/// Judges `rec` once and, when it is alive, binds it to a pidfd.
///
/// The pidfd is opened *before* the judgement, so one reading of the start
/// time suffices (it is the costly part: the kernel computes the whole of
/// `/proc/<pid>/stat`): the fd refers to the process X that held the pid
/// when it was opened; the judgement then found the process holding the pid
/// to be the recorded one R; and if X has not exited afterwards, X held the
/// pid the whole time (a pid is not reused while its process, even a
/// zombie, exists), so X is R. A record of another boot or PID namespace
/// is judged `Unknown` before its pid means anything, and the fd opened
/// for it is dropped unused. `Err` carries that `Unknown` verdict.
fn judge_bound(rec: &ProcessRecord, here: &Here) -> Result<Watch, Verdict> {
    // No fd: gone already (the judgement's kill says so too), a thread id,
    // an old kernel or a sandbox (then judged again at every check).
    let fd = PidFd::open(rec.pid).ok();
    match (judge(rec, here, &System), fd) {
        // A zombie still shows its pid and start time; the pidfd already
        // knows it exited.
        (Verdict::Alive, Some(fd)) if fd.has_exited() == Some(true) => {
            Ok(Watch::Dead(Death::Exited))
        }
        (Verdict::Alive, Some(fd)) => Ok(Watch::Bound(fd)),
        (Verdict::Alive, None) => Ok(Watch::Unbound),
        (Verdict::Dead(d), _) => Ok(Watch::Dead(d)),
        (unknown @ Verdict::Unknown(_), _) => Err(unknown),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;

    /// A probe with fabricated answers.
    pub(crate) struct Fake {
        pub exists: Option<bool>,
        pub start: ProcStart,
        pub asked_start: Cell<bool>,
    }

    impl Probe for Fake {
        fn exists(&self, _pid: u32) -> Option<bool> {
            self.exists
        }
        fn start_ticks(&self, _pid: u32) -> ProcStart {
            self.asked_start.set(true);
            self.start
        }
    }

    fn fake(exists: Option<bool>, start: ProcStart) -> Fake {
        Fake {
            exists,
            start,
            asked_start: Cell::new(false),
        }
    }

    const HERE: Here = Here {
        process: ProcessRecord {
            pid: 10,
            start_ticks: 500,
            ns: Namespaces { pid: 7, time: 8 },
            boot: 0xb007,
        },
        proc_is_ours: true,
    };

    const REC: ProcessRecord = ProcessRecord {
        pid: 42,
        start_ticks: 900,
        ns: Namespaces { pid: 7, time: 8 },
        boot: 0xb007,
    };

    #[test]
    fn the_decision_table() {
        use ProcStart::*;
        use Verdict::*;
        let alive = fake(Some(true), Ticks(900));
        let gone = fake(Some(false), Missing);
        let reused = fake(Some(true), Ticks(901));
        assert_eq!(judge(&REC, &HERE, &alive), Alive);
        assert_eq!(judge(&REC, &HERE, &gone), Dead(Death::Exited));
        assert_eq!(judge(&REC, &HERE, &reused), Dead(Death::PidReused));

        // Nothing is judged across a boot or a PID namespace, even a pid
        // that does not exist here (it is another process's pid).
        let cases = [
            ProcessRecord {
                boot: 0xb008,
                ..REC
            },
            ProcessRecord { boot: 0, ..REC },
            ProcessRecord {
                ns: Namespaces { pid: 9, time: 8 },
                ..REC
            },
            ProcessRecord {
                ns: Namespaces { pid: 0, time: 8 },
                ..REC
            },
            ProcessRecord { pid: 0, ..REC },
            ProcessRecord {
                start_ticks: 0,
                ..REC
            },
        ];
        for rec in cases {
            assert!(matches!(judge(&rec, &HERE, &gone), Unknown(_)), "{rec:?}");
            assert!(matches!(judge(&rec, &HERE, &reused), Unknown(_)), "{rec:?}");
        }
        let blind = Here {
            process: ProcessRecord {
                ns: Namespaces { pid: 0, time: 8 },
                ..HERE.process
            },
            ..HERE
        };
        assert!(matches!(judge(&REC, &blind, &gone), Unknown(_)));

        // A failed probe proves nothing.
        assert!(matches!(
            judge(&REC, &HERE, &fake(None, Missing)),
            Unknown(_)
        ));
        // kill sees the pid but /proc does not (hidepid): not dead.
        assert!(matches!(
            judge(&REC, &HERE, &fake(Some(true), Missing)),
            Unknown(_)
        ));
        assert!(matches!(
            judge(&REC, &HERE, &fake(Some(true), Unreadable)),
            Unknown(_)
        ));

        // Start times are compared only through our own /proc, in the same
        // time namespace; ESRCH needs neither.
        let foreign_proc = Here {
            proc_is_ours: false,
            ..HERE
        };
        assert!(matches!(judge(&REC, &foreign_proc, &reused), Unknown(_)));
        assert_eq!(judge(&REC, &foreign_proc, &gone), Dead(Death::Exited));
        let other_time = ProcessRecord {
            ns: Namespaces { pid: 7, time: 3 },
            ..REC
        };
        let probe = fake(Some(true), Ticks(901));
        assert!(matches!(judge(&other_time, &HERE, &probe), Unknown(_)));
        assert!(!probe.asked_start.get());
        assert_eq!(judge(&other_time, &HERE, &gone), Dead(Death::Exited));
    }

    #[test]
    fn parsing() {
        let stat =
            "7560 (c a) t) R 7556 7556 6613 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 72317 3133440";
        assert_eq!(parse_stat_start_ticks(stat), Some(72317));
        assert_eq!(parse_stat_start_ticks("1 (x) R"), None);
        assert_eq!(
            parse_boot_id("6b2ad925-277a-4541-9847-21082ff9412d\n"),
            Some(0x6b2ad925_277a_4541_9847_21082ff9412d)
        );
        assert_eq!(parse_boot_id("6b2ad925"), None);
        assert_eq!(parse_boot_id("zz2ad925-277a-4541-9847-21082ff9412d"), None);
        assert_eq!(nspid_is_ours("Name:\tx\nNSpid:\t12\n", 12), Some(true));
        assert_eq!(nspid_is_ours("NSpid:\t900\t12\n", 12), Some(false));
        assert_eq!(nspid_is_ours("NSpid:\t13\n", 12), Some(false));
        assert_eq!(nspid_is_ours("Name:\tx\n", 12), None);
        let ns = Namespaces {
            pid: 4026531836,
            time: 4026531834,
        };
        assert_eq!(Namespaces::from_word(ns.to_word()), ns);
    }

    #[test]
    fn this_process_knows_itself_and_is_alive() {
        let here = Here::current();
        let me = here.process;
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_ticks > 0 && me.boot != 0 && me.ns.pid != 0);
        assert!(here.proc_is_ours);
        here.check_not_forked().unwrap();
        assert_eq!(judge(&me, &here, &System), Verdict::Alive);
        let reused = ProcessRecord {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert_eq!(
            judge(&reused, &here, &System),
            Verdict::Dead(Death::PidReused)
        );
        let mut w = Watcher::default();
        assert_eq!(w.verdict(&me, &here, Instant::now()), Verdict::Alive);
        assert_eq!(w.verdict(&me, &here, Instant::now()), Verdict::Alive);
        assert_eq!(
            w.verdict(&reused, &here, Instant::now()),
            Verdict::Dead(Death::PidReused)
        );
        assert_eq!(w.len(), 2);
    }

    /// A child that exits at once (this test binary running no test), and
    /// its start time if it could be read before it exited.
    fn short_lived_child() -> (std::process::Child, Option<u64>) {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "liveness::tests::no-such-test", "-q"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .ok()
            .and_then(|s| parse_stat_start_ticks(&s));
        (child, start)
    }

    #[test]
    fn a_watched_child_is_dead_once_it_exits() {
        let here = Here::current();
        let (mut child, start) = short_lived_child();
        let rec = ProcessRecord {
            pid: child.id(),
            start_ticks: start.unwrap_or(1),
            ..here.process
        };
        let mut w = Watcher::default();
        if start.is_some() {
            // Running, or exited and then known through the pidfd.
            let v = w.verdict(&rec, &here, Instant::now());
            assert!(matches!(v, Verdict::Alive | Verdict::Dead(Death::Exited)));
        }
        // Once it exits it is a zombie (not reaped yet), which keeps its pid
        // and start time; the pidfd reports the exit all the same. Bounded
        // wait: the child exits at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut v = w.verdict(&rec, &here, Instant::now());
        while v != Verdict::Dead(Death::Exited) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            v = w.verdict(&rec, &here, Instant::now());
        }
        assert_eq!(
            v,
            Verdict::Dead(Death::Exited),
            "zombie seen through the pidfd"
        );
        child.wait().unwrap();
        assert_eq!(
            w.verdict(&rec, &here, Instant::now()),
            Verdict::Dead(Death::Exited)
        );
        assert_eq!(
            Watcher::default().verdict(&rec, &here, Instant::now()),
            Verdict::Dead(Death::Exited),
            "judged afresh"
        );
    }

    #[test]
    fn a_dead_process_s_pidfd_is_closed_when_a_new_one_is_watched() {
        let here = Here::current();
        let (mut child, start) = short_lived_child();
        let Some(start) = start else {
            // Exited before its start time could be read: nothing to bind.
            child.wait().unwrap();
            return;
        };
        let rec = ProcessRecord {
            pid: child.id(),
            start_ticks: start,
            ..here.process
        };
        let mut w = Watcher::default();
        if w.verdict(&rec, &here, Instant::now()) != Verdict::Alive {
            child.wait().unwrap();
            return; // already gone: never bound
        }
        assert_eq!(w.bound(), 1);
        child.wait().unwrap();
        // Another process is watched: the dead one's pidfd goes, its verdict
        // stays.
        assert_eq!(
            w.verdict(&here.process, &here, Instant::now()),
            Verdict::Alive
        );
        assert_eq!(w.bound(), 1, "only this process's pidfd is left");
        assert_eq!(w.len(), 2);
        assert_eq!(
            w.verdict(&rec, &here, Instant::now()),
            Verdict::Dead(Death::Exited)
        );
    }

    #[test]
    fn the_watcher_is_bounded() {
        let here = Here::current();
        let mut w = Watcher::default();
        for i in 0..(MAX_WATCHED as u64 + 10) {
            let rec = ProcessRecord {
                start_ticks: here.process.start_ticks + 1 + i,
                ..here.process
            };
            assert_eq!(
                w.verdict(&rec, &here, Instant::now()),
                Verdict::Dead(Death::PidReused)
            );
        }
        assert_eq!(w.len(), MAX_WATCHED);
    }
}
