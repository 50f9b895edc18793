//! A/B and canary experiments: which arm a fetch belongs to, and the
//! guardrail that switches a misbehaving arm off.
//!
//! Assignment is a pure function of (experiment, shard id or fetch number,
//! disabled arms). Per shard it hashes the salt and the shard id (xxh3, stable
//! across processes, machines and versions), so every consumer sends a given
//! shard to the same arm. An arm the guardrail disabled sends its traffic to
//! the control arm (`arms[0]`); the other arms keep their shards.
//!
//! The guardrail keeps, per arm, outcomes in a sliding window of time slots
//! (driven by the node's injected clock, so tests do not sleep) and judges
//! the arm's error rate and its p99 latency relative to the control arm's.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};

use hdrhistogram::Histogram;
use shardport_abi::ShardId;

use crate::config::{Experiment, ExperimentUnit, Guardrail};

/// The arm a fetch was assigned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// Index of the arm whose transport goes first.
    pub arm: usize,
    /// `Some(drawn)` when the drawn arm is disabled and the fetch went to
    /// the control arm instead.
    pub redirected_from: Option<usize>,
}

/// The point in `[0, 2^64)` a fetch draws: per shard from the salt and the
/// id, per fetch from the salt and the fetch's sequence number.
pub fn draw(exp: &Experiment, id: ShardId, fetch_seq: u64) -> u64 {
    // Streaming xxh3 gives the same digest as hashing the concatenation
    // (salt, unit tag, little-endian id or sequence), without allocating.
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(exp.salt.as_bytes());
    match exp.unit {
        ExperimentUnit::Shard => {
            h.update(b"s");
            h.update(&id.as_u128().to_le_bytes());
        }
        ExperimentUnit::Fetch => {
            h.update(b"f");
            h.update(&fetch_seq.to_le_bytes());
        }
    }
    h.digest()
}

/// The arm of a draw: arms own consecutive slices of `[0, total weight)`
/// in config order, and the draw is mapped onto that range without bias
/// worth measuring (128-bit multiply-shift). `disabled` is a bit set of arm
/// indices; a disabled arm's share goes to the control arm.
pub fn assign(exp: &Experiment, point: u64, disabled: u64) -> Assignment {
    let total = exp.total_weight();
    let x = ((u128::from(point) * u128::from(total)) >> 64) as u64;
    let mut acc = 0u64;
    let mut arm = exp.arms.len() - 1;
    for (i, a) in exp.arms.iter().enumerate() {
        acc += u64::from(a.weight);
        if x < acc {
            arm = i;
            break;
        }
    }
    if arm != 0 && disabled & (1 << arm) != 0 {
        Assignment {
            arm: 0,
            redirected_from: Some(arm),
        }
    } else {
        Assignment {
            arm,
            redirected_from: None,
        }
    }
}

/// Number of slots a guardrail window is cut into.
const SLOTS: u64 = 10;

#[derive(Debug, Clone)]
struct Slot {
    /// Index of the slot period (`now / slot_len`) it holds.
    period: u64,
    ok: u64,
    errors: u64,
    latency: Histogram<u64>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid histogram bounds")
}

/// Outcomes of one arm over the window.
#[derive(Debug, Clone, Default)]
pub struct WindowStats {
    /// Successful attempts.
    pub ok: u64,
    /// Failed attempts.
    pub errors: u64,
    /// p99 latency of the successful attempts, ns (0 when none).
    pub p99_ns: u64,
}

impl WindowStats {
    /// Attempts.
    pub fn attempts(&self) -> u64 {
        self.ok + self.errors
    }
}

/// Whether `arm` (not the control) should be disabled, judged on its window
/// and the control arm's; returns the reason. Pure.
pub fn judge(g: &Guardrail, arm: &WindowStats, control: &WindowStats) -> Option<String> {
    if arm.attempts() < g.min_samples {
        return None;
    }
    if let Some(max) = g.max_error_rate {
        let rate = arm.errors as f64 / arm.attempts() as f64;
        if rate > max {
            return Some(format!(
                "error rate {:.1}% ({} of {} attempts) over the last {:?} exceeds max-error-rate {:.1}%",
                rate * 100.0,
                arm.errors,
                arm.attempts(),
                g.window,
                max * 100.0
            ));
        }
    }
    if let Some(max) = g.max_p99_ratio {
        if arm.ok >= g.min_samples && control.ok >= g.min_samples && control.p99_ns > 0 {
            let ratio = arm.p99_ns as f64 / control.p99_ns as f64;
            if ratio > max {
                return Some(format!(
                    "p99 latency {:.1} us is {ratio:.2}x the control arm's {:.1} us over the last {:?}, above max-p99-ratio {max}",
                    arm.p99_ns as f64 / 1e3,
                    control.p99_ns as f64 / 1e3,
                    g.window
                ));
            }
        }
    }
    None
}

