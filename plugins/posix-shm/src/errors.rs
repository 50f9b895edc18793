//! Turning system-call failures into errors an operator can act on.

use rustix::io::Errno;
use shardport_abi::{AbiError, ErrorKind};
use shardport_kit::format_byte_size;

use crate::{board::LAYOUT_VERSION, liveness::Death, names::Kind, sys::SysError};

/// What to tell someone whose `/dev/shm` ran out.
const SHM_FULL_HINT: &str = "/dev/shm is full (or the system is out of memory); \
     Docker gives containers a 64 MiB /dev/shm by default: raise it with \
     `docker run --shm-size=8g` (`shm_size` in compose, an `emptyDir` with \
     `medium: Memory` in Kubernetes), or lower `pool-size`";

/// Creating (or reserving pages in) one of our own segments failed.
pub(crate) fn create_failed(kind: Kind, name: &str, size: u64, e: SysError) -> AbiError {
    let what = format!(
        "cannot create {kind} {name} ({}): {e}",
        format_byte_size(size)
    );
    let (kind, msg) = match e.errno {
        Errno::NOSPC | Errno::NOMEM => (
            ErrorKind::RESOURCE_EXHAUSTED,
            format!("{what}; {SHM_FULL_HINT}"),
        ),
        Errno::MFILE | Errno::NFILE => (
            ErrorKind::RESOURCE_EXHAUSTED,
            format!("{what}; the process is out of file descriptors (raise `ulimit -n`)"),
        ),
        Errno::ACCESS | Errno::PERM => (
            ErrorKind::PERMISSION_DENIED,
            format!("{what}; check that /dev/shm is writable by this user"),
        ),
        _ => (ErrorKind::IO, what),
    };
    AbiError::new(kind, msg)
}

/// Backing pool pages for a new allocation failed.
pub(crate) fn reserve_failed(name: &str, len: u64, e: SysError) -> AbiError {
    let what = format!(
        "cannot back {} of pool data segment {name}: {e}",
        format_byte_size(len)
    );
    match e.errno {
        Errno::NOSPC | Errno::NOMEM => AbiError::new(
            ErrorKind::RESOURCE_EXHAUSTED,
            format!("{what}; {SHM_FULL_HINT}"),
        ),
        _ => AbiError::new(ErrorKind::IO, what),
    }
}

/// Opening a peer's segment named in a descriptor failed.
pub(crate) fn open_failed(kind: Kind, name: &str, e: SysError) -> AbiError {
    match e.errno {
        Errno::NOENT => AbiError::not_found(format!(
            "{kind} {name} does not exist: the shard was removed by its owner \
             (or the owner does not share this /dev/shm)"
        )),
        Errno::ACCESS | Errno::PERM => AbiError::new(
            ErrorKind::PERMISSION_DENIED,
            format!(
                "cannot open {kind} {name}: {e}; segments are created 0600, so owner \
                 and consumer must run as the same user"
            ),
        ),
        Errno::MFILE | Errno::NFILE | Errno::NOMEM => AbiError::new(
            ErrorKind::RESOURCE_EXHAUSTED,
            format!("cannot open {kind} {name}: {e}"),
        ),
        _ => AbiError::new(ErrorKind::IO, format!("cannot open {kind} {name}: {e}")),
    }
}

/// The process that owns the shard's segments (per their names) is provably
/// gone: whatever is still in `/dev/shm` is an orphan, not a shard.
pub(crate) fn owner_dead(pid: u32, death: Death, segment: &str) -> AbiError {
    let how = match death {
        Death::Exited => String::new(),
        Death::PidReused => format!("; pid {pid} now belongs to another process"),
    };
    AbiError::not_found(format!(
        "owner process {pid} has exited; its shards are gone ({segment}{how})"
    ))
}

/// The owner's lease board has another layout version than this plugin
/// (`found`: the version byte of its magic).
pub(crate) fn board_version(board: &str, found: u8) -> AbiError {
    // Boards before version 4 spelled the whole magic "SPSHMBRD" (their
    // version was in the next word): their version byte reads `D`.
    let (found, older) = if found == b'D' {
        ("3 or older".to_owned(), true)
    } else {
        (
            char::from(found).escape_default().to_string(),
            found < LAYOUT_VERSION,
        )
    };
    let who = if older { "an older" } else { "a newer" };
    let ours = char::from(LAYOUT_VERSION);
    AbiError::unavailable(format!(
        "lease board {board} has layout version {found} but this posix-shm plugin uses \
         version {ours}: the owner runs {who} posix-shm plugin; run the same \
         plugin version on both sides (another transport can serve this shard meanwhile)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_shm_mentions_docker() {
        let e = create_failed(
            Kind::PoolData,
            "/shardport-t-p0",
            1 << 30,
            SysError {
                op: "fallocate",
                errno: Errno::NOSPC,
            },
        );
        assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED);
        assert!(e.message.starts_with(
            "cannot create pool data segment /shardport-t-p0 (1 GiB): fallocate failed: "
        ));
        assert!(e.message.contains("/dev/shm is full"));
        assert!(e.message.contains("64 MiB"));
        assert!(e.message.contains("--shm-size"));
        let e = create_failed(
            Kind::Shard,
            "/x",
            1,
            SysError {
                op: "mmap",
                errno: Errno::NOMEM,
            },
        );
        assert!(e.message.contains("--shm-size"));
    }

    #[test]
    fn missing_segment_is_not_found() {
        let e = open_failed(
            Kind::Shard,
            "/shardport-t-s1",
            SysError {
                op: "shm_open",
                errno: Errno::NOENT,
            },
        );
        assert_eq!(e.kind, ErrorKind::NOT_FOUND);
        assert!(e.message.contains("removed by its owner"));
    }

    #[test]
    fn dead_owner_and_version_messages() {
        let e = owner_dead(1234, Death::Exited, "/shardport-x-p0");
        assert_eq!(e.kind, ErrorKind::NOT_FOUND);
        assert_eq!(
            e.message.as_str(),
            "owner process 1234 has exited; its shards are gone (/shardport-x-p0)"
        );
        let e = owner_dead(1234, Death::PidReused, "/shardport-x-s3");
        assert_eq!(
            e.message.as_str(),
            "owner process 1234 has exited; its shards are gone (/shardport-x-s3; \
             pid 1234 now belongs to another process)"
        );
        let e = board_version("/shardport-x-b1", b'3');
        assert_eq!(e.kind, ErrorKind::UNAVAILABLE);
        assert_eq!(
            e.message.as_str(),
            "lease board /shardport-x-b1 has layout version 3 but this posix-shm plugin uses \
             version 4: the owner runs an older posix-shm plugin; run the same plugin version \
             on both sides (another transport can serve this shard meanwhile)"
        );
        assert!(board_version("/b", b'5').message.contains("a newer"));
        // Boards of versions 1 to 3 (magic "SPSHMBRD").
        let old = board_version("/b", b'D').message;
        assert!(
            old.contains("layout version 3 or older but") && old.contains("an older"),
            "{old}"
        );
    }
}
