//! The invariants a simulation run is judged by, checked after the run
//! from what the actors recorded and what the store holds (see the
//! [module docs](super)).

use std::collections::BTreeSet;
use std::sync::Arc;

use coord_adapters::board::{Board, BoardAdapter, BoardError, BoardOptions, TaskState};
use coord_adapters::sideeffect::{Action, Outcome, SideEffectAdapter, SideEffectStore};
use coord_backend::{Backend, Clock};

use super::recipes::{check_all_free, check_holdings, check_recipe_grants_reached};
use super::{
    read_counter, Facts, Grant, LockKind, OutboxRun, SlotRun, ACTIONS, EPOCH_MS, LOCK_TTL, OUTBOX,
    OUTBOX_PREFIX, QUEUE, QUEUED, SCHEDULER_JOB, SCHEDULER_WINDOW, TASKS,
};

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
    // Side effects: each closure at most once per life of its key (a life
    // ends when retention removes the key's record); answers carry the
    // result of a run that happened.
    let no_removals = Vec::new();
    for (key, runs) in &f.effects {
        let removals = f.removals.get(key).unwrap_or(&no_removals);
        for pair in runs.windows(2) {
            let (first, next) = (pair[0].1, pair[1].1);
            if !removals.iter().any(|r| first < *r && *r < next) {
                violations.push(format!(
                    "side effect {key} applied twice in one life (no removal of its record \
                     between the runs): {runs:?}, removals at {removals:?}"
                ));
            }
        }
    }
    for (key, answers) in &f.answered {
        let ran: Vec<&str> = f
            .effects
            .get(key)
            .map(|runs| runs.iter().map(|(who, _)| who.as_str()).collect())
            .unwrap_or_default();
        for answer in answers {
            if !ran.contains(&answer.as_str()) {
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
        let runs = f.effects.get(&key).map_or(&[][..], Vec::as_slice);
        let ran = runs.len();
        // Its record was removed after its last run: a new life may begin.
        let pruned_since = match (runs.last(), f.removals.get(&key).and_then(|r| r.last())) {
            (Some((_, run)), Some(removed)) => removed > run,
            _ => false,
        };
        let errors = f.effect_errors.get(&key).copied().unwrap_or(0);
        let state = adapter
            .acquire(&Action::new(key.clone(), "payments"), LOCK_TTL)
            .await;
        match state {
            Ok(acquired) => match acquired.outcome() {
                Outcome::Uncertain if ran == 0 && errors == 0 => violations.push(format!(
                    "side effect {key} is uncertain, yet no run started and every caller got a definite answer"
                )),
                Outcome::Applied if ran > 0 && !pruned_since => violations.push(format!(
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
    check_queue_drains(f, store, clock.as_ref(), violations).await;
    check_outbox(f, store, clock.as_ref(), violations).await;
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
    check_retention_drains(store, violations).await;
    check_claims_drain(store, violations).await;
}

/// Once every run's lease is far past the run store's window, a prune
/// leaves no claim and no running entry of the scheduler's job: a run whose
/// finish was lost and that nobody took over (abandoned) is forgotten too.
/// Queue: nothing committed is lost. Two hours later (every lease and
/// backoff over), a clean client drains the queue; then every queued task
/// is completed (or pruned after completing) or dead, and none whose
/// completion was answered Ok is claimed by the drain.
async fn check_queue_drains(
    f: &Facts,
    store: &Arc<dyn Backend>,
    clock: &dyn Clock,
    violations: &mut Vec<String>,
) {
    let later = Arc::new(coord_backend::ManualClock::at_millis(
        clock.now_millis() + 2 * 3_600_000,
    ));
    let board =
        BoardAdapter::with_options(store.clone(), BoardOptions::default().with_clock(later));
    let mut drained = BTreeSet::new();
    loop {
        match board.claim_next(QUEUE, "checker", LOCK_TTL).await {
            Ok(Some(task)) => {
                drained.insert(task.id.clone());
                if let Err(e) = board.complete(&task.id, &task.token, Vec::new()).await {
                    violations.push(format!("queue drain: completing {}: {e}", task.id));
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                violations.push(format!("queue drain: {e}"));
                return;
            }
        }
    }
    for t in 0..QUEUED {
        // `qd<t>` waits for good on a dead `q<t>` (or one pruned once dead).
        let dep_dead = match board.get(&format!("q{t}")).await {
            Ok(task) => matches!(task.state, TaskState::Dead { .. }),
            Err(_) => !f.completions.contains_key(&format!("q{t}@life-0")),
        };
        for id in [format!("q{t}"), format!("qd{t}")] {
            let completed_ok = f.completions.contains_key(&format!("{id}@life-0"));
            match board.get(&id).await {
                Ok(task) => match &task.state {
                    TaskState::Completed { .. } | TaskState::Dead { .. } => {}
                    TaskState::Open if id.starts_with("qd") && dep_dead => {}
                    state => violations.push(format!(
                        "queued task {id} is neither completed nor dead after the drain: {state:?} \
                         (it has no entry claim_next finds)"
                    )),
                },
                // Pruned once completed (a completion answered in doubt
                // may have applied): only a task someone claimed can be.
                Err(BoardError::NotFound { .. })
                    if f.claims.contains_key(&id) || drained.contains(&id) => {}
                Err(BoardError::NotFound { .. }) => violations.push(format!(
                    "queued task {id} vanished, yet nobody ever claimed it"
                )),
                Err(e) => violations.push(format!("queued task {id} unreadable at the end: {e}")),
            }
            if completed_ok && drained.contains(&id) {
                violations.push(format!(
                    "queued task {id} was completed (answered Ok) and claimed again by the drain"
                ));
            }
        }
    }
}

/// Outbox: no intent runs twice, none committed is lost. 90 minutes later
/// (every lease and backoff over, yet within the hour the final retention
/// check leaves a completion), a clean dispatcher drains the outbox;
/// then every intent whose enqueue was answered Ok is completed, dead or
/// uncertain (or was pruned once final), and for every key each run after
/// the first started only after the one before it answered "nothing took
/// effect".
async fn check_outbox(
    f: &Facts,
    store: &Arc<dyn Backend>,
    clock: &dyn Clock,
    violations: &mut Vec<String>,
) {
    use coord_adapters::outbox::{HandlerError, Outbox};
    let later = Arc::new(coord_backend::ManualClock::at_millis(
        clock.now_millis() + 90 * 60_000,
    ));
    let board = BoardAdapter::with_options(
        store.clone(),
        BoardOptions::default()
            .with_clock(later)
            .with_key_prefix(OUTBOX_PREFIX),
    );
    let outbox = Outbox::over(Arc::new(board), OUTBOX).expect("the outbox");
    let dispatcher = outbox.dispatcher("checker");
    let drained: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    loop {
        let seen = drained.clone();
        let step = dispatcher
            .dispatch_next(move |intent| {
                seen.lock().unwrap().push(intent.key);
                std::future::ready(Ok::<_, HandlerError>(b"checker".to_vec()))
            })
            .await;
        match step {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                violations.push(format!("outbox drain: {e}"));
                return;
            }
        }
    }
    let drained = drained.lock().unwrap().clone();
    let final_event = u64::MAX;
    for (key, runs) in &f.outbox_runs {
        let mut runs: Vec<&OutboxRun> = runs.iter().collect();
        let drain_run = OutboxRun {
            who: "checker".to_owned(),
            started: final_event,
            answered: Some(final_event),
            declined: false,
        };
        if drained.contains(key) {
            runs.push(&drain_run);
        }
        for pair in runs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let followed_a_decline = a.declined && a.answered.is_some_and(|at| at < b.started);
            if !followed_a_decline {
                violations.push(format!(
                    "outbox intent {key} ran twice: {} (from event {}, answered {:?}, declined {}) \
                     then {} (from event {})",
                    a.who, a.started, a.answered, a.declined, b.who, b.started
                ));
            }
        }
    }
    for key in &f.outbox_enqueued {
        let ran = f.outbox_runs.contains_key(key) || drained.contains(key);
        match outbox.status(key).await {
            Ok(task) => match &task.state {
                TaskState::Completed { .. }
                | TaskState::Dead { .. }
                | TaskState::Uncertain { .. } => {}
                state => violations.push(format!(
                    "outbox intent {key} is neither completed, dead nor uncertain after the drain: \
                     {state:?}"
                )),
            },
            Err(BoardError::NotFound { .. }) if ran => {}
            Err(BoardError::NotFound { .. }) => violations.push(format!(
                "outbox intent {key} was committed, never ran, and is gone"
            )),
            Err(e) => violations.push(format!("outbox intent {key} unreadable at the end: {e}")),
        }
    }
}

async fn check_claims_drain(store: &Arc<dyn Backend>, violations: &mut Vec<String>) {
    use coord_backend::ManualClock;
    use coord_scheduler::{RunStore, RunStoreOptions, SlotStore};
    // A week past the simulated epoch: past every lease, even one written
    // by a scheduler whose clock stepped hours ahead.
    let far = Arc::new(ManualClock::at_millis(EPOCH_MS + 7 * 24 * 3_600_000));
    let options = RunStoreOptions::default().with_forget_claims_after(Some(SCHEDULER_WINDOW));
    let runs = match RunStore::new(store.clone(), far, options) {
        Ok(runs) => runs,
        Err(e) => return violations.push(format!("no run store at the end: {e}")),
    };
    if let Err(e) = runs.prune(SCHEDULER_JOB).await {
        violations.push(format!("scheduler prune failed at the end: {e}"));
    }
    match store.keys(&format!("sched/{SCHEDULER_JOB}/slot/")).await {
        Ok(left) if !left.is_empty() => violations.push(format!(
            "scheduler claims no prune forgets: {} left, first {:?}",
            left.len(),
            left.first()
        )),
        Ok(_) => {}
        Err(e) => violations.push(format!("scheduler claims unreadable at the end: {e}")),
    }
    match runs.active(SCHEDULER_JOB).await {
        Ok(active) if !active.is_empty() => violations.push(format!(
            "scheduler runs left in the running set after the prune: {active:?}"
        )),
        Ok(_) => {}
        Err(e) => violations.push(format!("scheduler running set unreadable at the end: {e}")),
    }
}

/// Once every completion is past the retention, prunes leave nothing in the
/// retention indexes but their cursors and removal counter: no entry was
/// written where no prune looks (a late clock's completion, a late commit).
/// Runs after every other check: it removes completed tasks and keys.
async fn check_retention_drains(store: &Arc<dyn Backend>, violations: &mut Vec<String>) {
    use coord_adapters::retention::PruneOptions;
    use coord_backend::ManualClock;
    // Three hours past the simulated epoch: every completion is over an hour old.
    let far = Arc::new(ManualClock::at_millis(EPOCH_MS + 3 * 3_600_000));
    let window = PruneOptions::after(std::time::Duration::from_secs(3600));
    let effects = SideEffectAdapter::with_clock(store.clone(), far.clone());
    let board = BoardAdapter::with_options(store.clone(), BoardOptions::default().with_clock(far));
    for _ in 0..100 {
        match effects.prune(&window).await {
            Ok(p) if p.more => continue,
            Ok(_) => break,
            Err(e) => {
                violations.push(format!("side-effect prune failed at the end: {e}"));
                break;
            }
        }
    }
    for _ in 0..100 {
        match board.prune(&window).await {
            Ok(p) if p.more => continue,
            Ok(_) => break,
            Err(e) => {
                violations.push(format!("board prune failed at the end: {e}"));
                break;
            }
        }
    }
    for (index, kept) in [
        ("se/done/", &["se/done/cursor"][..]),
        (
            "board/done/",
            &["board/done/cursor", "board/done/removed"][..],
        ),
    ] {
        match store.keys(index).await {
            Ok(keys) => {
                let left: Vec<&String> = keys
                    .iter()
                    .filter(|k| !kept.contains(&k.as_str()))
                    .collect();
                if !left.is_empty() {
                    violations.push(format!(
                        "retention index entries no prune removes: {left:?}"
                    ));
                }
            }
            Err(e) => violations.push(format!("{index} unreadable at the end: {e}")),
        }
    }
}
