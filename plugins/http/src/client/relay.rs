//! Consumer side of relaying (see `crate::relay`): join the shard's tree at
//! its owner, stream it piece by piece from the parent the owner names,
//! check every piece against the owner's hash, keep a copy for the
//! consumer's own children, and fail over to another holder (or the owner)
//! when a parent fails.

use bytes::Bytes;

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::relay::{
    wire::{self as rwire, JoinReply, JoinRequest, Parent, Serves},
    Filling, Holding, Holdings,
};

/// Rejoins one fetch makes before it takes the rest from the owner.
const MAX_REJOINS: usize = 16;
/// Times a quiet relay is asked again, without progress in between, before
/// it is reported failed.
const MAX_QUIET_RETRIES: usize = 1;

/// What a relayed fetch needs from the transport.
pub(crate) struct RelaySetup<'a> {
    /// Where this node serves its copies (`None`: it joins as a leaf).
    pub serves: Option<Serves>,
    /// This node's server requires client certificates (mutual TLS).
    pub serves_client_auth: bool,
    pub holdings: &'a Holdings,
    /// `relay-stall-timeout`.
    pub stall: Duration,
    /// The smallest piece size an owner may use.
    pub min_piece: u64,
    /// `relay-sources`: sources one fetch takes pieces from at once.
    pub sources: u32,
    /// `relay-lag`: the least time without a piece that makes a source late.
    pub lag: Duration,
}

/// The owner's answer to a join.
enum Joined {
    Reply(JoinReply),
    /// The owner does not relay this shard (a GPU shard, an empty one, or
    /// an owner from before relays): fetch it plainly.
    NotRelayable(String),
}

/// Where the bytes of one stream come from.
#[derive(Clone, Copy)]
pub(super) struct Source<'s> {
    pub(super) addr: &'s str,
    pub(super) tls: bool,
    pub(super) owner: bool,
}

impl<'s> Source<'s> {
    fn of(parent: &'s Parent, desc: &'s Descriptor) -> Source<'s> {
        match parent {
            Parent::Owner => Source {
                addr: &desc.addr,
                tls: desc.tls,
                owner: true,
            },
            Parent::Holder(s) => Source {
                addr: &s.addr,
                tls: s.tls,
                owner: false,
            },
        }
    }
}

/// Where verified pieces go.
pub(super) trait Sink {
    /// Memory to read piece bytes `start..start + n` into directly, when
    /// there is such memory (host memory; not a device).
    fn direct(&mut self, start: usize, n: usize) -> Option<&mut [u8]>;
    /// Takes a verified piece read elsewhere.
    fn put(&mut self, start: usize, piece: &[u8]) -> PluginResult<()>;
}

/// The host's destination buffer.
struct HostSink<'a>(&'a mut [u8]);

impl Sink for HostSink<'_> {
    fn direct(&mut self, start: usize, n: usize) -> Option<&mut [u8]> {
        Some(&mut self.0[start..start + n])
    }

    fn put(&mut self, start: usize, piece: &[u8]) -> PluginResult<()> {
        self.0[start..start + piece.len()].copy_from_slice(piece);
        Ok(())
    }
}

/// Device memory at `base`, reached through a ring of pinned buffers.
struct DeviceSink<'a> {
    up: &'a mut crate::gpu::Uploader,
    base: u64,
    ordinal: u32,
}

impl Sink for DeviceSink<'_> {
    fn direct(&mut self, _: usize, _: usize) -> Option<&mut [u8]> {
        None
    }

    fn put(&mut self, start: usize, piece: &[u8]) -> PluginResult<()> {
        let failed = |why: String| {
            AbiError::new(
                ErrorKind::IO,
                format!(
                    "http: copying a relayed piece into cuda:{}: {why}",
                    self.ordinal
                ),
            )
        };
        // Ring buffers are `device-piece` bytes, relay pieces at most that
        // (or split across buffers when larger).
        let mut done = 0;
        while done < piece.len() {
            let buf = self.up.next_buffer().map_err(failed)?;
            let n = buf.len().min(piece.len() - done);
            buf[..n].copy_from_slice(&piece[done..done + n]);
            self.up
                .submit(self.base + (start + done) as u64, n)
                .map_err(failed)?;
            done += n;
        }
        Ok(())
    }
}

