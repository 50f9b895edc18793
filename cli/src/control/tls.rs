//! Optional TLS for the control endpoint and its client: rustls with the
//! ring provider (no OpenSSL).
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

use rustls::{
    crypto::{ring, CryptoProvider},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    ClientConfig, RootCertStore, ServerConfig,
};

/// The first byte of every TLS connection (a handshake record).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn pem_error(e: rustls::pki_types::pem::Error, what: &str) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(e) => format!("cannot read the file: {e}"),
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("no {what} in this file (expected PEM)")
        }
        e => format!("not a valid PEM file: {e:?}"),
    }
}

/// The certificates of a PEM file; `what` names the key or flag in errors.
fn certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |why: String| format!("{what} = \"{}\": {why}", path.display());
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| bad(pem_error(e, "certificate")))?;
    if certs.is_empty() {
        return Err(bad(
            "no certificate in this file (expected PEM `BEGIN CERTIFICATE` blocks)".into(),
        ));
    }
    Ok(certs)
}

/// The control endpoint's TLS config from `[control] tls-cert` and
/// `tls-key`; errors name the key and the file.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = certs("`control.tls-cert`", cert)?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        format!(
            "`control.tls-key` = \"{}\": {}",
            key.display(),
            pem_error(e, "private key")
        )
    })?;
    let mut sc = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("control endpoint TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            format!(
                "`control.tls-key` = \"{}\" cannot be used with `control.tls-cert` = \"{}\": {e}",
                key.display(),
                cert.display()
            )
        })?;
    // One request per connection: nothing to resume.
    sc.send_tls13_tickets = 0;
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
        let mut roots = RootCertStore::empty();
        for c in certs("--ca", path)? {
            roots.add(c).map_err(|e| {
                format!(
                    "--ca = \"{}\": not a usable CA certificate: {e}",
                    path.display()
                )
            })?;
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("control client TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Trust {
            config: Arc::new(config),
        })
    }

    /// The rustls config.
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
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

/// A TLS failure as a sentence with a hint, from the error rustls put
/// inside an `io::Error`; `None` when it is plain I/O.
pub fn explain(e: &io::Error) -> Option<String> {
    let te = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    use rustls::Error as E;
    let hint = match te {
        E::InvalidCertificate(_) => {
            "; the endpoint's certificate is not issued by a CA in --ca, or does not name \
             the address given to --node"
        }
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. } => {
            "; the endpoint did not answer like a TLS server: it may serve plain HTTP \
             (drop --ca, or set `control.tls-cert` on the node)"
        }
        _ => "",
    };
    Some(format!("{te}{hint}"))
}
