//! Is a process still alive? posix-shm's use of the kit's lease-and-liveness
//! core (`shardport_kit::lease::liveness`: identity, proof of death, the boot
//! id), behind dead-consumer lease reclamation, the dead-owner segment sweep
//! and the consumer's dead-owner check.
//!
//! # Identity
//! A process records who it is as a [`ProcessRecord`] (pid, start time,
//! PID and time namespaces, boot id; see the kit for the rules). A segment
//! owner's record is in its segment names (see `names`); a lease holder's
//! is in its lease record (see `board`), where the boot is implied (a lease
//! board is kernel memory of this boot).
//!
//! # Proof of death
//! [`judge`] (the kit's) says [`Verdict::Dead`] only with proof, and only
//! for a record made in *our* boot and *our* PID namespace. A zombie
//! (exited, not yet reaped by its parent) still has its pid and start
//! time, so `judge` alone counts it as alive until it is reaped; a
//! [`Watcher`] knows better through its pidfd.
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
    time::{Duration, Instant},
};

use shardport_abi::{AbiError, PluginResult};
pub(crate) use shardport_kit::lease::liveness::{
    judge, Death, Here, Namespaces, Probe, ProcStart, ProcessRecord, System, Verdict,
};

use crate::sys::PidFd;

/// Processes a [`Watcher`] keeps verdicts (and pidfds) for. A node's
/// consumers watch a handful of owners and owners a few dozen consumers; the
/// bound keeps a process far from its descriptor limit (each live entry holds
/// one pidfd). Beyond it the least recently checked entry is dropped and
/// judged afresh when it comes back.
pub(crate) const MAX_WATCHED: usize = 64;

/// Fails when this process is not the one `here` was read in: a forked
/// child would record its parent's identity in names and lease records,
/// and a sweep that saw the parent die would take them away.
pub(crate) fn check_not_forked(here: &Here) -> PluginResult<()> {
    let now = std::process::id();
    if now == here.process.pid {
        return Ok(());
    }
    Err(AbiError::internal(format!(
        "this posix-shm instance was created in process {} and is used in process {now} \
         (a fork): create a new node in the child",
        here.process.pid
    )))
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
    // An open pidfd is the kernel's word that the pid exists: the
    // judgement's `kill(pid, 0)` would only repeat it.
    let verdict = match fd {
        Some(_) => judge(rec, here, &Exists),
        None => judge(rec, here, &System),
    };
    match (verdict, fd) {
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

/// The real system, for a pid whose pidfd was just opened: it exists.
struct Exists;

impl Probe for Exists {
    fn exists(&self, _pid: u32) -> Option<bool> {
        Some(true)
    }
    fn start_ticks(&self, pid: u32) -> ProcStart {
        System.start_ticks(pid)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use shardport_kit::lease::liveness::{start_ticks, Probe, ProcStart};

    /// A probe with fabricated answers (for the sweep's tests).
    pub(crate) struct Fake {
        pub exists: Option<bool>,
        pub start: ProcStart,
    }

    impl Probe for Fake {
        fn exists(&self, _pid: u32) -> Option<bool> {
            self.exists
        }
        fn start_ticks(&self, _pid: u32) -> ProcStart {
            self.start
        }
    }

    #[test]
    fn this_process_is_watched_alive_and_not_forked() {
        let here = Here::current();
        let me = here.process;
        check_not_forked(&here).unwrap();
        let forked = Here {
            process: ProcessRecord {
                pid: me.pid + 1,
                ..me
            },
            ..here
        };
        let e = check_not_forked(&forked).unwrap_err().to_string();
        assert!(e.contains("(a fork)"), "{e}");
        let reused = ProcessRecord {
            start_ticks: me.start_ticks + 1,
            ..me
        };
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
        let start = start_ticks(child.id());
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
