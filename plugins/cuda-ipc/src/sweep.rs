//! Removing the lease boards that dead owners left in `/dev/shm`.
//!
//! An owner unlinks its board when its transport is dropped; a process that
//! is killed, or exits without dropping its node (`os._exit`, an interpreter
//! that never collects the node), leaves it behind. [`dead_boards`] runs at
//! start (`sweep-on-start`, the default) and at every `Transport::sweep`
//! (`Node.sweep`, `shardport gc`).
//!
//! # What is removed
//! Only names this plugin makes, read completely:
//! `shardport-cuda-<pid>-<start ticks>-<rest of the host's node tag>`, whose
//! board header says it is a board of this layout and records the owner's
//! namespaces, regular files of our own uid, and only when the kit's `judge_holder`
//! (`shardport_kit::lease::liveness`) proves the owner dead from the pid, start time and namespaces (another
//! PID or time namespace, a zombie, an unreadable `/proc`: left alone). A
//! dead owner creates nothing more, and no later process shares its pid and
//! start time, so nothing new can appear under a name judged dead; a
//! consumer that still maps the board keeps a valid mapping.

use std::os::unix::fs::MetadataExt;

use shardport_kit::lease::liveness::{judge_holder, Here, Holder, System, Verdict};

use crate::{board::Board, descriptor::BOARD_PREFIX, sys::BoardMap};

const SHM_DIR: &str = "/dev/shm";

/// The owner's pid and start time read from a `/dev/shm` entry that is a
/// board name (without the leading `/`), or `None` for any other name.
pub(crate) fn owner_of(entry: &str) -> Option<(u32, u64)> {
    let tag = entry.strip_prefix(BOARD_PREFIX.trim_start_matches('/'))?;
    let mut parts = tag.splitn(3, '-');
    let pid: u32 = parts.next()?.parse().ok()?;
    let start: u64 = parts.next()?.parse().ok()?;
    let rest = parts.next()?;
    let valid = !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    (pid != 0 && start != 0 && valid).then_some((pid, start))
}

/// Unlinks the boards of provably dead owners; returns how many. Never
/// fails: what cannot be listed, opened or judged is logged and left.
pub(crate) fn dead_boards(here: &Here) -> u64 {
    let entries = match std::fs::read_dir(SHM_DIR) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(target: "cuda_ipc", error = %e, "cannot list /dev/shm for dead boards");
            return 0;
        }
    };
    let uid = rustix::process::geteuid().as_raw();
    let mut swept = 0;
    for entry in entries.filter_map(Result::ok) {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Some((pid, start_ticks)) = owner_of(&name) else {
            continue;
        };
        if pid == here.process.pid {
            continue;
        }
        match entry.metadata() {
            Ok(m) if m.file_type().is_file() && m.uid() == uid => {}
            _ => continue,
        }
        let path = format!("/{name}");
        let Ok(map) = BoardMap::open(&path) else {
            continue;
        };
        let Ok(board) = Board::attach(map) else {
            tracing::debug!(target: "cuda_ipc", board = %name, "not a board of this layout, left alone");
            continue;
        };
        let owner = Holder {
            pid,
            start_ticks,
            ns: board.owner_namespaces(),
        };
        drop(board);
        match judge_holder(&owner, here, &System) {
            Verdict::Dead(why) => match rustix::shm::unlink(path.as_str()) {
                Ok(()) => {
                    swept += 1;
                    tracing::info!(target: "cuda_ipc", board = %name, pid, death = %why, "removed the lease board of a dead owner");
                }
                Err(e) => {
                    tracing::debug!(target: "cuda_ipc", board = %name, error = %e, "could not remove a dead owner's board")
                }
            },
            Verdict::Alive => {}
            Verdict::Unknown(why) => {
                tracing::debug!(target: "cuda_ipc", board = %name, pid, why, "left a board whose owner cannot be judged")
            }
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Layout, LAYOUT_VERSION};
    use shardport_kit::lease::liveness::{start_ticks, Namespaces};

    #[test]
    fn reads_only_names_this_plugin_makes() {
        assert_eq!(
            owner_of("shardport-cuda-4242-987654-18a2b3cg0"),
            Some((4242, 987654))
        );
        assert_eq!(
            owner_of("shardport-cuda-4242-987654-18a2b3cg0x1"),
            Some((4242, 987654))
        );
        for other in [
            "shardport-cuda-t1-2-abc",
            "shardport-cuda-4242-987654",
            "shardport-cuda-4242-0-abc",
            "shardport-cuda-0-5-abc",
            "shardport-cuda-4242-5-ABC",
            "shardport-shm-4242-5-abc",
            "cuda.shm.4242",
        ] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    /// A real board of a real process that exited (a child of this test),
    /// one of a live process (this one, under another name shape it owns),
    /// and one whose header records no namespaces: only the first goes.
    #[test]
    fn removes_the_boards_of_dead_owners_only() {
        assert_eq!(LAYOUT_VERSION, b'3');
        let here = Here::current();
        if here.process.ns.pid == 0 || !here.proc_is_ours {
            eprintln!("skipped: this process cannot read its own PID namespace");
            return;
        }
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let make = |pid: u32, start: u64, ns: Namespaces| {
            let name = format!(
                "{BOARD_PREFIX}{pid}-{start}-{:x}g0",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            );
            let layout = Layout {
                slots: 2,
                records: 2,
            };
            let map = BoardMap::create(&name, layout.words()).unwrap();
            let b = Board::init(map, layout);
            b.set_owner_namespaces(ns);
            (name, b)
        };
        let exists = |name: &str| std::path::Path::new(&format!("/dev/shm{name}")).exists();
        // Kept mapped by "its owner" (this test) so their names stay; the
        // owners recorded in the names are what the sweep judges.
        let (dead, dead_board) = make(dead_pid, 12345, here.process.ns);
        let me = std::process::id() + 1_000_000; // no such pid: but no namespaces recorded
        let (unknown, unknown_board) = make(me, 12345, Namespaces::default());
        // A live process (our parent) with its real start time.
        let parent = rustix::process::getppid().map_or(1, |p| p.as_raw_nonzero().get() as u32);
        let parent_start = start_ticks(parent).unwrap_or(1);
        let (alive, alive_board) = make(parent, parent_start, here.process.ns);
        let swept = dead_boards(&here);
        assert!(swept >= 1, "the dead owner's board is swept");
        assert!(!exists(&dead), "{dead} removed");
        assert!(
            exists(&unknown),
            "{unknown}: no namespaces recorded, left alone"
        );
        assert!(exists(&alive), "{alive}: its owner lives");
        // The test's own values own the names and unlink the rest on drop.
        drop((dead_board, unknown_board, alive_board));
        assert!(!exists(&unknown) && !exists(&alive));
    }
}
