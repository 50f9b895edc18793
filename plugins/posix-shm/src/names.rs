//! Segment names: how owners make them, how consumers check them, and how
//! the dead-owner sweep reads their owner out of them.
//!
//! A name is `/{prefix}-{identity}-{node_tag}-{kind}{counter}`:
//! - `prefix`: the configured `segment-prefix`;
//! - `identity`: `{pid ns}_{time ns}_{boot id}`, the owner process's PID and
//!   time namespace inodes (decimal) and the kernel boot id (32 lowercase hex
//!   digits), so a sweep can tell whether the pid in the name means the same
//!   process to it as to the owner (see `liveness`);
//! - `node_tag`: the host's per-node-instance tag, `{pid}-{start ticks}-{random}`
//!   (the owner's pid and process start time, see the host's `new_node_tag`);
//! - `kind`: one letter for the segment's role, and a per-transport counter.
//!
//! Node tags are unique per host node instance and names are created
//! `O_EXCL`, so two owners never share a name. A consumer accepts only names
//! with its own prefix and this shape (everything between the prefix and the
//! last `-` is the owner's part, opaque to it). The sweep is stricter: it
//! touches only names that [`parse_owned`] reads completely; a node tag of
//! another shape (the test harness's) makes a name the sweep never touches.

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use shardport_kit::lease::liveness::parse_boot_id;

use crate::liveness::{Namespaces, ProcessRecord};

/// Longest `segment-prefix`: leaves room for the node tag and counter under
/// the kernel's 255-byte name limit.
pub(crate) const MAX_PREFIX_LEN: usize = 32;
/// Longest node tag accepted from the host (it sends ~30 characters).
pub(crate) const MAX_NODE_TAG_LEN: usize = 64;
/// Longest identity part: two 10-digit namespace inodes, two `_` and 32 hex
/// digits of boot id.
const MAX_IDENTITY_LEN: usize = 10 + 1 + 10 + 1 + 32;
/// Longest segment name, slash included: 1 + 32 + 1 + 54 + 1 + 64 + 1 + 1 + 20
/// = 175 fits, and stays below Linux's `NAME_MAX` (255) for `/dev/shm` entries.
pub(crate) const MAX_NAME_LEN: usize = 200;
/// Digits of a `u64` counter.
const MAX_COUNTER_DIGITS: usize = 20;

/// Role of a segment, the letter before its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The pool's data segment.
    PoolData,
    /// The pool's lease board.
    Board,
    /// A per-shard segment (segment-per-shard mode, or a spilled shard).
    Shard,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::PoolData => 'p',
            Kind::Board => 'b',
            Kind::Shard => 's',
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::PoolData => "pool data segment",
            Kind::Board => "lease board",
            Kind::Shard => "shard segment",
        })
    }
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Checks a configured `segment-prefix`: `[A-Za-z0-9_-]`, starts with a
/// letter, at most [`MAX_PREFIX_LEN`] characters.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!("must start with a letter, found \"{prefix}\""));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(format!(
            "must be at most {MAX_PREFIX_LEN} characters, found {}",
            prefix.len()
        ));
    }
    if let Some(c) = prefix.chars().find(|&c| !name_char(c)) {
        return Err(format!(
            "may contain only letters, digits, `_` and `-`, found {c:?} in \"{prefix}\""
        ));
    }
    Ok(())
}

/// Checks the host's node tag (the host promises `[a-z0-9-]`; a bad tag would
/// make names consumers reject, so fail at construction instead).
pub(crate) fn validate_node_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > MAX_NODE_TAG_LEN {
        return Err(format!(
            "node tag must be 1..={MAX_NODE_TAG_LEN} characters, found {}",
            tag.len()
        ));
    }
    if let Some(c) = tag
        .chars()
        .find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
    {
        return Err(format!(
            "node tag may contain only `a-z`, `0-9` and `-`, found {c:?} in \"{tag}\""
        ));
    }
    Ok(())
}

