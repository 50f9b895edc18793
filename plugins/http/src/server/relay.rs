//! The relay endpoints (see `crate::relay`): joins at the owner, streams
//! of a shard from the owner's export or a holder's copy, and removals
//! sent to holders.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::relay::{
    holdings::{End, Next},
    tree::Report,
    wire::{self as rwire, Endpoint, JoinReply, JoinRequest},
    Holding,
};

/// Pieces streamed ahead of the connection per response.
const STREAM_AHEAD: usize = 2;

/// How long an owner waits to resolve the name a joining relay serves on.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) async fn route(
    shared: &Shared,
    req: Request<Incoming>,
    rest: &str,
    peer: Option<std::net::IpAddr>,
) -> Response<Frames> {
    let endpoint = match rwire::parse_path(rest) {
        Ok(e) => e,
        Err(why) => return error(StatusCode::BAD_REQUEST, "bad_request", &why),
    };
    let path = req.uri().path().to_owned();
    match endpoint {
        Endpoint::Join(id) if req.method() == Method::POST => join(shared, id, req, peer).await,
        Endpoint::Join(_) => method_not_allowed(req.method(), &path, "POST"),
        Endpoint::Stream(id, from, to) if req.method() == Method::GET => {
            stream(shared, id, from, to).await
        }
        Endpoint::Stream(..) => method_not_allowed(req.method(), &path, "GET"),
        Endpoint::Copy(id) if matches!(*req.method(), Method::DELETE | Method::POST) => {
            let removal = req.method() == Method::DELETE;
            match owners_key(shared, id, req).await {
                Err(r) => r,
                Ok(()) if removal => drop_copy(shared, id),
                Ok(()) => rejoin(shared, id),
            }
        }
        Endpoint::Copy(_) => method_not_allowed(req.method(), &path, "DELETE, POST"),
    }
}

fn not_exported(shared: &Shared, id: ShardId) -> Response<Frames> {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!(
            "shard {id} is not exported by owner {} (it was removed, or never existed here)",
            shared.advertised
        ),
    )
}

