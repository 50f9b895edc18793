//! Opening a connection to an owner: resolving its address within the
//! connect deadline, connecting, and the TLS handshake.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Client {
    /// Opens a new connection to `pool`'s owner (and completes the TLS
    /// handshake when it serves HTTPS) within `connect-timeout`.
    pub(super) fn connect(&self, pool: &OwnerPool) -> PluginResult<Conn> {
        let addr = pool.addr.as_str();
        let tls = match (pool.tls, &self.tls) {
            (false, _) => None,
            (true, Some(c)) => Some(Arc::clone(c)),
            (true, None) => {
                return Err(AbiError::new(
                    ErrorKind::PERMISSION_DENIED,
                    format!(
                        "owner {addr} serves HTTPS (its descriptor says so), but this \
                         consumer has no `tls-ca` to check its certificate against: set \
                         `tls-ca` in this http transport's config"
                    ),
                ))
            }
        };
        let deadline = Instant::now() + self.connect_timeout;
        let timed_out = || {
            AbiError::new(
                ErrorKind::TIMEOUT,
                format!(
                    "cannot connect to owner {addr} within connect-timeout ({}): the owner \
                     host is down or unreachable",
                    format_duration(self.connect_timeout)
                ),
            )
        };
        let addrs = resolve(addr, self.connect_timeout).map_err(|e| match e {
            None => timed_out(),
            Some(e) => AbiError::unavailable(format!("cannot resolve owner address {addr}: {e}")),
        })?;
        let mut last: Option<io::Error> = None;
        let mut stream = None;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(timed_out()),
                Err(e) => last = Some(e),
            }
        }
        let Some(stream) = stream else {
            let e = last.unwrap_or_else(|| io::Error::other("the name resolved to no address"));
            return Err(connect_failed(addr, &e));
        };
        let setup = stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(self.request_timeout)))
            .and_then(|()| stream.set_write_timeout(Some(self.request_timeout)));
        if let Err(e) = setup {
            return Err(AbiError::io(
                format!("cannot configure the connection to owner {addr}"),
                &e,
            ));
        }
        let stream = match tls {
            None => Stream::Plain(stream),
            Some(config) => Stream::Tls(Box::new(self.handshake(addr, config, stream, deadline)?)),
        };
        self.stats.client_connections_opened.inc();
        debug!(target: "http", owner = %addr, tls = pool.tls, "connected");
        Ok(Conn {
            stream,
            buf: vec![0u8; READ_BUF].into_boxed_slice(),
            pos: 0,
            end: 0,
            req: Vec::new(),
            idle_since: Instant::now(),
            spin: self.spin,
            read_timeout: self.request_timeout,
            _open: Held::new(&self.stats, |s| &s.client_connections_open),
        })
    }

    /// Runs the client side of a TLS handshake on `tcp` until `deadline`
    /// (what is left of `connect-timeout`).
    pub(super) fn handshake(
        &self,
        addr: &str,
        config: Arc<ClientConfig>,
        mut tcp: TcpStream,
        deadline: Instant,
    ) -> PluginResult<StreamOwned<ClientConnection, TcpStream>> {
        let name = tls::server_name(addr).map_err(|why| {
            AbiError::invalid_descriptor(format!("owner address {addr} for TLS: {why}"))
        })?;
        let mut conn = ClientConnection::new(config, name)
            .map_err(|e| AbiError::internal(format!("cannot start TLS with owner {addr}: {e}")))?;
        let timed_out = || {
            AbiError::new(
                ErrorKind::TIMEOUT,
                format!(
                    "TLS handshake with owner {addr} not complete within connect-timeout ({})",
                    format_duration(self.connect_timeout)
                ),
            )
        };
        while conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            let bounded = tcp
                .set_read_timeout(Some(left))
                .and_then(|()| tcp.set_write_timeout(Some(left)));
            if let Err(e) = bounded {
                return Err(AbiError::io(
                    format!("cannot configure the connection to owner {addr}"),
                    &e,
                ));
            }
            match conn.complete_io(&mut tcp) {
                Ok((0, 0)) if conn.is_handshaking() => {
                    return Err(AbiError::unavailable(format!(
                        "owner {addr} closed the connection during the TLS handshake (does it \
                         serve plain HTTP? its descriptor says HTTPS)"
                    )))
                }
                Ok(_) => {}
                Err(e) if is_timeout(&e) => return Err(timed_out()),
                Err(e) if tls::is_tls_error(&e) => return Err(tls::explain(addr, &e)),
                Err(e) => {
                    return Err(AbiError::unavailable(format!(
                        "TLS handshake with owner {addr} failed: {e}"
                    )))
                }
            }
        }
        let restored = tcp
            .set_read_timeout(Some(self.request_timeout))
            .and_then(|()| tcp.set_write_timeout(Some(self.request_timeout)));
        if let Err(e) = restored {
            return Err(AbiError::io(
                format!("cannot configure the connection to owner {addr}"),
                &e,
            ));
        }
        Ok(StreamOwned::new(conn, tcp))
    }
}

/// Resolves `addr` (`host:port`). An IP address needs no lookup; a name is
/// looked up on a helper thread so the wait is bounded by `timeout` (the
/// system resolver has no timeout of its own). `Err(None)`: timed out.
pub(super) fn resolve(addr: &str, timeout: Duration) -> Result<Vec<SocketAddr>, Option<io::Error>> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let (tx, rx) = mpsc::channel();
    let name = addr.to_owned();
    let spawned = std::thread::Builder::new()
        .name("shardport-http-resolve".into())
        .spawn(move || {
            let _ = tx.send(name.to_socket_addrs().map(Iterator::collect));
        });
    match spawned {
        Ok(_) => match rx.recv_timeout(timeout) {
            Ok(r) => r.map_err(Some),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(Some(io::Error::other("the resolver thread failed")))
            }
        },
        // No thread to spare: resolve here, unbounded.
        Err(_) => addr.to_socket_addrs().map(Iterator::collect).map_err(Some),
    }
}

/// A TCP connect failure, with the kind the host acts on.
pub(super) fn connect_failed(addr: &str, e: &io::Error) -> AbiError {
    let kind = match e.kind() {
        io::ErrorKind::TimedOut => ErrorKind::TIMEOUT,
        io::ErrorKind::PermissionDenied => ErrorKind::PERMISSION_DENIED,
        _ => ErrorKind::UNAVAILABLE,
    };
    let hint = match e.kind() {
        io::ErrorKind::ConnectionRefused => {
            "; nothing listens there: the owner exited, or it serves another address"
        }
        _ => "",
    };
    AbiError::new(kind, format!("cannot connect to owner {addr}: {e}{hint}"))
}
