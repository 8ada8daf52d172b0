//! The checks run on a recorded [`History`] after a round.
//!
//! - **Acknowledged writes lost** / linearizability: each raw key's history
//!   of reads and conditional txns, checked against a register of unique
//!   values with `todc_utils`' [`WGLChecker`] (no search of our own). A txn
//!   whose answer was lost (`Unknown`) gets its response at the END of the
//!   history and applies iff the state equals what it asserted; a failed
//!   call that sent nothing (`Unavailable`) was never recorded. A lost
//!   acknowledged write is counted directly as well: an applied txn whose
//!   value some operation called after it returned saw overwritten by an
//!   older value (the chain of applied txns went back).
//! - **Fences**: per key of a lock, fair lock, semaphore or board task, two
//!   grants (permits, claims) with the same fence, or a grant asked for
//!   after another was granted whose fence is not higher.
//! - **Overlapping grants**: more grants of one key live at once than it
//!   has permits (1 for a lock, a fair lock or a board claim; N for a
//!   semaphore), with validity intervals (grant → send time of the last
//!   successful renewal + TTL, cut at the release or the complete call)
//!   each shrunk by half of [`OVERLAP_TOLERANCE`] at both ends (for two
//!   grants: they overlap by more than the tolerance).
//! - **Stale sink writes**: the fenced sink accepted a write with a lower
//!   fence than a write it had accepted before the call.
//! - **Double applies**: a side-effect action applied more than once.
//! - **Tasks completed twice**: a board task whose completion was
//!   acknowledged under two claims (fences), a claim of a task asked for
//!   after its completion was acknowledged, or two acknowledged effects of
//!   one task (see [`crate::history::Effect`]).
//! - **Slots run twice**: two handler starts of one scheduler slot with the
//!   same takeover count (the claim, or one takeover, won twice), or two
//!   acknowledged effects of one slot.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use todc_utils::linearizability::history::{Action, History as WglHistory};
use todc_utils::{Specification, WGLChecker};

use crate::history::{EffectOf, Grant, History, Micros, RawKind, RawOp, TxnResult, Value};

/// How much two validity intervals may overlap before it counts: the
/// adapters store lease ends in whole milliseconds, counted from a wall
/// clock read just after the monotonic send time the harness uses.
pub const OVERLAP_TOLERANCE: Micros = 2_000;

/// An operation of the register specification (call and response carry the same).
#[derive(Clone, Debug)]
pub enum RegisterOp {
    /// A read that returned the value.
    Read(Value),
    /// A conditional write of `new` asserting the register holds `expected`.
    Cas {
        /// Asserted.
        expected: Value,
        /// Written.
        new: u64,
        /// What came back.
        result: TxnResult,
    },
}

/// A register holding unique values (`None`: missing, the initial state).
#[derive(Debug)]
pub struct UniqueRegister;

impl Specification for UniqueRegister {
    type State = Value;
    type Operation = RegisterOp;

    fn init() -> Value {
        None
    }

    fn apply(op: &RegisterOp, state: &Value) -> (bool, Value) {
        match op {
            RegisterOp::Read(value) => (value == state, *state),
            RegisterOp::Cas {
                expected,
                new,
                result,
            } => match result {
                TxnResult::Applied => (expected == state, Some(*new)),
                TxnResult::Rejected => (expected != state, *state),
                TxnResult::Unknown if expected == state => (true, Some(*new)),
                TxnResult::Unknown => (true, *state),
            },
        }
    }
}

/// Whether one key's operations are linearizable (WGL search of `todc_utils`).
pub fn linearizable(ops: &[&RawOp]) -> bool {
    if ops.is_empty() {
        return true;
    }
    // (time, 0 = call / 1 = response, op index): calls first at equal times
    // (the lenient order); an unknown txn's response after everything.
    let mut events: Vec<(Micros, u8, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, 0, i));
        let unknown = matches!(
            op.kind,
            RawKind::Cas {
                result: TxnResult::Unknown,
                ..
            }
        );
        events.push((if unknown { Micros::MAX } else { op.ret }, 1, i));
    }
    events.sort();
    let actions = events
        .into_iter()
        .map(|(_, phase, i)| {
            let op = match ops[i].kind {
                RawKind::Read { value } => RegisterOp::Read(value),
                RawKind::Cas {
                    expected,
                    new,
                    result,
                } => RegisterOp::Cas {
                    expected,
                    new,
                    result,
                },
            };
            // One process per operation: todc pairs a process's calls and
            // responses in order, and an unknown txn's response moved to the
            // end must not pair with its client's next call.
            (
                i,
                if phase == 0 {
                    Action::Call(op)
                } else {
                    Action::Response(op)
                },
            )
        })
        .collect();
    WGLChecker::<UniqueRegister>::is_linearizable(WglHistory::from_actions(actions))
}

