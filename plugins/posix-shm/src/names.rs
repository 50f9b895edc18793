//! Segment names: how owners make them and how consumers check them.
//!
//! A name is `/{prefix}-{node_tag}-{kind}{counter}`: the configured prefix,
//! the host's per-node-instance tag, one letter for the segment's role and a
//! per-transport counter. Node tags are unique per host node instance, names
//! are created `O_EXCL`, so two owners never share a name; a consumer accepts
//! only names with its own prefix and this exact shape.

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

/// Longest `segment-prefix`: leaves room for the node tag and counter under
/// the kernel's 255-byte name limit.
pub(crate) const MAX_PREFIX_LEN: usize = 32;
/// Longest node tag accepted from the host (it sends ~30 characters).
pub(crate) const MAX_NODE_TAG_LEN: usize = 128;
/// Longest segment name, slash included: 1 + 32 + 1 + 128 + 1 + 1 + 20 = 184
/// fits, and stays below Linux's `NAME_MAX` (255) for `/dev/shm` entries.
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

/// Makes this transport's segment names. Owned by the owner side (no
/// globals); the counter is atomic so segments are created without a lock.
#[derive(Debug)]
pub(crate) struct NameGen {
    /// `/{prefix}-{node_tag}-`
    base: String,
    next: AtomicU64,
}

impl NameGen {
    /// A generator for `prefix` (validated) and `node_tag` (validated).
    pub(crate) fn new(prefix: &str, node_tag: &str) -> Self {
        NameGen {
            base: format!("/{prefix}-{node_tag}-"),
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
    if let Some(c) = rest.chars().find(|&c| !name_char(c)) {
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
/// (`/{prefix}-{node_tag}-`). Segments of one owner share it.
pub(crate) fn owner_base(name: &str) -> &str {
    name.rfind('-').map_or(name, |i| &name[..=i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_pass_the_check() {
        let g = NameGen::new("shardport", "t12-0-abc");
        let p = g.next(Kind::PoolData);
        let b = g.next(Kind::Board);
        let s = g.next(Kind::Shard);
        assert_eq!(p, "/shardport-t12-0-abc-p0");
        assert_eq!(b, "/shardport-t12-0-abc-b1");
        assert_eq!(s, "/shardport-t12-0-abc-s2");
        check_name(&p, "shardport", Kind::PoolData).unwrap();
        check_name(&b, "shardport", Kind::Board).unwrap();
        check_name(&s, "shardport", Kind::Shard).unwrap();
        assert!(check_name(&p, "shardport", Kind::Board).is_err());
        assert_eq!(owner_base(&p), g.base());
        assert_eq!(owner_base(&p), owner_base(&b));
        let long = NameGen::new(&"a".repeat(32), &"z".repeat(128)).next(Kind::Shard);
        let g = NameGen::new(&"a".repeat(32), &"z".repeat(128));
        g.next.store(u64::MAX, Relaxed);
        let longest = g.next(Kind::Shard);
        assert!(longest.len() <= MAX_NAME_LEN, "{}", longest.len());
        check_name(&long, &"a".repeat(32), Kind::Shard).unwrap();
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
        assert!(validate_node_tag(&"a".repeat(129)).is_err());
    }
}
