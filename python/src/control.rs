//! The node's control endpoint from Python: `Node.serve_control()` serves
//! this library node's authenticated endpoint (`shardport_control`, the one
//! `shardport serve` runs), and `remove_remote()` asks an owner's endpoint
//! to remove shards, from any process that holds the token. This is how a
//! program's cleanup reaches shards owned by another process.

use std::time::Duration;

use pyo3::prelude::*;
use shardport_control::{
    client::{self, ClientError},
    tls, ControlServer, Limits,
};
use shardport_host::{config::ControlConfig, Node};

use crate::{
    errors::{py_err, Kind},
    handle::PyHandle,
    logs::unlocked,
};

/// Starts the endpoint of `node` on `bind` (default: the config's
/// `control.bind`), with `token` (default: the config's `control.auth-token`
/// or `auth-token-env`) and the config's `control.tls-cert`/`tls-key`.
pub(crate) fn serve(
    node: &Node,
    cfg: &ControlConfig,
    bind: Option<&str>,
    token: Option<String>,
) -> PyResult<ControlServer> {
    let token = match token {
        Some(t) if t.is_empty() => {
            return Err(py_err(
                Kind::InvalidInput,
                "token must not be empty (give None for the config's)",
            ))
        }
        Some(t) => Some(t),
        None => cfg.token.resolve().map_err(|e| py_err(Kind::Config, e))?,
    };
    let tls = match &cfg.tls {
        None => None,
        Some(t) => Some(tls::server_config(&t.cert, &t.key).map_err(|e| py_err(Kind::Config, e))?),
    };
    let bind = bind.unwrap_or(&cfg.bind);
    ControlServer::start_tls(node, bind, token, Limits::default(), tls)
        .map_err(|e| py_err(Kind::Transport, e.to_string()))
}

/// Shard ids from `Handle`s or 32-hex-digit strings.
fn ids_of(ids: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let mut out = Vec::new();
    for item in ids.try_iter()? {
        let item = item?;
        if let Ok(h) = item.downcast::<PyHandle>() {
            out.push(h.borrow().inner.id.to_string());
        } else if let Ok(s) = item.extract::<String>() {
            shardport_control::parse_id(&s).map_err(|e| py_err(Kind::InvalidInput, e))?;
            out.push(s);
        } else {
            return Err(py_err(
                Kind::InvalidInput,
                format!(
                    "ids must be Handles or 32-hex-digit shard ids, not {}",
                    item.get_type().name()?
                ),
            ));
        }
    }
    Ok(out)
}

/// Asks the control endpoint at ``address`` (``host:port``) to remove the
/// shards ``ids`` (``Handle`` objects or 32-hex-digit ids) that its node
/// owns, with the bearer ``token``; over HTTPS when ``ca`` names the CA
/// file (PEM) to trust. Returns the ids it did not own (already removed,
/// or never its own). A refused token raises ``PermissionDeniedError``, an
/// unreachable endpoint ``TransportError``. The GIL is released meanwhile.
#[pyfunction]
#[pyo3(signature = (address, ids, token=None, ca=None, timeout=10.0))]
pub(crate) fn remove_remote(
    py: Python<'_>,
    address: &str,
    ids: &Bound<'_, PyAny>,
    token: Option<String>,
    ca: Option<std::path::PathBuf>,
    timeout: f64,
) -> PyResult<Vec<String>> {
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(py_err(
            Kind::InvalidInput,
            format!("timeout must be a positive number of seconds, not {timeout}"),
        ));
    }
    let ids = ids_of(ids)?;
    let trust = match ca {
        None => None,
        Some(p) => Some(tls::Trust::from_ca_file(&p).map_err(|e| py_err(Kind::Config, e))?),
    };
    let body = serde_json::json!({ "ids": ids }).to_string();
    let timeout = Duration::from_secs_f64(timeout);
    let answer = unlocked(py, || {
        client::call_with(
            address,
            trust.as_ref(),
            "POST",
            "/v1/remove",
            token.as_deref(),
            body.as_bytes(),
            timeout,
        )
    })
    .map_err(client_err)?;
    Ok(answer["missing"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// A control call's failure as the matching exception.
fn client_err(e: ClientError) -> PyErr {
    let kind = match &e {
        ClientError::Status { status: 401, .. } => Kind::PermissionDenied,
        ClientError::Status { status: 400, .. } => Kind::InvalidInput,
        _ => Kind::Transport,
    };
    py_err(kind, e.to_string())
}
