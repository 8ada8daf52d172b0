//! The invariants a simulation run is judged by, checked after the run
//! from what the actors recorded and what the store holds (see the
//! [module docs](super)).

use std::collections::BTreeSet;
use std::sync::Arc;

use coord_adapters::board::{Board, BoardAdapter, BoardError, BoardOptions, TaskState};
use coord_adapters::sideeffect::{Action, Outcome, SideEffectAdapter, SideEffectStore};
use coord_backend::{Backend, Clock};

use super::recipes::{check_all_free, check_holdings, check_recipe_grants_reached};
use super::{Facts, Grant, LockKind, SlotRun, ACTIONS, EPOCH_MS, LOCK_TTL, TASKS};

/// The JSON record at `key`, read through the store itself (`None`: never
/// written, or unreadable).
pub(super) async fn read_record(store: &Arc<dyn Backend>, key: &str) -> Option<serde_json::Value> {
    let entry = store.snapshot(&[key.to_owned()]).await.ok()?.pop()?;
    serde_json::from_slice(entry.value.as_deref()?).ok()
}

/// The counter `field` of the JSON record at `key` (`None`: never written).
pub(super) async fn read_counter(store: &Arc<dyn Backend>, key: &str, field: &str) -> Option<u64> {
    read_record(store, key).await?.get(field)?.as_u64()
}

/// One lock's invariants: unique fences; validity windows in fence order
/// never overlap; (generic lock) every stored grant reached someone.
async fn check_lock(
    f: &Facts,
    kind: LockKind,
    store: &Arc<dyn Backend>,
    violations: &mut Vec<String>,
) {
    let grants: Vec<&Grant> = f.grants.iter().filter(|g| g.lock == kind).collect();
    let mut fences = BTreeSet::new();
    for g in &grants {
        if !fences.insert(g.fence) {
            violations.push(format!("{kind:?} lock fence {} granted twice", g.fence));
        }
    }
    let mut by_fence = grants.clone();
    by_fence.sort_by_key(|g| g.fence);
    for pair in by_fence.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if let Some(last) = a.last_valid {
            if last > b.granted {
                violations.push(format!(
                    "{kind:?} lock: {} (fence {}) acted as holder (event {last}) after {} (fence {}) was granted (event {})",
                    a.who, a.fence, b.who, b.fence, b.granted
                ));
            }
        }
    }
    if kind == LockKind::Fair {
        return;
    }
    // Every grant the store made reached its caller, or its caller was told
    // the outcome was unknown (an error), or dropped its wait with a store
    // call under way: a grant nobody knows of is a lock answered "held
    // elsewhere" while it was the caller's.
    let errors = f.lock_errors.get(&kind).copied().unwrap_or(0);
    if let Some(stored) = read_counter(store, kind.record(), "fence").await {
        let unknown = (1..=stored).filter(|n| !fences.contains(n)).count() as u64;
        if unknown > errors {
            violations.push(format!(
                "{kind:?} lock: the store granted {unknown} fence(s) nobody received, with only {errors} error answers"
            ));
        }
    }
}

