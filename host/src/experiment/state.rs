//! The live state of one experiment: each arm's phase (enabled, tripped,
//! probing), its guardrail window, and the ramp's step.
//!
//! # Arm phases
//! An enabled arm whose window breaks the guardrail is *tripped*: its draws
//! go to the control arm. After the cool-down it is *probing* (half-open):
//! a small share of its draws (`probe-share`) come back to it, judged in a
//! fresh window; once `min-samples` probes are in, it is enabled again if
//! the guardrail holds, or tripped again with twice the cool-down (up to
//! `max-cooldown`). `cooldown = "off"` keeps a tripped arm off until a
//! manual reset, which re-enables every arm at once.
//!
//! # Ramps
//! A ramp raises one arm's share step by step: it moves to the next step
//! after `interval` at the current one if the arm did not trip meanwhile;
//! a trip halts the ramp where it is. A reset resumes it, and its next
//! step comes one whole `interval` after the reset: a build that just
//! tripped gets no more traffic than before until it has earned it.
//!
//! # Reloads
//! A reload carries the state over by arm name ([`ExperimentState::carried`]):
//! phases (a trip stays a trip), reasons and the ramp's step stay; only a
//! new transport instance behind an arm, or a new guardrail window, starts
//! that arm's window afresh, and only a changed ramp restarts the ramp.
//!
//! Time is the node's monotonic clock, read by the caller: nothing here
//! sleeps or spawns. The fast path ([`ExperimentState::gate`]) reads atomics
//! and takes the lock only when a cool-down or a ramp interval has ended.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex, MutexGuard, OnceLock, Weak,
};

use super::{judge, new_histogram, Gate, Slot, WindowStats, SLOTS};
use crate::config::{Experiment, Guardrail};

/// What an arm is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmPhase {
    /// Serving its draws.
    Enabled,
    /// Switched off by the guardrail until `until_ns` (or a reset when
    /// `until_ns` is `u64::MAX`).
    Tripped {
        /// Monotonic time the cool-down ends.
        until_ns: u64,
        /// The cool-down that was applied.
        cooldown_ns: u64,
    },
    /// Serving a probe share of its draws, which are being judged.
    Probing {
        /// The cool-down of the trip before (doubled on a failed probe).
        cooldown_ns: u64,
    },
}

impl ArmPhase {
    /// `enabled`, `tripped` or `probing` (the metric label).
    pub fn name(&self) -> &'static str {
        match self {
            ArmPhase::Enabled => "enabled",
            ArmPhase::Tripped { .. } => "tripped",
            ArmPhase::Probing { .. } => "probing",
        }
    }
}

/// Something that changed an experiment's traffic, for logs, metrics and
/// the `ab report` timeline.
#[derive(Debug, Clone, PartialEq)]
pub enum ArmEvent {
    /// The guardrail switched the arm off.
    Tripped {
        /// Arm index.
        arm: usize,
        /// The guardrail's finding.
        why: String,
        /// Cool-down before probing (`None`: until reset).
        cooldown_ns: Option<u64>,
    },
    /// The cool-down ended; the arm is probing.
    Probing {
        /// Arm index.
        arm: usize,
    },
    /// The probes passed; the arm serves its whole share again.
    Recovered {
        /// Arm index.
        arm: usize,
    },
    /// The ramp moved to its next step.
    RampStep {
        /// Step index.
        step: usize,
        /// The ramped arm's share now.
        share: f64,
    },
    /// The ramp stopped because its arm tripped.
    RampHalted {
        /// Step index it stays at.
        step: usize,
    },
}

