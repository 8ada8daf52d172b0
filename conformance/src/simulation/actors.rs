//! The simulation's actors: each drives one adapter through its own faulty
//! instance and records what it was told in the shared facts.

use std::future::Future;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, BoardOptions, TaskSpec};
use coord_adapters::lock::{GuardOptions, LockError, LockGuard, WaitOptions};
use coord_adapters::sideeffect::{
    Action, BackendFencedSink, EffectResult, Fence, FencedSink, Outcome, Runner, SideEffectAdapter,
};
use coord_backend::{Backend, Mutation};
use coord_scheduler::{
    handler, Job, JobOptions, RunStore, RunStoreOptions, Schedule, Scheduler, SchedulerOptions,
    SlotStore,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::*;

/// What every seeded actor works with: its instance, the log, the shared
/// facts, its own random stream and when to stop.
pub(super) struct Actor {
    pub(super) inst: Arc<Instance>,
    pub(super) log: Arc<Log>,
    pub(super) shared: Shared,
    pub(super) rng: StdRng,
    pub(super) end: Instant,
}

impl Actor {
    pub(super) fn new(
        inst: &Arc<Instance>,
        log: &Arc<Log>,
        shared: &Shared,
        seed: u64,
        end: Instant,
    ) -> Self {
        Actor {
            inst: inst.clone(),
            log: log.clone(),
            shared: shared.clone(),
            rng: StdRng::seed_from_u64(seed),
            end,
        }
    }

    fn parts(self) -> (Arc<Instance>, Arc<Log>, Shared, StdRng, Instant) {
        (self.inst, self.log, self.shared, self.rng, self.end)
    }
}

/// Await `call`; or, with probability `p`, drop it once a random 10 ms to
/// 3 s have passed without an answer, as a cancelled task's future is
/// dropped. `None`: dropped.
pub(super) async fn maybe_dropped<F: Future>(
    rng: &mut StdRng,
    p: f64,
    call: F,
) -> Option<F::Output> {
    if rng.random_bool(p) {
        let cut = Duration::from_millis(rng.random_range(10..3000));
        tokio::time::timeout(cut, call).await.ok()
    } else {
        Some(call.await)
    }
}

/// Reclaim a few tombstones every 1.5 s until `end` (through the store
/// itself: a reclaim changes nothing any reader can see, so it is not
/// faulted), logging what went.
pub(super) async fn reclaimer(store: Arc<dyn Backend>, log: Arc<Log>, end: Instant) {
    let options = coord_backend::ReclaimOptions::DEFAULT.with_max_tombstones(5);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        match store.reclaim(&options).await {
            Ok(done) if done.removed > 0 => log.event(
                "maintainer",
                format!("reclaimed {} tombstones", done.removed),
            ),
            Ok(_) => {}
            Err(e) => log.event("maintainer", format!("reclaim failed: {e}")),
        }
    }
}