/// `POST /v1/relay/{id}/join`: the owner places the member in the shard's
/// tree and answers with the piece hashes and its parent.
async fn join(
    shared: &Shared,
    id: ShardId,
    req: Request<Incoming>,
    peer: Option<std::net::IpAddr>,
) -> Response<Frames> {
    let body = match read_body(shared, req, rwire::MAX_JOIN_REQUEST).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.first() == Some(&rwire::FORGEABLE_VERSION) {
        // A build from before BLAKE3 piece hashes: it would check pieces
        // against a hash any holder can forge, so it is not relayed to (its
        // consumer fetches from this owner instead).
        return error(
            StatusCode::CONFLICT,
            "not_relayable",
            &format!(
                "shard {id}: this owner relays only to consumers that check pieces by BLAKE3 (join version {}); this one sent version {}",
                rwire::VERSION,
                rwire::FORGEABLE_VERSION
            ),
        );
    }
    let mut join = match JoinRequest::decode(&body) {
        Ok(j) => j,
        Err(why) => return error(StatusCode::BAD_REQUEST, "bad_request", &why),
    };
    // Held until the member is placed: `unexport` forgets the tree only
    // after its readers are gone, so no tree outlives its export.
    let Some(reader) = shared.registry.reader(id) else {
        return not_exported(shared, id);
    };
    let len = reader.len() as u64;
    if len == 0 {
        return error(
            StatusCode::CONFLICT,
            "not_relayable",
            &format!("shard {id} is empty: there is nothing to relay"),
        );
    }
    if join.from > len {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!(
                "offset {} is past the end of shard {id} ({len} bytes)",
                join.from
            ),
        );
    }
    // A member serves on its own address: other consumers are sent there
    // with their token, so an address elsewhere (another host, anything a
    // client could name) makes it a leaf. (After the export check: a name
    // is resolved only for a shard that exists.)
    // What the owner hands out for a plain-HTTP holder is the address it
    // verified, as an IP literal: a name is resolved here once, never again
    // by a consumer or by this owner's notices, so a name that resolves
    // elsewhere later (to a consumer's loopback, say) redirects nobody. A
    // TLS holder keeps its name: consumers check its certificate against
    // it, which no other server can present.
    if let Some(s) = &mut join.serves {
        match serves_from(&s.addr, peer).await {
            Ok(verified) if !s.tls => s.addr = verified,
            Ok(_) => {}
            Err(why) => {
                shared.stats.relay_addresses_refused.inc();
                debug!(target: "http", shard = %id, relay = %s.addr, ?peer, %why, "joins as a leaf");
                join.serves = None;
            }
        }
    }
    let tracked = shared.trackers.tracked(id);
    let piece = tracked.piece;
    let hashes = tracked
        .hashes
        .get_or_try_init(|| async {
            // A reader of its own for the hashing task (a GPU shard is
            // staged through the pinned pool to be read).
            let Some(r) = shared.registry.reader(id) else {
                return Err(format!("shard {id} was removed while it was being hashed"));
            };
            let pool = Arc::clone(&shared.staging);
            let wait = shared.request_timeout;
            // Encoded once: every join of the shard sends the same bytes.
            tokio::task::spawn_blocking(move || hash_pieces(r, &pool, piece, wait))
                .await
                .map_err(|e| e.to_string())?
                .map(|h| Bytes::from(rwire::encode_hashes(&h)))
        })
        .await;
    let hashes = match hashes {
        Ok(h) => h.clone(),
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                &format!("hashing shard {id} failed: {e}"),
            )
        }
    };
    let placed = tracked.join(&join, peer.map(|p| p.to_canonical()));
    drop(reader);
    shared.stats.relay_joins.inc();
    match &placed.report {
        Report::Demoted(moved) => {
            shared.stats.relay_demotions.inc();
            debug!(target: "http", shard = %id, relay = %moved.addr, late = join.late, "relay demoted: it rejoins at the tail");
            tell_to_rejoin(shared, id, moved.clone());
        }
        Report::Ignored => {
            shared.stats.relay_reports_ignored.inc();
            debug!(target: "http", shard = %id, relay = ?join.failed, late = join.late, "a report not acted on: a holder the reporter was not given, or past its demotions");
        }
        Report::None | Report::Already => {}
    }
    // The key this owner will drop or move the member's copy with: only a
    // recorded member that serves keeps a copy to drop.
    let key = match &join.serves {
        Some(s) if placed.recorded => shared.client.removal_key(id, &s.addr),
        _ => [0; 16],
    };
    let reply = JoinReply {
        len,
        piece: piece as u32,
        parent: placed.parent,
        no_copy: !placed.recorded,
        key,
        hashes: Vec::new(),
        alternates: placed.alternates,
    };
    framed(
        StatusCode::OK,
        "application/octet-stream",
        Frames::new([
            Bytes::from(reply.encode_head()),
            hashes,
            Bytes::from(reply.encode_alternates()),
        ]),
    )
}

/// Tells the relay at `at`, just demoted, to rejoin `id`'s tree (where it
/// is placed at the tail), off the runtime: a stopped relay answers only
/// once it runs again, within `relay-stall-timeout` (or it was reported
/// failed, and its own stalled fetch rejoins anyway).
fn tell_to_rejoin(shared: &Shared, id: ShardId, at: rwire::Serves) {
    let client = Arc::clone(&shared.client);
    let wait = shared.relay_stall;
    shared.dedicated.spawn_blocking(move || {
        if let Err(e) = client.ask_rejoin(&at, id, wait) {
            debug!(target: "http", shard = %id, relay = %at.addr, error = %e.message, "a demoted relay was not told to rejoin; it stays where it is until its own next join");
        }
    });
}

/// The hash of every `piece`-byte piece of the shard `reader` reads:
/// its host bytes in place, or a GPU shard staged through `pool` one
/// staging piece at a time.
fn hash_pieces(
    reader: Reader,
    pool: &Arc<PinnedPool>,
    piece: u64,
    wait: Duration,
) -> Result<Vec<crate::relay::PieceHash>, String> {
    let Some((ordinal, addr)) = reader.device() else {
        return Ok(crate::relay::piece_hashes(&reader.into_bytes(), piece));
    };
    let len = reader.len();
    let mut pieces = crate::relay::PieceHasher::new(piece);
    let mut at = 0usize;
    while at < len {
        let n = pool.piece().min(len - at);
        let mut staged = pool.take(ordinal, wait)?;
        staged.fill(ordinal, addr + at as u64, n)?;
        pieces.update(staged.as_ref());
        at += n;
    }
    Ok(pieces.finish())
}