/// The live state of one experiment: disabled arms and guardrail windows.
#[derive(Debug)]
pub struct ExperimentState {
    disabled: AtomicU64,
    trips: Vec<AtomicU64>,
    reasons: Mutex<Vec<Option<String>>>,
    windows: Mutex<Vec<Vec<Slot>>>,
    slot_ns: u64,
}

impl ExperimentState {
    /// A fresh state (every arm enabled).
    pub fn new(exp: &Experiment) -> Self {
        let window_ns = exp
            .guardrail
            .as_ref()
            .map_or(1, |g| g.window.as_nanos().min(u128::from(u64::MAX)) as u64);
        ExperimentState {
            disabled: AtomicU64::new(0),
            trips: exp.arms.iter().map(|_| AtomicU64::new(0)).collect(),
            reasons: Mutex::new(vec![None; exp.arms.len()]),
            windows: Mutex::new(vec![Vec::new(); exp.arms.len()]),
            slot_ns: (window_ns / SLOTS).max(1),
        }
    }

    /// Bit set of disabled arms.
    pub fn disabled(&self) -> u64 {
        self.disabled.load(Ordering::Relaxed)
    }

    /// Why `arm` is disabled, if it is.
    pub fn disabled_reason(&self, arm: usize) -> Option<String> {
        self.reasons
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(arm)
            .cloned()
            .flatten()
    }

    /// How many times the guardrail tripped for `arm`.
    pub fn trips(&self, arm: usize) -> u64 {
        self.trips.get(arm).map_or(0, |t| t.load(Ordering::Relaxed))
    }

    /// Records the outcome of an attempt on `arm` at monotonic time `now_ns`
    /// and applies the guardrail. Returns the reason when this outcome made
    /// the guardrail disable the arm (the caller logs it).
    pub fn record(
        &self,
        exp: &Experiment,
        arm: usize,
        ok: bool,
        latency_ns: u64,
        now_ns: u64,
    ) -> Option<String> {
        let g = exp.guardrail.as_ref()?;
        let period = now_ns / self.slot_ns;
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let slots = windows.get_mut(arm)?;
        slots.retain(|s| s.period + SLOTS > period);
        let slot = match slots.iter_mut().position(|s| s.period == period) {
            Some(i) => &mut slots[i],
            None => {
                slots.push(Slot {
                    period,
                    ok: 0,
                    errors: 0,
                    latency: new_histogram(),
                });
                slots.last_mut().expect("just pushed")
            }
        };
        if ok {
            slot.ok += 1;
            let _ = slot.latency.record(latency_ns.max(1));
        } else {
            slot.errors += 1;
        }
        if arm == 0 || self.disabled() & (1 << arm) != 0 {
            return None;
        }
        let stats = |slots: &mut Vec<Slot>| {
            slots.retain(|s| s.period + SLOTS > period);
            let mut h = new_histogram();
            let mut w = WindowStats::default();
            for s in slots.iter() {
                w.ok += s.ok;
                w.errors += s.errors;
                let _ = h.add(&s.latency);
            }
            w.p99_ns = if h.is_empty() {
                0
            } else {
                h.value_at_quantile(0.99)
            };
            w
        };
        let mine = stats(&mut windows[arm]);
        let control = stats(&mut windows[0]);
        let why = judge(g, &mine, &control)?;
        self.disabled.fetch_or(1 << arm, Ordering::Relaxed);
        self.trips[arm].fetch_add(1, Ordering::Relaxed);
        self.reasons.lock().unwrap_or_else(|p| p.into_inner())[arm] = Some(why.clone());
        Some(why)
    }

