//! A socket reader bounded by one deadline for a whole message, however
//! its bytes are paced.

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

/// A socket reader that fails with `TimedOut` once its deadline has passed,
/// whatever the pace of the bytes: per-read timeouts alone let a peer that
/// sends one byte a second hold a connection forever.
#[derive(Debug)]
pub struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl DeadlineStream {
    /// Reads from `stream` until `deadline`.
    pub fn new(stream: TcpStream, deadline: Instant) -> DeadlineStream {
        DeadlineStream { stream, deadline }
    }

    /// Moves the deadline (e.g. from the head's to the body's).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// The socket.
    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }
}

/// Writes go straight to the socket, bounded by its write timeout (the
/// deadline bounds reads; TLS writes its handshake through this too).
impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline_passed = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "deadline passed before the message was complete",
            )
        };
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(deadline_passed());
        }
        self.stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        // The socket timeout is the time left, so its expiry is the deadline.
        self.stream.read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => deadline_passed(),
            _ => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn a_trickling_peer_meets_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            // One byte now, then silence until the reader has given up.
            s.write_all(b"G").unwrap();
            let mut buf = [0u8; 1];
            let _ = s.read(&mut buf);
        });
        let (sock, _) = listener.accept().unwrap();
        let mut r = DeadlineStream::new(sock, Instant::now() + Duration::from_millis(200));
        let mut buf = [0u8; 8];
        assert_eq!(r.read(&mut buf).unwrap(), 1);
        let e = r.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        r.set_deadline(Instant::now());
        assert_eq!(
            r.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
        drop(r);
        peer.join().unwrap();
    }
}
