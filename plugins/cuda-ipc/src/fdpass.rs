//! Handing VMM file descriptors from an owner to its consumers: an abstract
//! Unix socket per owner transport instance, descriptors passed with
//! `SCM_RIGHTS`.
//!
//! # Why a socket
//! A VMM allocation is shared as a file descriptor
//! (`cuMemExportToShareableHandle`), and a descriptor is a per-process
//! object: the only general way to give one to another process is a Unix
//! socket (`pidfd_getfd` needs ptrace rights that Yama or a container
//! commonly withholds). The owner serves its exported chunks on the abstract
//! name [`socket_name`] of its board (no file to remove: the name dies with
//! the socket); a consumer asks for one export by lease slot and generation,
//! after it took the lease.
//!
//! # Protocol (little-endian)
//! ```text
//! request   16 bytes: "SPFD", slot u32, slot generation u64
//! reply     16 bytes: "SPFD", status u32 (0 ok, 1 not exported, 2 refused),
//!                     count u32 (chunks), reserved u32
//! then      `count` descriptors, at most FDS_PER_MESSAGE per message, each
//!           message one byte of payload carrying SCM_RIGHTS
//! ```
//!
//! # Who may ask
//! Exactly those who may open the owner's board (mode 0600): the owner
//! refuses a peer whose uid (`SO_PEERCRED`) is not its own, and a consumer
//! accepts descriptors only from the process the descriptor names (the
//! socket's peer pid), so a process that squats a dead owner's name cannot
//! hand out memory of its own. The server handles one connection at a time
//! with a one-second deadline for its whole request: a silent or trickling
//! peer delays others by at most that.

use std::{
    collections::HashMap,
    io::{Read, Write},
    mem::MaybeUninit,
    os::{
        fd::{AsFd, OwnedFd},
        linux::net::SocketAddrExt,
        unix::net::{SocketAddr, UnixListener, UnixStream},
    },
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

use crate::sys::peer_credentials;

const MAGIC: &[u8; 4] = b"SPFD";
/// Descriptors per `sendmsg` (the kernel allows 253).
const FDS_PER_MESSAGE: usize = 64;
const STATUS_OK: u32 = 0;
const STATUS_NOT_EXPORTED: u32 = 1;
const STATUS_REFUSED: u32 = 2;
/// How long the server gives one connection to send its whole request.
const SERVER_READ_DEADLINE: Duration = Duration::from_secs(1);
/// How long a consumer waits for the owner.
const CLIENT_DEADLINE: Duration = Duration::from_secs(5);

/// The abstract socket name of the board `board` (`/shardport-cuda-...`).
pub(crate) fn socket_name(board: &str) -> String {
    format!("{}.fd", board.trim_start_matches('/'))
}

/// One export's chunk descriptors, in address order.
pub(crate) type ChunkFds = Arc<Vec<OwnedFd>>;

/// The owner's exported chunks, by (lease slot, slot generation).
#[derive(Debug, Default)]
pub(crate) struct Shelf {
    map: Mutex<HashMap<(u32, u64), ChunkFds>>,
}

impl Shelf {
    /// Offers an export's descriptors.
    pub(crate) fn put(&self, slot: u32, generation: u64, fds: ChunkFds) {
        shardport_kit::lock(&self.map).insert((slot, generation), fds);
    }

    /// Withdraws an export (consumers that mapped it keep their mappings).
    pub(crate) fn take(&self, slot: u32, generation: u64) {
        shardport_kit::lock(&self.map).remove(&(slot, generation));
    }

    /// Withdraws every export (the transport is going away).
    pub(crate) fn clear(&self) {
        shardport_kit::lock(&self.map).clear();
    }

    fn get(&self, slot: u32, generation: u64) -> Option<ChunkFds> {
        shardport_kit::lock(&self.map)
            .get(&(slot, generation))
            .cloned()
    }
}

/// The owner's server thread; stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct FdServer {
    name: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    shelf: Arc<Shelf>,
}

impl FdServer {
    /// Binds `name` and serves `shelf` on a thread of its own.
    pub(crate) fn start(name: &str, shelf: Arc<Shelf>) -> std::io::Result<FdServer> {
        let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name)?)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            let shelf = Arc::clone(&shelf);
            std::thread::Builder::new()
                .name("cuda-ipc-fds".into())
                .spawn(move || serve(&listener, &shelf, &stop))?
        };
        Ok(FdServer {
            name: name.to_owned(),
            stop,
            thread: Some(thread),
            shelf,
        })
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Nothing is handed out any more: the descriptors close with the
        // last reference, which a thread left running no longer holds.
        self.shelf.clear();
        // Wake the accept: a connection of our own, which the loop sees
        // after the flag, made non-blocking (a full backlog must not hang
        // a drop). Without it the thread is left to end with the process.
        let woke = wake(&self.name).is_ok();
        if let Some(t) = self.thread.take() {
            if woke {
                let _ = t.join();
            } else {
                tracing::warn!(target: "cuda_ipc", socket = %self.name, "could not wake the descriptor server to stop it");
            }
        }
    }
}

