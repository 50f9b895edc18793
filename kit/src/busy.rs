//! How busy the machine's cores are right now, for work that only pays
//! while a core is idle: splitting a copy across threads (`copy`), polling
//! a socket instead of sleeping (`poll::core_to_spare`). On a machine whose
//! cores all have work (many processes on few cores), a second copy thread
//! adds no capacity and a polling thread takes a core from one with work. Also the cores this process may
//! use ([`cores`]).
//!
//! The reading is the machine's runnable tasks (the fourth field of
//! `/proc/loadavg`, which counts the caller) against its online cores
//! (`/sys/devices/system/cpu/online`). Both are the whole machine's, not a
//! cgroup's (`/proc/loadavg` is not per cgroup), so they are compared with
//! each other. A reading is used for [`CHECK_EVERY`] in a process (it
//! costs a few microseconds: an open, a read and a close). `None` where
//! the files cannot be read: callers then act as if cores were idle, as
//! before this check.

use std::{
    num::NonZeroUsize,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

/// How long one reading of the machine's runnable tasks is used.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(1);

/// The machine's runnable tasks (the caller included) and online cores, at
/// most [`CHECK_EVERY`] old.
pub(crate) fn load() -> Option<(usize, usize)> {
    static LAST: Mutex<Option<(Instant, Option<usize>)>> = Mutex::new(None);
    let running = {
        let mut last = crate::lock(&LAST);
        let now = Instant::now();
        match *last {
            Some((at, running)) if now.duration_since(at) < CHECK_EVERY => running,
            _ => {
                let running = std::fs::read_to_string("/proc/loadavg")
                    .ok()
                    .and_then(|text| runnable_tasks(&text));
                *last = Some((now, running));
                running
            }
        }
    };
    Some((running?, online_cores()))
}

/// Cores with nothing to run now: online cores less runnable tasks.
pub(crate) fn spare_cores() -> Option<usize> {
    load().map(|(running, online)| online.saturating_sub(running))
}

/// The cores this process may run on, asked once (the answer reads cgroup
/// files: too slow to ask per copy).
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
}

/// The machine's online cores (a list such as `0-3,8-11`), read once; the
/// cores this process may use where it cannot be read.
fn online_cores() -> usize {
    static ONLINE: OnceLock<usize> = OnceLock::new();
    *ONLINE.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|list| count_cpu_list(&list))
            .unwrap_or_else(cores)
    })
}

/// The runnable tasks in a `/proc/loadavg` text (`0.52 0.61 0.58 3/712 4096`: 3).
fn runnable_tasks(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// The number of cores in a kernel CPU list (`0-3,8-11`: 8); `None` when
/// malformed or empty.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        n += hi.checked_sub(lo)? + 1;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_and_cpu_lists_are_read() {
        assert_eq!(runnable_tasks("0.52 0.61 0.58 3/712 4096\n"), Some(3));
        assert_eq!(runnable_tasks("0.00 0.01 0.05 1/80 17"), Some(1));
        assert_eq!(runnable_tasks("0.52 0.61 0.58"), None);
        assert_eq!(runnable_tasks("a b c x/712 4096"), None);
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8-11"), Some(8));
        assert_eq!(count_cpu_list("0-3,5"), Some(5));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("0-x"), None);
        // This machine's files read: at least the caller runs, at least
        // one core is online.
        let (running, online) = load().expect("/proc/loadavg and the cpu list read here");
        assert!(running >= 1 && online >= 1, "{running} {online}");
        assert!(spare_cores().unwrap() < online);
    }
}
