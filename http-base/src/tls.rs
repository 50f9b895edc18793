//! TLS for every shardport endpoint and client: rustls with the ring
//! provider (no OpenSSL).
//!
//! # Overview
//! [`certs`], [`private_key`] and [`roots`] read PEM files; each error names
//! the setting that gave the file (`name`, e.g. `` `control.tls-cert` `` or
//! `--ca`) and the file: `{name} = "{path}": {why}`. [`server_config`] and
//! [`client_config`] build rustls configs from what they read, with one
//! protocol policy (rustls' safe defaults, no session tickets: a server of
//! one request per connection has nothing to resume, and a pooled client
//! connection lives long). A client checks a certificate against
//! [`server_name`] of the address it was given.
//!
//! A TLS connection starts with a handshake record
//! ([`TLS_HANDSHAKE_RECORD`]) and an HTTP request with a letter, so a server
//! can answer a client that speaks the other protocol at once.
//!
//! # Failure modes
//! rustls reports handshake failures as bare `io::Error`s; [`explain`] sorts
//! them ([`Failure`]) and adds the caller's hint for each kind, so an
//! operator reads which setting to look at.

use std::{io, path::Path, sync::Arc};

use rustls::{
    client::WebPkiServerVerifier,
    crypto::{ring, CryptoProvider},
    server::danger::ClientCertVerifier,
    AlertDescription, ClientConfig, RootCertStore, ServerConfig,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};

/// The first byte of every TLS connection (a handshake record).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// ring's provider in rustls' default order.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// ring's provider with AES-128-GCM preferred over AES-256-GCM (rustls'
/// default order puts AES-256 first): both are recommended suites, and
/// AES-128 has four fewer rounds per block, which shows on bulk shard
/// transfers. Nothing is removed, so a peer that offers only other suites
/// still connects.
pub fn bulk_provider() -> Arc<CryptoProvider> {
    let mut p = ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// `{name} = "{path}": {why}`.
fn bad(name: &str, path: &Path, why: impl std::fmt::Display) -> String {
    format!("{name} = \"{}\": {why}", path.display())
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

/// The certificates of PEM file `path` (at least one), which setting
/// `name` gave.
pub fn certs(name: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| bad(name, path, pem_error(e, "certificate")))?;
    if certs.is_empty() {
        return Err(bad(
            name,
            path,
            "no certificate in this file (expected PEM `BEGIN CERTIFICATE` blocks)",
        ));
    }
    Ok(certs)
}

/// The private key of PEM file `path`, which setting `name` gave.
pub fn private_key(name: &str, path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| bad(name, path, pem_error(e, "private key")))
}

/// The CA certificates of PEM file `path`, which setting `name` gave.
pub fn roots(name: &str, path: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut store = RootCertStore::empty();
    for c in certs(name, path)? {
        store
            .add(c)
            .map_err(|e| bad(name, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// Why a config could not be built from what the files held.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The provider supports none of the safe protocol versions.
    #[error("{0}")]
    Versions(rustls::Error),
    /// The verifier over the CA certificates could not be built.
    #[error("{0}")]
    Verifier(String),
    /// The private key does not go with the certificate chain.
    #[error("{0}")]
    KeyMismatch(rustls::Error),
}

/// A server config presenting `chain` with `key`; it asks for a client
/// certificate when `clients` (a verifier over the CAs it trusts) is given.
pub fn server_config(
    provider: Arc<CryptoProvider>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<ServerConfig, ConfigError> {
    let builder = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Versions)?;
    let builder = match clients {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut sc = builder
        .with_single_cert(chain, key)
        .map_err(ConfigError::KeyMismatch)?;
    sc.send_tls13_tickets = 0;
    Ok(sc)
}

/// A verifier of client certificates issued by a CA in `roots` (mutual TLS).
pub fn client_verifier(
    provider: Arc<CryptoProvider>,
    roots: Arc<RootCertStore>,
) -> Result<Arc<dyn ClientCertVerifier>, ConfigError> {
    rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
        .build()
        .map_err(|e| ConfigError::Verifier(e.to_string()))
}

/// A client config trusting the CAs in `roots`, presenting `identity`
/// (chain and key) when a server asks for a certificate.
pub fn client_config(
    provider: Arc<CryptoProvider>,
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, ConfigError> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
        .build()
        .map_err(|e| ConfigError::Verifier(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::Versions)?
        .with_webpki_verifier(verifier);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(ConfigError::KeyMismatch),
    }
}

/// The name a client checks the certificate against: the host of
/// `host:port` (an IP address, bracketed for IPv6, or a DNS name).
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host:?} cannot be checked against a certificate: {e}"))
}

/// The rustls error inside an I/O error, if there is one.
pub fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether `e` is a TLS failure (rather than plain I/O).
pub fn is_tls_error(e: &io::Error) -> bool {
    rustls_error(e).is_some()
}

/// What kind of TLS failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The peer's certificate is not trusted or does not name the address.
    Untrusted,
    /// The peer refused this side's client certificate, or its absence.
    CertificateRefused,
    /// The peer did not answer like TLS (it may speak plain HTTP).
    NotTls,
    /// Anything else.
    Other,
}

/// What an operator should look at for each kind of [`Failure`]; each is
/// appended to rustls' message (start it with `"; "`, or leave it empty).
#[derive(Debug, Clone, Copy)]
pub struct Hints<'a> {
    /// For [`Failure::Untrusted`].
    pub untrusted: &'a str,
    /// For [`Failure::CertificateRefused`].
    pub refused: &'a str,
    /// For [`Failure::NotTls`].
    pub not_tls: &'a str,
}

/// The kind of a rustls error.
pub fn classify(e: &rustls::Error) -> Failure {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(_) => Failure::Untrusted,
        E::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => Failure::CertificateRefused,
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. } => Failure::NotTls,
        _ => Failure::Other,
    }
}

/// A TLS failure as a sentence with the hint for its kind, from the error
/// rustls put inside an `io::Error`; `None` when it is plain I/O.
pub fn explain(e: &io::Error, hints: &Hints<'_>) -> Option<(Failure, String)> {
    let te = rustls_error(e)?;
    let kind = classify(te);
    let hint = match kind {
        Failure::Untrusted => hints.untrusted,
        Failure::CertificateRefused => hints.refused,
        Failure::NotTls => hints.not_tls,
        Failure::Other => "",
    };
    Some((kind, format!("{te}{hint}")))
}

#[cfg(test)]
mod tests;
