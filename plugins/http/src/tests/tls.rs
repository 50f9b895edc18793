//! TLS and mutual TLS between whole transport instances on real sockets,
//! with a throwaway CA (rcgen) written to a temp dir per test: fetches over
//! HTTPS, refused certificates, plain-vs-TLS mismatches, stalled
//! handshakes, and config errors that name the key and the file.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use shardport_abi::{ErrorKind, ImportItem, RSlice, RSliceMut, ShardMeta};

use super::{
    assert_kind, export, export_gpu, fetch, fetch_device, fetch_noted, gpu_meta, node, pattern,
    stat, try_node, wait_for_stat, GENEROUS, STAND_IN,
};
use crate::descriptor::Descriptor;

/// A certificate authority made for one test.
pub(crate) struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by this
    /// CA, and its key, as PEM.
    pub(crate) fn issue(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, "shardport test");
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub(crate) fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// PEM files in a temp dir.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// `(cert, key)` files of a certificate for 127.0.0.1 from `ca`.
    fn issue(&self, ca: &Ca, name: &str) -> (PathBuf, PathBuf) {
        let (c, k) = ca.issue(&["127.0.0.1", "localhost"]);
        (
            self.write(&format!("{name}.crt"), &c),
            self.write(&format!("{name}.key"), &k),
        )
    }

    fn ca(&self, ca: &Ca, name: &str) -> PathBuf {
        self.write(&format!("{name}.pem"), &ca.pem())
    }
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// An owner config serving TLS with `cert`.
fn owner_cfg(cert: &(PathBuf, PathBuf)) -> String {
    format!(
        "tls-cert = \"{}\"\ntls-key = \"{}\"\n",
        p(&cert.0),
        p(&cert.1)
    )
}

#[test]
fn shards_move_over_https_single_and_batched() {
    let files = Files::new();
    let ca = Ca::new("test CA");
    let server = files.issue(&ca, "owner");
    let ca_file = files.ca(&ca, "ca");
    let owner = node(&format!("{}auth-token = \"tok\"", owner_cfg(&server)));
    let consumer = node(&format!(
        "tls-ca = \"{}\"\nauth-token = \"tok\"",
        p(&ca_file)
    ));
    let a = pattern(300_001, 3);
    let b = pattern(4096, 4);
    let da = export(&owner.t, 1, &a).unwrap();
    let db = export(&owner.t, 2, &b).unwrap();
    // The descriptor says HTTPS.
    let d = Descriptor::decode(&da).unwrap();
    assert!(d.tls);
    assert_eq!(d.addr, owner.addr.to_string());
    assert!(owner.t.health().message.as_str().ends_with("over TLS"));

    assert_eq!(fetch(&consumer.t, &da, a.len()).unwrap(), a);
    assert_eq!(fetch(&consumer.t, &db, b.len()).unwrap(), b);
    // A batch over a pooled TLS connection.
    let (mut xa, mut xb) = (vec![0u8; a.len()], vec![0u8; b.len()]);
    let (ma, mb) = (
        ShardMeta::bytes(a.len() as u64),
        ShardMeta::bytes(b.len() as u64),
    );
    let mut items = vec![
        ImportItem {
            desc: RSlice::from_slice(&da),
            meta: &ma,
            dst: RSliceMut::from_mut_slice(&mut xa),
        },
        ImportItem {
            desc: RSlice::from_slice(&db),
            meta: &mb,
            dst: RSliceMut::from_mut_slice(&mut xb),
        },
    ];
    for r in consumer
        .t
        .import_many(RSliceMut::from_mut_slice(&mut items))
    {
        r.into_result().unwrap();
    }
    drop(items);
    assert_eq!((xa, xb), (a.clone(), b.clone()));
    assert_eq!(stat(&consumer.t, "client_connections_opened"), 1);
    assert!(stat(&consumer.t, "client_connections_reused") >= 2);
    assert_eq!(stat(&owner.t, "tls_handshake_failures"), 0);
    assert_eq!(stat(&owner.t, "auth_failures"), 0);
}

