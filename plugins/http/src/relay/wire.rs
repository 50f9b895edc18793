//! The relay endpoints' paths and binary bodies. Pure functions, no I/O;
//! integers big-endian like the rest of the wire protocol.
//!
//! ```text
//! POST /v1/relay/{id}/join request          200 reply
//!   0  1  version (2)                         0  1  version (2)
//!   1  8  member id (random, per fetch)       1  8  shard length
//!   9  8  from: bytes held (piece-aligned)    9  4  piece size
//!  17  1  flags: 1 serves, 2 serves TLS,    13  1  flags: 1 parent is the owner,
//!             4 takes alternates, 8 the             2 parent serves TLS, 4 keep
//!             failed holder was late, 16
//!             requires client certificates
//!                                                    no copy (not recorded), 8
//!                                                    alternates follow the hashes
//!  18  1  a = address length (0: none)       14  1  p = parent address length
//!  19  a  address it serves on               15  p  parent address (none: owner)
//!   .  1  f = failed holder's length (0)      . 16  the member's removal key
//!                                                   (zeros: it keeps no copy)
//!                                             .  4  k = piece count
//!   .  f  the holder that failed it           .  32k BLAKE3 of every piece
//!                                             .  1  m = alternates (with flag 8)
//!                                             per alternate:
//!                                             .  1  1 the owner, 2 serves TLS
//!                                             .  1  a = address length (0: owner)
//!                                             .  a  its address
//!
//! GET /v1/relay/{id}/{from}   the shard's bytes from `from` (decimal,
//!                             piece-aligned) to its end, piece by piece
//! GET /v1/relay/{id}/{from}-{to}  the same, bytes `from..to` (`to` a piece
//!                             boundary or the shard's end)
//! DELETE /v1/relay/{id}       a holder drops its copy (sent by the owner,
//!                             with the holder's 16-byte removal key as the
//!                             body; any other body is refused, 403)
//! POST /v1/relay/{id}         a holder rejoins the tree at its next piece
//!                             (sent by the owner to a relay it demoted,
//!                             with the same key)
//! ```

use shardport_abi::ShardId;

use super::{PieceHash, RemovalKey};
use crate::descriptor::{parse_host_port, MAX_ADDR_LEN};

/// Version byte of the join framings. Version 1 carried xxh3-64 piece
/// hashes, which a holder can forge: an owner refuses version 1 joins
/// (their consumers fetch from it directly), and a consumer that meets an
/// owner that refuses version 2 does the same.
pub(crate) const VERSION: u8 = 2;
/// The join version whose xxh3-64 piece hashes a holder can forge.
pub(crate) const FORGEABLE_VERSION: u8 = 1;
/// Path prefix of every relay endpoint.
pub(crate) const PREFIX: &str = "/v1/relay/";
/// Longest join request: both addresses at their longest.
pub(crate) const MAX_JOIN_REQUEST: usize = 19 + 1 + 2 * MAX_ADDR_LEN;
const FLAG_SERVES: u8 = 1;
const FLAG_TLS: u8 = 2;
const FLAG_ALTERNATES: u8 = 4;
const FLAG_LATE: u8 = 8;
const FLAG_CLIENT_AUTH: u8 = 16;
const PARENT_OWNER: u8 = 1;
const PARENT_TLS: u8 = 2;
const NO_COPY: u8 = 4;
const HAS_ALTERNATES: u8 = 8;
/// Most alternates a join reply names (`relay-sources` is at most one more).
pub(crate) const MAX_ALTERNATES: usize = 3;
/// Longest alternates part of a join reply.
pub(crate) const MAX_ALTERNATES_BYTES: usize = 1 + MAX_ALTERNATES * (2 + MAX_ADDR_LEN);