/// Prune completed board tasks or side effects, or add a pruned task again
/// (as its next life), every second until `end`, through a faulty instance
/// whose pruners' clock is two hours ahead.
pub(super) async fn board_maintainer(actor: Actor) {
    use coord_adapters::board::BoardError;
    use coord_adapters::retention::PruneOptions;
    let (inst, log, shared, mut rng, end) = actor.parts();
    // Two hours ahead with a one-hour retention: every completion is past it.
    let ahead = Arc::new(SimClock {
        start: inst.clock.start,
        offset_ms: AtomicI64::new(2 * 3_600_000),
    });
    let pruner = BoardAdapter::with_options(
        inst.backend(),
        BoardOptions::default().with_clock(ahead.clone()),
    );
    let effects = SideEffectAdapter::with_clock(inst.backend(), ahead);
    let board = inst.board();
    let mut lives = [0u32; TASKS];
    let who = inst.name.as_str();
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        inst.wait_running().await;
        let window = PruneOptions::after(Duration::from_secs(3600)).with_max_records(3);
        if rng.random_bool(0.3) {
            let pruned = pruner.prune(&window).await;
            if let Ok(p) = &pruned {
                *facts(&shared).stats.entry("tasks pruned").or_insert(0) += p.removed;
            }
            log.event(
                who,
                match pruned {
                    Ok(p) => format!("pruned {} tasks (more: {})", p.removed, p.more),
                    Err(e) => format!("prune: {}", kind(&e.to_string())),
                },
            );
            continue;
        }
        if rng.random_bool(0.3) {
            let pruned = effects.prune(&window).await;
            if let Ok(p) = &pruned {
                *facts(&shared)
                    .stats
                    .entry("side effects pruned")
                    .or_insert(0) += p.removed;
            }
            log.event(
                who,
                match pruned {
                    Ok(p) => format!("pruned {} side effects (more: {})", p.removed, p.more),
                    Err(e) => format!("prune side effects: {}", kind(&e.to_string())),
                },
            );
            continue;
        }
        let t = rng.random_range(0..TASKS);
        let id = format!("t{t}");
        if matches!(board.get(&id).await, Err(BoardError::NotFound { .. })) {
            lives[t] += 1;
            let life = format!("life-{}", lives[t]);
            if rng.random_bool(0.3) {
                // The add's reply is lost and its txn held in the server for
                // a while: across the claims, completion and prune of the
                // life its resend created.
                let after_calls = rng.random_range(5..60);
                log.event(who, format!("add {id}: held back for {after_calls} calls"));
                inst.faulty
                    .once(Target::WritingTxn, Fault::LateCommit { after_calls });
            }
            let added = board
                .add(TaskSpec::new(&id, life.as_bytes().to_vec()))
                .await;
            if added.is_ok() {
                count(&shared, "tasks added again");
            }
            log.event(who, format!("add {id} as {life}: {}", said(added)));
        }
    }
}

pub(super) async fn lock_actor(lock_kind: LockKind, actor: Actor) {
    let (inst, log, shared, mut rng, end) = actor.parts();
    let lock = lock_kind.make(&inst);
    let key = lock_kind.key();
    let sink = BackendFencedSink::new(inst.backend());
    let who = inst.name.as_str();
    while Instant::now() < end {
        inst.wait_running().await;
        let wait = WaitOptions::with_timeout(Duration::from_secs(4));
        let acquire = LockGuard::acquire_with(&lock, key, LOCK_TTL, &wait, GuardOptions::default());
        let in_doubt = inst.faulty.answered_in_doubt();
        let Some(answer) = maybe_dropped(&mut rng, 0.15, acquire).await else {
            // A grant may have landed only if a store call was under way
            // or held back, or one was answered in doubt.
            if inst.faulty.drop_leaves_doubt(in_doubt) {
                *facts(&shared).lock_errors.entry(lock_kind).or_insert(0) += 1;
            }
            log.event(who, "lock: dropped while waiting");
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
            continue;
        };
        let guard = match answer {
            Ok(guard) => guard,
            Err(e) => {
                if matches!(&e, LockError::Store(e) if e.is_indeterminate()) {
                    *facts(&shared).lock_errors.entry(lock_kind).or_insert(0) += 1;
                }
                log.event(who, format!("lock: {}", kind(&e.to_string())));
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
                continue;
            }
        };
        let fence = guard.fence();
        let index = {
            let mut f = facts(&shared);
            f.clock += 1;
            let granted = f.clock;
            f.grants.push(Grant {
                lock: lock_kind,
                who: who.to_owned(),
                fence,
                granted,
                last_valid: None,
            });
            f.grants.len() - 1
        };
        count(
            &shared,
            match lock_kind {
                LockKind::Generic => "lock grants",
                LockKind::Fair => "fair lock grants",
            },
        );
        log.event(who, format!("lock granted fence {fence}"));
        for _ in 0..rng.random_range(1..5) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
            inst.wait_running().await;
            if !guard.is_valid() {
                log.event(who, format!("lock fence {fence} no longer valid"));
                break;
            }
            {
                let mut f = facts(&shared);
                f.clock += 1;
                f.grants[index].last_valid = Some(f.clock);
            }
            let write = vec![Mutation::put(format!("{key}/data"), fence.to_string())];
            let landed = sink.write_fenced(key, Fence(fence), write).await;
            log.event(who, format!("fenced write {fence}: {}", said(landed)));
        }
        let released = guard.release().await;
        log.event(who, format!("release fence {fence}: {}", said(released)));
    }
}

