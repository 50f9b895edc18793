use std::io::Write;

use super::*;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap();
    p
}

/// A self-signed certificate for 127.0.0.1 and its key, as files.
fn identity(dir: &Path, stem: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    (
        write(dir, &format!("{stem}.pem"), &ck.cert.pem()),
        write(dir, &format!("{stem}.key"), &ck.key_pair.serialize_pem()),
    )
}

#[test]
fn files_load_and_errors_name_the_setting_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = identity(dir.path(), "a");
    let chain = certs("`x.tls-cert`", &cert).unwrap();
    let k = private_key("`x.tls-key`", &key).unwrap();
    server_config(provider(), chain, k, None).unwrap();
    let store = roots("--ca", &cert).unwrap();
    client_config(bulk_provider(), store, None).unwrap();

    let missing = dir.path().join("missing.pem");
    let e = certs("--ca", &missing).unwrap_err();
    assert!(
        e.starts_with(&format!(
            "--ca = \"{}\": cannot read the file",
            missing.display()
        )),
        "{e}"
    );
    let empty = write(dir.path(), "empty.pem", "not pem\n");
    let e = certs("`x.tls-cert`", &empty).unwrap_err();
    assert!(e.contains("no certificate in this file"), "{e}");
    let e = private_key("`x.tls-key`", &cert).unwrap_err();
    assert!(e.contains("no private key in this file"), "{e}");
}

#[test]
fn a_key_that_does_not_go_with_the_chain_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = identity(dir.path(), "a");
    let (_, other_key) = identity(dir.path(), "b");
    let r = server_config(
        provider(),
        certs("c", &cert).unwrap(),
        private_key("k", &other_key).unwrap(),
        None,
    );
    assert!(matches!(r, Err(ConfigError::KeyMismatch(_))), "{r:?}");
}

#[test]
fn server_names_are_the_host_of_the_address() {
    assert_eq!(
        server_name("example.com:443").unwrap(),
        ServerName::try_from("example.com").unwrap()
    );
    assert_eq!(
        server_name("[::1]:80").unwrap(),
        ServerName::try_from("::1").unwrap()
    );
    assert_eq!(
        server_name("10.0.0.1:9").unwrap(),
        ServerName::try_from("10.0.0.1").unwrap()
    );
    let e = server_name("bad name:1").unwrap_err();
    assert!(e.contains("cannot be checked against a certificate"), "{e}");
}

#[test]
fn failures_get_the_hint_of_their_kind() {
    let hints = Hints {
        untrusted: "; check the CA",
        refused: "; check the client certificate",
        not_tls: "; plain HTTP?",
    };
    let plain = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
    assert_eq!(explain(&plain, &hints), None);
    assert!(!is_tls_error(&plain));
    let wrap = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
    let (kind, text) = explain(
        &wrap(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        )),
        &hints,
    )
    .unwrap();
    assert_eq!(kind, Failure::Untrusted);
    assert!(text.ends_with("; check the CA"), "{text}");
    let (kind, text) = explain(
        &wrap(rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired,
        )),
        &hints,
    )
    .unwrap();
    assert_eq!(kind, Failure::CertificateRefused);
    assert!(text.ends_with("; check the client certificate"), "{text}");
    let (kind, text) = explain(
        &wrap(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        )),
        &hints,
    )
    .unwrap();
    assert_eq!(kind, Failure::NotTls);
    assert!(text.ends_with("; plain HTTP?"), "{text}");
    let (kind, text) = explain(&wrap(rustls::Error::DecryptError), &hints).unwrap();
    assert_eq!(
        (kind, text),
        (Failure::Other, rustls::Error::DecryptError.to_string())
    );
}
