//! Is a process still alive? The decision behind the reclamation of dead
//! consumers' leases (see [`board`](super::board), "Reclaiming"), the sweep
//! of dead owners' segments and a consumer's dead-owner check.
//!
//! # Identity
//! A process records who it is: its pid and start time (clock ticks since
//! boot, `/proc/<pid>/stat` field 22) as it sees them in its own PID
//! namespace, and the inodes of its PID and time namespaces: a [`Holder`].
//! Where the record may outlive the boot (a name on a filesystem another
//! kernel may mount), it adds the kernel's boot id: a [`ProcessRecord`]. In
//! a lease record the boot is implied: a lease board is kernel memory of
//! this boot ([`judge_holder`]).
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
//! alive: another boot, another or an unknown PID namespace, an unknown
//! field, an unreadable `/proc`, a failed probe. A zombie (exited, not yet
//! reaped by its parent) still has its pid and start time, so `judge` counts
//! it as alive until it is reaped. That is also what a zombie *must* be
//! taken for: a process whose main thread called `pthread_exit` while its
//! other threads still run (and read the lent memory) looks exactly like
//! one that exited, so its lease waits until its parent reaps it. A
//! transport that holds a pidfd of the process knows better (the pidfd
//! reports the exit only once the whole thread group is gone).
//!
//! Reclaiming a live holder's lease would let an owner overwrite or free
//! memory the holder still reads, which is why death must be proved, never
//! guessed.

use std::{fmt, os::unix::fs::MetadataExt};

use rustix::{io::Errno, process};

/// Where the kernel publishes its boot id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

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

/// Who a process is within one boot, as it recorded itself (a lease
/// holder's record). Zero in any field means unknown, and then it is never
/// judged dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Holder {
    /// Pid in its own PID namespace.
    pub pid: u32,
    /// Start time, clock ticks since boot, as read in its own time namespace.
    pub start_ticks: u64,
    /// Its namespaces.
    pub ns: Namespaces,
}

impl Holder {
    /// The record of this holder in boot `boot` (for a lease board: the
    /// boot it was created in, a board being kernel memory of that boot).
    pub fn record(&self, boot: u128) -> ProcessRecord {
        ProcessRecord {
            pid: self.pid,
            start_ticks: self.start_ticks,
            ns: self.ns,
            boot,
        }
    }
}

/// Who a process is, as it recorded itself, boot included. Zero in any
/// field means unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProcessRecord {
    /// Pid in its own PID namespace.
    pub pid: u32,
    /// Start time, clock ticks since boot, as read in its own time namespace.
    pub start_ticks: u64,
    /// Its namespaces.
    pub ns: Namespaces,
    /// The kernel's boot id as a number ([`parse_boot_id`]).
    pub boot: u128,
}

impl ProcessRecord {
    /// The record without its boot.
    pub fn holder(&self) -> Holder {
        Holder {
            pid: self.pid,
            start_ticks: self.start_ticks,
            ns: self.ns,
        }
    }
}

/// This process: its own record, and whether our `/proc` shows our PID
/// namespace (so `/proc/<pid>` means what `kill(pid, 0)` means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Here {
    /// This process.
    pub process: ProcessRecord,
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
            .and_then(|s| parse_stat_start_ticks(&s))
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
                boot: boot_id().unwrap_or(0),
            },
            proc_is_ours,
        }
    }

    /// This process as a lease holder (its record without the boot).
    pub fn holder(&self) -> Holder {
        self.process.holder()
    }
}

/// Start time (field 22) from the text of a `/proc/<pid>/stat` file.
pub fn parse_stat_start_ticks(stat: &str) -> Option<u64> {
    // Field 2 (comm) is parenthesised and may contain spaces or `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Start time of process `pid` in clock ticks since boot, as our `/proc`
/// shows it; `None` when it cannot be read.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = read_stat(pid).ok()?;
    parse_stat_start_ticks(&stat)
}