/// Whether `addr` (`host:port`, checked by the decoder) names the peer the
/// join came from (an IP equal to it, or a name that resolves to it); the
/// peer's IP literal with the port when it does.
async fn serves_from(addr: &str, peer: Option<std::net::IpAddr>) -> Result<String, String> {
    let canonical = |ip: std::net::IpAddr| ip.to_canonical();
    let Some(peer) = peer.map(canonical) else {
        return Err("the join's peer is unknown".into());
    };
    let (host, port) = crate::descriptor::parse_host_port(addr)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let literal = || std::net::SocketAddr::new(peer, port).to_string();
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return if canonical(ip) == peer {
            Ok(literal())
        } else {
            Err(format!("it joined from {peer}"))
        };
    }
    let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| format!("{host} did not resolve within {RESOLVE_TIMEOUT:?}"))?
        .map_err(|e| format!("{host} does not resolve: {e}"))?;
    if found.map(|a| canonical(a.ip())).any(|ip| ip == peer) {
        Ok(literal())
    } else {
        Err(format!(
            "{host} does not resolve to {peer}, where it joined from"
        ))
    }
}

/// Reads a small request body whole, within `request-timeout`.
async fn read_body(
    shared: &Shared,
    req: Request<Incoming>,
    limit: usize,
) -> Result<Bytes, Response<Frames>> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("this request's body is at most {limit} bytes"),
        )
    };
    // A declared length over the limit is refused at once, before any wait.
    if hyper::body::Body::size_hint(req.body()).lower() > limit as u64 {
        return Err(too_large());
    }
    let collected = tokio::time::timeout(
        shared.request_timeout,
        Limited::new(req.into_body(), limit).collect(),
    )
    .await;
    match collected {
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            &format!(
                "the request body did not arrive within request-timeout ({})",
                format_duration(shared.request_timeout)
            ),
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!("cannot read the request body: {e}"),
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// `GET /v1/relay/{id}/{from}` (to the end) or `{from}-{to}`: the owner's
/// own bytes, or this node's relay copy streamed as its verified pieces
/// arrive.
async fn stream(shared: &Shared, id: ShardId, from: u64, to: Option<u64>) -> Response<Frames> {
    if let Some(reader) = shared.registry.reader(id) {
        let len = reader.len() as u64;
        let to = to.unwrap_or(len);
        if from > len || to > len {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("bytes {from}..{to} are past the end of shard {id} ({len} bytes)"),
            );
        }
        shared.stats.bytes_served.add(to - from);
        let body = Frames::of([part_range(shared, reader, from as usize, to as usize)]);
        return relay_response(body, len);
    }
    let Some(holding) = shared.holdings.get(id) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!(
                "{} holds no relay copy of shard {id} (it was dropped, or never fetched here)",
                shared.advertised
            ),
        );
    };
    // The piece size arrives with this node's own join reply, moments
    // after a peer may have been sent here.
    let stall = shared.relay_stall;
    let piece = holding
        .wait_for(stall, |h| match (h.progress().1, h.next(0)) {
            (_, Next::Failed(why)) => Some(Err(why)),
            (0, _) => None,
            (p, _) => Some(Ok(p)),
        })
        .await;
    let piece = match piece {
        Some(Ok(p)) => p,
        Some(Err(why)) => {
            return error(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!(
                    "{}'s relay copy of shard {id} is gone: {why}",
                    shared.advertised
                ),
            )
        }
        None => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "stalled",
                &format!(
                    "{}'s relay copy of shard {id} has not started within relay-stall-timeout",
                    shared.advertised
                ),
            )
        }
    };
    let len = holding.len;
    let to = to.unwrap_or(len);
    let boundary = |at: u64| at <= len && (at % piece == 0 || at == len);
    if !boundary(from) || !boundary(to) {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!(
                "bytes {from}..{to} of shard {id}: each end must be a piece boundary ({len} \
                 bytes in pieces of {piece})"
            ),
        );
    }
    if let Next::Evicted(first) = holding.next(from / piece) {
        return error(
            StatusCode::GONE,
            "evicted",
            &format!(
                "{} keeps only the most recent pieces of shard {id} (relay-window): byte {from} \
                 was dropped, it holds pieces from byte {} on",
                shared.advertised,
                first * piece
            ),
        );
    }
    let rx = spawn_stream(shared, holding, from / piece, to.div_ceil(piece));
    let mut frames = Frames::of([Part::Staging(rx)]);
    frames.set_len(to - from);
    relay_response(frames, len)
}