/// GPU shards are staged over HTTPS with the token like CPU shards (host
/// memory standing in for the device): both destinations, and a consumer
/// without the token is refused before any byte leaves device memory.
#[test]
fn gpu_shards_move_over_https_with_the_token() {
    let files = Files::new();
    let ca = Ca::new("test CA");
    let server = files.issue(&ca, "owner");
    let ca_file = files.ca(&ca, "ca");
    let owner = node(&format!(
        "{}auth-token = \"tok\"\n{STAND_IN}",
        owner_cfg(&server)
    ));
    let consumer = node(&format!(
        "tls-ca = \"{}\"\nauth-token = \"tok\"\n{STAND_IN}",
        p(&ca_file)
    ));
    let data = pattern((3 << 16) + 7, 8);
    let desc = export_gpu(&owner.t, 1, &data);
    assert!(Descriptor::decode(&desc).unwrap().tls);
    assert!(fetch_device(&consumer.t, &desc, data.len()).unwrap() == data);
    let mut host = vec![0u8; data.len()];
    consumer
        .t
        .import_into(
            RSlice::from_slice(&desc),
            &gpu_meta(data.len()),
            RSliceMut::from_mut_slice(&mut host),
        )
        .into_result()
        .unwrap();
    assert!(host == data);
    let stranger = node(&format!("tls-ca = \"{}\"\n{STAND_IN}", p(&ca_file)));
    assert_kind(
        fetch_device(&stranger.t, &desc, data.len()),
        ErrorKind::PERMISSION_DENIED,
        "token",
    );
    assert_eq!(stat(&owner.t, "auth_failures"), 1);
}

#[test]
fn mutual_tls_admits_certificates_of_the_client_ca_only() {
    let files = Files::new();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let other_ca = Ca::new("another CA");
    let server = files.issue(&server_ca, "owner");
    let good = files.issue(&client_ca, "good");
    let foreign = files.issue(&other_ca, "foreign");
    let (server_ca_file, client_ca_file) = (
        files.ca(&server_ca, "server-ca"),
        files.ca(&client_ca, "client-ca"),
    );
    let owner = node(&format!(
        "{}tls-client-auth = \"required\"\ntls-client-ca = \"{}\"",
        owner_cfg(&server),
        p(&client_ca_file)
    ));
    let data = pattern(65_536, 9);
    let desc = export(&owner.t, 7, &data).unwrap();
    let consumer = |identity: Option<&(PathBuf, PathBuf)>| {
        let mut cfg = format!("tls-ca = \"{}\"\n", p(&server_ca_file));
        if let Some((c, k)) = identity {
            cfg.push_str(&format!(
                "tls-client-cert = \"{}\"\ntls-client-key = \"{}\"\n",
                p(c),
                p(k)
            ));
        }
        node(&cfg)
    };

    // A certificate from the client CA: admitted.
    assert_eq!(
        fetch(&consumer(Some(&good)).t, &desc, data.len()).unwrap(),
        data
    );
    // An owner's own tls-cert/tls-key serve as its client identity too.
    let both = node(&format!(
        "{}tls-ca = \"{}\"",
        owner_cfg(&good),
        p(&server_ca_file)
    ));
    assert_eq!(fetch(&both.t, &desc, data.len()).unwrap(), data);

    // No certificate, or one from another CA: refused, saying why.
    for (who, c) in [
        ("none", consumer(None)),
        ("foreign", consumer(Some(&foreign))),
    ] {
        let e = assert_kind(
            fetch(&c.t, &desc, data.len()),
            ErrorKind::PERMISSION_DENIED,
            "requires mutual TLS and refused this consumer's certificate",
        );
        assert!(e.message.contains(&owner.addr.to_string()), "{who}: {e}");
        assert!(e.message.contains("tls-client-ca"), "{who}: {e}");
    }
    wait_for_stat(&owner.t, "tls_handshake_failures", 2);
    // The owner still serves the good consumer afterwards.
    assert_eq!(
        fetch(&consumer(Some(&good)).t, &desc, data.len()).unwrap(),
        data
    );
}