/// What one stream from a source showed, besides its result.
#[derive(Default)]
pub(super) struct Seen {
    /// The source answered 200 (a relay that did, then went quiet, may be
    /// waiting for its own parent).
    pub(super) answered: bool,
    /// The relay no longer holds the piece asked for (`relay-window`): not
    /// a failure of the relay; the rest comes from the owner.
    pub(super) evicted: bool,
    /// The parent stayed late while the alternates took over this many
    /// runs from it (0: it did not): it is reported late at the rejoin.
    pub(super) late: u32,
    /// The owner demoted this relay and asked it to rejoin.
    pub(super) moved: bool,
}

/// The pieces of one shard as the owner hashed them.
pub(super) struct Pieces {
    pub(super) size: u64,
    pub(super) hashes: Vec<crate::relay::PieceHash>,
}

impl Client {
    /// Fetches `desc`'s shard into `dst` through its relay tree. `Ok(None)`:
    /// the owner does not relay it; fetch it plainly.
    pub(crate) fn fetch_relayed(
        &self,
        desc: &Descriptor,
        dst: &mut [u8],
        setup: &RelaySetup<'_>,
    ) -> PluginResult<Option<ImportInfo>> {
        self.fetch_relayed_into(desc, &mut HostSink(dst), setup)
    }

    /// [`fetch_relayed`](Self::fetch_relayed) of a GPU shard into device
    /// memory at `dst` on device `ordinal`, through the ring of pinned
    /// buffers GPU fetches use.
    pub(crate) fn fetch_relayed_device(
        &self,
        desc: &Descriptor,
        ordinal: u32,
        dst: u64,
        ring: &DeviceRing,
        setup: &RelaySetup<'_>,
    ) -> PluginResult<Option<ImportInfo>> {
        let mut up = self.uploader(ring, ordinal)?;
        let mut sink = DeviceSink {
            up: &mut up,
            base: dst,
            ordinal,
        };
        let r = self.fetch_relayed_into(desc, &mut sink, setup);
        let r = match r {
            Ok(Some(info)) => up
                .finish()
                .map(|()| Some(info))
                .map_err(|why| AbiError::new(ErrorKind::IO, format!("http: {why}"))),
            other => other,
        };
        if r.is_ok() {
            self.uploaders.give_back(up);
        }
        r
    }

    fn fetch_relayed_into(
        &self,
        desc: &Descriptor,
        dst: &mut dyn Sink,
        setup: &RelaySetup<'_>,
    ) -> PluginResult<Option<ImportInfo>> {
        let mut filling = setup
            .serves
            .as_ref()
            .and_then(|_| setup.holdings.fill(desc.id, desc.len));
        let r = self.relay_rounds(desc, dst, setup, &mut filling);
        match (filling, &r) {
            (Some(f), Ok(Some(_))) => f.complete(),
            (Some(f), Ok(None)) => f.fail("its owner does not relay it"),
            (Some(f), Err(e)) => f.fail(&format!("its fetch failed: {}", e.message)),
            (None, _) => {}
        }
        if matches!(r, Ok(Some(_))) {
            self.stats.relay_fetches.inc();
        }
        r
    }

