//! The endpoints: what each path does with the node.

use std::io::{BufReader, Read};

use serde_json::json;
use shardport_abi::{DType, Device, ShardId};
use shardport_host::{node::Node, node::TensorSpec};

use crate::{
    conn::{Conn, JSON, PROMETHEUS_TEXT},
    parse_id,
    request::{content_length, Refusal, Request},
    MAX_JSON_BODY,
};

pub(crate) fn handle(
    node: &Node,
    req: &Request,
    reader: &mut BufReader<Conn>,
) -> Result<(&'static str, Vec<u8>), Refusal> {
    fn to_json<T: serde::Serialize>(v: &T) -> Result<(&'static str, Vec<u8>), Refusal> {
        serde_json::to_vec(v)
            .map(|b| (JSON, b))
            .map_err(|e| (500, "internal", e.to_string()))
    }
    let json_out = |v: serde_json::Value| to_json(&v);
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/health") => {
            json_out(json!({"ok": true, "node": node.config().node.name, "tag": node.tag()}))
        }
        ("GET", "/v1/stats") => to_json(&node.stats()),
        ("GET", "/metrics") => Ok((
            PROMETHEUS_TEXT,
            shardport_host::metrics::prometheus(&node.metrics_snapshot()).into_bytes(),
        )),
        ("GET", "/v1/metrics.json") => to_json(&node.metrics_snapshot()),
        ("POST", "/v1/experiments/reset") => {
            let body = read_json_body(req, reader)?;
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Reset {
                #[serde(default)]
                experiment: Option<String>,
            }
            let r: Reset = if body.iter().all(u8::is_ascii_whitespace) {
                Reset { experiment: None }
            } else {
                serde_json::from_slice(&body).map_err(|e| {
                    (
                        400,
                        "bad_request",
                        format!("expected {{\"experiment\": \"NAME\"}} or an empty body: {e}"),
                    )
                })?
            };
            let done = node
                .reset_experiments(r.experiment.as_deref())
                .map_err(|m| (404, "not_found", m))?;
            json_out(json!({ "reenabled": done }))
        }
        ("POST", "/v1/put") => {
            let spec = put_spec(req)?;
            let tags = req
                .query
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("tag.").map(|k| (k.to_owned(), v.clone())))
                .collect();
            let len = content_length(req, node.config().node.max_shard_size)?;
            let mut read_err = None;
            let spec = match spec {
                Some(s) => s,
                None => TensorSpec::bytes(len),
            };
            let result = node.put_with(&spec, tags, |dst| {
                if dst.len() as u64 != len {
                    read_err = Some((
                        400,
                        "bad_request",
                        format!("body is {len} bytes, dtype and shape need {}", dst.len()),
                    ));
                } else if let Err(e) = reader.read_exact(dst) {
                    read_err = Some((400, "bad_request", format!("reading the body: {e}")));
                }
            });
            match (result, read_err) {
                (Ok(h), Some(e)) => {
                    node.remove(&[h.id]);
                    Err(e)
                }
                (Err(shardport_host::HostError::InvalidShard(_)), Some(r)) => Err(r),
                (Err(e), _) => Err((400, "put_failed", e.to_string())),
                (Ok(h), None) => json_out(json!({
                    "id": h.id.to_string(),
                    "handle": hex::encode(h.to_bytes()),
                    "handle_json": serde_json::from_str::<serde_json::Value>(&h.to_json()).unwrap_or_default(),
                })),
            }
        }
        ("POST", "/v1/remove") => {
            let ids = read_ids(req, reader)?;
            let Some(ids) = ids else {
                return Err((400, "bad_request", "expected {\"ids\": [...]}".to_owned()));
            };
            let missing: Vec<String> = node.remove(&ids).iter().map(ToString::to_string).collect();
            json_out(json!({ "missing": missing }))
        }
        ("POST", "/v1/drain") => {
            let drained = match read_ids(req, reader)? {
                Some(ids) => node.drain(&ids),
                None => node.drain_all(),
            };
            tracing::info!(target: "control", drained, "drain");
            json_out(json!({ "drained": drained }))
        }
        ("POST", "/v1/sweep") => json_out(node.sweep_json()),
        ("POST", "/v1/reload") => {
            let body = read_json_body(req, reader)?;
            let report = reload(node, &body)?;
            to_json(&report)
        }
        (
            _,
            "/v1/health"
            | "/v1/stats"
            | "/v1/put"
            | "/v1/remove"
            | "/v1/drain"
            | "/v1/sweep"
            | "/metrics"
            | "/v1/metrics.json"
            | "/v1/experiments/reset"
            | "/v1/reload",
        ) => Err((
            405,
            "method_not_allowed",
            format!("{} is not allowed on {}", req.method, req.path),
        )),
        (_, path) => Err((404, "not_found", format!("no endpoint {path}"))),
    }
}