/// Applied txns of one key whose value was seen replaced by an older one
/// by an operation called after the txn returned.
pub fn lost_acked_writes(ops: &[&RawOp]) -> usize {
    // Which value each written value replaced (unique values: a tree).
    let mut parent: HashMap<u64, Value> = HashMap::new();
    for op in ops {
        if let RawKind::Cas {
            expected,
            new,
            result: TxnResult::Applied | TxnResult::Unknown,
        } = op.kind
        {
            parent.insert(new, expected);
        }
    }
    let ancestors = |x: u64| {
        let mut seen = HashSet::new();
        let mut at = parent.get(&x).copied();
        while let Some(v) = at {
            if !seen.insert(v) {
                break;
            }
            at = v.and_then(|v| parent.get(&v).copied());
        }
        seen
    };
    // What each operation observed: a read's value, an applied txn's expected one.
    let observed: Vec<(Micros, Value)> = ops
        .iter()
        .filter_map(|op| match op.kind {
            RawKind::Read { value } => Some((op.call, value)),
            RawKind::Cas {
                expected,
                result: TxnResult::Applied,
                ..
            } => Some((op.call, expected)),
            _ => None,
        })
        .collect();
    ops.iter()
        .filter(|op| {
            let RawKind::Cas {
                new,
                result: TxnResult::Applied,
                ..
            } = op.kind
            else {
                return false;
            };
            let older = ancestors(new);
            observed
                .iter()
                .any(|(call, value)| *call > op.ret && older.contains(value))
        })
        .count()
}

/// Everything the checks found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Violations {
    /// Raw keys whose history is not linearizable.
    pub non_linearizable_keys: Vec<String>,
    /// Acknowledged writes lost (see [`lost_acked_writes`]).
    pub acked_writes_lost: usize,
    /// Duplicate or decreasing fences (one line each).
    pub dup_fences: Vec<String>,
    /// Overlapping live grants (one line each).
    pub overlapping_grants: Vec<String>,
    /// Fenced-sink writes accepted with a fence lower than an earlier accepted one.
    pub stale_sink_writes: Vec<String>,
    /// Side-effect actions applied more than once.
    pub double_applies: Vec<String>,
    /// Board tasks completed (or their effect applied) twice.
    pub tasks_completed_twice: Vec<String>,
    /// Scheduler slots run (or their effect applied) twice.
    pub slots_run_twice: Vec<String>,
}

impl Violations {
    /// No violation of any kind.
    pub fn is_empty(&self) -> bool {
        self.non_linearizable_keys.is_empty()
            && self.acked_writes_lost == 0
            && self.dup_fences.is_empty()
            && self.overlapping_grants.is_empty()
            && self.stale_sink_writes.is_empty()
            && self.double_applies.is_empty()
            && self.tasks_completed_twice.is_empty()
            && self.slots_run_twice.is_empty()
    }
}

