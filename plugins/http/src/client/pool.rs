//! The connections to one owner: a bounded pool of checked-out and idle
//! ones, and the checkout that gives a slot back.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Checked-out connections and idle ones of one owner.
#[derive(Default)]
pub(super) struct PoolState {
    /// Requests holding a slot now (each with its own connection).
    pub(super) busy: usize,
    /// Kept-alive connections, most recently used last.
    pub(super) idle: Vec<Conn>,
    /// Requests waiting for a slot (`freed` is signalled only for them: a
    /// signal is a system call, and every request gives its slot back).
    pub(super) waiting: usize,
}

/// Connections to one owner.
pub(super) struct OwnerPool {
    pub(super) addr: String,
    /// Connect with TLS.
    pub(super) tls: bool,
    pub(super) state: Mutex<PoolState>,
    /// Signalled when a slot is given back.
    pub(super) freed: Condvar,
}

impl OwnerPool {
    pub(super) fn state(&self) -> MutexGuard<'_, PoolState> {
        // Only counter updates and pushes and pops happen under this lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A slot of an owner's pool and, once connected, its connection; gives
/// the slot back on drop, and the connection to the idle list when the
/// exchange left it reusable.
pub(super) struct Checkout {
    pub(super) pool: Arc<OwnerPool>,
    pub(super) conn: Option<Conn>,
    pub(super) reused: bool,
    pub(super) reusable: bool,
    pub(super) idle_timeout: Duration,
}

impl Checkout {
    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a checkout is connected before use")
    }

    pub(super) fn kind(&self) -> &'static str {
        if self.reused {
            "pooled"
        } else {
            "new"
        }
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let keep = self
            .conn
            .take()
            .filter(|c| self.reusable && c.buffered() == 0);
        let now = Instant::now();
        let mut expired = Vec::new();
        let wake = {
            let mut st = self.pool.state();
            if let Some(mut c) = keep {
                c.idle_since = now;
                st.idle.push(c);
            }
            // Forget connections the owner has closed by now (its
            // idle-timeout): closing happens after the lock is released.
            let timeout = self.idle_timeout;
            let mut i = 0;
            while i < st.idle.len() {
                if now.duration_since(st.idle[i].idle_since) >= timeout {
                    expired.push(st.idle.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            st.busy -= 1;
            st.waiting > 0
        };
        if wake {
            self.pool.freed.notify_one();
        }
        drop(expired);
    }
}