/// `POST /v1/reload`: which config to apply, from the body.
fn reload(node: &Node, body: &[u8]) -> Result<shardport_host::node::ReloadReport, Refusal> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Reload {
        #[serde(default)]
        path: Option<std::path::PathBuf>,
        #[serde(default)]
        config: Option<String>,
        #[serde(default)]
        adopt: bool,
    }
    let r: Reload = if body.iter().all(u8::is_ascii_whitespace) {
        Reload {
            path: None,
            config: None,
            adopt: false,
        }
    } else {
        serde_json::from_slice(body).map_err(|e| {
            (
                400,
                "bad_request",
                format!(
                    "expected an empty body, {{\"path\": FILE}} or {{\"config\": TOML, \"path\": FILE, \"adopt\": BOOL}}: {e}"
                ),
            )
        })?
    };
    let adopt = match (r.adopt, &r.path) {
        (false, _) => None,
        (true, None) => {
            return Err((
                400,
                "bad_request",
                "`adopt` needs the `path` of the config file to adopt".to_owned(),
            ))
        }
        (true, Some(p)) => Some(adoptable(p, r.config.as_deref())?),
    };
    let result = match (r.config, r.path) {
        (Some(text), path) => {
            let origin = match path {
                Some(p) => shardport_host::config::Origin::File(p),
                None => shardport_host::config::Origin::Text {
                    name: "<config sent to POST /v1/reload>".to_owned(),
                    base_dir: std::env::current_dir().unwrap_or_default(),
                    search_deps: false,
                },
            };
            node.reload_text(&text, origin)
        }
        (None, path) => node.reload_file(path.as_deref()),
    };
    let report = result.map_err(|e| (409, "reload_refused", e.to_string()))?;
    if let Some(p) = adopt {
        node.adopt_config_file(p);
    }
    Ok(report)
}

/// The file a reload may make the node's own: `path` on this node's
/// machine (absolute against the node's directory), which must hold the
/// config text sent, if one was, so that a later SIGHUP reads what was
/// applied.
fn adoptable(path: &std::path::Path, sent: Option<&str>) -> Result<std::path::PathBuf, Refusal> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let here = std::fs::read_to_string(&abs).map_err(|e| {
        (
            400,
            "bad_request",
            format!(
                "cannot adopt {}: this node cannot read it ({e}); copy the file to the node's machine first",
                abs.display()
            ),
        )
    })?;
    if sent.is_some_and(|t| t != here) {
        return Err((
            400,
            "bad_request",
            format!(
                "cannot adopt {}: the file on this node's machine differs from the config sent",
                abs.display()
            ),
        ));
    }
    Ok(abs)
}

/// The request body, bounded by [`MAX_JSON_BODY`].
fn read_json_body(req: &Request, reader: &mut BufReader<Conn>) -> Result<Vec<u8>, Refusal> {
    let len = content_length(req, MAX_JSON_BODY as u64)?;
    let mut body = vec![0u8; len as usize];
    reader
        .read_exact(&mut body)
        .map_err(|e| (400, "bad_request", format!("reading the body: {e}")))?;
    Ok(body)
}

/// A `{"ids": [...]}` body (`Some`) or `{"all": true}` (`None`).
fn read_ids(req: &Request, reader: &mut BufReader<Conn>) -> Result<Option<Vec<ShardId>>, Refusal> {
    let body = read_json_body(req, reader)?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ids {
        #[serde(default)]
        ids: Option<Vec<String>>,
        #[serde(default)]
        all: bool,
    }
    let ids: Ids = serde_json::from_slice(&body).map_err(|e| {
        (
            400,
            "bad_request",
            format!("expected {{\"ids\": [...]}} or {{\"all\": true}}: {e}"),
        )
    })?;
    match (ids.ids, ids.all) {
        (Some(list), false) => list
            .iter()
            .map(|s| parse_id(s))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(|e| (400, "bad_request", e)),
        (None, true) => Ok(None),
        _ => Err((
            400,
            "bad_request",
            "give exactly one of \"ids\" and \"all\": true".to_owned(),
        )),
    }
}

/// `dtype` and `shape` query parameters; `None` when both are absent (raw bytes).
fn put_spec(req: &Request) -> Result<Option<TensorSpec>, Refusal> {
    let get = |k: &str| {
        req.query
            .iter()
            .find(|(q, _)| q == k)
            .map(|(_, v)| v.as_str())
    };
    let (dtype, shape) = (get("dtype"), get("shape"));
    if dtype.is_none() && shape.is_none() {
        return Ok(None);
    }
    let dtype = match dtype {
        Some(d) => DType::from_name(d)
            .ok_or_else(|| (400, "bad_request", format!("unknown dtype `{d}`")))?,
        None => DType::U8,
    };
    let shape = shape
        .ok_or_else(|| {
            (
                400,
                "bad_request",
                "`dtype` needs `shape` (e.g. shape=4,8)".to_owned(),
            )
        })?
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<u64>().map_err(|_| {
                (
                    400,
                    "bad_request",
                    format!("shape dimension `{d}` is not a number"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(TensorSpec {
        dtype,
        shape,
        device: Device::CPU,
    }))
}
