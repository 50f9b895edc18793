//! A load point's TCP limit (`shardport bench load`, http points): what
//! this machine's loopback TCP carries from one process to this many
//! consumer processes at once, the shards' sizes, nothing else. The owner
//! worker serves raw TCP (request `tcp_serve`: a thread per connection,
//! an 8-byte length in, that many bytes back out of one warm buffer), and
//! every consumer worker asks for the workload's sizes in a loop for a
//! fixed time (request `tcp_limit`), as the http consumers fetch. Both ends
//! poll (for the other's bytes, and a writer for room in a full socket
//! buffer) instead of sleeping only while a core is idle, as the http
//! transport's ends do (`kit::poll`), and as the bench's TCP limit does
//! (`crate::polled`); nothing else of HTTP, the host or the runtime is in
//! it. Loopback only; every loop is bounded in count and time.

use std::{
    collections::BTreeMap,
    io::Write,
    net::{TcpListener, TcpStream},
    sync::Arc,
    time::{Duration, Instant},
};

use shardport_kit::poll::core_to_spare;

use super::load::{timed_loop, LoopResult, LoopSpec, SIZES};

/// How long an end polls for the other's bytes before it sleeps (where a
/// core is idle): the http owner's default `owner-spin`.
const POLL: Duration = Duration::from_micros(200);

/// How long after the loops' end the server still accepts and serves:
/// room for consumers that start late (a consumer's loop ends with the
/// others' whatever its start).
const GRACE: Duration = Duration::from_secs(10);

/// The most connections one `tcp_serve` accepts.
pub const MAX_CONNECTIONS: usize = 1024;

/// The largest length a request may ask for: the workload's largest shard.
fn max_len() -> usize {
    SIZES.iter().copied().max().unwrap_or(0) as usize
}

/// Starts the raw server for `connections` consumers of a loop of
/// `duration_ms` from `start_unix_ns` (a worker's `tcp_serve` request) and
/// returns its loopback port at once. It accepts at most `connections`
/// connections, serves each on a thread of its own, and stops accepting
/// and serving [`GRACE`] after the loops' end: nothing of it outlives that.
pub fn serve(connections: usize, duration_ms: u64, start_unix_ns: u64) -> Result<u16, String> {
    if connections == 0 || connections > MAX_CONNECTIONS {
        return Err(format!(
            "tcp_serve: connections must be 1..={MAX_CONNECTIONS}, not {connections}"
        ));
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("tcp_serve: bind: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("tcp_serve: {e}"))?
        .port();
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("tcp_serve: {e}"))?;
    let until = Instant::now() + until_end(duration_ms, start_unix_ns) + GRACE;
    let src: Arc<[u8]> = vec![7u8; max_len()].into();
    std::thread::Builder::new()
        .name("tcp-limit-accept".into())
        .spawn(move || {
            let mut accepted = 0;
            while accepted < connections && Instant::now() < until {
                match listener.accept() {
                    Ok((s, _)) => {
                        accepted += 1;
                        let src = Arc::clone(&src);
                        let _ = std::thread::Builder::new()
                            .name("tcp-limit-serve".into())
                            .spawn(move || serve_connection(s, &src, until));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        })
        .map_err(|e| format!("tcp_serve: {e}"))?;
    Ok(port)
}

/// Time from now to the end of a loop of `duration_ms` from `start_unix_ns`.
fn until_end(duration_ms: u64, start_unix_ns: u64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_nanos(start_unix_ns).saturating_sub(now) + Duration::from_millis(duration_ms)
}

/// Answers one consumer's requests until it closes, sends a length beyond
/// the workload's, or `until` passes.
fn serve_connection(mut s: TcpStream, src: &[u8], until: Instant) {
    let _ = s.set_nodelay(true);
    // Once, not per request: a read that waits still ends, at most this
    // long after `until` (the loop checks `until` between requests).
    let _ = s.set_read_timeout(Some(
        until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ));
    let mut req = [0u8; 8];
    while Instant::now() < until {
        if crate::polled::read(&mut s, &mut req, POLL, core_to_spare).is_err() {
            return;
        }
        let len = u64::from_le_bytes(req) as usize;
        if len > src.len() || crate::polled::write(&s, &src[..len], core_to_spare).is_err() {
            return;
        }
    }
}

/// A consumer's loop against the raw server on `port` (a worker's
/// `tcp_limit` request): the shards' sizes in `spec`'s handles, one chosen
/// at random each time as the load loop chooses a shard, each asked for and
/// read whole into a destination of that length; for `spec.duration_ms`
/// from its scheduled start.
pub fn run(port: u16, spec: &LoopSpec) -> Result<LoopResult, String> {
    let mut lens = Vec::with_capacity(spec.handles.len());
    for text in &spec.handles {
        let h = super::decode_handle(text, None)?;
        let len = h.meta.byte_len as usize;
        if len > max_len() {
            return Err(format!(
                "a shard of {len} bytes is beyond the TCP limit's {}",
                max_len()
            ));
        }
        lens.push(len);
    }
    if lens.is_empty() {
        return Err("no handles".into());
    }
    let mut dst: BTreeMap<usize, Vec<u8>> = lens.iter().map(|&l| (l, vec![1u8; l])).collect();
    let mut s =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("tcp_limit: connect: {e}"))?;
    s.set_nodelay(true).map_err(|e| format!("tcp_limit: {e}"))?;
    // A lost or short reply is an error, never a hung point.
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| format!("tcp_limit: {e}"))?;
    let out = timed_loop(spec, |rng, out| {
        let len = lens[rng.below(lens.len() as u64) as usize];
        let buf = dst.get_mut(&len).expect("a destination per length");
        s.write_all(&(len as u64).to_le_bytes())
            .map_err(|e| format!("tcp_limit: request: {e}"))?;
        crate::polled::read(&mut s, buf, POLL, core_to_spare)
            .map_err(|e| format!("tcp_limit: {len} bytes back: {e}"))?;
        out.fetches += 1;
        out.bytes += len as u64;
        Ok(())
    });
    std::hint::black_box(&dst);
    out
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn a_consumer_gets_every_size_it_asks_for_and_the_server_refuses_more() {
        let port = serve(2, 200, 0).unwrap();
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for &len in &SIZES {
            s.write_all(&len.to_le_bytes()).unwrap();
            let mut buf = vec![0u8; len as usize];
            s.read_exact(&mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 7), "{len} bytes");
        }
        // A length beyond the workload's ends the connection.
        s.write_all(&(max_len() as u64 + 1).to_le_bytes()).unwrap();
        let mut b = [0u8; 1];
        assert!(
            matches!(s.read(&mut b), Ok(0)),
            "the connection stayed open"
        );
        assert!(serve(0, 200, 0).is_err());
        assert!(serve(MAX_CONNECTIONS + 1, 200, 0).is_err());
    }
}
