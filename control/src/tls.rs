//! Optional TLS for the control endpoint and its client: rustls with the
//! ring provider (no OpenSSL), set up by the workspace's one TLS base
//! (`shardport_http_base::tls`); this module names the settings and words
//! the hints.
//!
//! The server side comes from `[control] tls-cert` / `tls-key` (PEM files;
//! [`server_config`]); the client side from the CLI's `--ca FILE` (the CAs
//! it trusts, [`Trust`]). The client checks the endpoint's certificate
//! against the host of the address it was given (a DNS name or an IP
//! address in the certificate's subject alternative names). Every file
//! error names the key (or flag) and the file.
//!
//! Both sides look at the first byte of a connection before anything else:
//! a TLS handshake starts with a handshake record (22), an HTTP request with
//! a letter. A mismatch (a plain client of a TLS endpoint, or a TLS client
//! of a plain one) is answered at once, in plain HTTP, with a 400 saying
//! what the other side must do, instead of waiting for a head that never
//! comes.

use std::{io, path::Path, sync::Arc};

use rustls::{ClientConfig, ServerConfig};
use shardport_http_base::tls::{self, ConfigError, Hints};

/// The name a client checks the certificate against: the host of
/// `host:port` (an IP address, bracketed for IPv6, or a DNS name).
pub use shardport_http_base::tls::server_name;
/// The first byte of every TLS connection (a handshake record).
pub use shardport_http_base::tls::TLS_HANDSHAKE_RECORD;

/// The control endpoint's TLS config from `[control] tls-cert` and
/// `tls-key`; errors name the key and the file.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = tls::certs("`control.tls-cert`", cert)?;
    let private = tls::private_key("`control.tls-key`", key)?;
    // One request per connection: nothing to resume (the base sends no
    // session tickets).
    let sc = tls::server_config(tls::provider(), chain, private, None).map_err(|e| match e {
        ConfigError::KeyMismatch(e) => format!(
            "`control.tls-key` = \"{}\" cannot be used with `control.tls-cert` = \"{}\": {e}",
            key.display(),
            cert.display()
        ),
        e => format!("control endpoint TLS: {e}"),
    })?;
    Ok(Arc::new(sc))
}

/// What a control client trusts: the CAs of `--ca`.
#[derive(Clone)]
pub struct Trust {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust").finish_non_exhaustive()
    }
}

impl Trust {
    /// The CA certificates (PEM) in `path`; errors name `--ca` and the file.
    pub fn from_ca_file(path: &Path) -> Result<Trust, String> {
        let roots = tls::roots("--ca", path)?;
        let config = tls::client_config(tls::provider(), roots, None)
            .map_err(|e| format!("control client TLS: {e}"))?;
        Ok(Trust {
            config: Arc::new(config),
        })
    }

    /// The rustls config.
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }
}

/// What to look at for each kind of TLS failure with a control endpoint.
const HINTS: Hints<'static> = Hints {
    untrusted: "; the endpoint's certificate is not issued by a CA in --ca, or does not name \
                the address given to --node",
    refused: "",
    not_tls: "; the endpoint did not answer like a TLS server: it may serve plain HTTP \
              (drop --ca, or set `control.tls-cert` on the node)",
};

/// A TLS failure as a sentence with a hint, from the error rustls put
/// inside an `io::Error`; `None` when it is plain I/O.
pub fn explain(e: &io::Error) -> Option<String> {
    tls::explain(e, &HINTS).map(|(_, text)| text)
}