    /// Re-enables every disabled arm and forgets the windows (an operator
    /// decided the cause is fixed). Returns the arms that were disabled.
    pub fn reset(&self) -> Vec<usize> {
        let was = self.disabled.swap(0, Ordering::Relaxed);
        let mut reasons = self.reasons.lock().unwrap_or_else(|p| p.into_inner());
        reasons.iter_mut().for_each(|r| *r = None);
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .for_each(Vec::clear);
        (0..64).filter(|i| was & (1 << i) != 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::config::{Arm, RouteWhen, TransportName};

    fn exp(unit: ExperimentUnit, weights: &[u32], guardrail: Option<Guardrail>) -> Experiment {
        Experiment {
            name: "e".into(),
            when: RouteWhen::default(),
            unit,
            salt: "salt-1".into(),
            arms: weights
                .iter()
                .enumerate()
                .map(|(i, &w)| Arm {
                    name: format!("arm{i}"),
                    transport: TransportName::new(&format!("t{i}")).unwrap(),
                    weight: w,
                })
                .collect(),
            guardrail,
        }
    }

    fn id(n: u64) -> ShardId {
        ShardId {
            hi: 0x5eed,
            lo: n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        }
    }

    /// Counts arms over `n` shards (fixed ids, so the result is deterministic).
    fn split(e: &Experiment, n: u64, disabled: u64) -> Vec<u64> {
        let mut counts = vec![0u64; e.arms.len()];
        for i in 0..n {
            counts[assign(e, draw(e, id(i), i), disabled).arm] += 1;
        }
        counts
    }

    #[test]
    fn assignment_follows_weights_within_tolerance() {
        // 100_000 draws: the binomial standard deviation of a 10% share is
        // ~95 draws (~0.1 percentage points); 1 point of tolerance is > 10 sigma.
        for unit in [ExperimentUnit::Shard, ExperimentUnit::Fetch] {
            let e = exp(unit, &[90, 10], None);
            let c = split(&e, 100_000, 0);
            let share = c[1] as f64 / 100_000.0;
            assert!((share - 0.10).abs() < 0.01, "{unit}: canary share {share}");
            let e = exp(unit, &[1, 2, 1], None);
            let c = split(&e, 100_000, 0);
            for (i, want) in [0.25, 0.5, 0.25].iter().enumerate() {
                let got = c[i] as f64 / 100_000.0;
                assert!(
                    (got - want).abs() < 0.01,
                    "{unit}: arm {i} share {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn assignment_is_deterministic_and_sticky_per_shard() {
        let e = exp(ExperimentUnit::Shard, &[50, 50], None);
        for i in 0..1000 {
            // The fetch sequence number does not matter per shard.
            let a = assign(&e, draw(&e, id(i), 1), 0);
            let b = assign(&e, draw(&e, id(i), 999_999), 0);
            assert_eq!(a, b, "shard {i} moved between fetches");
        }
        // Same config in another process: the same split.
        let again = exp(ExperimentUnit::Shard, &[50, 50], None);
        assert_eq!(split(&e, 5000, 0), split(&again, 5000, 0));
        // Another salt reshuffles.
        let mut other = e.clone();
        other.salt = "salt-2".into();
        let moved = (0..1000)
            .filter(|&i| {
                assign(&e, draw(&e, id(i), 0), 0).arm
                    != assign(&other, draw(&other, id(i), 0), 0).arm
            })
            .count();
        assert!(moved > 300 && moved < 700, "{moved} of 1000 moved");
    }

    #[test]
    fn draw_is_xxh3_of_salt_unit_and_id() {
        // Pinned so a refactor cannot silently reshuffle every deployment.
        let e = exp(ExperimentUnit::Shard, &[1, 1], None);
        let mut key = b"salt-1s".to_vec();
        key.extend_from_slice(&id(3).as_u128().to_le_bytes());
        assert_eq!(draw(&e, id(3), 77), xxhash_rust::xxh3::xxh3_64(&key));
        let f = exp(ExperimentUnit::Fetch, &[1, 1], None);
        let mut key = b"salt-1f".to_vec();
        key.extend_from_slice(&77u64.to_le_bytes());
        assert_eq!(draw(&f, id(3), 77), xxhash_rust::xxh3::xxh3_64(&key));
    }

    #[test]
    fn per_fetch_unit_varies_for_one_shard() {
        let e = exp(ExperimentUnit::Fetch, &[50, 50], None);
        let arms: std::collections::BTreeSet<usize> = (0..100)
            .map(|seq| assign(&e, draw(&e, id(7), seq), 0).arm)
            .collect();
        assert_eq!(arms.len(), 2, "one shard, many fetches: both arms");
    }

    #[test]
    fn disabled_arm_goes_to_control_and_others_keep_their_shards() {
        let e = exp(ExperimentUnit::Shard, &[50, 25, 25], None);
        for i in 0..2000 {
            let p = draw(&e, id(i), 0);
            let before = assign(&e, p, 0);
            let after = assign(&e, p, 1 << 2);
            match before.arm {
                2 => assert_eq!(
                    after,
                    Assignment {
                        arm: 0,
                        redirected_from: Some(2)
                    }
                ),
                a => assert_eq!(
                    after,
                    Assignment {
                        arm: a,
                        redirected_from: None
                    }
                ),
            }
        }
        // The control arm cannot be disabled.
        let p = (0..)
            .map(|i| draw(&e, id(i), 0))
            .find(|&p| assign(&e, p, 0).arm == 0)
            .unwrap();
        assert_eq!(assign(&e, p, 1).arm, 0);
    }

    proptest! {
        #[test]
        fn assign_always_returns_an_enabled_arm(
            weights in proptest::collection::vec(1u32..1000, 2..16),
            point: u64,
            disabled: u64,
        ) {
            let e = exp(ExperimentUnit::Fetch, &weights, None);
            let a = assign(&e, point, disabled);
            prop_assert!(a.arm < weights.len());
            prop_assert!(a.arm == 0 || disabled & (1 << a.arm) == 0);
        }
    }

    fn guard(max_error_rate: Option<f64>, max_p99_ratio: Option<f64>) -> Guardrail {
        Guardrail {
            max_error_rate,
            max_p99_ratio,
            window: Duration::from_secs(10),
            min_samples: 20,
        }
    }

    #[test]
    fn judge_error_rate_needs_min_samples() {
        let g = guard(Some(0.1), None);
        let none = WindowStats::default();
        let few = WindowStats {
            ok: 10,
            errors: 9,
            p99_ns: 1,
        };
        assert_eq!(judge(&g, &few, &none), None, "below min-samples");
        let bad = WindowStats {
            ok: 17,
            errors: 3,
            p99_ns: 1,
        };
        let why = judge(&g, &bad, &none).expect("15% > 10%");
        assert!(why.contains("15.0%") && why.contains("3 of 20"), "{why}");
        let fine = WindowStats {
            ok: 18,
            errors: 2,
            p99_ns: 1,
        };
        assert_eq!(judge(&g, &fine, &none), None, "10% is not above 10%");
    }

    #[test]
    fn judge_p99_ratio_against_control() {
        let g = guard(None, Some(3.0));
        let control = WindowStats {
            ok: 50,
            errors: 0,
            p99_ns: 10_000,
        };
        let slow = WindowStats {
            ok: 50,
            errors: 0,
            p99_ns: 40_000,
        };
        let ok = WindowStats {
            ok: 50,
            errors: 0,
            p99_ns: 29_000,
        };
        assert!(judge(&g, &slow, &control).unwrap().contains("4.00x"));
        assert_eq!(judge(&g, &ok, &control), None);
        let thin_control = WindowStats {
            ok: 5,
            errors: 0,
            p99_ns: 10,
        };
        assert_eq!(
            judge(&g, &slow, &thin_control),
            None,
            "control below min-samples"
        );
    }

    #[test]
    fn window_trips_on_errors_and_forgets_old_slots() {
        let e = exp(
            ExperimentUnit::Shard,
            &[50, 50],
            Some(guard(Some(0.2), None)),
        );
        let st = ExperimentState::new(&e);
        let s = 1_000_000_000u64; // 1 s; slots are 1 s in a 10 s window
                                  // 19 errors long ago: they leave the window before they count.
        for _ in 0..19 {
            assert_eq!(st.record(&e, 1, false, 0, 0), None);
        }
        for _ in 0..20 {
            assert_eq!(st.record(&e, 1, true, 1000, 11 * s), None);
        }
        assert_eq!(st.disabled(), 0, "old errors aged out");
        // 4 errors on top of 20 successes: 16.7% < 20%; the 6th makes 23%.
        for _ in 0..5 {
            assert_eq!(st.record(&e, 1, false, 0, 12 * s), None);
        }
        let why = st.record(&e, 1, false, 0, 12 * s).expect("trips");
        assert!(why.contains("max-error-rate"), "{why}");
        assert_eq!(st.disabled(), 1 << 1);
        assert_eq!(st.trips(1), 1);
        assert_eq!(st.disabled_reason(1).as_deref(), Some(why.as_str()));
        // Already disabled: no second trip.
        assert_eq!(st.record(&e, 1, false, 0, 12 * s), None);
        assert_eq!(st.trips(1), 1);
        // The control arm is never disabled.
        for _ in 0..100 {
            assert_eq!(st.record(&e, 0, false, 0, 12 * s), None);
        }
        assert_eq!(st.disabled(), 1 << 1);
        assert_eq!(st.reset(), vec![1]);
        assert_eq!(st.disabled(), 0);
        assert_eq!(st.disabled_reason(1), None);
    }

    #[test]
    fn window_trips_on_p99_ratio() {
        let e = exp(
            ExperimentUnit::Shard,
            &[50, 50],
            Some(guard(None, Some(2.0))),
        );
        let st = ExperimentState::new(&e);
        for _ in 0..30 {
            st.record(&e, 0, true, 10_000, 5);
        }
        for _ in 0..19 {
            assert_eq!(st.record(&e, 1, true, 50_000, 5), None);
        }
        let why = st
            .record(&e, 1, true, 50_000, 5)
            .expect("5x the control p99");
        assert!(why.contains("max-p99-ratio"), "{why}");
    }
}
