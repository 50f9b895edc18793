//! Is a lease holder still alive? The decision behind the owner's
//! reclamation of dead consumers' leases (see `board`, "Reclaiming").
//!
//! A small, self-contained version of the rules posix-shm's `liveness`
//! follows (that module is private to its crate); no `unsafe` here.
//!
//! # Identity
//! A consumer records who it is in its lease record as a [`Holder`]: its pid
//! and start time (clock ticks since boot, `/proc/<pid>/stat` field 22) as it
//! sees them in its own PID namespace, and the inodes of its PID and time
//! namespaces. The boot is implied: a board is kernel memory of this boot.
//!
//! # Proof of death
//! [`judge`] says [`Verdict::Dead`] only with proof, and only for a holder
//! recorded in *our* PID namespace, where its pid means the same process to
//! us as to it:
//! - `kill(pid, 0)` fails with `ESRCH`: no such process;
//! - or `/proc/<pid>/stat` shows another start time: the pid was reused.
//!   `/proc` is read only when it belongs to our PID namespace and the time
//!   namespaces agree (start times are shifted by a time namespace's offset).
//!
//! Everything else is [`Verdict::Unknown`], which every caller treats as
//! alive: another or an unknown PID namespace, an unknown field, an
//! unreadable `/proc`, a failed probe, and a zombie (state `Z`): a process
//! that exited but is not reaped yet looks exactly like one whose main
//! thread called `pthread_exit` while its other threads still run (and read
//! the device memory), so its lease waits until its parent reaps it.

use std::os::unix::fs::MetadataExt;

use rustix::{io::Errno, process};

/// Inodes of a process's PID and time namespaces; 0 when unknown (for the
/// time namespace also: a kernel without time namespaces, before 5.6).
/// Namespace inodes are 32-bit in Linux (`ns_common::inum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Namespaces {
    /// PID namespace inode.
    pub pid: u32,
    /// Time namespace inode.
    pub time: u32,
}

impl Namespaces {
    /// This process's namespaces, from `/proc/self/ns`.
    pub fn current() -> Namespaces {
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
    pub fn to_word(self) -> u64 {
        u64::from(self.pid) | u64::from(self.time) << 32
    }

    /// Inverse of [`to_word`](Self::to_word).
    pub fn from_word(w: u64) -> Namespaces {
        Namespaces {
            pid: w as u32,
            time: (w >> 32) as u32,
        }
    }
}

/// Who holds a lease, as it recorded itself. Zero in any field means unknown
/// (and then it is never judged dead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Holder {
    /// Pid in its own PID namespace.
    pub pid: u32,
    /// Start time, clock ticks since boot, as read in its own time namespace.
    pub start_ticks: u64,
    /// Its namespaces.
    pub ns: Namespaces,
}

/// This process: its own record, and whether our `/proc` shows our PID
/// namespace (so `/proc/<pid>` means what `kill(pid, 0)` means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Here {
    /// This process as a lease holder.
    pub holder: Holder,
    /// `/proc` belongs to our PID namespace.
    pub proc_is_ours: bool,
}

impl Here {
    /// Reads this process's identity from `/proc`. Parts that cannot be read
    /// stay 0, and then nothing recorded with them is ever judged dead.
    pub fn current() -> Here {
        let pid = std::process::id();
        let start_ticks = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .map_or(0, |s| s.start_ticks);
        let proc_is_ours = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| nspid_is_ours(&s, pid))
            // Kernels before 4.1 have no NSpid line: /proc/self then names
            // us by our pid in the namespace /proc belongs to.
            .unwrap_or_else(|| {
                std::fs::read_link("/proc/self")
                    .is_ok_and(|p| p.as_os_str() == pid.to_string().as_str())
            });
        Here {
            holder: Holder {
                pid,
                start_ticks,
                ns: Namespaces::current(),
            },
            proc_is_ours,
        }
    }
}

/// What `/proc/<pid>/stat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `Z`, ...
    pub state: u8,
    /// Field 22.
    pub start_ticks: u64,
}

/// State and start time from the text of a `/proc/<pid>/stat` file.
pub fn parse_stat(stat: &str) -> Option<Stat> {
    // Field 2 (comm) is parenthesised and may contain spaces or `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // Field 22 is the 19th after field 3.
    let start_ticks = fields.nth(22 - 4)?.parse().ok()?;
    Some(Stat { state, start_ticks })
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

/// What [`judge`] concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Running with the recorded start time.
    Alive,
    /// Proved gone (the reason, for logs).
    Dead(&'static str),
    /// Cannot tell (the reason, for debug logs). Treated as alive.
    Unknown(&'static str),
}

/// What `/proc/<pid>/stat` gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcStat {
    /// Read and parsed.
    Found(Stat),
    /// No such file (the process is gone, or hidden by `hidepid`).
    Missing,
    /// Present but unreadable or unparsable.
    Unreadable,
}

/// The two questions [`judge`] asks the system, as a trait so the decision
/// table is tested with fabricated answers.
pub trait Probe {
    /// `kill(pid, 0)`: `Some(false)` only when no such process exists.
    fn exists(&self, pid: u32) -> Option<bool>;
    /// `/proc/<pid>/stat` as our `/proc` shows it.
    fn stat(&self, pid: u32) -> ProcStat;
}

/// The real system.
#[derive(Debug, Clone, Copy)]
pub struct System;

impl Probe for System {
    fn exists(&self, pid: u32) -> Option<bool> {
        let pid = i32::try_from(pid).ok().and_then(process::Pid::from_raw)?;
        match process::test_kill_process(pid) {
            Ok(()) | Err(Errno::PERM) => Some(true),
            Err(Errno::SRCH) => Some(false),
            Err(_) => None,
        }
    }

    fn stat(&self, pid: u32) -> ProcStat {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => parse_stat(&s).map_or(ProcStat::Unreadable, ProcStat::Found),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ProcStat::Missing,
            Err(_) => ProcStat::Unreadable,
        }
    }
}