/// Which relay endpoint a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/relay/{id}/join`.
    Join(ShardId),
    /// `/v1/relay/{id}/{from}` (to the end) or `/v1/relay/{id}/{from}-{to}`.
    Stream(ShardId, u64, Option<u64>),
    /// `/v1/relay/{id}`: `DELETE` drops the copy, `POST` asks its fetch to
    /// rejoin the tree.
    Copy(ShardId),
}

/// Parses the part of a path after [`PREFIX`].
pub(crate) fn parse_path(rest: &str) -> Result<Endpoint, String> {
    let (hex, tail) = match rest.split_once('/') {
        Some((h, t)) => (h, Some(t)),
        None => (rest, None),
    };
    let id = crate::wire::parse_shard_id(hex)
        .ok_or_else(|| format!("malformed shard id {hex:?}: expected 32 hex digits"))?;
    match tail {
        None => Ok(Endpoint::Copy(id)),
        Some("join") => Ok(Endpoint::Join(id)),
        Some(t)
            if !t.is_empty()
                && t.len() <= 41
                && t.bytes().all(|b| b.is_ascii_digit() || b == b'-') =>
        {
            let offset = |o: &str| {
                if o.is_empty() || o.len() > 20 || !o.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!(
                        "expected a decimal byte offset or a range `from-to` after the shard \
                         id, found {t:?}"
                    ));
                }
                o.parse::<u64>()
                    .map_err(|_| format!("offset {o:?} does not fit in 64 bits"))
            };
            match t.split_once('-') {
                None => Ok(Endpoint::Stream(id, offset(t)?, None)),
                Some((from, to)) => {
                    let (from, to) = (offset(from)?, offset(to)?);
                    if to <= from {
                        return Err(format!("the range {t:?} is empty"));
                    }
                    Ok(Endpoint::Stream(id, from, Some(to)))
                }
            }
        }
        Some(t) => Err(format!(
            "expected `join`, a decimal byte offset or a range `from-to` after the shard id, \
             found {t:?}"
        )),
    }
}

/// The path of the join endpoint of `id`.
pub(crate) fn join_path(id: ShardId) -> String {
    format!("{PREFIX}{id}/join")
}

/// The path streaming `id` from byte `from`.
pub(crate) fn stream_path(id: ShardId, from: u64) -> String {
    format!("{PREFIX}{id}/{from}")
}

/// The path streaming bytes `from..to` of `id`.
pub(crate) fn range_path(id: ShardId, from: u64, to: u64) -> String {
    format!("{PREFIX}{id}/{from}-{to}")
}

/// The path of a holder's copy of `id`.
pub(crate) fn copy_path(id: ShardId) -> String {
    format!("{PREFIX}{id}")
}

/// Where a member serves its copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Serves {
    /// `host:port`.
    pub addr: String,
    /// Over TLS.
    pub tls: bool,
}

/// A join (or rejoin) of a shard's tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JoinRequest {
    /// The fetch's random id, the same on every rejoin.
    pub member: u64,
    /// Bytes of the shard the member holds already (a piece boundary).
    pub from: u64,
    /// Where it serves what it receives; `None`: a leaf.
    pub serves: Option<Serves>,
    /// It serves only clients with a certificate from its `tls-client-ca`
    /// (mutual TLS; with `serves` over TLS only).
    pub serves_client_auth: bool,
    /// The holder that just failed it, if any.
    pub failed: Option<String>,
    /// `failed` did not fail: it was late, and the member's alternates
    /// took over from it (the owner moves it out of others' paths all the
    /// same).
    pub late: bool,
    /// It fetches from more than one source at once: the owner may name
    /// alternates besides the parent.
    pub alternates: bool,
}