/// Run every check on `history`.
pub fn check(history: &History) -> Violations {
    let mut v = Violations::default();

    let mut by_key: BTreeMap<&str, Vec<&RawOp>> = BTreeMap::new();
    for op in &history.raw {
        by_key.entry(&op.key).or_default().push(op);
    }
    for (key, ops) in &by_key {
        if !linearizable(ops) {
            v.non_linearizable_keys.push((*key).to_owned());
        }
        v.acked_writes_lost += lost_acked_writes(ops);
    }

    let mut grants: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for g in &history.grants {
        grants.entry(&g.key).or_default().push(g);
    }
    for (key, gs) in grants {
        for (i, a) in gs.iter().enumerate() {
            for b in &gs[i + 1..] {
                if a.fence == b.fence {
                    v.dup_fences.push(format!(
                        "{key}: fence {} granted twice (holders {} and {})",
                        a.fence, a.holder, b.holder
                    ));
                }
                for (first, then) in [(a, b), (b, a)] {
                    if then.call > first.granted && then.fence < first.fence {
                        v.dup_fences.push(format!(
                            "{key}: fence {} granted after fence {} (asked at {} µs, after the grant at {} µs)",
                            then.fence, first.fence, then.call, first.granted
                        ));
                    }
                }
            }
        }
        v.overlapping_grants.extend(overlaps(key, &gs));
    }

    for a in &history.sink_writes {
        for b in &history.sink_writes {
            if a.resource == b.resource && b.call > a.ret && b.fence < a.fence {
                v.stale_sink_writes.push(format!(
                    "{}: fence {} accepted after fence {}",
                    a.resource, b.fence, a.fence
                ));
            }
        }
    }

    let mut applies: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for a in &history.applies {
        applies.entry(&a.action).or_default().push(a);
    }
    for (action, list) in applies {
        if list.len() > 1 {
            let who: Vec<String> = list
                .iter()
                .map(|a| format!("runner {} fence {} at {} µs", a.runner, a.fence, a.at))
                .collect();
            v.double_applies.push(format!(
                "{action} applied {} times: {}",
                list.len(),
                who.join(", ")
            ));
        }
    }

    let mut done: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for c in &history.completions {
        done.entry(&c.task).or_default().push(c);
    }
    for (task, list) in &done {
        let fences: BTreeSet<u64> = list.iter().map(|c| c.fence).collect();
        if fences.len() > 1 {
            let who: Vec<String> = list
                .iter()
                .map(|c| format!("worker {} fence {} at {} µs", c.worker, c.fence, c.ret))
                .collect();
            v.tasks_completed_twice.push(format!(
                "task {task} completed under {} claims: {}",
                fences.len(),
                who.join(", ")
            ));
        }
        let acked = list.iter().map(|c| c.ret).min().unwrap_or(Micros::MAX);
        let claim_key = format!("task/{task}");
        for g in history
            .grants
            .iter()
            .filter(|g| g.key == claim_key && g.call > acked)
        {
            v.tasks_completed_twice.push(format!(
                "task {task} claimed (holder {}, fence {}) at {} µs after its completion was acknowledged at {acked} µs",
                g.holder, g.fence, g.call
            ));
        }
    }

    let mut effects: BTreeMap<&EffectOf, BTreeSet<&str>> = BTreeMap::new();
    for e in &history.effects {
        effects.entry(&e.of).or_default().insert(&e.who);
    }
    for (of, who) in effects {
        if who.len() > 1 {
            let who: Vec<&str> = who.into_iter().collect();
            match of {
                EffectOf::Task(task) => v.tasks_completed_twice.push(format!(
                    "task {task}: effect acknowledged to {}",
                    who.join(" and ")
                )),
                EffectOf::Slot(slot) => v.slots_run_twice.push(format!(
                    "slot {slot}: effect acknowledged to {}",
                    who.join(" and ")
                )),
            }
        }
    }

    let mut runs: BTreeMap<(u64, u32), Vec<_>> = BTreeMap::new();
    for r in &history.slot_runs {
        runs.entry((r.slot, r.takeovers)).or_default().push(r);
    }
    for ((slot, takeovers), list) in runs {
        if list.len() > 1 {
            let who: Vec<String> = list
                .iter()
                .map(|r| format!("{} at {} µs", r.instance, r.at))
                .collect();
            v.slots_run_twice.push(format!(
                "slot {slot} started {} times after {takeovers} takeovers: {}",
                list.len(),
                who.join(", ")
            ));
        }
    }
    v
}