impl ArmEvent {
    /// The same event, naming arm `arm` (an arm's index under another
    /// generation of the config).
    fn for_arm(self, arm: usize) -> ArmEvent {
        match self {
            ArmEvent::Tripped {
                why, cooldown_ns, ..
            } => ArmEvent::Tripped {
                arm,
                why,
                cooldown_ns,
            },
            ArmEvent::Probing { .. } => ArmEvent::Probing { arm },
            ArmEvent::Recovered { .. } => ArmEvent::Recovered { arm },
            other => other,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct RampState {
    step: usize,
    since_ns: u64,
    halted: bool,
}

#[derive(Debug)]
struct Book {
    phases: Vec<ArmPhase>,
    reasons: Vec<Option<String>>,
    windows: Vec<Vec<Slot>>,
    ramp: Option<RampState>,
}

/// The live state of one experiment.
#[derive(Debug)]
pub struct ExperimentState {
    /// Bit sets mirrored from `book` for the lock-free fast path.
    disabled: AtomicU64,
    probing: AtomicU64,
    /// Ramp step + 1 (0: no ramp).
    ramp_step: AtomicU64,
    /// Earliest monotonic time at which [`tick`](Self::tick) has work.
    next_event_ns: AtomicU64,
    book: Mutex<Book>,
    slot_ns: u64,
    /// Set when a reload carried this state to another (see [`Self::retire`]).
    successor: OnceLock<(Weak<ExperimentState>, Box<Experiment>)>,
}

fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl ExperimentState {
    /// A fresh state at monotonic time `now_ns` (every arm enabled, the
    /// ramp at its first step).
    pub fn new(exp: &Experiment, now_ns: u64) -> Self {
        let window_ns = exp.guardrail.as_ref().map_or(1, |g| nanos(g.window));
        let ramp = exp.ramp.as_ref().map(|_| RampState {
            step: 0,
            since_ns: now_ns,
            halted: false,
        });
        let st = ExperimentState {
            disabled: AtomicU64::new(0),
            probing: AtomicU64::new(0),
            ramp_step: AtomicU64::new(u64::from(ramp.is_some())),
            next_event_ns: AtomicU64::new(u64::MAX),
            book: Mutex::new(Book {
                phases: vec![ArmPhase::Enabled; exp.arms.len()],
                reasons: vec![None; exp.arms.len()],
                windows: vec![Vec::new(); exp.arms.len()],
                ramp,
            }),
            slot_ns: (window_ns / SLOTS).max(1),
            successor: OnceLock::new(),
        };
        st.publish(exp, &st.lock());
        st
    }

    /// True when this state can carry on under `next` (a reload) as it is:
    /// same arm names in the same order, same guardrail window and the
    /// same ramp ([`same_ramp`]).
    pub fn fits(&self, old: &Experiment, next: &Experiment) -> bool {
        let names = |e: &Experiment| e.arms.iter().map(|a| a.name.clone()).collect::<Vec<_>>();
        names(old) == names(next)
            && old.guardrail.as_ref().map(|g| g.window) == next.guardrail.as_ref().map(|g| g.window)
            && same_ramp(old, next)
    }

    /// The state of `next` after a reload, carried over from `self` (the
    /// state of `old`) by arm name: each arm keeps its phase and reason (a
    /// tripped arm stays tripped until a reset or its cool-down; a changed
    /// cool-down applies from now), and its guardrail window unless
    /// `renewed(arm)` (a new transport instance serves it: its samples were
    /// another build's) or the window's length changed. The control arm,
    /// and every arm of an experiment left without a guardrail, is
    /// enabled. An unchanged ramp (same arm name, steps and interval)
    /// keeps its step, halt and clock; another one starts at its first
    /// step, halted if its arm is not enabled. Arms new in `next` start
    /// enabled. Returns the state and one line per arm or ramp whose state
    /// a reader of the reload should know about.
    pub fn carried(
        &self,
        old: &Experiment,
        next: &Experiment,
        renewed: impl Fn(usize) -> bool,
        now_ns: u64,
    ) -> (ExperimentState, Vec<String>) {
        let st = ExperimentState::new(next, now_ns);
        let mut notes = Vec::new();
        let same_window =
            old.guardrail.as_ref().map(|g| g.window) == next.guardrail.as_ref().map(|g| g.window);
        {
            let was = self.lock();
            let mut book = st.lock();
            for (j, arm) in next.arms.iter().enumerate() {
                let Some(i) = old.arms.iter().position(|a| a.name == arm.name) else {
                    continue;
                };
                let (phase, note) = carried_phase(was.phases[i], old, next, j, now_ns);
                if let Some(n) = note {
                    notes.push(format!("experiment {}: arm {}: {n}", next.name, arm.name));
                }
                book.phases[j] = phase;
                if phase != ArmPhase::Enabled {
                    book.reasons[j].clone_from(&was.reasons[i]);
                }
                if same_window && !renewed(j) {
                    book.windows[j].clone_from(&was.windows[i]);
                }
                if renewed(j) {
                    notes.push(format!(
                        "experiment {}: arm {} is served by a new instance of {}: its guardrail window starts afresh, its state stays {}{}",
                        next.name,
                        arm.name,
                        arm.transport,
                        phase.name(),
                        if phase == ArmPhase::Enabled {
                            ""
                        } else {
                            " (`shardport ab reset` re-enables it)"
                        }
                    ));
                }
            }
            if let Some(b) = &next.ramp {
                match was.ramp {
                    Some(r) if same_ramp(old, next) => book.ramp = Some(r),
                    _ => {
                        let arm_off = book.phases[b.arm] != ArmPhase::Enabled;
                        if let Some(r) = book.ramp.as_mut() {
                            r.halted = arm_off;
                        }
                        if arm_off {
                            notes.push(format!(
                                "experiment {}: ramp {} at its first step ({:.1}%), halted: its arm {} is not enabled",
                                next.name,
                                if old.ramp.is_some() { "restarts" } else { "starts" },
                                b.steps[0] * 100.0,
                                next.arms[b.arm].name
                            ));
                        }
                    }
                }
            }
            st.publish(next, &book);
        }
        (st, notes)
    }

    /// Hands this state over to `next` (the state of `next_exp` that a
    /// reload carried it to): outcomes recorded here from now on, by
    /// fetches that began under the old config, are recorded there by arm
    /// name, so a trip in flight across a reload is not lost.
    pub fn retire(&self, next: &Arc<ExperimentState>, next_exp: &Experiment) {
        let _ = self
            .successor
            .set((Arc::downgrade(next), Box::new(next_exp.clone())));
    }

    /// The state outcomes go to now, with the arm's index there.
    fn successor_of(
        &self,
        exp: &Experiment,
        arm: usize,
    ) -> Option<(Arc<ExperimentState>, &Experiment, usize)> {
        let (w, next) = self.successor.get()?;
        let st = w.upgrade()?;
        let name = &exp.arms.get(arm)?.name;
        let j = next.arms.iter().position(|a| a.name == *name)?;
        Some((st, next, j))
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mirrors the book into the atomics the fast path reads.
    fn publish(&self, exp: &Experiment, book: &Book) {
        let (mut disabled, mut probing, mut next) = (0u64, 0u64, u64::MAX);
        for (i, p) in book.phases.iter().enumerate() {
            match *p {
                ArmPhase::Enabled => {}
                ArmPhase::Tripped { until_ns, .. } => {
                    disabled |= 1 << i;
                    next = next.min(until_ns);
                }
                ArmPhase::Probing { .. } => probing |= 1 << i,
            }
        }
        if let (Some(r), Some(cfg)) = (&book.ramp, &exp.ramp) {
            if !r.halted && r.step + 1 < cfg.steps.len() {
                next = next.min(r.since_ns.saturating_add(nanos(cfg.interval)));
            }
            self.ramp_step.store(r.step as u64 + 1, Ordering::Relaxed);
        }
        self.disabled.store(disabled, Ordering::Relaxed);
        self.probing.store(probing, Ordering::Relaxed);
        self.next_event_ns.store(next, Ordering::Relaxed);
    }

    /// Moves time to `now_ns`: ends cool-downs (the arm starts probing) and
    /// advances the ramp. Cheap when nothing is due (one atomic load).
    pub fn tick(&self, exp: &Experiment, now_ns: u64) -> Vec<ArmEvent> {
        if now_ns < self.next_event_ns.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let mut book = self.lock();
        let mut events = Vec::new();
        for i in 0..book.phases.len() {
            if let ArmPhase::Tripped {
                until_ns,
                cooldown_ns,
            } = book.phases[i]
            {
                if now_ns >= until_ns {
                    book.phases[i] = ArmPhase::Probing { cooldown_ns };
                    book.windows[i].clear();
                    events.push(ArmEvent::Probing { arm: i });
                }
            }
        }
        if let (Some(cfg), Some(r)) = (&exp.ramp, book.ramp.as_mut()) {
            let due = r.since_ns.saturating_add(nanos(cfg.interval));
            if exp.arms[cfg.arm].weight == 0 && now_ns >= due {
                // Drained: the arm earns no step while it takes no traffic.
                r.since_ns = now_ns;
            } else if !r.halted && r.step + 1 < cfg.steps.len() && now_ns >= due {
                r.step += 1;
                r.since_ns = now_ns;
                events.push(ArmEvent::RampStep {
                    step: r.step,
                    share: cfg.steps[r.step],
                });
            }
        }
        self.publish(exp, &book);
        events
    }

    /// The gates a fetch reads (after [`tick`](Self::tick)).
    pub fn gate(&self, exp: &Experiment) -> Gate {
        let step = self.ramp_step.load(Ordering::Relaxed);
        Gate {
            disabled: self.disabled.load(Ordering::Relaxed),
            probing: self.probing.load(Ordering::Relaxed),
            ramp: exp
                .ramp
                .as_ref()
                .filter(|_| step > 0)
                .and_then(|r| Some((r.arm, *r.steps.get(step as usize - 1)?))),
        }
    }

    /// Bit set of disabled (tripped) arms.
    pub fn disabled(&self) -> u64 {
        self.disabled.load(Ordering::Relaxed)
    }

    /// Each arm's phase.
    pub fn phases(&self) -> Vec<ArmPhase> {
        self.lock().phases.clone()
    }

    /// The ramp's step and whether it halted (`None`: no ramp); of the
    /// successor once this state is retired.
    pub fn ramp(&self) -> Option<(usize, bool)> {
        if let Some(st) = self.successor.get().and_then(|(w, _)| w.upgrade()) {
            return st.ramp();
        }
        self.lock().ramp.map(|r| (r.step, r.halted))
    }

    /// Why `arm` was last tripped, while it is tripped or probing.
    pub fn disabled_reason(&self, arm: usize) -> Option<String> {
        self.lock().reasons.get(arm).cloned().flatten()
    }

    /// Records the outcome of an attempt on `arm` at monotonic time `now_ns`
    /// and applies the guardrail: an enabled arm may trip, a probing arm is
    /// judged once its probes reach `min-samples`. Returns what changed.
    pub fn record(
        &self,
        exp: &Experiment,
        arm: usize,
        ok: bool,
        latency_ns: u64,
        now_ns: u64,
    ) -> Option<ArmEvent> {
        if let Some((st, next, j)) = self.successor_of(exp, arm) {
            let event = st.record(next, j, ok, latency_ns, now_ns)?;
            return Some(event.for_arm(arm));
        }
        let g = exp.guardrail.as_ref()?;
        let period = now_ns / self.slot_ns;
        let mut book = self.lock();
        let slots = book.windows.get_mut(arm)?;
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
        let phase = book.phases[arm];
        if arm == 0 || matches!(phase, ArmPhase::Tripped { .. }) {
            return None;
        }
        let mine = window_stats(&mut book.windows[arm], period);
        let control = window_stats(&mut book.windows[0], period);
        let verdict = judge(g, &mine, &control);
        let event = match (phase, verdict) {
            (ArmPhase::Enabled, None) => return None,
            (ArmPhase::Probing { .. }, None) if mine.attempts() < g.min_samples => return None,
            (ArmPhase::Probing { .. }, None) => {
                book.phases[arm] = ArmPhase::Enabled;
                book.reasons[arm] = None;
                ArmEvent::Recovered { arm }
            }
            (ArmPhase::Enabled, Some(why)) => self.trip(&mut book, g, arm, why, None, now_ns),
            (ArmPhase::Probing { cooldown_ns }, Some(why)) => {
                self.trip(&mut book, g, arm, why, Some(cooldown_ns), now_ns)
            }
            (ArmPhase::Tripped { .. }, _) => unreachable!("returned above"),
        };
        if matches!(event, ArmEvent::Tripped { .. }) {
            if let (Some(r), Some(cfg)) = (book.ramp.as_mut(), &exp.ramp) {
                if cfg.arm == arm {
                    r.halted = true;
                }
            }
        }
        self.publish(exp, &book);
        Some(event)
    }

    /// Switches `arm` off: for the guardrail's cool-down on a first trip,
    /// twice the last one (capped) after a failed probe.
    fn trip(
        &self,
        book: &mut Book,
        g: &Guardrail,
        arm: usize,
        why: String,
        last_cooldown_ns: Option<u64>,
        now_ns: u64,
    ) -> ArmEvent {
        let cooldown_ns = g.cooldown.map(|c| match last_cooldown_ns {
            None => nanos(c),
            Some(last) => last.saturating_mul(2).min(nanos(g.max_cooldown)),
        });
        book.phases[arm] = ArmPhase::Tripped {
            until_ns: cooldown_ns.map_or(u64::MAX, |c| now_ns.saturating_add(c)),
            cooldown_ns: cooldown_ns.unwrap_or(0),
        };
        book.reasons[arm] = Some(why.clone());
        book.windows[arm].clear();
        ArmEvent::Tripped {
            arm,
            why,
            cooldown_ns,
        }
    }

    /// Re-enables every tripped or probing arm, forgets the windows and
    /// resumes a halted ramp (an operator decided the cause is fixed) at
    /// monotonic time `now_ns`: the ramp's next step comes one `interval`
    /// after the reset. Returns the arms that were not enabled, and whether
    /// a halted ramp resumed.
    pub fn reset(&self, exp: &Experiment, now_ns: u64) -> (Vec<usize>, bool) {
        let mut book = self.lock();
        let was: Vec<usize> = (0..book.phases.len())
            .filter(|&i| book.phases[i] != ArmPhase::Enabled)
            .collect();
        book.phases.iter_mut().for_each(|p| *p = ArmPhase::Enabled);
        book.reasons.iter_mut().for_each(|r| *r = None);
        book.windows.iter_mut().for_each(Vec::clear);
        let resumed = match book.ramp.as_mut().filter(|r| r.halted) {
            Some(r) => {
                r.halted = false;
                r.since_ns = now_ns;
                true
            }
            None => false,
        };
        self.publish(exp, &book);
        (was, resumed)
    }
}

/// True when `old` and `next` ramp the same arm (by name) over the same
/// steps and interval: a reload keeps such a ramp where it is.
pub fn same_ramp(old: &Experiment, next: &Experiment) -> bool {
    let key = |e: &Experiment| {
        e.ramp
            .as_ref()
            .map(|r| (e.arms[r.arm].name.clone(), r.steps.clone(), r.interval))
    };
    key(old) == key(next)
}

/// The phase arm `j` of `next` takes over from `was` (its phase under
/// `old`), and why it changed, if it did.
fn carried_phase(
    was: ArmPhase,
    old: &Experiment,
    next: &Experiment,
    j: usize,
    now_ns: u64,
) -> (ArmPhase, Option<String>) {
    if was == ArmPhase::Enabled {
        return (was, None);
    }
    let Some(g) = &next.guardrail else {
        return (
            ArmPhase::Enabled,
            Some(format!(
                "re-enabled ({}): the experiment has no guardrail now",
                was.name()
            )),
        );
    };
    if j == 0 {
        return (
            ArmPhase::Enabled,
            Some(format!(
                "re-enabled ({}): it is the control arm now",
                was.name()
            )),
        );
    }
    let ArmPhase::Tripped { .. } = was else {
        return (was, None);
    };
    if old.guardrail.as_ref().map(|o| o.cooldown) == Some(g.cooldown) {
        return (was, None);
    }
    let (phase, when) = match g.cooldown {
        None => (
            ArmPhase::Tripped {
                until_ns: u64::MAX,
                cooldown_ns: 0,
            },
            "until `shardport ab reset`".to_owned(),
        ),
        Some(c) => (
            ArmPhase::Tripped {
                until_ns: now_ns.saturating_add(nanos(c)),
                cooldown_ns: nanos(c),
            },
            format!("probed after the new cool-down of {c:?} from now"),
        ),
    };
    (phase, Some(format!("stays tripped, {when}")))
}

/// The window's totals and p99, dropping slots that left it.
fn window_stats(slots: &mut Vec<Slot>, period: u64) -> WindowStats {
    slots.retain(|s| s.period + SLOTS > period);
    let mut h = new_histogram();
    let (mut ok, mut errors) = (0, 0);
    for s in slots.iter() {
        ok += s.ok;
        errors += s.errors;
        let _ = h.add(&s.latency);
    }
    WindowStats::of(ok, errors, &h)
}

#[cfg(test)]
mod tests;