impl JoinRequest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MAX_JOIN_REQUEST);
        v.push(VERSION);
        v.extend_from_slice(&self.member.to_be_bytes());
        v.extend_from_slice(&self.from.to_be_bytes());
        let flags = match &self.serves {
            None => 0,
            Some(s) => FLAG_SERVES | if s.tls { FLAG_TLS } else { 0 },
        };
        v.push(
            flags
                | if self.alternates { FLAG_ALTERNATES } else { 0 }
                | if self.late { FLAG_LATE } else { 0 }
                | if self.serves_client_auth {
                    FLAG_CLIENT_AUTH
                } else {
                    0
                },
        );
        push_addr(&mut v, self.serves.as_ref().map(|s| s.addr.as_str()));
        push_addr(&mut v, self.failed.as_deref());
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<JoinRequest, String> {
        let mut r = Reader { b, at: 0 };
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(format!(
                "join request version {version} (this owner reads {VERSION})"
            ));
        }
        let member = r.u64("member id")?;
        let from = r.u64("offset")?;
        let flags = r.u8("flags")?;
        if flags & !(FLAG_SERVES | FLAG_TLS | FLAG_ALTERNATES | FLAG_LATE | FLAG_CLIENT_AUTH) != 0 {
            return Err(format!("unknown join flags {flags:#04x}"));
        }
        if flags & FLAG_CLIENT_AUTH != 0
            && flags & (FLAG_SERVES | FLAG_TLS) != FLAG_SERVES | FLAG_TLS
        {
            return Err("the client-certificates flag is set without serving over TLS".into());
        }
        let addr = r.addr("serving address")?;
        let serves = match (flags & FLAG_SERVES != 0, addr) {
            (true, Some(addr)) => Some(Serves {
                addr,
                tls: flags & FLAG_TLS != 0,
            }),
            (false, None) => None,
            (true, None) => return Err("the serves flag is set without an address".into()),
            (false, Some(_)) => return Err("an address is given without the serves flag".into()),
        };
        let failed = r.addr("failed holder's address")?;
        let late = flags & FLAG_LATE != 0;
        if late && failed.is_none() {
            return Err("the late flag is set without the late holder's address".into());
        }
        r.end("join request")?;
        Ok(JoinRequest {
            member,
            from,
            serves,
            failed,
            late,
            alternates: flags & FLAG_ALTERNATES != 0,
            serves_client_auth: flags & FLAG_CLIENT_AUTH != 0,
        })
    }
}

/// Whom a member fetches from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parent {
    /// The owner itself.
    Owner,
    /// A holder.
    Holder(Serves),
}

/// The owner's answer to a join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JoinReply {
    pub len: u64,
    pub piece: u32,
    pub parent: Parent,
    /// The owner did not record the member (its tree is full): it must
    /// keep no copy, since no removal would reach it.
    pub no_copy: bool,
    /// What the owner will send with a removal or a move of the member's
    /// copy (zeros when it keeps none).
    pub key: RemovalKey,
    pub hashes: Vec<PieceHash>,
    /// Other sources the member may take pieces from when its parent
    /// falls behind (only for a joiner that asked; at most
    /// [`MAX_ALTERNATES`]).
    pub alternates: Vec<Parent>,
}