/// The moments more grants of `key` were live than it has permits (the
/// fewest any of them names): one line each time the count goes over.
pub fn overlaps(key: &str, grants: &[&Grant]) -> Vec<String> {
    let permits = grants.iter().map(|g| g.permits).min().unwrap_or(1).max(1) as usize;
    // Doubled time, so half the tolerance stays whole: (time, 0 = end / 1 =
    // start, grant); at equal times ends go first (touching is no overlap).
    let mut events: Vec<(Micros, u8, usize)> = Vec::new();
    for (i, g) in grants.iter().enumerate() {
        let start = g.granted.saturating_mul(2) + OVERLAP_TOLERANCE;
        let end = g.until.saturating_mul(2).saturating_sub(OVERLAP_TOLERANCE);
        if start < end {
            events.push((start, 1, i));
            events.push((end, 0, i));
        }
    }
    events.sort();
    let mut live: BTreeSet<usize> = BTreeSet::new();
    let mut out = Vec::new();
    for (_, phase, i) in events {
        if phase == 0 {
            live.remove(&i);
            continue;
        }
        live.insert(i);
        if live.len() == permits + 1 {
            let who: Vec<String> = live
                .iter()
                .map(|&j| {
                    let g = grants[j];
                    format!(
                        "fence {} (holder {}, {}..{} µs)",
                        g.fence, g.holder, g.granted, g.until
                    )
                })
                .collect();
            out.push(format!(
                "{key}: {} grants live at once ({permits} allowed): {}",
                live.len(),
                who.join(", ")
            ));
        }
    }
    out
}

