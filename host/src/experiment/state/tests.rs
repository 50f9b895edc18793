//! Unit tests of the experiment state: phases, ramps, resets, reloads.
use std::time::Duration;

use super::*;
use crate::config::{Arm, ExperimentUnit, Ramp, RouteWhen};
use crate::vocab::TransportName;

const S: u64 = 1_000_000_000;

fn exp(cooldown: Option<Duration>, ramp: Option<Ramp>) -> Experiment {
    Experiment {
        name: "e".into(),
        when: RouteWhen::default(),
        unit: ExperimentUnit::Shard,
        salt: "s".into(),
        arms: ["control", "canary"]
            .iter()
            .map(|n| Arm {
                name: (*n).into(),
                transport: TransportName::new(n).unwrap(),
                weight: 50,
            })
            .collect(),
        guardrail: Some(Guardrail {
            max_error_rate: Some(0.2),
            max_p99_ratio: None,
            window: Duration::from_secs(10),
            min_samples: 20,
            cooldown,
            max_cooldown: Duration::from_secs(100),
            probe_share: 0.1,
        }),
        ramp,
    }
}

/// Records `n` outcomes on `arm` at `t`, returning the events.
fn feed(
    st: &ExperimentState,
    e: &Experiment,
    arm: usize,
    ok: bool,
    n: usize,
    t: u64,
) -> Vec<ArmEvent> {
    (0..n)
        .filter_map(|_| st.record(e, arm, ok, 1000, t))
        .collect()
}

#[test]
fn a_tripped_arm_probes_after_its_cooldown_and_recovers_when_probes_pass() {
    let e = exp(Some(Duration::from_secs(30)), None);
    let st = ExperimentState::new(&e, 0);
    let ev = feed(&st, &e, 1, false, 20, S);
    assert!(
        matches!(ev[..], [ArmEvent::Tripped { arm: 1, cooldown_ns: Some(c), .. }] if c == 30 * S)
    );
    assert_eq!(st.gate(&e).disabled, 0b10);
    // Before the cool-down ends nothing changes.
    assert!(st.tick(&e, 30 * S).is_empty());
    assert_eq!(st.phases()[1].name(), "tripped");
    assert_eq!(st.tick(&e, 31 * S), vec![ArmEvent::Probing { arm: 1 }]);
    let g = st.gate(&e);
    assert_eq!((g.disabled, g.probing), (0, 0b10));
    // 19 good probes are not enough to judge; the 20th re-enables it.
    assert!(feed(&st, &e, 1, true, 19, 32 * S).is_empty());
    assert_eq!(
        feed(&st, &e, 1, true, 1, 32 * S),
        vec![ArmEvent::Recovered { arm: 1 }]
    );
    assert_eq!(st.gate(&e), Gate::default());
    assert_eq!(st.disabled_reason(1), None);
}

#[test]
fn a_failed_probe_trips_again_with_twice_the_cooldown_up_to_the_cap() {
    let e = exp(Some(Duration::from_secs(30)), None);
    let st = ExperimentState::new(&e, 0);
    feed(&st, &e, 1, false, 20, 0);
    let mut t = 0;
    for want in [60, 100, 100] {
        t += 200 * S;
        assert_eq!(st.tick(&e, t), vec![ArmEvent::Probing { arm: 1 }]);
        let ev = feed(&st, &e, 1, false, 20, t);
        assert!(
            matches!(ev[..], [ArmEvent::Tripped { cooldown_ns: Some(c), .. }] if c == want * S),
            "{ev:?}, want a {want} s cool-down"
        );
    }
    // A manual reset still re-enables it at once.
    assert_eq!(st.reset(&e, t).0, vec![1]);
    assert_eq!(st.gate(&e), Gate::default());
}

#[test]
fn cooldown_off_keeps_a_tripped_arm_off_until_reset() {
    let e = exp(None, None);
    let st = ExperimentState::new(&e, 0);
    feed(&st, &e, 1, false, 20, 0);
    assert!(st.tick(&e, u64::MAX - 1).is_empty());
    assert_eq!(st.gate(&e).disabled, 0b10);
}

fn ramp() -> Option<Ramp> {
    Some(Ramp {
        arm: 1,
        steps: vec![0.01, 0.05, 0.25, 0.5],
        interval: Duration::from_secs(60),
    })
}