    fn relay_rounds(
        &self,
        desc: &Descriptor,
        dst: &mut dyn Sink,
        setup: &RelaySetup<'_>,
        filling: &mut Option<Filling<'_>>,
    ) -> PluginResult<Option<ImportInfo>> {
        let owner_pool = self.pool(&Owner::of(desc));
        let member = member_id();
        let mut at = 0u64;
        // With more than one source: the pieces held, in any order.
        let mut have: Option<multi::Have> = None;
        let mut failed: Option<String> = None;
        // `failed` was late, not failed.
        let mut late = false;
        let mut pieces: Option<Pieces> = None;
        let mut history: Vec<String> = Vec::new();
        // A relay no longer held what this fetch needs: the owner serves the rest.
        let mut to_owner = false;
        for round in 0..=MAX_REJOINS {
            // Only a member that keeps a copy serves.
            let serves = filling.as_ref().and(setup.serves.clone());
            let join = JoinRequest {
                member,
                from: at,
                serves_client_auth: setup.serves_client_auth
                    && serves.as_ref().is_some_and(|s| s.tls),
                serves,
                failed: failed.take(),
                late: std::mem::take(&mut late),
                alternates: setup.sources > 1,
            };
            let joined = match self.join(&owner_pool, desc, &join, setup.min_piece) {
                // An owner from before late reports refuses the flag
                // (`unknown join flags`): report the holder failed instead.
                Err(e) if join.late => {
                    debug!(target: "http", shard = %desc.id, owner = %desc.addr, error = %e.message, "a late report was refused, reporting the holder failed");
                    let join = JoinRequest {
                        late: false,
                        ..join
                    };
                    self.join(&owner_pool, desc, &join, setup.min_piece)
                }
                r => r,
            };
            let reply = match joined? {
                Joined::Reply(r) => r,
                Joined::NotRelayable(why) if pieces.is_none() => {
                    debug!(target: "http", shard = %desc.id, owner = %desc.addr, %why, "not relayed");
                    return Ok(None);
                }
                Joined::NotRelayable(why) => {
                    return Err(AbiError::unavailable(format!(
                        "owner {} stopped relaying shard {} mid-fetch: {why}",
                        desc.addr, desc.id
                    )))
                }
            };
            if let Some(f) = filling.as_ref().filter(|_| !reply.no_copy) {
                f.holding.set_key(reply.key);
            }
            if reply.no_copy {
                // The owner's tree is full: no removal would reach a copy.
                if let Some(f) = filling.take() {
                    f.fail("its owner keeps no record of this consumer (a full tree)");
                }
            }
            let holding = filling.as_ref().map(|f| &*f.holding);
            match &pieces {
                None => {
                    if let Some(h) = holding {
                        h.set_piece(u64::from(reply.piece));
                    }
                    if setup.sources > 1 {
                        have = Some(multi::Have::new(reply.hashes.len() as u64));
                    }
                    pieces = Some(Pieces {
                        size: u64::from(reply.piece),
                        hashes: reply.hashes,
                    });
                }
                Some(p) if p.size != u64::from(reply.piece) || p.hashes != reply.hashes => {
                    return Err(AbiError::unavailable(format!(
                        "owner {} changed the pieces of shard {} mid-fetch (did it restart?)",
                        desc.addr, desc.id
                    )))
                }
                Some(_) => {}
            }
            let pieces = pieces.as_ref().expect("set above");
            // Out of rejoins: the rest comes from the owner.
            let parent = if round == MAX_REJOINS || to_owner {
                Parent::Owner
            } else {
                reply.parent
            };
            let source = Source::of(&parent, desc);
            if desc.tls && !source.tls {
                // Never a plain holder for a TLS owner's shard.
                history.push(format!("relay {} refused (plain HTTP)", source.addr));
                failed = Some(source.addr.to_owned());
                self.stats.relay_failovers.inc();
                continue;
            }
            // Alternates: when the parent is a holder, and only those a TLS
            // owner's shard may be fetched from.
            let alternates: Vec<Source<'_>> = if matches!(parent, Parent::Holder(_)) {
                reply
                    .alternates
                    .iter()
                    .map(|a| Source::of(a, desc))
                    .filter(|a| a.tls || !desc.tls)
                    .take(setup.sources.saturating_sub(1) as usize)
                    .collect()
            } else {
                Vec::new()
            };
            let mut sources = vec![source];
            sources.extend(alternates);
            let mut seen = Seen::default();
            let mut stream = |at: &mut u64, seen: &mut Seen| match have.as_mut() {
                None => self.stream_from(
                    &sources[0],
                    desc,
                    at,
                    dst,
                    pieces,
                    holding,
                    setup.stall,
                    seen,
                ),
                Some(have) => {
                    let r = self.fetch_from_sources(
                        &sources,
                        desc,
                        have,
                        dst,
                        pieces,
                        holding,
                        (setup.stall, setup.lag),
                        seen,
                    );
                    // What a rejoin reports (and the quiet retry's progress).
                    *at = have.contiguous(pieces.size, desc.len);
                    r
                }
            };
            let mut streamed = stream(&mut at, &mut seen);
            // A relay that answered and then went quiet may only be waiting
            // for its own parent (it rejoins within its own timeout): ask it
            // again before blaming it. A live relay answers at once and
            // streams on; a dead or stopped one refuses or stays silent (a
            // relay that never answered is not asked again).
            let mut quiet_retries = 0;
            while let Err(e) = &streamed {
                if source.owner
                    || !seen.answered
                    || e.kind != ErrorKind::TIMEOUT
                    || quiet_retries >= MAX_QUIET_RETRIES
                {
                    break;
                }
                quiet_retries += 1;
                let before = at;
                seen = Seen::default();
                debug!(target: "http", shard = %desc.id, relay = source.addr, at, "relay quiet, asking it again");
                streamed = stream(&mut at, &mut seen);
                if at > before {
                    quiet_retries = 0;
                }
            }
            match streamed {
                Ok(()) => {
                    if !source.owner {
                        // Bytes from holders: the owner, which removes,
                        // confirms the shard still exists before they are
                        // returned (a holder that ignored the removal
                        // cannot complete a removed shard).
                        self.still_exported(&owner_pool, desc)?;
                    }
                    let from = if source.owner {
                        format!("from owner {} (relay tree root)", desc.addr)
                    } else {
                        format!("from relay {}, owner {}", source.addr, desc.addr)
                    };
                    let from = match &have {
                        Some(h) if h.from_alternates > 0 => format!(
                            "{from}; {} of {} pieces from alternates ({} late runs taken over)",
                            h.from_alternates,
                            pieces.hashes.len(),
                            h.taken_over
                        ),
                        _ => from,
                    };
                    // Short, whatever happened: it ends up in the fetch's reason.
                    let note = match history.len() {
                        0 => from,
                        1..=3 => format!("{from}; after {}", history.join(", ")),
                        n => format!(
                            "{from}; after {}, and {} more",
                            history[..3].join(", "),
                            n - 3
                        ),
                    };
                    return Ok(Some(ImportInfo { note: note.into() }));
                }
                // Before the owner's arm: a relay whose parent is the
                // owner is moved too (the owner is not failing).
                Err(_) if seen.moved => {
                    debug!(target: "http", shard = %desc.id, parent = source.addr, at, "the owner demoted this relay, rejoining (at the tail)");
                    self.stats.relay_moves.inc();
                    history.push("moved by the owner (a member it fed reported it)".into());
                }
                Err(e) if source.owner => return Err(e),
                Err(e) if seen.late > 0 => {
                    debug!(target: "http", shard = %desc.id, relay = source.addr, error = %e.message, at, "parent late, reporting it and rejoining");
                    self.stats.relay_late_parents.inc();
                    history.push(format!(
                        "relay {} late ({} runs taken over), replaced",
                        source.addr, seen.late
                    ));
                    failed = Some(source.addr.to_owned());
                    late = true;
                }
                Err(e) if seen.evicted => {
                    debug!(target: "http", shard = %desc.id, relay = source.addr, error = %e.message, at, "relay window passed, the owner serves the rest");
                    history.push(format!(
                        "relay {} no longer held byte {at} (relay-window)",
                        source.addr
                    ));
                    to_owner = true;
                }
                Err(e) => {
                    debug!(target: "http", shard = %desc.id, relay = source.addr, error = %e.message, at, "relay failed, rejoining");
                    self.stats.relay_failovers.inc();
                    history.push(format!("relay {} failed at byte {at}", source.addr));
                    failed = Some(source.addr.to_owned());
                }
            }
        }
        unreachable!("the last round streams from the owner, which returns")
    }

    /// Asks the owner whether it still exports `desc`'s shard (an empty
    /// stream from its end): `NOT_FOUND` when it was removed.
    fn still_exported(&self, pool: &Arc<OwnerPool>, desc: &Descriptor) -> PluginResult<()> {
        let path = rwire::stream_path(desc.id, desc.len);
        let req = Request {
            method: "GET",
            path: &path,
            body: &[],
            read_timeout: None,
        };
        let (mut co, head) = self.exchange(pool, &req)?;
        if head.status == 404 {
            let e = self.error_response(pool, &head, &mut co, "the check of a relayed fetch");
            return Err(AbiError::new(
                ErrorKind::NOT_FOUND,
                format!(
                    "shard {} was removed by its owner {} while it was fetched through relays; its bytes are not returned ({})",
                    desc.id, desc.addr, e.message
                ),
            ));
        }
        if head.status != 200 || head.content_length != Some(0) {
            return Err(self.error_response(
                pool,
                &head,
                &mut co,
                &format!(
                    "the check that owner {} still exports shard {}",
                    desc.addr, desc.id
                ),
            ));
        }
        co.reusable = !head.close;
        Ok(())
    }

    /// `POST /v1/relay/{id}/join` at the owner.
    fn join(
        &self,
        pool: &Arc<OwnerPool>,
        desc: &Descriptor,
        join: &JoinRequest,
        min_piece: u64,
    ) -> PluginResult<Joined> {
        let path = rwire::join_path(desc.id);
        let body = join.encode();
        let req = Request {
            method: "POST",
            path: &path,
            body: &body,
            read_timeout: None,
        };
        let (mut co, head) = self.exchange(pool, &req)?;
        if head.status != 200 {
            let e = self.error_response(
                pool,
                &head,
                &mut co,
                &format!("a join of shard {}", desc.id),
            );
            // An owner from before relays, or from before BLAKE3 piece
            // hashes (it reads join version 1 only): fetch from it directly.
            let old_owner = (head.status == 404 && e.message.contains("(no_such_endpoint)"))
                || (head.status == 400 && e.message.contains("join request version"));
            if head.status == 409 || old_owner {
                return Ok(Joined::NotRelayable(e.message.into()));
            }
            return Err(e);
        }
        let max = 64
            + 32 * crate::relay::piece_count(desc.len, min_piece)
            + 255
            + rwire::MAX_ALTERNATES_BYTES as u64;
        let n = head.content_length.unwrap_or(u64::MAX);
        if n > max {
            return Err(AbiError::internal(format!(
                "owner {} sent a join reply of {n} bytes for shard {}, more than its {max} \
                 bytes of piece hashes can take",
                pool.addr, desc.id
            )));
        }
        let mut bytes = vec![0u8; n as usize];
        let mut body = Body::new(co.conn(), &pool.addr, self.request_timeout, n);
        body.read_exact(&mut bytes, What::JoinReply)?;
        co.reusable = body.complete() && !head.close;
        JoinReply::decode(&bytes, desc.len, min_piece)
            .map(Joined::Reply)
            .map_err(|why| {
                AbiError::internal(format!(
                    "owner {} sent a malformed join reply for shard {}: {why}",
                    pool.addr, desc.id
                ))
            })
    }

    /// Streams the shard from `at` to its end from `source`, checking each
    /// piece; `at` advances past every piece verified, so a failure leaves
    /// it where the next source resumes.
    #[allow(clippy::too_many_arguments)]
    fn stream_from(
        &self,
        source: &Source<'_>,
        desc: &Descriptor,
        at: &mut u64,
        dst: &mut dyn Sink,
        pieces: &Pieces,
        holding: Option<&Holding>,
        stall: Duration,
        seen: &mut Seen,
    ) -> PluginResult<()> {
        let pool = self.pool(&Owner {
            addr: source.addr.to_owned(),
            tls: source.tls,
        });
        let want = desc.len - *at;
        let (mut co, head, timeout) =
            self.ask_source(&pool, source, desc, (*at, desc.len), stall, seen)?;
        let mut body = Body::new(co.conn(), &pool.addr, timeout, want);
        while *at < desc.len {
            let n = pieces.size.min(desc.len - *at) as usize;
            let k = (*at / pieces.size) as usize;
            let start = *at as usize;
            // A relay delivers each piece within relay-stall-timeout (a
            // trickle of bytes never trips the per-read timeout).
            if !source.owner {
                body.deadline = Some(Instant::now() + stall);
            }
            // A leaf reads straight into host memory; a relay into a piece
            // of its own (kept for its children), as does a device fetch.
            match (holding, dst.direct(start, n)) {
                (None, Some(out)) => {
                    body.read_exact(out, What::Shard(desc.id))?;
                    self.check_piece(source, desc, pieces, k, out)?;
                }
                (holding, _) => {
                    let mut buf = vec![0u8; n];
                    body.read_exact(&mut buf, What::Shard(desc.id))?;
                    self.check_piece(source, desc, pieces, k, &buf)?;
                    dst.put(start, &buf)?;
                    if let Some(h) = holding {
                        h.push(Bytes::from(buf));
                    }
                }
            }
            self.stats.relay_bytes_received.add(n as u64);
            if !source.owner {
                self.stats.relay_bytes_from_holders.add(n as u64);
            }
            *at += n as u64;
            if *at < desc.len && holding.is_some_and(|h| h.take_rejoin()) {
                // The owner demoted this relay: rejoin (the connection is
                // left with its body unread: not pooled).
                seen.moved = true;
                return Err(AbiError::unavailable(format!(
                    "the owner of shard {} moved this relay: rejoining",
                    desc.id
                )));
            }
        }
        // Connections that carried a relay's shorter timeout are not pooled.
        co.reusable = source.owner && body.complete() && !head.close;
        Ok(())
    }

    /// Asks `source` for bytes `from..to` of the shard (the stream to its
    /// end, or a range) and checks the answer's head: 200, and exactly
    /// those bytes of a shard of the descriptor's length. Returns the
    /// connection, the head and the read timeout the connection carries (a
    /// relay's `relay-stall-timeout`, the owner's request timeout). A relay
    /// connection whose answer was refused is not pooled, nor one whose
    /// body was not what was asked (it is left unread).
    pub(super) fn ask_source(
        &self,
        pool: &Arc<OwnerPool>,
        source: &Source<'_>,
        desc: &Descriptor,
        (from, to): (u64, u64),
        stall: Duration,
        seen: &mut Seen,
    ) -> PluginResult<(Checkout, ResponseHead, Duration)> {
        let path = if to == desc.len {
            rwire::stream_path(desc.id, from)
        } else {
            rwire::range_path(desc.id, from, to)
        };
        let timeout = if source.owner {
            self.request_timeout
        } else {
            stall
        };
        let req = Request {
            method: "GET",
            path: &path,
            body: &[],
            read_timeout: Some(timeout),
        };
        let (mut co, head) = self.exchange(pool, &req)?;
        if head.status != 200 {
            let e = self.error_response(
                pool,
                &head,
                &mut co,
                &format!(
                    "bytes {from}..{to} of shard {} from its relay tree",
                    desc.id
                ),
            );
            // It carried a relay's read timeout: never pooled.
            co.reusable = source.owner && co.reusable;
            seen.evicted = !source.owner && head.status == 410;
            return Err(e);
        }
        seen.answered = true;
        let want = to - from;
        if head.content_length != Some(want) || head.shard_len != Some(desc.len) {
            co.reusable = false;
            return Err(AbiError::internal(format!(
                "{} answered {} bytes of a {}-byte shard {} for bytes {from}..{to}: expected \
                 {want} of {}",
                source.addr,
                head.content_length.unwrap_or_default(),
                head.shard_len.unwrap_or_default(),
                desc.id,
                desc.len
            )));
        }
        Ok((co, head, timeout))
    }

    /// `Ok` when `piece` (piece `k` of the shard, from `source`) has the
    /// owner's hash; otherwise counts it corrupt and says who sent what.
    pub(super) fn check_piece(
        &self,
        source: &Source<'_>,
        desc: &Descriptor,
        pieces: &Pieces,
        k: usize,
        piece: &[u8],
    ) -> PluginResult<()> {
        if crate::relay::hash_piece(piece) == pieces.hashes[k] {
            return Ok(());
        }
        self.stats.relay_corrupt_pieces.inc();
        let start = k as u64 * pieces.size;
        Err(AbiError::new(
            ErrorKind::IO,
            format!(
                "{} sent piece {k} of shard {} (bytes {start}..{}) with a hash other than the \
                 owner's",
                source.addr,
                desc.id,
                start + piece.len() as u64
            ),
        ))
    }

    /// Tells the relay at `at`, which the owner just demoted, to rejoin the
    /// tree of `id` (`POST /v1/relay/{id}`), waiting up to `wait` for the
    /// answer (a stopped relay answers when it runs again).
    pub(crate) fn ask_rejoin(&self, at: &Serves, id: ShardId, wait: Duration) -> PluginResult<()> {
        let wait = wait.max(self.connect_timeout);
        self.tell_holder(at, id, "POST", wait, &format!("the move of {id}"))
    }

    /// Tells the holder at `at` that its copy of `id` is removed.
    pub(crate) fn drop_copy(&self, at: &Serves, id: ShardId) -> PluginResult<()> {
        let wait = self.connect_timeout;
        self.tell_holder(at, id, "DELETE", wait, &format!("the removal of {id}"))
    }

    /// `method` on the holder's copy of `id` (`/v1/relay/{id}`), answered
    /// within `wait`: 200, or the error the holder answered, naming `what`.
    fn tell_holder(
        &self,
        at: &Serves,
        id: ShardId,
        method: &'static str,
        wait: Duration,
        what: &str,
    ) -> PluginResult<()> {
        let pool = self.pool(&Owner {
            addr: at.addr.clone(),
            tls: at.tls,
        });
        let path = rwire::copy_path(id);
        let key = self.removal_key(id, &at.addr);
        let req = Request {
            method,
            path: &path,
            body: &key,
            read_timeout: Some(wait),
        };
        let (mut co, head) = self.exchange(&pool, &req)?;
        let r = if head.status == 200 {
            Ok(())
        } else {
            Err(self.error_response(&pool, &head, &mut co, what))
        };
        // A few bytes of JSON, and a read timeout of its own: not pooled.
        co.reusable = false;
        r
    }
}

/// A fetch's member id: unique enough among one shard's joiners.
fn member_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut key = [0u8; 24];
    key[..8].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    key[8..16].copy_from_slice(&nanos.to_le_bytes());
    key[16..].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&key)
}
