//! Relayed fetches from more than one source at once (`relay-sources` > 1).
//!
//! The owner names a joiner's parent and, besides it, **alternates**: the
//! nearest ancestors above the parent (the owner among them) with a free
//! helping slot. One thread per source:
//!
//! - the parent (source 0) streams the shard from the first piece nobody
//!   holds or was asked for (`GET /v1/relay/{id}/{from}`), as a fetch with
//!   one source does; it stops where the next piece is another source's
//!   and streams again from the next free one;
//! - an alternate waits until a source is **late** (no piece for the lag:
//!   16 times the usual time between two pieces, at least `relay-lag`, at most
//!   half of `relay-stall-timeout`), then asks for a run of at most 4 MiB
//!   (`GET /v1/relay/{id}/{from}-{to}`): the rest of a late alternate's
//!   run, or the pieces a late parent would send next, and so on while the
//!   parent stays late. In a chain every link is busy carrying one copy, so
//!   an alternate that pulled all the time would only slow the member it
//!   already feeds.
//!
//! Every piece is checked against the owner's hash whatever its source; a
//! piece that arrives twice (a late source delivering what another took
//! over) is dropped. The copy a relay serves onward grows only in order:
//! pieces that arrive ahead of a missing one wait (at most a run per
//! source) until it comes. What is held survives a rejoin: a fetch whose
//! parent failed resumes with only the pieces it lacks.
//!
//! A parent that sent pieces in this round and then stays late while the
//! alternates take over [`LATE_RUNS`] runs from it, silent for at least
//! [`REPORT_FACTOR`] times the lag, ends the round: the fetch rejoins and
//! reports it late, and the owner moves it out of the path (demotes it)
//! and names another parent. A relay the owner demoted is asked to rejoin
//! (`POST /v1/relay/{id}`): its round ends at the next piece (or within
//! [`MOVE_CHECK`] while none comes) and it rejoins, keeping what it holds.
//! The parent also reads the pieces of an alternate whose run is late,
//! lowest first: the copy grows in order, and a stopped alternate would
//! otherwise hold it, and this relay's children, up.
//!
//! A failing alternate ends only its own part (its pieces go back to be
//! taken again); the parent failing ends the round, and the fetch rejoins
//! as with one source. When every piece is here, sockets still waiting on
//! a late source are shut down, so no fetch waits for a stalled source
//! once it is complete.

use std::{
    collections::BTreeMap,
    net::{Shutdown, TcpStream},
};

use bytes::Bytes;

use super::relay::{Pieces, Seen, Sink, Source};
#[allow(clippy::wildcard_imports)]
use super::*;
use crate::relay::Holding;

/// Bytes an alternate is asked for at once (a run), at most.
const RUN_BYTES: u64 = 4 << 20;
/// A run is at most this share of the shard, so a small shard has runs to
/// share between sources.
const RUNS_AT_LEAST: u64 = 8;
/// A source is late when no piece came for this many times the usual time
/// between two pieces, and at least `relay-lag`.
const LAG_FACTOR: u32 = 16;
/// Runs the alternates take over from a late parent, with no new piece
/// from it in between, before the fetch reports it late at a rejoin (so
/// one hiccup moves nobody)...
const LATE_RUNS: u32 = 2;
/// ... and it must have sent nothing for this many times the lag (at
/// least a second with the default `relay-lag`).
const REPORT_FACTOR: u32 = 4;
/// How often a round waiting for pieces looks whether its owner asked this
/// relay to rejoin.
const MOVE_CHECK: Duration = Duration::from_millis(50);

/// The pieces one fetch holds, kept across its rejoins.
pub(super) struct Have {
    got: Vec<bool>,
    count: u64,
    /// Every piece before it is held and in the relay copy.
    prefix: u64,
    /// Verified pieces past `prefix`, waiting for the ones before them
    /// (only when the fetch keeps a relay copy).
    ahead: BTreeMap<u64, Bytes>,
    /// Pieces taken from alternates.
    pub(super) from_alternates: u64,
    /// Runs an alternate took over from a late source.
    pub(super) taken_over: u64,
}

