//! The dead-owner sweep: removing the segments that owners which died
//! (`SIGKILL`, the OOM killer, a crash) left in `/dev/shm`.
//!
//! # What is swept
//! The sweep lists `/dev/shm` and considers only names that
//! [`names::parse_owned`] reads completely with *our* configured prefix:
//! another prefix, an older name shape or a node tag of another shape is
//! never touched. Names are grouped by the owner they record (pid, start
//! time, namespaces, boot), each owner is judged once (see `liveness`; a
//! pidfd also catches an owner that exited but is not reaped yet), and
//! a segment is unlinked only when its owner is provably dead: the owner
//! recorded our boot and our PID namespace, and no process has its pid, or
//! a process with a later start time does. A live owner's segments, and
//! those of owners we cannot judge (another PID namespace, another boot,
//! unreadable `/proc`), are left alone. Each name is judged by itself, so a
//! data segment whose board is already gone is swept like any other.
//!
//! Only regular files owned by our effective uid are unlinked (the sticky
//! `/dev/shm` would refuse the others anyway). Each unlink is logged at
//! info with the name and the dead pid.
//!
//! # Races
//! A dead owner creates nothing more, and its names embed its pid and start
//! time, which no later process shares, so no new segment can appear under
//! a name judged dead. Two sweepers may race for a name: the loser gets
//! `ENOENT`, which is not counted. A consumer that still maps a swept
//! segment keeps a valid mapping; the kernel frees the pages with the last
//! mapping.
//!
//! Sweeping never fails the caller's request: a name that cannot be
//! examined or unlinked is logged and skipped. Only a `/dev/shm` that cannot
//! be listed is an error, for `Transport::sweep` to report.

use std::{collections::HashMap, os::unix::fs::MetadataExt, path::Path};

use rustix::io::Errno;

use crate::{
    liveness::{Death, Here, ProcessRecord, Verdict, Watcher},
    names,
    sys::{self},
};

/// Where `shm_open` names live on Linux.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// What one sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Segments unlinked.
    pub segments: u64,
    /// `/dev/shm` space they occupied: allocated pages (`st_blocks`), not
    /// their sparse size.
    pub bytes: u64,
}

/// One segment the sweep would remove, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Orphan {
    /// The `/dev/shm` entry (without the leading `/`).
    pub entry: String,
    pub owner: ProcessRecord,
    pub death: Death,
}

/// Decides which of `entries` (names in `/dev/shm`) are orphans of dead
/// owners with `prefix`, asking `verdict` once per owner. Pure but for
/// `verdict`, so the decision is tested with fabricated processes.
pub(crate) fn orphans<'a>(
    entries: impl IntoIterator<Item = &'a str>,
    prefix: &str,
    mut verdict: impl FnMut(&ProcessRecord) -> Verdict,
) -> Vec<Orphan> {
    let mut by_owner: HashMap<ProcessRecord, Vec<&str>> = HashMap::new();
    for entry in entries {
        if let Some(name) = names::parse_owned(entry, prefix) {
            by_owner.entry(name.owner).or_default().push(entry);
        }
    }
    let mut out = Vec::new();
    for (owner, entries) in by_owner {
        match verdict(&owner) {
            Verdict::Dead(death) => out.extend(entries.into_iter().map(|e| Orphan {
                entry: e.to_owned(),
                owner,
                death,
            })),
            Verdict::Alive => {}
            Verdict::Unknown(why) => {
                tracing::debug!(target: "posix_shm", pid = owner.pid, segments = entries.len(), why, "leaving segments of an owner that cannot be judged");
            }
        }
    }
    out.sort_by(|a, b| a.entry.cmp(&b.entry));
    out
}

