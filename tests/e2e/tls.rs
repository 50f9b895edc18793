//! TLS end to end, with a throwaway CA generated per test (rcgen): the http
//! transport between owner and consumer processes (`shardport worker`, the
//! real `.so` loaded by the host), mutual TLS admitting and refusing
//! consumers, the control endpoint of `shardport serve` over HTTPS with
//! `shardport stats --ca`, plain-vs-TLS mismatches answered at once, and
//! bad certificate paths reported as config errors naming key and file.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use shardport_cli::worker::WorkerProcess;
use shardport_host::FetchMode;

use crate::util;

/// A certificate authority made for one test.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    /// Writes `NAME.crt` (for 127.0.0.1 and localhost, signed by this CA)
    /// and `NAME.key` into `dir`.
    fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    /// Writes this CA's certificate as `NAME.pem` into `dir`.
    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(format!("{name}.pem"));
        std::fs::write(&p, self.cert.pem()).unwrap();
        p
    }
}

fn worker(dir: &Path, role: &str, config: &str) -> WorkerProcess {
    let sub = dir.join(role);
    std::fs::create_dir_all(&sub).unwrap();
    let (path, _) = util::write_config(&sub, config);
    WorkerProcess::spawn(
        role,
        &util::shardport_bin(),
        &["--config".into(), path.into_os_string()],
    )
    .expect("spawn worker")
}

/// The http plugin table with `extra` keys in its config.
fn http(extra: &str) -> String {
    format!("{}{extra}\n", util::http_plugin())
}

#[test]
fn http_fetches_over_mutual_tls_between_processes() {
    let dir = util::temp_dir("tls-http");
    let d = dir.path();
    let (server_ca, client_ca, other_ca) = (
        Ca::new("server CA"),
        Ca::new("client CA"),
        Ca::new("other CA"),
    );
    let (owner_cert, owner_key) = server_ca.issue(d, "owner");
    let (good_cert, good_key) = client_ca.issue(d, "consumer");
    let (bad_cert, bad_key) = other_ca.issue(d, "stranger");
    let (server_ca_file, client_ca_file) = (
        server_ca.write(d, "server-ca"),
        client_ca.write(d, "client-ca"),
    );
    let mut owner = worker(
        d,
        "owner",
        &http(&format!(
            "tls-cert = \"{}\"\ntls-key = \"{}\"\ntls-client-auth = \"required\"\ntls-client-ca = \"{}\"\nauth-token = \"t0k\"",
            owner_cert.display(),
            owner_key.display(),
            client_ca_file.display()
        )),
    );
    let consumer_cfg = |identity: Option<(&Path, &Path)>| {
        let mut extra = format!(
            "tls-ca = \"{}\"\nauth-token = \"t0k\"\n",
            server_ca_file.display()
        );
        if let Some((c, k)) = identity {
            extra.push_str(&format!(
                "tls-client-cert = \"{}\"\ntls-client-key = \"{}\"\n",
                c.display(),
                k.display()
            ));
        }
        http(&extra)
    };
    let mut good = worker(d, "good", &consumer_cfg(Some((&good_cert, &good_key))));
    for (i, len) in [0u64, 4096, (3 << 20) + 5].into_iter().enumerate() {
        let seed = 40 + i as u64;
        let h = util::put(&mut owner, len, seed).handle.unwrap();
        let r = util::fetch(
            &mut good,
            &h,
            FetchMode::Copy,
            Some(seed),
            false,
            Some("http"),
        )
        .unwrap();
        assert_eq!(r.verified, Some(true), "len {len}");
        assert_eq!(r.transport.as_deref(), Some("http"));
    }
    let h = util::put(&mut owner, 1 << 20, 9).handle.unwrap();
    // No client certificate, or one from another CA: refused with a reason.
    let mut anonymous = worker(d, "anonymous", &consumer_cfg(None));
    let mut stranger = worker(d, "stranger", &consumer_cfg(Some((&bad_cert, &bad_key))));
    for w in [&mut anonymous, &mut stranger] {
        let e = util::fetch(w, &h, FetchMode::Copy, Some(9), false, Some("http")).unwrap_err();
        assert!(
            e.contains("requires mutual TLS and refused this consumer's certificate"),
            "{e}"
        );
    }
    // A consumer that does not trust the owner's CA refuses the owner.
    let mut doubtful = worker(
        d,
        "doubtful",
        &http(&format!(
            "tls-ca = \"{}\"\ntls-client-cert = \"{}\"\ntls-client-key = \"{}\"\nauth-token = \"t0k\"",
            client_ca_file.display(),
            good_cert.display(),
            good_key.display()
        )),
    );
    let e = util::fetch(
        &mut doubtful,
        &h,
        FetchMode::Copy,
        Some(9),
        false,
        Some("http"),
    )
    .unwrap_err();
    assert!(
        e.contains("not issued by a CA in this consumer's `tls-ca`"),
        "{e}"
    );
    // A consumer without any TLS config is told what to set.
    let mut plain = worker(d, "plain", &http("auth-token = \"t0k\""));
    let e = util::fetch(
        &mut plain,
        &h,
        FetchMode::Copy,
        Some(9),
        false,
        Some("http"),
    )
    .unwrap_err();
    assert!(
        e.contains("serves HTTPS") && e.contains("set `tls-ca`"),
        "{e}"
    );
    // The good consumer still gets through.
    let r = util::fetch(&mut good, &h, FetchMode::Copy, Some(9), false, Some("http")).unwrap();
    assert_eq!(r.verified, Some(true));
}