pub(super) async fn board_actor(actor: Actor) {
    let (inst, log, shared, mut rng, end) = actor.parts();
    let board = inst.board();
    let who = inst.name.as_str();
    while Instant::now() < end {
        let id = format!(
            "{}{}",
            if rng.random_bool(0.5) { "t" } else { "d" },
            rng.random_range(0..TASKS)
        );
        inst.wait_running().await;
        match board.claim(&id, who, LOCK_TTL).await {
            Ok(task) => {
                facts(&shared)
                    .claims
                    .entry(id.clone())
                    .or_default()
                    .push(task.fence);
                log.event(who, format!("claimed {id} fence {}", task.fence));
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..2000))).await;
                inst.wait_running().await;
                complete_task(&board, &task, who, &shared, &log).await;
            }
            Err(e) => log.event(who, format!("claim {id}: {}", kind(&e.to_string()))),
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
    }
}

/// Complete a claimed task (its result: who completed it) and record a
/// completion answered Ok under `<id>@<life>` (the life is its payload).
async fn complete_task(
    board: &BoardAdapter,
    task: &coord_adapters::board::ClaimedTask,
    who: &str,
    shared: &Shared,
    log: &Log,
) {
    let id = &task.id;
    let done = board
        .complete(id, &task.token, who.as_bytes().to_vec())
        .await;
    if done.is_ok() {
        let life = String::from_utf8_lossy(&task.payload);
        facts(shared)
            .completions
            .entry(format!("{id}@{life}"))
            .or_default()
            .push(who.to_owned());
    }
    log.event(who, format!("complete {id}: {}", said(done)));
}

/// A queue worker: takes the next ready task of queue `q`, works on it,
/// then completes it, fails it (retried after its backoff, dead after 3
/// attempts) or walks away (its lease runs out: a failed attempt).
pub(super) async fn queue_actor(actor: Actor) {
    let (inst, log, shared, mut rng, end) = actor.parts();
    let board = inst.board();
    let who = inst.name.as_str();
    while Instant::now() < end {
        inst.wait_running().await;
        match board.claim_next(QUEUE, who, LOCK_TTL).await {
            Ok(Some(task)) => {
                let id = task.id.clone();
                facts(&shared)
                    .claims
                    .entry(id.clone())
                    .or_default()
                    .push(task.fence);
                count(&shared, "queue claims");
                log.event(who, format!("claimed next {id} fence {}", task.fence));
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..1500))).await;
                inst.wait_running().await;
                let roll = rng.random_range(0..10);
                if roll < 7 {
                    complete_task(&board, &task, who, &shared, &log).await;
                } else if roll < 9 {
                    let failed = board.fail(&id, &task.token, "simulated failure").await;
                    log.event(who, format!("fail {id}: {}", said(failed.map(|_| ()))));
                } else {
                    log.event(who, format!("walk away from {id}"));
                }
            }
            Ok(None) => {}
            Err(e) => log.event(who, format!("claim next: {}", kind(&e.to_string()))),
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..300))).await;
    }
}