/// A non-blocking connection to `name` (the stop signal of its server).
fn wake(name: &str) -> std::io::Result<()> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())?;
    match rustix::net::connect(&fd, &addr) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn serve(listener: &UnixListener, shelf: &Shelf, stop: &AtomicBool) {
    let uid = rustix::process::geteuid();
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok((stream, _)) => {
                if let Err(e) = answer(stream, shelf, uid) {
                    tracing::debug!(target: "cuda_ipc", error = %e, "a descriptor request failed");
                }
            }
            Err(e) => {
                tracing::warn!(target: "cuda_ipc", error = %e, "descriptor server: accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn reply(stream: &mut UnixStream, status: u32, count: u32) -> std::io::Result<()> {
    let mut head = [0u8; 16];
    head[..4].copy_from_slice(MAGIC);
    head[4..8].copy_from_slice(&status.to_le_bytes());
    head[8..12].copy_from_slice(&count.to_le_bytes());
    stream.write_all(&head)
}

/// Fills `buf` within `deadline` of `start` altogether (not per read: a
/// peer trickling a byte at a time is cut off at the deadline).
fn read_by(
    stream: &mut UnixStream,
    buf: &mut [u8],
    start: std::time::Instant,
    deadline: Duration,
) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn answer(mut stream: UnixStream, shelf: &Shelf, uid: rustix::process::Uid) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    let (pid, peer_uid) = peer_credentials(stream.as_fd())?;
    if peer_uid != uid.as_raw() {
        tracing::warn!(target: "cuda_ipc", pid, uid = peer_uid, "refused a descriptor request from another user");
        return reply(&mut stream, STATUS_REFUSED, 0);
    }
    stream.set_write_timeout(Some(CLIENT_DEADLINE))?;
    let mut req = [0u8; 16];
    read_by(&mut stream, &mut req, start, SERVER_READ_DEADLINE)?;
    if &req[..4] != MAGIC {
        return reply(&mut stream, STATUS_REFUSED, 0);
    }
    let slot = u32::from_le_bytes(req[4..8].try_into().expect("4 bytes"));
    let generation = u64::from_le_bytes(req[8..16].try_into().expect("8 bytes"));
    let Some(fds) = shelf.get(slot, generation) else {
        return reply(&mut stream, STATUS_NOT_EXPORTED, 0);
    };
    reply(&mut stream, STATUS_OK, fds.len() as u32)?;
    for batch in fds.chunks(FDS_PER_MESSAGE) {
        let borrowed: Vec<_> = batch.iter().map(AsFd::as_fd).collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
            return Err(std::io::Error::other(
                "descriptor batch does not fit its buffer",
            ));
        }
        sendmsg(
            &stream,
            &[std::io::IoSlice::new(&[0])],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
    }
    Ok(())
}

/// Why a consumer got no descriptors.
#[derive(Debug)]
pub(crate) enum FetchError {
    /// The owner no longer exports it.
    NotExported,
    /// Anything else, described.
    Failed(String),
}

/// Asks the owner `owner_pid` serving `name` for export (slot,
/// generation): exactly `want` descriptors, in chunk order.
pub(crate) fn fetch(
    name: &str,
    owner_pid: u32,
    slot: u32,
    generation: u64,
    want: usize,
) -> Result<Vec<OwnedFd>, FetchError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        FetchError::Failed(format!(
            "the owner's descriptor socket @{name}: {what}: {e}"
        ))
    };
    let addr = SocketAddr::from_abstract_name(name).map_err(|e| fail("bad name", &e))?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(|e| {
        fail(
            "cannot connect (the owner exited, or runs in another network namespace)",
            &e,
        )
    })?;
    let (peer_pid, peer_uid) =
        peer_credentials(stream.as_fd()).map_err(|e| fail("SO_PEERCRED", &e))?;
    if peer_pid == 0 || peer_pid != owner_pid || peer_uid != rustix::process::geteuid().as_raw() {
        return Err(FetchError::Failed(format!(
            "the descriptor socket @{name} is served by pid {peer_pid} (uid {peer_uid}), not by \
             the owner the descriptor names (pid {owner_pid}, our uid): refused"
        )));
    }
    stream
        .set_read_timeout(Some(CLIENT_DEADLINE))
        .and_then(|()| stream.set_write_timeout(Some(CLIENT_DEADLINE)))
        .map_err(|e| fail("deadline", &e))?;
    let mut req = [0u8; 16];
    req[..4].copy_from_slice(MAGIC);
    req[4..8].copy_from_slice(&slot.to_le_bytes());
    req[8..16].copy_from_slice(&generation.to_le_bytes());
    stream.write_all(&req).map_err(|e| fail("request", &e))?;
    let mut head = [0u8; 16];
    stream
        .read_exact(&mut head)
        .map_err(|e| fail("reply", &e))?;
    if &head[..4] != MAGIC {
        return Err(fail("reply", &"not a descriptor server's reply"));
    }
    let status = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    let count = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    match status {
        STATUS_OK => {}
        STATUS_NOT_EXPORTED => return Err(FetchError::NotExported),
        STATUS_REFUSED => return Err(fail("refused", &"the owner refused this process")),
        s => return Err(fail("reply", &format!("unknown status {s}"))),
    }
    if count != want {
        return Err(fail(
            "reply",
            &format!("{count} chunks offered, the descriptor says {want}"),
        ));
    }
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = recvmsg(
            &stream,
            &mut [std::io::IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(|e| fail("receiving descriptors", &e))?;
        let before = fds.len();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if got.flags.contains(ReturnFlags::CTRUNC) {
            return Err(fail(
                "receiving descriptors",
                &"the kernel dropped some (out of file descriptors here?)",
            ));
        }
        if got.bytes == 0 && fds.len() == before {
            return Err(fail(
                "receiving descriptors",
                &format!("the owner closed after {} of {count}", fds.len()),
            ));
        }
    }
    if fds.len() != count {
        return Err(fail(
            "receiving descriptors",
            &format!("{} received, {count} expected", fds.len()),
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn name(tag: &str) -> String {
        socket_name(&format!(
            "/shardport-cuda-test-{}-{tag}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ))
    }

    /// Files standing in for exported chunks (no GPU here): each holds its
    /// index, so the consumer can tell them apart and check their order.
    fn files(n: usize) -> ChunkFds {
        Arc::new(
            (0..n)
                .map(|i| {
                    let fd =
                        rustix::fs::memfd_create("chunk", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
                    rustix::io::write(&fd, format!("chunk {i}").as_bytes()).unwrap();
                    fd
                })
                .collect(),
        )
    }

    fn content(fd: &OwnedFd) -> String {
        let mut buf = [0u8; 32];
        let n = rustix::io::pread(fd, &mut buf, 0).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn passes_every_descriptor_in_order_across_batches() {
        let shelf = Arc::new(Shelf::default());
        let n = FDS_PER_MESSAGE * 2 + 3;
        shelf.put(7, 3, files(n));
        let sock = name("order");
        let _server = FdServer::start(&sock, Arc::clone(&shelf)).unwrap();
        let got = fetch(&sock, std::process::id(), 7, 3, n).unwrap();
        assert_eq!(got.len(), n);
        for (i, fd) in got.iter().enumerate() {
            assert_eq!(content(fd), format!("chunk {i}"));
            // Received close-on-exec, and new descriptors of this process.
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
            assert!(fd.as_raw_fd() >= 0);
        }
    }

    #[test]
    fn refuses_what_is_not_exported_and_a_wrong_count_and_a_wrong_owner() {
        let shelf = Arc::new(Shelf::default());
        shelf.put(1, 1, files(2));
        let sock = name("refuse");
        let _server = FdServer::start(&sock, Arc::clone(&shelf)).unwrap();
        assert!(matches!(
            fetch(&sock, std::process::id(), 1, 2, 2),
            Err(FetchError::NotExported)
        ));
        shelf.take(1, 1);
        assert!(matches!(
            fetch(&sock, std::process::id(), 1, 1, 2),
            Err(FetchError::NotExported)
        ));
        shelf.put(1, 1, files(2));
        match fetch(&sock, std::process::id(), 1, 1, 3) {
            Err(FetchError::Failed(m)) => assert!(m.contains("2 chunks offered"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The descriptor names another owner than the socket's peer.
        match fetch(&sock, std::process::id() + 1, 1, 1, 2) {
            Err(FetchError::Failed(m)) => assert!(m.contains("not by the owner"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_silent_peer_does_not_stop_the_server_and_drop_stops_it() {
        let shelf = Arc::new(Shelf::default());
        shelf.put(2, 9, files(1));
        let sock = name("silent");
        let server = FdServer::start(&sock, Arc::clone(&shelf)).unwrap();
        // Connects and says nothing: the server gives up after its deadline.
        let silent =
            UnixStream::connect_addr(&SocketAddr::from_abstract_name(&sock).unwrap()).unwrap();
        let got = fetch(&sock, std::process::id(), 2, 9, 1).unwrap();
        assert_eq!(content(&got[0]), "chunk 0");
        drop(silent);
        drop(server);
        match fetch(&sock, std::process::id(), 2, 9, 1) {
            Err(FetchError::Failed(m)) => assert!(m.contains("cannot connect"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_server_is_a_clear_error() {
        match fetch(&name("none"), std::process::id(), 0, 1, 1) {
            Err(FetchError::Failed(m)) => {
                assert!(m.contains("cannot connect"), "{m}");
                assert!(m.contains("the owner exited"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
}
