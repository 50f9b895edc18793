//! Connection budgets that an unauthenticated client cannot exhaust.
//!
//! A connection is *pending* from accept until its request head has arrived
//! and its token checked. Pending connections have their own budget, in
//! total and per peer address, and when a new connection would exceed it
//! the *oldest* pending connection (of the same peer when that peer is over
//! its share, else of anyone) is closed to make room: a client that trickles
//! its head (slow loris) grows old and loses its place, while an operator
//! whose head arrives at once is through before anyone can evict it.
//! Authenticated requests are counted apart (the control endpoint's
//! `MAX_CONNECTIONS`, the http transport's `max-connections`), so pending
//! connections never take an authenticated client's slot. Used by the
//! control endpoint (threads, `TcpStream`) and the http data endpoint
//! (tasks, closed through a notification).

use std::{
    collections::VecDeque,
    net::{IpAddr, Shutdown, TcpStream},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

/// Something that can be closed from another thread to evict it.
pub trait Close: Send {
    /// Ends the connection; its reader sees an error or end of stream.
    fn close(&self);
}

impl Close for TcpStream {
    fn close(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

/// The pending-connection budget.
pub struct Admission<C: Close> {
    state: Mutex<State<C>>,
    max_pending: usize,
    max_per_peer: usize,
    evicted: AtomicU64,
}

struct State<C> {
    next_id: u64,
    /// Oldest first.
    pending: VecDeque<Entry<C>>,
}

struct Entry<C> {
    id: u64,
    peer: IpAddr,
    conn: C,
}

/// A pending connection's place; dropping it (or [`Ticket::admit`]) frees it.
pub struct Ticket<C: Close> {
    admission: Arc<Admission<C>>,
    id: u64,
}

impl<C: Close> Admission<C> {
    /// A budget of `max_pending` pending connections, at most
    /// `max_per_peer` of them from one address (both at least 1).
    pub fn new(max_pending: usize, max_per_peer: usize) -> Arc<Admission<C>> {
        Arc::new(Admission {
            state: Mutex::new(State {
                next_id: 0,
                pending: VecDeque::new(),
            }),
            max_pending: max_pending.max(1),
            max_per_peer: max_per_peer.clamp(1, max_pending.max(1)),
            evicted: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<C>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new pending connection from `peer`, closing the oldest
    /// pending one if the budget is exceeded. `conn` is the handle used to
    /// close it if it is evicted in turn.
    pub fn enter(self: &Arc<Self>, peer: IpAddr, conn: C) -> Ticket<C> {
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.pending.push_back(Entry { id, peer, conn });
        let from_peer = s.pending.iter().filter(|e| e.peer == peer).count();
        let victim = if from_peer > self.max_per_peer {
            s.pending.iter().position(|e| e.peer == peer)
        } else if s.pending.len() > self.max_pending {
            Some(0)
        } else {
            None
        };
        if let Some(entry) = victim.and_then(|i| s.pending.remove(i)) {
            drop(s);
            entry.conn.close();
            self.evicted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: "admission", peer = %entry.peer, "oldest pending connection evicted");
        }
        Ticket {
            admission: Arc::clone(self),
            id,
        }
    }

    /// Pending connections now.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Pending connections closed to make room, since start.
    pub fn evicted_total(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn leave(&self, id: u64) {
        let mut s = self.lock();
        if let Some(i) = s.pending.iter().position(|e| e.id == id) {
            s.pending.remove(i);
        }
    }
}

impl<C: Close> Ticket<C> {
    /// The head arrived and passed authentication: the connection stops
    /// counting as pending.
    pub fn admit(self) {
        // Drop does the bookkeeping.
    }
}

impl<C: Close> Drop for Ticket<C> {
    fn drop(&mut self) {
        self.admission.leave(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Clone, Default)]
    struct Fake(Arc<AtomicBool>);
    impl Close for Fake {
        fn close(&self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    impl Fake {
        fn closed(&self) -> bool {
            self.0.load(Ordering::Relaxed)
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_new_connection_evicts_the_oldest_when_the_budget_is_full() {
        let a = Admission::new(3, 3);
        let conns: Vec<Fake> = (0..3).map(|_| Fake::default()).collect();
        let tickets: Vec<_> = conns
            .iter()
            .enumerate()
            .map(|(i, c)| a.enter(ip(i as u8 + 1), c.clone()))
            .collect();
        assert!(conns.iter().all(|c| !c.closed()));
        let newest = Fake::default();
        let _t = a.enter(ip(9), newest.clone());
        assert!(conns[0].closed(), "the oldest was not evicted");
        assert!(!conns[1].closed() && !conns[2].closed() && !newest.closed());
        assert_eq!(a.pending(), 3);
        assert_eq!(a.evicted_total(), 1);
        drop(tickets);
        assert_eq!(a.pending(), 1);
    }

    #[test]
    fn a_peer_over_its_share_loses_its_own_oldest_not_someone_elses() {
        let a = Admission::new(10, 2);
        let other = Fake::default();
        let _o = a.enter(ip(2), other.clone());
        let mine: Vec<Fake> = (0..3).map(|_| Fake::default()).collect();
        let _t: Vec<_> = mine.iter().map(|c| a.enter(ip(1), c.clone())).collect();
        assert!(mine[0].closed());
        assert!(!mine[1].closed() && !mine[2].closed());
        assert!(!other.closed(), "another peer's connection was evicted");
    }

    #[test]
    fn admitted_connections_no_longer_count_as_pending() {
        let a = Admission::new(2, 2);
        let first = Fake::default();
        a.enter(ip(1), first.clone()).admit();
        let _b = a.enter(ip(1), Fake::default());
        let _c = a.enter(ip(1), Fake::default());
        assert!(!first.closed(), "an admitted connection was evicted");
        assert_eq!(a.pending(), 2);
    }
}