/// `shardport serve` with `extra` config; returns the child and its
/// control address (from its first line of output).
fn serve(dir: &Path, extra: &str) -> (Child, String) {
    let (cfg, _) = util::write_config(
        dir,
        &format!(
            "[control]\nbind = \"127.0.0.1:0\"\n{extra}\n{}",
            util::http_plugin()
        ),
    );
    let mut child = Command::new(util::shardport_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let control = first
        .strip_prefix("control: ")
        .expect("control line")
        .to_owned();
    std::thread::spawn(move || for _ in lines {});
    (child, control)
}

fn shardport(args: &[&str]) -> std::process::Output {
    Command::new(util::shardport_bin())
        .args(args)
        .env_remove("SHARDPORT_TOKEN")
        .env_remove("SHARDPORT_CA")
        .output()
        .unwrap()
}

#[test]
fn the_control_endpoint_serves_https_to_the_cli() {
    let dir = util::temp_dir("tls-control");
    let d = dir.path();
    let ca = Ca::new("control CA");
    ca.issue(d, "control");
    let ca_file = ca.write(d, "ca");
    let other = Ca::new("other CA").write(d, "other");
    // Relative paths resolve against the config file's directory.
    let (mut tls_node, tls_addr) = serve(
        d,
        "auth-token = \"s3cret\"\ntls-cert = \"control.crt\"\ntls-key = \"control.key\"",
    );
    let ca_arg = ca_file.to_str().unwrap();

    let out = shardport(&[
        "stats", "--node", &tls_addr, "--token", "s3cret", "--ca", ca_arg,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(stats.get("shards_owned").is_some(), "{stats}");
    // put and metrics go over TLS too.
    let out = shardport(&[
        "put", "--node", &tls_addr, "--token", "s3cret", "--ca", ca_arg, "--size", "4KiB",
        "--seed", "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = shardport(&[
        "metrics", "--node", &tls_addr, "--token", "s3cret", "--ca", ca_arg,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A wrong token is still refused over TLS.
    let out = shardport(&[
        "stats", "--node", &tls_addr, "--token", "nope", "--ca", ca_arg,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    // Plain HTTP to the TLS endpoint: told to use TLS.
    let out = shardport(&["stats", "--node", &tls_addr, "--token", "s3cret"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("serves HTTPS only") && err.contains("--ca"),
        "{err}"
    );
    // A CA that did not issue the endpoint's certificate.
    let out = shardport(&[
        "stats",
        "--node",
        &tls_addr,
        "--token",
        "s3cret",
        "--ca",
        other.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TLS failed") && err.contains("not issued by a CA in --ca"),
        "{err}"
    );
    // A --ca file that is not there: a usage error naming the flag and file.
    let missing = d.join("missing.pem");
    let out = shardport(&[
        "stats",
        "--node",
        &tls_addr,
        "--ca",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "--ca = \"{}\": cannot read the file",
            missing.display()
        )),
        "{err}"
    );

    // TLS to a plain endpoint: told it serves plain HTTP.
    let plain_dir = d.join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let (mut plain_node, plain_addr) = serve(&plain_dir, "");
    let out = shardport(&["stats", "--node", &plain_addr, "--ca", ca_arg]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TLS failed") && err.contains("serve plain HTTP"),
        "{err}"
    );
    let out = shardport(&["stats", "--node", &plain_addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    util::terminate(&mut tls_node);
    util::terminate(&mut plain_node);
}

#[test]
fn bad_certificate_paths_are_config_errors_naming_key_and_file() {
    let dir = util::temp_dir("tls-bad-paths");
    let d = dir.path();
    let ca = Ca::new("CA");
    let (cert, key) = ca.issue(d, "node");
    let missing = d.join("nope.crt");
    let run = |extra: &str, http_extra: &str| {
        // Written as is: some of these do not even pass the config check.
        let cfg = d.join("node.toml");
        // `required`: a plugin that fails to load stops `serve` (exit 3)
        // instead of a warning.
        let text = format!(
            "[control]\nbind = \"127.0.0.1:0\"\n{extra}\n{}",
            http(http_extra).replacen("[plugin.config]", "required = true\n[plugin.config]", 1)
        );
        std::fs::write(&cfg, text).unwrap();
        let mut child = Command::new(util::shardport_bin())
            .args(["serve", "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A serve that started anyway would never exit: stop it after a
        // generous wait, so the test fails instead of hanging.
        let mut stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if std::time::Instant::now() > deadline {
                util::terminate(&mut child);
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        (status.and_then(|s| s.code()), reader.join().unwrap())
    };
    let (code, err) = run(
        &format!(
            "tls-cert = \"{}\"\ntls-key = \"{}\"",
            missing.display(),
            key.display()
        ),
        "",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "`control.tls-cert` = \"{}\": cannot read the file",
            missing.display()
        )),
        "{err}"
    );
    let (code, err) = run(&format!("tls-cert = \"{}\"", cert.display()), "");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("`control.tls-cert` needs `control.tls-key`"),
        "{err}"
    );
    let (code, err) = run(
        "",
        &format!(
            "tls-cert = \"{}\"\ntls-key = \"{}\"",
            cert.display(),
            missing.display()
        ),
    );
    // A plugin that refuses an option is an invalid config (exit 2), with
    // the option's file:line:col, like the host's own config errors.
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "`plugin.http.config.tls-key` = \"{}\": cannot read the file",
            missing.display()
        )),
        "{err}"
    );
    assert!(err.contains("node.toml:"), "{err}");
}

/// Clients that open TLS handshakes and stall are pending connections like
/// slow heads: they are evicted oldest first, and cut off at the head
/// deadline, while an operator's handshake and request get through.
#[test]
fn stalled_tls_handshakes_do_not_lock_out_an_operator() {
    use std::{io::Read as _, io::Write as _, net::TcpStream, time::Duration};

    use shardport_control::{client, tls, ControlServer, Limits};

    let dir = util::temp_dir("tls-stalled");
    let d = dir.path();
    let ca = Ca::new("control CA");
    let (cert, key) = ca.issue(d, "control");
    let trust = client::Trust::from_ca_file(&ca.write(d, "ca")).unwrap();
    let n = shardport_host::Node::start(util::parse(&util::http_plugin())).unwrap();
    let limits = Limits {
        max_pending: 8,
        max_pending_per_peer: 8,
        head_deadline: Duration::from_secs(2),
        ..Limits::default()
    };
    let server = ControlServer::start_tls(
        &n,
        "127.0.0.1:0",
        Some("tok".into()),
        limits,
        Some(tls::server_config(&cert, &key).unwrap()),
    )
    .unwrap();
    let addr = server.addr().to_string();
    // Twice the pending budget, each stuck after the first bytes of a
    // ClientHello.
    let attackers: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(&[0x16, 0x03, 0x01, 0x02]).unwrap();
            s
        })
        .collect();
    for _ in 0..3 {
        let stats = client::call_with(
            &addr,
            Some(&trust),
            "GET",
            "/v1/stats",
            Some("tok"),
            &[],
            Duration::from_secs(30),
        )
        .expect("an operator was locked out by stalled handshakes");
        assert!(stats.get("shards_owned").is_some(), "{stats}");
    }
    assert!(
        server.evicted_total() >= 8,
        "stalled handshakes were not evicted: {}",
        server.evicted_total()
    );
    assert!(server.pending() <= 8);
    // The ones still pending are closed at the head deadline.
    for mut s in attackers {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("a stalled handshake was not closed: {e}"),
            }
        }
    }
}
