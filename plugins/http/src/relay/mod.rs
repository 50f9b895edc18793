//! Relays: consumers that serve a shard onward while they fetch it, so a
//! broadcast of S bytes to N nodes takes about one link's time S/B rather
//! than N·S/B on the owner's link.
//!
//! # Protocol (the README has the operator's view)
//! 1. A consumer with `relay = "on"` fetching a shard of at least
//!    `relay-min-size` first sets aside a [`Holding`] for it (so peers
//!    sent to it find it at once), then **joins** the shard's tree at its
//!    owner: `POST /v1/relay/{id}/join` ([`wire::JoinRequest`]: a random
//!    member id kept across rejoins, the bytes it already holds, the
//!    address it serves on, the holder that failed it, if any).
//! 2. The owner answers ([`wire::JoinReply`]) with the piece size, the
//!    BLAKE3 hash of every piece of the shard (computed once, from its own
//!    bytes, at the first join), and the member's **parent**: itself, or the shallowest holder
//!    with fewer than `relay-fanout` children ([`tree`]; with fanout 1 the
//!    tree is a chain).
//! 3. The consumer reads `GET /v1/relay/{id}/{from}` from its parent, piece
//!    by piece; checks every piece against the owner's hash; copies it into
//!    the host's destination and appends it to its holding, which streams it
//!    to the consumer's own children at once (cut-through: a relay forwards
//!    piece k while it receives piece k + 1).
//! 4. A parent that fails (refused, closed, silent for
//!    `relay-stall-timeout`, a piece with the wrong hash) is reported at the
//!    next join, which gives another parent; the consumer resumes at the
//!    first piece it lacks. Only the owner failing fails the fetch.
//!    With `relay-sources` > 1 the owner also names **alternates** (the
//!    nearest ancestors above the parent, within the fan-out bound), and
//!    an alternate takes over the pieces of a parent that is late
//!    (`crate::client`'s `multi`), without a rejoin; a parent that stays
//!    late is reported late at a rejoin. The owner **demotes** a holder a
//!    member it fed reported failed or late ([`tree`]): it leaves its
//!    slot, is told to rejoin (`POST /v1/relay/{id}`) and is placed at
//!    the tail, out of everyone's path.
//! 5. `unexport` at the owner forgets the tree and sends
//!    `DELETE /v1/relay/{id}` to every holder, which drops its copy and
//!    cuts the streams it serves. A consumer only ever reaches a holder
//!    through a join at the owner, which answers 404 once the shard is gone.
//!
//! GPU shards take the same path: the owner hashes and streams them staged
//! through its pinned pool; relays hold host copies; a device fetch copies
//! each verified piece to the GPU through the consumer's pinned ring.
//!
//! Integrity is end to end: hashes come from the owner over the owner's
//! connection (TLS and token included), and a relay keeps (so serves) only
//! pieces it verified. The hash is BLAKE3 (256 bits, collision resistant):
//! a holder that has the data token cannot make a piece that matches the
//! owner's hash, so whatever path the bytes took, a consumer returns only
//! the owner's bytes. (A non-cryptographic hash with a public function,
//! such as xxh3, lets anyone write a different piece with the same hash.) Relays serve with the same token and TLS settings as
//! every endpoint of the plugin; a TLS owner never sends a consumer to a
//! plain-HTTP holder.

pub(crate) mod holdings;
pub(crate) mod tree;
pub(crate) mod wire;

pub(crate) use holdings::{Filling, Holding, Holdings};
pub(crate) use tree::{TlsPolicy, Trackers};

/// What a holder's owner sends with `DELETE` or `POST /v1/relay/{id}`: the
/// key it gave that holder at its join.
pub(crate) type RemovalKey = [u8; 16];

/// The hash of one piece: BLAKE3, 32 bytes.
pub(crate) type PieceHash = [u8; 32];

/// The hash of `piece`.
pub(crate) fn hash_piece(piece: &[u8]) -> PieceHash {
    *blake3::hash(piece).as_bytes()
}

/// The hash of every `piece`-byte piece of `bytes` (the last may be shorter).
pub(crate) fn piece_hashes(bytes: &[u8], piece: u64) -> Vec<PieceHash> {
    bytes.chunks(piece as usize).map(hash_piece).collect()
}

/// [`piece_hashes`] over bytes that arrive in chunks of any size (a GPU
/// shard staged through host memory).
pub(crate) struct PieceHasher {
    piece: u64,
    in_piece: u64,
    state: blake3::Hasher,
    hashes: Vec<PieceHash>,
}

impl PieceHasher {
    pub(crate) fn new(piece: u64) -> PieceHasher {
        PieceHasher {
            piece,
            in_piece: 0,
            state: blake3::Hasher::new(),
            hashes: Vec::new(),
        }
    }

    pub(crate) fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = ((self.piece - self.in_piece) as usize).min(bytes.len());
            self.state.update(&bytes[..take]);
            self.in_piece += take as u64;
            bytes = &bytes[take..];
            if self.in_piece == self.piece {
                self.hashes.push(*self.state.finalize().as_bytes());
                self.state.reset();
                self.in_piece = 0;
            }
        }
    }

    pub(crate) fn finish(mut self) -> Vec<PieceHash> {
        if self.in_piece > 0 {
            self.hashes.push(*self.state.finalize().as_bytes());
        }
        self.hashes
    }
}

/// Pieces of a shard of `len` bytes.
pub(crate) fn piece_count(len: u64, piece: u64) -> u64 {
    len.div_ceil(piece)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_shard_the_last_one_short() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let h = piece_hashes(&bytes, 300);
        assert_eq!(h.len() as u64, piece_count(1000, 300));
        assert_eq!(h[3], *blake3::hash(&bytes[900..]).as_bytes());
        assert_ne!(h[0], h[1]);
        assert_eq!(piece_count(0, 300), 0);
        assert_eq!(piece_count(600, 300), 2);
    }

    #[test]
    fn hashing_in_chunks_of_any_size_gives_the_same_pieces() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let whole = piece_hashes(&bytes, 1024);
        for chunk in [1, 100, 1024, 3000, 10_000] {
            let mut h = PieceHasher::new(1024);
            for c in bytes.chunks(chunk) {
                h.update(c);
            }
            assert_eq!(h.finish(), whole, "chunks of {chunk}");
        }
    }
}