#[test]
fn a_ramp_advances_one_step_per_interval_to_its_last_step() {
    let e = exp(None, ramp());
    let st = ExperimentState::new(&e, 5 * S);
    assert_eq!(st.gate(&e).ramp, Some((1, 0.01)));
    assert!(st.tick(&e, 64 * S).is_empty(), "interval not over");
    let mut shares = Vec::new();
    for k in 1..=5u64 {
        for ev in st.tick(&e, 5 * S + k * 60 * S) {
            if let ArmEvent::RampStep { share, .. } = ev {
                shares.push(share);
            }
        }
    }
    assert_eq!(shares, vec![0.05, 0.25, 0.5], "stops at the last step");
    assert_eq!(st.gate(&e).ramp, Some((1, 0.5)));
    assert_eq!(st.ramp(), Some((3, false)));
}

#[test]
fn a_ramp_halts_where_its_arm_trips_and_a_reset_resumes_it() {
    let e = exp(None, ramp());
    let st = ExperimentState::new(&e, 0);
    st.tick(&e, 60 * S);
    assert_eq!(st.gate(&e).ramp, Some((1, 0.05)));
    feed(&st, &e, 1, false, 20, 61 * S);
    assert_eq!(st.ramp(), Some((1, true)));
    assert!(st.tick(&e, 1000 * S).is_empty(), "halted: no step");
    assert_eq!(st.gate(&e).ramp, Some((1, 0.05)));
    st.reset(&e, 1000 * S);
    assert_eq!(st.ramp(), Some((1, false)));
    // The step was long due, but a reset earns the arm no traffic: the
    // next step comes one interval after it.
    assert!(st.tick(&e, 1001 * S).is_empty(), "stepped at the reset");
    assert!(st.tick(&e, 1059 * S).is_empty());
    let ev = st.tick(&e, 1060 * S);
    assert_eq!(
        ev,
        vec![ArmEvent::RampStep {
            step: 2,
            share: 0.25
        }]
    );
    // A reset of a ramp that is not halted leaves its clock alone.
    st.reset(&e, 1100 * S);
    assert_eq!(
        st.tick(&e, 1120 * S),
        vec![ArmEvent::RampStep {
            step: 3,
            share: 0.5
        }]
    );
}

#[test]
fn a_reload_carries_trips_and_the_ramp_by_arm_name() {
    let e = exp(None, ramp());
    let st = ExperimentState::new(&e, 0);
    st.tick(&e, 60 * S);
    feed(&st, &e, 1, false, 20, 61 * S);
    assert_eq!(st.ramp(), Some((1, true)));
    // The canary's plugin is replaced (a new build): its trip, its
    // reason and the halted step stay; its window starts afresh.
    let (next, notes) = st.carried(&e, &e, |arm| arm == 1, 70 * S);
    assert_eq!(next.phases()[1].name(), "tripped");
    assert!(next.disabled_reason(1).is_some());
    assert_eq!(next.ramp(), Some((1, true)));
    assert_eq!(next.gate(&e).ramp, Some((1, 0.05)));
    assert!(
        notes.len() == 1 && notes[0].contains("arm canary") && notes[0].contains("tripped"),
        "{notes:?}"
    );
    assert!(next.tick(&e, 10_000 * S).is_empty(), "still halted");
    // 15 errors, below min-samples: the window carries over to the same
    // instance (5 more trip the arm), not to a new one.
    let st = ExperimentState::new(&e, 0);
    assert!(feed(&st, &e, 1, false, 15, S).is_empty());
    let (same, _) = st.carried(&e, &e, |_| false, 2 * S);
    assert_eq!(feed(&same, &e, 1, false, 5, 2 * S).len(), 1);
    let (new_build, _) = st.carried(&e, &e, |arm| arm == 1, 2 * S);
    assert!(feed(&new_build, &e, 1, false, 5, 2 * S).is_empty());
    // A changed ramp restarts at its first step, halted while its arm
    // is off; an unchanged guardrail window keeps the control's samples.
    let mut faster = e.clone();
    faster.ramp.as_mut().unwrap().interval = Duration::from_secs(10);
    let st = ExperimentState::new(&e, 0);
    feed(&st, &e, 1, false, 20, S);
    let (next, notes) = st.carried(&e, &faster, |_| false, 2 * S);
    assert_eq!(next.ramp(), Some((0, true)));
    assert!(
        notes[0].contains("ramp restarts") && notes[0].contains("halted"),
        "{notes:?}"
    );
    // An arm new in the next config starts enabled.
    let mut renamed = e.clone();
    renamed.arms[1].name = "canary-2".into();
    let (next, _) = st.carried(&e, &renamed, |_| false, 2 * S);
    assert_eq!(next.phases()[1].name(), "enabled");
}