/// Per fault: the time from the fault to the end of the first successful
/// operation called at or after it (`None`: none succeeded before the round ended).
pub fn unavailability(history: &History) -> Vec<Option<Duration>> {
    history
        .faults
        .iter()
        .map(|f| {
            history
                .successes
                .iter()
                .filter(|(call, _)| *call >= f.at)
                .map(|(_, ret)| *ret)
                .min()
                .map(|ret| Duration::from_micros(ret.saturating_sub(f.at)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Apply, Completion, Effect, FaultEvent, Grant, SinkWrite, SlotRun};

    fn read(key: &str, client: usize, call: Micros, ret: Micros, value: Value) -> RawOp {
        RawOp {
            key: key.into(),
            client,
            call,
            ret,
            kind: RawKind::Read { value },
        }
    }

    fn cas(
        client: usize,
        call: Micros,
        ret: Micros,
        expected: Value,
        new: u64,
        result: TxnResult,
    ) -> RawOp {
        RawOp {
            key: "k".into(),
            client,
            call,
            ret,
            kind: RawKind::Cas {
                expected,
                new,
                result,
            },
        }
    }

    fn grant(holder: usize, fence: u64, call: Micros, granted: Micros, until: Micros) -> Grant {
        Grant {
            key: "l".into(),
            permits: 1,
            holder,
            fence,
            call,
            granted,
            until,
        }
    }

    fn effect(of: EffectOf, who: &str) -> Effect {
        Effect {
            of,
            who: who.into(),
            at: 0,
        }
    }

    fn completion(task: &str, worker: usize, fence: u64, call: Micros, ret: Micros) -> Completion {
        Completion {
            task: task.into(),
            worker,
            fence,
            call,
            ret,
        }
    }

    fn slot_run(slot: u64, instance: &str, takeovers: u32) -> SlotRun {
        SlotRun {
            slot,
            instance: instance.into(),
            takeovers,
            at: slot,
        }
    }

    /// A clean history: two clients racing on one key, one unknown txn
    /// that did apply, one that did not, a lock handed over in order, a
    /// sink with rising fences, each effect once.
    fn clean() -> History {
        History {
            raw: vec![
                read("k", 0, 0, 10, None),
                read("k", 1, 5, 12, None),
                cas(0, 11, 20, None, 1, TxnResult::Applied),
                cas(1, 13, 25, None, 2, TxnResult::Rejected),
                read("k", 1, 30, 35, Some(1)),
                cas(1, 36, 50, Some(1), 3, TxnResult::Unknown),
                read("k", 0, 60, 70, Some(3)),
                cas(0, 71, 80, Some(3), 4, TxnResult::Unknown),
                read("k", 0, 90, 95, Some(3)),
            ],
            grants: vec![
                grant(0, 1, 0, 10, 5_000),
                grant(1, 2, 1, 8_000, 12_000),
                grant(0, 3, 9_000, 13_000, 20_000),
            ],
            sink_writes: vec![
                SinkWrite {
                    resource: "l".into(),
                    fence: 1,
                    call: 100,
                    ret: 200,
                },
                SinkWrite {
                    resource: "l".into(),
                    fence: 2,
                    call: 8_100,
                    ret: 8_200,
                },
            ],
            applies: vec![
                Apply {
                    action: "e0".into(),
                    runner: 0,
                    fence: 1,
                    at: 5,
                },
                Apply {
                    action: "e1".into(),
                    runner: 1,
                    fence: 1,
                    at: 6,
                },
            ],
            effects: vec![
                effect(EffectOf::Task("t0".into()), "worker 0 fence 1"),
                effect(EffectOf::Slot(1_000), "i0 takeovers 0"),
            ],
            completions: vec![
                completion("t0", 0, 1, 100, 200),
                // The same claim's retry after a lost answer: acknowledged again.
                completion("t0", 0, 1, 250, 300),
            ],
            slot_runs: vec![
                slot_run(1_000, "i0", 0),
                // Taken over after the lease ran out: a legitimate second start.
                slot_run(1_000, "i1", 1),
                slot_run(2_000, "i1", 0),
            ],
            successes: vec![(0, 10), (1_000, 1_500), (3_000, 3_100)],
            faults: vec![FaultEvent {
                what: "kill".into(),
                at: 900,
                new_leader_at: Some(1_200),
            }],
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let h = clean();
        assert_eq!(check(&h), Violations::default());
        assert_eq!(unavailability(&h), vec![Some(Duration::from_micros(600))]);
    }

    #[test]
    fn a_lost_acknowledged_write_is_reported() {
        let mut h = clean();
        // Applied 4 over 3 and acknowledged; a later read sees 3 again.
        h.raw.pop();
        h.raw.pop();
        h.raw.push(cas(0, 71, 80, Some(3), 4, TxnResult::Applied));
        h.raw.push(read("k", 1, 90, 95, Some(3)));
        let v = check(&h);
        assert_eq!(v.non_linearizable_keys, vec!["k".to_owned()]);
        assert_eq!(v.acked_writes_lost, 1);
    }

    #[test]
    fn a_stale_read_and_a_wrong_rejection_are_not_linearizable() {
        let mut h = clean();
        h.raw.push(read("k", 1, 200, 210, Some(1)));
        assert_eq!(check(&h).non_linearizable_keys, vec!["k".to_owned()]);
        // A txn rejected although nothing changed the value it asserted.
        let ops = [
            read("k", 0, 0, 1, None),
            cas(0, 2, 3, None, 7, TxnResult::Rejected),
        ];
        assert!(!linearizable(&ops.iter().collect::<Vec<_>>()));
    }

    #[test]
    fn duplicate_and_decreasing_fences_are_reported() {
        let mut h = clean();
        h.grants.push(grant(1, 3, 21_000, 22_000, 25_000));
        let v = check(&h);
        assert_eq!(v.dup_fences.len(), 1, "{v:?}");
        let mut h = clean();
        h.grants.push(grant(1, 2, 21_000, 22_000, 25_000));
        let v = check(&h);
        // Equal to fence 2 and lower than fence 3, asked after both were granted.
        assert_eq!(v.dup_fences.len(), 2, "{v:?}");
        assert!(v.overlapping_grants.is_empty());
    }

    #[test]
    fn overlapping_grants_are_reported() {
        let mut h = clean();
        h.grants.push(grant(1, 4, 14_000, 15_000, 30_000));
        let v = check(&h);
        assert_eq!(v.overlapping_grants.len(), 1, "{v:?}");
        assert!(v.dup_fences.is_empty());
    }

    #[test]
    fn a_double_apply_and_a_stale_sink_write_are_reported() {
        let mut h = clean();
        h.applies.push(Apply {
            action: "e0".into(),
            runner: 1,
            fence: 2,
            at: 50,
        });
        h.sink_writes.push(SinkWrite {
            resource: "l".into(),
            fence: 1,
            call: 9_000,
            ret: 9_100,
        });
        let v = check(&h);
        assert_eq!(v.double_applies.len(), 1, "{v:?}");
        assert_eq!(v.stale_sink_writes.len(), 1, "{v:?}");
    }

    #[test]
    fn a_fair_lock_key_is_checked_like_a_lock() {
        // A fair lock's grants go through the same fence and overlap checks.
        let fair = |holder, fence, call, granted, until| Grant {
            key: "fair0".into(),
            ..grant(holder, fence, call, granted, until)
        };
        let mut h = clean();
        h.grants.push(fair(0, 1, 0, 10, 5_000));
        h.grants.push(fair(1, 2, 4_000, 6_000, 9_000));
        assert_eq!(check(&h), Violations::default());
        h.grants.push(fair(2, 2, 6_000, 6_500, 9_500));
        let v = check(&h);
        assert_eq!(v.dup_fences.len(), 1, "{v:?}");
        assert_eq!(v.overlapping_grants.len(), 1, "{v:?}");
        assert!(v.overlapping_grants[0].starts_with("fair0:"), "{v:?}");
    }

    #[test]
    fn more_live_permits_than_the_semaphore_has_are_reported() {
        let permit = |holder, fence, granted, until| Grant {
            key: "sem0".into(),
            permits: 2,
            ..grant(holder, fence, granted, granted, until)
        };
        let mut h = clean();
        // Two permits live at once: allowed; a third waits for one to end.
        h.grants.push(permit(0, 1, 0, 10_000));
        h.grants.push(permit(1, 2, 1_000, 12_000));
        h.grants.push(permit(2, 3, 10_000, 20_000));
        // Overlapping by no more than the tolerance is not counted.
        h.grants.push(permit(0, 4, 11_000, 22_000));
        assert_eq!(check(&h), Violations::default());
        // A third live permit while two are held.
        h.grants.push(permit(1, 5, 15_000, 18_000));
        let v = check(&h);
        assert_eq!(v.overlapping_grants.len(), 1, "{v:?}");
        assert!(v.overlapping_grants[0].contains("3 grants"), "{v:?}");
        // A permit fence reused, and one lower than an earlier grant's.
        h.grants.pop();
        h.grants.push(permit(1, 3, 30_000, 31_000));
        let v = check(&h);
        assert!(v.overlapping_grants.is_empty(), "{v:?}");
        assert_eq!(v.dup_fences.len(), 2, "{v:?}");
    }

    #[test]
    fn a_task_completed_twice_is_reported() {
        // Acknowledged under a second claim.
        let mut h = clean();
        h.completions.push(completion("t0", 1, 2, 400, 500));
        let v = check(&h);
        assert_eq!(v.tasks_completed_twice.len(), 1, "{v:?}");
        // Claimed again after its completion was acknowledged.
        let mut h = clean();
        h.grants.push(Grant {
            key: "task/t0".into(),
            ..grant(1, 2, 400, 450, 900)
        });
        let v = check(&h);
        assert_eq!(v.tasks_completed_twice.len(), 1, "{v:?}");
        // Its effect acknowledged to two claims.
        let mut h = clean();
        h.effects
            .push(effect(EffectOf::Task("t0".into()), "worker 1 fence 2"));
        let v = check(&h);
        assert_eq!(v.tasks_completed_twice.len(), 1, "{v:?}");
        assert!(v.slots_run_twice.is_empty());
        // A claim before the completion was acknowledged is no violation.
        let mut h = clean();
        h.grants.push(Grant {
            key: "task/t0".into(),
            ..grant(1, 2, 150, 160, 190)
        });
        assert_eq!(check(&h), Violations::default());
    }

    #[test]
    fn a_slot_run_twice_is_reported() {
        // The claim of slot 2000 won by a second instance.
        let mut h = clean();
        h.slot_runs.push(slot_run(2_000, "i0", 0));
        let v = check(&h);
        assert_eq!(v.slots_run_twice.len(), 1, "{v:?}");
        // Its effect acknowledged twice.
        let mut h = clean();
        h.effects
            .push(effect(EffectOf::Slot(1_000), "i1 takeovers 1"));
        let v = check(&h);
        assert_eq!(v.slots_run_twice.len(), 1, "{v:?}");
        assert!(v.tasks_completed_twice.is_empty());
    }
}