/// The text of `/proc/<pid>/stat`, in as few system calls as the kernel
/// allows: open, one read into a buffer sized for it, close.
/// (`fs::read_to_string` asks the size first, which procfs reports as 0,
/// then reads in doubling pieces from 32 bytes: five reads and a `statx`
/// for a 300-byte file. The first contact with an owner reads this file,
/// so each call counts there.) A file longer than the buffer is read to
/// its end all the same.
pub fn read_stat(pid: u32) -> std::io::Result<String> {
    use std::io::Read;
    /// Larger than any `stat` line: 52 numeric fields and a 16-byte name.
    const TYPICAL: usize = 1024;
    let mut f = std::fs::File::open(format!("/proc/{pid}/stat"))?;
    let mut buf = vec![0u8; TYPICAL];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // procfs returns a whole small file in one read; the next would
        // only say "end". A short read of a file this small is the end.
        if len < buf.len() && len > 0 && buf[len - 1] == b'\n' {
            break;
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A boot id as `/proc` writes it (`6b2ad925-277a-4541-9847-21082ff9412d`,
/// surrounding whitespace allowed) as a number: 32 hex digits, dashes
/// ignored. `None` when malformed. The one parser of boot ids: every
/// transport, and the host, reads them through it.
pub fn parse_boot_id(text: &str) -> Option<u128> {
    let mut v: u128 = 0;
    let mut digits = 0;
    for c in text.trim().chars().filter(|&c| c != '-') {
        if digits == 32 {
            return None;
        }
        v = v << 4 | u128::from(c.to_digit(16)?);
        digits += 1;
    }
    (digits == 32).then_some(v)
}

/// This kernel's boot id ([`BOOT_ID_PATH`]); `None` when it cannot be read
/// or parsed, or is zero (which every record takes for unknown).
pub fn boot_id() -> Option<u128> {
    std::fs::read_to_string(BOOT_ID_PATH)
        .ok()
        .and_then(|s| parse_boot_id(&s))
        .filter(|&b| b != 0)
}

/// A boot id in the form `/proc` writes it: 32 lowercase hex digits in
/// groups of 8, 4, 4, 4 and 12, joined by dashes.
pub fn format_boot_id(boot: u128) -> String {
    let h = format!("{boot:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Death {
    /// No process has its pid any more.
    Exited,
    /// A process with another start time has its pid.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Running (or a zombie not reaped yet) with the recorded start time.
    Alive,
    /// Proved gone.
    Dead(Death),
    /// Cannot tell (the reason, for debug logs). Treated as alive.
    Unknown(&'static str),
}

/// What `/proc/<pid>/stat` says about a start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcStart {
    /// Read and parsed.
    Ticks(u64),
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
    /// Start time of `pid` as our `/proc` shows it.
    fn start_ticks(&self, pid: u32) -> ProcStart;
}

/// The real system.
#[derive(Debug, Clone, Copy)]
pub struct System;

impl Probe for System {
    /// By `kill(pid, 0)` (no signal is sent), in this process's PID
    /// namespace: `Some(false)` only on `ESRCH`, the kernel's proof that no
    /// such process exists; `EPERM` means it exists but belongs to someone
    /// else. `None` for 0 and ids above `i32::MAX`, which `kill` would read
    /// as process groups, and for any other error.
    fn exists(&self, pid: u32) -> Option<bool> {
        let pid = i32::try_from(pid).ok().and_then(process::Pid::from_raw)?;
        match process::test_kill_process(pid) {
            Ok(()) | Err(Errno::PERM) => Some(true),
            Err(Errno::SRCH) => Some(false),
            Err(_) => None,
        }
    }

    fn start_ticks(&self, pid: u32) -> ProcStart {
        match read_stat(pid) {
            Ok(s) => parse_stat_start_ticks(&s).map_or(ProcStart::Unreadable, ProcStart::Ticks),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ProcStart::Missing,
            Err(_) => ProcStart::Unreadable,
        }
    }
}

/// Is the process `rec` describes alive, seen from `here`? Dead only with
/// proof; see the module docs for the rules.
pub fn judge(rec: &ProcessRecord, here: &Here, probe: &impl Probe) -> Verdict {
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
    judge_holder(&rec.holder(), here, probe)
}

/// [`judge`] for a record of this boot, whose boot id is implied rather
/// than recorded (a lease record on a board, which is kernel memory of the
/// boot it was made in; a name in a tmpfs, emptied at boot).
pub fn judge_holder(rec: &Holder, here: &Here, probe: &impl Probe) -> Verdict {
    let me = &here.process;
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

#[cfg(test)]
mod tests;
