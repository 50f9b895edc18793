//! Requests: authentication, framing checks, and the answers of each
//! endpoint (a shard, a batch, health), errors as JSON.

#[allow(clippy::wildcard_imports)]
use super::*;
use shardport_http_base::head::{framing, FramingError};

pub(super) async fn handle(
    shared: Arc<Shared>,
    activity: Arc<Activity>,
    pending: Pending,
    req: Request<Incoming>,
) -> Result<Response<Frames>, Infallible> {
    let in_flight = InFlight::new(activity, &shared.stats);
    let mut resp = route(&shared, &pending, req).await;
    if resp.status() == StatusCode::OK {
        shared.stats.requests_served.inc();
    } else {
        shared.stats.requests_failed.inc();
    }
    resp.body_mut().track(in_flight);
    Ok(resp)
}

/// Answers one request. A request that gets past framing and the token
/// check admits its connection (it stops counting as pending); a refused
/// one leaves it pending, and evictable.
pub(super) async fn route(
    shared: &Shared,
    pending: &Pending,
    req: Request<Incoming>,
) -> Response<Frames> {
    if let Err(why) = check_framing(req.headers()) {
        let mut r = error(StatusCode::BAD_REQUEST, "bad_request", &why);
        // The body's extent is ambiguous: never read another request from
        // this connection.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    if let Some(token) = &shared.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        if !wire::bearer_matches(given, token.as_str()) {
            shared.stats.auth_failures.inc();
            let why = if given.is_none() {
                "missing bearer token: this owner requires `authorization: Bearer <auth-token>`"
            } else {
                "wrong bearer token: owner and consumer must share the same auth-token"
            };
            let mut r = error(StatusCode::UNAUTHORIZED, "unauthorized", why);
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"shardport\""),
            );
            return r;
        }
    }
    pending.admit();
    let path = req.uri().path();
    if path == wire::HEALTH_PATH {
        if req.method() != Method::GET {
            return method_not_allowed(req.method(), path, "GET");
        }
        return health(shared);
    }
    if path == wire::BATCH_PATH {
        if req.method() != Method::POST {
            return method_not_allowed(req.method(), path, "POST");
        }
        return batch(shared, req).await;
    }
    if let Some(rest) = path.strip_prefix(crate::relay::wire::PREFIX) {
        let rest = rest.to_owned();
        return super::relay::route(shared, req, &rest, pending.peer).await;
    }
    if let Some(hex) = path.strip_prefix(wire::SHARD_PATH) {
        if req.method() != Method::GET {
            return method_not_allowed(req.method(), path, "GET");
        }
        let Some(id) = wire::parse_shard_id(hex) else {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!(
                    "malformed shard id {:?} in the path: expected 32 hex digits",
                    quote(hex)
                ),
            );
        };
        return shard(shared, id);
    }
    error(
        StatusCode::NOT_FOUND,
        "no_such_endpoint",
        &format!(
            "no endpoint {:?}; this owner serves GET /v1/shards/{{id}}, POST /v1/batch, \
             GET /v1/health, and the relay endpoints under /v1/relay/",
            quote(path)
        ),
    )
}

pub(super) fn shard(shared: &Shared, id: ShardId) -> Response<Frames> {
    let Some(reader) = shared.registry.reader(id) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!(
                "shard {id} is not exported by owner {} (it was removed, or never existed here)",
                shared.advertised
            ),
        );
    };
    let body = Frames::of([part(shared, reader)]);
    let len = body.len();
    shared.stats.bytes_served.add(len);
    let mut r = framed(StatusCode::OK, "application/octet-stream", body);
    r.headers_mut()
        .insert(wire::LEN_HEADER, HeaderValue::from(len));
    r
}

pub(super) async fn batch(shared: &Shared, req: Request<Incoming>) -> Response<Frames> {
    let limit = shared.max_request_bytes;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!(
                "batch request body exceeds max-request-bytes ({})",
                format_byte_size(limit as u64)
            ),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large();
    }
    let collected = tokio::time::timeout(
        shared.request_timeout,
        Limited::new(req.into_body(), limit).collect(),
    )
    .await;
    let body = match collected {
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                &format!(
                    "the request body did not arrive within request-timeout ({})",
                    format_duration(shared.request_timeout)
                ),
            )
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("cannot read the request body: {e}"),
            )
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    let ids = match wire::decode_batch_request(&body, shared.max_batch) {
        Ok(ids) => ids,
        Err(wire::BatchRequestError::Malformed(why)) => {
            return error(StatusCode::BAD_REQUEST, "bad_request", &why)
        }
        Err(wire::BatchRequestError::TooMany { count, max }) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "batch_too_large",
                &format!("batch of {count} shards exceeds this owner's max-batch ({max})"),
            )
        }
    };
    let readers = shared.registry.readers(&ids);
    let mut entries = Vec::with_capacity(ids.len());
    let mut data = Vec::with_capacity(ids.len() + 1);
    for reader in readers {
        match reader {
            Some(r) => {
                entries.push(wire::BatchEntry {
                    status: wire::ITEM_OK,
                    len: r.len() as u64,
                });
                data.push(part(shared, r));
            }
            None => entries.push(wire::BatchEntry {
                status: wire::ITEM_NOT_FOUND,
                len: 0,
            }),
        }
    }
    let head = Bytes::from(wire::encode_batch_head(&entries));
    let served: u64 = entries.iter().map(|e| e.len).sum();
    shared.stats.bytes_served.add(served);
    shared.stats.batches_served.inc();
    let body = Frames::of(std::iter::once(Part::Ready(head)).chain(data));
    framed(StatusCode::OK, "application/octet-stream", body)
}