impl JoinReply {
    /// The whole reply (the owner sends [`encode_head`](Self::encode_head)
    /// and the shard's hashes, encoded once).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = self.encode_head();
        v.extend_from_slice(&encode_hashes(&self.hashes));
        v.extend_from_slice(&self.encode_alternates());
        v
    }

    /// What follows the hashes: the alternates, when there are any.
    pub(crate) fn encode_alternates(&self) -> Vec<u8> {
        if self.alternates.is_empty() {
            return Vec::new();
        }
        debug_assert!(self.alternates.len() <= MAX_ALTERNATES);
        let mut v = Vec::with_capacity(MAX_ALTERNATES_BYTES);
        v.push(self.alternates.len() as u8);
        for a in &self.alternates {
            match a {
                Parent::Owner => {
                    v.push(PARENT_OWNER);
                    push_addr(&mut v, None);
                }
                Parent::Holder(s) => {
                    v.push(if s.tls { PARENT_TLS } else { 0 });
                    push_addr(&mut v, Some(&s.addr));
                }
            }
        }
        v
    }

    /// Everything but the hashes (the owner sends the shard's encoded
    /// hashes, made once, after it).
    pub(crate) fn encode_head(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(15 + MAX_ADDR_LEN);
        v.push(VERSION);
        v.extend_from_slice(&self.len.to_be_bytes());
        v.extend_from_slice(&self.piece.to_be_bytes());
        let no_copy = if self.no_copy { NO_COPY } else { 0 }
            | if self.alternates.is_empty() {
                0
            } else {
                HAS_ALTERNATES
            };
        match &self.parent {
            Parent::Owner => {
                v.push(PARENT_OWNER | no_copy);
                push_addr(&mut v, None);
            }
            Parent::Holder(s) => {
                v.push(if s.tls { PARENT_TLS } else { 0 } | no_copy);
                push_addr(&mut v, Some(&s.addr));
            }
        }
        v.extend_from_slice(&self.key);
        v
    }

    /// Decodes a reply for a shard of `len` bytes, checking that its pieces
    /// cover exactly that length with pieces of at least `min_piece` bytes.
    pub(crate) fn decode(b: &[u8], len: u64, min_piece: u64) -> Result<JoinReply, String> {
        let mut r = Reader { b, at: 0 };
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(format!(
                "join reply version {version} (this consumer reads {VERSION})"
            ));
        }
        let got_len = r.u64("length")?;
        if got_len != len {
            return Err(format!(
                "the reply is for {got_len} bytes, the descriptor says {len}"
            ));
        }
        let piece = r.u32("piece size")?;
        if u64::from(piece) < min_piece {
            return Err(format!("piece size {piece} is under {min_piece} bytes"));
        }
        let flags = r.u8("parent flags")?;
        let no_copy = flags & NO_COPY != 0;
        let has_alternates = flags & HAS_ALTERNATES != 0;
        let parent = r.source(flags & !(NO_COPY | HAS_ALTERNATES), "parent")?;
        let key: RemovalKey = r.take(16, "removal key")?.try_into().expect("16 bytes");
        let k = r.u32("piece count")?;
        let want = super::piece_count(len, u64::from(piece));
        if u64::from(k) != want {
            return Err(format!(
                "{k} piece hashes for {len} bytes in pieces of {piece} (expected {want})"
            ));
        }
        let mut hashes = Vec::with_capacity(k as usize);
        for _ in 0..k {
            let h = r.take(32, "piece hash")?;
            hashes.push(h.try_into().expect("32 bytes"));
        }
        let mut alternates = Vec::new();
        if has_alternates {
            let m = r.u8("alternates count")? as usize;
            if m == 0 || m > MAX_ALTERNATES {
                return Err(format!(
                    "{m} alternates (1 to {MAX_ALTERNATES} follow the flag)"
                ));
            }
            for _ in 0..m {
                let f = r.u8("alternate flags")?;
                alternates.push(r.source(f, "alternate")?);
            }
        }
        r.end("join reply")?;
        Ok(JoinReply {
            len,
            piece,
            parent,
            no_copy,
            key,
            hashes,
            alternates,
        })
    }
}

/// The hash part of a join reply: the piece count and every hash.
pub(crate) fn encode_hashes(hashes: &[PieceHash]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + 32 * hashes.len());
    v.extend_from_slice(&(hashes.len() as u32).to_be_bytes());
    for h in hashes {
        v.extend_from_slice(h);
    }
    v
}