#[test]
fn an_owner_certificate_from_another_ca_is_refused() {
    let files = Files::new();
    let (ca, other) = (Ca::new("owner CA"), Ca::new("unrelated CA"));
    let owner = node(&owner_cfg(&files.issue(&ca, "owner")));
    let consumer = node(&format!("tls-ca = \"{}\"", p(&files.ca(&other, "other"))));
    let data = pattern(1000, 1);
    let desc = export(&owner.t, 1, &data).unwrap();
    assert_kind(
        fetch(&consumer.t, &desc, data.len()),
        ErrorKind::PERMISSION_DENIED,
        "not issued by a CA in this consumer's `tls-ca`",
    );
    // A certificate that does not name the advertised address is refused too.
    let (c, k) = ca.issue(&["elsewhere.example"]);
    let (c, k) = (files.write("w.crt", &c), files.write("w.key", &k));
    let owner = node(&owner_cfg(&(c, k)));
    let desc = export(&owner.t, 2, &data).unwrap();
    let consumer = node(&format!("tls-ca = \"{}\"", p(&files.ca(&ca, "ca"))));
    assert_kind(
        fetch(&consumer.t, &desc, data.len()),
        ErrorKind::PERMISSION_DENIED,
        "does not name the address it advertises",
    );
}

#[test]
fn plain_and_tls_mismatches_fail_at_once_with_clear_errors() {
    let files = Files::new();
    let ca = Ca::new("test CA");
    let tls_owner = node(&owner_cfg(&files.issue(&ca, "owner")));
    let plain_owner = node("");
    let data = pattern(5000, 2);
    let tls_desc = export(&tls_owner.t, 1, &data).unwrap();
    let plain_desc = export(&plain_owner.t, 1, &data).unwrap();
    assert!(!Descriptor::decode(&plain_desc).unwrap().tls);

    // A consumer without `tls-ca` is told what to set, without connecting.
    let plain_consumer = node("");
    assert_kind(
        fetch(&plain_consumer.t, &tls_desc, data.len()),
        ErrorKind::PERMISSION_DENIED,
        "serves HTTPS (its descriptor says so), but this consumer has no `tls-ca`",
    );
    assert_eq!(stat(&tls_owner.t, "connections_accepted"), 0);
    // It still reads plain owners, and a TLS consumer does too.
    assert_eq!(
        fetch(&plain_consumer.t, &plain_desc, data.len()).unwrap(),
        data
    );
    let tls_consumer = node(&format!("tls-ca = \"{}\"", p(&files.ca(&ca, "ca"))));
    assert_eq!(
        fetch(&tls_consumer.t, &plain_desc, data.len()).unwrap(),
        data
    );

    // A plain-HTTP client of a TLS owner gets a plain 400 that says so.
    let mut s = TcpStream::connect(tls_owner.addr).unwrap();
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("\"tls_required\""), "{answer}");
    assert!(answer.contains("serves HTTPS only"), "{answer}");

    // A descriptor that says HTTPS for an owner that serves plain HTTP (an
    // owner restarted without TLS): a clear error, not a hang.
    let mut d = Descriptor::decode(&plain_desc).unwrap();
    d.tls = true;
    let e = fetch(&tls_consumer.t, &d.encode(), data.len()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::UNAVAILABLE, "{e}");
    assert!(
        e.message.contains("did not answer like a TLS server")
            || e.message
                .contains("closed the connection during the TLS handshake"),
        "{e}"
    );
}

#[test]
fn handshakes_are_bounded_on_both_sides() {
    let files = Files::new();
    let ca = Ca::new("test CA");
    // Owner side: a peer that starts a handshake and stalls is closed after
    // tls-handshake-timeout.
    let owner = node(&format!(
        "{}tls-handshake-timeout = \"200ms\"",
        owner_cfg(&files.issue(&ca, "owner"))
    ));
    let mut s = TcpStream::connect(owner.addr).unwrap();
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        r => panic!("the stalled handshake was not closed: {r:?}"),
    }
    wait_for_stat(&owner.t, "tls_handshake_failures", 1);
    wait_for_stat(&owner.t, "connections_timed_out", 1);
    assert_eq!(stat(&owner.t, "tls_handshake_failures"), 1);

    // Consumer side: an owner that accepts and never answers costs at most
    // connect-timeout.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let d = Descriptor {
        addr: silent.local_addr().unwrap().to_string(),
        id: shardport_abi::ShardId::from_u128(1),
        len: 10,
        tls: true,
    }
    .encode();
    let consumer = node(&format!(
        "tls-ca = \"{}\"\nconnect-timeout = \"300ms\"",
        p(&files.ca(&ca, "ca"))
    ));
    assert_kind(
        fetch(&consumer.t, &d, 10),
        ErrorKind::TIMEOUT,
        "TLS handshake with owner",
    );
    drop(silent);
}