/// Is the process `rec` describes alive, seen from `here`? Dead only with
/// proof; see the module docs for the rules.
pub fn judge(rec: &Holder, here: &Here, probe: &impl Probe) -> Verdict {
    let me = &here.holder;
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
        Some(false) => return Verdict::Dead("exited"),
        None => return Verdict::Unknown("kill(pid, 0) failed"),
        Some(true) => {}
    }
    if !here.proc_is_ours {
        return Verdict::Unknown("/proc belongs to another PID namespace");
    }
    if rec.ns.time != me.ns.time {
        return Verdict::Unknown("recorded in another time namespace");
    }
    match probe.stat(rec.pid) {
        ProcStat::Found(s) if s.start_ticks != rec.start_ticks => {
            Verdict::Dead("exited, its pid now belongs to another process")
        }
        ProcStat::Found(s) if matches!(s.state, b'Z' | b'X') => {
            Verdict::Unknown("a zombie: exited, or only its main thread did; judged once reaped")
        }
        ProcStat::Found(_) => Verdict::Alive,
        // kill saw it, /proc does not: hidden (hidepid) or just exiting.
        ProcStat::Missing | ProcStat::Unreadable => {
            Verdict::Unknown("the pid exists but its /proc entry cannot be read")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        exists: Option<bool>,
        stat: ProcStat,
    }

    impl Probe for Fake {
        fn exists(&self, _pid: u32) -> Option<bool> {
            self.exists
        }
        fn stat(&self, _pid: u32) -> ProcStat {
            self.stat
        }
    }

    const HERE: Here = Here {
        holder: Holder {
            pid: 10,
            start_ticks: 500,
            ns: Namespaces { pid: 7, time: 8 },
        },
        proc_is_ours: true,
    };

    const REC: Holder = Holder {
        pid: 42,
        start_ticks: 900,
        ns: Namespaces { pid: 7, time: 8 },
    };

    fn running(state: u8, start_ticks: u64) -> Fake {
        Fake {
            exists: Some(true),
            stat: ProcStat::Found(Stat { state, start_ticks }),
        }
    }

    #[test]
    fn the_decision_table() {
        let gone = Fake {
            exists: Some(false),
            stat: ProcStat::Missing,
        };
        assert_eq!(judge(&REC, &HERE, &running(b'S', 900)), Verdict::Alive);
        assert!(matches!(judge(&REC, &HERE, &gone), Verdict::Dead(_)));
        assert!(matches!(
            judge(&REC, &HERE, &running(b'R', 901)),
            Verdict::Dead(_)
        ));
        // A zombie leader may still have running threads: never dead.
        assert!(matches!(
            judge(&REC, &HERE, &running(b'Z', 900)),
            Verdict::Unknown(_)
        ));
        // Nothing is judged across PID namespaces or with unknown fields,
        // not even a pid that does not exist here.
        for rec in [
            Holder {
                ns: Namespaces { pid: 9, time: 8 },
                ..REC
            },
            Holder {
                ns: Namespaces { pid: 0, time: 8 },
                ..REC
            },
            Holder { pid: 0, ..REC },
            Holder {
                start_ticks: 0,
                ..REC
            },
        ] {
            assert!(matches!(judge(&rec, &HERE, &gone), Verdict::Unknown(_)));
            assert!(matches!(
                judge(&rec, &HERE, &running(b'Z', 1)),
                Verdict::Unknown(_)
            ));
        }
        // A failed probe, or a pid kill sees and /proc hides, proves nothing.
        for stat in [ProcStat::Missing, ProcStat::Unreadable] {
            let f = Fake {
                exists: Some(true),
                stat,
            };
            assert!(matches!(judge(&REC, &HERE, &f), Verdict::Unknown(_)));
        }
        let failed = Fake {
            exists: None,
            stat: ProcStat::Missing,
        };
        assert!(matches!(judge(&REC, &HERE, &failed), Verdict::Unknown(_)));
        // /proc of another namespace, or another time namespace: start
        // times are not compared; ESRCH still proves death.
        let foreign = Here {
            proc_is_ours: false,
            ..HERE
        };
        assert!(matches!(
            judge(&REC, &foreign, &running(b'Z', 1)),
            Verdict::Unknown(_)
        ));
        assert!(matches!(judge(&REC, &foreign, &gone), Verdict::Dead(_)));
        let other_time = Holder {
            ns: Namespaces { pid: 7, time: 3 },
            ..REC
        };
        assert!(matches!(
            judge(&other_time, &HERE, &running(b'R', 1)),
            Verdict::Unknown(_)
        ));
    }

    #[test]
    fn parsing() {
        let stat =
            "7560 (c a) t) Z 7556 7556 6613 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 72317 3133440";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                state: b'Z',
                start_ticks: 72317
            })
        );
        assert_eq!(parse_stat("1 (x) R"), None);
        assert_eq!(nspid_is_ours("Name:\tx\nNSpid:\t12\n", 12), Some(true));
        assert_eq!(nspid_is_ours("NSpid:\t900\t12\n", 12), Some(false));
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
        let me = here.holder;
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_ticks > 0 && me.ns.pid != 0, "{me:?}");
        assert!(here.proc_is_ours);
        assert_eq!(judge(&me, &here, &System), Verdict::Alive);
        let reused = Holder {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(matches!(judge(&reused, &here, &System), Verdict::Dead(_)));
    }
}
