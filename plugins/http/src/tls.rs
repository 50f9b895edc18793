//! Optional TLS: rustls with the ring provider (no OpenSSL).
//!
//! # Overview
//! [`setup`] reads the files the `tls-*` keys name when the transport is
//! constructed and builds the owner's [`ServerConfig`] (with `tls-cert` /
//! `tls-key`, and a client-certificate verifier over `tls-client-ca` when
//! `tls-client-auth = "required"`) and the consumer's [`ClientConfig`] (with
//! `tls-ca`, presenting `tls-client-cert` / `tls-client-key`, or `tls-cert`
//! / `tls-key`, when an owner asks for a certificate). Every failure is a
//! config error naming the key and the file.
//!
//! The consumer checks the owner's certificate against the host of the
//! descriptor's address (a DNS name or an IP address in the certificate's
//! subject alternative names), so an owner's certificate must name what it
//! advertises.
//!
//! # Failure modes
//! [`explain`] turns a handshake failure into a sentence an operator can act
//! on (untrusted certificate, a plain-HTTP peer, a refused client
//! certificate), since rustls reports them as bare `io::Error`s. The file
//! reading, the configs' protocol policy and the sorting of failures are
//! the workspace's one TLS base (`shardport_http_base::tls`); this module
//! holds what is the transport's own: its keys and its hints.

use std::{io, path::Path, sync::Arc};

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use shardport_abi::{AbiError, ErrorKind, PluginResult};
use shardport_http_base::tls::{self, ConfigError, Failure, Hints};

use crate::config::{ClientAuth, Config};

/// The built TLS configs of one transport instance.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    /// The owner serves HTTPS with this (from `tls-cert`).
    pub server: Option<Arc<ServerConfig>>,
    /// The consumer reaches HTTPS owners with this (from `tls-ca`).
    pub client: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server", &self.server.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// How errors name key `key` of this instance: `plugin.<instance>.config.<key>`.
fn key_name(cfg: &Config, key: &str) -> String {
    format!("`plugin.{}.config.{key}`", cfg.instance)
}

fn bad_file(cfg: &Config, key: &str, path: &Path, why: impl std::fmt::Display) -> AbiError {
    AbiError::config(format!(
        "{} = \"{}\": {why}",
        key_name(cfg, key),
        path.display()
    ))
}

fn certs(cfg: &Config, key: &str, path: &Path) -> PluginResult<Vec<CertificateDer<'static>>> {
    tls::certs(&key_name(cfg, key), path).map_err(AbiError::config)
}

fn private_key(cfg: &Config, key: &str, path: &Path) -> PluginResult<PrivateKeyDer<'static>> {
    tls::private_key(&key_name(cfg, key), path).map_err(AbiError::config)
}

fn roots(cfg: &Config, key: &str, path: &Path) -> PluginResult<Arc<RootCertStore>> {
    tls::roots(&key_name(cfg, key), path).map_err(AbiError::config)
}

/// A config the files named by `key_path` / `cert_path` could not build.
fn config_error(
    cfg: &Config,
    (cert_key, cert_path): (&str, &Path),
    (key_key, key_path): (&str, &Path),
    verifier: (&str, &Path),
    e: ConfigError,
) -> AbiError {
    match e {
        ConfigError::KeyMismatch(e) => bad_file(
            cfg,
            key_key,
            key_path,
            format!(
                "cannot be used with `{cert_key}` = \"{}\": {e}",
                cert_path.display()
            ),
        ),
        ConfigError::Verifier(e) => bad_file(cfg, verifier.0, verifier.1, e),
        ConfigError::Versions(e) => AbiError::config(format!("tls: {e}")),
        e => AbiError::config(format!("tls: {e}")),
    }
}