#[test]
fn bad_tls_files_are_config_errors_naming_the_key_and_the_file() {
    let files = Files::new();
    let ca = Ca::new("test CA");
    let (cert, key) = files.issue(&ca, "owner");
    let (_, other_key) = files.issue(&ca, "other");
    let garbage = files.write("garbage.pem", "not a certificate\n");
    let missing = files.dir.path().join("missing.pem");
    let ca_file = files.ca(&ca, "ca");
    let cases = [
        (
            format!("tls-cert = \"{}\"\ntls-key = \"{}\"", p(&missing), p(&key)),
            format!("`plugin.http.config.tls-cert` = \"{}\": cannot read the file", p(&missing)),
        ),
        (
            format!("tls-cert = \"{}\"\ntls-key = \"{}\"", p(&garbage), p(&key)),
            format!("`plugin.http.config.tls-cert` = \"{}\": no certificate", p(&garbage)),
        ),
        (
            format!("tls-cert = \"{}\"\ntls-key = \"{}\"", p(&cert), p(&garbage)),
            format!("`plugin.http.config.tls-key` = \"{}\": no private key", p(&garbage)),
        ),
        (
            format!("tls-cert = \"{}\"\ntls-key = \"{}\"", p(&cert), p(&other_key)),
            format!("`plugin.http.config.tls-key` = \"{}\": cannot be used with `tls-cert`", p(&other_key)),
        ),
        (
            format!("tls-ca = \"{}\"", p(&missing)),
            format!("`plugin.http.config.tls-ca` = \"{}\": cannot read the file", p(&missing)),
        ),
        (
            format!(
                "tls-cert = \"{}\"\ntls-key = \"{}\"\ntls-client-auth = \"required\"\ntls-client-ca = \"{}\"",
                p(&cert),
                p(&key),
                p(&garbage)
            ),
            format!("`plugin.http.config.tls-client-ca` = \"{}\": no certificate", p(&garbage)),
        ),
        (
            format!(
                "tls-ca = \"{}\"\ntls-client-cert = \"{}\"\ntls-client-key = \"{}\"",
                p(&ca_file),
                p(&missing),
                p(&key)
            ),
            format!("`plugin.http.config.tls-client-cert` = \"{}\": cannot read the file", p(&missing)),
        ),
        (
            format!("tls-client-cert = \"{}\"\ntls-client-key = \"{}\"", p(&cert), p(&key)),
            "`plugin.http.config.tls-client-cert`: only used to reach HTTPS owners".to_owned(),
        ),
    ];
    for (cfg, want) in cases {
        let e = try_node(&cfg).expect_err(&cfg);
        assert_eq!(e.kind, ErrorKind::CONFIG, "{cfg}: {e}");
        assert!(e.message.starts_with(&want), "{cfg}:\n{e}\nwant: {want}");
    }
}

/// A batch request larger than rustls's 64 KiB send buffer (5000 ids,
/// 80 KiB) goes out whole over TLS.
#[test]
fn a_large_batch_request_crosses_tls() {
    let files = Files::new();
    let ca = Ca::new("test CA");
    let owner = node(&format!(
        "{}max-batch = 8192",
        owner_cfg(&files.issue(&ca, "owner"))
    ));
    let consumer = node(&format!(
        "tls-ca = \"{}\"\nmax-batch = 8192",
        p(&files.ca(&ca, "ca"))
    ));
    let n = 5000;
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(8, i as u8)).collect();
    let descs: Vec<Vec<u8>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| export(&owner.t, i as u128 + 1, d).unwrap())
        .collect();
    let meta = ShardMeta::bytes(8);
    let mut bufs = vec![vec![0u8; 8]; n];
    let mut items: Vec<ImportItem<'_>> = descs
        .iter()
        .zip(bufs.iter_mut())
        .map(|(d, b)| ImportItem {
            desc: RSlice::from_slice(d),
            meta: &meta,
            dst: RSliceMut::from_mut_slice(b),
        })
        .collect();
    for r in consumer
        .t
        .import_many(RSliceMut::from_mut_slice(&mut items))
    {
        r.into_result().unwrap();
    }
    drop(items);
    assert_eq!(bufs, data);
    assert_eq!(stat(&consumer.t, "batch_requests"), 1);
}