/// An outbox dispatcher: enqueues an intent of its own now and then (once:
/// an error is an answer in doubt, never retried), and dispatches, its
/// handler working 50 ms to 5 s (past its 3 s lease at times) and answering
/// "applied" (8 in 10), "nothing took effect" or "unknown"; sometimes it
/// walks away mid-run, as a killed process does.
pub(super) async fn outbox_actor(actor: Actor) {
    use coord_adapters::outbox::{HandlerError, Outbox};
    let (inst, log, shared, mut rng, end) = actor.parts();
    let board = BoardAdapter::with_options(
        inst.backend(),
        BoardOptions::default()
            .with_clock(inst.clock.clone())
            .with_key_prefix(OUTBOX_PREFIX),
    );
    let outbox = Outbox::over(Arc::new(board), OUTBOX).expect("the outbox");
    let who = inst.name.clone();
    let dispatcher = outbox.dispatcher(&who).with_ttl(LOCK_TTL);
    let mut enqueued = 0u32;
    while Instant::now() < end {
        inst.wait_running().await;
        if rng.random_bool(0.3) {
            let key = format!("{who}-{enqueued}");
            enqueued += 1;
            let added = outbox.enqueue(&key, who.clone().into_bytes()).await;
            log.event(
                &who,
                format!("enqueue {key}: {}", said(added.as_ref().map(|_| ()))),
            );
            if added.is_ok() {
                facts(&shared).outbox_enqueued.insert(key);
            }
        }
        let work = Duration::from_millis(rng.random_range(50..5000));
        let roll = rng.random_range(0..10);
        let walk_away = rng.random_bool(0.05);
        let (me, shared2, inst2) = (who.clone(), shared.clone(), inst.clone());
        let run = dispatcher.dispatch_next(move |intent| async move {
            let index = {
                let mut f = facts(&shared2);
                f.clock += 1;
                let started = f.clock;
                let runs = f.outbox_runs.entry(intent.key.clone()).or_default();
                runs.push(OutboxRun {
                    who: me.clone(),
                    started,
                    answered: None,
                    declined: false,
                });
                runs.len() - 1
            };
            tokio::time::sleep(work).await;
            inst2.wait_running().await;
            let declined = roll == 8;
            {
                let mut f = facts(&shared2);
                f.clock += 1;
                let at = f.clock;
                let run = &mut f.outbox_runs.get_mut(&intent.key).expect("recorded")[index];
                run.answered = Some(at);
                run.declined = declined;
            }
            match roll {
                8 => Err(HandlerError::not_applied("simulated refusal")),
                9 => Err(HandlerError::unknown("simulated timeout")),
                _ => Ok(me.into_bytes()),
            }
        });
        let done = if walk_away {
            // Killed mid-run: the future is dropped, its claim runs out.
            tokio::time::timeout(Duration::from_millis(30), run)
                .await
                .ok()
        } else {
            Some(run.await)
        };
        match done {
            Some(Ok(Some(dispatched))) => {
                count(&shared, "outbox dispatches");
                log.event(&who, format!("dispatched {dispatched:?}"));
            }
            Some(Ok(None)) => {}
            Some(Err(e)) => log.event(&who, format!("dispatch: {}", kind(&e.to_string()))),
            None => log.event(&who, "walked away mid-dispatch"),
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..300))).await;
    }
}

pub(super) async fn runner_actor(actor: Actor) {
    let (inst, log, shared, mut rng, end) = actor.parts();
    let runner = Runner::new(Arc::new(SideEffectAdapter::with_clock(
        inst.backend(),
        inst.clock.clone(),
    )));
    let who = inst.name.clone();
    while Instant::now() < end {
        let key = format!("fx/{}", rng.random_range(0..ACTIONS));
        let work = Duration::from_millis(rng.random_range(10..2500));
        inst.wait_running().await;
        let action = Action::new(key.clone(), "payments");
        let (me, shared2, inst2) = (who.clone(), shared.clone(), inst.clone());
        let key2 = key.clone();
        let done = runner
            .execute(&action, LOCK_TTL, move |_lease| async move {
                {
                    let mut f = facts(&shared2);
                    f.clock += 1;
                    let at = f.clock;
                    f.effects.entry(key2).or_default().push((me.clone(), at));
                }
                tokio::time::sleep(work).await;
                inst2.wait_running().await;
                Ok::<_, std::io::Error>(EffectResult::from(me.as_bytes()))
            })
            .await;
        let said = match done {
            Ok(execution) => {
                if matches!(execution.outcome, Outcome::Applied | Outcome::Replayed) {
                    let result = execution
                        .result
                        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
                        .unwrap_or_default();
                    facts(&shared)
                        .answered
                        .entry(key.clone())
                        .or_default()
                        .push(result);
                }
                format!("{:?}", execution.outcome)
            }
            Err(e) => {
                // Any error may leave an intent behind (it then reads as
                // uncertain, never as free): only definite answers may not.
                *facts(&shared).effect_errors.entry(key.clone()).or_insert(0) += 1;
                kind(&e.to_string())
            }
        };
        log.event(&who, format!("execute {key}: {said}"));
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
    }
}