/// The identity part of our names for process `me`: `{pid ns}_{time ns}_{boot id}`.
pub(crate) fn identity(me: &ProcessRecord) -> String {
    format!("{}_{}_{:032x}", me.ns.pid, me.ns.time, me.boot)
}

/// Makes this transport's segment names. Owned by the owner side (no
/// globals); the counter is atomic so segments are created without a lock.
#[derive(Debug)]
pub(crate) struct NameGen {
    /// `/{prefix}-{identity}-{node_tag}-`
    base: String,
    next: AtomicU64,
}

impl NameGen {
    /// A generator for `prefix` (validated) and `node_tag` (validated), in
    /// process `me`.
    pub(crate) fn new(prefix: &str, node_tag: &str, me: &ProcessRecord) -> Self {
        NameGen {
            base: format!("/{prefix}-{}-{node_tag}-", identity(me)),
            next: AtomicU64::new(0),
        }
    }

    /// The next unused name of `kind`. 2^64 names never run out; were they
    /// to wrap, `O_EXCL` would still refuse a name that exists.
    pub(crate) fn next(&self, kind: Kind) -> String {
        let n = self.next.fetch_add(1, Relaxed);
        format!("{}{}{n}", self.base, kind.letter())
    }

    /// The common start of every name this generator makes.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }
}

/// Checks a segment name taken from a descriptor: at most [`MAX_NAME_LEN`]
/// bytes, `/` then only `[A-Za-z0-9_-]` (so no further `/`, no `..`), our
/// `prefix` and `-`, a non-empty node tag, and `-{kind letter}{digits}`.
pub(crate) fn check_name(name: &str, prefix: &str, kind: Kind) -> Result<(), String> {
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{} bytes long, more than {MAX_NAME_LEN}",
            name.len()
        ));
    }
    let Some(rest) = name.strip_prefix('/') else {
        return Err(format!("{name:?} does not start with `/`"));
    };
    // Bytes first (every import checks two names); chars only to report.
    if !rest.bytes().all(|b| name_char(char::from(b))) {
        let c = rest.chars().find(|&c| !name_char(c)).unwrap_or('?');
        return Err(format!(
            "{name:?} contains {c:?}; only letters, digits, `_` and `-` may follow the `/`"
        ));
    }
    let Some(body) = rest.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return Err(format!(
            "{name:?} does not start with this transport's prefix `/{prefix}-`"
        ));
    };
    let Some((tag, last)) = body.rsplit_once('-') else {
        return Err(format!("{name:?} has no node tag"));
    };
    let digits = last.strip_prefix(kind.letter()).unwrap_or("");
    if tag.is_empty()
        || digits.is_empty()
        || digits.len() > MAX_COUNTER_DIGITS
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(format!(
            "{name:?} is not a {kind} name (`/{prefix}-<node tag>-{}<counter>`)",
            kind.letter()
        ));
    }
    Ok(())
}

/// The owner part of a checked name: everything up to its last `-`
/// (`/{prefix}-{identity}-{node_tag}-`). Segments of one owner share it.
pub(crate) fn owner_base(name: &str) -> &str {
    name.rfind('-').map_or(name, |i| &name[..=i])
}

/// A segment name read completely: its owner and its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnedName {
    /// The owner process as the name records it.
    pub owner: ProcessRecord,
    pub kind: Kind,
    /// The owner node's epoch as the node tag records it (`{epoch hex}g`
    /// starts the random part of tags the host makes); `None` for a tag of
    /// another shape (an older host's).
    pub epoch: Option<u64>,
}