pub(super) async fn check(
    f: &Facts,
    store: &Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    violations: &mut Vec<String>,
) {
    for kind in [LockKind::Generic, LockKind::Fair] {
        check_lock(f, kind, store, violations).await;
    }
    check_holdings(&f.holdings, violations);
    check_recipe_grants_reached(f, store, violations).await;
    // Side effects: each closure at most once; answers carry the one result.
    for (key, runs) in &f.effects {
        if runs.len() > 1 {
            violations.push(format!(
                "side effect {key} applied {} times: {runs:?}",
                runs.len()
            ));
        }
    }
    for (key, answers) in &f.answered {
        let ran = f.effects.get(key).cloned().unwrap_or_default();
        for answer in answers {
            if !ran.contains(answer) {
                violations.push(format!(
                    "side effect {key} answered with the result of {answer:?}, but the runs were {ran:?}"
                ));
            }
        }
    }
    // The stored state of each action agrees with what ran and what was answered.
    let adapter = SideEffectAdapter::with_clock(store.clone(), clock.clone());
    for a in 0..ACTIONS {
        let key = format!("fx/{a}");
        let ran = f.effects.get(&key).map_or(0, Vec::len);
        let errors = f.effect_errors.get(&key).copied().unwrap_or(0);
        let state = adapter
            .acquire(&Action::new(key.clone(), "payments"), LOCK_TTL)
            .await;
        match state {
            Ok(acquired) => match acquired.outcome() {
                Outcome::Uncertain if ran == 0 && errors == 0 => violations.push(format!(
                    "side effect {key} is uncertain, yet no run started and every caller got a definite answer"
                )),
                Outcome::Applied if ran > 0 => violations.push(format!(
                    "side effect {key} ran, yet the store lets it run again"
                )),
                Outcome::Replayed if ran == 0 => violations.push(format!(
                    "side effect {key} is completed, yet it never ran"
                )),
                _ => {}
            },
            Err(e) => violations.push(format!("side effect {key} unreadable at the end: {e}")),
        }
    }
    // Board: one successful completion per task, unique fences, the store agrees.
    for (id, claims) in &f.claims {
        let unique: BTreeSet<_> = claims.iter().collect();
        if unique.len() != claims.len() {
            violations.push(format!(
                "task {id}: a claim fence was granted twice: {claims:?}"
            ));
        }
    }
    let board = BoardAdapter::with_options(
        store.clone(),
        BoardOptions::default().with_clock(clock.clone()),
    );
    for (id_life, done) in &f.completions {
        if done.len() > 1 {
            violations.push(format!(
                "task {id_life} completed {} times: {done:?}",
                done.len()
            ));
        }
        let (id, life) = id_life.split_once('@').unwrap_or((id_life, ""));
        match board.get(id).await {
            // The same life still there: it must say who completed it.
            Ok(task) if task.payload == life.as_bytes() => {
                let by_completer =
                    matches!(&task.state, TaskState::Completed { agent, .. } if *agent == done[0]);
                if !by_completer {
                    violations.push(format!(
                        "task {id_life}: completion by {} answered Ok, the store holds {:?}",
                        done[0], task.state
                    ));
                }
            }
            // Pruned since (and maybe added again as a later life).
            Ok(_) | Err(BoardError::NotFound { .. }) => {}
            Err(e) => violations.push(format!("task {id} unreadable at the end: {e}")),
        }
    }
    // Dependents: `d<i>` waited on `t<i>`'s first life. Once that life
    // completed, `d<i>` is claimable for good, even after `t<i>` was pruned
    // (and added again, not completed); it only goes once pruned itself.
    for t in 0..TASKS {
        let (dep, id) = (format!("t{t}"), format!("d{t}"));
        let dep_done = f.completions.contains_key(&format!("{dep}@life-0"));
        match board.claim(&id, "checker", LOCK_TTL).await {
            Err(BoardError::DependenciesNotMet { pending, .. }) if dep_done => violations.push(
                format!("{id} waits on {pending:?}, yet {dep}'s first life completed"),
            ),
            Err(BoardError::NotFound { .. }) if !f.claims.contains_key(&id) => {
                violations.push(format!(
                    "{id} vanished, yet nobody ever claimed it (only completed tasks are pruned)"
                ))
            }
            Err(BoardError::Store(e)) => {
                violations.push(format!("{id} unreadable at the end: {e}"))
            }
            _ => {}
        }
    }
    // Scheduler: at most one run per slot.
    // A slot runs again only as a takeover, after the earlier run stopped
    // acting on it (its lease lost or its work done).
    for (slot, runs) in &f.slot_runs {
        let mut runs: Vec<&SlotRun> = runs.iter().collect();
        runs.sort_by_key(|r| r.started);
        for pair in runs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.takeovers <= a.takeovers || a.last_valid > b.started {
                violations.push(format!(
                    "slot {} ran twice at once: {} (takeovers {}, held until event {}) and {} (takeovers {}, from event {})",
                    slot.saturating_sub(EPOCH_MS),
                    a.who,
                    a.takeovers,
                    a.last_valid,
                    b.who,
                    b.takeovers,
                    b.started
                ));
            }
        }
    }
    // Last: it takes every lock and recipe.
    check_all_free(store, clock, violations).await;
}