/// Lists `/dev/shm` and unlinks every segment with `prefix` whose owner is
/// provably dead. `Err` only when `/dev/shm` cannot be listed.
pub(crate) fn sweep_dead_owners(prefix: &str, here: &Here) -> std::io::Result<Swept> {
    let dir = Path::new(SHM_DIR);
    let entries: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let uid = sys::effective_uid();
    let mut swept = Swept::default();
    // A watcher, not bare `judge`: its pidfd also sees an exited owner that
    // its parent has not reaped yet (a zombie) as dead.
    let mut watcher = Watcher::default();
    let found = orphans(entries.iter().map(String::as_str), prefix, |owner| {
        watcher.verdict(owner, here, std::time::Instant::now())
    });
    for orphan in found {
        let meta = match std::fs::symlink_metadata(dir.join(&orphan.entry)) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(target: "posix_shm", segment = %orphan.entry, error = %e, "cannot examine a dead owner's segment");
                continue;
            }
        };
        if !meta.file_type().is_file() || meta.uid() != uid {
            tracing::debug!(target: "posix_shm", segment = %orphan.entry, uid = meta.uid(), "not a segment of ours, left alone");
            continue;
        }
        let bytes = meta.blocks().saturating_mul(512);
        match sys::unlink_segment(&format!("/{}", orphan.entry)) {
            Ok(()) => {
                swept.segments += 1;
                swept.bytes += bytes;
                tracing::info!(
                    target: "posix_shm",
                    segment = %orphan.entry,
                    pid = orphan.owner.pid,
                    death = %orphan.death,
                    bytes,
                    "swept a segment of a dead owner"
                );
            }
            // Another sweeper was first.
            Err(e) if e.errno == Errno::NOENT => {}
            Err(e) => {
                tracing::warn!(target: "posix_shm", segment = %orphan.entry, pid = orphan.owner.pid, error = %e, "cannot unlink a dead owner's segment");
            }
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::{judge, tests::Fake, Namespaces};
    use crate::names::{identity, NameGen};
    use shardport_kit::lease::liveness::ProcStart;

    const HERE: Here = Here {
        process: ProcessRecord {
            pid: 10,
            start_ticks: 500,
            ns: Namespaces { pid: 7, time: 8 },
            boot: 0xb007,
        },
        proc_is_ours: true,
    };

    fn name(prefix: &str, owner: &ProcessRecord, kind: names::Kind) -> String {
        let tag = format!("{}-{}-ab12", owner.pid, owner.start_ticks);
        NameGen::new(prefix, &tag, owner).next(kind)[1..].to_owned()
    }

    #[test]
    fn only_our_prefix_and_exact_shape_and_dead_owners() {
        let dead = ProcessRecord {
            pid: 42,
            start_ticks: 900,
            ..HERE.process
        };
        let other_ns = ProcessRecord {
            ns: Namespaces { pid: 99, time: 8 },
            ..dead
        };
        let other_boot = ProcessRecord {
            boot: 0xb008,
            ..dead
        };
        let id = identity(&dead);
        let entries = [
            name("shardport", &dead, names::Kind::PoolData),
            name("shardport", &dead, names::Kind::Board),
            name("shardport", &dead, names::Kind::Shard),
            name("other", &dead, names::Kind::PoolData),
            name("shardport", &other_ns, names::Kind::PoolData),
            name("shardport", &other_boot, names::Kind::PoolData),
            format!("shardport-{id}-t42-0-abc-p0"),
            "shardport-42-900-ab12-p0".to_owned(),
            format!("shardport-{id}-42-900-ab12-p0.lock"),
            "sem.shardport".to_owned(),
        ];
        let gone = Fake {
            exists: Some(false),
            start: ProcStart::Missing,
        };
        let entries = || entries.iter().map(String::as_str);
        let found = orphans(entries(), "shardport", |o| judge(o, &HERE, &gone));
        let got: Vec<&str> = found.iter().map(|o| o.entry.as_str()).collect();
        let mut want = entries().take(3).collect::<Vec<_>>();
        want.sort();
        assert_eq!(got, want);
        assert!(found
            .iter()
            .all(|o| o.owner == dead && o.death == Death::Exited));

        // The same names, their owner alive: nothing.
        let alive = Fake {
            exists: Some(true),
            start: ProcStart::Ticks(900),
        };
        assert!(orphans(entries(), "shardport", |o| judge(o, &HERE, &alive)).is_empty());

        // Its pid reused by a later process: dead.
        let reused = Fake {
            exists: Some(true),
            start: ProcStart::Ticks(901),
        };
        let found = orphans(entries(), "shardport", |o| judge(o, &HERE, &reused));
        assert_eq!(found.len(), 3);
        assert!(found.iter().all(|o| o.death == Death::PidReused));
    }
}