/// Reads `name` (with or without its leading `/`) as a name this plugin made
/// with `prefix` for a host node tag: exactly
/// `{prefix}-{pid ns}_{time ns}_{boot id}-{pid}-{start ticks}-{random}-{kind}{counter}`,
/// numbers in canonical decimal (no sign, no leading zero), the boot id as 32
/// lowercase hex digits, the random part `[a-z0-9]+`. Anything else is
/// `None`: another prefix, an older name shape, a node tag of another shape.
/// The part counts are exact, so a name matches at most one prefix.
pub(crate) fn parse_owned(name: &str, prefix: &str) -> Option<OwnedName> {
    let name = name.strip_prefix('/').unwrap_or(name);
    if name.len() + 1 > MAX_NAME_LEN {
        return None;
    }
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let mut parts = rest.split('-');
    let (Some(identity), Some(pid), Some(start), Some(random), Some(last), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if identity.len() > MAX_IDENTITY_LEN {
        return None;
    }
    let mut ids = identity.split('_');
    let (Some(pid_ns), Some(time_ns), Some(boot), None) =
        (ids.next(), ids.next(), ids.next(), ids.next())
    else {
        return None;
    };
    // Names spell the boot id one way only (32 lowercase hex digits, no
    // dashes), so each segment has one name; the kit reads the number.
    let boot = (boot.len() == 32
        && boot
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| parse_boot_id(boot))??;
    let (pid, start_ticks) = parse_node_tag_parts(pid, start, random)?;
    let mut last = last.chars();
    let kind = match last.next()? {
        'p' => Kind::PoolData,
        'b' => Kind::Board,
        's' => Kind::Shard,
        _ => return None,
    };
    decimal(last.as_str(), MAX_COUNTER_DIGITS)?;
    let epoch = random
        .split_once('g')
        .and_then(|(hex, _)| (hex.len() <= 16).then(|| u64::from_str_radix(hex, 16).ok())?);
    Some(OwnedName {
        epoch,
        owner: ProcessRecord {
            pid,
            start_ticks,
            ns: Namespaces {
                pid: u32::try_from(decimal(pid_ns, 10)?).ok()?,
                time: u32::try_from(decimal(time_ns, 10)?).ok()?,
            },
            boot,
        },
        kind,
    })
}

/// What a segment name says about its owner, as far as a handle's claim
/// is compared with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnerMark {
    /// The owner node's epoch (`None` for an older host's tag).
    pub epoch: Option<u64>,
    /// PID namespace inode.
    pub pid_ns: u32,
    /// Boot id.
    pub boot: u128,
}

/// The owner mark of `name`, or why it has none.
pub(crate) fn owner_mark(name: &str, prefix: &str) -> Result<OwnerMark, String> {
    let n = parse_owned(name, prefix).ok_or_else(|| {
        format!("segment `{name}` is not named for an owner (prefix `{prefix}`, host node tag)")
    })?;
    Ok(OwnerMark {
        epoch: n.epoch,
        pid_ns: n.owner.ns.pid,
        boot: n.owner.boot,
    })
}

/// Why the segment `name` (whose mark is `m`) does not belong to the owner
/// a handle claims, or `Ok` when it does: the identity part (PID
/// namespace, boot id) and the node epoch in the name must be the claim's.
/// Parts the claim leaves unknown are not compared; a name from an older
/// host (no epoch in its tag) is bound by identity only. No allocation
/// unless it fails. Reads the claim's epoch, PID namespace and boot id
/// only: the consumer's memo of the last check that passed
/// (`consumer::Passed`) compares exactly those, and must follow any change.
pub(crate) fn check_owner(
    name: &str,
    m: &OwnerMark,
    claim: &shardport_abi::OwnerClaim<'_>,
) -> Result<(), String> {
    let epoch_ok = m.epoch.is_none_or(|e| e == claim.epoch);
    let pid_ok = claim.pid_ns == 0 || u64::from(m.pid_ns) == claim.pid_ns;
    let claimed_boot = parse_boot_id(claim.boot_id.as_str());
    let boot_ok = claimed_boot.is_none_or(|b| b == m.boot);
    if epoch_ok && pid_ok && boot_ok {
        return Ok(());
    }
    let mut wrong = Vec::new();
    if !epoch_ok {
        wrong.push(format!(
            "node epoch {:x}, the handle's owner has {:x}",
            m.epoch.unwrap_or_default(),
            claim.epoch
        ));
    }
    if !pid_ok {
        wrong.push(format!(
            "PID namespace {}, the handle's owner has {}",
            m.pid_ns, claim.pid_ns
        ));
    }
    if let (false, Some(b)) = (boot_ok, claimed_boot) {
        wrong.push(format!(
            "boot id {:032x}, the handle's owner has {b:032x}",
            m.boot
        ));
    }
    Err(format!(
        "segment `{name}` belongs to another owner than the handle names ({}): a handle may only name its owner's segments",
        wrong.join("; ")
    ))
}