fn push_addr(v: &mut Vec<u8>, addr: Option<&str>) {
    let a = addr.unwrap_or("");
    debug_assert!(a.len() <= MAX_ADDR_LEN);
    v.push(a.len() as u8);
    v.extend_from_slice(a.as_bytes());
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], String> {
        let end = self.at + n;
        if end > self.b.len() {
            return Err(format!(
                "cut short: {} bytes end inside the {what}",
                self.b.len()
            ));
        }
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_be_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    /// A length-prefixed `host:port`; length 0 is `None`.
    fn addr(&mut self, what: &str) -> Result<Option<String>, String> {
        let n = self.u8(what)? as usize;
        if n == 0 {
            return Ok(None);
        }
        let raw = self.take(n, what)?;
        let s = std::str::from_utf8(raw).map_err(|_| format!("the {what} is not UTF-8"))?;
        parse_host_port(s).map_err(|why| format!("the {what} {s:?}: {why}"))?;
        Ok(Some(s.to_owned()))
    }

    /// A source: `flags` (1 the owner, 2 TLS) and a length-prefixed
    /// address, none for the owner.
    fn source(&mut self, flags: u8, what: &str) -> Result<Parent, String> {
        let addr = self.addr(&format!("{what} address"))?;
        match (flags, addr) {
            (PARENT_OWNER, None) => Ok(Parent::Owner),
            (0 | PARENT_TLS, Some(addr)) => Ok(Parent::Holder(Serves {
                addr,
                tls: flags == PARENT_TLS,
            })),
            (f, a) => Err(format!(
                "{what} flags {f:#04x} do not fit {}",
                if a.is_some() {
                    "an address"
                } else {
                    "a missing address"
                }
            )),
        }
    }

    fn end(&self, what: &str) -> Result<(), String> {
        if self.at != self.b.len() {
            return Err(format!(
                "{} bytes after the end of the {what}",
                self.b.len() - self.at
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ShardId {
        ShardId::from_u128(0xabc)
    }

    #[test]
    fn paths_round_trip_and_refuse_what_is_not_theirs() {
        let rest = |p: &str| p.strip_prefix(PREFIX).unwrap().to_owned();
        assert_eq!(
            parse_path(&rest(&join_path(id()))),
            Ok(Endpoint::Join(id()))
        );
        assert_eq!(
            parse_path(&rest(&stream_path(id(), 262_144))),
            Ok(Endpoint::Stream(id(), 262_144, None))
        );
        assert_eq!(
            parse_path(&rest(&range_path(id(), 16_384, 32_768))),
            Ok(Endpoint::Stream(id(), 16_384, Some(32_768)))
        );
        assert_eq!(
            parse_path(&rest(&copy_path(id()))),
            Ok(Endpoint::Copy(id()))
        );
        for bad in [
            "00000000000000000000000000000abc/5-5",
            "00000000000000000000000000000abc/6-5",
            "00000000000000000000000000000abc/1-",
            "00000000000000000000000000000abc/-",
            "00000000000000000000000000000abc/1-2-3",
            "00000000000000000000000000000abc/1-99999999999999999999",
            "xyz",
            "00000000000000000000000000000abc/",
            "00000000000000000000000000000abc/-1",
            "00000000000000000000000000000abc/1/2",
            "00000000000000000000000000000abc/99999999999999999999",
        ] {
            assert!(parse_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn join_requests_round_trip() {
        for req in [
            JoinRequest {
                member: 7,
                ..JoinRequest::default()
            },
            JoinRequest {
                member: u64::MAX,
                from: 1 << 30,
                serves: Some(Serves {
                    addr: "10.0.0.3:7071".into(),
                    tls: true,
                }),
                failed: Some("node9.example:7071".into()),
                alternates: true,
                ..JoinRequest::default()
            },
        ] {
            assert_eq!(JoinRequest::decode(&req.encode()), Ok(req));
        }
    }

    #[test]
    fn malformed_join_requests_are_refused_with_the_reason() {
        let good = JoinRequest {
            member: 1,
            serves: Some(Serves {
                addr: "10.0.0.3:7071".into(),
                tls: false,
            }),
            ..JoinRequest::default()
        }
        .encode();
        let mut v = good.clone();
        v[0] = 1;
        assert!(JoinRequest::decode(&v).unwrap_err().contains("version 1"));
        assert!(JoinRequest::decode(&good[..10])
            .unwrap_err()
            .contains("cut short"));
        let mut v = good.clone();
        v.push(0);
        assert!(JoinRequest::decode(&v)
            .unwrap_err()
            .contains("after the end"));
        let mut v = good.clone();
        v[17] = 0;
        assert!(JoinRequest::decode(&v)
            .unwrap_err()
            .contains("without the serves flag"));
        let mut v = good.clone();
        v[17] = 0x80 | FLAG_SERVES;
        assert!(JoinRequest::decode(&v)
            .unwrap_err()
            .contains("unknown join flags"));
        let mut v = good;
        v[19] = b' ';
        assert!(JoinRequest::decode(&v)
            .unwrap_err()
            .contains("serving address"));
    }

    #[test]
    fn join_replies_round_trip_and_must_cover_the_shard() {
        let reply = JoinReply {
            len: 600,
            piece: 256,
            parent: Parent::Holder(Serves {
                addr: "10.0.0.4:7071".into(),
                tls: false,
            }),
            no_copy: false,
            key: [7; 16],
            hashes: vec![[1; 32], [2; 32], [3; 32]],
            alternates: vec![],
        };
        let b = reply.encode();
        assert_eq!(JoinReply::decode(&b, 600, 16), Ok(reply.clone()));
        assert!(JoinReply::decode(&b, 601, 16)
            .unwrap_err()
            .contains("descriptor says 601"));
        assert!(JoinReply::decode(&b, 600, 512)
            .unwrap_err()
            .contains("under 512"));
        let short = JoinReply {
            hashes: vec![[1; 32], [2; 32]],
            ..reply
        };
        assert!(JoinReply::decode(&short.encode(), 600, 16)
            .unwrap_err()
            .contains("expected 3"));
        let owner = JoinReply {
            len: 0,
            piece: 256,
            parent: Parent::Owner,
            no_copy: true,
            key: [0; 16],
            hashes: vec![],
            alternates: vec![],
        };
        assert_eq!(JoinReply::decode(&owner.encode(), 0, 16), Ok(owner));
    }

    #[test]
    fn alternates_follow_the_hashes_when_flagged() {
        let holder = |n: u8, tls: bool| {
            Parent::Holder(Serves {
                addr: format!("10.0.0.{n}:7071"),
                tls,
            })
        };
        let reply = JoinReply {
            len: 600,
            piece: 256,
            parent: holder(4, false),
            no_copy: false,
            key: [7; 16],
            hashes: vec![[1; 32], [2; 32], [3; 32]],
            alternates: vec![holder(3, true), Parent::Owner],
        };
        let b = reply.encode();
        assert_eq!(JoinReply::decode(&b, 600, 16), Ok(reply.clone()));
        assert!(b.len() <= 15 + 255 + 16 + 4 + 3 * 32 + MAX_ALTERNATES_BYTES);
        // Without the flag, bytes after the hashes are refused.
        let plain = JoinReply {
            alternates: vec![],
            ..reply.clone()
        }
        .encode();
        let mut v = plain.clone();
        v.extend_from_slice(&reply.encode_alternates());
        assert!(JoinReply::decode(&v, 600, 16)
            .unwrap_err()
            .contains("after the end"));
        // The flag with no alternates, or more than the limit, is refused.
        let mut v = plain.clone();
        v[13] |= HAS_ALTERNATES;
        v.push(0);
        assert!(JoinReply::decode(&v, 600, 16)
            .unwrap_err()
            .contains("0 alternates"));
        let mut v = plain;
        v[13] |= HAS_ALTERNATES;
        v.push(MAX_ALTERNATES as u8 + 1);
        assert!(JoinReply::decode(&v, 600, 16)
            .unwrap_err()
            .contains("alternates (1 to"));
        // A cut-short alternate.
        let mut v = b.clone();
        v.pop();
        assert!(JoinReply::decode(&v, 600, 16)
            .unwrap_err()
            .contains("cut short"));
    }
}