#[test]
fn a_reload_carries_a_ramp_by_its_arm_name_not_its_position() {
    let e = exp(None, ramp());
    let st = ExperimentState::new(&e, 0);
    st.tick(&e, 60 * S);
    feed(&st, &e, 1, false, 20, 61 * S);
    // Renamed: another arm, enabled, and its ramp starts afresh, not halted.
    let mut renamed = e.clone();
    renamed.arms[1].name = "canary-2".into();
    let (next, _) = st.carried(&e, &renamed, |_| false, 70 * S);
    assert_eq!(next.ramp(), Some((0, false)));
    assert_eq!(next.phases()[1], ArmPhase::Enabled);
    // Reordered: the same arms, the same ramp by name; the canary is the
    // control now, so it is enabled (the control is never off), and the
    // ramped arm keeps its step.
    let mut three = e.clone();
    three.arms.push(Arm {
        name: "third".into(),
        transport: TransportName::new("third").unwrap(),
        weight: 10,
    });
    three.ramp = Some(Ramp {
        arm: 2,
        ..ramp().unwrap()
    });
    let st = ExperimentState::new(&three, 0);
    st.tick(&three, 60 * S);
    feed(&st, &three, 1, false, 20, 61 * S);
    let mut moved = three.clone();
    moved.arms.swap(1, 2);
    moved.ramp.as_mut().unwrap().arm = 1;
    let (next, notes) = st.carried(&three, &moved, |_| false, 70 * S);
    assert_eq!(next.ramp(), Some((1, false)), "{notes:?}");
    assert_eq!(next.phases()[2].name(), "tripped");
    moved.arms.swap(0, 2);
    moved.ramp.as_mut().unwrap().arm = 1;
    let (next, notes) = st.carried(&three, &moved, |_| false, 70 * S);
    assert_eq!(next.phases()[0], ArmPhase::Enabled);
    assert!(
        notes.iter().any(|n| n.contains("control arm now")),
        "{notes:?}"
    );
}

#[test]
fn a_changed_guardrail_governs_a_carried_trip() {
    let e = exp(None, None);
    let st = ExperimentState::new(&e, 0);
    feed(&st, &e, 1, false, 20, S);
    // A cool-down where there was none: probed after it, from the reload.
    let timed = exp(Some(Duration::from_secs(30)), None);
    let (next, notes) = st.carried(&e, &timed, |_| false, 10 * S);
    assert!(notes[0].contains("stays tripped"), "{notes:?}");
    assert!(next.tick(&timed, 39 * S).is_empty());
    assert_eq!(
        next.tick(&timed, 40 * S),
        vec![ArmEvent::Probing { arm: 1 }]
    );
    // No guardrail any more: nothing could ever re-enable the arm, so the
    // reload does, and says so.
    let mut bare = e.clone();
    bare.guardrail = None;
    let (next, notes) = st.carried(&e, &bare, |_| false, 10 * S);
    assert_eq!(next.gate(&bare).disabled, 0);
    assert!(notes[0].contains("no guardrail"), "{notes:?}");
}

#[test]
fn a_drained_ramp_takes_no_step() {
    let mut e = exp(None, ramp());
    e.arms[1].weight = 0;
    let st = ExperimentState::new(&e, 0);
    for k in 1..=5 {
        assert!(st.tick(&e, k * 60 * S).is_empty(), "stepped while drained");
    }
    // Weighted again: one interval from the last tick before its step.
    e.arms[1].weight = 50;
    assert!(st.tick(&e, 330 * S).is_empty());
    assert_eq!(
        st.tick(&e, 360 * S),
        vec![ArmEvent::RampStep {
            step: 1,
            share: 0.05
        }]
    );
}

#[test]
fn a_retired_state_hands_outcomes_to_its_successor_by_arm_name() {
    let mut e = exp(None, None);
    e.arms.push(Arm {
        name: "third".into(),
        transport: TransportName::new("third").unwrap(),
        weight: 10,
    });
    let old = ExperimentState::new(&e, 0);
    // The next config lists the canary last.
    let mut next_exp = e.clone();
    next_exp.arms.swap(1, 2);
    let (next, _) = old.carried(&e, &next_exp, |_| false, 0);
    let next = Arc::new(next);
    old.retire(&next, &next_exp);
    // A fetch that began under the old config fails after the reload:
    // the trip lands in the new state, named by the old index.
    let events = feed(&old, &e, 1, false, 20, S);
    assert!(
        matches!(events[..], [ArmEvent::Tripped { arm: 1, .. }]),
        "{events:?}"
    );
    assert_eq!(next.phases()[2].name(), "tripped");
    assert_eq!(next.phases()[1], ArmPhase::Enabled);
}