impl Have {
    pub(super) fn new(pieces: u64) -> Have {
        Have {
            got: vec![false; pieces as usize],
            count: 0,
            prefix: 0,
            ahead: BTreeMap::new(),
            from_alternates: 0,
            taken_over: 0,
        }
    }

    /// Bytes held from the start without a gap (what a join reports).
    pub(super) fn contiguous(&self, piece: u64, len: u64) -> u64 {
        (self.prefix * piece).min(len)
    }

    /// Takes a verified piece: into the destination, and into the relay
    /// copy in order.
    fn take(
        &mut self,
        k: u64,
        bytes: Bytes,
        dst: &mut dyn Sink,
        piece: u64,
        holding: Option<&Holding>,
    ) -> PluginResult<()> {
        if self.got[k as usize] {
            return Ok(());
        }
        dst.put((k * piece) as usize, &bytes)?;
        self.got[k as usize] = true;
        self.count += 1;
        if k != self.prefix {
            if holding.is_some() {
                self.ahead.insert(k, bytes);
            }
            return Ok(());
        }
        if let Some(h) = holding {
            h.push(bytes);
        }
        self.prefix += 1;
        while self.prefix < self.got.len() as u64 && self.got[self.prefix as usize] {
            if let Some(h) = holding {
                if let Some(b) = self.ahead.remove(&self.prefix) {
                    h.push(b);
                }
            }
            self.prefix += 1;
        }
        Ok(())
    }
}

/// Pieces per run for a shard of `n` pieces of `piece` bytes.
fn run_pieces(n: u64, piece: u64) -> u64 {
    (RUN_BYTES / piece).clamp(1, n.div_ceil(RUNS_AT_LEAST).max(1))
}

/// What one source is doing.
#[derive(Default)]
struct Work {
    /// The next piece it reads. An alternate's run is `at..end` (`end`
    /// moves down to `at` when another source takes the rest over); the
    /// parent streams on from `at` while the pieces are nobody else's.
    at: u64,
    end: u64,
    /// Asking or reading.
    busy: bool,
    /// When it last delivered a piece or started a request.
    since: Option<Instant>,
    /// The socket it reads, to shut down when the fetch no longer needs it.
    socket: Option<TcpStream>,
}

struct State {
    /// Pieces verified by some source (handed to the fetch or on their way).
    got: Vec<bool>,
    /// Pieces in an alternate's run.
    asked: Vec<bool>,
    left: u64,
    /// Source 0 is the parent.
    work: Vec<Work>,
    /// The usual time between two pieces of one source, in nanoseconds
    /// (a moving average), 0 until known.
    interval_ns: u64,
    /// The round ends: every source stops (the parent failed, or every
    /// piece is here).
    stop: bool,
    taken_over: u64,
    /// Runs taken over from the parent since its last new piece.
    parent_runs: u32,
    /// The round ended because the parent stayed late for [`LATE_RUNS`]
    /// runs: it is to be reported.
    parent_late: bool,
    /// The parent sent a new piece in this round. One that never did is
    /// not reported late: it may only hold less than this fetch (a relay
    /// placed below a member behind it); its stall timeout still applies.
    parent_delivered: bool,
}

impl State {
    /// The first piece at or after `from` nobody holds or was asked for.
    fn free_from(&self, from: u64) -> Option<u64> {
        let free = |k: &u64| !self.got[*k as usize] && !self.asked[*k as usize];
        (from..self.got.len() as u64)
            .find(free)
            .or_else(|| (0..from.min(self.got.len() as u64)).find(free))
    }

    /// Whether the parent may read piece `k`: nobody holds it, and nobody
    /// was asked for it or the alternate asked is late (its run stalled: a
    /// stopped alternate would hold up the copy's growth in order, and so
    /// this relay's own children, until its stall timeout). A piece that
    /// then comes twice is dropped.
    fn parent_may_read(&self, k: u64, lag: Duration, now: Instant) -> bool {
        if self.got[k as usize] {
            return false;
        }
        !self.asked[k as usize]
            || self.work[1..].iter().any(|wk| {
                wk.busy && wk.at <= k && k < wk.end && wk.since.is_some_and(|s| now - s > lag)
            })
    }