/// Relays under TLS: every holder serves HTTPS with its own certificate
/// from the consumers' CA, and the token applies inside. The second
/// consumer gets the shard from the first, over TLS.
#[test]
fn relays_serve_over_tls_with_the_token() {
    let files = Files::new();
    let ca = Ca::new("relay CA");
    let ca_file = files.ca(&ca, "ca");
    let tls = |name: &str| {
        format!(
            "{}tls-ca = \"{}\"\nauth-token = \"tok\"\nrelay = \"on\"\nrelay-min-size = \"64KiB\"\n",
            owner_cfg(&files.issue(&ca, name)),
            p(&ca_file)
        )
    };
    let owner = node(&format!("{}relay-piece = \"16KiB\"", tls("owner")));
    let data = pattern((1 << 20) + 9, 8);
    let desc = export(&owner.t, 1, &data).unwrap();
    let first = node(&tls("first"));
    let second = node(&tls("second"));
    assert_eq!(fetch(&first.t, &desc, data.len()).unwrap(), data);
    let (dst, note) = fetch_noted(&second.t, &desc, data.len()).unwrap();
    assert_eq!(dst, data);
    assert!(
        note.contains(&format!("from relay {}", first.addr)),
        "{note}"
    );
    assert_eq!(stat(&first.t, "relay_bytes_served"), data.len() as u64);
}

/// A TLS owner never sends a consumer to a plain-HTTP holder: a relay
/// without a certificate is never named a parent, so every consumer gets
/// the shard over TLS, from the owner or a TLS holder.
#[test]
fn a_tls_owner_never_names_a_plain_holder() {
    let files = Files::new();
    let ca = Ca::new("relay CA");
    let ca_file = files.ca(&ca, "ca");
    let owner = node(&format!(
        "{}relay-piece = \"16KiB\"",
        owner_cfg(&files.issue(&ca, "owner"))
    ));
    let data = pattern((1 << 20) + 9, 9);
    let desc = export(&owner.t, 1, &data).unwrap();
    let plain_relay = format!(
        "tls-ca = \"{}\"\nrelay = \"on\"\nrelay-min-size = \"64KiB\"\n",
        p(&ca_file)
    );
    let plain = node(&plain_relay);
    assert_eq!(fetch(&plain.t, &desc, data.len()).unwrap(), data);
    let next = node(&plain_relay);
    assert_eq!(fetch(&next.t, &desc, data.len()).unwrap(), data);
    assert_eq!(stat(&plain.t, "relay_bytes_served"), 0, "never a parent");
    assert_eq!(stat(&next.t, "relay_bytes_from_holders"), 0);
    assert_eq!(stat(&owner.t, "bytes_served"), 2 * data.len() as u64);
}

/// An owner that requires client certificates names only holders that
/// require them too: a holder that serves TLS to anyone would hand the
/// shard to a token holder without a certificate.
#[test]
fn an_owner_requiring_client_certificates_names_only_holders_that_do() {
    let files = Files::new();
    let ca = Ca::new("relay CA");
    let ca_file = files.ca(&ca, "ca");
    let mtls = format!(
        "tls-client-auth = \"required\"\ntls-client-ca = \"{}\"\n",
        p(&ca_file)
    );
    let owner = node(&format!(
        "{}{mtls}relay-piece = \"16KiB\"",
        owner_cfg(&files.issue(&ca, "owner"))
    ));
    let relay = |name: &str, strict: bool| {
        node(&format!(
            "{}tls-ca = \"{}\"\nrelay = \"on\"\nrelay-min-size = \"64KiB\"\n{}",
            owner_cfg(&files.issue(&ca, name)),
            p(&ca_file),
            if strict { mtls.as_str() } else { "" }
        ))
    };
    let data = pattern((1 << 20) + 9, 10);
    let desc = export(&owner.t, 1, &data).unwrap();
    let lax = relay("lax", false);
    assert_eq!(fetch(&lax.t, &desc, data.len()).unwrap(), data);
    let strict = relay("strict", true);
    let (got, note) = fetch_noted(&strict.t, &desc, data.len()).unwrap();
    assert_eq!(got, data);
    assert!(
        note.starts_with("from owner"),
        "sent to a lax holder: {note}"
    );
    let third = relay("third", true);
    let (got, note) = fetch_noted(&third.t, &desc, data.len()).unwrap();
    assert_eq!(got, data);
    assert!(
        note.contains(&format!("from relay {}", strict.addr)),
        "{note}"
    );
    assert_eq!(stat(&lax.t, "relay_bytes_served"), 0, "never a parent");
}