/// The body part of one exported shard: its host bytes in place, or a GPU
/// shard to stage.
pub(super) fn part(shared: &Shared, reader: Reader) -> Part {
    part_from(shared, reader, 0)
}

/// [`part`] from byte `from` on (`from` <= the shard's length).
pub(super) fn part_from(shared: &Shared, reader: Reader, from: usize) -> Part {
    let to = reader.len();
    part_range(shared, reader, from, to)
}

/// Bytes `from..to` of `reader`'s shard (`from <= to <= len`).
pub(super) fn part_range(shared: &Shared, reader: Reader, from: usize, to: usize) -> Part {
    if reader.device().is_some() {
        Part::Device {
            reader,
            pool: Arc::clone(&shared.staging),
            wait: shared.request_timeout,
            from,
            to,
        }
    } else {
        Part::Ready(reader.into_bytes().slice(from..to))
    }
}

pub(super) fn health(shared: &Shared) -> Response<Frames> {
    let (shards, bytes) = shared.registry.totals();
    let mut body = String::from("{\"status\":\"ok\",\"bound\":\"");
    body.push_str(&shared.bound.to_string());
    body.push_str("\",\"advertised\":\"");
    // Validated at construction: no characters JSON would need escaped.
    body.push_str(&shared.advertised);
    body.push_str(&format!(
        "\",\"shards\":{shards},\"bytes\":{bytes},\"version\":\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    ));
    json(StatusCode::OK, body)
}

pub(super) fn method_not_allowed(
    method: &Method,
    path: &str,
    allow: &'static str,
) -> Response<Frames> {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!("{method} is not allowed on {}; use {allow}", quote(path)),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Refuses every request whose body framing two HTTP parsers could read
/// differently (the request-smuggling shapes), by the workspace's one
/// framing rule (`shardport_http_base::head::framing`): more than one
/// `content-length` field, even with equal values (named first), and any
/// `transfer-encoding` (our client frames every body with
/// `content-length`, so chunk sizes are never parsed). hyper itself
/// refuses obs-fold, bare CR and unparsable `content-length` values with
/// 400, and frames the body by the value it parsed, so the value is left
/// to it.
pub(super) fn check_framing(headers: &header::HeaderMap) -> Result<(), String> {
    let fields = headers
        .iter()
        .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()));
    let count = match framing(fields, usize::MAX) {
        Ok(_) | Err(FramingError::BadLength(_)) => return Ok(()),
        Err(FramingError::RepeatedLength { count, .. }) => count,
        Err(FramingError::TransferEncoding { lengths, .. }) if lengths > 1 => lengths,
        Err(FramingError::TransferEncoding { value, .. }) => {
            return Err(format!(
                "transfer-encoding {:?} is not accepted: frame the body with content-length",
                String::from_utf8_lossy(&value)
            ))
        }
    };
    Err(format!(
        "{count} content-length fields: a request must carry at most one"
    ))
}

pub(super) fn error(status: StatusCode, code: &str, message: &str) -> Response<Frames> {
    json(status, wire::error_body(code, message))
}

pub(super) fn json(status: StatusCode, body: String) -> Response<Frames> {
    framed(status, "application/json", Frames::new([Bytes::from(body)]))
}

/// A response with `body`, its `content-type` and its `content-length`
/// (every body this server sends has a known length).
pub(super) fn framed(
    status: StatusCode,
    content_type: &'static str,
    body: Frames,
) -> Response<Frames> {
    let len = body.len();
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// A peer-supplied string shortened for an error message.
pub(super) fn quote(s: &str) -> String {
    if s.len() <= MAX_QUOTED_PATH {
        return s.to_owned();
    }
    let mut end = MAX_QUOTED_PATH;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}