    /// The first piece at or after `from` (then from the start) the
    /// parent may read.
    fn parent_from(&self, from: u64, lag: Duration) -> Option<u64> {
        let now = Instant::now();
        let n = self.got.len() as u64;
        (from..n)
            .find(|&k| self.parent_may_read(k, lag, now))
            .or_else(|| (0..from.min(n)).find(|&k| self.parent_may_read(k, lag, now)))
    }
}

/// Who fetches what, shared by the sources of one round.
struct Sched {
    st: Mutex<State>,
    changed: Condvar,
    run: u64,
    stall: Duration,
    /// `relay-lag`.
    lag_min: Duration,
}

/// An alternate's run.
struct Run {
    from: u64,
    to: u64,
}

impl Sched {
    fn new(got: Vec<bool>, sources: usize, run: u64, stall: Duration, lag_min: Duration) -> Sched {
        let left = got.iter().filter(|g| !**g).count() as u64;
        Sched {
            st: Mutex::new(State {
                asked: vec![false; got.len()],
                got,
                left,
                work: (0..sources).map(|_| Work::default()).collect(),
                interval_ns: 0,
                stop: false,
                taken_over: 0,
                parent_runs: 0,
                parent_late: false,
                parent_delivered: false,
            }),
            changed: Condvar::new(),
            run,
            stall,
            lag_min,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long a source may deliver nothing before it is late.
    fn lag(&self, st: &State) -> Duration {
        let cap = (self.stall / 2).max(self.lag_min);
        if st.interval_ns == 0 {
            return cap;
        }
        (Duration::from_nanos(st.interval_ns) * LAG_FACTOR).clamp(self.lag_min, cap)
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        // Look again when something changes, or when a source may have
        // become late: a quarter of the lag, and at most every 50 ms (the
        // lag shrinks once the first pieces show the usual gap).
        let wait = (self.lag(&st) / 4).clamp(Duration::from_millis(5), Duration::from_millis(50));
        self.changed
            .wait_timeout(st, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// Where the parent's next stream starts: the first piece nobody
    /// holds or was asked for, waiting until there is one; `None` once the
    /// round ends.
    fn parent_next(&self) -> Option<u64> {
        let mut st = self.state();
        st.work[0].busy = false;
        loop {
            if st.stop || st.left == 0 {
                return None;
            }
            // The lowest piece first: a late alternate's run holds up the
            // copy's growth in order.
            if let Some(from) = st.parent_from(0, self.lag(&st)) {
                let n = st.got.len() as u64;
                let wk = &mut st.work[0];
                wk.at = from;
                wk.end = n;
                wk.busy = true;
                wk.since = Some(Instant::now());
                wk.socket = None;
                return Some(from);
            }
            st = self.wait(st);
        }
    }

    /// The next run for alternate `w`: the rest of a late alternate's run,
    /// or, while the parent is late, the pieces it would read next;
    /// waiting until there is one. `None` once the round ends.
    fn claim(&self, w: usize) -> Option<Run> {
        let mut st = self.state();
        st.work[w].busy = false;
        loop {
            if st.stop || st.left == 0 {
                return None;
            }
            let lag = self.lag(&st);
            let now = Instant::now();
            let late = |wk: &Work| wk.busy && wk.since.is_some_and(|s| now - s > lag);
            let victim = (1..st.work.len())
                .find(|&v| v != w && late(&st.work[v]) && st.work[v].at < st.work[v].end);
            if let Some(v) = victim {
                let (from, to) = (st.work[v].at, st.work[v].end);
                st.work[v].end = from;
                st.taken_over += 1;
                return Some(self.start(&mut st, w, from, to));
            }
            if late(&st.work[0]) {
                let at = st.work[0].at;
                let silent = st.work[0].since.map_or(Duration::ZERO, |s| now - s);
                if st.parent_runs >= LATE_RUNS
                    && st.parent_delivered
                    && silent >= lag * REPORT_FACTOR
                    && st.free_from(at).is_some()
                {
                    // Late run after run: the owner should move it.
                    st.parent_late = true;
                    self.finish_locked(&mut st);
                    drop(st);
                    self.changed.notify_all();
                    return None;
                }
                if let Some(from) = st.free_from(at) {
                    let n = st.got.len() as u64;
                    let mut to = from;
                    while to < n
                        && to - from < self.run
                        && !st.got[to as usize]
                        && !st.asked[to as usize]
                    {
                        to += 1;
                    }
                    st.taken_over += 1;
                    st.parent_runs += 1;
                    return Some(self.start(&mut st, w, from, to));
                }
            }
            st = self.wait(st);
        }
    }

    fn start(&self, st: &mut State, w: usize, from: u64, to: u64) -> Run {
        for a in &mut st.asked[from as usize..to as usize] {
            *a = true;
        }
        let wk = &mut st.work[w];
        wk.at = from;
        wk.end = to;
        wk.busy = true;
        wk.since = Some(Instant::now());
        wk.socket = None;
        Run { from, to }
    }

    /// Source `w` verified piece `k`: whether it is new (the fetch takes
    /// it) and whether `w` reads on (the parent: while the next piece is
    /// nobody else's; an alternate: to the end of its run).
    fn deliver(&self, w: usize, k: u64) -> (bool, bool) {
        let mut st = self.state();
        let new = !st.got[k as usize];
        if new {
            st.got[k as usize] = true;
            st.left -= 1;
            if w == 0 {
                st.parent_runs = 0;
                st.parent_delivered = true;
            }
        }
        let now = Instant::now();
        if let Some(since) = st.work[w].since {
            let dt = (now - since).as_nanos().min(u128::from(u64::MAX)) as u64;
            st.interval_ns = if st.interval_ns == 0 {
                dt
            } else {
                (st.interval_ns * 7 + dt) / 8
            };
        }
        let n = st.got.len() as u64;
        let next_free = k + 1 < n
            && if w == 0 {
                let lag = self.lag(&st);
                // A late alternate's run below this piece: go back for it
                // first (the copy grows in order).
                let behind = st.work[1..].iter().any(|wk| {
                    wk.busy
                        && wk.since.is_some_and(|s| now - s > lag)
                        && (wk.at..wk.end.min(k)).any(|j| !st.got[j as usize])
                });
                !behind && st.parent_may_read(k + 1, lag, now)
            } else {
                !st.got[k as usize + 1] && !st.asked[k as usize + 1]
            };
        let wk = &mut st.work[w];
        wk.since = Some(now);
        wk.at = wk.at.max(k + 1);
        let reads_on = if w == 0 { next_free } else { wk.at < wk.end };
        let go_on = reads_on && !st.stop && st.left > 0;
        let done = st.left == 0;
        if done {
            self.finish_locked(&mut st);
        }
        drop(st);
        // Nobody waits for a piece as such (lateness is a matter of time,
        // looked at on each wait's timeout); only the end wakes them.
        if done {
            self.changed.notify_all();
        }
        (new, go_on)
    }

    /// Remembers the socket source `w` reads, so it can be shut down;
    /// whether the round still needs it.
    fn reading(&self, w: usize, socket: Option<TcpStream>) -> bool {
        let mut st = self.state();
        if st.stop || st.left == 0 {
            return false;
        }
        st.work[w].socket = socket;
        true
    }

    /// Source `w` leaves (failed, or nothing left): what an alternate was
    /// asked for and did not deliver can be taken by others.
    fn leave(&self, w: usize) {
        let mut st = self.state();
        if w != 0 {
            let (at, end) = (st.work[w].at, st.work[w].end);
            for k in at..end {
                if !st.got[k as usize] {
                    st.asked[k as usize] = false;
                }
            }
        }
        let wk = &mut st.work[w];
        wk.end = wk.at;
        wk.busy = false;
        wk.socket = None;
        drop(st);
        self.changed.notify_all();
    }

    /// Ends the round: every source stops, sockets still being read are
    /// shut down.
    fn stop(&self) {
        let mut st = self.state();
        self.finish_locked(&mut st);
        drop(st);
        self.changed.notify_all();
    }

    fn finish_locked(&self, st: &mut State) {
        st.stop = true;
        for wk in &mut st.work {
            if let Some(s) = wk.socket.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    fn stopped(&self) -> bool {
        self.state().stop
    }
}

/// A verified piece on its way to the fetch: its index, bytes, and the
/// source that sent it (0: the parent).
type Delivered = (u64, Bytes, usize);

impl Client {
    /// One round of a relayed fetch from `sources` (the parent first): takes
    /// every piece `have` lacks. `Err`: the parent failed (`seen` says
    /// how), and `have` keeps what arrived.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch_from_sources(
        &self,
        sources: &[Source<'_>],
        desc: &Descriptor,
        have: &mut Have,
        dst: &mut dyn Sink,
        pieces: &Pieces,
        holding: Option<&Holding>,
        (stall, lag): (Duration, Duration),
        seen: &mut Seen,
    ) -> PluginResult<()> {
        let n = pieces.hashes.len() as u64;
        if have.count == n {
            return Ok(());
        }
        let sched = Sched::new(
            have.got.clone(),
            sources.len(),
            run_pieces(n, pieces.size),
            stall,
            lag,
        );
        let (tx, rx) = mpsc::channel::<Delivered>();
        let mut taken: PluginResult<()> = Ok(());
        // The owner demoted this relay: end the round, rejoin.
        let mut moved = false;
        let results: Vec<(PluginResult<()>, Seen)> = std::thread::scope(|s| {
            let workers: Vec<_> = sources
                .iter()
                .enumerate()
                .map(|(w, source)| {
                    let tx = tx.clone();
                    let sched = &sched;
                    s.spawn(move || {
                        let mut seen = Seen::default();
                        let r =
                            self.source_runs(w, source, desc, pieces, stall, sched, &tx, &mut seen);
                        sched.leave(w);
                        if w == 0 && r.is_err() {
                            sched.stop();
                        }
                        (r, seen)
                    })
                })
                .collect();
            drop(tx);
            // Ends when every source has left (the channel's senders are
            // gone), after the pieces they sent. Between pieces it looks
            // whether the owner asked this relay to rejoin (a relay whose
            // own sources are silent is moved all the same).
            loop {
                let (k, bytes, w) = match rx.recv_timeout(MOVE_CHECK) {
                    Ok(d) => d,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if !moved && holding.is_some_and(|h| h.take_rejoin()) {
                            moved = true;
                            sched.stop();
                        }
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                };
                if taken.is_err() {
                    continue;
                }
                if w != 0 {
                    have.from_alternates += 1;
                    self.stats
                        .relay_bytes_from_alternates
                        .add(bytes.len() as u64);
                }
                taken = have.take(k, bytes, dst, pieces.size, holding);
                if taken.is_err() {
                    sched.stop();
                } else if !moved && holding.is_some_and(|h| h.take_rejoin()) {
                    moved = true;
                    sched.stop();
                }
            }
            workers
                .into_iter()
                .map(|j| {
                    j.join().unwrap_or_else(|_| {
                        (
                            Err(AbiError::internal("a relay source thread panicked")),
                            Seen::default(),
                        )
                    })
                })
                .collect()
        });
        let (taken_over, parent_late, parent_runs) = {
            let st = sched.state();
            (st.taken_over, st.parent_late, st.parent_runs)
        };
        have.taken_over += taken_over;
        self.stats.relay_takeovers.add(taken_over);
        taken?;
        let mut results = results.into_iter();
        let (main, main_seen) = results.next().expect("the parent is a source");
        *seen = main_seen;
        for (w, (r, _)) in results.enumerate() {
            if let Err(e) = r {
                debug!(target: "http", shard = %desc.id, alternate = sources[w + 1].addr, error = %e.message, "alternate left");
            }
        }
        if have.count == n {
            return Ok(());
        }
        if moved {
            seen.moved = true;
            return Err(AbiError::unavailable(format!(
                "the owner of shard {} moved this relay: rejoining",
                desc.id
            )));
        }
        if parent_late {
            seen.late = parent_runs;
            return Err(AbiError::unavailable(format!(
                "{} stayed late while alternates took over {parent_runs} runs of shard {}",
                sources[0].addr, desc.id
            )));
        }
        main?;
        Err(AbiError::unavailable(format!(
            "the sources of shard {} stopped with {} of {n} pieces",
            desc.id, have.count
        )))
    }

    /// Source `w`'s part of a round: the parent streams, an alternate
    /// takes runs, until nothing is left for it.
    #[allow(clippy::too_many_arguments)]
    fn source_runs(
        &self,
        w: usize,
        source: &Source<'_>,
        desc: &Descriptor,
        pieces: &Pieces,
        stall: Duration,
        sched: &Sched,
        tx: &mpsc::Sender<Delivered>,
        seen: &mut Seen,
    ) -> PluginResult<()> {
        let pool = self.pool(&Owner {
            addr: source.addr.to_owned(),
            tls: source.tls,
        });
        loop {
            let run = if w == 0 {
                sched.parent_next().map(|from| Run {
                    from,
                    to: pieces.hashes.len() as u64,
                })
            } else {
                sched.claim(w)
            };
            let Some(run) = run else {
                return Ok(());
            };
            if w != 0 {
                debug!(target: "http", shard = %desc.id, source = source.addr, from = run.from, to = run.to, "taking over from a late source");
            }
            match self.fetch_run(w, source, &pool, desc, pieces, stall, sched, tx, &run, seen) {
                Ok(()) => {}
                // Shut down by the round (complete, or the parent failed).
                Err(_) if sched.stopped() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Asks `source` for pieces `run.from..run.to` (the parent: a stream to
    /// the shard's end) and hands each verified one to the fetch, until the
    /// run ends or the next piece is another source's.
    #[allow(clippy::too_many_arguments)]
    fn fetch_run(
        &self,
        w: usize,
        source: &Source<'_>,
        pool: &Arc<OwnerPool>,
        desc: &Descriptor,
        pieces: &Pieces,
        stall: Duration,
        sched: &Sched,
        tx: &mpsc::Sender<Delivered>,
        run: &Run,
        seen: &mut Seen,
    ) -> PluginResult<()> {
        let from = run.from * pieces.size;
        let to = (run.to * pieces.size).min(desc.len);
        let want = to - from;
        let (mut co, head, timeout) =
            self.ask_source(pool, source, desc, (from, to), stall, seen)?;
        if !sched.reading(w, co.conn().stream.tcp().try_clone().ok()) {
            co.reusable = false;
            return Ok(());
        }
        let mut body = Body::new(co.conn(), &pool.addr, timeout, want);
        let mut complete = false;
        for k in run.from..run.to {
            let start = k * pieces.size;
            let n = pieces.size.min(desc.len - start) as usize;
            if !source.owner {
                body.deadline = Some(Instant::now() + stall);
            }
            let mut buf = vec![0u8; n];
            body.read_exact(&mut buf, What::Shard(desc.id))?;
            self.check_piece(source, desc, pieces, k as usize, &buf)?;
            self.stats.relay_bytes_received.add(n as u64);
            if !source.owner {
                self.stats.relay_bytes_from_holders.add(n as u64);
            }
            let (new, go_on) = sched.deliver(w, k);
            if new && tx.send((k, Bytes::from(buf), w)).is_err() {
                break;
            }
            if k + 1 == run.to {
                complete = true;
            } else if !go_on {
                break;
            }
        }
        co.reusable = complete && body.complete() && !head.close;
        Ok(())
    }
}