fn relay_response(frames: Frames, len: u64) -> Response<Frames> {
    let mut r = framed(StatusCode::OK, "application/octet-stream", frames);
    r.headers_mut()
        .insert(wire::LEN_HEADER, HeaderValue::from(len));
    r
}

/// Waits until `check` answers, for as long as the copy is being filled
/// (checking every `period`); a copy that ended without an answer is an
/// error.
async fn until_filled<T>(
    holding: &Holding,
    period: Duration,
    mut check: impl FnMut(&Holding) -> Option<Result<T, String>>,
) -> Result<T, String> {
    loop {
        if let Some(r) = holding.wait_for(period, &mut check).await {
            return r;
        }
        if let End::Failed(why) = holding.end() {
            return Err(why);
        }
    }
}

/// Sends the copy's pieces `first..end`, each as soon as it is held;
/// ends the body with an error (a short body for the peer) when the copy
/// fails. It waits as long as the copy is being filled: a relay whose own
/// parent stalls does not cut its children off (they would blame it); its
/// fetch rejoins or fails within its own timeouts.
fn spawn_stream(
    shared: &Shared,
    holding: Arc<Holding>,
    first: u64,
    end: u64,
) -> tokio::sync::mpsc::Receiver<Result<Bytes, String>> {
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_AHEAD);
    let stats = Arc::clone(&shared.stats);
    let stall = shared.relay_stall;
    let corrupt = shared.relay_corrupt;
    tokio::spawn(async move {
        let mut k = first;
        while k < end {
            let next = until_filled(&holding, stall, |h| match h.next(k) {
                Next::Wait => None,
                Next::Piece(p) => Some(Ok(Some(p))),
                Next::Done => Some(Ok(None)),
                Next::Failed(why) => Some(Err(why)),
                Next::Evicted(first) => Some(Err(format!(
                    "piece {k} was dropped (relay-window: it holds pieces from {first} on)"
                ))),
            })
            .await;
            let piece = match next {
                Ok(Some(p)) => p,
                Ok(None) => return,
                Err(why) => {
                    let _ = tx.send(Err(format!("the relay copy failed: {why}"))).await;
                    return;
                }
            };
            let piece = if corrupt {
                flip_first_bit(&piece)
            } else {
                piece
            };
            stats.relay_bytes_served.add(piece.len() as u64);
            if tx.send(Ok(piece)).await.is_err() {
                return; // the peer went away
            }
            k += 1;
        }
    });
    rx
}

/// Tests only (`test-corrupt-relay`): a piece with its first bit flipped.
fn flip_first_bit(p: &Bytes) -> Bytes {
    let mut v = p.to_vec();
    if let Some(b) = v.first_mut() {
        *b ^= 1;
    }
    Bytes::from(v)
}

/// Only the shard's owner drops or moves a copy: the request's body must be
/// the removal key the owner gave this holder at its join (the data token
/// alone, which every consumer holds, is not enough). A node holding no
/// copy of `id` has nothing to protect.
async fn owners_key(
    shared: &Shared,
    id: ShardId,
    req: Request<Incoming>,
) -> Result<(), Response<Frames>> {
    let sent = read_body(shared, req, 16).await?;
    match shared.holdings.get(id) {
        Some(h) if !h.is_key(&sent) => {
            shared.stats.relay_notices_refused.inc();
            Err(error(
                StatusCode::FORBIDDEN,
                "forbidden",
                &format!(
                    "only the owner of shard {id} may drop or move this copy: the request does not carry the key it gave this holder"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// `DELETE /v1/relay/{id}`: the owner removed the shard; drop the copy.
fn drop_copy(shared: &Shared, id: ShardId) -> Response<Frames> {
    let had = shared.holdings.drop_copy(id, "its owner removed the shard");
    if had {
        shared.stats.relay_copies_dropped.inc();
    }
    json(StatusCode::OK, format!("{{\"dropped\":{had}}}"))
}

/// `POST /v1/relay/{id}`: the owner demoted this relay; its fetch of `id`
/// rejoins the tree at its next piece (checked by [`owners_key`] first).
fn rejoin(shared: &Shared, id: ShardId) -> Response<Frames> {
    let asked = shared.holdings.get(id).is_some_and(|h| h.ask_rejoin());
    json(StatusCode::OK, format!("{{\"rejoining\":{asked}}}"))
}

/// Drops expired relay copies every `period` until shutdown.
pub(super) async fn prune_copies(
    holdings: Arc<crate::relay::Holdings>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => holdings.prune(),
            _ = shutdown.changed() => return,
        }
    }
}