/// The owner pid and start ticks of a node tag of the host's shape,
/// `{pid}-{start ticks}-{random}`; `None` for any other tag.
pub(crate) fn parse_node_tag(tag: &str) -> Option<(u32, u64)> {
    let mut parts = tag.split('-');
    let (Some(pid), Some(start), Some(random), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    parse_node_tag_parts(pid, start, random)
}

fn parse_node_tag_parts(pid: &str, start: &str, random: &str) -> Option<(u32, u64)> {
    let random_ok = !random.is_empty()
        && random
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    random_ok.then_some(())?;
    Some((u32::try_from(decimal(pid, 10)?).ok()?, decimal(start, 20)?))
}

/// `s` as a canonical decimal number of at most `max_digits` digits.
fn decimal(s: &str, max_digits: usize) -> Option<u64> {
    let canonical = !s.is_empty()
        && s.len() <= max_digits
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: ProcessRecord = ProcessRecord {
        pid: 1234,
        start_ticks: 56789,
        ns: Namespaces {
            pid: 4026531836,
            time: 4026531834,
        },
        boot: 0x6b2ad925_277a_4541_9847_21082ff9412d,
    };

    #[test]
    fn generated_names_pass_the_check() {
        let g = NameGen::new("shardport", "t12-0-abc", &ME);
        let p = g.next(Kind::PoolData);
        let b = g.next(Kind::Board);
        let s = g.next(Kind::Shard);
        let id = "4026531836_4026531834_6b2ad925277a4541984721082ff9412d";
        assert_eq!(p, format!("/shardport-{id}-t12-0-abc-p0"));
        assert_eq!(b, format!("/shardport-{id}-t12-0-abc-b1"));
        assert_eq!(s, format!("/shardport-{id}-t12-0-abc-s2"));
        check_name(&p, "shardport", Kind::PoolData).unwrap();
        check_name(&b, "shardport", Kind::Board).unwrap();
        check_name(&s, "shardport", Kind::Shard).unwrap();
        assert!(check_name(&p, "shardport", Kind::Board).is_err());
        assert_eq!(owner_base(&p), g.base());
        assert_eq!(owner_base(&p), owner_base(&b));
        let widest = ProcessRecord {
            ns: Namespaces {
                pid: u32::MAX,
                time: u32::MAX,
            },
            boot: u128::MAX,
            ..ME
        };
        assert_eq!(identity(&widest).len(), MAX_IDENTITY_LEN);
        let g = NameGen::new(&"a".repeat(32), &"z".repeat(64), &widest);
        g.next.store(u64::MAX, Relaxed);
        let longest = g.next(Kind::Shard);
        assert!(longest.len() <= MAX_NAME_LEN, "{}", longest.len());
        check_name(&longest, &"a".repeat(32), Kind::Shard).unwrap();
    }

    #[test]
    fn a_name_is_bound_to_the_owner_epoch_and_identity_a_handle_claims() {
        let g = NameGen::new("pfx", "1234-56789-18a2bg3", &ME);
        let name = g.next(Kind::PoolData);
        assert_eq!(parse_owned(&name, "pfx").unwrap().epoch, Some(0x18a2b));
        fn claim(epoch: u64, boot: &str, pid_ns: u64) -> shardport_abi::OwnerClaim<'_> {
            shardport_abi::OwnerClaim {
                epoch,
                boot_id: boot.into(),
                pid_ns,
                ..Default::default()
            }
        }
        let boot = format!("{:032x}", ME.boot);
        let dashed = format!(
            "{}-{}-{}-{}-{}",
            &boot[..8],
            &boot[8..12],
            &boot[12..16],
            &boot[16..20],
            &boot[20..]
        );
        let me = u64::from(ME.ns.pid);
        let m = owner_mark(&name, "pfx").unwrap();
        assert_eq!(check_owner(&name, &m, &claim(0x18a2b, &dashed, me)), Ok(()));
        assert_eq!(
            check_owner(&name, &m, &claim(0x18a2b, &boot, me)),
            Ok(()),
            "no dashes"
        );
        // Unknown parts of the claim are not compared.
        assert_eq!(check_owner(&name, &m, &claim(0x18a2b, "", 0)), Ok(()));
        let e = check_owner(&name, &m, &claim(0x18a2c, &dashed, me)).unwrap_err();
        assert!(
            e.contains("node epoch 18a2b, the handle's owner has 18a2c"),
            "{e}"
        );
        let e = check_owner(&name, &m, &claim(0x18a2b, &dashed, me + 1)).unwrap_err();
        assert!(e.contains("PID namespace"), "{e}");
        let e = check_owner(&name, &m, &claim(0x18a2b, &"0".repeat(32), me)).unwrap_err();
        assert!(e.contains("boot id") && e.contains("another owner"), "{e}");
        let e = owner_mark("/pfx-garbage", "pfx").unwrap_err();
        assert!(e.contains("not named for an owner"), "{e}");
    }

    #[test]
    fn owned_names_parse_back_to_their_owner() {
        // A host node tag: `{pid}-{start ticks}-{random}`.
        let g = NameGen::new("job_7-a", "1234-56789-9f3eae460", &ME);
        for (kind, name) in [
            (Kind::PoolData, g.next(Kind::PoolData)),
            (Kind::Board, g.next(Kind::Board)),
            (Kind::Shard, g.next(Kind::Shard)),
        ] {
            let parsed = parse_owned(&name, "job_7-a").unwrap();
            assert_eq!(
                parsed,
                OwnedName {
                    owner: ME,
                    kind,
                    epoch: None
                }
            );
            assert_eq!(parse_owned(&name[1..], "job_7-a"), Some(parsed));
            // Exact parts: never read under a shorter or longer prefix.
            assert_eq!(parse_owned(&name, "job_7"), None);
            assert_eq!(parse_owned(&name, "job_7-a-4026531836"), None);
        }
        let unknown_time = NameGen::new(
            "shardport",
            "1-2-x",
            &ProcessRecord {
                ns: Namespaces { pid: 5, time: 0 },
                ..ME
            },
        )
        .next(Kind::Shard);
        assert_eq!(
            parse_owned(&unknown_time, "shardport").unwrap().owner.ns,
            Namespaces { pid: 5, time: 0 }
        );
    }

    #[test]
    fn node_tags_of_the_hosts_shape() {
        assert_eq!(parse_node_tag("1234-56789-9f3eae460"), Some((1234, 56789)));
        assert_eq!(parse_node_tag("1234-0-ab"), Some((1234, 0)));
        for other in [
            "t1234-0-17ab",
            "1234-56789",
            "1234-56789-ab-c",
            "1234-56789-AB",
            "",
        ] {
            assert_eq!(parse_node_tag(other), None, "{other}");
        }
    }

    #[test]
    fn foreign_names_do_not_parse() {
        let id = "4026531836_4026531834_6b2ad925277a4541984721082ff9412d";
        let good = format!("shardport-{id}-1234-56789-9f3eae460-p0");
        assert!(parse_owned(&good, "shardport").is_some());
        for bad in [
            // Another prefix, or ours extended.
            format!("other-{id}-1234-56789-9f3eae460-p0"),
            format!("shardportx-{id}-1234-56789-9f3eae460-p0"),
            // The older shape, without an identity.
            "shardport-1234-56789-9f3eae460-p0".to_owned(),
            // The test harness's node tags.
            format!("shardport-{id}-t1234-0-17ab-p0"),
            // Parts missing, extra or malformed.
            format!("shardport-{id}-1234-56789-9f3eae460-x-p0"),
            format!("shardport-{id}-1234-56789-p0"),
            format!("shardport-{id}-1234-56789-9f3eae460-q0"),
            format!("shardport-{id}-1234-56789-9f3eae460-p"),
            format!("shardport-{id}-1234-56789-9f3eae460-p01"),
            format!("shardport-{id}-1234-56789-9F3EAE460-p0"),
            format!("shardport-{id}-01234-56789-9f3eae460-p0"),
            format!("shardport-{id}-+1234-56789-9f3eae460-p0"),
            format!("shardport-{id}-12345678901-56789-9f3eae460-p0"),
            format!("shardport-{id}-1234--9f3eae460-p0"),
            format!("shardport-{id}-1234-56789-9f3eae460-p0.tmp"),
            "shardport-4026531836_4026531834-1234-56789-9f3eae460-p0".to_owned(),
            "shardport-4026531836_4026531834_6B2AD925277A4541984721082FF9412D-1234-56789-9f3eae460-p0"
                .to_owned(),
            "shardport-4026531836_4026531834_6b2ad925277a4541984721082ff9412-1234-56789-9f3eae460-p0"
                .to_owned(),
            "shardport-4026531836_4026531834_6b2ad925277a4541984721082ff9412d_1-1234-56789-9f3eae460-p0"
                .to_owned(),
            "shardport-99999999999_1_6b2ad925277a4541984721082ff9412d-1234-56789-9f3eae460-p0"
                .to_owned(),
            format!("shardport-{id}-1234-56789-{}-p0", "a".repeat(200)),
            String::new(),
            "/".to_owned(),
        ] {
            assert_eq!(parse_owned(&bad, "shardport"), None, "{bad}");
        }
    }

    #[test]
    fn hostile_names_are_refused() {
        for bad in [
            "/../../etc/passwd",
            "/shardport-x/../../etc/passwd",
            "/shardport-t1-p0/x",
            "shardport-t1-p0",
            "/other-t1-p0",
            "/shardport-p0",
            "/shardport--p0",
            "/shardport-t1-p",
            "/shardport-t1-px",
            "/shardport-t1-p01234567890123456789012",
            "/shardport-t1.p0",
            "/shardport-t1-p0\0",
            "/shardportx-t1-p0",
            "",
            "/",
        ] {
            assert!(
                check_name(bad, "shardport", Kind::PoolData).is_err(),
                "{bad:?} accepted"
            );
        }
        let long = format!("/shardport-{}-p0", "a".repeat(300));
        assert!(check_name(&long, "shardport", Kind::PoolData)
            .unwrap_err()
            .contains("more than 200"));
    }

    #[test]
    fn prefixes_and_tags() {
        validate_prefix("shardport").unwrap();
        validate_prefix("A_b-9").unwrap();
        assert!(validate_prefix("9a").is_err());
        assert!(validate_prefix("_a").is_err());
        assert!(validate_prefix("a.b").is_err());
        assert!(validate_prefix("a/b").is_err());
        assert!(validate_prefix(&"a".repeat(33)).is_err());
        validate_node_tag("t123-4-ab").unwrap();
        assert!(validate_node_tag("").is_err());
        assert!(validate_node_tag("T1").is_err());
        assert!(validate_node_tag("a/b").is_err());
        assert!(validate_node_tag(&"a".repeat(65)).is_err());
        validate_node_tag(&"a".repeat(64)).unwrap();
    }
}
