//! A/B and canary experiments: which arm a fetch belongs to, and the
//! guardrail that switches a misbehaving arm off.
//!
//! Assignment is a pure function of (experiment, shard id or fetch number,
//! arm gates). Per shard it hashes the salt and the shard id (xxh3, stable
//! across processes, machines and versions), so every consumer sends a given
//! shard to the same arm, and weighted rendezvous hashing over the arm names
//! makes it monotone: raising an arm's weight or ramp share only moves shards
//! into that arm. An arm the guardrail disabled sends its traffic to the
//! control arm (`arms[0]`); the other arms keep their shards.
//!
//! The guardrail keeps, per arm, outcomes in a sliding window of time slots
//! (driven by the node's injected clock, so tests do not sleep) and judges
//! the arm's error rate and its p99 latency relative to the control arm's.
//! `state` holds each arm's phase (enabled, tripped, probing) and the ramp.

use hdrhistogram::Histogram;
use shardport_abi::ShardId;

use crate::config::{Experiment, ExperimentUnit, Guardrail};

mod state;

pub use state::{same_ramp, ArmEvent, ArmPhase, ExperimentState};

/// The arm a fetch was assigned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// Index of the arm whose transport goes first.
    pub arm: usize,
    /// `Some(drawn)` when the drawn arm is disabled (or probing, and this
    /// draw is not one of its probes) and the fetch went to the control arm.
    pub redirected_from: Option<usize>,
    /// The arm is probing (half-open) and this fetch is one of its probes.
    pub probe: bool,
}

/// The live gates of one experiment's arms, read once per fetch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gate {
    /// Bit set of arms switched off by the guardrail (their draws go to
    /// the control arm).
    pub disabled: u64,
    /// Bit set of arms being probed after a cool-down: a share
    /// (`guardrail.probe-share`) of their draws stays, the rest go to the
    /// control arm.
    pub probing: u64,
    /// `(arm, share)`: a ramp's current step; the arm takes `share` of the
    /// traffic, the other arms split the rest by their weights.
    pub ramp: Option<(usize, f64)>,
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