/// Run side effects of keys of its own (`late/<n>`, each tried once) on a
/// clock [`BEHIND_MS`] behind everyone else's, until `end`: its
/// completions are indexed for retention while the others' clocks (and the
/// maintainer's, far ahead) have moved the index's cursor past its minute.
pub(super) async fn behind_runner(actor: Actor) {
    let (inst, log, shared, mut rng, end) = actor.parts();
    let runner = Runner::new(Arc::new(SideEffectAdapter::with_clock(
        inst.backend(),
        inst.clock.clone(),
    )));
    let who = inst.name.clone();
    let mut n = 0u32;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
        inst.wait_running().await;
        let key = format!("late/{n}");
        n += 1;
        let done = runner
            .execute(&Action::new(key.clone(), "ledger"), LOCK_TTL, |_| async {
                Ok::<_, std::io::Error>(EffectResult::from(&b"late"[..]))
            })
            .await;
        if matches!(&done, Ok(e) if e.outcome == Outcome::Applied) {
            count(&shared, "late-clock side effects");
        }
        let said = done.map_or_else(|e| kind(&e.to_string()), |e| format!("{:?}", e.outcome));
        log.event(&who, format!("execute {key}: {said}"));
    }
}

pub(super) fn start_scheduler(inst: &Arc<Instance>, log: &Arc<Log>, shared: &Shared) -> Scheduler {
    let store: Arc<dyn SlotStore> = Arc::new(
        RunStore::new(
            inst.backend(),
            inst.clock.clone(),
            RunStoreOptions::default().with_forget_claims_after(Some(SCHEDULER_WINDOW)),
        )
        .expect("a run store"),
    );
    let options = SchedulerOptions::instance(inst.name.clone())
        .with_poll_interval(Duration::from_millis(250));
    let scheduler = Scheduler::new(Some(store), inst.clock.clone(), options);
    let (who, log, shared, inst2) = (inst.name.clone(), log.clone(), shared.clone(), inst.clone());
    let job = Job::new(
        SCHEDULER_JOB,
        Schedule::parse("every 1s", None).expect("a schedule"),
        handler(move |ctx| {
            let (who, log, shared, inst) =
                (who.clone(), log.clone(), shared.clone(), inst2.clone());
            async move {
                if ctx.manual {
                    return Ok(());
                }
                let index = {
                    let mut f = facts(&shared);
                    f.clock += 1;
                    let started = f.clock;
                    let runs = f.slot_runs.entry(ctx.slot).or_default();
                    runs.push(SlotRun {
                        who: who.clone(),
                        takeovers: ctx.takeovers,
                        started,
                        last_valid: started,
                    });
                    runs.len() - 1
                };
                count(&shared, "scheduler runs");
                log.event(
                    &who,
                    format!(
                        "run slot {} (takeovers {})",
                        ctx.slot.saturating_sub(EPOCH_MS),
                        ctx.takeovers
                    ),
                );
                // Work in steps, each only while the lease is surely held.
                for _ in 0..3 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    inst.wait_running().await;
                    if ctx.is_lease_lost() {
                        log.event(&who, "lease lost: stops");
                        break;
                    }
                    let mut f = facts(&shared);
                    f.clock += 1;
                    let now = f.clock;
                    if let Some(run) = f
                        .slot_runs
                        .get_mut(&ctx.slot)
                        .and_then(|r| r.get_mut(index))
                    {
                        run.last_valid = now;
                    }
                }
                Ok(())
            }
        }),
    )
    .with_options(
        JobOptions::default()
            .with_lease_ttl(LOCK_TTL)
            .with_max_late(Duration::from_secs(5)),
    );
    scheduler.add_job(job).expect("a valid job");
    scheduler.start();
    scheduler
}
