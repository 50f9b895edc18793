//! Counters and gauges a transport reports through `Transport::stats`.
//!
//! Relaxed atomics: they order nothing, they only count. A transport keeps
//! them in a struct of its own (one field per statistic, each documented),
//! and lists them in `stats()` with [`StatList`], in the order its README
//! documents.

use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    Arc,
};

use shardport_abi::transport::Stat;

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n` (wrapping, as a counter read as a rate does).
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A value that goes up and down (open connections, requests in flight).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Subtracts `n`, saturating at zero (a bug that gives back too much
    /// shows as 0, not as 2^64 - 1).
    pub fn sub(&self, n: u64) {
        let _ = self
            .0
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
    }

    /// Sets the value.
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Holds one unit of a gauge inside shared stats `S` until dropped, so every
/// exit path (an error, a panic, a task dropped mid-way) gives it back.
///
/// ```
/// use std::sync::Arc;
/// use shardport_kit::stats::{Gauge, GaugeHold};
///
/// #[derive(Default)]
/// struct Stats { in_flight: Gauge }
///
/// let stats = Arc::new(Stats::default());
/// let hold = GaugeHold::new(&stats, |s| &s.in_flight);
/// assert_eq!(stats.in_flight.get(), 1);
/// drop(hold);
/// assert_eq!(stats.in_flight.get(), 0);
/// ```
pub struct GaugeHold<S> {
    stats: Arc<S>,
    gauge: fn(&S) -> &Gauge,
}

impl<S> GaugeHold<S> {
    /// Adds one to `gauge(stats)` and holds it.
    pub fn new(stats: &Arc<S>, gauge: fn(&S) -> &Gauge) -> Self {
        gauge(stats).add(1);
        GaugeHold {
            stats: Arc::clone(stats),
            gauge,
        }
    }
}

impl<S> Drop for GaugeHold<S> {
    fn drop(&mut self) {
        (self.gauge)(&self.stats).sub(1);
    }
}

impl<S> std::fmt::Debug for GaugeHold<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GaugeHold")
            .field("value", &(self.gauge)(&self.stats).get())
            .finish()
    }
}

/// Builds the list `Transport::stats` returns, in a fixed order.
#[derive(Debug, Default)]
pub struct StatList(Vec<Stat>);

impl StatList {
    /// An empty list.
    pub fn new() -> Self {
        StatList(Vec::new())
    }

    /// Appends counter `name` with the value of `c`.
    #[must_use]
    pub fn counter(mut self, name: &str, c: &Counter) -> Self {
        self.0.push(Stat::counter(name, c.get()));
        self
    }

    /// Appends gauge `name` with the value of `g`.
    #[must_use]
    pub fn gauge(mut self, name: &str, g: &Gauge) -> Self {
        self.0.push(Stat::gauge(name, g.get()));
        self
    }

    /// Appends a counter computed elsewhere.
    #[must_use]
    pub fn counter_value(mut self, name: &str, value: u64) -> Self {
        self.0.push(Stat::counter(name, value));
        self
    }

    /// Appends a gauge computed elsewhere (a table's length, bytes held).
    #[must_use]
    pub fn gauge_value(mut self, name: &str, value: u64) -> Self {
        self.0.push(Stat::gauge(name, value));
        self
    }

    /// The list.
    pub fn finish(self) -> Vec<Stat> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_abi::transport::StatKind;

    #[test]
    fn counters_gauges_and_holds() {
        #[derive(Default)]
        struct S {
            open: Gauge,
        }
        let c = Counter::default();
        c.inc();
        c.add(41);
        assert_eq!(c.get(), 42);
        let s = Arc::new(S::default());
        let a = GaugeHold::new(&s, |s| &s.open);
        let b = GaugeHold::new(&s, |s| &s.open);
        assert_eq!(s.open.get(), 2);
        drop(a);
        drop(b);
        assert_eq!(s.open.get(), 0);
        s.open.sub(5);
        assert_eq!(s.open.get(), 0, "saturates instead of wrapping");
        s.open.set(7);
        let list = StatList::new()
            .counter("c", &c)
            .gauge("g", &s.open)
            .counter_value("cv", 1)
            .gauge_value("gv", 2)
            .finish();
        let got: Vec<(&str, bool, u64)> = list
            .iter()
            .map(|s| (s.name.as_str(), s.kind == StatKind::COUNTER, s.value))
            .collect();
        assert_eq!(
            got,
            [
                ("c", true, 42),
                ("g", false, 7),
                ("cv", true, 1),
                ("gv", false, 2)
            ]
        );
    }
}
