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
//! certificate), since rustls reports them as bare `io::Error`s.

use std::{io, path::Path, sync::Arc};

use rustls::{
    client::WebPkiServerVerifier,
    crypto::{ring, CryptoProvider},
    server::WebPkiClientVerifier,
    AlertDescription, ClientConfig, RootCertStore, ServerConfig,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use shardport_abi::{AbiError, ErrorKind, PluginResult};

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

/// ring's provider with AES-128-GCM preferred over AES-256-GCM (rustls'
/// default order puts AES-256 first): both are recommended suites, and
/// AES-128 has four fewer rounds per block, which shows on bulk shard
/// transfers. Nothing is removed, so a peer that offers only other suites
/// still connects.
fn provider() -> Arc<CryptoProvider> {
    let mut p = ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// A config error naming `plugin.<instance>.config.<key>` and the file.
fn bad_file(cfg: &Config, key: &str, path: &Path, why: impl std::fmt::Display) -> AbiError {
    AbiError::config(format!(
        "`plugin.{}.config.{key}` = \"{}\": {why}",
        cfg.instance,
        path.display()
    ))
}

fn pem_error(e: rustls_pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(e) => format!("cannot read the file: {e}"),
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("no {what} in this file (expected PEM)")
        }
        e => format!("not a valid PEM file: {e:?}"),
    }
}

fn certs(cfg: &Config, key: &str, path: &Path) -> PluginResult<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| bad_file(cfg, key, path, pem_error(e, "certificate")))?;
    if certs.is_empty() {
        return Err(bad_file(
            cfg,
            key,
            path,
            "no certificate in this file (expected PEM `BEGIN CERTIFICATE` blocks)",
        ));
    }
    Ok(certs)
}

fn private_key(cfg: &Config, key: &str, path: &Path) -> PluginResult<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| bad_file(cfg, key, path, pem_error(e, "private key")))
}

fn roots(cfg: &Config, key: &str, path: &Path) -> PluginResult<Arc<RootCertStore>> {
    let mut store = RootCertStore::empty();
    for c in certs(cfg, key, path)? {
        store
            .add(c)
            .map_err(|e| bad_file(cfg, key, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// Reads and checks every file the `tls-*` keys name; builds the configs.
pub(crate) fn setup(cfg: &Config) -> PluginResult<Tls> {
    let files = &cfg.tls;
    let server = match &files.cert {
        None => None,
        Some((cert_path, key_path)) => {
            let chain = certs(cfg, "tls-cert", cert_path)?;
            let key = private_key(cfg, "tls-key", key_path)?;
            let builder = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| AbiError::config(format!("tls: {e}")))?;
            let builder = match (files.client_auth, &files.client_ca) {
                (ClientAuth::Required, Some(ca)) => {
                    let verifier = WebPkiClientVerifier::builder_with_provider(
                        roots(cfg, "tls-client-ca", ca)?,
                        provider(),
                    )
                    .build()
                    .map_err(|e| bad_file(cfg, "tls-client-ca", ca, e))?;
                    builder.with_client_cert_verifier(verifier)
                }
                _ => builder.with_no_client_auth(),
            };
            let mut sc = builder.with_single_cert(chain, key).map_err(|e| {
                bad_file(
                    cfg,
                    "tls-key",
                    key_path,
                    format!(
                        "cannot be used with `tls-cert` = \"{}\": {e}",
                        cert_path.display()
                    ),
                )
            })?;
            // Consumers do not resume sessions (a pooled connection lives
            // long); tickets would only be bytes a pooled connection has to
            // skip.
            sc.send_tls13_tickets = 0;
            Some(Arc::new(sc))
        }
    };
    let client = match &files.ca {
        None => None,
        Some(ca) => {
            let verifier =
                WebPkiServerVerifier::builder_with_provider(roots(cfg, "tls-ca", ca)?, provider())
                    .build()
                    .map_err(|e| bad_file(cfg, "tls-ca", ca, e))?;
            let builder = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| AbiError::config(format!("tls: {e}")))?
                .with_webpki_verifier(verifier);
            let identity = match (&files.client_cert, &files.cert) {
                (Some(pair), _) => Some((pair, "tls-client-cert", "tls-client-key")),
                (None, Some(pair)) => Some((pair, "tls-cert", "tls-key")),
                (None, None) => None,
            };
            let cc = match identity {
                None => builder.with_no_client_auth(),
                Some(((cert_path, key_path), ck, kk)) => {
                    let chain = certs(cfg, ck, cert_path)?;
                    let key = private_key(cfg, kk, key_path)?;
                    builder.with_client_auth_cert(chain, key).map_err(|e| {
                        bad_file(
                            cfg,
                            kk,
                            key_path,
                            format!(
                                "cannot be used with `{ck}` = \"{}\": {e}",
                                cert_path.display()
                            ),
                        )
                    })?
                }
            };
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

/// The name a consumer checks the owner's certificate against: the host of
/// `host:port` (an IP address, bracketed for IPv6, or a DNS name).
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host:?} cannot be checked against a certificate: {e}"))
}

/// The rustls error inside an I/O error, if there is one.
fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether `e` is a TLS failure (rather than plain I/O).
pub(crate) fn is_tls_error(e: &io::Error) -> bool {
    rustls_error(e).is_some()
}

/// A TLS failure talking to owner `addr`, as an error the operator can act
/// on: what went wrong, and which key to look at.
pub(crate) fn explain(addr: &str, e: &io::Error) -> AbiError {
    let Some(te) = rustls_error(e) else {
        return AbiError::unavailable(format!("TLS with owner {addr} failed: {e}"));
    };
    use rustls::Error as E;
    let (kind, hint) = match te {
        E::InvalidCertificate(_) => (
            ErrorKind::PERMISSION_DENIED,
            "; the owner's certificate is not issued by a CA in this consumer's `tls-ca`, or \
             does not name the address it advertises",
        ),
        E::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => (
            ErrorKind::PERMISSION_DENIED,
            "; the owner requires mutual TLS and refused this consumer's certificate (or its \
             absence): give this consumer `tls-client-cert` / `tls-client-key` (or `tls-cert` \
             / `tls-key`) issued by a CA in the owner's `tls-client-ca`",
        ),
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. } => (
            ErrorKind::UNAVAILABLE,
            "; the owner did not answer like a TLS server: it may serve plain HTTP while its \
             descriptor says HTTPS (a restarted owner without `tls-cert`?)",
        ),
        _ => (ErrorKind::UNAVAILABLE, ""),
    };
    AbiError::new(kind, format!("TLS with owner {addr} failed: {te}{hint}"))
}