/// Reads and checks every file the `tls-*` keys name; builds the configs
/// (the bulk provider: AES-128-GCM first, see [`tls::bulk_provider`]).
pub(crate) fn setup(cfg: &Config) -> PluginResult<Tls> {
    let files = &cfg.tls;
    let server = match &files.cert {
        None => None,
        Some((cert_path, key_path)) => {
            let chain = certs(cfg, "tls-cert", cert_path)?;
            let key = private_key(cfg, "tls-key", key_path)?;
            // A failure names the three files, whichever refused.
            let refused = |ca: &Path, e| {
                config_error(
                    cfg,
                    ("tls-cert", cert_path),
                    ("tls-key", key_path),
                    ("tls-client-ca", ca),
                    e,
                )
            };
            let (clients, ca) = match (files.client_auth, &files.client_ca) {
                (ClientAuth::Required, Some(ca)) => {
                    let roots = roots(cfg, "tls-client-ca", ca)?;
                    let v = tls::client_verifier(tls::bulk_provider(), roots)
                        .map_err(|e| refused(ca, e))?;
                    (Some(v), ca.as_path())
                }
                _ => (None, cert_path.as_path()),
            };
            // Consumers do not resume sessions (a pooled connection lives
            // long); the base sends no tickets, bytes a pooled connection
            // would only have to skip.
            let sc = tls::server_config(tls::bulk_provider(), chain, key, clients)
                .map_err(|e| refused(ca, e))?;
            Some(Arc::new(sc))
        }
    };
    let client = match &files.ca {
        None => None,
        Some(ca) => {
            let roots = roots(cfg, "tls-ca", ca)?;
            let identity = match (&files.client_cert, &files.cert) {
                (Some(pair), _) => Some((pair, "tls-client-cert", "tls-client-key")),
                (None, Some(pair)) => Some((pair, "tls-cert", "tls-key")),
                (None, None) => None,
            };
            let (pair, names) = match identity {
                None => (None, None),
                Some(((cert_path, key_path), ck, kk)) => (
                    Some((certs(cfg, ck, cert_path)?, private_key(cfg, kk, key_path)?)),
                    Some(((ck, cert_path.as_path()), (kk, key_path.as_path()))),
                ),
            };
            let cc = tls::client_config(tls::bulk_provider(), roots, pair).map_err(|e| {
                let ((ck, cp), (kk, kp)) = names.unwrap_or((("tls-ca", ca), ("tls-ca", ca)));
                config_error(cfg, (ck, cp), (kk, kp), ("tls-ca", ca), e)
            })?;
            Some(Arc::new(cc))
        }
    };
    if files.client_cert.is_some() && client.is_none() {
        return Err(AbiError::config(format!(
            "`plugin.{}.config.tls-client-cert`: only used to reach HTTPS owners, which needs \
             `tls-ca` (the CAs this consumer trusts)",
            cfg.instance
        )));
    }
    Ok(Tls { server, client })
}

/// The name a consumer checks the owner's certificate against.
pub(crate) use tls::{is_tls_error, server_name};

/// What to look at for each kind of TLS failure with an owner.
const HINTS: Hints<'static> = Hints {
    untrusted: "; the owner's certificate is not issued by a CA in this consumer's `tls-ca`, \
                or does not name the address it advertises",
    refused: "; the owner requires mutual TLS and refused this consumer's certificate (or its \
              absence): give this consumer `tls-client-cert` / `tls-client-key` (or `tls-cert` \
              / `tls-key`) issued by a CA in the owner's `tls-client-ca`",
    not_tls: "; the owner did not answer like a TLS server: it may serve plain HTTP while its \
              descriptor says HTTPS (a restarted owner without `tls-cert`?)",
};

/// A TLS failure talking to owner `addr`, as an error the operator can act
/// on: what went wrong, and which key to look at.
pub(crate) fn explain(addr: &str, e: &io::Error) -> AbiError {
    let Some((failure, text)) = tls::explain(e, &HINTS) else {
        return AbiError::unavailable(format!("TLS with owner {addr} failed: {e}"));
    };
    let kind = match failure {
        Failure::Untrusted | Failure::CertificateRefused => ErrorKind::PERMISSION_DENIED,
        Failure::NotTls | Failure::Other => ErrorKind::UNAVAILABLE,
    };
    AbiError::new(kind, format!("TLS with owner {addr} failed: {text}"))
}
