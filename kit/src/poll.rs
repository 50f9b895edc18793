//! Waiting for a socket's bytes without sleeping: a reader that sleeps in
//! the kernel wakes tens of microseconds late on a VM whose idle vCPUs
//! halt (`guest_halt_poll_ns` = 0), more than a small request's whole round
//! trip. [`await_bytes`] polls first, for a bounded time, then lets the
//! read that follows sleep as usual. Used by the http transport's consumer
//! and owner and by `shardport bench`'s TCP limit. A poll pays only while
//! a core is idle: [`core_to_spare`] tells whether one is (on a machine
//! whose cores all have work, a polling thread takes a core from a task
//! that has work, and the poll itself waits for its turn).
//!
//! ```
//! use std::{io::{Read, Write}, net::{TcpListener, TcpStream}, time::Duration};
//! use shardport_kit::poll::await_bytes;
//!
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let mut client = TcpStream::connect(listener.local_addr()?)?;
//! let (mut server, _) = listener.accept()?;
//! server.write_all(b"hi")?;
//! await_bytes(&client, Duration::from_millis(50)); // returns once they are there
//! let mut got = [0u8; 2];
//! client.read_exact(&mut got)?;
//! assert_eq!(&got, b"hi");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::{
    os::fd::AsFd,
    time::{Duration, Instant},
};

/// Whether a thread may poll now without taking a core from another task:
/// the machine's runnable tasks, the caller included, are at most its
/// online cores (read at most once a millisecond; see the `busy` module).
/// `true` where that cannot be read.
pub fn core_to_spare() -> bool {
    crate::busy::load().is_none_or(|(running, online)| running <= online)
}

/// Polls that give up in a row after which a caller stops polling the
/// same stream: its bytes come slower than a poll lasts (a stream paced
/// by a slow link, a peer that pauses between requests), and each poll
/// was a core spent peeking and yielding.
pub const MAX_FRUITLESS_POLLS: u32 = 4;

/// True when `tcp` has nothing to read right now: no bytes, no end of
/// stream, no error (one non-blocking peek, consuming nothing).
pub fn nothing_to_read(tcp: impl AsFd) -> bool {
    let mut probe = [0u8; 1];
    match rustix::net::recv(
        tcp,
        &mut probe[..],
        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
    ) {
        Err(e) => e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR,
        Ok(_) => false,
    }
}

/// Polls `tcp` for up to `spin` until bytes (or its end, or an error)
/// arrive, so that the read which follows finds them instead of sleeping.
/// One non-blocking peek per turn, yielding the core between turns;
/// nothing is consumed. With TLS the peek sees the ciphertext, which is
/// what the read waits for too. A zero `spin` returns at once. Returns
/// `false` when the poll gave up (nothing arrived within `spin`; always
/// for a zero `spin`), `true` when there is something to read: a caller
/// whose polls keep giving up (a stream paced by a slow link, whose bytes
/// come milliseconds apart) can stop polling.
pub fn await_bytes(tcp: impl AsFd, spin: Duration) -> bool {
    if spin.is_zero() {
        return false;
    }
    let until = Instant::now() + spin;
    // Bytes, the end of the stream or an error end the poll: the read sees it.
    loop {
        if !nothing_to_read(&tcp) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpStream,
    };

    use super::*;

    #[test]
    fn polling_consumes_nothing_and_gives_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        assert!(nothing_to_read(&client));
        // Nothing arrives: the poll gives up (the test would hang otherwise).
        assert!(!await_bytes(&client, Duration::from_millis(2)));
        assert!(!await_bytes(&client, Duration::ZERO));
        // Bytes arrive: the poll returns and they are all still there.
        server.write_all(b"response").unwrap();
        assert!(await_bytes(&client, Duration::from_secs(3600)));
        assert!(!nothing_to_read(&client));
        let mut got = [0u8; 8];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"response");
        // The end of the stream ends the poll too, and reads as the end.
        drop(server);
        await_bytes(&client, Duration::from_secs(3600));
        assert_eq!(client.read(&mut got).unwrap(), 0);
    }

    #[test]
    fn no_core_to_spare_while_every_core_has_work() {
        let Some((_, online)) = crate::busy::load() else {
            eprintln!("skipped: /proc/loadavg or the online cpu list cannot be read here");
            return;
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..online + 2)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(20);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until
                    {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        // The reading is the machine's, taken at most once a millisecond:
        // look until it shows the spinners (they run until told to stop).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut spare = true;
        while spare && Instant::now() < deadline {
            spare = core_to_spare();
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        assert!(!spare, "{} spinning threads on {online} cores", online + 2);
    }
}