/// A uniform number in `(0, 1]` from `point` and `key` (53 bits of xxh3).
fn unit_interval(point: u64, key: &[u8]) -> f64 {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(key, point);
    ((h >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// The arm of a draw, by weighted rendezvous hashing: every arm scores the
/// draw with a hash of (draw, arm name), `-ln(u) / weight`, and the lowest
/// score wins. Each arm wins with probability weight / total, and the
/// assignment is monotone: raising one arm's weight (or its ramp share)
/// can only move draws into that arm, never out of it and never between
/// the other arms, so a ramp does not reshuffle what the other arms serve.
/// Scores depend on arm names, not positions, so reordering arms moves
/// nothing. A disabled arm's draws go to the control arm (`arms[0]`); a
/// probing arm keeps a `probe_share` of its draws (another hash of the
/// draw decides which).
pub fn assign(exp: &Experiment, point: u64, gate: &Gate) -> Assignment {
    let mut best = (f64::INFINITY, 0usize);
    for (i, a) in exp.arms.iter().enumerate() {
        let w = exp.draw_weight(i, gate.ramp);
        if w <= 0.0 {
            continue;
        }
        let score = -unit_interval(point, a.name.as_bytes()).ln() / w;
        if score < best.0 {
            best = (score, i);
        }
    }
    let arm = best.1;
    let redirect = Assignment {
        arm: 0,
        redirected_from: Some(arm),
        probe: false,
    };
    if arm == 0 {
        return Assignment {
            arm,
            redirected_from: None,
            probe: false,
        };
    }
    if gate.disabled & (1 << arm) != 0 {
        return redirect;
    }
    if gate.probing & (1 << arm) != 0 {
        let share = exp.guardrail.as_ref().map_or(0.0, |g| g.probe_share);
        return if unit_interval(point, b"\0probe") <= share {
            Assignment {
                arm,
                redirected_from: None,
                probe: true,
            }
        } else {
            redirect
        };
    }
    Assignment {
        arm,
        redirected_from: None,
        probe: false,
    }
}

/// Each arm's expected share of the experiment's traffic under `gate`
/// (what [`assign`] gives on average): weights, or the ramp step and the
/// others by weight; a disabled arm's share, and the part of a probing
/// arm's share that is not probed, count for the control arm.
pub fn shares(exp: &Experiment, gate: &Gate) -> Vec<f64> {
    let mut out = exp.shares_at(gate.ramp);
    for i in 1..out.len() {
        let kept = if gate.disabled & (1 << i) != 0 {
            0.0
        } else if gate.probing & (1 << i) != 0 {
            exp.guardrail.as_ref().map_or(0.0, |g| g.probe_share)
        } else {
            1.0
        };
        let moved = out[i] * (1.0 - kept);
        out[i] -= moved;
        out[0] += moved;
    }
    out
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
    /// A 99% confidence interval of that p99, ns: the order statistics
    /// whose ranks bound the 99th percentile's rank (distribution-free;
    /// with few samples it widens to the largest one).
    pub p99_bounds_ns: (u64, u64),
}

impl WindowStats {
    /// Attempts.
    pub fn attempts(&self) -> u64 {
        self.ok + self.errors
    }

    /// The stats of `ok` successes with latencies `h` and `errors` failures.
    fn of(ok: u64, errors: u64, h: &Histogram<u64>) -> WindowStats {
        let (p99_ns, p99_bounds_ns) = if h.is_empty() {
            (0, (0, 0))
        } else {
            (h.value_at_quantile(0.99), quantile_bounds(h, 0.99))
        };
        WindowStats {
            ok,
            errors,
            p99_ns,
            p99_bounds_ns,
        }
    }
}

/// z of a two-sided 99% normal interval.
const Z_99: f64 = 2.576;

/// A distribution-free 99% confidence interval of the `q` quantile of the
/// samples in `h`: the `n q` rank give or take `z sqrt(n q (1 - q))`
/// (the binomial count of samples below the quantile), as values.
fn quantile_bounds(h: &Histogram<u64>, q: f64) -> (u64, u64) {
    let n = h.len() as f64;
    let half = Z_99 * (n * q * (1.0 - q)).sqrt();
    let lo = (n * q - half).floor().max(1.0);
    let hi = (n * q + half).ceil().min(n);
    (h.value_at_quantile(lo / n), h.value_at_quantile(hi / n))
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
    // Noise must not trip an arm: the ratio that counts is the arm's p99 at
    // the low end of its 99% interval over the control's at the high end.
    // With few samples that compares a low percentile of the arm with the
    // control's largest sample; with many it converges on the p99 ratio.
    if let Some(max) = g.max_p99_ratio {
        let (arm_low, control_high) = (arm.p99_bounds_ns.0, control.p99_bounds_ns.1);
        if arm.ok >= g.min_samples && control.ok >= g.min_samples && control_high > 0 {
            let ratio = arm_low as f64 / control_high as f64;
            if ratio > max {
                return Some(format!(
                    "p99 latency {:.1} us is {:.2}x the control arm's {:.1} us over the last {:?}, and at least {ratio:.2}x at the edges of their 99% confidence intervals (arm >= {:.1} us, control <= {:.1} us; {} and {} samples), above max-p99-ratio {max}",
                    arm.p99_ns as f64 / 1e3,
                    arm.p99_ns as f64 / control.p99_ns.max(1) as f64,
                    control.p99_ns as f64 / 1e3,
                    g.window,
                    arm_low as f64 / 1e3,
                    control_high as f64 / 1e3,
                    arm.ok,
                    control.ok
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::config::{Arm, RouteWhen};
    use crate::vocab::TransportName;

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
            ramp: None,
        }
    }

    fn gate(disabled: u64) -> Gate {
        Gate {
            disabled,
            ..Gate::default()
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
            counts[assign(e, draw(e, id(i), i), &gate(disabled)).arm] += 1;
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
            let a = assign(&e, draw(&e, id(i), 1), &gate(0));
            let b = assign(&e, draw(&e, id(i), 999_999), &gate(0));
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
                assign(&e, draw(&e, id(i), 0), &gate(0)).arm
                    != assign(&other, draw(&other, id(i), 0), &gate(0)).arm
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
            .map(|seq| assign(&e, draw(&e, id(7), seq), &gate(0)).arm)
            .collect();
        assert_eq!(arms.len(), 2, "one shard, many fetches: both arms");
    }

    #[test]
    fn disabled_arm_goes_to_control_and_others_keep_their_shards() {
        let e = exp(ExperimentUnit::Shard, &[50, 25, 25], None);
        for i in 0..2000 {
            let p = draw(&e, id(i), 0);
            let before = assign(&e, p, &gate(0));
            let after = assign(&e, p, &gate(1 << 2));
            match before.arm {
                2 => assert_eq!(
                    after,
                    Assignment {
                        arm: 0,
                        redirected_from: Some(2),
                        probe: false,
                    }
                ),
                a => assert_eq!(
                    after,
                    Assignment {
                        arm: a,
                        redirected_from: None,
                        probe: false,
                    }
                ),
            }
        }
        // The control arm cannot be disabled.
        let p = (0..)
            .map(|i| draw(&e, id(i), 0))
            .find(|&p| assign(&e, p, &gate(0)).arm == 0)
            .unwrap();
        assert_eq!(assign(&e, p, &gate(1)).arm, 0);
    }

    proptest! {
        #[test]
        fn assign_always_returns_an_enabled_arm(
            weights in proptest::collection::vec(1u32..1000, 2..16),
            point: u64,
            disabled: u64,
        ) {
            let e = exp(ExperimentUnit::Fetch, &weights, None);
            let a = assign(&e, point, &gate(disabled));
            prop_assert!(a.arm < weights.len());
            prop_assert!(a.arm == 0 || disabled & (1 << a.arm) == 0);
        }

        /// Raising one arm's weight never moves a shard out of that arm,
        /// nor between two other arms: the shards that move, move into it.
        #[test]
        fn raising_a_weight_only_moves_shards_into_that_arm(
            weights in proptest::collection::vec(1u32..1000, 2..8),
            raised in 0usize..8,
            by in 1u32..5000,
            ids in proptest::collection::vec(any::<u64>(), 200),
        ) {
            let raised = raised % weights.len();
            let before = exp(ExperimentUnit::Shard, &weights, None);
            let mut after = before.clone();
            after.arms[raised].weight += by;
            for &n in &ids {
                let a = assign(&before, draw(&before, id(n), 0), &gate(0)).arm;
                let b = assign(&after, draw(&after, id(n), 0), &gate(0)).arm;
                prop_assert!(a == b || b == raised, "shard {n} moved from arm {a} to {b}, raised {raised}");
            }
        }

        /// The same for a ramp: a later step only moves shards into the
        /// ramped arm.
        #[test]
        fn a_ramp_step_only_moves_shards_into_the_ramped_arm(
            weights in proptest::collection::vec(1u32..1000, 2..8),
            arm in 1usize..8,
            lo in 0.001f64..0.99,
            up in 0.0f64..1.0,
            ids in proptest::collection::vec(any::<u64>(), 200),
        ) {
            let arm = 1 + (arm - 1) % (weights.len() - 1);
            let hi = lo + (1.0 - lo) * up;
            let e = exp(ExperimentUnit::Shard, &weights, None);
            let at = |share: f64| Gate { ramp: Some((arm, share)), ..Gate::default() };
            for &n in &ids {
                let p = draw(&e, id(n), 0);
                let a = assign(&e, p, &at(lo)).arm;
                let b = assign(&e, p, &at(hi)).arm;
                prop_assert!(a == b || b == arm, "shard {n} moved from arm {a} to {b} ({lo} -> {hi})");
            }
        }
    }

    #[test]
    fn weight_zero_drains_an_arm_even_a_ramped_one() {
        let e = exp(ExperimentUnit::Fetch, &[50, 0, 50], None);
        let c = split(&e, 10_000, 0);
        assert_eq!(c[1], 0, "{c:?}");
        assert!((shares(&e, &Gate::default())[1]).abs() < f64::EPSILON);
        let ramped = Gate {
            ramp: Some((1, 0.5)),
            ..Gate::default()
        };
        for i in 0..10_000 {
            assert_ne!(assign(&e, draw(&e, id(i), i), &ramped).arm, 1);
        }
        assert!((shares(&e, &ramped)[1]).abs() < f64::EPSILON);
        // The control may be drained too: the other arms carry it all.
        let e = exp(ExperimentUnit::Fetch, &[0, 1], None);
        assert_eq!(split(&e, 1000, 0), vec![0, 1000]);
    }

    #[test]
    fn a_ramp_step_gives_its_arm_that_share_of_the_traffic() {
        let e = exp(ExperimentUnit::Shard, &[70, 30, 10], None);
        for share in [0.01, 0.05, 0.25, 0.5] {
            let mut counts = [0u64; 3];
            for i in 0..100_000 {
                let g = Gate {
                    ramp: Some((2, share)),
                    ..Gate::default()
                };
                counts[assign(&e, draw(&e, id(i), 0), &g).arm] += 1;
            }
            let got = counts[2] as f64 / 100_000.0;
            assert!(
                (got - share).abs() < 0.01,
                "step {share}: ramped arm got {got}"
            );
            // The others keep their 70:30 ratio of the rest.
            let ratio = counts[0] as f64 / counts[1] as f64;
            assert!(
                (ratio - 70.0 / 30.0).abs() < 0.15,
                "step {share}: 0:1 ratio {ratio}"
            );
        }
        let all = Gate {
            ramp: Some((1, 1.0)),
            ..Gate::default()
        };
        assert!((0..1000).all(|i| assign(&e, draw(&e, id(i), 0), &all).arm == 1));
    }

    fn guard(max_error_rate: Option<f64>, max_p99_ratio: Option<f64>) -> Guardrail {
        Guardrail {
            max_error_rate,
            max_p99_ratio,
            window: Duration::from_secs(10),
            min_samples: 20,
            cooldown: None,
            max_cooldown: Duration::from_secs(3600),
            probe_share: 0.1,
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
            p99_bounds_ns: (1, 1),
        };
        assert_eq!(judge(&g, &few, &none), None, "below min-samples");
        let bad = WindowStats {
            ok: 17,
            errors: 3,
            p99_ns: 1,
            p99_bounds_ns: (1, 1),
        };
        let why = judge(&g, &bad, &none).expect("15% > 10%");
        assert!(why.contains("15.0%") && why.contains("3 of 20"), "{why}");
        let fine = WindowStats {
            ok: 18,
            errors: 2,
            p99_ns: 1,
            p99_bounds_ns: (1, 1),
        };
        assert_eq!(judge(&g, &fine, &none), None, "10% is not above 10%");
    }

    /// Window stats of these latencies (ns), all successes.
    fn stats_of(latencies: &[u64]) -> WindowStats {
        let mut h = new_histogram();
        for &l in latencies {
            h.record(l).unwrap();
        }
        WindowStats::of(latencies.len() as u64, 0, &h)
    }

    #[test]
    fn judge_p99_ratio_against_control() {
        let g = guard(None, Some(3.0));
        let control = stats_of(&[10_000; 50]);
        let slow = stats_of(&[40_000; 50]);
        let ok = stats_of(&[29_000; 50]);
        let why = judge(&g, &slow, &control).unwrap();
        assert!(
            why.contains("4.00x") && why.contains("50 and 50 samples"),
            "{why}"
        );
        assert_eq!(judge(&g, &ok, &control), None);
        let thin_control = stats_of(&[10; 5]);
        assert_eq!(
            judge(&g, &slow, &thin_control),
            None,
            "control below min-samples"
        );
        // One slow outlier in the control's window widens its interval to
        // it: a 4x arm is not shown slower by 50 samples.
        let mut spiky = vec![10_000; 49];
        spiky.push(200_000);
        assert_eq!(judge(&g, &slow, &stats_of(&spiky)), None);
    }

    #[test]
    fn the_p99_interval_bounds_the_rank_of_the_99th_percentile() {
        // 1..=10_000 us: p99 is 9_900 us; the interval's ranks are 9_900
        // give or take 2.576 * sqrt(99) = 25.6 (values within the
        // histogram's 1% precision).
        let all: Vec<u64> = (1..=10_000u64).map(|i| i * 1000).collect();
        let w = stats_of(&all);
        let (lo, hi) = w.p99_bounds_ns;
        assert!(lo < hi && lo <= w.p99_ns && w.p99_ns <= hi, "{w:?}");
        assert!((9_774_000..=9_900_000).contains(&lo), "{lo}");
        assert!((9_900_000..=10_030_000).contains(&hi), "{hi}");
        // 40 samples: from the 37th smallest to the largest.
        let few: Vec<u64> = (1..=40u64).collect();
        assert_eq!(stats_of(&few).p99_bounds_ns, (37, 40));
    }

    /// A deterministic heavy-tailed sample: Pareto with index 1 from 10 us
    /// (a tail far heavier than a transport's).
    fn noisy(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = ((x >> 11) + 1) as f64 / (1u64 << 53) as f64;
                (10_000.0 / u).min(1e12) as u64
            })
            .collect()
    }

    #[test]
    fn a_byte_identical_arm_under_noise_never_trips_and_a_slow_one_does() {
        let g = guard(None, Some(5.0));
        let g = Guardrail {
            min_samples: 100,
            ..g
        };
        // The same heavy-tailed distribution on both arms, 100 samples
        // each, 500 windows: comparing plain p99s trips some of them; the
        // intervals trip none.
        let (mut plain, mut ours) = (0, 0);
        for seed in 0..500 {
            let arm = stats_of(&noisy(seed, 100));
            let control = stats_of(&noisy(seed + 10_000, 100));
            if arm.p99_ns as f64 / control.p99_ns as f64 > 5.0 {
                plain += 1;
            }
            if judge(&g, &arm, &control).is_some() {
                ours += 1;
            }
        }
        assert!(plain > 0, "the noise is not noisy enough to test anything");
        assert_eq!(ours, 0, "{ours} of 500 identical windows tripped");
        // A build 10x slower than a steadier control (10-20 us) is caught
        // with as few samples as min-samples.
        let steady: Vec<u64> = (0..100).map(|i| 10_000 + i * 100).collect();
        let slow: Vec<u64> = steady.iter().map(|l| l * 10).collect();
        assert!(judge(&g, &stats_of(&slow), &stats_of(&steady)).is_some());
    }

    #[test]
    fn window_trips_on_errors_and_forgets_old_slots() {
        let e = exp(
            ExperimentUnit::Shard,
            &[50, 50],
            Some(guard(Some(0.2), None)),
        );
        let st = ExperimentState::new(&e, 0);
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
        let Some(ArmEvent::Tripped {
            arm: 1,
            why,
            cooldown_ns: None,
        }) = st.record(&e, 1, false, 0, 12 * s)
        else {
            panic!("the 6th error trips arm 1 with no cool-down");
        };
        assert!(why.contains("max-error-rate"), "{why}");
        assert_eq!(st.disabled(), 1 << 1);
        assert_eq!(st.disabled_reason(1).as_deref(), Some(why.as_str()));
        // Already disabled: no second trip.
        assert_eq!(st.record(&e, 1, false, 0, 12 * s), None);
        // The control arm is never disabled.
        for _ in 0..100 {
            assert_eq!(st.record(&e, 0, false, 0, 12 * s), None);
        }
        assert_eq!(st.disabled(), 1 << 1);
        assert_eq!(st.reset(&e, 12 * s).0, vec![1]);
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
        let st = ExperimentState::new(&e, 0);
        for _ in 0..30 {
            st.record(&e, 0, true, 10_000, 5);
        }
        for _ in 0..19 {
            assert_eq!(st.record(&e, 1, true, 50_000, 5), None);
        }
        let Some(ArmEvent::Tripped { why, .. }) = st.record(&e, 1, true, 50_000, 5) else {
            panic!("5x the control p99 trips");
        };
        assert!(why.contains("max-p99-ratio"), "{why}");
    }
}
