//! One connection to an owner: its byte stream (plain or TLS), its read
//! buffer, and the reading of one response body.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A connection's byte stream: plain TCP, or TLS over TCP.
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// The socket underneath (for peeks and timeouts).
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One open connection to an owner.
pub(super) struct Conn {
    pub(super) stream: Stream,
    /// Bytes received but not consumed yet are `buf[pos..end]`.
    pub(super) buf: Box<[u8]>,
    pub(super) pos: usize,
    pub(super) end: usize,
    /// Scratch for the request being written.
    pub(super) req: Vec<u8>,
    /// When it was last returned to its pool.
    pub(super) idle_since: Instant,
    /// How long a read that would wait polls first (`spin`).
    pub(super) spin: Duration,
    /// The socket's read timeout now.
    pub(super) read_timeout: Duration,
    /// Holds one unit of `client_connections_open`.
    pub(super) _open: Held,
}

impl Conn {
    pub(super) fn buffered(&self) -> usize {
        self.end - self.pos
    }

    /// Copies buffered bytes into `dst`; returns how many.
    pub(super) fn take_buffered(&mut self, dst: &mut [u8]) -> usize {
        let n = self.buffered().min(dst.len());
        dst[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        n
    }

    /// Discards up to `n` buffered bytes; returns how many.
    pub(super) fn drop_buffered(&mut self, n: u64) -> usize {
        let k = (self.buffered() as u64).min(n) as usize;
        self.pos += k;
        k
    }

    /// Reads at most `max` bytes into the (empty) buffer.
    pub(super) fn fill(&mut self, max: usize) -> io::Result<usize> {
        debug_assert_eq!(self.buffered(), 0);
        self.pos = 0;
        self.end = 0;
        let want = max.min(self.buf.len());
        let n = read_retrying(&mut self.stream, &mut self.buf[..want])?;
        self.end = n;
        Ok(n)
    }

    /// Polls before a body read that would wait, like before the head:
    /// the body of a large response arrives in pieces, and a consumer that
    /// sleeps between them wakes late for each. Plain TCP only: a TLS
    /// stream may hold decrypted bytes the socket no longer shows. And only
    /// while a core is idle ([`core_to_spare`]). `None` when it did not
    /// poll, else whether bytes came (`false`: the poll gave up; see
    /// [`Body::read_exact`]).
    pub(super) fn await_body_bytes(&self) -> Option<bool> {
        (matches!(self.stream, Stream::Plain(_)) && core_to_spare())
            .then(|| await_bytes(self.stream.tcp(), self.spin))
    }

    /// Whether a pooled connection can carry a request: the owner has not
    /// closed it and sent nothing unasked (one non-blocking peek).
    pub(super) fn looks_alive(&self) -> bool {
        if self.buffered() != 0 {
            return false;
        }
        // Closed, or bytes nobody asked for, read as "something". With TLS,
        // an owner closing the connection sends close_notify first: bytes
        // to peek at, so the same test holds. (A close_notify that rustls
        // read together with the last response bytes shows up as an end of
        // stream on the next request, which is retried.)
        nothing_to_read(self.stream.tcp())
    }
}

pub(super) fn read_retrying(s: &mut Stream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// What a body read is receiving, for messages.
#[derive(Debug, Clone, Copy)]
pub(super) enum What {
    Shard(ShardId),
    BatchHead,
    ErrorBody,
    JoinReply,
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::Shard(id) => write!(f, "shard {id}"),
            What::BatchHead => f.write_str("the batch header table"),
            What::ErrorBody => f.write_str("an error body"),
            What::JoinReply => f.write_str("a relay join reply"),
        }
    }
}

/// Reads the body of one response (`content-length` bytes) from its
/// connection: buffered bytes first, then straight into destinations.
pub(super) struct Body<'c> {
    pub(super) conn: &'c mut Conn,
    pub(super) addr: &'c str,
    pub(super) timeout: Duration,
    /// Body bytes not handed out yet (buffered ones included).
    pub(super) unread: u64,
    /// Body bytes handed out so far.
    pub(super) received: u64,
    /// The announced length.
    pub(super) total: u64,
    /// A read that completes after this fails (a peer that trickles bytes
    /// never trips the socket's per-read timeout): set per piece for
    /// relays.
    pub(super) deadline: Option<Instant>,
    /// Polls before the reads of this body that gave up in a row. After
    /// [`MAX_FRUITLESS_POLLS`] the body's reads stop polling: its bytes
    /// come slower than a poll lasts (a relay's stream, paced by a link of
    /// a few hundred Mbit/s), and each poll was a `spin` of a core spent
    /// peeking and yielding. Reset when a poll finds bytes.
    fruitless_polls: u32,
}

