//! Socket reads and writes that poll instead of sleeping: on a VM whose
//! idle vCPUs halt, a thread that sleeps in a read (or in a write to a
//! full socket buffer) wakes 30-40 us late, once per wait. The TCP limits
//! of `shardport bench` and of `bench load` move their bytes with these,
//! as the http transport's ends wait for theirs (`kit::poll`): a limit
//! that slept where the product polls would not be the machine's limit.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use shardport_kit::poll::await_bytes;

/// How long a write polls a full socket buffer in all: as long as a
/// blocked read may wait (a reader that stopped reading must not keep the
/// writer spinning).
const WRITE_DEADLINE: Duration = Duration::from_secs(30);

/// Fills `buf` from `s`, polling for up to `spin` before each read for
/// which `poll` says so (a read that would wait then finds the bytes),
/// else reading as usual.
pub fn read(
    s: &mut TcpStream,
    buf: &mut [u8],
    spin: Duration,
    poll: impl Fn() -> bool,
) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        if poll() {
            await_bytes(&*s, spin);
        }
        match s.read(&mut buf[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` to `s` in non-blocking sends (`MSG_DONTWAIT`: a
/// write that fits costs one system call, as a blocking one does); while
/// the socket's buffer is full, yields the core and tries again as long as
/// `poll` says so, and else finishes in a blocking write.
pub fn write(mut s: &TcpStream, buf: &[u8], poll: impl Fn() -> bool) -> std::io::Result<()> {
    use rustix::{io::Errno, net::SendFlags};
    let deadline = Instant::now() + WRITE_DEADLINE;
    let mut sent = 0;
    while sent < buf.len() {
        match rustix::net::send(s, &buf[sent..], SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(Errno::AGAIN) if !poll() => return s.write_all(&buf[sent..]),
            Err(Errno::AGAIN) => {
                if Instant::now() >= deadline {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                std::thread::yield_now();
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