impl<'c> Body<'c> {
    pub(super) fn new(conn: &'c mut Conn, addr: &'c str, timeout: Duration, total: u64) -> Self {
        Body {
            conn,
            addr,
            timeout,
            unread: total,
            received: 0,
            total,
            deadline: None,
            fruitless_polls: 0,
        }
    }

    pub(super) fn failed(&self, e: &io::Error, what: What) -> AbiError {
        if is_timeout(e) {
            AbiError::new(
                ErrorKind::TIMEOUT,
                format!(
                    "owner {} sent nothing for request-timeout ({}) while sending {what} \
                     ({} bytes of the response received)",
                    self.addr,
                    format_duration(self.timeout),
                    self.received
                ),
            )
        } else {
            AbiError::unavailable(format!(
                "connection to owner {} failed while receiving {what} ({} bytes of the \
                 response received): {e}",
                self.addr, self.received
            ))
        }
    }

    pub(super) fn ended(&self, what: What) -> AbiError {
        AbiError::unavailable(format!(
            "connection to owner {} closed while receiving {what}: the owner ended the \
             response after {} of {} bytes ({} bytes of the response received)",
            self.addr, self.received, self.total, self.received
        ))
    }

    /// Fills `dst` exactly: buffered bytes first, then reads straight into
    /// `dst` (through the buffer only for pieces smaller than it).
    pub(super) fn read_exact(&mut self, dst: &mut [u8], what: What) -> PluginResult<()> {
        if dst.len() as u64 > self.unread {
            return Err(AbiError::internal(format!(
                "reading {what} past the end of the response of owner {}",
                self.addr
            )));
        }
        let mut filled = self.conn.take_buffered(dst);
        self.count(filled);
        while filled < dst.len() {
            let rest = dst.len() - filled;
            if self.fruitless_polls < MAX_FRUITLESS_POLLS {
                match self.conn.await_body_bytes() {
                    Some(true) => self.fruitless_polls = 0,
                    Some(false) => self.fruitless_polls += 1,
                    None => {}
                }
            }
            let r = if rest >= self.conn.buf.len() {
                read_retrying(&mut self.conn.stream, &mut dst[filled..])
            } else {
                // Read ahead within this body only: the next piece is likely
                // small too.
                let max = self.unread.min(READ_BUF as u64) as usize;
                self.conn.fill(max).map(|n| {
                    if n == 0 {
                        0
                    } else {
                        self.conn.take_buffered(&mut dst[filled..])
                    }
                })
            };
            match r {
                Ok(0) => return Err(self.ended(what)),
                Ok(n) => {
                    filled += n;
                    self.count(n);
                }
                Err(e) => return Err(self.failed(&e, what)),
            }
            if filled < dst.len() && self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(AbiError::new(
                    ErrorKind::TIMEOUT,
                    format!(
                        "{} sent {what} too slowly: {filled} of {} bytes within its deadline",
                        self.addr,
                        dst.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn count(&mut self, n: usize) {
        self.unread -= n as u64;
        self.received += n as u64;
    }

    /// Discards `n` bytes of the body.
    pub(super) fn skip(&mut self, mut n: u64, what: What) -> PluginResult<()> {
        while n > 0 {
            let k = self.conn.drop_buffered(n);
            self.count(k);
            n -= k as u64;
            if n == 0 {
                break;
            }
            let max = self.unread.min(READ_BUF as u64) as usize;
            match self.conn.fill(max) {
                Ok(0) => return Err(self.ended(what)),
                Ok(_) => {}
                Err(e) => return Err(self.failed(&e, what)),
            }
        }
        Ok(())
    }

    /// The whole body was read and nothing beyond it arrived: the
    /// connection may carry the next request.
    pub(super) fn complete(&self) -> bool {
        self.unread == 0 && self.conn.buffered() == 0
    }
}
